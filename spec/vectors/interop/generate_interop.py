"""Golden vectors of the interop work: the V3.2 656-byte row (fp8_ds_mla_v32) under both of its
profiles, and the non-default numerics profiles of the V4 formats.

    python spec/vectors/interop/generate_interop.py          # (re)write spec/vectors/interop/*.json
    python spec/vectors/interop/generate_interop.py --check  # exit 1 if a committed file differs

Nothing here imports kvformats. The bytes come from the published layout facts only (spec/engines.md
§2 FlashMLA / vLLM, §5 divergence matrix, OCP MX v1.0 as spec/engines.md summarises it), computed one
element at a time with Python floats, numpy float32 and ml_dtypes casts, reusing only the
kvformats-free helpers of ``../oracle.py`` (bf16 / e4m3 element casts, float32 rounding) and
``../generate.py`` (the vector JSON shape). A few hand-checked literals are asserted before
anything is written, so a wrong rule fails generation rather than producing a wrong vector.

V3.2 row (656 B, token-interleaved, no page tail): ``[512 e4m3 | 4 x float32 LE scale | 64 x bf16
LE rope]``; tile t covers NoPE dims 128t..128t+127.
"""

from __future__ import annotations

import math
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import generate as g  # noqa: E402
import oracle as o  # noqa: E402

F32 = np.float32
FLT_MIN = 2.0**-126
V32_ROW = 656


# ----- element rules written from the facts -------------------------------------------------------
def v32_row(x, profile: str) -> tuple[bytes, bytes]:
    """(656-byte row, decoded bf16 bytes) of one 576-value input (rounded to bf16 first).

    flashmla-ref: s = 2^ceil(log2(max(amax / 448, 1e-4))) (float32 division, float32 log2),
    y = x * 2^-e.  vllm: s = max(fl32(amax / 448), FLT_MIN), y = fl32(x / s).  Both: clamp ±448,
    e4m3 RNE; decode bf16(fl32(e4m3 * s))."""
    xb = [o.bf16(v) for v in x]
    values, scales, decoded = bytearray(), [], []
    for t in range(4):
        tile = xb[128 * t:128 * t + 128]
        amax = max(abs(v) for v in tile)
        if profile == "flashmla-ref":
            e = o.exponent(amax, 448.0, 1e-4, "scale")
            s = 2.0**e
            codes = [o.e4m3_byte(v * s**-1) for v in tile]  # a power of two: exact
        else:
            s = float(max(F32(amax) / F32(448.0), F32(FLT_MIN)))
            codes = [o.e4m3_byte(float(F32(v) / F32(s))) for v in tile]
        values += bytes(codes)
        scales.append(s)
        decoded += [float(F32(o.e4m3_value(c)) * F32(s)) for c in codes]
    rope = o.bf16_bytes(xb[512:])
    return bytes(values) + o.f32_bytes(scales) + rope, o.bf16_bytes(decoded) + rope


def e2m1_rne_code(y: float, signed_zero: bool) -> int:
    """Round-half-even e2m1 code of y, saturating at 6; the sign bit copies y's sign."""
    a = min(abs(y), 6.0)
    mags = o.E2M1_VALUES
    best = min(range(8), key=lambda c: (abs(mags[c] - a), c & 1))  # a tie takes the even code
    neg = math.copysign(1.0, y) < 0 if signed_zero else (y < 0 and best != 0)
    return best | (8 if neg else 0)


