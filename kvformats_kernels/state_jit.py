"""Triton kernels of compressor_state (spec/upstream.md §5): float32 rows [kv | score + ape]; with
APE=False those of compressor_state_v41: [kv | score] as given."""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.rows_jit import locate_slot, record_slots


@triton.jit
def encode_kernel(kv_ptr, score_ptr, pos_ptr, ape_ptr, slots_ptr, cache_ptr, err_ptr, n_rows,
                  kv_stride, score_stride, pos_stride, ape_stride, ape_half_stride, slot_stride, capacity,
                  page_stride, PAGE_SIZE: tl.constexpr, ROW_STRIDE: tl.constexpr, KV_OFF: tl.constexpr,
                  SCORE_OFF: tl.constexpr, W: tl.constexpr, APE: tl.constexpr, RATIO: tl.constexpr,
                  APE_HALF: tl.constexpr,
                  KV_BF16: tl.constexpr, SCORE_BF16: tl.constexpr, APE_BF16: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, SITE: tl.constexpr):
    """cache row = [kv | score + ape[p mod RATIO]] in float32 (offsets and strides in floats);
    with APE=False [kv | score] (positions and ape not read; -0.0 stays -0.0); a slot >= capacity
    is skipped and recorded at SITE. Column c of ape row r is at ``r * ape_stride + (c // APE_HALF)
    * ape_half_stride + c % APE_HALF``: APE_HALF = W for a [RATIO, W] table, W/2 for its halves
    [RATIO, 2, W/2] (a strided view of an engine's reordered table)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    m = ok[:, None] & (cols < W)[None, :]
    mx = in_range[:, None] & (cols < W)[None, :]  # inputs are read regardless of the slot: no wait on it
    kv = nj.load_f32((kv_ptr + rows * kv_stride)[:, None] + cols[None, :], mx, KV_BF16)
    score = nj.load_f32((score_ptr + rows * score_stride)[:, None] + cols[None, :], mx, SCORE_BF16)
    if APE:
        p = tl.load(pos_ptr + rows * pos_stride, mask=in_range, other=0).to(tl.int64)
        r = p % RATIO
        r = tl.where(r < 0, r + RATIO, r)  # floor modulo, as torch's % on negative positions
        ape_col = (cols // APE_HALF) * ape_half_stride + cols % APE_HALF
        score = score + nj.load_f32((ape_ptr + r * ape_stride)[:, None] + ape_col[None, :], mx, APE_BF16)
    at = (cache_ptr + page * page_stride + row * ROW_STRIDE)[:, None] + cols[None, :]
    tl.store(at + KV_OFF, kv, mask=m)
    tl.store(at + SCORE_OFF, score, mask=m)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def gather_kernel(cache_ptr, slots_ptr, out_ptr, out2_ptr, err_ptr, n_rows, slot_stride, capacity, page_stride,
                  PAGE_SIZE: tl.constexpr, ROW_STRIDE: tl.constexpr, ROW_OFF: tl.constexpr,
                  ROW_ELEMS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr,
                  SITE: tl.constexpr):
    """out[n] = the 32-bit words of the row at slots[n]; zeros for invalid slots (a slot >=
    capacity recorded at SITE). With SPLIT > 0
    the first SPLIT words of each row go to out (rows of SPLIT words) and the rest to out2: the
    decode's kv and score as two tensors of their own, with no copy afterwards."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    live = (cols < ROW_ELEMS)[None, :]
    src = (cache_ptr + page * page_stride + row * ROW_STRIDE + ROW_OFF)[:, None] + cols[None, :]
    v = tl.load(src, mask=ok[:, None] & live, other=0)
    if SPLIT == 0:
        tl.store((out_ptr + rows * ROW_ELEMS)[:, None] + cols[None, :], v, mask=in_range[:, None] & live)
    else:
        first = (cols < SPLIT)[None, :]
        keep = in_range[:, None] & live
        tl.store((out_ptr + rows * SPLIT)[:, None] + cols[None, :], v, mask=keep & first)
        tl.store((out2_ptr + rows * (ROW_ELEMS - SPLIT))[:, None] + (cols - SPLIT)[None, :], v, mask=keep & ~first)
    record_slots(err_ptr, rows, slot, capacity, SITE)
