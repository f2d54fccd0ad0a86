"""Launcher of the DeepSeek V4 SWA insert, registered as the "triton" backend of
``kvformats.deepseek_v4.swa_insert``: one fused kernel (q normalised and rotated in place; kv
rotated and written as fp8_ds_mla rows, reading kv once). Nothing synchronises with the host."""

from __future__ import annotations

import torch

from kvformats.runtime import deferred
from kvformats_kernels import _common as cm
from kvformats_kernels import settings
from kvformats_kernels.dsv4 import swa_jit as jit
from kvformats_kernels.dsv4.query import bf16_words
from kvformats_kernels.geometry import nope_rope_constants
from kvformats_kernels.launch import fast

# q: heads per program (a [BLOCK_H, D] tile); kv: rows per program. Benchmarks may override.
CONFIG = settings.declare("swa", {"block_h": 8, "block_kv": 8, "num_warps": 4})


def swa_insert(q, kv, kv_cache, layout, slots, positions, cos_sin, eps) -> None:
    """``q [T, H, D]`` (contiguous, bf16 / fp32) <- rope_p(rms(q)) in place; kv rows t < len(slots)
    with 0 <= slot < capacity written as fp8_ds_mla rows of ``kv_cache`` (other slots skipped),
    as ``kvformats.deepseek_v4.swa_insert``. q may differ from the reference in the last bit where
    the RMS sum's order does (a float32 sum in another order)."""
    t, heads, d = q.shape
    n_kv = slots.shape[0] if kv_cache.shape[0] else 0
    cfg = CONFIG
    head_blocks = cm.grid_rows(heads, cfg["block_h"])
    q_programs = t * head_blocks
    kv_programs = cm.grid_rows(n_kv, cfg["block_kv"])
    if q_programs + kv_programs == 0:
        return
    words = bf16_words(q)
    if words is not None:
        qk, q_bf16 = words, True
    else:
        qk, q_bf16 = (q.view(torch.int16), True) if q.dtype == torch.bfloat16 else (q, False)
    kvk, kv_bf16 = cm.rows_input(kv)
    u8, page_stride = cm.byte_cache(layout, kv_cache)
    cs = cos_sin if cos_sin.shape[1] <= 1 or cos_sin.stride(1) == 1 else cos_sin.contiguous()
    rope = cs.shape[1]
    fast(jit.swa_kernel)[(q_programs + kv_programs,)](
        qk, kvk, slots, positions, cs, u8, deferred.error_record(q.device), heads, head_blocks, q_programs, n_kv,
        qk.stride(0), qk.stride(1), cm.row_stride(kvk), slots.stride(0), positions.stride(0), cs.stride(0), cs.shape[0],
        cm.capacity(layout, kv_cache),
        page_stride, cm.f32(eps), D=d, DT=cm.next_pow2(d), ROPE=rope, RT=cm.next_pow2(rope), PAGE_SIZE=layout.page_size,
        **nope_rope_constants(layout), **cm.rule_constants(layout.scale_rule), Q_BF16=q_bf16, Q_PAIRS=words is not None,
        KV_BF16=kv_bf16, BLOCK_H=cfg["block_h"], BLOCK_KV=cfg["block_kv"], SITE=_SITE, **cm.launch_opts(cfg),
        enable_fp_fusion=False)


_SITE = deferred.site("swa_insert", "positions")
LAUNCHERS = {"swa_insert": swa_insert}


# launch settings change through settings.change
settings.guard(__name__, 'CONFIG')
