"""Triton kernels of the DeepSeek V4.1 page formats: fp8_ds_mla_v41 (528 B rows, every dim e4m3
with a ue8m0 scale per 32) and fp4_ds_mla_v41 (288 B rows, e2m1 nibbles with an e4m3 scale per 16),
each page-planar or token-interleaved (the *_interleaved formats).

A row is NB blocks of QB values, a data record and a scale record; every offset arrives as a
constexpr read off the layout's regions (kvformats_kernels/v41.py), so the two layouts of a
format take the same kernels. FP4 picks the format in the shared bodies; the numerics profile
arrives as constexprs too (v41._rule_constants). Rounding is done as the reference does it
(kvformats/formats/*_v41.py), on bit patterns where the interpreter's float casts would round
otherwise (numerics_jit).
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
def fp4_scale_byte(amax, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                   RECIPROCAL: tl.constexpr, RCP: tl.constexpr, HW: tl.constexpr, SHORT: tl.constexpr = False):
    """The e4m3 scale byte (int32, sign bit clear) of fp4 blocks with absolute maximum ``amax``
    (float32 >= 0 or NaN), as fp4_ds_mla_v41.E4m3ScaleRule.scale_bytes: q = fl32(amax / ELEM_MAX)
    floored at FLOOR (on q with FLOOR_ON_SCALE, else on amax: nj.block_scale), or with RECIPROCAL
    (vLLM's product) q = fl32(amax * RCP) floored at FLOOR, RCP = fl32(1 / ELEM_MAX); then e4m3
    round-half-even: e4m3_code saturates at 448 (the rule's SCALE_MAX, an Inf maximum too),
    gives 0x7F for NaN, and rounds a q below 2^-6 to a subnormal scale (steps of 2^-9, the
    floor) as torch's float8_e4m3fn cast does, in both of its paths. SHORT: amax is a maximum of
    bf16 values, so the division may take nj.quotient_short (HW: a product and one fused
    correction)."""
    if RECIPROCAL:
        q = nj.max_nan(amax * tl.full(amax.shape, RCP, tl.float32), FLOOR)
    elif SHORT and FLOOR_ON_SCALE:
        q = nj.max_nan(nj.quotient_short(amax, ELEM_MAX, HW), FLOOR)
    else:
        q = nj.block_scale(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE)
    return nj.e4m3_code(q, HW) & 0x7F


@triton.jit
def fp8_divided(x, y, amax, e):
    """The e4m3 inputs of fp8 blocks under a profile's poison_nonfinite (FlashMLA's writer,
    nx.e4m3_quantize_divided): x / scale, one correctly rounded division, where the block maximum
    ``amax`` [BM, NB] is NaN (scale NaN) or +Inf (scale 2^e = +Inf, e = 128): NaN codes and
    signed zeros; elsewhere ``y`` (x * 2^-e, the same value as x / 2^e). The division runs only
    in programs holding such a block (a branch on the program's blocks, not per element)."""
    bad = nj.f32_bits(amax) >= 0x7F800000
    if tl.max(tl.max(bad.to(tl.int32), 1), 0) > 0:
        scale = tl.where(amax == amax, nj.pow2(e), nj.bits_f32(tl.full(amax.shape, 0x7FC00000, tl.int32)))
        y = tl.where(bad[:, :, None], tl.math.div_rn(x, tl.broadcast_to(scale[:, :, None], x.shape)), y)
    return y


@triton.jit
def _nan_nibbles(x, NAN_SIGN: tl.constexpr):
    """The nibble of an element whose x / s is NaN: 0, or with NAN_SIGN (FlashMLA) 0x8 where the
    element itself is a NaN with its sign bit set."""
    if NAN_SIGN:
        return tl.where(x != x, (x.to(tl.int32, bitcast=True) >> 28) & 8, 0)
    return tl.zeros(x.shape, tl.int32)


@triton.jit
def _nan_words(x, NAN_SIGN: tl.constexpr):
    """_nan_nibbles of x [P, QB] packed as little-endian words [P, QB / 8] (element 8w + i at
    bits 4i of word w), the layout of nj.e2m1_rne_words."""
    P: tl.constexpr = x.shape[0]
    QB: tl.constexpr = x.shape[1]
    if NAN_SIGN:
        nib = tl.reshape(_nan_nibbles(x, NAN_SIGN), (P, QB // 8, 8))
        return tl.sum(nib << (tl.arange(0, 8) * 4)[None, None, :], axis=2)
    return tl.zeros((P, QB // 8), tl.int32)


@triton.jit
def _fp4_encode_lanes(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                      PAGE_SIZE: tl.constexpr, VAL_OFF: tl.constexpr, VAL_STRIDE: tl.constexpr,
                      SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr,
                      QB: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                      RECIPROCAL: tl.constexpr, RCP: tl.constexpr, BLOCK_M: tl.constexpr, SITE: tl.constexpr,
                      WORDS: tl.constexpr, HW: tl.constexpr, NAN_SIGN: tl.constexpr):
    """The fp4 encode of bf16 rows, one (row, block) pair per lane (the launcher gives every
    lane at least one pair, and rows on 16 bytes: see v41._lanes for why): a block's maximum, scale and
    reciprocal are that lane's own (no shuffles), and its nibbles come from the f16-pair PTX
    (nj.e2m1_rne_words, which makes x times about 1 / s give the codes of fl32(x / s)): no
    division per element and no branch, about a quarter of the instructions of the per-element
    path, which was bound by issuing them, not by memory. The scale byte is fp4_scale_byte's."""
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
    sbyte = fp4_scale_byte(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, RECIPROCAL, RCP, HW, True).to(tl.uint8)
    r = nj.fp4_reciprocal(nj.e4m3_to_f32(sbyte, HW), HW)
    # a NaN in a block makes its scale NaN (0x7F), hence every value of it: code 0
    words = tl.where((sbyte == 0x7F)[:, None], _nan_words(x, NAN_SIGN), nj.e2m1_rne_words(x * r[:, None], HW))
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
                  RECIPROCAL: tl.constexpr, RCP: tl.constexpr, POISON: tl.constexpr, NAN_SIGN: tl.constexpr,
                  IS_BF16: tl.constexpr, BLOCK_M: tl.constexpr, SITE: tl.constexpr, HW: tl.constexpr = False,
                  WORDS: tl.constexpr = False, LANES: tl.constexpr = False):
    """Rows x [N, NB * QB] (bf16 / fp16 / fp32, rounded to bf16 first) into the rows at slots
    (skipped outside [0, capacity); a slot >= capacity recorded at SITE).

    528 B rows: e = the ScaleRule's exponent of the block maximum (its floor on amax or, with
    FLOOR_ON_SCALE, on amax / ELEM_MAX: nj.block_exponent), bytes e4m3(x * 2^-e), scale byte
    clamp(e + 127, 0, 255); POISON (the profile's poison_nonfinite): a block whose maximum is NaN
    or Inf codes x / scale instead (fp8_divided). FP4 (288 B rows): s = the e4m3 scale of
    fp4_scale_byte (floor FLOOR, down to e4m3's subnormals; RECIPROCAL: vLLM's amax * RCP),
    nibbles e2m1(fl32(x / s)) round-half-even with the sign of zero kept, and 0 where x / s is
    NaN (NAN_SIGN: 0x8 for an element that is a NaN with its sign bit set); with LANES through
    _fp4_encode_lanes. POISON is never set for FP4 (the fp4 rule has no
    such case: v41._rule_constants). WORDS: every data address is a multiple of 4 (nibbles may
    go as int32 words)."""
    tl.static_assert(not FP4 or SCALE_MAX == 448.0, "e4m3_code's saturation is the fp4 scale's clamp")
    if FP4 and LANES:
        _fp4_encode_lanes(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                          PAGE_SIZE, VAL_OFF, VAL_STRIDE, SCALE_OFF, SCALE_STRIDE, NB, NB_P2, QB, FLOOR, ELEM_MAX,
                          FLOOR_ON_SCALE, RECIPROCAL, RCP, BLOCK_M, SITE, WORDS, HW, NAN_SIGN)
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
        sbyte = fp4_scale_byte(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, RECIPROCAL, RCP, HW)
        s = nj.e4m3_value(sbyte)
        y = tl.math.div_rn(x, tl.broadcast_to(s[:, :, None], x.shape))
        codes = tl.where(y == y, nj.e2m1_code(y, True, True), _nan_nibbles(x, NAN_SIGN))  # NaN has no code
        _store_block_nibbles((cache_ptr + base + VAL_OFF + row * VAL_STRIDE)[:, None] + blk[None, :] * (QB // 2),
                             codes, m2)
        tl.store(scale_at, sbyte.to(tl.uint8), mask=m2)
    else:
        e = nj.block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
        y = x * nj.pow2(-e)[:, :, None]
        if POISON:
            y = fp8_divided(x, y, amax, e)
        codes = nj.e4m3_code(y, HW)
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
