"""Generate the golden vectors in spec/vectors/*.json.

    python spec/vectors/generate.py          # (re)write every vector file
    python spec/vectors/generate.py --check  # exit 1 if a committed file differs

Nothing here imports kvformats: inputs are built with Python floats / numpy float32, expected
bytes are either copied from spec/upstream.md §12 (the "literal" vectors A..E) or derived by the
independent scalar oracle in ``oracle.py`` (the adversarial vectors in ``adversarial.py``).
Before writing, the oracle is cross-checked against every literal byte and SHA-256 of §12, so
a transcription slip here or an oracle bug fails generation rather than producing a wrong
vector.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import oracle as o  # noqa: E402

SENTINEL = 0xA5

# ----- spec/upstream.md §12, copied verbatim --------------------------------------------------------
A_DATA = """
fc ed 74 fa dc 78 f7 66 7b f2 70 fc ea 76 f9 00 79 f6 6a 7c f0 72 fb e6 77 f8 5c 7a f4 6d 7c ee
74 fa e0 78 f8 64 7b f2 70 fc eb 75 fa d0 79 f6 69 7c f1 72 fb e8 76 f9 58 7a f4 6c 7c ef 73 fa
e2 78 f8 62 7a f3 6f fc ec 74 fa d8 79 f6 68 7b f2 71 fc e9 76 f9 50 7a f5 6b 7c f0 72 fb e4 78
f8 60 7a f4 6e fc ed 74 fa dc 78 f7 66 7b f2 70 fc ea 76 f9 00 79 f6 6a 7c f0 72 fb e6 77 f8 5c
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
f0 72 fb e4 78 f8 60 7a f4 6e fc ed 74 fa dc 78 f7 66 7b f2 70 fc ea 76 f9 00 79 f6 6a 7c f0 72
fb e6 77 f8 5c 7a f4 6d 7c ee 74 fa e0 78 f8 64 7b f2 70 fc eb 75 fa d0 79 f6 69 7c f1 72 fb e8
76 f9 58 7a f4 6c 7c ef 73 fa e2 78 f8 62 7a f3 6f fc ec 74 fa d8 79 f6 68 7b f2 71 fc e9 76 f9
50 7a f5 6b 7c f0 72 fb e4 78 f8 60 7a f4 6e fc ed 74 fa dc 78 f7 66 7b f2 70 fc ea 76 f9 00 79
f6 6a 7c f0 72 fb e6 77 f8 5c 7a f4 6d 7c ee 74 fa e0 78 f8 64 7b f2 70 fc eb 75 fa d0 79 f6 69
7c f1 72 fb e8 76 f9 58 7a f4 6c 7c ef 73 fa e2 78 f8 62 7a f3 6f fc ec 74 fa d8 79 f6 68 7b f2
71 fc e9 76 f9 50 7a f5 6b 7c f0 72 fb e4 78 f8 60 7a f4 6e fc ed 74 fa dc 78 f7 66 7b f2 70 fc
ea 76 f9 00 79 f6 6a 7c f0 72 fb e6 77 f8 5c 7a f4 6d 7c ee 74 fa e0 78 f8 64 7b f2 70 fc eb 75
bc c0 91 41 b6 c1 9b 3f 3b c1 a2 c1 63 c0 4a c1 87 40 b4 c1 ad 41 dc 40 68 c1 51 41 59 c1 41 c0
c9 41 a5 40 8f 41 78 c1 db c0 6b 41 81 c1 67 bf b4 41 f2 c0 26 41 bc c1 e3 c0 3f 41 9b c1 13 c0
92 41 5a c1 4a 40 b5 41 1c c1 0c 41 b7 c1 9f c0 65 41 8e c1 8d 3e 98 41 51 c1 ac 40 c0 41 fb c0
2a 41 ac c1 44 c0 78 41 84 c1 fa 3f a4 41 37 c1 e1 40 c8 c1 d0 c0 40 41 a0 c1 c2 bf 88 41 70 c1
"""
A_SCALES = "74 75 69 77 78 79 7a 00"
A_DATA_SHA = "8075d1de2b83808191639b525156199e17469a88dfd20372d006a03848471c97"
A_SCALES_SHA = "e2ef21ffc4ee0e5a6a4fe466bc32a8a579789ef8fcc4e30d7549c1a0c1cfdb77"
A_DECODED = [-0.1875, -0.05078125, 0.09375, -0.15625, -0.01171875, 0.125, -0.1171875, 0.02734375]
A2_DATA_SHA = "1da877a83acfdbc87f784dcda4e054fb7ea4afb92eeeee8dfe3cdce6ca8883e5"
B_SPANS = [(256, "77 7d 00"), (0, "fe e0 7c f0 79 f6 74 fa"), (128, "48 3e a5 bf 57 be 91 bf")]
D_VALUES = """
fc f2 6a 7a f6 00 76 fa ea 72 7c f2 69 7a f7 d0 76 fa eb 71 7c f2 68 79 f8 d8 76 fa ec 70 7c f3
66 79 f8 dc 75 fa ed 70 7b f4 64 79 f8 e0 74 fb ee 6f 7b f4 62 78 f8 e2 74 fb ef 6e 7b f4 60 78
f9 e4 74 fb f0 6d 7a f5 5c 78 f9 e6 73 fc f0 6c 7a f6 58 78 f9 e8 72 fc f1 6b 7a f6 50 77 fa e9
72 fc f2 6a 7a f6 00 76 fa ea 72 7c f2 69 7a f7 d0 76 fa eb 71 7c f2 68 79 f8 d8 76 fa ec 70 7c
"""
D_SCALE = "00 00 00 3b"
D_VALUES_SHA = "74f8980840bb85fea1f92e9fef25af8999aa290636c6b41f85cf303f37bf2653"
D_DECODED = [-0.75, -0.3125, 0.15625, 0.625, -0.4375, 0.0]
E_VALUES = """
f7 00 91 32 54 e6 00 00 bc ab 9a 09 10 21 32 43 0d 95 a5 b4 c4 c3 d2 d1 50 59 4a 4b 3c 2c 1d 0d
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 0e a6 c6 d5 e4 e2 60 6a 5c 4d 2e 0e a6 c6 d5 e4
"""
E_SCALES = "7f 80 70 75"
E_DECODED = [6, -6, 0, 0, 0.5, -0.5, 1, 1.5, 2, 3, 4, -4, 0, 0, 0, 0]
C_ROWS = {0: [0, 1, 2, 3, 0, 0.11, 0.22, 0.33], 5: [2.5, 3.5, 4.5, 5.5, 0.10, 0.21, 0.32, 0.43]}


# ----- vector helpers ---------------------------------------------------------------------------
def hx(text_or_bytes) -> bytes:
    return bytes.fromhex(text_or_bytes) if isinstance(text_or_bytes, str) else bytes(text_or_bytes)


def tensor(dtype: str, shape: list[int], raw: bytes) -> dict:
    return {"dtype": dtype, "shape": shape, "hex": raw.hex()}


def int64s(values) -> dict:
    return tensor("int64", [len(values)], struct.pack(f"<{len(values)}q", *values))


def row_spans(slot: int, page_size: int, page_stride: int, records: list[int]) -> list[tuple[int, int]]:
    """Absolute (offset, length) of each segment record of a slot (spec/upstream.md §2.1, §3.1, §4.1)."""
    page, row = divmod(slot, page_size)
    spans, seg_at = [], 0
    for rec in records:
        spans.append((page * page_stride + seg_at + row * rec, rec))
        seg_at += page_size * rec
    return spans


def cache_checks(slots, rows, page_size, page_stride, records):
    """(cache_bytes, written) entries: every written record's bytes at its absolute offset."""
    cache_bytes, written = [], []
    for slot, row in zip(slots, rows):
        if slot < 0:
            continue
        at = 0
        for off, n in row_spans(slot, page_size, page_stride, records):
            cache_bytes.append({"offset": off, "hex": row[at:at + n].hex()})
            written.append([off, n])
            at += n
    return cache_bytes, written


