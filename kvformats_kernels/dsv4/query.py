"""Launchers of the DeepSeek V4 query / output transforms, registered as the "triton" backend of
``kvformats.deepseek_v4``: the indexer query preps, the inverse-RoPE FP8 output quantization
and the Hadamard transform. Each takes exactly the arguments of its reference implementation
(already validated) and returns the same tensors; nothing synchronises with the host."""

from __future__ import annotations

import functools

import torch

from kvformats.dsv4_constants import OUT_SCALE_RULE
from kvformats.errors import BackendUnavailableError
from kvformats.formats.mxfp4_indexer import SCALE_RULE as MXFP4_RULE
from kvformats.runtime import deferred
from kvformats_kernels import _common as cm
from kvformats_kernels import settings
from kvformats_kernels.dsv4 import query_jit as jit
from kvformats_kernels.launch import fast

# where each op's declaration (kvformats.deepseek_v4.query) records an invalid position: the
# same ids by the same (op, argument) names
_SITE_Q_MXFP4 = deferred.site("prepare_indexer_q_mxfp4", "positions")
_SITE_Q_FP8 = deferred.site("prepare_indexer_q_fp8", "positions")
_SITE_INV_ROPE = deferred.site("inv_rope_fp8_quant", "positions")

# Program sizes (benchmarks may override). indexer_q: heads per program (a row per lane);
# hadamard: warps per program (a row per lane up to ROW_IN_LANE_MAX_D; wider rows: tile elements
# per program); inv_rope: quantization groups per program (a group per lane).
# lane_load / lane_store: rows loaded / stored one per lane (query_jit.thread_rows, store_rows),
# else in the layouts Triton picks; bit-identical either way, only the speed differs. All three
# load a row per lane (the row's arithmetic then needs no other lane: query_jit's docstring) and
# store plainly (coalesced), the fastest pair; one-row-per-lane stores were no faster.
# indexer_q maxnreg: a register cap that spills a little but fits more one-warp programs per
# SM, which speeds up both preps; the fastest cap of a sweep (docs/explanation/measured-choices.md).
# Re-sweep it when the prep's body changes.
CONFIG = settings.declare("query", {
    "indexer_q": {"block_h": 32, "num_warps": 1, "lane_load": 1, "lane_store": 0, "maxnreg": 160},
    "hadamard": {"num_warps": 1, "tile": 4096, "lane_load": 1, "lane_store": 0, "maxnreg": 0},
    "inv_rope": {"lanes": 8, "num_warps": 1, "lane_load": 1, "lane_store": 0},
})
HADAMARD_MAX_D = 1024  # wider rows are left to the reference (a row tile in registers stops paying off)
ROW_IN_LANE_MAX_D = 128  # rows up to this width live in one lane's registers
INV_ROPE_MAX_GROUP = 128  # a group per lane: wider groups would spill
# e4m3 bytes by the hardware cast (cvt.rn.satfinite, sm_89+) instead of integer rounding in the
# inverse-RoPE quant and the FP8 query prep: the same bytes (the GPU tests check both paths) in
# far fewer instructions, and these kernels are bound by instructions, not memory. On by
# default; the interpreter takes the integer path.
HW_E4M3 = settings.declare("hw_e4m3", {"enabled": True})


def _lanes(cfg: dict) -> dict:
    return dict(LANE_LOAD=bool(cfg["lane_load"]), LANE_STORE=bool(cfg["lane_store"]))


