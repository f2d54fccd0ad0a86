"""Golden vectors of the DeepSeek V4.1 page formats (spec/formats/fp8_ds_mla_v41.md,
fp4_ds_mla_v41.md), built like the others in generate.py: no kvformats import, inputs from Python
floats, bytes from the independent oracle (ml_dtypes casts), and the bytes the format files state
for the edge cases asserted before anything is returned.

The layouts are the page-planar ones; the encode rule is the default profile "tokenspeed"
(tokenspeed-kernel 0.1.4's released writer, spec/formats/fp8_ds_mla_v41.md and fp4_ds_mla_v41.md).
"""

from __future__ import annotations

import oracle as o
from adversarial import bf16_cases, padded, pattern

V41 = {"head_dim": 512, "page_size": 64}
E4M3_TIES = [17.0, 19.0, -17.0, 34.0, 38.0, 272.0, 304.0, 9.5, 4.75]  # RNE picks the even mantissa


def fp8_row0() -> list[float]:
    """Zero and -0.0 blocks, a block max of exactly 448 * 2^-3, e4m3 ties, the 1e-4 absmax floor,
    a huge block; the rest (RoPE dims too, all quantized) a pattern."""
    b2 = padded([56.0, -56.0], 32, pattern(32, 11, 17, 0.25))
    b3 = padded([t * 2.0 ** -11 for t in E4M3_TIES], 32, pattern(32, 5, 23, 2.0 ** -11))
    b4 = padded([2.0 ** -20, -(2.0 ** -20), 2.0 ** -30], 32)
    b5 = padded([1.5 * 2.0 ** 100], 32, pattern(32, 7, 19, 2.0 ** 95))
    rest = [v for b in range(6, 16) for v in pattern(32, 13, 31, 2.0 ** (b - 10))]
    return [0.0] * 32 + [-0.0] * 32 + b2 + b3 + b4 + b5 + rest


def fp8_vector(vector, tensor) -> dict:
    slots = [70, -1, 3]
    enc, rows, decoded, x = bf16_cases([fp8_row0(), pattern(512, 3, 7, 1.0), pattern(512, 17, 41, 2.0 ** -3)],
                                       o.v41_fp8_row, slots, 528)
    row0 = enc[0][0]
    assert row0[512:514] == b"\x69\x69" and set(row0[:32]) == {0} and set(row0[32:64]) == {0x80}
    assert row0[514] == 127 - 3 and row0[64:66] == b"\x7e\xfe"  # 56 = 448 * 2^-3
    assert row0[515] == 127 - 11 and row0[96] == 0x58  # 17 -> 16 (even mantissa)
    assert row0[516] == 0x69 and row0[128] == 0x48  # floored absmax 1e-4: 2^-20 * 2^22 = 4
    return _vector(vector, tensor, "fp8_ds_mla_v41",
                   "fp8_ds_mla_v41 (528 B) rows: zero and -0.0 blocks (scale 0x69, bytes 00 / 80), a block max of "
                   "448 * 2^-3 (scale 0x7c, 7e fe), e4m3 ties to even, the 1e-4 floor, a huge block; slot 70 "
                   "of 64-row pages of 33792 B -> values at 36864, scale at 66656; a -1 slot between",
                   x, slots, rows, decoded, 33792, [512, 16], (36864, 66656))


def _vector(vector, tensor, fmt: str, description: str, x: bytes, slots, rows, decoded, page_stride: int,
            record_bytes: list[int], offsets: tuple[int, int]) -> dict:
    """A V4.1 vector: three bf16 rows of 512 at ``slots`` in 2 pages, and the values and scale
    offsets of slot 70 (``offsets``)."""
    name = f"v41_{fmt.removesuffix('_v41')}"
    source = f"independent oracle (spec/vectors/oracle.py); spec/formats/{fmt}.md"
    return vector(name, source, description, fmt, V41, {"x": tensor("bfloat16", [3, 512], x)}, slots, 2,
                  page_stride, record_bytes, rows, decoded,
                  slot_offsets=[{"slot": 70, "page_stride": page_stride, "region": region, "offset": offset}
                                for region, offset in zip(("values", "scale"), offsets)])


