"""Golden vectors: every file in spec/vectors reproduced byte for byte through the public API
(encode into a sentinel-filled cache, gather, decode), plus guards on the vector set itself."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.spec.vectors import load_vector, run_vector, vector_paths

ROOT = Path(__file__).resolve().parents[1]
VECTOR_DIR = ROOT / "spec" / "vectors"
PATHS = vector_paths(VECTOR_DIR)
# SHA-256 values printed in spec/upstream.md §12, repeated here so a regenerated vector cannot move them.
LITERAL_SHA = {
    ("A", 0, 576): "8075d1de2b83808191639b525156199e17469a88dfd20372d006a03848471c97",
    ("A", 576, 584): "e2ef21ffc4ee0e5a6a4fe466bc32a8a579789ef8fcc4e30d7549c1a0c1cfdb77",
    ("A2", 0, 576): "1da877a83acfdbc87f784dcda4e054fb7ea4afb92eeeee8dfe3cdce6ca8883e5",
    ("D", 0, 128): "74f8980840bb85fea1f92e9fef25af8999aa290636c6b41f85cf303f37bf2653",
}


def _failures(vec) -> list[str]:
    return [f"{c.name}: got {c.actual[:96]} want {c.expected[:96]}" for c in run_vector(vec) if not c.ok]


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_vector_reproduced(path):
    vec = load_vector(path)
    assert vec["format"] in kvf.list_formats()
    assert _failures(vec) == []


def test_vector_set_covers_formats_md_examples_and_every_format():
    vecs = [load_vector(p) for p in PATHS]
    ids = {v["id"] for v in vecs}
    assert {"A", "A2", "B", "C", "D", "E", "F"} <= ids
    adversarial = {v["format"] for v in vecs if v["id"].startswith("adv_")}
    assert {"fp8_ds_mla", "fp8_indexer", "mxfp4_indexer"} <= adversarial
    assert {"fp8_ds_mla", "fp8_indexer", "mxfp4_indexer", "compressor_state"} <= {v["format"] for v in vecs}
    for v in vecs:
        assert v["source"] and v["description"] and v["op"] == "encode", v["id"]
        assert (VECTOR_DIR / f"{v['id']}.json").is_file()


@pytest.mark.parametrize("key", sorted(LITERAL_SHA), ids=lambda k: f"{k[0]}[{k[1]}:{k[2]}]")
def test_literal_sha256_of_encoded_bytes(key):
    """The SHA-256 values of spec/upstream.md §12, asserted on freshly encoded rows (A2 is given only as
    a digest, so this is its one literal check)."""
    vid, start, stop = key
    vec = load_vector(VECTOR_DIR / f"{vid}.json")
    entry = next(s for s in vec["expected"]["sha256"] if (s["start"], s["stop"]) == (start, stop))
    assert entry["sha256"] == LITERAL_SHA[key]
    assert hashlib.sha256(bytes.fromhex(vec["expected"]["rows"][0])[start:stop]).hexdigest() == LITERAL_SHA[key]
    checks = {c.name: c for c in run_vector(vec)}
    check = checks[f"sha256 of row 0 bytes [{start}:{stop}]"]
    assert check.actual == LITERAL_SHA[key]


def test_a_and_d_addresses_match_formats_md():
    """Slot 70: fp8_ds_mla data at 40896 / scales at 74352, FP8 indexer values 9216 / scale 16664;
    HCA slot 3: 2304 / 2888 (spec/upstream.md §2.1, §12)."""
    want = {"A": {40896: 576, 74352: 8}, "A_hca": {2304: 576, 2888: 8}, "D": {9216: 128, 16664: 4}}
    for vid, spans in want.items():
        vec = load_vector(VECTOR_DIR / f"{vid}.json")
        got = {c["offset"]: len(c["hex"]) // 2 for c in vec["expected"]["cache_bytes"]}
        assert got == spans


def test_harness_detects_a_wrong_byte():
    vec = copy.deepcopy(load_vector(VECTOR_DIR / "A.json"))
    row = bytearray.fromhex(vec["expected"]["rows"][0])
    row[0] ^= 1  # -384 (fc) would become fd: a one-ulp slip must not pass
    vec["expected"]["rows"][0] = row.hex()
    assert any("gathered row 0" in f for f in _failures(vec))


def test_harness_detects_a_write_outside_the_row():
    vec = copy.deepcopy(load_vector(VECTOR_DIR / "D.json"))
    vec["expected"]["written"] = vec["expected"]["written"][:1]  # pretend the scale was not ours
    assert any("outside the written rows" in f for f in _failures(vec))


def _generator():
    spec = importlib.util.spec_from_file_location("kvf_vector_generate", VECTOR_DIR / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_vectors_match_the_generator():
    gen = _generator()
    built = gen.build_all()
    assert sorted(built) == sorted(p.name for p in PATHS)
    for name, vec in built.items():
        assert gen.render(vec) == (VECTOR_DIR / name).read_text(), f"{name} is stale: run spec/vectors/generate.py"


def test_generator_is_independent_of_kvformats():
    for name in ("generate.py", "oracle.py", "adversarial.py", "vector_f.py", "vector_v41.py"):
        source = (VECTOR_DIR / name).read_text()
        assert "import kvformats" not in source and "from kvformats" not in source, name