def _hw_e4m3(device) -> bool:
    return HW_E4M3["enabled"] and device.type == "cuda" and not settings.SETTINGS.interpret


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _bits(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(x with bf16 as int16 bit patterns, whether it is bf16)."""
    return (x.view(torch.int16), True) if x.dtype == torch.bfloat16 else (x, False)


def bf16_words(x: torch.Tensor) -> torch.Tensor | None:
    """An int32 alias (two elements per word) of a bf16 ``x [A, B, C]`` with unit last stride,
    when every row starts 4-byte aligned and C is even; else None."""
    if x.dtype != torch.bfloat16 or x.shape[2] % 2 or x.storage_offset() % 2 or x.stride(0) % 2 or x.stride(1) % 2:
        return None
    return x.view(torch.int32) if x.data_ptr() % 4 == 0 else None


def _input(x: torch.Tensor) -> tuple[torch.Tensor, bool, bool]:
    """(x as the kernel reads it, is bf16, as int32 pairs) for a 3-d activation."""
    x = _unit_last(x)
    words = bf16_words(x)
    if words is not None:
        return words, True, True
    x, is_bf16 = _bits(x)
    return x, is_bf16, False


@functools.cache
def _mxfp4_rule() -> dict:
    """The MXFP4 indexer's scale rule as kernel constexprs (the FP8 prep's scales take no rule;
    cached: short_exponent runs the rule once)."""
    return {**cm.rule_constants(MXFP4_RULE), **cm.short_exponent(MXFP4_RULE)}


def _indexer_q(index_q, positions, cos_sin, weights, softmax_scale, head_scale, mxfp4: bool):
    t, h, d = index_q.shape
    dev = index_q.device
    out = torch.empty((t, h, d // 2 if mxfp4 else d), dtype=torch.uint8, device=dev)
    scales = torch.empty((t, h), dtype=torch.int32, device=dev)
    w_out = torch.empty((t, h), dtype=torch.float32, device=dev)
    if t and h:
        qk, is_bf16, pairs = _input(index_q)
        w, w_bf16 = _bits(weights)
        cs = _unit_last(cos_sin)
        cfg = CONFIG["indexer_q"]
        fast(jit.indexer_q_kernel)[(t, cm.grid_rows(h, cfg["block_h"]))](
            qk, positions, cs, w, out.view(torch.int32) if mxfp4 else out, scales, w_out, deferred.error_record(dev),
            h, qk.stride(0), qk.stride(1), positions.stride(0), cs.stride(0), cs.shape[0], w.stride(0), w.stride(1),
            cm.f32(d ** -0.5),
            cm.f32(softmax_scale), cm.f32(head_scale), ROPE=cs.shape[1], MXFP4=mxfp4, **_mxfp4_rule(),
            IS_BF16=is_bf16, PAIRS=pairs, W_BF16=w_bf16,
            HW_E4M3=_hw_e4m3(dev), BLOCK_H=cfg["block_h"], EVEN_H=mxfp4 and h % cfg["block_h"] == 0,
            **_lanes(cfg), SITE=_SITE_Q_MXFP4 if mxfp4 else _SITE_Q_FP8,
            **cm.launch_opts(cfg), enable_fp_fusion=False)
    if mxfp4:
        return (out, scales), w_out
    return out.view(torch.float8_e4m3fn), w_out


def prepare_indexer_q_mxfp4(index_q, positions, cos_sin, weights, softmax_scale, head_scale):
    """``((packed uint8 [T, H, 64], scales int32 [T, H]), weights_out float32 [T, H])`` for
    ``index_q [T, H, 128]``, as ``kvformats.deepseek_v4.prepare_indexer_q_mxfp4`` (contiguous
    outputs; the reference's ``packed`` is a strided view with the same values)."""
    return _indexer_q(index_q, positions, cos_sin, weights, softmax_scale, head_scale, True)


def prepare_indexer_q_fp8(index_q, positions, cos_sin, weights, softmax_scale, head_scale):
    """``(q float8_e4m3fn [T, H, 128], weights_out float32 [T, H])``, as
    ``kvformats.deepseek_v4.prepare_indexer_q_fp8``."""
    return _indexer_q(index_q, positions, cos_sin, weights, softmax_scale, head_scale, False)


def _refuse(op: str, reason: str | None) -> None:
    """A launcher called directly with shapes its kernel does not run raises (no silent
    fallback: the reference is the model-op layer's, which picks it under backend="auto")."""
    if reason is not None:
        raise BackendUnavailableError(f"the Triton kernel of deepseek_v4.{op} does not run {reason}")


def _inv_rope_unsupported(o, positions, cos_sin, n_groups, heads_per_group, group, tma_aligned) -> str | None:
    """Why the kernel cannot run these shapes (None: it can). It holds one quantization group per
    lane: a power of two up to INV_ROPE_MAX_GROUP that holds the whole RoPE tail (DeepSeek V4's
    128-groups with a 64-dim tail do)."""
    rope = cos_sin.shape[1]
    if group & (group - 1) or group > INV_ROPE_MAX_GROUP or rope > group:
        return (f"quant_group_size {group} with rope_dim {rope} (the kernel takes a power-of-two group of at most "
                f"{INV_ROPE_MAX_GROUP} that holds the whole RoPE tail)")
    return None


def inv_rope_fp8_quant(o, positions, cos_sin, n_groups, heads_per_group, group, tma_aligned):
    """``(q float8_e4m3fn [T, G, Hg * D] (a transposed view of a contiguous [G, T, Hg * D]),
    scales)`` as ``kvformats.deepseek_v4.inv_rope_fp8_quant``; the kernel writes the scale
    store's padding tokens as zeros. Shapes ``unsupported`` names raise BackendUnavailableError;
    the public function never sends them here (backend="auto" picks the reference for them)."""
    t, heads, d = o.shape
    rope = cos_sin.shape[1]
    _refuse("inv_rope_fp8_quant", _inv_rope_unsupported(o, positions, cos_sin, n_groups, heads_per_group, group,
                                                        tma_aligned))
    dev = o.device
    t_pad = -(-t // 4) * 4
    nq = d // group
    buf = torch.empty((n_groups, t, heads_per_group * d), dtype=torch.uint8, device=dev)
    if tma_aligned:
        store = torch.empty((n_groups, heads_per_group, t_pad), dtype=torch.int32, device=dev)
    else:
        store = torch.empty((n_groups, heads_per_group * nq, t_pad), dtype=torch.float32, device=dev)
    if t:
        x, is_bf16, pairs = _input(o)
        cs = _unit_last(cos_sin)
        cfg = CONFIG["inv_rope"]
        nqp = cm.next_pow2(nq)
        block_t = max(1, cfg["lanes"] // nqp)  # a group per lane
        fast(jit.inv_rope_kernel)[(cm.grid_rows(t_pad, block_t), heads)](
            x, positions, cs, buf, store, deferred.error_record(dev), t, t_pad, heads_per_group, x.stride(0),
            x.stride(1), positions.stride(0), cs.stride(0), cs.shape[0], buf.stride(0), D=d, ROPE=rope, GS=group,
            NQP2=nqp, **cm.rule_constants(OUT_SCALE_RULE),
            TMA=bool(tma_aligned), IS_BF16=is_bf16, PAIRS=pairs, HW_E4M3=_hw_e4m3(dev), BLOCK_T=block_t,
            **_lanes(cfg), SITE=_SITE_INV_ROPE, **cm.launch_opts(cfg), enable_fp_fusion=False)
    return buf.view(torch.float8_e4m3fn).transpose(0, 1), store.permute(2, 0, 1)[:t]


def _hadamard_unsupported(x, scale) -> str | None:
    """Why the kernel cannot run ``x`` (None: it can): rows wider than HADAMARD_MAX_D (a butterfly
    on a register tile that wide would spill)."""
    if x.shape[-1] > HADAMARD_MAX_D:
        return f"rows of {x.shape[-1]} elements (the kernel takes rows of at most {HADAMARD_MAX_D})"
    return None


def hadamard_transform(x, scale):
    """bf16 ``bf16(scale * H(bf16(x)))`` over the last dim, same shape as ``x``, as
    ``kvformats.deepseek_v4.hadamard_transform``. Rows wider than HADAMARD_MAX_D (1024) raise
    BackendUnavailableError; the public function sends them to the reference under
    backend="auto"."""
    shape, d = x.shape, x.shape[-1]
    _refuse("hadamard_transform", _hadamard_unsupported(x, scale))
    rows = _unit_last(x.reshape(-1, d))
    n = rows.shape[0]
    out = torch.empty((n, d), dtype=torch.int16, device=x.device)
    if n:
        src, is_bf16 = _bits(rows)
        cfg = CONFIG["hadamard"]
        if d <= ROW_IN_LANE_MAX_D:
            block_m, vec, opts = 32 * cfg["num_warps"], min(8, d), cm.launch_opts(cfg)
        else:  # the compiler's layout, 4 warps
            block_m, vec, opts = max(1, cfg["tile"] // d), d, {"num_warps": 4}
        fast(jit.hadamard_kernel)[(cm.grid_rows(n, block_m),)](
            src, out, n, cm.row_stride(src), cm.f32(scale), LOG2_D=d.bit_length() - 1, V=vec, IS_BF16=is_bf16,
            BLOCK_M=block_m, **_lanes(cfg), **opts, enable_fp_fusion=False)
    return out.view(torch.bfloat16).reshape(shape)


# The public functions (kvformats.deepseek_v4) ask a launcher's ``unsupported(*args)`` before
# running it: a reason string means another backend must serve these shapes.
inv_rope_fp8_quant.unsupported = _inv_rope_unsupported  # type: ignore[attr-defined]  # read by the dispatcher
hadamard_transform.unsupported = _hadamard_unsupported  # type: ignore[attr-defined]

LAUNCHERS = {
    "prepare_indexer_q_mxfp4": prepare_indexer_q_mxfp4,
    "prepare_indexer_q_fp8": prepare_indexer_q_fp8,
    "inv_rope_fp8_quant": inv_rope_fp8_quant,
    "hadamard_transform": hadamard_transform,
}


# launch settings change through settings.change
settings.guard(__name__, 'CONFIG', 'HW_E4M3', 'HADAMARD_MAX_D', 'ROW_IN_LANE_MAX_D', 'INV_ROPE_MAX_GROUP')
