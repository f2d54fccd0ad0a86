"""Triton kernels of fp8_ds_mla (formats.md §2): encode and decode of whole rows.

A row is NB NoPE blocks of QB values (float8_e4m3fn, one ue8m0 exponent each) and a RoPE tail
of ROPE bf16 values; every offset arrives as a constexpr read off the layout's regions.
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.rows_jit import locate


@triton.jit
def encode_kernel(x_ptr, slots_ptr, cache_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                  PAGE_SIZE: tl.constexpr, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
                  ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr,
                  SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
                  PAD_OFF: tl.constexpr, PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr,
                  PAD_P2: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr, QB: tl.constexpr,
                  ROPE: tl.constexpr, ROPE_P2: tl.constexpr,
                  FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                  E_MIN: tl.constexpr, E_MAX: tl.constexpr, IS_BF16: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row = locate(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = page * page_stride
    x_row = x_ptr + rows * x_stride

    # NoPE: bf16-round, per-block power-of-two exponent, e4m3 bytes.
    blk = tl.arange(0, NB_P2)
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    m3 = ok[:, None, None] & (blk < NB)[None, :, None]
    # x is read under the row-range mask only, so its load overlaps the slot load
    xq = nj.load_f32(x_row[:, None, None] + elem[None, :, :], in_range[:, None, None] & (blk < NB)[None, :, None],
                     IS_BF16)
    if not IS_BF16:
        xq = nj.bf16_round(xq)
    e = nj.block_exponent(tl.max(tl.abs(xq), axis=2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
    codes = nj.e4m3_bits(xq * nj.pow2(-e)[:, :, None])
    nope_at = cache_ptr + base + NOPE_OFF + row * NOPE_STRIDE
    tl.store(nope_at[:, None, None] + elem[None, :, :], codes.to(tl.uint8), mask=m3)

    # Scale bytes, then the record's pad bytes (always 0).
    s = tl.minimum(tl.maximum(e + 127, 0), 255)
    scale_at = cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE
    tl.store(scale_at[:, None] + blk[None, :], s.to(tl.uint8), mask=ok[:, None] & (blk < NB)[None, :])
    if PAD_BYTES > 0:
        p = tl.arange(0, PAD_P2)
        pad_at = cache_ptr + base + PAD_OFF + row * PAD_STRIDE
        tl.store(pad_at[:, None] + p[None, :], tl.zeros((BLOCK_M, PAD_P2), tl.uint8),
                 mask=ok[:, None] & (p < PAD_BYTES)[None, :])

    # RoPE tail as bf16, little endian: element j's low byte at 2j, high byte at 2j + 1.
    j = tl.arange(0, ROPE_P2)
    mj = in_range[:, None] & (j < ROPE)[None, :]
    if IS_BF16:
        h = tl.load(x_row[:, None] + (NB * QB) + j[None, :], mask=mj, other=0).to(tl.int32)
    else:
        h = nj.bf16_rne_bits(nj.load_f32(x_row[:, None] + (NB * QB) + j[None, :], mj, IS_BF16))
    pairs = tl.reshape(tl.join(h & 0xFF, (h >> 8) & 0xFF), (BLOCK_M, 2 * ROPE_P2))
    k = tl.arange(0, 2 * ROPE_P2)
    rope_at = cache_ptr + base + ROPE_OFF + row * ROPE_STRIDE
    tl.store(rope_at[:, None] + k[None, :], pairs.to(tl.uint8), mask=ok[:, None] & (k < 2 * ROPE)[None, :])


@triton.jit
def decode_kernel(cache_ptr, slots_ptr, out_ptr, n_rows, slot_stride, capacity, page_stride,
                  PAGE_SIZE: tl.constexpr, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
                  ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr,
                  SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
                  NB: tl.constexpr, NB_P2: tl.constexpr, QB: tl.constexpr,
                  ROPE: tl.constexpr, ROPE_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    """out (int16 bits of bf16) [N, HEAD_DIM]: e4m3 * 2^(s-127) rounded to bf16, then the tail."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row = locate(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = page * page_stride
    out_row = out_ptr + rows * HEAD_DIM

    blk = tl.arange(0, NB_P2)
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    live = (blk < NB)[None, :, None]
    b = tl.load((cache_ptr + base + NOPE_OFF + row * NOPE_STRIDE)[:, None, None] + elem[None, :, :],
                mask=ok[:, None, None] & live, other=0)
    s = tl.load((cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE)[:, None] + blk[None, :],
                mask=ok[:, None] & (blk < NB)[None, :], other=127)
    # NaN only from a NaN byte (0x7F / 0xFF) or a NaN scale (0xFF): decided on the bytes, so
    # the per-element rounding needs no NaN test.
    v = nj.e4m3_half_value(b) * 256.0 * nj.ue8m0_value(s)[:, :, None]
    nan = ((b.to(tl.int32) & 0x7F) == 0x7F) | (s == 0xFF)[:, :, None]
    bits = tl.where(nan, 0x7FC0, nj.bf16_rne_bits_nonan(v))
    tl.store(out_row[:, None, None] + elem[None, :, :], bits.to(tl.int16), mask=in_range[:, None, None] & live)

    k = tl.arange(0, 2 * ROPE_P2)
    pairs = tl.load((cache_ptr + base + ROPE_OFF + row * ROPE_STRIDE)[:, None] + k[None, :],
                    mask=ok[:, None] & (k < 2 * ROPE)[None, :], other=0).to(tl.int32)
    lo, hi = tl.split(tl.reshape(pairs, (BLOCK_M, ROPE_P2, 2)))
    j = tl.arange(0, ROPE_P2)
    tl.store(out_row[:, None] + (NB * QB) + j[None, :], (lo | (hi << 8)).to(tl.int16),
             mask=in_range[:, None] & (j < ROPE)[None, :])
