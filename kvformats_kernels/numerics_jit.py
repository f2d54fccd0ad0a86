"""Element codecs as Triton device functions, built from integer bit operations only (plus,
behind a ``HW`` constexpr that launchers set only on a GPU, the hardware conversions that give
the same bytes there).

The Triton CPU interpreter does not round like the GPU (its fp32 -> bf16 truncates, its
fp32 -> float8e4nv breaks ties away from zero and can drop a binade), and a libm ``log2`` may
differ from torch in the last ulp. Every rounding here is therefore done on the float32 bit
pattern with integer arithmetic, which is exact on the GPU and under ``TRITON_INTERPRET=1``
alike. Each helper mirrors one function of ``kvformats.numerics.codes`` and is checked against it
bit for bit (tests/kernels).
"""

import triton
import triton.language as tl


@triton.jit
def f32_bits(x):
    """float32 tensor -> its int32 bit pattern."""
    return x.to(tl.int32, bitcast=True)


@triton.jit
def bits_f32(b):
    """int32 bit pattern -> float32 tensor."""
    return b.to(tl.float32, bitcast=True)


@triton.jit
def bf16_rne_bits(x):
    """float32 -> bfloat16 bit pattern (int32 in [0, 0xFFFF]), round to nearest even.

    Exact for subnormals and overflow (rounds to inf); NaN -> 0x7FC0 (torch's canonical NaN).
    Adding 0x7FFF + lsb to the two's-complement pattern rounds the magnitude: a carry never
    reaches the sign bit of a finite value.
    """
    b = f32_bits(x)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    return tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded)


@triton.jit
def bf16_rne_bits_nonan(x):
    """bf16_rne_bits for inputs known not to be NaN (infinities allowed): no NaN select."""
    b = f32_bits(x)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


@triton.jit
def bf16_bits_f32(h):
    """bfloat16 bit pattern (any int, low 16 bits used) -> float32 (exact)."""
    return bits_f32(h.to(tl.int32) << 16)


@triton.jit
def bf16_round(x):
    """float32 -> the float32 value of its bf16 rounding (RNE)."""
    return bf16_bits_f32(bf16_rne_bits(x))


@triton.jit
def e4m3_bits(y):
    """float32 -> float8_e4m3fn byte (int32 in [0, 255]): clamp to ±448, round to nearest even.

    The sign of zero survives (-0.0 and negatives that round to zero give 0x80), as in torch's
    cast; NaN gives 0x7F (0xFF with the sign bit). Above 2^-6 (e4m3's least normal) rounding keeps
    3 of the 23 mantissa bits: add just under half an e4m3 ulp plus the kept lsb, shift, and rebias
    the exponent (127 - 7 = 120), a carry moving into the next binade as it should. Below 2^-6 the
    step is 2^-9:
    ``|y| * 2^9 + 2^23`` is rounded to an integer by the float32 add itself (round to nearest
    even, exact in IEEE arithmetic on the GPU and in numpy alike), so its low bits are the code.
    """
    b = f32_bits(y)
    raw = b & 0x7FFFFFFF
    mag = tl.minimum(raw, 0x43E00000)  # |y| clamped to 448 (as bits: monotone)
    normal = (mag + (0x7FFFF - (120 << 23)) + ((mag >> 20) & 1)) >> 20
    sub = f32_bits(bits_f32(mag) * 512.0 + 8388608.0) - 0x4B000000
    code = tl.where(mag < 0x3C800000, sub, normal)
    code = tl.where(raw > 0x7F800000, 0x7F, code)  # NaN -> the NaN code (spec/nan-policy.md)
    return code | ((b >> 24) & 0x80)


@triton.jit
def e4m3_half_value(byte):
    """float8_e4m3fn byte (int tensor, low 8 bits) -> float32 value * 2^-8, exact, for every byte
    but the NaN bytes 0x7F / 0xFF (which give ±1.875; callers test the byte).

    Every e4m3fn value v, subnormals included, is the float16 2^-8 v whose bits are the byte's
    sign at bit 15 and its other 7 bits at bits 13..7; float16 -> float32 is exact.
    """
    b = byte.to(tl.int32)
    h = (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.int16)
    return h.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e4m3_value(byte):
    """float8_e4m3fn byte (int tensor, low 8 bits) -> float32 (exact; 0x7F/0xFF -> NaN)."""
    v = e4m3_half_value(byte) * 256.0
    return tl.where((byte.to(tl.int32) & 0x7F) == 0x7F, bits_f32(f32_bits(v) | 0x7FC00000), v)


