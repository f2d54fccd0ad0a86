"""SWA insert (tokenspeed's ``fused_qnorm_rope_kv_insert``, spec/upstream.md §2.4, §6.1).

For every token t: ``q[t, h] <- rope_p(q[t, h] * rsqrt(mean(q[t, h]^2) + eps))`` in float32,
written back in q's dtype (weightless RMSNorm per head). For tokens t < len(slots) with
``0 <= slots[t] < capacity``: the kv row, its RoPE tail rotated at the token's own position p and
rounded to bf16, is written as an fp8_ds_mla row. Other slots are skipped silently and never
recorded (this is the one op that tolerates slots beyond the cache: tokenspeed's kernel does, and
engines rely on it for CUDA-graph padding).
"""

from __future__ import annotations

import torch

from kvformats.codec.op import Op
from kvformats.codec.rows import locate, write_rows
from kvformats.deepseek_v4 import _dispatch as D
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.transforms import rms_norm, rope_tail
from kvformats.errors import InputError, InputTypeError, describe
from kvformats.runtime import deferred
from kvformats.validation import REPEATED_SLOTS, repeats

ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)

SWA_INSERT = Op(D.MODEL_FAMILY, "swa_insert", mutates=("q", "kv_cache"), sites=("positions",),
                result=lambda a: a["q"])


@SWA_INSERT.public
def swa_insert(q: torch.Tensor, kv: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, cos_sin_cache: torch.Tensor, rms_eps: float, *, page_size: int = 64,
               backend: str = "auto", check: bool | str = True) -> torch.Tensor:
    """Normalise and rotate ``q`` in place and insert ``kv`` into the SWA cache. Returns ``q``.

    Args:
        q: ``[T, H, D]`` bf16 or fp32, contiguous; mutated in place.
        kv: ``[T, D]`` same dtype as q (the kv latent before RoPE).
        kv_cache: uint8 fp8_ds_mla cache ``[pages, >= page_size * row_bytes]`` (head_dim D, rope
            dim ``cos_sin_cache.shape[1]``).
        slots: int ``[S]`` with ``S <= T``; tokens t >= S only get q processed.
        positions: int ``[T]``; cos_sin_cache: float32 ``[max_pos, rope_dim]``.

    fp16 activations are refused: tokenspeed's fp16 variant stores the RoPE tail as fp16, which is
    not the fp8_ds_mla format (spec/upstream.md §13.3).

    ``check`` (True, False or "strict"; ``spec/checks.md``): on CPU tensors and in strict mode,
    positions outside the cos/sin table and repeated non-negative slots raise before anything is
    written. On a GPU nothing is read on the host: a token at an invalid position gets its q
    normalised but not rotated, its kv row is not written, and the violation is recorded for
    ``kvformats.raise_pending``; repeated slots are not looked for.
    """
    device = kv_cache.device if isinstance(kv_cache, torch.Tensor) else None
    if not isinstance(q, torch.Tensor) or q.dtype not in ACTIVATION_DTYPES:
        raise InputTypeError(f"q must be a bf16 or fp32 tensor [T, H, D] (fp16 is not supported), got {describe(q)}")
    C.check_tensor("q", q, dtypes=ACTIVATION_DTYPES, shape=(None, None, None), device=device)
    if not q.is_contiguous():
        raise InputError(f"q must be contiguous (it is written in place), got strides {q.stride()}")
    t, _, d = q.shape
    C.check_tensor("kv", kv, dtypes=(q.dtype,), shape=(t, d), device=device)
    C.check_index("positions", positions, t, device)
    s = C.check_index("slots", slots, None, device)
    if s > t:
        raise InputError(f"slots must have at most T = {t} entries (one per token), got {s}")
    rope_dim = C.check_cos_sin(cos_sin_cache, device)
    layout = C.ds_mla_layout(kv_cache, d, rope_dim, page_size)
    eps = C.check_float("rms_eps", rms_eps)
    if deferred.on_host(check, positions):
        C.check_positions_in_table(positions, cos_sin_cache)
        if s:
            live = slots[locate(layout, kv_cache, slots)[0]]
            if repeats(live):
                raise InputError(REPEATED_SLOTS)
    SWA_INSERT.resolve(backend, device)(q, kv, kv_cache, layout, slots, positions, cos_sin_cache, eps)
    return q


@SWA_INSERT.reference
def swa_insert_reference(q, kv, kv_cache, layout, slots, positions, cos_sin, eps) -> None:
    # check=False: a token at an invalid position is rotated by the identity and recorded (the
    # public function raised on the host where its check mode asks).
    q.copy_(rope_tail(rms_norm(q, None, eps), positions, cos_sin, check=False, site=_SITE))
    s = slots.shape[0]
    if s:
        p = positions[:s]
        # the kernel rounds to the activation dtype
        x = rope_tail(kv[:s], p, cos_sin, check=False, site=_SITE).to(kv.dtype)
        slots = torch.where((p >= 0) & (p < cos_sin.shape[0]), slots, -1)  # no row for an invalid position
        write_rows(layout, kv_cache, slots, layout.encode_rows(x))


_SITE = SWA_INSERT.site("positions")