def fp4_row0() -> list[float]:
    """Blocks of 16: zeros; -0.0 and tiny negatives; max exactly 6 with every e2m1 tie; a max
    whose amax / 6 rounds down (6.375 -> s = 1) and one that rounds up (6.5 -> s = 1.125);
    a block above 2688 (s clamped to 448); a tiny block (s floored at 2^-9); a block whose scale is
    an e4m3 subnormal (amax 6 * 5 * 2^-9 -> s = 5 * 2^-9); the rest a pattern."""
    ties = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -6.0]
    blocks = [[0.0] * 16, [-0.0, -(2.0 ** -12)] * 8, ties,
              padded([6.375, -6.0], 16, pattern(16, 5, 13, 0.5)), padded([6.5, 5.75], 16, pattern(16, 7, 11, 0.5)),
              padded([4096.0, -3072.0, 500.0], 16, pattern(16, 3, 7, 64.0)),
              padded([6 * 2.0 ** -11, 2.0 ** -11, -(2.0 ** -12)], 16),
              padded([30 * 2.0 ** -9, -(2.0 ** -9), 7 * 2.0 ** -9], 16)]
    flat = [v for b in blocks for v in b]
    return flat + [v for b in range(len(blocks), 32) for v in pattern(16, 11, 23, 2.0 ** (b % 9 - 4))]


def fp4_vector(vector, tensor) -> dict:
    slots = [70, -1, 3]
    enc, rows, decoded, x = bf16_cases([fp4_row0(), pattern(512, 3, 7, 1.0), pattern(512, 17, 41, 2.0 ** -3)],
                                       o.v41_fp4_row, slots, 288)
    row0, scales = enc[0][0], enc[0][0][256:]
    assert scales[0] == 0x01 and set(row0[:8]) == {0}  # zero block: s = 2^-9, nibbles 0
    assert scales[1] == 0x01 and set(row0[8:16]) == {0x88}  # -0.0 and tiny negatives keep their sign
    assert scales[2] == 0x38  # s = 1.0: ties go even (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, ...)
    assert row0[16] == 0x07 | 0x00 << 4 and row0[17] == 0x2 | 0x2 << 4  # 6, 0.25 | 0.75, 1.25
    assert row0[18] == 0x4 | 0x4 << 4 and row0[19] == 0x6 | 0x6 << 4  # 1.75, 2.5 | 3.5, 5
    assert scales[3] == 0x38 and row0[24] & 0xF == 0x7  # 6.375 / 1 saturates at 6
    assert scales[4] == 0x39  # 6.5 / 6 -> 1.125
    assert scales[5] == 0x7E  # 4096 / 6 > 448: clamped
    assert scales[6] == 0x01  # 6 * 2^-11 / 6 = 2^-11 -> floored at 2^-9
    assert scales[7] == 0x05 and row0[56] & 0xF == 0x7  # s = 5 * 2^-9, an e4m3 subnormal; 30 / 5 = 6
    return _vector(vector, tensor, "fp4_ds_mla_v41",
                   "fp4_ds_mla_v41 (288 B) rows: a zero block (scale 01), -0.0 (nibbles 8), every e2m1 tie at "
                   "s = 1 (scale 38), a scale that rounds down (6.375: saturates) and one that rounds up (6.5 -> "
                   "1.125), a block above 2688 (scale 7e), a tiny block (scale floored at 2^-9), a subnormal scale "
                   "(05); slot 70 of 64-row "
                   "pages of 18432 B -> values at 19968, scale at 35008; a -1 slot between",
                   x, slots, rows, decoded, 18432, [256, 32], (19968, 35008))


def build(vector, tensor) -> list[dict]:
    return [fp8_vector(vector, tensor), fp4_vector(vector, tensor)]
