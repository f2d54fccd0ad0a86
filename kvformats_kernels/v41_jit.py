"""Triton kernels of the DeepSeek V4.1 page formats: fp8_ds_mla_v41 (528 B rows, every dim e4m3
with a ue8m0 scale per 32) and fp4_ds_mla_v41 (288 B rows, e2m1 nibbles with an e4m3 scale per 16).

A row is NB blocks of QB values, a data record then a scale record; every offset arrives as a
constexpr read off the layout's regions (kvformats_kernels/v41.py). FP4 picks the format in the
shared bodies. Rounding is done as the reference does it (kvformats/formats/*_v41.py), on bit
patterns where the interpreter's float casts would round otherwise (numerics_jit).
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.fp8_ds_mla_jit import ue8m0_block_bits
from kvformats_kernels.indexer_jit import store_nibble_words
from kvformats_kernels.rows_jit import lane_pairs, locate_slot, record_slots


@triton.jit
def _store_block_nibbles(at, codes, mask):
    """e2m1 codes [BM, NB, QB] as QB / 2 bytes per block at the byte pointers ``at`` [BM, NB]
    (element 2k in the low nibble)."""
    BM: tl.constexpr = codes.shape[0]
    NB: tl.constexpr = codes.shape[1]
    HQ: tl.constexpr = codes.shape[2] // 2
    lo, hi = tl.split(tl.reshape(codes, (BM, NB, HQ, 2)))  # element 2k, element 2k + 1
    k = tl.arange(0, HQ)
    tl.store(at[:, :, None] + k[None, None, :], (lo | (hi << 4)).to(tl.uint8), mask=mask[:, :, None])


@triton.jit
def _fp4_encode_lanes(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                      PAGE_SIZE: tl.constexpr, VAL_OFF: tl.constexpr, VAL_STRIDE: tl.constexpr,
                      SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr,
                      QB: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, BLOCK_M: tl.constexpr,
                      SITE: tl.constexpr, WORDS: tl.constexpr, HW: tl.constexpr):
    """The fp4 encode of bf16 rows, one (row, block) pair per lane (the launcher gives every
    lane at least one pair, and rows on 16 bytes: see v41._lanes for why): a block's maximum, scale and
    reciprocal are that lane's own (no shuffles), and its nibbles come from the f16-pair PTX
    (nj.e2m1_rne_words, which makes x times about 1 / s give the codes of fl32(x / s)): no
    division per element and no branch, about a quarter of the instructions of the per-element
    path, which was bound by issuing them, not by memory."""
    tl.static_assert(QB % 8 == 0, "the e2m1 words take eight values")
    P: tl.constexpr = BLOCK_M * NB_P2
    rows, blk, live, in_range, ok, page, row, slot = lane_pairs(slots_ptr, slot_stride, n_rows, capacity, BLOCK_M,
                                                                NB, NB_P2, PAGE_SIZE)
    # [pairs, QB / 8, 8]: Triton's coalescing then gives the pair axis the lanes
    col = (tl.arange(0, QB // 8) * 8)[:, None] + tl.arange(0, 8)[None, :]
    x = nj.load_f32((x_ptr + rows * x_stride + blk * QB)[:, None, None] + col[None, :, :],
                    (in_range & live)[:, None, None], True)  # overlaps the slot load
    x = tl.reshape(x, (P, QB))
    amax = nj.abs_max(x, 1)
    q = nj.max_nan(nj.quotient_short(amax, ELEM_MAX, HW), FLOOR)
    sbyte = (nj.e4m3_code(q, HW) & 0x7F).to(tl.uint8)
    r = nj.fp4_reciprocal(nj.e4m3_to_f32(sbyte, HW), HW)
    # a NaN in a block makes its scale NaN (0x7F), hence every value of it: code 0
    words = tl.where((sbyte == 0x7F)[:, None], 0, nj.e2m1_rne_words(x * r[:, None], HW))
    base = cache_ptr + page * page_stride
    store_nibble_words(base + VAL_OFF + row * VAL_STRIDE + blk * (QB // 2), words, ok & live, WORDS)
    tl.store(base + SCALE_OFF + row * SCALE_STRIDE + blk, sbyte, mask=ok & live)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def v41_encode_kernel(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                  PAGE_SIZE: tl.constexpr, VAL_OFF: tl.constexpr, VAL_STRIDE: tl.constexpr,
                  SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
                  NB: tl.constexpr, NB_P2: tl.constexpr, QB: tl.constexpr, FP4: tl.constexpr,
                  FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                  E_MIN: tl.constexpr, E_MAX: tl.constexpr, SCALE_MAX: tl.constexpr,
                  IS_BF16: tl.constexpr, BLOCK_M: tl.constexpr, SITE: tl.constexpr, HW: tl.constexpr = False,
                  WORDS: tl.constexpr = False, LANES: tl.constexpr = False):
    """Rows x [N, NB * QB] (bf16 / fp16 / fp32, rounded to bf16 first) into the rows at slots
    (skipped outside [0, capacity); a slot >= capacity recorded at SITE).

    528 B rows: e = the ScaleRule's exponent of the block maximum, bytes e4m3(x * 2^-e), scale
    byte clamp(e + 127, 0, 255). FP4 (288 B rows): s = e4m3(clamp(fl32(amax / ELEM_MAX), FLOOR,
    SCALE_MAX)) with its sign bit clear (e4m3_code saturates at 448 and gives 0x7F for NaN, so
    only the floor needs a compare), nibbles e2m1(fl32(x / s)) round-half-even with the sign
    of zero kept, and 0 where x / s is NaN; with LANES through _fp4_encode_lanes. WORDS: every
    data address is a multiple of 4 (nibbles may go as int32 words)."""
    if FP4 and LANES:
        _fp4_encode_lanes(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                          PAGE_SIZE, VAL_OFF, VAL_STRIDE, SCALE_OFF, SCALE_STRIDE, NB, NB_P2, QB, FLOOR, ELEM_MAX,
                          BLOCK_M, SITE, WORDS, HW)
        return
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = page * page_stride
    blk = tl.arange(0, NB_P2)
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    inb = (blk < NB)[None, :]
    # x is read under the row-range mask only, so its load overlaps the slot load
    x = nj.load_f32((x_ptr + rows * x_stride)[:, None, None] + elem[None, :, :],
                    in_range[:, None, None] & inb[:, :, None], IS_BF16)
    if not IS_BF16:
        x = nj.bf16_round(x)
    amax = nj.abs_max(x, 2)
    scale_at = (cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE)[:, None] + blk[None, :]
    m2 = ok[:, None] & inb
    if FP4:
        q = nj.max_nan(tl.math.div_rn(amax, tl.full(amax.shape, ELEM_MAX, tl.float32)), FLOOR)
        sbyte = nj.e4m3_code(q, HW) & 0x7F  # clamps at SCALE_MAX = 448 itself; NaN -> 0x7F
        s = nj.e4m3_value(sbyte)
        y = tl.math.div_rn(x, tl.broadcast_to(s[:, :, None], x.shape))
        codes = tl.where(y == y, nj.e2m1_code(y, True, True), 0)  # NaN has no code: 0
        _store_block_nibbles((cache_ptr + base + VAL_OFF + row * VAL_STRIDE)[:, None] + blk[None, :] * (QB // 2),
                             codes, m2)
        tl.store(scale_at, sbyte.to(tl.uint8), mask=m2)
    else:
        e = nj.block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
        codes = nj.e4m3_code(x * nj.pow2(-e)[:, :, None], HW)
        tl.store((cache_ptr + base + VAL_OFF + row * VAL_STRIDE)[:, None, None] + elem[None, :, :],
                 codes.to(tl.uint8), mask=m2[:, :, None])
        tl.store(scale_at, nj.ue8m0_byte(e).to(tl.uint8), mask=m2)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def decode_body(cache_ptr, aux_ptr, page, row, ok, out_row, live, page_stride, aux_stride, G: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """The decode body of both V4.1 formats (rows_jit.decode_kernel; G.FP4 picks): bf16 bits
    (int16) of the rows at (page, row) [BM] (zeros where not ok) into ``out_row`` [BM pointers]
    where live: 528 B rows e4m3 * 2^(s - 127), FP4 rows e2m1 * e4m3 scale (exact), each rounded
    once to bf16 (NaN codes and scales give NaN; a ue8m0 byte 0xFF reads NaN with FF_NAN, else
    +Inf, as the profile says)."""
    base = page * page_stride
    blk = tl.arange(0, G.NB_P2)
    inb = (blk < G.NB)[None, :]
    s = tl.load((cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + blk[None, :],
                mask=ok[:, None] & inb, other=0)
    if G.FP4:
        HQ: tl.constexpr = G.QB // 2
        pair = blk[:, None] * HQ + tl.arange(0, HQ)[None, :]
        b = tl.load((cache_ptr + base + G.VAL_OFF + row * G.VAL_STRIDE)[:, None, None] + pair[None, :, :],
                    mask=ok[:, None, None] & inb[:, :, None], other=0)
        sc = nj.e4m3_to_f32(s, G.HW)[:, :, None]
        v = tl.join(nj.e2m1_value(b) * sc, nj.e2m1_value(b.to(tl.int32) >> 4) * sc)  # low nibble first
        bits = nj.bf16_bits(tl.reshape(v, (BLOCK_M, G.NB_P2, G.QB)), G.HW)
    else:
        elem = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
        b = tl.load((cache_ptr + base + G.VAL_OFF + row * G.VAL_STRIDE)[:, None, None] + elem[None, :, :],
                    mask=ok[:, None, None] & inb[:, :, None], other=0)
        bits = ue8m0_block_bits(b, s, G.HW, G.FF_NAN)
    out = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
    tl.store(out_row[:, None, None] + out[None, :, :], bits.to(tl.int16), mask=live[:, None, None] & inb[:, :, None])


@triton.jit
def fp4_decode_lanes_kernel(cache_ptr, slots_ptr, out_ptr, err_ptr, n_rows, slot_stride, capacity, page_stride,
                            PAGE_SIZE: tl.constexpr, VAL_OFF: tl.constexpr, VAL_STRIDE: tl.constexpr,
                            SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr, NB: tl.constexpr,
                            NB_P2: tl.constexpr, QB: tl.constexpr, FP4: tl.constexpr, BLOCK_M: tl.constexpr,
                            SITE: tl.constexpr, HW: tl.constexpr):
    """The fp4 slot decode of word-aligned records, one (row, block) pair per lane (the other
    decodes take decode_body through rows_jit's kernels): its data record's words and scale
    byte in, its bf16 values out as int32 pairs (nj.e2m1_bf16_words; with HW about four
    instructions a value, against eighteen for codes decoded one by one and joined)."""
    tl.static_assert(FP4 and QB % 8 == 0, "fp4 rows: a data word holds eight values")
    rows, blk, live, in_range, ok, page, row, slot = lane_pairs(slots_ptr, slot_stride, n_rows, capacity, BLOCK_M,
                                                                NB, NB_P2, PAGE_SIZE)
    base = cache_ptr + page * page_stride
    m = ok & live
    sbyte = tl.load(base + SCALE_OFF + row * SCALE_STRIDE + blk, mask=m, other=0)
    at = (base + VAL_OFF + row * VAL_STRIDE + blk * (QB // 2)).to(tl.pointer_type(tl.int32))
    w = tl.load(at[:, None] + tl.arange(0, QB // 8)[None, :], mask=m[:, None], other=0)
    dst = (out_ptr + rows * (NB * QB) + blk * QB).to(tl.pointer_type(tl.int32))
    tl.store(dst[:, None] + tl.arange(0, QB // 2)[None, :], nj.e2m1_bf16_words(w, nj.e4m3_to_f32(sbyte, HW), HW),
             mask=(in_range & live)[:, None])
    record_slots(err_ptr, rows, slot, capacity, SITE)
