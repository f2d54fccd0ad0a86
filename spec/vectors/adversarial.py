"""Adversarial golden vectors: edge cases of spec/upstream.md §2.2, §3.2, §4.3 and §7, with expected
bytes from the independent oracle (``oracle.py``). Each case also asserts the bytes spec/upstream.md
states for it (zero blocks, -0.0, 448·2^k, RNE ties, the float32 log2 quirk), so the oracle
cannot silently drift from the document."""

from __future__ import annotations

import struct

import oracle as o

DS = {"head_dim": 512, "rope_dim": 64, "page_size": 64}
IDX = {"head_dim": 128, "page_size": 64}
# Ties of e4m3 (RNE picks the even mantissa) and two subnormal ties, in units of the scale.
E4M3_TIES = [-400.0, 432.0, 17.0, 19.0, -17.0, 34.0, 38.0, 272.0, 304.0, 9.5, 4.75,
             2.0 ** -10, 3 * 2.0 ** -10, -(2.0 ** -10)]


def slot_rows(enc, slots, row_bytes: int, decoded_bytes: int, dtype: str = "float32"):
    """Expected gathered rows and decoded entries for ``enc`` (pairs of row bytes and decoded
    bytes) written at ``slots``: a slot of -1 writes nothing, so it gathers and decodes as zeros."""
    rows = [e[0] if s >= 0 else bytes(row_bytes) for e, s in zip(enc, slots)]
    decoded = [{"row": i, "start": 0, "dtype": dtype, "hex": (e[1] if s >= 0 else bytes(decoded_bytes)).hex()}
               for i, (e, s) in enumerate(zip(enc, slots))]
    return rows, decoded


def bf16_cases(rows_in, encode, slots, row_bytes: int):
    """(encoded rows, gathered rows, decoded entries, input bytes) of bf16 input rows written at
    ``slots`` by the oracle's ``encode`` (row -> (row bytes, decoded bf16 bytes)); the inputs
    must be bf16 values already, so the vector's input bytes are exactly the rows encoded."""
    assert all(o.bf16(v) == v for r in rows_in for v in r), "bf16 inputs must be exact"
    enc = [encode(r) for r in rows_in]
    rows, decoded = slot_rows(enc, slots, row_bytes, 2 * len(rows_in[0]), "bfloat16")
    return enc, rows, decoded, b"".join(o.bf16_bytes(r) for r in rows_in)