@triton.jit
def e4m3_code(y, HW: tl.constexpr):
    """e4m3_bits, or with HW the GPU's own conversion (cvt.rn.satfinite: clamp to ±448, round
    to nearest even, NaN -> 0x7F with its sign, the sign of zero kept: the same bytes, checked
    against the reference on the GPU). HW is never set under the interpreter, whose float8
    cast rounds ties away from zero."""
    if HW:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        return e4m3_bits(y)


@triton.jit
def e4m3_to_f32(byte, HW: tl.constexpr):
    """e4m3_value, or with HW the GPU's exact e4m3 -> float32 conversion (byte: uint8)."""
    if HW:
        return byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return e4m3_value(byte)


@triton.jit
def bf16_bits(x, HW: tl.constexpr):
    """bf16_rne_bits (NaN -> some NaN pattern), or with HW the GPU's cvt.rn.bf16.f32."""
    if HW:
        return x.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    else:
        return bf16_rne_bits(x)


@triton.jit
def pow2_bits(k):
    """int32 k -> bit pattern of float32 2^k: subnormal below -126, 0 below -149, inf above 127."""
    k = k.to(tl.int32)
    normal = (tl.minimum(tl.maximum(k, -126), 128) + 127) << 23
    sub = 1 << (tl.minimum(tl.maximum(k, -149), -127) + 149)
    out = tl.where(k >= -126, normal, sub)
    return tl.where(k < -149, 0, out)


@triton.jit
def pow2(k):
    """int32 k -> float32 2^k (see pow2_bits)."""
    return bits_f32(pow2_bits(k))


@triton.jit
def ue8m0_byte(e):
    """int32 exponents -> ue8m0 scale bytes clamp(e + 127, 0, 255) (int32; stored as uint8)."""
    return tl.minimum(tl.maximum(e + 127, 0), 255)


@triton.jit
def ue8m0_value(s, FF_NAN: tl.constexpr):
    """ue8m0 byte (int tensor, low 8 bits) -> float32 2^(s - 127); 0xFF -> NaN with FF_NAN
    (float8_e8m0fnu), else +Inf (2^128 in float32: the profile's ue8m0_ff "inf")."""
    s = s.to(tl.int32) & 0xFF
    if FF_NAN:
        return bits_f32(tl.where(s == 0xFF, 0x7FC00000, pow2_bits(s - 127)))
    else:
        return bits_f32(pow2_bits(s - 127))


@triton.jit
def _round_down_limit(m):
    """How many mantissa fields j of q = 2^m (1 + j 2^-23) make float32 log2(q) round down to m.

    log2(q) rounds down to m iff log2(1 + j 2^-23) < half the float32 gap above m, so the limit
    grows with the binade of |m|: for a = m (m >= 0) or -m - 1 (m < 0), the limit is
    ceil(ln 2 * 2^(t-1)) with t = floor(log2 a): 1 for a < 4, then 2, 3, 6, 12, 23, 45.
    Equal to kvformats.numerics.codes' table for every m in [-127, 128] (checked in tests/kernels).
    """
    a = tl.where(m < 0, -m - 1, m)
    return (1 + (a >= 4).to(tl.int32) + (a >= 8).to(tl.int32) + 3 * (a >= 16).to(tl.int32)
            + 6 * (a >= 32).to(tl.int32) + 11 * (a >= 64).to(tl.int32) + 22 * (a >= 128).to(tl.int32))


@triton.jit
def ceil_log2(q, NORMAL_ONLY: tl.constexpr = False):
    """``ceil(log2(q))`` as float32 arithmetic gives it, for float32 q >= 0 -> int32.

    Mirrors kvformats.numerics.codes.ceil_log2: one above a power of two only when the mantissa field
    reaches the round-down limit of its binade; subnormal q are taken at q * 2^64 and the
    exponent lowered by 64 (q = 0 gives -191); +inf gives 128, NaN 129. Exact integer work:
    the subnormal mantissa is normalised by an exact int -> float conversion.
    NORMAL_ONLY: the caller guarantees q >= 2^-126 (a floor), so that path is left out.
    """
    b = f32_bits(q) & 0x7FFFFFFF
    if NORMAL_ONLY:
        m = (b >> 23) - 127
        return m + ((b & 0x7FFFFF) >= _round_down_limit(m)).to(tl.int32)
    field = b >> 23
    j = b & 0x7FFFFF
    # subnormal: q = j * 2^-149; float(j) = j exactly, so q * 2^64 has float(j)'s mantissa
    # and exponent (exponent of float(j)) - 149 + 64.
    jb = f32_bits(j.to(tl.float32))
    tiny = field == 0
    m = tl.where(tiny, (jb >> 23) - 127 - 85, field - 127)
    m = tl.where(tiny & (j == 0), -127, m)
    man = tl.where(tiny, jb & 0x7FFFFF, j)
    e = m + (man >= _round_down_limit(m)).to(tl.int32)
    return tl.where(tiny, e - 64, e)


