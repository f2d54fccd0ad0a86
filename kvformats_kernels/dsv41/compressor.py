"""Triton kernels of ``kvformats.deepseek_v41``'s compressor ops, registered as their "triton"
backend: ``compressor_tail_scatter`` (a row copy into the compressor_state_v41 tail) and
``compressor_pool`` (pair softmax pooling, optionally RMS-normalised), on rows of 512 channels (a
program per row; ``compressor_pool`` takes ``block_m`` rows a program from its launch settings).
Nothing synchronises with the host.

Numerics follow the torch reference operation by operation (kvformats/deepseek_v41/compressor.py):
``fmax`` (maxnum) of the scores, libdevice ``expf`` on the GPU (torch's CUDA exp; the interpreter:
numpy's), correctly rounded divisions (``div_rn``), products and sums never fused (launched with
``enable_fp_fusion=False``), bf16 rounding on the bit pattern (or the GPU's ``cvt.rn.bf16.f32``),
the sum of squares as nine levels of adjacent-pair sums, libdevice ``rsqrtf`` on the GPU (torch's
CUDA rsqrt; the interpreter: ``1 / sqrt``, as torch's CPU rsqrt).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvformats_kernels import _common as cm
from kvformats_kernels import numerics_jit as nj
from kvformats_kernels import settings
from kvformats_kernels.dsv4 import pool_jit as pj
from kvformats_kernels.launch import fast

WIDTH = 512  # channels of content and of scores; a tail row holds 2 * WIDTH floats
# Per kernel: rows per program (block_m), num_warps; hw_cvt: the GPU's bf16 conversion (else
# integer rounding). "pool": compressor_pool without the norm, "norm": with it. Swept on an H100
# (16384 rows, 2026-12-07): pool 56 us at any of block_m 1-2 / 2-8 warps (tokenspeed's kernel:
# 57 us); norm 87 us with one row and one warp a program, 127-2000 us with more of either (the
# nine pair-sum levels move data between threads at each level; tokenspeed's tl.sum: 53 us).
CONFIG = settings.declare("dsv41_compressor", {
    "scatter": {"num_warps": 4},
    "pool": {"block_m": 1, "num_warps": 4},
    "norm": {"block_m": 1, "num_warps": 1, "hw_cvt": 1},
})


@triton.jit
def _pairs(x):
    """x [M, N] -> [M, N // 2]: x[:, 2i] + x[:, 2i + 1]."""
    a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
    return a + b


@triton.jit
def sum_pairwise_512(x):
    """Row sums of x [M, 512] -> [M, 1], as nine levels of adjacent-pair sums (the reference's order)."""
    tl.static_assert(x.shape[1] == 512)
    x = _pairs(_pairs(_pairs(x)))
    x = _pairs(_pairs(_pairs(x)))
    return _pairs(_pairs(_pairs(x)))


@triton.jit
def tail_scatter_kernel(c_ptr, s_ptr, slots_ptr, cache_ptr, c0, c1, s0, s1, slot_stride, capacity, page_stride,
                        PAGE_SIZE: tl.constexpr, W: tl.constexpr, C_BF16: tl.constexpr, S_BF16: tl.constexpr):
    """Tail row ``slots[t]`` = [content[t] | scores[t]] (float32) when 0 <= slot < capacity."""
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + row * slot_stride).to(tl.int64)
    ok = (slot >= 0) & (slot < capacity)
    d = tl.arange(0, W)
    m = pj.spread(ok, d)
    kv = nj.load_f32(c_ptr + row * c0 + d * c1, m, C_BF16)
    score = nj.load_f32(s_ptr + row * s0 + d * s1, m, S_BF16)
    at = tl.where(ok, slot, 0)
    dst = cache_ptr + (at // PAGE_SIZE) * page_stride + (at % PAGE_SIZE) * (2 * W) + d
    tl.store(dst, kv, mask=m)
    tl.store(dst + W, score, mask=m)


@triton.jit
def pool_kernel(c_ptr, s_ptr, prev_ptr, slot_ptr, act_ptr, cache_ptr, w_ptr, out_ptr, n_rows, c0, c1, s0, s1,
                prev_stride, slot_stride, act_stride, w_stride, o0, o1, capacity, page_stride, eps,
                PAGE_SIZE: tl.constexpr, W: tl.constexpr, BLOCK_M: tl.constexpr, C_BF16: tl.constexpr,
                S_BF16: tl.constexpr, W_BF16: tl.constexpr, HAS_NORM: tl.constexpr, GPU: tl.constexpr,
                HW: tl.constexpr):
    """Rows [BLOCK_M * pid, + BLOCK_M) of compressor_pool: each row's pair (predecessor, the row)
    pooled by a per-channel softmax of their scores; then, with HAS_NORM, bf16 rounding, RMSNorm
    and bf16 output (as int16 bits)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    inside = rows < n_rows
    live = inside & (tl.load(act_ptr + rows * act_stride, mask=inside, other=0) != 0)
    prev = tl.load(prev_ptr + rows * prev_stride, mask=inside, other=-1).to(tl.int64)
    slot = tl.load(slot_ptr + rows * slot_stride, mask=inside, other=-1).to(tl.int64)
    in_batch = live & (prev >= 0) & (prev < n_rows)
    in_tail = live & (prev < 0) & (slot >= PAGE_SIZE) & (slot < capacity)
    d = tl.arange(0, W)[None, :]
    every = d < W
    m_batch = in_batch[:, None] & every
    m_tail = in_tail[:, None] & every
    m_live = live[:, None] & every
    here = tl.where(in_batch, prev, 0)[:, None]
    at = tl.where(in_tail, slot, 0)[:, None]
    c0_batch = nj.load_f32(c_ptr + here * c0 + d * c1, m_batch, C_BF16)
    s0_batch = nj.load_f32(s_ptr + here * s0 + d * s1, m_batch, S_BF16)
    src = cache_ptr + (at // PAGE_SIZE) * page_stride + (at % PAGE_SIZE) * (2 * W) + d
    c0_tail = tl.load(src, mask=m_tail, other=0.0)
    s0_tail = tl.load(src + W, mask=m_tail, other=0.0)
    old_c = tl.where(m_batch, c0_batch, c0_tail)
    old_s = tl.where(m_batch, s0_batch, s0_tail)
    r = rows[:, None]
    cur_c = nj.load_f32(c_ptr + r * c0 + d * c1, m_live, C_BF16)
    cur_s = nj.load_f32(s_ptr + r * s0 + d * s1, m_live, S_BF16)
    top = tl.maximum(old_s, cur_s)  # maxnum: a NaN score leaves the other (torch.fmax)
    e_old = pj.exp_f32(old_s - top, GPU)
    e_new = pj.exp_f32(cur_s - top, GPU)
    total = e_old + e_new
    pooled = old_c * tl.math.div_rn(e_old, total) + cur_c * tl.math.div_rn(e_new, total)
    pooled = tl.where(m_live, pooled, 0.0)
    dst = out_ptr + r * o0 + d * o1
    keep = inside[:, None] & every
    if HAS_NORM:
        x = nj.bf16_bits_f32(nj.bf16_bits(pooled, HW))
        inv_rms = pj.rsqrt_f32(sum_pairwise_512(x * x) * 0.001953125 + eps, GPU)  # mean: times 2^-9, exact
        weight = nj.load_f32(w_ptr + d * w_stride, every, W_BF16)
        tl.store(dst, nj.bf16_bits((x * inv_rms) * weight, HW).to(tl.int16), mask=keep)
    else:
        tl.store(dst, pooled, mask=keep)


def _input(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(x as the kernel reads it, whether as bf16 bits): bf16 goes as int16 (exact widening)."""
    return (x.view(torch.int16), True) if x.dtype == torch.bfloat16 else (x, False)


def compressor_tail_scatter(layout, content, scores, cache, slots) -> None:
    """``kvformats.deepseek_v41.compressor_tail_scatter`` on validated input (``cache``: the
    ``[pages, P, 1024]`` view of the tail)."""
    n = content.shape[0]
    capacity = cache.shape[0] * layout.page_size
    if n == 0 or capacity == 0:
        return
    (c, c_bf16), (s, s_bf16) = _input(content), _input(scores)
    fast(tail_scatter_kernel)[(n,)](
        c, s, slots, cache, c.stride(0), c.stride(1), s.stride(0), s.stride(1), slots.stride(0), capacity,
        cache.stride(0), PAGE_SIZE=layout.page_size, W=WIDTH, C_BF16=c_bf16, S_BF16=s_bf16,
        **cm.launch_opts(CONFIG["scatter"]))


def compressor_pool(layout, content, scores, cache, previous, tail_slots, active, norm_weight, eps, out) -> None:
    """``kvformats.deepseek_v41.compressor_pool`` on validated input (N > 0), into ``out``."""
    n = content.shape[0]
    (c, c_bf16), (s, s_bf16) = _input(content), _input(scores)
    has_norm = norm_weight is not None
    if has_norm:
        w, w_bf16 = _input(norm_weight)
        dst = out.view(torch.int16)
    else:
        w, w_bf16, dst = c, False, out  # the weight pointer is never read
    gpu = content.device.type == "cuda"
    cfg = CONFIG["norm" if has_norm else "pool"]
    fast(pool_kernel)[(cm.grid_rows(n, cfg["block_m"]),)](
        c, s, previous, tail_slots, active.view(torch.uint8), cache, w, dst, n, c.stride(0), c.stride(1),
        s.stride(0), s.stride(1), previous.stride(0), tail_slots.stride(0), active.stride(0),
        w.stride(0) if has_norm else 0, dst.stride(0), dst.stride(1), cache.shape[0] * layout.page_size,
        cache.stride(0), float(eps), PAGE_SIZE=layout.page_size, W=WIDTH, BLOCK_M=cfg["block_m"], C_BF16=c_bf16,
        S_BF16=s_bf16, W_BF16=w_bf16, HAS_NORM=has_norm, GPU=gpu, HW=gpu and cm.hw_cvt(cfg), **cm.launch_opts(cfg),
        enable_fp_fusion=False)


LAUNCHERS = {"compressor_pool": compressor_pool, "compressor_tail_scatter": compressor_tail_scatter}


# launch settings change through settings.change
settings.guard(__name__, "CONFIG")
