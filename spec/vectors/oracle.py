"""An independent oracle for the golden-vector generator: the four encodings written again with
Python scalars, numpy float32 arithmetic and ml_dtypes casts, one element at a time.

It deliberately shares no code with ``kvformats`` (no torch, no bit tables): exponents come from
``math.log2`` in float64 rounded once to float32, which is what a correctly rounded float32
``log2`` returns except within ~1e-16 of a float32 rounding midpoint (never hit by these cases).
Checked against the literal bytes of spec/upstream.md §12 by ``generate.py`` before anything is written.
"""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np

F32 = np.float32
FP8_MAX = 448.0
E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def f32(x: float) -> float:
    """The float32 nearest to x (round to nearest even), as a Python float."""
    return float(F32(x))


def next_up_f32(x: float) -> float:
    """The next float32 above x (x a float32)."""
    return float(np.nextafter(F32(x), F32(np.inf)))


def bf16(x: float) -> float:
    """bfloat16 round-to-nearest-even of the float32 x."""
    return float(np.array([F32(x)]).astype(ml_dtypes.bfloat16)[0])


def bf16_bytes(values) -> bytes:
    return np.array([F32(v) for v in values], dtype=np.float32).astype(ml_dtypes.bfloat16).tobytes()


def f32_bytes(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def e4m3_byte(y: float) -> int:
    """float8_e4m3fn byte of float32(y) after clamping to ±448 (RNE, sign of zero kept)."""
    y = min(max(f32(y), -FP8_MAX), FP8_MAX)
    return int(np.array([F32(y)]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0])


def e4m3_value(b: int) -> float:
    return float(np.array([b], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)[0])


def ceil_log2_f32(q: float) -> int:
    """ceil of the float32-rounded log2 of the float32 q > 0."""
    return math.ceil(f32(math.log2(q)))


def exponent(amax: float, element_max: float, floor: float, floor_on: str) -> int:
    """The block exponent with float32 division and flooring (spec/upstream.md §2.2, §3.2, §4.3)."""
    if floor_on == "absmax":
        q = F32(max(F32(amax), F32(floor))) / F32(element_max)
    else:
        q = max(F32(amax) / F32(element_max), F32(floor))
    return ceil_log2_f32(float(q))


def ds_mla_row(x, head_dim: int, rope_dim: int) -> tuple[bytes, bytes]:
    """fp8_ds_mla (encoded row bytes, decoded bf16 bytes) of one input row (floats, any precision
    up to float32; rounded to bf16 first)."""
    nope = head_dim - rope_dim
    xb = [bf16(v) for v in x]
    values, scales, decoded = ue8m0_e4m3_blocks(xb[:nope], 64)
    rope = bf16_bytes(xb[nope:])
    return values + rope + scales + b"\x00", bf16_bytes(decoded) + rope


def ue8m0_e4m3_blocks(xb, block: int) -> tuple[bytes, bytes, list[float]]:
    """(e4m3 codes, ue8m0 scale bytes, decoded values) of bf16 values ``xb`` in blocks of
    ``block``: the fp8_ds_mla exponent rule (absmax floor 1e-4) per block."""
    codes, scales, decoded = bytearray(), bytearray(), []
    for b in range(len(xb) // block):
        part = xb[block * b:block * (b + 1)]
        e = exponent(max(abs(v) for v in part), FP8_MAX, 1e-4, "absmax")
        part_codes = [e4m3_byte(v * 2.0 ** -e) for v in part]
        codes += bytes(part_codes)
        scales.append(min(max(e + 127, 0), 255))
        decoded += [e4m3_value(c) * 2.0 ** e for c in part_codes]
    return bytes(codes), bytes(scales), decoded


def fp8_indexer_row(x) -> tuple[bytes, bytes]:
    """fp8_indexer (row bytes, decoded float32 bytes) of one float32 row of 128 values."""
    assert len(x) == 128
    e = exponent(max(abs(f32(v)) for v in x), FP8_MAX, 1e-10, "scale")
    codes = [e4m3_byte(f32(v) * 2.0 ** -e) for v in x]
    return bytes(codes) + f32_bytes([2.0 ** e]), f32_bytes([e4m3_value(c) * 2.0 ** e for c in codes])


def e2m1_code(y: float) -> int:
    a = min(abs(y), 6.0)
    code = sum(a > t for t in E2M1_THRESHOLDS)
    return code | (8 if y < 0 and code else 0)


def mxfp4_row(x) -> tuple[bytes, bytes]:
    """mxfp4_indexer (row bytes, decoded float32 bytes) of one float32 row."""
    codes, scales, decoded = [], bytearray(), []
    for b in range(len(x) // 32):
        block = [f32(v) for v in x[32 * b:32 * b + 32]]
        e = min(max(exponent(max(abs(v) for v in block), 6.0, 1e-4, "absmax"), -127), 127)
        block_codes = [e2m1_code(f32(v * 2.0 ** -e)) for v in block]
        codes += block_codes
        scales.append(e + 127)
        decoded += [(-1.0 if c & 8 else 1.0) * E2M1_VALUES[c & 7] * 2.0 ** e for c in block_codes]
    packed = bytes(codes[2 * k] | codes[2 * k + 1] << 4 for k in range(len(codes) // 2))
    return packed + bytes(scales), f32_bytes(decoded)


def cos_sin_row(p: int, rope_dim: int = 64, base: float = 10000.0) -> tuple[list[float], list[float]]:
    """(cos, sin) float32 lists of row p of the rope table (float64 math, rounded to float32)."""
    half = rope_dim // 2
    angles = [p * base ** (-2.0 * i / rope_dim) for i in range(half)]
    return [f32(math.cos(a)) for a in angles], [f32(math.sin(a)) for a in angles]


def rope_gptj(x, p: int, rope_dim: int = 64) -> list[float]:
    """Forward GPT-J rotation of the last rope_dim values in float32 arithmetic (no FMA)."""
    cos, sin = cos_sin_row(p, rope_dim)
    out = [f32(v) for v in x]
    nope = len(x) - rope_dim
    for i in range(rope_dim // 2):
        e, o, c, s = F32(out[nope + 2 * i]), F32(out[nope + 2 * i + 1]), F32(cos[i]), F32(sin[i])
        out[nope + 2 * i] = float(e * c - o * s)
        out[nope + 2 * i + 1] = float(e * s + o * c)
    return out


# ----- DeepSeek V4.1 rows (spec/formats/fp8_ds_mla_v41.md, fp4_ds_mla_v41.md): the default profile ---
# (tokenspeed-kernel 0.1.4's writer; on finite input FlashMLA's fp4 writer gives the same bytes)
E4M3_MIN_SUBNORMAL = 2.0 ** -9  # the smallest e4m3 value: the fp4 rows' scale floor


def v41_fp8_row(x) -> tuple[bytes, bytes]:
    """fp8_ds_mla_v41 (row bytes, decoded bf16 bytes) of one row: every dim rounded to bf16, then
    per 32 values the fp8_ds_mla exponent rule, e4m3 codes, one ue8m0 byte."""
    codes, scales, decoded = ue8m0_e4m3_blocks([bf16(v) for v in x], 32)
    return codes + scales, bf16_bytes(decoded)


def e4m3_scale_byte(amax: float) -> int:
    """The fp4 rows' scale byte: e4m3 (ml_dtypes, round to nearest even) of float32(amax / 6)
    clamped to [2^-9, 448]."""
    q = float(F32(amax) / F32(6.0))
    return e4m3_byte(min(max(q, E4M3_MIN_SUBNORMAL), FP8_MAX))


def e2m1_nibble(y: float) -> int:
    """The e2m1 nibble of float32 y by ml_dtypes (round half to even), clamped to ±6 first
    (the sign of zero kept: -0.0 and tiny negatives give 0x8)."""
    y = min(max(f32(y), -6.0), 6.0)
    return int(np.array([F32(y)]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)[0]) & 0xF


def e2m1_float(n: int) -> float:
    return float(np.array([n], dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)[0])


def v41_fp4_row(x) -> tuple[bytes, bytes]:
    """fp4_ds_mla_v41 (row bytes, decoded bf16 bytes) of one row: bf16 input, per 16 values an
    e4m3 scale s, nibbles e2m1(fl32(x / s)), element 2k in the low nibble."""
    xb = [bf16(v) for v in x]
    nibbles, scales, decoded = [], bytearray(), []
    for b in range(len(xb) // 16):
        block = xb[16 * b:16 * b + 16]
        sb = e4m3_scale_byte(max(abs(v) for v in block))
        s = e4m3_value(sb)
        block_nibbles = [e2m1_nibble(float(F32(v) / F32(s))) for v in block]
        nibbles += block_nibbles
        scales.append(sb)
        decoded += [e2m1_float(n) * s for n in block_nibbles]
    packed = bytes(nibbles[2 * k] | nibbles[2 * k + 1] << 4 for k in range(len(nibbles) // 2))
    return packed + bytes(scales), bf16_bytes(decoded)
