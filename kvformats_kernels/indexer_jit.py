"""Triton kernels of the indexer key formats: fp8_indexer (spec/upstream.md §3) and mxfp4_indexer
(§4). Rows are NB blocks of QB values; offsets arrive as constexprs read off the layout (one
named tuple G, _common.constants)."""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.rows_jit import locate_slot, record_slots


@triton.jit
def fp8_encode_kernel(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                      PAGE_SIZE: tl.constexpr, G: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr,
                      FLOOR_ON_SCALE: tl.constexpr, E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                      FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr, POW2: tl.constexpr, IS_BF16: tl.constexpr,
                      EXP_FLAT: tl.constexpr, BLOCK_M: tl.constexpr, SITE: tl.constexpr, HW: tl.constexpr = False,
                      SHORT_E: tl.constexpr = False, E_FLOOR: tl.constexpr = 0, EM_CARRY: tl.constexpr = 0,
                      EM_FIELD: tl.constexpr = 0):
    """G: the row's geometry (geometry.block_constants, as the decode bodies). Default rule: e =
    ceil_log2(max(amax / 448, 1e-10)); bytes e4m3(x * 2^-e); scale = float32 2^e (LE).
    POW2=False (a profile storing arbitrary scales): s = the rule's float32 quotient, bytes
    e4m3(x / s) with one correctly rounded division, as the reference. SHORT_E with bf16 input:
    the exponent of a block maximum of 8 significant bits in four integer operations
    (nj.block_exponent_short; _common.short_exponent says which rules allow it)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = page * page_stride
    blk = tl.arange(0, G.NB_P2)
    elem = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
    m3 = ok[:, None, None] & (blk < G.NB)[None, :, None]
    x = nj.load_f32((x_ptr + rows * x_stride)[:, None, None] + elem[None, :, :],
                    in_range[:, None, None] & (blk < G.NB)[None, :, None], IS_BF16)  # overlaps the slot load
    if POW2:
        if SHORT_E and IS_BF16:
            e = nj.block_exponent_short(nj.abs_max(x, 2), E_FLOOR, EM_CARRY, EM_FIELD, E_MAX)
        else:
            e = nj.tile_exponent(nj.abs_max(x, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, EXP_FLAT,
                                 FLOOR_MODE, ELEM_EMAX)
        codes = nj.e4m3_code(x * nj.pow2(-e)[:, :, None], HW)
        bits = nj.pow2_bits(e)
    else:
        q = nj.block_scale(nj.abs_max(x, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE)
        codes = nj.e4m3_code(tl.math.div_rn(x, tl.broadcast_to(q[:, :, None], x.shape)), HW)
        bits = nj.f32_bits(q)
    tl.store((cache_ptr + base + G.VAL_OFF + row * G.VAL_STRIDE)[:, None, None] + elem[None, :, :],
             codes.to(tl.uint8), mask=m3)
    scale_at = (cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + 4 * blk[None, :]
    m2 = ok[:, None] & (blk < G.NB)[None, :]
    for i in tl.static_range(4):
        tl.store(scale_at + i, ((bits >> (8 * i)) & 0xFF).to(tl.uint8), mask=m2)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def fp8_decode_body(cache_ptr, aux_ptr, page, row, ok, out_row, live, page_stride, aux_stride, G: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    """The fp8_indexer decode body (rows_jit.decode_kernel): float32 rows ``out_row`` [BM
    pointers] (where live) = e4m3 value * float32 scale of the rows at (page, row); zeros where
    not ok. G: the row's geometry (geometry.block_constants) and HW, the GPU's e4m3 conversion."""
    base = page * page_stride
    blk = tl.arange(0, G.NB_P2)
    elem = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
    inb = (blk < G.NB)[None, :, None]
    b = tl.load((cache_ptr + base + G.VAL_OFF + row * G.VAL_STRIDE)[:, None, None] + elem[None, :, :],
                mask=ok[:, None, None] & inb, other=0)
    scale_at = (cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + 4 * blk[None, :]
    m2 = ok[:, None] & (blk < G.NB)[None, :]
    bits = tl.zeros((BLOCK_M, G.NB_P2), tl.int32)
    for i in tl.static_range(4):
        bits = bits | (tl.load(scale_at + i, mask=m2, other=0).to(tl.int32) << (8 * i))
    v = nj.e4m3_to_f32(b, G.HW) * nj.bits_f32(bits)[:, :, None]
    tl.store(out_row[:, None, None] + elem[None, :, :], v, mask=live[:, None, None] & inb)


@triton.jit
def _store_nibbles(at, codes, mask):
    """e2m1 codes [P, QB] as QB / 2 bytes at each of the P byte pointers ``at`` (element 2k in
    the low nibble)."""
    P: tl.constexpr = codes.shape[0]
    HQ: tl.constexpr = codes.shape[1] // 2
    lo, hi = tl.split(tl.reshape(codes, (P, HQ, 2)))  # element 2k, element 2k + 1
    tl.store(at[:, None] + tl.arange(0, HQ)[None, :], (lo | (hi << 4)).to(tl.uint8), mask=mask[:, None])


@triton.jit
def store_nibble_words(at, words, mask, WORDS: tl.constexpr):
    """Little-endian words [P, QB / 8] of nibbles (nj.e2m1_words_hw) at the P byte pointers
    ``at``: as int32 stores where WORDS (the launcher checked every address is a multiple of
    4), else byte by byte."""
    P: tl.constexpr = words.shape[0]
    NW: tl.constexpr = words.shape[1]
    if WORDS:
        wp = at.to(tl.pointer_type(tl.int32))
        tl.store(wp[:, None] + tl.arange(0, NW)[None, :], words, mask=mask[:, None])
    else:
        k = tl.arange(0, 4)
        b = (words[:, :, None] >> (8 * k)[None, None, :]) & 0xFF
        tl.store(at[:, None] + tl.arange(0, 4 * NW)[None, :], tl.reshape(b, (P, 4 * NW)).to(tl.uint8),
                 mask=mask[:, None])


@triton.jit
def mxfp4_encode_kernel(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                        PAGE_SIZE: tl.constexpr, G: tl.constexpr, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr,
                        FLOOR_ON_SCALE: tl.constexpr, E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                        FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr, E2M1_RNE: tl.constexpr,
                        E2M1_SIGNED_ZERO: tl.constexpr, IS_BF16: tl.constexpr, EXP_FLAT: tl.constexpr,
                        BLOCK_M: tl.constexpr, SITE: tl.constexpr, LANE: tl.constexpr = False,
                        SHORT_E: tl.constexpr = False, E_FLOOR: tl.constexpr = 0, EM_CARRY: tl.constexpr = 0,
                        EM_FIELD: tl.constexpr = 0, HW: tl.constexpr = False, WORDS: tl.constexpr = False):
    """G: the row's geometry (geometry.block_constants, as the decode bodies). Default rule: e =
    ceil_log2(max(amax, 1e-4) / 6); nibbles by threshold (element 2k low); scale e + 127. Other
    profiles: their exponent rule and e2m1 rounding (constexprs).
    LANE: each (row, block) pair of the program in one lane; else the [rows, blocks, values]
    tile that Triton spreads a block over four lanes of (kept for programs with fewer pairs
    than lanes, and to compare against).

    Why: the MXFP4 encode is bound by instruction issue, not memory.
    Spread over four lanes, a block's maximum takes shuffles and its exponent (a division and
    a ceil_log2) is worked out by all four; here both are one lane's. The pairs go along one
    axis, row-major (lanes 4k..4k+3 hold one row's four blocks), loaded as [pairs, QB / V, V]
    so that Triton's coalescing gives the pair axis the lanes (as the query kernels'
    ``thread_rows``); a warp's nibble store is then 8 rows x 64 contiguous bytes. Launch it only
    with at least one pair per lane (BLOCK_M * NB_P2 >= 32 * num_warps, the launcher's rule):
    with fewer, Triton spreads a block over lanes that also repeat each other, and on the H200
    such programs stored wrong codes (docs/reliability.md, finding 6).

    The e2m1 codes take ``e2m1_code_short`` (about half the instructions) when the program's
    blocks allow it: bf16 input (8 significant bits), the default rounding and sign rule, and
    every scaled block maximum finite and below 7 (true of finite input under any ceil-rule
    profile). Otherwise the full ``e2m1_code``; the same bytes either way. On that short path
    with HW (GPU only) the nibbles come four f16 pairs to a word (nj.e2m1_words_hw: about half
    the instructions again), stored as int32 words where WORDS (every value address a multiple
    of 4). With bf16 input and a rule that allows it (SHORT_E: _common.short_exponent) a block's
    exponent takes four integer operations (nj.block_exponent_short) instead of a division
    and a float32 log2."""
    HQ: tl.constexpr = G.QB // 2
    if LANE:
        V: tl.constexpr = 8 if G.QB % 8 == 0 else G.QB
        P: tl.constexpr = BLOCK_M * G.NB_P2
        pr = tl.arange(0, P)
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + pr // G.NB_P2
        blk = pr % G.NB_P2
        live = blk < G.NB
        in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
        col = (tl.arange(0, G.QB // V) * V)[:, None] + tl.arange(0, V)[None, :]
        x = nj.load_f32((x_ptr + rows * x_stride + blk * G.QB)[:, None, None] + col[None, :, :],
                        (in_range & live)[:, None, None], IS_BF16)  # overlaps the slot load
        x = tl.reshape(x, (P, G.QB))
        amax = nj.abs_max(x, 1)
        if SHORT_E and IS_BF16:  # the maximum of bf16 values: 8 significant bits
            e = nj.block_exponent_short(amax, E_FLOOR, EM_CARRY, EM_FIELD, E_MAX)
        else:
            e = nj.block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE, ELEM_EMAX)
        scale = nj.pow2(-e)
        y = x * scale[:, None]
        base = cache_ptr + page * page_stride
        at = base + G.VAL_OFF + row * G.VAL_STRIDE + blk * HQ
        SHORT_RULES: tl.constexpr = IS_BF16 and not E2M1_RNE and not E2M1_SIGNED_ZERO
        if SHORT_RULES:
            # amax * 2^-e is the largest |y| of the block (a product by a power of two is monotone);
            # compared as bit patterns, where NaN and Inf lie above 7 (tl.max on floats drops NaN)
            top = tl.max(tl.where(live, nj.f32_bits(amax * scale) & 0x7FFFFFFF, 0))
            if top < 0x40E00000:  # 7.0
                if HW:
                    store_nibble_words(at, nj.e2m1_words_hw(y), ok & live, WORDS)
                else:
                    _store_nibbles(at, nj.e2m1_code_short(y), ok & live)
            else:
                _store_nibbles(at, nj.e2m1_code(y, E2M1_RNE, E2M1_SIGNED_ZERO), ok & live)
        else:
            _store_nibbles(at, nj.e2m1_code(y, E2M1_RNE, E2M1_SIGNED_ZERO), ok & live)
        s = nj.ue8m0_byte(e)
        tl.store(base + G.SCALE_OFF + row * G.SCALE_STRIDE + blk, s.to(tl.uint8), mask=ok & live)
        record_slots(err_ptr, rows, slot, capacity, SITE)
    else:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
        base = page * page_stride
        blk = tl.arange(0, G.NB_P2)
        elem = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
        pair = blk[:, None] * HQ + tl.arange(0, HQ)[None, :]
        live = (blk < G.NB)[None, :, None]
        x = nj.load_f32((x_ptr + rows * x_stride)[:, None, None] + elem[None, :, :], in_range[:, None, None] & live,
                        IS_BF16)  # overlaps the slot load
        e = nj.tile_exponent(nj.abs_max(x, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, EXP_FLAT,
                             FLOOR_MODE, ELEM_EMAX)
        codes = nj.e2m1_code(x * nj.pow2(-e)[:, :, None], E2M1_RNE, E2M1_SIGNED_ZERO)
        lo, hi = tl.split(tl.reshape(codes, (BLOCK_M, G.NB_P2, HQ, 2)))  # element 2k, element 2k + 1
        tl.store((cache_ptr + base + G.VAL_OFF + row * G.VAL_STRIDE)[:, None, None] + pair[None, :, :],
                 (lo | (hi << 4)).to(tl.uint8), mask=ok[:, None, None] & live)
        s = nj.ue8m0_byte(e)
        tl.store((cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + blk[None, :], s.to(tl.uint8),
                 mask=ok[:, None] & (blk < G.NB)[None, :])
        record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def mxfp4_decode_body(cache_ptr, aux_ptr, page, row, ok, out_row, live, page_stride, aux_stride, G: tl.constexpr,
                      BLOCK_M: tl.constexpr):
    """The mxfp4_indexer decode body (rows_jit.decode_kernel): float32 rows ``out_row`` (where
    live) = e2m1 value * 2^(s-127) of the rows at (page, row). G: the row's geometry
    (geometry.block_constants); FF_NAN: a scale byte 0xFF reads NaN, else +Inf (non-zero codes ±Inf,
    zero codes 0 * Inf = NaN in the product itself); STREAM: the rows are stored with the .cs
    (streaming, evict-first) cache hint."""
    HQ: tl.constexpr = G.QB // 2
    base = page * page_stride
    blk = tl.arange(0, G.NB_P2)
    pair = blk[:, None] * HQ + tl.arange(0, HQ)[None, :]
    inb = (blk < G.NB)[None, :, None]
    b = tl.load((cache_ptr + base + G.VAL_OFF + row * G.VAL_STRIDE)[:, None, None] + pair[None, :, :],
                mask=ok[:, None, None] & inb, other=0)
    s = tl.load((cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + blk[None, :],
                mask=ok[:, None] & (blk < G.NB)[None, :], other=127)
    sc = nj.ue8m0_value(s, G.FF_NAN)[:, :, None]
    v = tl.join(nj.e2m1_value(b) * sc, nj.e2m1_value(b.to(tl.int32) >> 4) * sc)  # low nibble first
    elem = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
    at = out_row[:, None, None] + elem[None, :, :]
    if G.STREAM:
        tl.store(at, tl.reshape(v, (BLOCK_M, G.NB_P2, G.QB)), mask=live[:, None, None] & inb, cache_modifier=".cs")
    else:
        tl.store(at, tl.reshape(v, (BLOCK_M, G.NB_P2, G.QB)), mask=live[:, None, None] & inb)