def vector(vid, source, description, fmt, params, inputs, slots, num_pages, page_stride,
           records, rows, decoded=None, **extra) -> dict:
    """A vector whose expected gathered rows are fully known (zero rows for slot < 0)."""
    page_size = params["page_size"]
    if page_stride is None:  # contiguous: the allocated page width (spec/upstream.md §1.3 padding rule)
        stride_bytes = page_size * sum(records)
        if fmt == "fp8_ds_mla":
            stride_bytes = -(-stride_bytes // records[0]) * records[0]
    else:
        stride_bytes = page_stride * (4 if fmt == "compressor_state" else 1)
    cache_bytes, written = cache_checks(slots, rows, page_size, stride_bytes, records)
    expected = {"rows": [r.hex() for r in rows], "cache_bytes": cache_bytes, "written": written}
    if decoded is not None:
        expected["decoded"] = decoded
    expected.update(extra)
    return {"id": vid, "source": source, "description": description, "format": fmt, "params": params,
            "op": "encode", "inputs": inputs, "slots": int64s(slots),
            "cache": {"num_pages": num_pages, "page_stride": page_stride, "sentinel": SENTINEL},
            "expected": expected}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decoded_entry(row: int, start: int, dtype: str, values) -> dict:
    raw = o.bf16_bytes(values) if dtype == "bfloat16" else o.f32_bytes(values)
    return {"row": row, "start": start, "dtype": dtype, "hex": raw.hex()}


# ----- spec/upstream.md §12 vectors ---------------------------------------------------------------
def kv_a() -> list[float]:
    kv = [(((37 * d) % 101) - 50) * 2.0 ** (d // 64 - 8) for d in range(512)]
    return [0.0 if 128 <= d < 192 else v for d, v in enumerate(kv)]


def ds_mla_input(kv, position, head_dim=512):
    x = [o.bf16(v) for v in o.rope_gptj(kv, position)]
    return {"x": tensor("bfloat16", [1, head_dim], o.bf16_bytes(x))}, x


def vectors_a() -> list[dict]:
    data, scales = hx(A_DATA.replace("\n", " ")), hx(A_SCALES)
    assert (sha(data), sha(scales)) == (A_DATA_SHA, A_SCALES_SHA), "A transcription"
    inputs, x = ds_mla_input(kv_a(), 5)
    row, dec = o.ds_mla_row(x, 512, 64)
    assert row == data + scales, "oracle disagrees with spec/upstream.md §12 A"
    assert dec[:16] == o.bf16_bytes(A_DECODED)
    params = {"head_dim": 512, "rope_dim": 64, "page_size": 64}
    sums = [{"row": 0, "start": 0, "stop": 576, "sha256": A_DATA_SHA},
            {"row": 0, "start": 576, "stop": 584, "sha256": A_SCALES_SHA}]
    offsets = [{"slot": 70, "page_stride": 37440, "region": "nope", "offset": 40896},
               {"slot": 70, "page_stride": 37440, "region": "scale", "offset": 74352}]
    a = vector("A", "spec/upstream.md §12 A", "fp8_ds_mla SWA row: x = bf16(rope_gptj(kv, position 5)); "
               "slot 70 of 64-row pages, stride 37440 -> data at 40896, scales at 74352",
               "fp8_ds_mla", params, inputs, [70], 2, 37440, [576, 8], [data + scales],
               [decoded_entry(0, 0, "bfloat16", A_DECODED)], sha256=sums, slot_offsets=offsets)
    hca = dict(params, page_size=2)
    a_hca = vector("A_hca", "spec/upstream.md §12 A (HCA offsets)", "the row of A in an HCA cache (2 rows "
                   "per page, page bytes 1728): slot 3 -> data at 2304, scales at 2888",
                   "fp8_ds_mla", hca, inputs, [3], 2, 1728, [576, 8], [data + scales],
                   slot_offsets=[{"slot": 3, "page_stride": 1728, "region": "nope", "offset": 2304},
                                 {"slot": 3, "page_stride": 1728, "region": "scale", "offset": 2888}])
    inputs2, x2 = ds_mla_input(kv_a(), 4)
    row2, _ = o.ds_mla_row(x2, 512, 64)
    assert sha(row2[:576]) == A2_DATA_SHA and row2[:448] == data[:448] and row2[576:] == scales
    a2 = vector("A2", "spec/upstream.md §12 A2", "A's kv as a compressed row completed at p = 7, ratio 4: "
                "rope position 4. Literal: SHA-256 of the data bytes; NoPE and scale bytes equal A's. "
                "Full row bytes from the independent oracle (matching that SHA-256).",
                "fp8_ds_mla", params, inputs2, [0], 1, 37440, [576, 8], [row2],
                sha256=[{"row": 0, "start": 0, "stop": 576, "sha256": A2_DATA_SHA}],
                spans=[{"row": 0, "start": 0, "hex": data[:448].hex()},
                       {"row": 0, "start": 576, "hex": scales.hex()}])
    return [a, a_hca, a2]


def vector_b() -> dict:
    x = [(((13 * d) % 29) - 14) * 0.125 * (64 if 64 <= d < 128 else 1) for d in range(192)]
    inputs, xr = ds_mla_input(x, 3, head_dim=192)
    row, _ = o.ds_mla_row(xr, 192, 64)
    spans = [{"row": 0, "start": s, "hex": hx(h).hex()} for s, h in B_SPANS]
    for s in spans:
        assert row[s["start"]:].startswith(bytes.fromhex(s["hex"])), "oracle disagrees with §12 B"
    return vector("B", "spec/upstream.md §12 B", "generic geometry head 192 / rope 64 (nope 128, token "
                  "record 256, scale record 3), rope position 3. Literal: scale bytes, first data "
                  "bytes, start of the rope bytes; full row from the independent oracle.",
                  "fp8_ds_mla", {"head_dim": 192, "rope_dim": 64, "page_size": 64}, inputs, [1], 1, None,
                  [256, 3], [row], spans=spans)


def vector_c() -> dict:
    positions = [0, 5]
    kv = [[0.5 * p + j for j in range(4)] for p in positions]
    score = [[o.f32(0.1 * ((3 * p + j) % 5)) for j in range(4)] for p in positions]
    ape = [[o.f32(0.01 * (10 * r + j)) for j in range(4)] for r in range(4)]
    rows = []
    for i, p in enumerate(positions):
        state = kv[i] + [o.f32(s + a) for s, a in zip(score[i], ape[p % 4])]
        assert all(abs(v - lit) < 1e-7 for v, lit in zip(state, C_ROWS[p])), "state row vs §12 C"
        rows.append(o.f32_bytes(state))
    flat = lambda m: o.f32_bytes([v for r in m for v in r])  # noqa: E731
    inputs = {"x": [tensor("float32", [2, 4], flat(kv)), tensor("float32", [2, 4], flat(score))],
              "positions": int64s(positions), "ape": tensor("float32", [4, 4], flat(ape))}
    decoded = [{"row": i, "start": 0, "dtype": "float32", "hex": r.hex()} for i, r in enumerate(rows)]
    return vector("C", "spec/upstream.md §12 C", "compressor state, ratio 4 (overlap), head_dim 2 -> W = 4; "
                  "ape in checkpoint order; state rows for p = 0 and p = 5 (score + ape[p % 4]). "
                  "The pooling numbers of §12 C belong to the compress op and are not covered here.",
                  "compressor_state", {"head_dim": 2, "ratio": 4, "page_size": 4}, inputs, positions, 2,
                  None, [32], rows, decoded)


def vector_d() -> dict:
    x = [(((29 * i) % 97) - 48) * 2.0 ** -6 for i in range(128)]
    values, scale = hx(D_VALUES.replace("\n", " ")), hx(D_SCALE)
    assert sha(values) == D_VALUES_SHA, "D transcription"
    row, _ = o.fp8_indexer_row(x)
    assert row == values + scale, "oracle disagrees with §12 D"
    return vector("D", "spec/upstream.md §12 D", "FP8 indexer row (bf16 input, amax 0.75 -> scale 2^-9); "
                  "slot 70 of 64-row pages of 8448 B -> values at 9216, scale at 16664",
                  "fp8_indexer", {"head_dim": 128, "page_size": 64},
                  {"x": tensor("bfloat16", [1, 128], o.bf16_bytes(x))}, [70], 2, 8448, [128, 4],
                  [values + scale], [decoded_entry(0, 0, "float32", D_DECODED)],
                  sha256=[{"row": 0, "start": 0, "stop": 128, "sha256": D_VALUES_SHA}],
                  slot_offsets=[{"slot": 70, "page_stride": 8448, "region": "values", "offset": 9216},
                                {"slot": 70, "page_stride": 8448, "region": "scale", "offset": 16664}])


def vector_e() -> dict:
    block0 = [6, -6, 0.25, -0.25, 0.75, -0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, 0.1, -0.1, 0, -0.0]
    block0 += [o.f32(-2 + 4 * i / 15) for i in range(16)]
    block1 = [((7 * i) % 15) - 7 for i in range(32)]
    block3 = [(((5 * i) % 11) - 5) * 2.0 ** -10 for i in range(32)]
    x = [o.bf16(v) for v in block0 + block1 + [0.0] * 32 + block3]
    values, scales = hx(E_VALUES.replace("\n", " ")), hx(E_SCALES)
    row, dec = o.mxfp4_row(x)
    assert row == values + scales, "oracle disagrees with §12 E"
    assert dec[:64] == o.f32_bytes(E_DECODED)
    return vector("E", "spec/upstream.md §12 E", "MXFP4 indexer row (bf16 input): scales 7f 80 70 75 "
                  "(DeepGEMM int32 0x7570807f); slot 67 in pages of stride 4480 (> 4352)",
                  "mxfp4_indexer", {"head_dim": 128, "page_size": 64},
                  {"x": tensor("bfloat16", [1, 128], o.bf16_bytes(x))}, [67], 2, 4480, [64, 4],
                  [values + scales], [decoded_entry(0, 0, "float32", E_DECODED)])


def build_all() -> dict[str, dict]:
    """Every vector, by file name."""
    import adversarial
    import vector_f
    import vector_v41

    vecs = [*vectors_a(), vector_b(), vector_c(), vector_d(), vector_e(), vector_f.build(vector, tensor, hx, int64s),
            *adversarial.build(vector), *vector_v41.build(vector, tensor)]
    return {f"{v['id']}.json": v for v in vecs}


def render(vec: dict) -> str:
    return json.dumps(vec, indent=2, sort_keys=True) + "\n"


def write_or_check(vectors: dict[str, dict], directory: Path, check: bool) -> int:
    """Write ``vectors`` (file name -> vector) into ``directory``, or with ``check`` list the stale ones."""
    stale = []
    for name, vec in vectors.items():
        path = directory / name
        text = render(vec)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    for name in stale:
        print(f"stale or missing: {directory / name}")
    return 1 if stale else 0


def main(argv: list[str]) -> int:
    return write_or_check(build_all(), HERE, "--check" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