@triton.jit
def floor_log2(a):
    """Exact ``floor(log2(a))`` of float32 a >= 0 -> int32, as kvformats.numerics.codes.floor_log2:
    subnormals through the exact int -> float conversion of their mantissa, 0 -> -1000,
    +Inf and NaN -> 128."""
    b = f32_bits(a) & 0x7FFFFFFF
    field = b >> 23
    j = b & 0x7FFFFF
    sub = (f32_bits(j.to(tl.float32)) >> 23) - 127 - 149  # a = j * 2^-149
    return tl.where(field > 0, field - 127, tl.where(j == 0, -1000, sub))


@triton.jit
def e2m1_code(y, RNE: tl.constexpr = False, SIGNED_ZERO: tl.constexpr = False):
    """float32 -> e2m1 nibble (int32 0..15), saturating at 6. Default (tokenspeed's thresholds):
    a magnitude equal to a threshold takes the smaller code, and the sign bit is set only on a
    non-zero code of a negative value. RNE: ties go to the even code (PTX cvt.rn.satfinite, OCP);
    SIGNED_ZERO: the sign bit copies the input's (nibble 8 possible). NaN gives code 0 (every
    threshold compare is false), as ``kvformats.numerics.codes.e2m1_encode``.

    From 1 up, e2m1 is a float with one mantissa bit (codes 2..7 = 1, 1.5, 2, 3, 4, 6), so
    rounding is adding just under half an ulp (2^21 - 1), plus the kept bit for RNE, to the
    float32 pattern and keeping exponent and top mantissa bit (2 * 127 - 2 = 252 rebiases).
    Below 1 the codes are 0, 1, 2 with thresholds 0.25 and 0.75; the part from 0.75 up to 1
    rounds to 1.0, so the rule above applied to max(|y|, 1) covers everything above 0.75, and
    below it the code is just "above 0.25". "Above 0.25" is also "the code is non-zero", the
    condition of the default sign rule. Compares on bit patterns order like the magnitudes;
    NaN fails both (code 0). About 12 instructions per value on sm_90, 18 before this shape
    (a three-way select of small codes).
    """
    b = f32_bits(y)
    mag = b & 0x7FFFFFFF
    finite = mag <= 0x7F800000
    m1 = tl.maximum(mag, 0x3F800000)
    if RNE:
        big = tl.minimum((m1 + ((1 << 21) - 1 - (252 << 22)) + ((m1 >> 22) & 1)) >> 22, 7)
        upper = (mag >= 0x3F400000) & finite  # 0.75 ties to 1.0, the even code
    else:
        big = tl.minimum((m1 + ((1 << 21) - 1 - (252 << 22))) >> 22, 7)
        upper = (mag > 0x3F400000) & finite
    live = (mag > 0x3E800000) & finite  # 0.25 ties to 0 under both rules
    code = tl.where(upper, big, live.to(tl.int32))
    if SIGNED_ZERO:
        return code | tl.where(b < 0, 8, 0)
    else:
        return code | tl.where(live & (b < 0), 8, 0)


@triton.jit
def e2m1_code_short(y):
    """``e2m1_code`` for finite y with at most 8 significant bits (a bf16 value
    times a power of two) and |y| < 7 (a block scaled by its ceil-rule exponent).

    Below 1, a + 1 lies in [1, 2), where the rule for a >= 1 (one mantissa bit, ties down)
    gives codes 2, 3, 4 exactly where a lies in [0, 0.25], (0.25, 0.75], (0.75, 1): the codes
    of a plus 2. a + 1 is exact for a >= 2^-15 (8 significant bits); smaller a land on 1 and
    code 0 either way. The sign bit goes with y < -0.25: negative with a non-zero code."""
    a = tl.abs(y)
    lt = a < 1.0
    a1 = tl.where(lt, a + 1.0, a)
    k = tl.where(lt, (1 << 21) - 1 - (254 << 22), (1 << 21) - 1 - (252 << 22))
    return (f32_bits(a1) + k + tl.where(y < -0.25, 8 << 22, 0)) >> 22


