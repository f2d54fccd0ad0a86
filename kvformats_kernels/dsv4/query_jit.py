"""Triton kernels of the DeepSeek V4 query / output transforms (spec/upstream.md §4.6, §6.2): the
indexer query preps (MXFP4 and FP8), the inverse-RoPE FP8 output quantization and the
Hadamard transform. Every rounding is an integer bit operation (numerics_jit) and every sum
the reference's own, so the bytes equal the reference's; launch with ``enable_fp_fusion=False``
(RoPE's products and sums must not fuse).

The Hadamard kernels keep each row (inv_rope: each quantization group) in one lane's
registers: a row is loaded as ``[BM, W / V, V]`` (V-element vectors; the column-chunk axis is
not contiguous to Triton's coalescing pass, which then gives the row axis the lanes), so the
butterfly's splits and joins, the group maximum and its exponent involve no other lane. Loaded
the other way (``[W / V, BM, V]`` permuted, or a plain ``[BM, W]`` tile) a row is spread over
lanes and the compiler carries that layout through the whole computation (with Triton 3.6 on
sm_90 the MXFP4 query prep then has nearly three times the SASS instructions, and spills;
``tools/compile_check.py`` shows both). Stores may go either way (``store_rows``): per lane
they need no layout conversion, plain they coalesce; the launchers' CONFIG picks what measured
faster. The integer roundings, not the memory, bound these kernels, so the hot path takes
shortcuts that hold for finite values, and a program that meets a non-finite value redoes its
rows the long way.
"""

import triton
import triton.language as tl

from kvformats_kernels import numerics_jit as nj
from kvformats_kernels import record_jit as rec
from kvformats_kernels.dsv4 import transforms_jit as tj


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def abs_max_nan(x, axis: tl.constexpr):
    """max |x| along ``axis``, NaN when any element is NaN (one max.NaN per element, where
    tl.max drops NaN), as torch's amax."""
    return tl.reduce(tl.abs(x), axis, _max_nan)