def mxfp4_row_profile(x, profile: str) -> tuple[bytes, bytes]:
    """mxfp4_indexer row under vllm (ceil rule, amax floor 6*2^-126, RNE, signed zero) or ocp
    (e = floor(log2 amax) - 2, clamped to ±127, RNE, signed zero)."""
    codes, scales, decoded = [], bytearray(), []
    for b in range(len(x) // 32):
        block = [o.f32(v) for v in x[32 * b:32 * b + 32]]
        amax = max(abs(v) for v in block)
        if profile == "vllm":
            e = o.exponent(amax, 6.0, 6 * 2.0**-126, "absmax")
        else:
            e = -127 if amax == 0 else math.floor(math.log2(amax)) - 2  # log2 exact for these inputs
        e = min(max(e, -127), 127)
        block_codes = [e2m1_rne_code(o.f32(v * 2.0**-e), True) for v in block]
        codes += block_codes
        scales.append(e + 127)
        decoded += [(-1.0 if c & 8 else 1.0) * o.E2M1_VALUES[c & 7] * 2.0**e for c in block_codes]
    packed = bytes(codes[2 * k] | codes[2 * k + 1] << 4 for k in range(len(codes) // 2))
    return packed + bytes(scales), o.f32_bytes(decoded)


def fp8_indexer_row_profile(x, profile: str) -> tuple[bytes, bytes]:
    """fp8_indexer row under vllm (2^ceil(log2(max(amax, 1e-4) / 448))) or deepgemm-ref
    (s = fl32(max(amax, 1e-4) / 448), arbitrary; y = fl32(x / s))."""
    amax = max(abs(o.f32(v)) for v in x)
    if profile == "vllm":
        s = 2.0 ** o.exponent(amax, 448.0, 1e-4, "absmax")
    else:
        s = float(F32(max(F32(amax), F32(1e-4))) / F32(448.0))
    codes = [o.e4m3_byte(float(F32(o.f32(v)) / F32(s))) for v in x]
    return bytes(codes) + o.f32_bytes([s]), o.f32_bytes([float(F32(o.e4m3_value(c)) * F32(s)) for c in codes])


def ds_mla_row_flashmla(x, head_dim: int = 512, rope_dim: int = 64) -> bytes:
    """584-byte V4 row with FlashMLA's MODEL1 rule: floor 1e-4 on the scale amax/448."""
    nope = head_dim - rope_dim
    xb = [o.bf16(v) for v in x]
    values, scales = bytearray(), bytearray()
    for b in range(nope // 64):
        block = xb[64 * b:64 * b + 64]
        e = o.exponent(max(abs(v) for v in block), 448.0, 1e-4, "scale")
        values += bytes(o.e4m3_byte(v * 2.0**-e) for v in block)
        scales.append(min(max(e + 127, 0), 255))
    return bytes(values) + o.bf16_bytes(xb[nope:]) + bytes(scales) + b"\x00"


# ----- inputs ---------------------------------------------------------------------------------------
def v32_input() -> list[float]:
    """576 values: tile 0 random-ish at 2^-3, tile 1 all zero (the floors differ), tile 2 with its
    maximum exactly 448 * 2^-4 = 28 and RNE ties, tile 3 tiny (amax 0.01: below 448 * 1e-4, so
    flashmla-ref's scale floor acts), then a bf16 RoPE tail."""
    t0 = [(((37 * d) % 101) - 50) * 2.0**-3 / 50 for d in range(128)]
    t1 = [0.0] * 128
    t1[5] = -0.0
    t2 = [(((13 * d) % 29) - 14) * 0.5 for d in range(128)]
    t2[0], t2[1], t2[2] = 28.0, -17 * 2.0**-4, 25 * 2.0**-4  # 17 and 25 (x 2^-4) are e4m3 ties at e = -4
    t3 = [(((7 * d) % 11) - 5) * 0.002 for d in range(128)]
    rope = [(((5 * d) % 17) - 8) * 0.375 for d in range(64)]
    return t0 + t1 + t2 + t3 + rope


def mxfp4_ties_input() -> list[float]:
    """128 values: block 0 holds the e2m1 midpoints (x 1, amax 6 -> e = 0) where RNE and the
    threshold rule differ (0.75, 1.75, 3.5) or agree (0.25, 1.25, 2.5, 5), negatives, -0.0 and a
    tiny negative; block 1 amax 7 (OCP: e = 0, 7 saturates to 6; ceil rule: e = 1); block 2 zero;
    block 3 amax 1e-30 (below 1e-4: only the floors differ)."""
    b0 = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -1.75, -3.5, -0.0, -0.1, 0.1, 0.5, 1.0]
    b0 += [-6.0, 4.0, 3.0, 2.0, 1.5, -0.25, -2.5, -5.0] + [0.0] * 8
    b1 = [7.0, -7.0, 6.5, 5.5, 3.0, 1.0, -0.4, 0.3] + [((3 * i) % 9 - 4) * 0.75 for i in range(24)]
    b3 = [1e-30 * ((i % 5) - 2) for i in range(32)]
    return [o.f32(v) for v in b0 + b1 + [0.0] * 32 + b3]


def fp8_indexer_input(scale: float) -> list[float]:
    """128 bf16 values, amax about 0.86 * scale (vllm's vector uses 2^-20: below its 1e-4 absmax
    floor, above tokenspeed's 1e-10 scale floor, so the two rules differ)."""
    return [o.bf16((((29 * i) % 97) - 48) * 2.0**-6 * (1.0 + (i % 3) / 7) * scale) for i in range(128)]


# ----- vectors --------------------------------------------------------------------------------------
V32_SLOT, V32_PAGE = 70, 64  # slot 70 of 64-row pages of 41984 B: row at 41984 + 6 * 656 = 45920


def v32_vector(profile: str) -> dict:
    x = v32_input()
    row, dec = v32_row(x, profile)
    assert len(row) == V32_ROW
    xb = [o.bf16(v) for v in x]
    inputs = {"x": g.tensor("bfloat16", [1, 576], o.bf16_bytes(xb))}
    vid = "v32_" + profile.replace("-", "_")
    desc = {"flashmla-ref": "V3.2 656 B row, FlashMLA reference numerics: power-of-two float32 scales "
                            "2^ceil(log2(max(amax/448, 1e-4)))",
            "vllm": "V3.2 656 B row, vLLM concat_and_cache_ds_mla numerics: arbitrary float32 scales "
                    "max(amax/448, FLT_MIN), values x / scale"}[profile]
    params = {"head_dim": 576, "rope_dim": 64, "page_size": V32_PAGE, "profile": profile}
    vec = g.vector(vid, "spec/engines.md §2 FlashMLA / vLLM, §5 (published V3.2 layout facts)",
                   desc + "; tiles: mixed, zero (-0.0 at dim 133), max 28 with ties, tiny; slot 70 -> row at 45920",
                   "fp8_ds_mla_v32", params, inputs, [V32_SLOT], 2, None, [V32_ROW], [row],
                   [{"row": 0, "start": 0, "dtype": "bfloat16", "hex": dec.hex()}],
                   slot_offsets=[{"slot": V32_SLOT, "page_stride": 41984, "region": "nope", "offset": 45920},
                                 {"slot": V32_SLOT, "page_stride": 41984, "region": "scale", "offset": 46432},
                                 {"slot": V32_SLOT, "page_stride": 41984, "region": "rope", "offset": 46448}])
    return vec


def mxfp4_vector(profile: str) -> dict:
    x = mxfp4_ties_input()
    row, dec = mxfp4_row_profile(x, profile)
    inputs = {"x": g.tensor("float32", [1, 128], o.f32_bytes(x))}
    return g.vector(f"profile_mxfp4_{profile}", "spec/engines.md §5 (vLLM V4 MXFP4 indexer; OCP MX v1.0 in §2)",
                    f"mxfp4_indexer, profile {profile}: e2m1 midpoints (RNE vs threshold), signed zero, "
                    "saturation, zero and tiny blocks", "mxfp4_indexer",
                    {"head_dim": 128, "page_size": 64, "profile": profile}, inputs, [3], 1, None, [64, 4],
                    [row], [{"row": 0, "start": 0, "dtype": "float32", "hex": dec.hex()}])


def fp8_indexer_vector(profile: str) -> dict:
    x = fp8_indexer_input(2.0**-20 if profile == "vllm" else 1.0)
    row, dec = fp8_indexer_row_profile(x, profile)
    inputs = {"x": g.tensor("bfloat16", [1, 128], o.bf16_bytes(x))}
    return g.vector(f"profile_fp8_indexer_{profile.replace('-', '_')}", "spec/engines.md §5 (vLLM / DeepGEMM FP8 indexer)",
                    f"fp8_indexer, profile {profile}" + (" (amax ~8e-7: the absmax floor 1e-4 acts)"
                                                         if profile == "vllm" else " (arbitrary float32 scale)"),
                    "fp8_indexer", {"head_dim": 128, "page_size": 64,
                                                                       "profile": profile},
                    inputs, [1], 1, None, [128, 4], [row], [{"row": 0, "start": 0, "dtype": "float32",
                                                             "hex": dec.hex()}])


def ds_mla_flashmla_vector() -> dict:
    x = [(((37 * d) % 101) - 50) * 2.0 ** (d // 64 - 8) for d in range(512)]
    for d in range(128, 192):
        x[d] = 0.0
    for d in range(192, 256):
        x[d] = (d % 7 - 3) * 2.0**-12  # amax 3 * 2^-12 < 448e-4: FlashMLA's scale floor acts
    xb = [o.bf16(v) for v in x]
    row = ds_mla_row_flashmla(xb)
    inputs = {"x": g.tensor("bfloat16", [1, 512], o.bf16_bytes(xb))}
    return g.vector("profile_fp8_ds_mla_flashmla_ref", "spec/engines.md §2 FlashMLA tests/quant.py, §5 'MODEL1 584 B'",
                    "fp8_ds_mla (V4 584 B), profile flashmla-ref: zero and tiny blocks take e = -13 "
                    "(scale floor 1e-4), not tokenspeed's -22", "fp8_ds_mla",
                    {"head_dim": 512, "rope_dim": 64, "page_size": 64, "profile": "flashmla-ref"},
                    inputs, [0], 1, None, [576, 8], [row])


def literal_checks() -> None:
    """Hand-derived facts the rules above must reproduce."""
    row, _ = v32_row(v32_input(), "flashmla-ref")
    sc = struct.unpack("<4f", row[512:528])
    assert sc[1] == 2.0**-13 and sc[3] == 2.0**-13, sc  # ceil(log2(1e-4)) = -13 for zero and tiny tiles
    assert sc[2] == 2.0**-4 and row[256] == 0x7E  # 28 = 448 * 2^-4 -> byte 0x7E
    assert row[257] == 0xD8 and row[258] == 0x5C  # -17 -> -16 (0xD8), 25 -> 24 (0x5C): RNE ties to even
    assert row[128 + 5] == 0x80  # -0.0 keeps its sign
    row, _ = v32_row(v32_input(), "vllm")
    assert row[528 - 12:528 - 8] == bytes.fromhex("00008000")  # zero tile: FLT_MIN = 0x00800000
    assert struct.unpack("<f", row[520:524])[0] == float(F32(28.0) / F32(448.0))  # 0.0625 exactly
    r, _ = mxfp4_row_profile(mxfp4_ties_input(), "vllm")
    nib = [r[i // 2] >> (4 * (i % 2)) & 0xF for i in range(32)]
    assert nib[:12] == [7, 0, 2, 2, 4, 4, 6, 6, 0xA, 0xC, 0xE, 0x8]  # 0.75->1, 1.75->2, 3.5->4, -0.0->0x8
    assert nib[12] == 0x8  # -0.1 rounds to -0
    r, _ = mxfp4_row_profile(mxfp4_ties_input(), "ocp")
    assert list(r[64:68]) == [127, 127, 0, 127 + math.floor(math.log2(2e-30)) - 2]
    assert r[16] & 0xF == 7  # block 1: 7 saturates to 6 under OCP's e = 0


def build_all() -> dict[str, dict]:
    literal_checks()
    vecs = [v32_vector("flashmla-ref"), v32_vector("vllm"), mxfp4_vector("vllm"), mxfp4_vector("ocp"),
            fp8_indexer_vector("vllm"), fp8_indexer_vector("deepgemm-ref"), ds_mla_flashmla_vector()]
    return {f"{v['id']}.json": v for v in vecs}


def main(argv: list[str]) -> int:
    return g.write_or_check(build_all(), HERE, "--check" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