@triton.jit
def bf16_round_hw(x):
    """float32 -> the float32 value of its bf16 RNE rounding by the GPU's cvt.rn.bf16x2.f32, two
    values per instruction (``x.to(tl.bfloat16).to(tl.float32)`` converts one at a time); the
    same rounding, NaN and Inf kept. GPU only (inline PTX); x must hold an even number of
    values per thread."""
    return tl.inline_asm_elementwise(
        "{\n.reg .b32 t;\ncvt.rn.bf16x2.f32 t, $3, $2;\nshl.b32 $0, t, 16;\nand.b32 $1, t, 0xFFFF0000;\n}",
        "=r,=r,r,r", [x], dtype=tl.float32, is_pure=True, pack=2)


def _e2m1_lane_codes(lo: str, hi: str, out: str) -> str:
    """PTX of e2m1_words_hw for one pair: ``out`` gets the codes of f32 registers lo / hi in bits
    9-12 of its low / high 16-bit lane (bit 12 the sign), every other bit 0."""
    return (f"cvt.rn.f16x2.f32 h, {hi}, {lo};\n"
            "and.b32 m, h, 0x7FFF7FFF;\n"
            "set.lt.f16x2.f16x2 lt, m, one;\n"  # 1.0 (0x3C00) where |h| < 1, else 0
            "add.rn.f16x2 a1, m, lt;\n"
            "and.b32 t, lt, 0x04000400;\n"
            "sub.u32 t, a1, t;\n"
            "sub.u32 t, t, 0x37013701;\n"  # + 0xFF - (28 << 9) per lane, no lane borrows (a1 >= 1.0)
            "set.lt.f16x2.f16x2 ng, h, q;\n"  # h < -0.25: 0x3C00 (bits 10-13)
            # bits 9-11 and 13 from t (the code; bit 13 is 0), the others from ng & ~t: bit 12 is
            # ng's (t's is 0), bits 0-8 and 14-15 are 0 in ng
            f"lop3.b32 {out}, t, ng, 0x2E002E00, 0xA4;\n")


_E2M1_WORDS_ASM = tl.constexpr(
    "{\n.reg .b32 h, m, one, q, lt, a1, t, ng, ta, tb, tc, td;\n"
    "mov.b32 one, 0x3C003C00;\n"
    "mov.b32 q, 0xB400B400;\n"  # -0.25
    + _e2m1_lane_codes("$1", "$2", "ta") + _e2m1_lane_codes("$3", "$4", "tb")
    + _e2m1_lane_codes("$5", "$6", "tc") + _e2m1_lane_codes("$7", "$8", "td")
    + "shr.u32 ta, ta, 9;\n"  # (0, 4) -> nibbles 0, 4
    "shr.u32 tb, tb, 1;\n"  # (2, 6) -> 2, 6
    "shr.u32 tc, tc, 5;\n"  # (1, 5) -> 1, 5
    "shl.b32 td, td, 3;\n"  # (3, 7) -> 3, 7
    "or.b32 ta, ta, tb;\n"
    "or.b32 tc, tc, td;\n"
    "or.b32 $0, ta, tc;\n}")


