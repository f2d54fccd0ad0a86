"""Triton kernels of fp8_ds_mla (spec/upstream.md §2) and its V3.2 form: encode and decode of whole rows.

A row is NB NoPE blocks of QB values (float8_e4m3fn) with one scale each — a ue8m0 byte (V4) or,
with SCALE_F32, a little-endian float32 (V3.2, 656 B rows; arbitrary scales when not POW2) —
and a RoPE tail of ROPE bf16 values; every offset arrives as a constexpr read off the layout's
regions.
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels.rows_jit import locate_slot, record_slots


@triton.jit
def store_row(cache_ptr, base, row, ok, nope_ok, codes, s, h, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
              ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr, SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
              PAD_OFF: tl.constexpr, PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr, PAD_P2: tl.constexpr,
              NB: tl.constexpr, ROPE: tl.constexpr, TAIL_AT: tl.constexpr, SCALE_F32: tl.constexpr = False,
              POW2: tl.constexpr = True):
    """Write whole rows where ``ok`` [BM], at the pages' byte offsets ``base`` and rows ``row``
    [BM]: the NoPE blocks' e4m3 codes [BM, NB_P2, QB] where ``nope_ok`` (``ok`` and block < NB,
    [BM, NB_P2, 1]), their scales s [BM, NB_P2] (exponents e of scales 2^e, stored as ue8m0
    bytes; with SCALE_F32 as float32, four bytes little endian, where s holds the float32 scales
    themselves unless POW2), the record's pad bytes (always 0)
    and the RoPE tail from h [BM, W] (bf16 bits; tail element j in column TAIL_AT + j), little
    endian: element j's low byte at 2j, high byte at 2j + 1. The encode kernel and the SWA insert
    write their rows here (the compress insert's one-row form keeps its own layouts:
    compress_jit.store_ds_mla).

    ``nope_ok`` comes from the caller so that the encode kernel can form it before its loads, as
    it did when this code was its own: formed here, the same instructions take more registers."""
    BM: tl.constexpr = codes.shape[0]
    NB_P2: tl.constexpr = codes.shape[1]
    QB: tl.constexpr = codes.shape[2]
    W: tl.constexpr = h.shape[1]
    tl.static_assert((s.shape[0] == BM) & (s.shape[1] == NB_P2) & (h.shape[0] == BM), "codes, s, h: one row each")
    tl.static_assert((NB <= NB_P2) & (TAIL_AT + ROPE <= W), "the NoPE blocks and the tail lie inside their tiles")
    blk = tl.arange(0, NB_P2)
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    nope_at = cache_ptr + base + NOPE_OFF + row * NOPE_STRIDE
    tl.store(nope_at[:, None, None] + elem[None, :, :], codes.to(tl.uint8), mask=nope_ok)
    scale_at = cache_ptr + base + SCALE_OFF + row * SCALE_STRIDE
    m2 = ok[:, None] & (blk < NB)[None, :]
    if SCALE_F32:
        if POW2:
            sbits = nj.pow2_bits(s)
        else:
            sbits = nj.f32_bits(s)
        for i in tl.static_range(4):
            tl.store(scale_at[:, None] + 4 * blk[None, :] + i, ((sbits >> (8 * i)) & 0xFF).to(tl.uint8), mask=m2)
    else:
        tl.store(scale_at[:, None] + blk[None, :], nj.ue8m0_byte(s).to(tl.uint8), mask=m2)
    if PAD_BYTES > 0:
        p = tl.arange(0, PAD_P2)
        pad_at = cache_ptr + base + PAD_OFF + row * PAD_STRIDE
        tl.store(pad_at[:, None] + p[None, :], tl.zeros((BM, PAD_P2), tl.uint8),
                 mask=ok[:, None] & (p < PAD_BYTES)[None, :])
    # A tail bound only where a column of the tile lies outside the tail: left of it in the SWA
    # insert's right-aligned tile, right of it in a tile wider than the tail.
    pairs = tl.reshape(tl.join(h & 0xFF, (h >> 8) & 0xFF), (BM, 2 * W))
    k = tl.arange(0, 2 * W) - 2 * TAIL_AT
    mk = ok[:, None]
    if TAIL_AT > 0:
        mk = mk & (k >= 0)[None, :]
    if TAIL_AT + ROPE < W:
        mk = mk & (k < 2 * ROPE)[None, :]
    rope_at = cache_ptr + base + ROPE_OFF + row * ROPE_STRIDE
    tl.store(rope_at[:, None] + k[None, :], pairs.to(tl.uint8), mask=mk)


@triton.jit
def encode_kernel(x_ptr, slots_ptr, cache_ptr, err_ptr, n_rows, x_stride, slot_stride, capacity, page_stride,
                  PAGE_SIZE: tl.constexpr, NOPE_OFF: tl.constexpr, NOPE_STRIDE: tl.constexpr,
                  ROPE_OFF: tl.constexpr, ROPE_STRIDE: tl.constexpr,
                  SCALE_OFF: tl.constexpr, SCALE_STRIDE: tl.constexpr,
                  PAD_OFF: tl.constexpr, PAD_STRIDE: tl.constexpr, PAD_BYTES: tl.constexpr,
                  PAD_P2: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr, QB: tl.constexpr,
                  ROPE: tl.constexpr, ROPE_P2: tl.constexpr,
                  FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                  E_MIN: tl.constexpr, E_MAX: tl.constexpr, FLOOR_MODE: tl.constexpr, ELEM_EMAX: tl.constexpr,
                  SCALE_F32: tl.constexpr, POW2: tl.constexpr,
                  IS_BF16: tl.constexpr, EXP_FLAT: tl.constexpr, BLOCK_M: tl.constexpr,
                  SITE: tl.constexpr, HW: tl.constexpr = False,
                  SHORT_E: tl.constexpr = False, E_FLOOR: tl.constexpr = 0, EM_CARRY: tl.constexpr = 0,
                  EM_FIELD: tl.constexpr = 0):
    """Rows x [N, head_dim] into the rows at slots (skipped outside [0, capacity); a slot >=
    capacity recorded at SITE in err_ptr's record). SHORT_E: the NoPE blocks' maxima (of
    bf16-rounded values: 8 significant bits) take their exponents in four integer operations
    (nj.block_exponent_short; _common.short_exponent says which rules allow it)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = page * page_stride
    x_row = x_ptr + rows * x_stride

    # NoPE: bf16-round, per-block power-of-two exponent, e4m3 bytes.
    blk = tl.arange(0, NB_P2)
    elem = blk[:, None] * QB + tl.arange(0, QB)[None, :]
    nope_ok = ok[:, None, None] & (blk < NB)[None, :, None]
    # x is read under the row-range mask only, so its load overlaps the slot load
    xq = nj.load_f32(x_row[:, None, None] + elem[None, :, :], in_range[:, None, None] & (blk < NB)[None, :, None],
                     IS_BF16)
    # The RoPE tail is loaded here, before any store: a load cannot move above a store that may
    # alias it, so loading it after the NoPE stores cost a second wait on memory.
    j = tl.arange(0, ROPE_P2)
    mj = in_range[:, None] & (j < ROPE)[None, :]
    if IS_BF16:
        h = tl.load(x_row[:, None] + (NB * QB) + j[None, :], mask=mj, other=0).to(tl.int32)
    else:
        h = nj.bf16_rne_bits(nj.load_f32(x_row[:, None] + (NB * QB) + j[None, :], mj, IS_BF16))
    if not IS_BF16:
        xq = nj.bf16_round(xq)
    if POW2:
        if SHORT_E:
            e = nj.block_exponent_short(nj.abs_max(xq, 2), E_FLOOR, EM_CARRY, EM_FIELD, E_MAX)
        else:
            e = nj.tile_exponent(nj.abs_max(xq, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, EXP_FLAT,
                                 FLOOR_MODE, ELEM_EMAX)
        codes = nj.e4m3_code(xq * nj.pow2(-e)[:, :, None], HW)
        s = e
    else:  # arbitrary float32 scale q, applied by one correctly rounded division (as the reference)
        s = nj.block_scale(nj.abs_max(xq, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE)
        codes = nj.e4m3_code(tl.math.div_rn(xq, tl.broadcast_to(s[:, :, None], xq.shape)), HW)
    store_row(cache_ptr, base, row, ok, nope_ok, codes, s, h, NOPE_OFF, NOPE_STRIDE, ROPE_OFF, ROPE_STRIDE, SCALE_OFF,
              SCALE_STRIDE, PAD_OFF, PAD_STRIDE, PAD_BYTES, PAD_P2, NB, ROPE, 0, SCALE_F32, POW2)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def ue8m0_block_bits(b, s, HW: tl.constexpr, FF_NAN: tl.constexpr):
    """bf16 bits (int32) of e4m3 bytes b [BM, NB, QB] times 2^(s - 127) (ue8m0 bytes s [BM, NB]),
    scale byte 0xFF read as NaN (FF_NAN) or +Inf. With HW the GPU's conversions (NaN bytes and
    scales, and 0 * Inf, give NaN through them); else integer rounding, where NaN can come only
    from a NaN byte (0x7F / 0xFF), a NaN scale (0xFF with FF_NAN) or a zero code times an Inf
    scale: decided on the bytes, so the per-element rounding needs no NaN test (±Inf rounds to
    ±Inf there)."""
    if HW:
        return nj.bf16_bits(nj.e4m3_to_f32(b, HW) * nj.ue8m0_value(s, FF_NAN)[:, :, None], HW)
    else:
        v = nj.e4m3_half_value(b) * 256.0 * nj.ue8m0_value(s, FF_NAN)[:, :, None]
        code = b.to(tl.int32) & 0x7F
        ff = (s == 0xFF)[:, :, None]
        if FF_NAN:
            nan = (code == 0x7F) | ff
        else:
            nan = (code == 0x7F) | (ff & (code == 0))
        return tl.where(nan, 0x7FC0, nj.bf16_rne_bits_nonan(v))


@triton.jit
def decode_body(cache_ptr, rope16_ptr, page, row, ok, out_row, live, page_stride, page_stride16, G: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """The decode body of fp8_ds_mla rows (rows_jit.decode_kernel): the rows at (page, row) [BM]
    (zeros where not ok) into the int16 (bf16 bits) rows ``out_row`` [BM pointers] where live:
    e4m3 * 2^(s-127) rounded to bf16, then the tail. G (fp8_ds_mla._decode_constants): the
    row's geometry; FF_NAN: a ue8m0 scale byte 0xFF reads NaN (else +Inf; the profile's
    ue8m0_ff); HW: the GPU's conversions.

    When the RoPE tail is one quantization block wide (DeepSeek V4: 7 x 64 + 64), a row is one
    [NB + 1, QB] tile whose last block is the tail, so each row leaves in one contiguous store.
    ROPE16: the tail is read as int16 words (its offsets and the page stride are even)."""
    base = page * page_stride
    if G.ROPE == G.QB:
        NBR: tl.constexpr = G.NB + 1  # NB_P2 is then next_pow2(NB + 1) (see the launcher)
        blk = tl.arange(0, G.NB_P2)
        c = tl.arange(0, G.QB)
        elem = blk[:, None] * G.QB + c[None, :]
        nope = (blk < G.NB)[None, :, None]
        tail = (blk == G.NB)[None, :, None]
        b = tl.load((cache_ptr + base + G.NOPE_OFF + row * G.NOPE_STRIDE)[:, None, None] + elem[None, :, :],
                    mask=ok[:, None, None] & nope, other=0)
        s = tl.load((cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None] + blk[None, :],
                    mask=ok[:, None] & (blk < G.NB)[None, :], other=127)
        bits = ue8m0_block_bits(b, s, G.HW, G.FF_NAN)
        if G.ROPE16:
            at = page * page_stride16 + (G.ROPE_OFF // 2) + row * (G.ROPE_STRIDE // 2)
            r = tl.load(rope16_ptr + at[:, None, None] + c[None, None, :], mask=ok[:, None, None] & tail,
                        other=0).to(tl.int32)
        else:
            at = (cache_ptr + base + G.ROPE_OFF + row * G.ROPE_STRIDE)[:, None, None] + 2 * c[None, None, :]
            lo = tl.load(at, mask=ok[:, None, None] & tail, other=0).to(tl.int32)
            hi = tl.load(at + 1, mask=ok[:, None, None] & tail, other=0).to(tl.int32)
            r = lo | (hi << 8)
        bits = tl.where(tail, r, bits)
        tl.store(out_row[:, None, None] + elem[None, :, :], bits.to(tl.int16),
                 mask=live[:, None, None] & (blk < NBR)[None, :, None])
    else:
        blk = tl.arange(0, G.NB_P2)
        elem = blk[:, None] * G.QB + tl.arange(0, G.QB)[None, :]
        inb = (blk < G.NB)[None, :, None]
        b = tl.load((cache_ptr + base + G.NOPE_OFF + row * G.NOPE_STRIDE)[:, None, None] + elem[None, :, :],
                    mask=ok[:, None, None] & inb, other=0)
        scale_at = (cache_ptr + base + G.SCALE_OFF + row * G.SCALE_STRIDE)[:, None]
        if G.SCALE_F32:  # float32 scales (V3.2): any value, NaN from the product itself
            sb = tl.zeros((BLOCK_M, G.NB_P2), tl.int32)
            for i in tl.static_range(4):
                sb = sb | (tl.load(scale_at + 4 * blk[None, :] + i, mask=ok[:, None] & (blk < G.NB)[None, :],
                                   other=0).to(tl.int32) << (8 * i))
            bits = nj.bf16_bits(nj.e4m3_to_f32(b, G.HW) * nj.bits_f32(sb)[:, :, None], G.HW)
        else:
            s = tl.load(scale_at + blk[None, :], mask=ok[:, None] & (blk < G.NB)[None, :], other=127)
            bits = ue8m0_block_bits(b, s, G.HW, G.FF_NAN)
        k = tl.arange(0, 2 * G.ROPE_P2)  # the tail is loaded before the NoPE store (see the encode)
        pairs = tl.load((cache_ptr + base + G.ROPE_OFF + row * G.ROPE_STRIDE)[:, None] + k[None, :],
                        mask=ok[:, None] & (k < 2 * G.ROPE)[None, :], other=0).to(tl.int32)
        tl.store(out_row[:, None, None] + elem[None, :, :], bits.to(tl.int16), mask=live[:, None, None] & inb)
        lo, hi = tl.split(tl.reshape(pairs, (BLOCK_M, G.ROPE_P2, 2)))
        j = tl.arange(0, G.ROPE_P2)
        tl.store(out_row[:, None] + (G.NB * G.QB) + j[None, :], (lo | (hi << 8)).to(tl.int16),
                 mask=live[:, None] & (j < G.ROPE)[None, :])