def pattern(n: int, mult: int, mod: int, unit: float) -> list[float]:
    return [(((mult * j) % mod) - mod // 2) * unit for j in range(n)]


def padded(values, n, fill=None):
    fill = fill if fill is not None else [0.0] * n
    return list(values) + fill[len(values):n]


def ds_row0() -> list[float]:
    """Zero block, -0.0 block, exact 448·2^-3 max, RNE ties at 2^-11, the 1e-4 absmax floor,
    a huge block, and a block whose max rounds down to 224·2^-4."""
    b2 = padded([56.0, -56.0], 64, pattern(64, 11, 17, 0.25))
    b3 = padded([t * 2.0 ** -11 for t in E4M3_TIES], 64, pattern(64, 5, 23, 2.0 ** -11))
    b4 = padded([2.0 ** -20, 2.0 ** -30, 2.0 ** -31, 2.0 ** -32, 3 * 2.0 ** -33, -(2.0 ** -20)], 64)
    b5 = padded([1.5 * 2.0 ** 100], 64, pattern(64, 7, 19, 2.0 ** 95))
    b6 = padded([225 * 2.0 ** -4], 64, pattern(64, 3, 13, 2.0 ** -4))
    rope = [-0.0, 2.0 ** -133, 3.3895313892515355e38, -3.3895313892515355e38, 1.0] + pattern(59, 9, 31, 0.5)
    return [0.0] * 64 + [-0.0] * 64 + b2 + b3 + b4 + b5 + b6 + rope


def ds_row2() -> list[float]:
    """Max 224·2^-5 (exponent k-1, value 448), an all-negative block at -448·2^5, subnormal
    outputs and a negative value that rounds to -0.0."""
    b0 = padded([7.0], 64, pattern(64, 13, 29, 2.0 ** -4))
    b1 = [-abs(v) - 16 for v in pattern(64, 17, 37, 16.0)]
    b1[9] = -448.0 * 32
    b2 = padded([1.0, 2.0 ** -17, 2.0 ** -18, 3 * 2.0 ** -18, -(2.0 ** -18)], 64)
    rest = [v for b in range(3, 7) for v in pattern(64, 13, 31, 2.0 ** (b - 4))]
    return b0 + b1 + b2 + rest + pattern(64, 7, 29, 0.25)


def check_ds_facts(row0: bytes, row2: bytes) -> None:
    scales0 = row0[576:584]
    assert scales0[0] == scales0[1] == 0x69 and set(row0[:64]) == {0} and set(row0[64:128]) == {0x80}
    assert scales0[2] == 127 - 3 and row0[128:130] == b"\x7e\xfe"
    assert scales0[3] == 127 - 11 and row0[192] == 0xFC  # -400 -> -384
    assert scales0[4] == 0x69 and row0[256] == 0x48  # floored absmax: 2^-20 * 2^22 = 4
    assert scales0[6] == 127 - 4 and row0[384] == 0x76  # 225 -> 224
    assert row2[576] == 127 - 6 and row2[0] == 0x7E and row2[64 + 9] == 0xFE
    assert row2[128 + 4] == 0x80  # -2^-10 in scale units rounds to -0.0


def ds_mla_edges(vector) -> dict:
    slots = [5, -1, 130]
    enc, rows, decoded, x = bf16_cases([ds_row0(), pattern(512, 3, 7, 1.0), ds_row2()],
                                       lambda r: o.ds_mla_row(r, 512, 64), slots, 584)
    check_ds_facts(enc[0][0], enc[2][0])
    return vector("adv_fp8_ds_mla_edges", "independent oracle (spec/vectors/oracle.py); spec/upstream.md §2.2, §7",
                  "bf16 rows: zero and -0.0 blocks (scale 0x69; 0x00 / 0x80), max exactly 448*2^-3 "
                  "(0x7E), RNE ties at 2^-11 (-400 -> -384 = 0xFC, 432 -> 448, subnormal ties), the "
                  "1e-4 absmax floor, a 2^100 block, 225*2^-4 -> 224, max 224*2^-5 (e = -6), a value "
                  "rounding to -0.0, rope bit patterns stored verbatim; slot -1 skipped; page stride "
                  "38016 (37440 + 576)", "fp8_ds_mla", DS,
                  {"x": {"dtype": "bfloat16", "shape": [3, 512], "hex": x.hex()}}, slots, 3, 38016,
                  [576, 8], rows, decoded)


def ds_mla_fp32(vector) -> dict:
    """float32 input: encode rounds to bf16 before the absmax, so the exponent follows bf16(x)."""
    b0 = padded([56.0 * (1 + 2.0 ** -9), 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20], 64,
                [v / 3 for v in pattern(64, 5, 11, 1.0)])
    b1 = padded([112.0 * (1 + 2.0 ** -10)], 64, [v / 7 for v in pattern(64, 3, 17, 1.0)])
    rest = [o.f32(v / 9) for v in pattern(320, 7, 41, 1.0)]
    rope = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 2.0 ** -8 + 2.0 ** -23, o.f32(3.0000001),
            -0.0, 65504.5, 1e-40] + [o.f32(v / 11) for v in pattern(56, 5, 23, 1.0)]
    rows_in = [[o.f32(v) for v in b0 + b1 + rest + rope], [o.f32(v / 13) for v in pattern(512, 37, 101, 1.0)]]
    enc = [o.ds_mla_row(r, 512, 64) for r in rows_in]
    assert enc[0][0][576:578] == bytes([127 - 3, 127 - 2]) and enc[0][0][0] == 0x7E and enc[0][0][64] == 0x7E
    assert enc[0][0][448:452] == bytes.fromhex("803f823f")  # bf16 ties to even: 1.0, 1.015625
    x = o.f32_bytes([v for r in rows_in for v in r])
    decoded = [{"row": i, "start": 0, "dtype": "bfloat16", "hex": e[1].hex()} for i, e in enumerate(enc)]
    return vector("adv_fp8_ds_mla_fp32", "independent oracle; spec/upstream.md §2.2 step 1",
                  "float32 input: NoPE values are rounded to bf16 before the absmax (56*(1+2^-9) -> 56, "
                  "e = -3; 112*(1+2^-10) -> 112, e = -2), rope values round to bf16 with ties to even "
                  "(1+2^-8 -> 1.0, 1+3*2^-8 -> 1+2^-6) including a float32 subnormal",
                  "fp8_ds_mla", DS, {"x": {"dtype": "float32", "shape": [2, 512], "hex": x.hex()}},
                  [0, 63], 1, None, [576, 8], [e[0] for e in enc], decoded)


def indexer_rows() -> list[list[float]]:
    quirk = o.next_up_f32(448.0 * 2 ** 10)  # q = amax/448 = 2^10 (1 + 2^-23): fl32(log2 q) = 10
    quirk_neg = o.next_up_f32(448.0 * 2.0 ** -20)
    return [
        [0.0] * 128,
        [-0.0] * 128,
        padded([3584.0, -3584.0], 128, pattern(128, 7, 61, 8.0)),
        padded([t * 2.0 ** -11 for t in E4M3_TIES], 128),
        padded([quirk, -quirk, 448.0 * 2 ** 9, 1.0], 128, pattern(128, 11, 53, 4096.0)),
        padded([2.0 ** -40, -(2.0 ** -40), 3 * 2.0 ** -42, 2.0 ** -43, 2.0 ** -44], 128),
        [o.f32(v / 3) for v in pattern(128, 5, 43, 1.0)],
        padded([quirk_neg, 448.0 * 2.0 ** -21], 128, pattern(128, 3, 37, 2.0 ** -25)),
    ]


def fp8_indexer_edges(vector) -> dict:
    rows_in = indexer_rows()
    enc = [o.fp8_indexer_row(r) for r in rows_in]
    scale = [e[0][128:] for e in enc]
    assert scale[0] == scale[1] == bytes.fromhex("0000002f") and set(enc[1][0][:128]) == {0x80}
    assert scale[2] == struct.pack("<f", 8.0) and enc[2][0][:2] == b"\x7e\xfe"
    assert enc[3][0][0] == 0xFC and scale[3] == struct.pack("<f", 2.0 ** -11)
    assert scale[4] == bytes.fromhex("00008044") and enc[4][0][:2] == b"\x7e\xfe"  # 2^10, not 2^11
    assert scale[5] == struct.pack("<f", 2.0 ** -33) and enc[5][0][0] == 0x04
    assert scale[7] == struct.pack("<f", 2.0 ** -20) and enc[7][0][0] == 0x7E
    slots = [0, 1, 64, 65, 127, 128, -1, 200]
    rows, decoded = slot_rows(enc, slots, 132, 512)
    x = o.f32_bytes([v for r in rows_in for v in r])
    return vector("adv_fp8_indexer_edges", "independent oracle; spec/upstream.md §3.2, §7",
                  "float32 rows: zero and -0.0 (scale 2^-33 = 00 00 00 2f), max 448*2^3 (scale 2^3, "
                  "0x7E), RNE ties, amax one float32 ulp above 448*2^10 and 448*2^-20 (float32 log2 "
                  "rounds down: scale 2^10 / 2^-20, value clamps to 448 = 0x7E), the 1e-10 scale floor, "
                  "non-bf16 values; slot -1; page stride 8512", "fp8_indexer", IDX,
                  {"x": {"dtype": "float32", "shape": [8, 128], "hex": x.hex()}}, slots, 4, 8512,
                  [128, 4], rows, decoded)


def mxfp4_rows() -> list[list[float]]:
    ties = [t * s * 8 for t in o.E2M1_THRESHOLDS for s in (1, -1)]
    above = [o.next_up_f32(t * 8) for t in o.E2M1_THRESHOLDS]
    quirk = o.next_up_f32(6.0 * 2 ** 10)  # q = 2^10 (1 + 2^-23): e = 10, |y| just above 6 -> code 7
    quirk_neg = o.next_up_f32(6.0 * 2.0 ** -12)
    tiny = [-0.0, -(2.0 ** -20), 2.0 ** -20, -1e-30, -(2.0 ** -16), 2.0 ** -17]
    row0 = ([0.0] * 32 + padded(tiny, 32) + padded([48.0] + ties + above, 32)
            + padded([quirk, 5120.0, 3584.0, -768.0, -quirk], 32, pattern(32, 7, 13, 256.0)))
    row1 = (padded([-1.5], 32, pattern(32, 5, 11, 0.125)) + padded([6.0 * 2.0 ** 100], 32, pattern(32, 3, 7, 2.0 ** 98))
            + padded([3.0, -0.75, 0.375, 0.625], 32, pattern(32, 9, 19, 0.125))
            + padded([quirk_neg], 32, pattern(32, 11, 23, 2.0 ** -16)))
    row2 = [o.f32(v / 7) for v in pattern(128, 13, 47, 1.0)]
    return [row0, row1, row2, [o.f32(v / 3) for v in pattern(128, 3, 29, 1.0)]]


def mxfp4_edges(vector) -> dict:
    rows_in = mxfp4_rows()
    enc = [o.mxfp4_row(r) for r in rows_in]
    r0, r1 = enc[0][0], enc[1][0]
    assert r0[64:68] == bytes([0x70, 0x70, 127 + 3, 127 + 10])
    assert set(r0[:16]) == {0} and r0[16:19] == bytes([0x00, 0x00, 0x09])  # -0.0, tiny negatives, -0.5
    assert r0[32] & 0xF == 7 and r0[32] >> 4 == 0  # 48 -> 6 * 2^3; tie 0.25 * 8 -> 0
    assert r0[48] == 0x67 and r0[49] == 0x95  # quirk max -> 7; 5 * 2^10 -> 4 (6); 3.5 -> 3; -0.75 -> -0.5
    assert r1[64:68] == bytes([127 - 2, 127 + 100, 127 - 1, 127 - 12]) and r1[0] & 0xF == 0xF
    slots = [3, 64, -1, 127]
    rows, decoded = slot_rows(enc, slots, 68, 512)
    x = o.f32_bytes([v for r in rows_in for v in r])
    return vector("adv_mxfp4_edges", "independent oracle; spec/upstream.md §4.2, §4.3, §7",
                  "float32 rows: zero block (0x70), -0.0 and tiny negatives (nibble 0), max exactly "
                  "6*2^3 (code 7), threshold ties toward the smaller magnitude and one ulp above each, "
                  "amax one float32 ulp above 6*2^10 and 6*2^-12 (float32 log2 rounds down: e = 10 / -12, "
                  "code 7), a 6*2^100 block, max 3 (e = -1); slot -1; page stride 4400",
                  "mxfp4_indexer", IDX, {"x": {"dtype": "float32", "shape": [4, 128], "hex": x.hex()}},
                  slots, 2, 4400, [64, 4], rows, decoded)


def build(vector) -> list[dict]:
    return [ds_mla_edges(vector), ds_mla_fp32(vector), fp8_indexer_edges(vector), mxfp4_edges(vector)]