@triton.jit
def _words_asm(y, ASM: tl.constexpr):
    """One int32 per eight values of y [BM, 8k] from the PTX ``ASM`` of the e2m1 word helpers,
    whose inputs are the pairs (0, 4), (2, 6), (1, 5), (3, 7) of each eight."""
    BM: tl.constexpr = y.shape[0]
    j0a, j0b = tl.split(tl.reshape(y, (BM, y.shape[1] // 8, 2, 2, 2)))  # element 8w + 4 j2 + 2 j1 + j0
    e0_4, e2_6 = tl.split(j0a)
    e1_5, e3_7 = tl.split(j0b)
    e0, e4 = tl.split(e0_4)
    e2, e6 = tl.split(e2_6)
    e1, e5 = tl.split(e1_5)
    e3, e7 = tl.split(e3_7)
    return tl.inline_asm_elementwise(ASM, "=r,f,f,f,f,f,f,f,f", [e0, e4, e2, e6, e1, e5, e3, e7],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def e2m1_words_hw(y):
    """e2m1 nibbles of y [BM, 8k] as little-endian words [BM, k] (``e2m1_code_short`` of element
    8w + j in bits 4j..4j+3 of word w; GPU only: inline PTX), for the short code's inputs (at most
    8 significant bits, |y| < 7), two values per instruction in half precision: such values
    convert to f16 exactly (below 2^-14 they may round, but stay below 0.25: code 0, no sign),
    then per 16-bit lane as e2m1_code_short on float32 bits: a = |h|, a + 1 where a < 1 (exact:
    a has 8 significant bits), add just under half an ulp of the one kept mantissa bit (0xFF at
    bit 9), rebias (28 codes, 30 below 1: the lane's "1.0 where a < 1" word carries bit 10 = 2
    codes), the sign where h < -0.25, and every other bit cleared. The pairs are (0, 4), (2, 6),
    (1, 5), (3, 7) of each eight, so that the four lane words shifted by 9, 1, 5 and -3 hold
    disjoint nibbles and OR into the word: about 9 instructions per pair, against 11 and the
    byte packing for codes made a pair at a time. tests/kernels/test_hw_cvt.py compares it with
    e2m1_code_short on every such value."""
    return _words_asm(y, _E2M1_WORDS_ASM)


def _e2m1_rne_lane_codes(lo: str, hi: str, out: str) -> str:
    """PTX of e2m1_rne_words (HW) for one pair: ``out`` gets the round-half-even codes of f32
    registers lo / hi in bits 9-12 of its low / high 16-bit lane (bit 12 the sign bit of the
    input), every other bit 0; a NaN input gives some code (the caller masks NaN blocks)."""
    return (f"cvt.rn.f16x2.f32 h, {hi}, {lo};\n"
            "and.b32 m, h, 0x7FFF7FFF;\n"
            "min.u16x2 m, m, sat;\n"  # saturate at 6.0 (Inf too)
            "set.lt.f16x2.f16x2 lt, m, one;\n"  # 1.0 (0x3C00) where |h| < 1, else 0
            "add.rn.f16x2 a1, m, lt;\n"
            "and.b32 c, lt, 0x04000400;\n"  # two codes (2 << 9) less where |h| < 1
            "shr.b32 k, a1, 9;\n"
            "and.b32 k, k, 0x00010001;\n"  # the kept mantissa bit: ties go to the even code
            "add.u32 t, a1, k;\n"
            "sub.u32 t, t, c;\n"
            "sub.u32 t, t, 0x37013701;\n"  # + 0xFF - (28 << 9) per lane; no lane borrows (a1 >= 1.0)
            "shr.b32 sg, h, 3;\n"  # the sign (bit 15) to bit 12
            "lop3.b32 t, t, sg, 0x0E000E00, 0xE4;\n"  # bits 9-11 from t, the others from sg
            f"and.b32 {out}, t, 0x1E001E00;\n")


_E2M1_RNE_WORDS_ASM = tl.constexpr(
    "{\n.reg .b32 h, m, one, sat, lt, a1, c, k, t, sg, ta, tb, tc, td;\n"
    "mov.b32 one, 0x3C003C00;\n"
    "mov.b32 sat, 0x46004600;\n"  # 6.0, 6.0
    + _e2m1_rne_lane_codes("$1", "$2", "ta") + _e2m1_rne_lane_codes("$3", "$4", "tb")
    + _e2m1_rne_lane_codes("$5", "$6", "tc") + _e2m1_rne_lane_codes("$7", "$8", "td")
    + "shr.u32 ta, ta, 9;\n"
    "shr.u32 tb, tb, 1;\n"
    "shr.u32 tc, tc, 5;\n"
    "shl.b32 td, td, 3;\n"
    "or.b32 ta, ta, tb;\n"
    "or.b32 tc, tc, td;\n"
    "or.b32 $0, ta, tc;\n}")


@triton.jit
def e2m1_rne_words(y, HW: tl.constexpr):
    """Round-half-even, saturating e2m1 nibbles of y [BM, 8k] (sign bit = the input's) as
    little-endian words [BM, k], word layout as e2m1_words_hw; NaN values give unspecified
    nibbles (the fp4 encode zeroes a NaN block's words: its scale is NaN, so all of its values
    are). HW: the f16-pair PTX (GPU only); else the same steps in Triton (the interpreter's
    path): the snap to f16, then e2m1_code's round-half-even.

    For y = fl32(x * r) with x a bf16 value, s an e4m3 scale (at most 4 significant bits) and r
    within 2^-21 of 1 / s (fp4_reciprocal): the codes equal e2m1(fl32(x / s)), the reference's
    division. Why: x / s is either exactly a rounding midpoint t (0.25, 0.75, ..., 5: x = t s)
    or more than 2^-8 (relative) away from every midpoint, since x - t s is a multiple of the
    smaller of x's and t s's last bits. y is within 2^-20 (relative) of x / s, and the
    conversion to f16 (11 significant bits) snaps an exact midpoint's y onto t while leaving
    every other value on its side; from there the lanes round as e2m1_words_hw does, plus the
    kept bit for the even code, with |h| clamped at 6. tests/kernels/test_fp4_words_hw.py
    checks every bf16 x against every e4m3 scale (2^-9 .. 448) on the GPU;
    tests/test_e2m1_snap.py replays the lane arithmetic in numpy on the same pairs, with r
    off by up to 2 ulps."""
    if HW:
        return _words_asm(y, _E2M1_RNE_WORDS_ASM)
    else:
        snap = y.to(tl.float16).to(tl.float32)
        return nibble_words(tl.where(snap == snap, e2m1_code(snap, True, True), 0))


@triton.jit
def fp4_reciprocal(s, HW: tl.constexpr):
    """1 / s for the fp4 encode's scales: with HW the GPU's rcp.approx (one instruction, within
    1 ulp: inside e2m1_rne_words' 2^-21), else correctly rounded."""
    if HW:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [s], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)


@triton.jit
def quotient_short(a, D: tl.constexpr, HW: tl.constexpr):
    """fl32(a / D), correctly rounded, for a >= 0 with at most 8 significant bits (the maximum
    of bf16 values) or NaN / Inf, and D = 6.0: with HW the product by fl32(1 / D) and one fused
    correction (no branch; equal to the division on every such a, checked on the GPU by
    tests/kernels/test_fp4_words_hw.py), else div_rn (the interpreter has no fused multiply-add)."""
    if HW:
        tl.static_assert(D == 6.0, "the fused correction is checked for a divisor of 6 only")
        c: tl.constexpr = 1.0 / D
        q0 = a * c
        # the correction of an infinite a is NaN: keep q0 there (and for NaN, which is NaN)
        return tl.where(a < float("inf"), tl.fma(tl.fma(-q0, D, a), c, q0), q0)
    else:
        return tl.math.div_rn(a, tl.full(a.shape, D, tl.float32))


@triton.jit
def nibble_words(codes):
    """Nibble codes [BM, 8k] (int32 0..15) as little-endian words [BM, k]: element 8w + j in
    bits 4j..4j+3 of word w (a sum of disjoint bit fields: their OR)."""
    BM: tl.constexpr = codes.shape[0]
    K: tl.constexpr = codes.shape[1] // 8
    return tl.sum(tl.reshape(codes, (BM, K, 8)) << (4 * tl.arange(0, 8))[None, None, :], axis=2)


def _e2m1_bf16_pair(j: int) -> str:
    """PTX of e2m1_bf16_words (HW) for byte j of word $4 (elements 2j, 2j + 1) into output $j:
    each nibble's code as bf16 bits (magnitude bits 0-2 at 6-8, the sign at 15: value * 2^-126,
    code 1 a subnormal), rescaled by 2^126 and multiplied by the scale pair $5, both exact."""
    sel = j | j << 4 | (4 + j) << 8 | (4 + j) << 12  # [w.byte j, (ignored), hn.byte j, (ignored)]
    return (f"prmt.b32 u, $4, hn, {sel:#06x};\n"
            "shl.b32 a, u, 6;\n"
            "and.b32 a, a, 0x01C001C0;\n"
            "shl.b32 b, u, 12;\n"
            "lop3.b32 a, b, a, 0x80008000, 0xEC;\n"  # (b & sign bits) | a
            "mul.rn.bf16x2 a, a, p2;\n"
            f"mul.rn.bf16x2 ${j}, a, $5;\n")


_E2M1_BF16_WORDS_ASM = tl.constexpr(
    "{\n.reg .b32 hn, u, a, b, p2;\n"
    "mov.b32 p2, 0x7E807E80;\n"  # 2^126, 2^126
    "shr.b32 hn, $4, 4;\n"  # the high nibbles at the low nibbles' places
    + "".join(_e2m1_bf16_pair(j) for j in range(4)) + "}")


@triton.jit
def e2m1_bf16_words(w, s, HW: tl.constexpr):
    """bf16 pairs of the e2m1 nibbles of the words w [P, K] (element 2k in the low nibble of
    byte k, little-endian) times the float32 scales s [P] (e4m3 values, NaN allowed), as words
    [P, 4K]: word 4k + j holds elements 8k + 2j (low half) and 8k + 2j + 1. Exact: a code (at
    most 2 significant bits) times a scale with at most 4 needs at most 5, with no rounding, so
    the bits are those of the reference's float32 product rounded to bf16; a NaN scale gives
    NaN. HW: bf16x2 multiplies in inline PTX (GPU only), about four instructions a value;
    else in Triton. tests/kernels/test_fp4_words_hw.py checks every byte against every scale."""
    P: tl.constexpr = w.shape[0]
    K: tl.constexpr = w.shape[1]
    if HW:
        s16 = f32_bits(s) >> 16  # exact: e4m3 values are bf16 values
        s2 = tl.broadcast_to(((s16 & 0xFFFF) | (s16 << 16))[:, None], (P, K))
        o0, o1, o2, o3 = tl.inline_asm_elementwise(_E2M1_BF16_WORDS_ASM, "=r,=r,=r,=r,r,r", [w, s2],
                                                   dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True,
                                                   pack=1)
        # tl.join stacks on a new last axis, so the outer join's operand index is the last
        # digit: (o0, o2) and (o1, o3) give the order o0, o1, o2, o3
        return tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), (P, 4 * K))
    else:
        codes = (w[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 0xF
        bits = (f32_bits(e2m1_value(codes) * s[:, None, None]) >> 16) & 0xFFFF  # exact (see above)
        lo, hi = tl.split(tl.reshape(bits, (P, 4 * K, 2)))
        return lo | (hi << 16)


@triton.jit
def e2m1_value(n):
    """e2m1 nibble (int tensor, low 4 bits) -> float32 (0.5 steps below 2, then 3, 4, 6);
    nibble 8 is -0.0. Built as float32 bits: codes 2..7 are 2^(c/2 - 1) (1 + (c & 1) / 2),
    code 1 is 0.5."""
    c = n.to(tl.int32)
    m = c & 7
    mag = tl.where(m >= 2, ((m + 252) << 22), tl.where(m == 1, 0x3F000000, 0))
    return bits_f32(mag | ((c & 8) << 28))


@triton.jit
def abs_max(x, axis: tl.constexpr):
    """max |x| along ``axis`` (float32), NaN if any element is NaN. Taken on the bit patterns:
    for non-negative floats the integer order is the float order and every NaN pattern lies
    above +Inf, whereas tl.max on floats drops NaN."""
    return bits_f32(tl.max(f32_bits(x) & 0x7FFFFFFF, axis=axis))


@triton.jit
def max_nan(q, FLOOR: tl.constexpr):
    """max(q, FLOOR) for q >= 0 or NaN (then NaN), on bit patterns as abs_max."""
    return bits_f32(tl.maximum(f32_bits(q), f32_bits(tl.full(q.shape, FLOOR, tl.float32))))


@triton.jit
def block_exponent(amax, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                   E_MIN: tl.constexpr, E_MAX: tl.constexpr, FLOOR_MODE: tl.constexpr = False,
                   ELEM_EMAX: tl.constexpr = 0):
    """A ScaleRule's exponent of blocks with absolute maximum ``amax`` (float32) -> int32.

    FLOOR and ELEM_MAX are float32 values; the division is correctly rounded (div_rn), as
    torch's is, so the exponent matches ``ScaleRule.exponents`` bit for bit. A NaN amax gives the
    clamp exponent E_MAX, like +Inf (spec/nan-policy.md §2). FLOOR_MODE (the rule's
    exponent_mode "floor_minus_emax", OCP MX): floor(log2(max(amax, FLOOR))) - ELEM_EMAX, exact.
    """
    if FLOOR_MODE:
        e = floor_log2(max_nan(amax, FLOOR)) - ELEM_EMAX
        return tl.minimum(tl.maximum(e, E_MIN), E_MAX)
    if FLOOR_ON_SCALE:
        q = max_nan(tl.math.div_rn(amax, tl.full(amax.shape, ELEM_MAX, tl.float32)), FLOOR)
        NORMAL: tl.constexpr = FLOOR >= 1.1754943508222875e-38
    else:
        q = tl.math.div_rn(max_nan(amax, FLOOR), tl.full(amax.shape, ELEM_MAX, tl.float32))
        NORMAL: tl.constexpr = FLOOR / ELEM_MAX >= 1.2e-38  # type: ignore[no-redef]  # a constexpr per branch
    return tl.minimum(tl.maximum(ceil_log2(q, NORMAL), E_MIN), E_MAX)


@triton.jit
def block_exponent_short(amax, E_FLOOR: tl.constexpr, EM_CARRY: tl.constexpr, EM_FIELD: tl.constexpr,
                         E_MAX: tl.constexpr):
    """``block_exponent`` in four integer operations, for amax with at most 8 significant bits
    (a maximum of bf16 values) under a rule that ``_common.short_exponent`` accepts: a ceil rule
    whose ELEM_MAX = (1 + g) 2^j has at most 8 significant bits and whose floor keeps every
    quotient normal; E_FLOOR is the rule's exponent of amax = 0 (the floor's). Exact:
    tests/kernels/test_numerics_jit.py compares it with the rule on every bf16 value.

    For a = (1 + f) 2^k >= the floor, q = a / ELEM_MAX rounds to 2^(k - j) or less when f <= g,
    and to at least 2^(k - j) (1 + 2^-8) otherwise (8-bit significands differ by more than the
    rounding), where float32's log2 is above k - j + 1/200, so ceil(log2(q)) = k - j + (f > g):
    a carry out of the mantissa field when it exceeds g's. Values below the floor, subnormal or
    0 give at most its exponent, which the maximum with E_FLOOR then takes (ceil(log2(.)) is
    monotonic, so the floor commutes with it). Inf and NaN (bit patterns above the largest
    finite one; amax >= 0) give E_MAX, as the rule's clamp of ceil(log2(.)) = 128 or 129 does.
    EM_CARRY is 0x7FFFFF - g's mantissa field, EM_FIELD the biased exponent field of ELEM_MAX
    (127 + j)."""
    b = f32_bits(amax)
    e = tl.minimum(tl.maximum(((b + EM_CARRY) >> 23) - EM_FIELD, E_FLOOR), E_MAX)
    return tl.where(b >= 0x7F800000, E_MAX, e)


@triton.jit
def block_scale(amax, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr):
    """The float32 scale of a rule with ``power_of_two=False``: q = max(amax, FLOOR) / ELEM_MAX
    (or max(amax / ELEM_MAX, FLOOR)), unrounded, as ``ScaleRule.scales_of_amax``."""
    em = tl.full(amax.shape, ELEM_MAX, tl.float32)
    if FLOOR_ON_SCALE:
        return max_nan(tl.math.div_rn(amax, em), FLOOR)
    else:
        return tl.math.div_rn(max_nan(amax, FLOOR), em)


@triton.jit
def load_f32(ptrs, mask, IS_BF16: tl.constexpr):
    """Load bf16 / fp16 / fp32 values as float32, exactly. bf16 arrives as int16 bit patterns
    (the interpreter's own bf16 -> fp32 conversion flushes subnormals)."""
    if IS_BF16:
        return bf16_bits_f32(tl.load(ptrs, mask=mask, other=0))
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def tile_exponent(amax, FLOOR: tl.constexpr, ELEM_MAX: tl.constexpr, FLOOR_ON_SCALE: tl.constexpr,
                  E_MIN: tl.constexpr, E_MAX: tl.constexpr, FLAT: tl.constexpr, FLOOR_MODE: tl.constexpr = False,
                  ELEM_EMAX: tl.constexpr = 0):
    """block_exponent of a [BM, NB] tile of block maxima. FLAT: computed on a 1-D reshape, so
    that (if the compiler keeps that layout) each block's exponent is worked out by one thread
    instead of by every thread holding a slice of the block, then broadcast back."""
    if FLAT:
        flat = tl.reshape(amax, (amax.shape[0] * amax.shape[1],))
        e = block_exponent(flat, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE, ELEM_EMAX)
        return tl.reshape(e, (amax.shape[0], amax.shape[1]))
    else:
        return block_exponent(amax, FLOOR, ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX, FLOOR_MODE, ELEM_EMAX)
