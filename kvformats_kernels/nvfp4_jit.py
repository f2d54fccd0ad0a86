"""Triton kernels of nvfp4_ds_mla (352 B token-interleaved rows: e2m1 NoPE nibbles with an e4m3
scale per 16 values, rounded up and stored permuted, then unscaled e4m3 RoPE values).

Every offset and the permutation arrive as constexprs read off the layout (kvformats_kernels/
nvfp4.py): the scale of NoPE block s sits at ``(s % QUADS) * COLS + s // QUADS`` of the scale
record. Rounding follows the reference (kvformats/formats/nvfp4_ds_mla.py) on bit patterns
(numerics_jit), so the interpreter and the GPU give its bytes.
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.rows_jit import locate_slot, record_slots


@triton.jit
def scale_slots(blk, QUADS: tl.constexpr, COLS: tl.constexpr):
    """The byte of the scale record holding block ``blk``'s scale (the stored permutation)."""
    return (blk % QUADS) * COLS + blk // QUADS


@triton.jit
def nvfp4_encode_kernel(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                        PAGE_SIZE: tl.constexpr, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
                        ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr,
                        SCALE_STRIDE: tl.constexpr, NOPE: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr,
                        QB: tl.constexpr, QUADS: tl.constexpr, COLS: tl.constexpr, ROPE: tl.constexpr,
                        ROPE_P2: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, IS_BF16: tl.constexpr,
                        BLOCK_M: tl.constexpr, SITE: tl.constexpr, HW: tl.constexpr = False):
    """Rows x [N, NOPE + ROPE] (bf16 / fp16 / fp32, rounded to bf16 first) into the rows at slots
    (skipped outside [0, capacity); a slot >= capacity recorded at SITE).

    Per NoPE block: t = max(fl32(amax / ELEM_MAX), FLOOR) (NaN kept), byte = e4m3(t) with the
    sign bit clear (e4m3_code clamps at 448, +Inf too; NaN -> 0x7F), plus one where its value is
    below t and the byte below 0x7E; nibbles = e2m1 round-half-even of fl32(x / sf) saturating at
    6, 7 where that is NaN, the sign bit where it is < 0. RoPE: e4m3(x), unscaled."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = cache_ptr + page * page_stride
    src = x_ptr + rows * x_stride
    blk = tl.arange(0, NB_P2)
    inb = (blk < NB)[None, :]
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    r = tl.arange(0, ROPE_P2)
    rm = (r < ROPE)[None, :]
    # x is read under the row-range mask only, so its loads overlap the slot load
    x = nj.load_f32(src[:, None, None] + elem[None, :, :], in_range[:, None, None] & inb[:, :, None], IS_BF16)
    xr = nj.load_f32(src[:, None] + NOPE + r[None, :], in_range[:, None] & rm, IS_BF16)
    if not IS_BF16:
        x = nj.bf16_round(x)
        xr = nj.bf16_round(xr)
    amax = nj.abs_max(x, 2)
    t = nj.max_nan(tl.math.div_rn(amax, tl.full(amax.shape, ELEM_MAX, tl.float32)), FLOOR)
    sbyte = nj.e4m3_code(t, HW) & 0x7F
    up = (nj.e4m3_to_f32(sbyte.to(tl.uint8), HW) < t) & (sbyte < 0x7E)  # NaN compares false
    sbyte = sbyte + up.to(tl.int32)
    sf = nj.e4m3_to_f32(sbyte.to(tl.uint8), HW)
    y = tl.math.div_rn(x, tl.broadcast_to(sf[:, :, None], x.shape))
    mag = tl.where(y == y, nj.e2m1_code(y, True, False) & 7, 7)  # NaN: past every midpoint, code 7
    codes = mag | tl.where(y < 0, 8, 0)  # y < 0: -0.0 and NaN never take the sign bit
    m2 = ok[:, None] & inb
    HQ: tl.constexpr = QB // 2
    lo, hi = tl.split(tl.reshape(codes, (BLOCK_M, NB_P2, HQ, 2)))  # element 2k, element 2k + 1
    at = (base + NOPE_OFF + row * NOPE_STRIDE)[:, None] + blk[None, :] * HQ
    tl.store(at[:, :, None] + tl.arange(0, HQ)[None, None, :], (lo | (hi << 4)).to(tl.uint8), mask=m2[:, :, None])
    tl.store((base + SCALE_OFF + row * SCALE_STRIDE)[:, None] + scale_slots(blk, QUADS, COLS)[None, :],
             sbyte.to(tl.uint8), mask=m2)
    tl.store((base + ROPE_OFF + row * ROPE_STRIDE)[:, None] + r[None, :], nj.e4m3_code(xr, HW).to(tl.uint8),
             mask=ok[:, None] & rm)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def decode_body(cache_ptr, aux_ptr, page, row, ok, out_row, live, page_stride, aux_stride, G: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """The nvfp4_ds_mla decode body (rows_jit.decode_kernel, paged_decode_kernel): bf16 bits
    (int16) of the rows at (page, row) [BM] (zeros where not ok) into ``out_row`` [BM pointers]
    where live: NoPE e2m1 value * its block's e4m3 scale (read at its permuted byte), RoPE the
    e4m3 value; each exact, then bf16 (exact too). NaN scales and NaN codes give NaN."""
    base = cache_ptr + page * page_stride
    blk = tl.arange(0, G.NB_P2)
    inb = (blk < G.NB)[None, :]
    s = tl.load((base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + scale_slots(blk, G.QUADS, G.COLS)[None, :],
                mask=ok[:, None] & inb, other=0)
    HQ: tl.constexpr = G.QB // 2
    pair = blk[:, None] * HQ + tl.arange(0, HQ)[None, :]
    b = tl.load((base + G.NOPE_OFF + row * G.NOPE_STRIDE)[:, None, None] + pair[None, :, :],
                mask=ok[:, None, None] & inb[:, :, None], other=0)
    r = tl.arange(0, G.ROPE_P2)
    rm = (r < G.ROPE)[None, :]
    rb = tl.load((base + G.ROPE_OFF + row * G.ROPE_STRIDE)[:, None] + r[None, :], mask=ok[:, None] & rm, other=0)
    sc = nj.e4m3_to_f32(s, G.HW)[:, :, None]
    v = tl.join(nj.e2m1_value(b) * sc, nj.e2m1_value(b.to(tl.int32) >> 4) * sc)  # low nibble first
    bits = nj.bf16_bits(tl.reshape(v, (BLOCK_M, G.NB_P2, G.QB)), G.HW)
    out = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
    tl.store(out_row[:, None, None] + out[None, :, :], bits.to(tl.int16), mask=live[:, None, None] & inb[:, :, None])
    rbits = nj.bf16_bits(nj.e4m3_to_f32(rb, G.HW), G.HW)
    tl.store(out_row[:, None] + G.NOPE + r[None, :], rbits.to(tl.int16), mask=live[:, None] & rm)
