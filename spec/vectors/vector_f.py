"""Golden vector F (spec/upstream.md §12 F), built like the others in generate.py: it imports no
kvformats, builds the input with Python floats, derives the bytes with the independent oracle
(float32 GPT-J RoPE, an exact float64 Hadamard sum, the MXFP4 row oracle) and asserts them
against the literal bytes of §12 F before returning the vector.

F is stored as an ``encode`` vector of mxfp4_indexer (x = the bf16 Hadamard output, so the
generic vector harness reproduces the packed bytes and scales), plus a ``pipeline`` entry with
the raw query, position and scales that ``deepseek_v4.prepare_indexer_q_mxfp4`` starts from.
"""

from __future__ import annotations

import struct

import oracle as o


F_PACKED = """
1c b1 09 1c 64 02 3c be 1c 11 c1 ae f7 ba e0 1b ee bc ec 1c 1f 02 c4 be 65 11 4d ae b3 ba 0e 1b
63 00 a4 b0 19 ab c0 92 f9 aa 0b 92 c0 09 2a b0 53 00 10 90 3a 99 0a 01 61 99 a1 01 c2 00 91 90
"""
F_SCALES = "7c 7c 7d 7e"
F_SCALE_INT32 = 0x7E7D7C7C


def hadamard_bf16(x) -> list[float]:
    """Natural-order Hadamard of bf16 values: exact float64 sum, times float32(128^-0.5), rounded
    to float32 then to bf16 (spec/upstream.md §4.4)."""
    n = len(x)
    scale = o.f32(n ** -0.5)
    sums = [sum(v if bin(i & j).count("1") % 2 == 0 else -v for i, v in enumerate(x)) for j in range(n)]
    return [o.bf16(o.f32(s * scale)) for s in sums]


def build(vector, tensor, hx, int64s) -> dict:
    """The F vector, made with generate.py's ``vector``, ``tensor``, ``hx`` and ``int64s`` helpers."""
    q = [o.bf16((((11 * i) % 23) - 11) * 0.0625) for i in range(128)]
    rotated = [o.bf16(v) for v in o.rope_gptj(q, 5)]
    x = hadamard_bf16(rotated)
    row, decoded = o.mxfp4_row(x)
    packed, scales = hx(F_PACKED.replace("\n", " ")), hx(F_SCALES)
    assert row == packed + scales, "oracle disagrees with spec/upstream.md §12 F"
    assert struct.unpack("<i", scales)[0] == F_SCALE_INT32
    softmax_scale = 128 ** -0.5
    pipeline = {
        "op": "deepseek_v4.prepare_indexer_q_mxfp4",
        "inputs": {"index_q": tensor("bfloat16", [1, 1, 128], o.bf16_bytes(q)),
                   "positions": int64s([5]),
                   "weights": tensor("float32", [1, 1], o.f32_bytes([1.0]))},
        "cos_sin_cache": {"rope_dim": 64, "max_positions": 8, "base": 10000.0},
        "softmax_scale": softmax_scale, "head_scale": 1.0,
        "expected": {"q_packed": packed.hex(), "q_scale": tensor("int32", [1, 1], scales),
                     "weights": o.f32_bytes([o.f32(o.f32(1.0 * softmax_scale) * 1.0)]).hex()},
    }
    vec = vector("F", "spec/upstream.md §12 F", "indexer query MXFP4 (1 token, 1 head, position 5): q -> "
                   "RoPE(dims 64..127) -> bf16 -> Hadamard-128 -> bf16 -> MXFP4; x is the bf16 Hadamard "
                   "output, so the row is the query's packed bytes + scales 7c 7c 7d 7e (int32 0x7e7d7c7c). "
                   "'pipeline' holds the raw query for deepseek_v4.prepare_indexer_q_mxfp4.",
                   "mxfp4_indexer", {"head_dim": 128, "page_size": 64},
                   {"x": tensor("bfloat16", [1, 128], o.bf16_bytes(x))}, [5], 1, None, [64, 4], [row],
                   [{"row": 0, "start": 0, "dtype": "float32", "hex": decoded[:64].hex()}])
    vec["pipeline"] = pipeline
    return vec
