"""Benchmark cases of the DeepSeek V4 query / output side: swa_insert, the indexer query preps
(MXFP4, FP8), inv_rope_fp8_quant and hadamard_transform.

``cases(sizes)`` builds, for each size n (tokens), CUDA inputs at DeepSeek V4's shapes: q of
the SWA insert [T, 64, 512] bf16 with kv [T, 512] into a 64-row fp8_ds_mla cache; indexer q
[T, 64, 128] bf16 with float32 weights; attention output [T, 8 * 16, 512] bf16; Hadamard rows
[T * 64, 128] bf16. Sizes up to DECODE_MAX are decode steps; larger ones are prefill steps,
where the SWA insert and inv_rope take n // 4 and n // 8 tokens so that the reference (whose
float32 temporaries are several times the input) fits beside the inputs. Positions are
random below 65,536; SWA slots are distinct, with 3 % -1 and 1 % beyond the cache.

``run_triton`` / ``run_reference`` call the registered implementations directly on the same
prepared arguments (the public functions' host-side validation is not timed); swa_insert
rewrites q in place, so repeated calls keep normalising the same buffer. Cases whose label
ends in "hw e4m3" run the FP8 kernels with the hardware e4m3 cast (query.HW_E4M3), the others
with integer rounding.

``min_bytes``: inputs read once (activations, weights, positions, slots, and one cos_sin row
per token) plus outputs written once (in place for q; whole fp8_ds_mla rows of 584 bytes for
the SWA cache; the inverse-RoPE scale store with its padding).
"""

from __future__ import annotations

import torch
from benchmarks.dsv4_case import Case, implementation

from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.rope import cos_sin_cache
from kvformats.formats import Fp8DsMla

DECODE_MAX = 4096
DEV = "cuda"
HEADS_SWA, D, ROPE = 64, 512, 64
HEADS_IDX, D_IDX = 64, 128
GROUPS, HPG = 8, 16
MAX_POS = 65536


def _case(op, label, rows, min_bytes, how, args, hw=False, hw_label="hw e4m3"):
    tri, ref = implementation(op, "triton"), implementation(op, "reference")

    def run_triton():  # rows without "hw ..." time the integer roundings (query.HW_E4M3 off)
        from kvformats_kernels import settings
        from kvformats_kernels.dsv4 import query as kq

        if kq.HW_E4M3["enabled"] == hw:
            return tri(*args)
        with settings.changed("hw_e4m3", "enabled", hw):
            return tri(*args)

    return Case(op=op, label=label + (f", {hw_label}" if hw else ""), rows=rows, min_bytes=int(min_bytes), how=how,
                run_triton=run_triton, run_reference=lambda: ref(*args))


def _label(n: int, tokens: int, what: str) -> str:
    step = "decode" if n <= DECODE_MAX else "prefill"
    return f"{step} {tokens} tokens{what}"


def _bf16(shape, g):
    return torch.randn(shape, generator=g, device=DEV).to(torch.bfloat16)


def _swa(n: int, g, cs) -> list[Case]:
    t = n if n <= DECODE_MAX else n // 4
    layout = Fp8DsMla(head_dim=D, rope_dim=ROPE, page_size=64)
    pages = -(-t // 64) + 2
    cache = layout.allocate(pages, device=DEV)
    slots = torch.randperm(pages * 64, generator=g, device=DEV)[:t]
    r = torch.rand(t, generator=g, device=DEV)
    slots[r < 0.03] = -1
    slots[r > 0.99] = pages * 64 + 5
    pos = torch.randint(0, MAX_POS, (t,), generator=g, device=DEV)
    q, kv = _bf16((t, HEADS_SWA, D), g), _bf16((t, D), g)
    args = (q, kv, cache, C.ds_mla_layout(cache, D, ROPE, 64), slots, pos, cs, 1e-6)
    nbytes = 2 * q.numel() * 2 + kv.numel() * 2 + t * layout.row_bytes + t * (8 + 8 + ROPE * 4)
    how = "q read + written (bf16), kv read, one 584 B row per token, slots, positions, a cos_sin row per token"
    return [_case("swa_insert", _label(n, t, f" x {HEADS_SWA} heads"), t * HEADS_SWA, nbytes, how, args)]


def _indexer(n: int, g, cs) -> list[Case]:
    t = n
    q = _bf16((t, HEADS_IDX, D_IDX), g)
    pos = torch.randint(0, MAX_POS, (t,), generator=g, device=DEV)
    w = torch.randn(t, HEADS_IDX, generator=g, device=DEV)
    args = (q, pos, cs, w, D_IDX ** -0.5, HEADS_IDX ** -0.5)
    rows = t * HEADS_IDX
    read = q.numel() * 2 + w.numel() * 4 + t * (8 + ROPE * 4)
    label = _label(n, t, f" x {HEADS_IDX} heads")
    out = []
    for op, per_row in (("prepare_indexer_q_mxfp4", D_IDX // 2 + 4 + 4), ("prepare_indexer_q_fp8", D_IDX + 4)):
        how = f"q (bf16), weights (fp32), positions and a cos_sin row per token read; {per_row} B per row written"
        # query.HW_E4M3 also switches the bf16 roundings to the hardware's, so the MXFP4 prep has
        # a hardware variant too (the default on a GPU)
        for hw in (False, True):
            out.append(_case(op, label, rows, read + rows * per_row, how, args, hw,
                             "hw bf16" if op.endswith("mxfp4") else "hw e4m3"))
    return out


def _inv_rope(n: int, g, cs) -> list[Case]:
    t = n if n <= DECODE_MAX else n // 8
    heads = GROUPS * HPG
    o = _bf16((t, heads, D), g)
    pos = torch.randint(0, MAX_POS, (t,), generator=g, device=DEV)
    t_pad = -(-t // 4) * 4
    out = []
    for tma in (True, False):
        scale_bytes = heads * t_pad * 4 * (1 if tma else D // 128)
        nbytes = o.numel() * 2 + o.numel() + scale_bytes + t * (8 + ROPE * 4)
        how = "o read (bf16), e4m3 written, the scale store (padded to 4 tokens), positions, a cos_sin row per token"
        label = _label(n, t, f" x {heads} heads, {'int32' if tma else 'float32'} scales")
        for hw in (False, True):
            out.append(_case("inv_rope_fp8_quant", label, t * heads, nbytes, how,
                             (o, pos, cs, GROUPS, HPG, 128, tma), hw))
    return out


def _hadamard(n: int, g) -> list[Case]:
    x = _bf16((n * HEADS_IDX, D_IDX), g)
    return [_case("hadamard_transform", _label(n, n, f" x {HEADS_IDX} rows of {D_IDX}"), x.shape[0],
                  2 * x.numel() * 2, "x read and the result written (bf16)", (x, D_IDX ** -0.5))]


def cases(sizes=(64, 131072)) -> list[Case]:
    g = torch.Generator(device=DEV).manual_seed(0)
    cs = cos_sin_cache(ROPE, MAX_POS).to(DEV)
    out: list[Case] = []
    for n in sizes:
        out += _swa(n, g, cs) + _indexer(n, g, cs) + _inv_rope(n, g, cs) + _hadamard(n, g)
    return out