@triton.jit
def thread_rows(row_ptr, live, W: tl.constexpr, V: tl.constexpr, LO: tl.constexpr = 0, OTHER: tl.constexpr = 0,
                LANE: tl.constexpr = True):
    """W consecutive elements at each of the BM pointers ``row_ptr`` -> [BM, W] (raw dtype); rows
    not ``live`` and columns below LO read OTHER. LANE: loaded as [BM, W / V, V], one row per
    lane (see the module docstring); else as [W / V, BM, V] permuted, which Triton 3.6 spreads
    over lanes (kept to compare against: CONFIG's lane_load)."""
    BM: tl.constexpr = row_ptr.shape[0]
    col = (tl.arange(0, W // V) * V)[:, None] + tl.arange(0, V)[None, :]
    if LANE:
        x = tl.load(row_ptr[:, None, None] + col[None, :, :], mask=live[:, None, None] & (col >= LO)[None, :, :],
                    other=OTHER)
        return tl.reshape(x, (BM, W))
    else:
        x = tl.load(row_ptr[None, :, None] + col[:, None, :], mask=live[None, :, None] & (col >= LO)[:, None, :],
                    other=OTHER)
        return tl.reshape(tl.permute(x, (1, 0, 2)), (BM, W))


@triton.jit
def store_rows(row_ptr, x, live, V: tl.constexpr, LANE: tl.constexpr):
    """Store x [BM, W] at the BM pointers ``row_ptr`` (rows where ``live``). LANE: as
    [BM, W / V, V], V elements per access and a row per lane, the store twin of thread_rows
    (a plain [BM, W] store is laid out across lanes, and the compiler carries that layout back
    through the computation); else the plain, coalesced store."""
    BM: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1]
    if LANE:
        col = (tl.arange(0, W // V) * V)[:, None] + tl.arange(0, V)[None, :]
        tl.store(row_ptr[:, None, None] + col[None, :, :], tl.reshape(x, (BM, W // V, V)), mask=live[:, None, None])
    else:
        tl.store(row_ptr[:, None] + tl.arange(0, W)[None, :], x, mask=live[:, None])


@triton.jit
def words_f32(w):
    """int32 words of two bf16 each (element 2k in the low half) -> (even, odd) float32."""
    return nj.bits_f32(w << 16), nj.bits_f32(w & -65536)


@triton.jit
def bf16_value(x, SAFE: tl.constexpr, HW: tl.constexpr = False, PAIRED: tl.constexpr = False):
    """float32 -> the float32 value of its bf16 RNE rounding. Not SAFE: for values that are not
    NaN (a NaN made by arithmetic, 0x7FFFFFFF, would carry into the sign bit); then HW rounds by
    the GPU's cvt.rn.bf16.f32 (about four integer operations per value less), which gives the
    same bits for every non-NaN float32, subnormals and overflow to infinity included
    (launchers set it only on a GPU: the interpreter's cast truncates). PAIRED (with HW): two
    values per cvt.rn.bf16x2.f32 (nj.bf16_round_hw), fewer instructions where the compiler
    converts one at a time and then needs the float32 values (the MXFP4 prep), more where it
    pairs conversions itself (the FP8 prep: ~2,200 -> 2,430 SASS on its fast path)."""
    if SAFE:
        return nj.bf16_round(x)
    elif HW and PAIRED:
        return nj.bf16_round_hw(x)
    elif HW:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        return nj.bf16_bits_f32(nj.bf16_rne_bits_nonan(x))


@triton.jit
def rope_pairs(ev, od, cs_row, pos_ok, FIRST: tl.constexpr, ROPE: tl.constexpr):
    """GPT-J RoPE of the pairs (ev, od) [BM, P] of one position (``cs_row``: its cos_sin row),
    in rope_rows's float32 order; pair i is rope pair FIRST + i (outside [0, ROPE / 2): NoPE,
    passed through). cos and sin are loaded once, as vectors, for the whole tile. ``pos_ok``
    (scalar): the position is a row of the table; else nothing is read and the pairs pass
    through (the reference's unrotated row of an invalid position)."""
    P: tl.constexpr = ev.shape[1]
    k = tl.arange(0, P) + FIRST
    inside = (k >= 0) & (k < ROPE // 2)
    kk = tl.where(inside, k, 0)
    on = inside & ((k * 0 + pos_ok.to(tl.int32)) != 0)  # a vector mask (see pool_jit.spread)
    cos = tl.load(cs_row + kk, mask=on, other=1.0)[None, :]
    sin = tl.load(cs_row + ROPE // 2 + kk, mask=on, other=0.0)[None, :]
    return (tl.where(on[None, :], ev * cos - od * sin, ev),
            tl.where(on[None, :], ev * sin + od * cos, od))


@triton.jit
def _half(row, live, cs_row, pos_ok, HALF_IDX: tl.constexpr, ROPE: tl.constexpr, IS_BF16: tl.constexpr,
          PAIRS: tl.constexpr, SAFE: tl.constexpr, LANE: tl.constexpr, HW: tl.constexpr,
          PAIRED: tl.constexpr = False):
    """Half HALF_IDX (64 dims) of 128-dim rows, RoPE'd where it holds RoPE dims and rounded to
    bf16 where that changes anything (RoPE dims, non-bf16 input) -> (float32 [BM, 64], the sum
    of the values read: not finite when one of them is not; 0 with HW, see _indexer_rows).
    PAIRS: bf16 read as int32 words (``row`` points at words); PAIRED: as bf16_value."""
    BM: tl.constexpr = row.shape[0]
    if PAIRS:
        ev, od = words_f32(thread_rows(row + HALF_IDX * 32, live, 32, 4, LANE=LANE))
    else:
        x = thread_rows(row + HALF_IDX * 64, live, 64, 8, LANE=LANE)
        x = nj.bf16_bits_f32(x) if IS_BF16 else x.to(tl.float32)
        ev, od = tl.split(tl.reshape(x, (BM, 32, 2)))
    if HW:
        check = 0.0
    else:
        check = tl.sum(ev + od)
    FIRST: tl.constexpr = HALF_IDX * 32 - (128 - ROPE) // 2  # rope pair of this half's pair 0
    if FIRST + 32 > 0:
        ev, od = rope_pairs(ev, od, cs_row, pos_ok, FIRST, ROPE)
        return bf16_value(tl.reshape(tl.join(ev, od), (BM, 64)), SAFE, HW, PAIRED), check
    x = tl.reshape(tl.join(ev, od), (BM, 64))
    return (x if IS_BF16 else bf16_value(x, SAFE, HW)), check


@triton.jit
def _mxfp4_fast(u, had_scale, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                E_MIN: tl.constexpr, E_MAX: tl.constexpr, SHORT_E: tl.constexpr, E_FLOOR: tl.constexpr,
                EM_CARRY: tl.constexpr, EM_FIELD: tl.constexpr):
    """The MXFP4 fast path (GPU: hardware roundings, inline PTX) of one half u [BM, 64] of the
    butterfly's last stage, two blocks of 32 -> (nibble words [BM, 8], block exponents [BM, 2],
    a check that is not finite when the fast path does not hold).

    The reference takes y = bf16(u * s) (s = had_scale), the block's e from max |y|, then the
    codes of y * 2^-e. Both roundings are monotonic, so max |y| = bf16(max |u| * s): the maxima
    are taken on u. And a product's rounding commutes with a power of two while the result
    stays normal, so y * 2^-e = bf16(u * (s * 2^-e)): one product per value instead of two.
    That holds when s * 2^-e lies in [2^-126, 2^96]: then every u * s that can reach a code
    (|y| * 2^-e > 0.25, so u * s >= 2^-103) is normal, and smaller values give code 0 either
    way; outside that range (2^-e is then not even formed exactly) the check is made infinite
    and the rows are redone SAFE. (With s = 128^-0.5 and the MXFP4 rule that is a guard only:
    the floor keeps e >= -15, and e >= 123 needs |u| >= 2^128, beyond float32.) The maxima keep
    NaN, and bf16(max) is not finite exactly when some y is not. SHORT_E: max |y| has 8 significant
    bits, so the rule's exponent takes nj.block_exponent_short (a division and a float32 log2
    otherwise: ~48 instructions a block)."""
    BM: tl.constexpr = u.shape[0]
    blocks = tl.reshape(u, (BM, 2, 32))
    amax = (abs_max_nan(blocks, 2) * had_scale).to(tl.bfloat16).to(tl.float32)  # max |y|
    if SHORT_E:
        e = nj.block_exponent_short(amax, E_FLOOR, EM_CARRY, EM_FIELD, E_MAX)
    else:
        e = nj.block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
    s2 = had_scale * nj.bits_f32((127 - e) << 23)  # 2^-e where -e is a normal exponent
    far = (s2 < 1.1754943508222875e-38) | (s2 > 7.922816251426434e+28)  # not in [2^-126, 2^96]
    bad = tl.sum(tl.where(far, float("inf"), amax))
    y = nj.bf16_round_hw(blocks * s2[:, :, None])
    return nj.e2m1_words_hw(tl.reshape(y, (BM, 64))), e, bad


@triton.jit
def _indexer_rows(row, live, cs_row, pos_ok, had_scale, ROPE: tl.constexpr, MXFP4: tl.constexpr,
                  FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                  E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                  IS_BF16: tl.constexpr, PAIRS: tl.constexpr, HW_E4M3: tl.constexpr, SAFE: tl.constexpr,
                  LANE: tl.constexpr, SHORT_E: tl.constexpr = False, E_FLOOR: tl.constexpr = 0,
                  EM_CARRY: tl.constexpr = 0, EM_FIELD: tl.constexpr = 0):
    """(dims 0..63, dims 64..127, MXFP4 scale words, check) of rows of 128 dims:
    y = bf16(scale * H(bf16(rope_p(q)))), then MXFP4 ([BM, 8] halves of little-endian int32 words
    of nibbles) or e4m3 ([BM, 64] byte halves).

    Not SAFE, the e2m1 code takes its short form (with HW_E4M3: in f16 pairs, nj.e2m1_words_hw) and,
    without HW_E4M3, the integer roundings skip their NaN select (a NaN made by arithmetic would
    turn into -0.0); both hold for finite values. The check, a sum of every value rounded last (z;
    for MXFP4 with HW_E4M3 the NaN-keeping block maxima of y = bf16(z), which the scales need anyway
    and which are not finite exactly when some y, hence some z, is not), is then not finite whenever
    a value on the way was not (an Inf or NaN input, an overflow in RoPE or in the butterfly): every
    output of a Hadamard transform sums every input, add and subtract keep Inf and NaN, and so does
    the hardware bf16 rounding; the integer rounding may not, so without HW_E4M3 the sums of the
    inputs join the check. The caller then redoes the rows SAFE. (Finite sums beyond float32 also
    trip it: harmless. z itself cannot round to a bf16 Inf: it is the butterfly's finite float32 sum
    times 128^-0.5.)

    H_128 = H_64 on each half, then one stage (a, b) -> (a + b, a - b) across the halves: the
    reference's butterfly stage for stage, with the RoPE tail (the second half) alone."""
    FAST_MX: tl.constexpr = MXFP4 and HW_E4M3 and not SAFE
    xa, check_a = _half(row, live, cs_row, pos_ok, 0, ROPE, IS_BF16, PAIRS, SAFE, LANE, HW_E4M3, FAST_MX)
    xb, check_b = _half(row, live, cs_row, pos_ok, 1, ROPE, IS_BF16, PAIRS, SAFE, LANE, HW_E4M3, FAST_MX)
    a = tj.hadamard_rows(xa, 6)
    b = tj.hadamard_rows(xb, 6)
    BM: tl.constexpr = a.shape[0]
    check = check_a + check_b
    word = tl.zeros((BM,), tl.int32)
    if FAST_MX:  # both halves first: a and b are dead before the quantization, which cuts the
        u0 = a + b  # spills under the 160-register cap (a row lives in one lane); the FP8 prep is
        u1 = a - b  # slower in this order, so it keeps its own
    for half in tl.static_range(2):
        if FAST_MX:
            out, e, bad = _mxfp4_fast(u0 if half == 0 else u1, had_scale, FLOOR, ELEM_MAX, FLOOR_ON_SCALE,
                                      E_MIN, E_MAX, SHORT_E, E_FLOOR, EM_CARRY, EM_FIELD)
            check += bad
        else:
            z = ((a + b) if half == 0 else (a - b)) * had_scale
            check += tl.sum(z)
            y = bf16_value(z, SAFE, HW_E4M3)
        if MXFP4:
            if not FAST_MX:
                blocks = tl.reshape(y, (BM, 2, 32))
                e = nj.block_exponent(abs_max_nan(blocks, 2), FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
                codes = nj.e2m1_code(blocks * nj.pow2(-e)[:, :, None]) if SAFE else \
                    nj.e2m1_code_short(blocks * nj.pow2(-e)[:, :, None])
                # little-endian words, as e2m1_words_hw: element 8w + j in bits 4j..4j+3 of word w
                out = tl.sum(tl.reshape(codes, (BM, 8, 8)) << (4 * tl.arange(0, 8))[None, None, :], axis=2)
            s = nj.ue8m0_byte(e)
            word = word | tl.sum(s << (8 * tl.arange(0, 2) + 16 * half)[None, :], axis=1)  # disjoint bytes
        else:
            out = nj.e4m3_bits(y) if SAFE else e4m3_fast(y, HW_E4M3).to(tl.int32)
        if half == 0:
            out0 = out
        else:
            out1 = out
    return out0, out1, word, check


@triton.jit
def _store_q(out_ptr, scale_out_ptr, r, live, out0, out1, word, MXFP4: tl.constexpr, LANE: tl.constexpr):
    """Rows r of the packed output, two halves of 64 bytes (FP8: out_ptr points at bytes) or of 8
    int32 words of nibbles (MXFP4: at words), and for MXFP4 their scale words."""
    if MXFP4:
        at = out_ptr + r * 16
        store_rows(at, out0, live, 4, LANE)
        store_rows(at + 8, out1, live, 4, LANE)
        tl.store(scale_out_ptr + r, word, mask=live)
    else:
        at = out_ptr + r * 128
        store_rows(at, out0.to(tl.uint8), live, 16, LANE)
        store_rows(at + 64, out1.to(tl.uint8), live, 16, LANE)


@triton.jit
def indexer_q_kernel(q_ptr, pos_ptr, cs_ptr, w_ptr, out_ptr, scale_out_ptr, w_out_ptr, err_ptr,
                     heads, q_stride_t, q_stride_h, pos_stride, cs_stride, cs_rows, w_stride_t, w_stride_h,
                     had_scale, softmax_scale, head_scale,
                     ROPE: tl.constexpr, MXFP4: tl.constexpr,
                     FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                     E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                     IS_BF16: tl.constexpr, PAIRS: tl.constexpr, W_BF16: tl.constexpr, HW_E4M3: tl.constexpr,
                     BLOCK_H: tl.constexpr, LANE_LOAD: tl.constexpr, LANE_STORE: tl.constexpr,
                     EVEN_H: tl.constexpr = False, SHORT_E: tl.constexpr = False, E_FLOOR: tl.constexpr = 0,
                     EM_CARRY: tl.constexpr = 0, EM_FIELD: tl.constexpr = 0, SITE: tl.constexpr = 0):
    """Token program_id(0), heads BLOCK_H * program_id(1) + i of q [T, H, 128] (strides in
    q_ptr's units): MXFP4 nibbles [T * H, 16] (int32 words) and one int32 of the four ue8m0 bytes per row, or
    e4m3 bytes [T * H, 128]; w_out[t * H + h] = (w[t, h] * softmax_scale) * head_scale.
    A position outside [0, cs_rows) leaves the rows unrotated and is recorded (SITE) by the
    token's first head block, after its stores."""
    t = tl.program_id(0).to(tl.int64)  # axis 0: up to 2^31 - 1 tokens (axis 1 stops at 65535)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = h < heads
    if EVEN_H:  # every head of the program exists: unmasked loads need no zeroed registers (the
        live = tl.full((BLOCK_H,), 1, tl.int1)  # MXFP4 prep gains; the FP8 prep gets slower)
    pos = tl.load(pos_ptr + t * pos_stride).to(tl.int64)
    pos_ok = (pos >= 0) & (pos < cs_rows)
    cs_row = cs_ptr + tl.where(pos_ok, pos, 0) * cs_stride
    row = q_ptr + t * q_stride_t + h.to(tl.int64) * q_stride_h
    r = t * heads + h
    # the head weights are loaded before any store: a load cannot move above a store that may
    # alias it, so loading them last cost a second wait on memory
    w = nj.load_f32(w_ptr + t * w_stride_t + h * w_stride_h, live, W_BF16)
    out0, out1, word, check = _indexer_rows(row, live, cs_row, pos_ok, had_scale, ROPE, MXFP4, FLOOR, ELEM_MAX,
                                            FLOOR_ON_SCALE, E_MIN, E_MAX, IS_BF16, PAIRS, HW_E4M3, False, LANE_LOAD,
                                            SHORT_E, E_FLOOR, EM_CARRY, EM_FIELD)
    _store_q(out_ptr, scale_out_ptr, r, live, out0, out1, word, MXFP4, LANE_STORE)
    if check * 0.0 != check * 0.0:  # the check is Inf or NaN
        # stored first and redone here, so that no result of the fast path stays live (in
        # registers) through this rarely taken branch; the barrier orders the two stores
        tl.debug_barrier()
        out0, out1, word, check = _indexer_rows(row, live, cs_row, pos_ok, had_scale, ROPE, MXFP4, FLOOR, ELEM_MAX,
                                                FLOOR_ON_SCALE, E_MIN, E_MAX, IS_BF16, PAIRS, HW_E4M3, True, LANE_LOAD)
        _store_q(out_ptr, scale_out_ptr, r, live, out0, out1, word, MXFP4, LANE_STORE)
    tl.store(w_out_ptr + r, (w * softmax_scale) * head_scale, mask=live)
    rec.record_scalar(err_ptr, (tl.program_id(1) == 0) & (pos_ok == 0), t, pos, cs_rows, 2, SITE)


@triton.jit
def e4m3_finite(y):
    """``numerics_jit.e4m3_bits`` for y that is not NaN (±Inf saturates to ±448), without the
    NaN select."""
    b = nj.f32_bits(y)
    mag = tl.minimum(b & 0x7FFFFFFF, 0x43E00000)
    normal = (mag + (0x7FFFF - (120 << 23)) + ((mag >> 20) & 1)) >> 20
    sub = nj.f32_bits(nj.bits_f32(mag) * 512.0 + 8388608.0) - 0x4B000000
    return tl.where(mag < 0x3C800000, sub, normal) | ((b >> 24) & 0x80)


@triton.jit
def e4m3_fast(y, HW: tl.constexpr):
    """e4m3 bytes of y that is not NaN: the integer path, or (HW, compiled for sm_89+ only) the
    hardware's cvt.rn.satfinite.e4m3x2.f32, which rounds the same way (to nearest even,
    saturating at ±448) two values per instruction. The interpreter casts differently (its
    float8 cast breaks ties away from zero), so launchers pass HW only to compiled kernels."""
    if HW:
        return y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        return e4m3_finite(y)


@triton.jit
def inv_rope_kernel(o_ptr, pos_ptr, cs_ptr, out_ptr, scale_ptr, err_ptr, n_tok, t_pad, heads_per_group,
                    o_stride_t, o_stride_h, pos_stride, cs_stride, cs_rows, out_stride_g,
                    D: tl.constexpr, ROPE: tl.constexpr, GS: tl.constexpr, NQP2: tl.constexpr,
                    FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                    E_MIN: tl.constexpr, E_MAX: tl.constexpr,
                    TMA: tl.constexpr, IS_BF16: tl.constexpr, PAIRS: tl.constexpr, HW_E4M3: tl.constexpr,
                    BLOCK_T: tl.constexpr, LANE_LOAD: tl.constexpr, LANE_STORE: tl.constexpr,
                    SITE: tl.constexpr = 0):
    """BLOCK_T tokens of one head (program axis 1): inverse RoPE of o[t, head] in float32, e4m3
    bytes per GS-group with a power-of-two scale, into out [G, T, Hg * D] (contiguous); scales
    token-fastest into [heads (* D / GS), t_pad], zero for the padding tokens.

    One lane holds one GS-group (GS a power of two, the RoPE tail inside the last group): the
    group maximum, its exponent and the codes need no other lane. The lanes of last groups
    rotate their tail at their token's position. PAIRS: bf16 read as int32 words (o_ptr and its
    strides in words). A token whose position is outside [0, cs_rows) is quantized unrotated
    and recorded (SITE) by head 0's program, after its stores."""
    NQ: tl.constexpr = D // GS
    NQP: tl.constexpr = NQP2  # NQ rounded up to a power of two (rows g >= NQ are idle)
    R: tl.constexpr = BLOCK_T * NQP
    HP: tl.constexpr = GS // 2
    head = tl.program_id(1).to(tl.int64)
    r = tl.arange(0, R)
    g = r % NQP
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + r // NQP
    live = (t < n_tok) & (g < NQ)
    VW: tl.constexpr = 4 if HP >= 4 else HP  # 16-byte vectors of words / floats
    VE: tl.constexpr = 8 if GS >= 8 else GS  # 16-byte vectors of bf16
    at = o_ptr + t * o_stride_t + head * o_stride_h
    if PAIRS:
        ev, od = words_f32(thread_rows(at + g * HP, live, HP, VW, LANE=LANE_LOAD))
    else:
        x = thread_rows(at + g * GS, live, GS, VE, LANE=LANE_LOAD)
        x = nj.bf16_bits_f32(x) if IS_BF16 else x.to(tl.float32)
        ev, od = tl.split(tl.reshape(x, (R, HP, 2)))
    # the tail: pairs k >= FIRST of the last group, at each row's own position; cos / sin are
    # gathered row per lane too (a [R, HP] load would lay the rotation out across lanes)
    FIRST: tl.constexpr = (GS - ROPE) // 2
    last = live & (g == NQ - 1)
    pos = tl.load(pos_ptr + t * pos_stride, mask=last, other=0).to(tl.int64)
    pos_bad = last & ((pos < 0) | (pos >= cs_rows))
    last = last & ~pos_bad  # an invalid position: no table read, the tail passes through
    cs = cs_ptr + tl.where(last, pos, 0) * cs_stride - FIRST
    cos = thread_rows(cs, last, HP, VW, FIRST, 1.0, LANE_LOAD)
    # inverse: the conjugate rotation. Times -1, not unary minus: compiled for the GPU that was
    # 0 - sin, +0 for sin = +0, where the reference's -sin is -0 (other signs of zero; seen on the H200)
    sin = thread_rows(cs + ROPE // 2, last, HP, VW, FIRST, 0.0, LANE_LOAD) * -1.0
    rot = last[:, None] & (tl.arange(0, HP) >= FIRST)[None, :]
    ev2 = tl.where(rot, ev * cos - od * sin, ev)
    od2 = tl.where(rot, ev * sin + od * cos, od)
    x = tl.reshape(tl.join(ev2, od2), (R, GS))
    amax = abs_max_nan(x, 1)
    e = nj.block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX)
    y = x * nj.pow2(-e)[:, None]
    if tl.sum(amax) == tl.sum(amax):
        codes = e4m3_fast(y, HW_E4M3).to(tl.int32)
    else:  # a NaN somewhere in these rows
        codes = nj.e4m3_bits(y)
    hg = head // heads_per_group  # output group, and the head's place in it
    dst = out_ptr + hg * out_stride_g + t * (heads_per_group * D) + (head - hg * heads_per_group) * D + g * GS
    store_rows(dst, codes.to(tl.uint8), live, 16 if GS >= 16 else GS, LANE_STORE)

    if TMA:  # NQ = 4: one word of four exponent bytes per (token, head)
        s = tl.where(live, nj.ue8m0_byte(e), 0)
        word = tl.sum(tl.reshape(s << (8 * g), (BLOCK_T, NQP)), axis=1)  # disjoint bytes: the sum is an OR
        tt = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tl.store(scale_ptr + head * t_pad + tt, word, mask=tt < t_pad)
    else:
        v = tl.where(live, nj.pow2(e), 0.0)
        tl.store(scale_ptr + (head * NQ + g) * t_pad + t, v, mask=(t < t_pad) & (g < NQ))
    rec.record_violation(err_ptr, pos_bad & (head == 0), t, pos, cs_rows, 2, SITE)


@triton.jit
def hadamard_kernel(x_ptr, out_ptr, n_rows, x_stride, scale,
                    LOG2_D: tl.constexpr, V: tl.constexpr, IS_BF16: tl.constexpr, BLOCK_M: tl.constexpr,
                    LANE_LOAD: tl.constexpr, LANE_STORE: tl.constexpr):
    """out (bf16 bits) [N, D] = bf16(scale * H(bf16(x))) row by row; rows are read V elements
    at a time, one row per lane (V = D: the default layout, for rows too wide for one lane)."""
    D: tl.constexpr = 1 << LOG2_D
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < n_rows
    x = thread_rows(x_ptr + rows * x_stride, live, D, V, LANE=LANE_LOAD)
    x = nj.bf16_bits_f32(x) if IS_BF16 else nj.bf16_round(x.to(tl.float32))
    y = tj.hadamard_rows(x, LOG2_D) * scale
    store_rows(out_ptr + rows * D, nj.bf16_rne_bits(y).to(tl.int16), live, V, LANE_STORE)
