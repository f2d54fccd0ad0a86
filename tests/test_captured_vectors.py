"""Vectors captured by running the engines' own code (spec/vectors/captured/<engine>/, written by
tools/capture/from_<engine>.py): kvformats' reference under the vector's profile reproduces every
one byte for byte (decoded values exactly, NaN positions equal). The tests read the committed
JSON only; no engine code is needed here.

A vector kvformats disagrees with stays, marked in DEPARTURES with the reason (strict: a vector
that starts passing must be moved out of the list)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.spec.vectors import load_vector, run_vector

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "spec" / "vectors" / "captured"
PATHS = sorted(DIR.glob("*/*.json"))

DEPARTURES = {
    "tokenspeed_fp8_indexer_loop_fp32": (
        "tokenspeed's per-token write_deepseek_v4_indexer_fp8_cache takes the scale in Python double "
        "(math.log2): at amax one float32 ulp above 448*2^k it picks 2^(k+1); its batch writer "
        "_write_deepseek_v4_indexer_fp8_cache_capturable (float32 torch.log2 rounds to k) and kvformats "
        "pick 2^k"),
    "deepgemm_mxfp4_indexer_fp32": (
        "DeepGEMM's ceil_to_ue8m0(amax / 6) rounds up on any mantissa bit of the float32 quotient: at "
        "amax one float32 ulp above 6*2^k it picks 2^(k+1); kvformats' deepgemm-ref takes "
        "2^ceil(log2(amax / 6)) in float32, where log2 rounds to k (bf16 inputs cannot reach the case)"),
    "deepgemm_mxfp4_decode_zero_scale": (
        "DeepGEMM's unpack_ue8m0_from_int shifts the byte into a float32 exponent field, so ue8m0 byte 0 "
        "reads as 0.0; kvformats reads 2^-127"),
    "deepgemm_mxfp4_decode_ff_scale": (
        "DeepGEMM's unpack_ue8m0_from_int reads ue8m0 byte 0xFF as +Inf (0x7F800000); kvformats reads NaN"),
    "tokenspeed_fp8_ds_mla_read_triton_bytes": (
        "tokenspeed's Triton deepseek_v4_dequantize_and_gather_k_cache computes the scale with tl.exp2, "
        "which the GPU evaluates with a flush to zero: scale byte 0x00 (2^-127, a float32 subnormal) reads "
        "as 0, so those blocks decode to zeros; kvformats' tokenspeed profile reads 2^-127 exactly, as "
        "tokenspeed's torch reader does (spec/nan-policy.md §5). Every differing block of the capture has "
        "scale byte 0x00"),
    "deepgemm_mxfp4_decode_negative_zero": (
        "DeepGEMM's _dequantize_from_fp4_e2m1 decodes nibble 0x8 (e2m1 -0) as +0.0; kvformats as -0.0"),
}


def _failures(vec) -> list[str]:
    return [f"{c.name}: got {c.actual[:96]} want {c.expected[:96]}" for c in run_vector(vec) if not c.ok]


def _param(path: Path):
    vid = path.stem
    marks = [pytest.mark.xfail(strict=True, reason=DEPARTURES[vid])] if vid in DEPARTURES else []
    return pytest.param(path, id=f"{path.parent.name}/{vid}", marks=marks)


@pytest.mark.parametrize("path", [_param(p) for p in PATHS])
def test_captured_vector_reproduced(path):
    vec = load_vector(path)
    assert vec["format"] in kvf.list_formats()
    assert _failures(vec) == []


def test_captured_vectors_are_well_formed():
    assert {p.parent.name for p in PATHS} >= {"flashmla", "deepgemm", "tokenspeed"}
    for p in PATHS:
        vec = load_vector(p)
        assert vec["id"] == p.stem and vec["op"] in ("encode", "decode"), p
        cap = vec["captured"]
        for key in ("repo", "commit", "file", "function", "url", "blob", "device", "command"):
            assert cap[key], (p, key)
        # the provenance names the public upstream file at its commit, never a path of this machine
        assert cap["url"] == f"https://github.com/{cap['repo']}/blob/{cap['commit']}/{cap['file']}"
        assert cap["command"].startswith(f"python3 tools/capture/from_{p.parent.name}.py")
        text = p.read_text()
        # no absolute path of the machine that captured it: neither this checkout, nor a home
        # folder, nor any argument of the recorded command
        assert str(ROOT) not in text and str(Path.home()) not in text, p
        assert not any(arg.startswith("/") for arg in cap["command"].split()), p
        assert "shared/" not in cap["command"], p
        assert "profile" in vec["params"], p


def test_departures_name_existing_vectors():
    assert set(DEPARTURES) <= {p.stem for p in PATHS}


def test_nan_any_still_catches_a_changed_value():
    """"nan": "any" relaxes NaN bits only: a changed finite element must still fail."""
    vec = copy.deepcopy(load_vector(DIR / "flashmla" / "flashmla_model1_decode_bytes.json"))
    d = vec["expected"]["decoded"][0]
    raw = bytearray.fromhex(d["hex"])
    i = next(j for j in range(0, len(raw), 2) if raw[j + 1] & 0x7F not in (0x7F, 0x00))  # a finite non-zero
    raw[i + 1] ^= 0x80  # flip its sign
    d["hex"] = raw.hex()
    assert any("decoded row 0" in f for f in _failures(vec))


def test_decode_vectors_check_nan_positions():
    vec = copy.deepcopy(load_vector(DIR / "flashmla" / "flashmla_model1_decode_bytes.json"))
    d = next(e for e in vec["expected"]["decoded"] if "c07f" in e["hex"] or "ffff" in e["hex"] or "7fc0" in e["hex"])
    raw = bytearray.fromhex(d["hex"])
    nan_at = next(j for j in range(0, len(raw), 2) if raw[j + 1] & 0x7F == 0x7F and raw[j] & 0x80)
    raw[nan_at:nan_at + 2] = b"\x00\x00"  # a NaN the engine produced, replaced by 0.0
    d["hex"] = raw.hex()
    assert any(f"decoded row {d['row']}" in f for f in _failures(vec))


def test_capture_scripts_are_independent_of_kvformats():
    """A captured vector must come from the engine alone: the scripts never import kvformats."""
    scripts = sorted((ROOT / "tools" / "capture").glob("*.py"))
    assert {p.name for p in scripts} >= {"common.py", "from_flashmla.py", "from_deepgemm.py", "from_tokenspeed.py",
                                         "from_vllm.py"}
    for p in scripts:
        source = p.read_text()
        assert "import kvformats" not in source and "from kvformats" not in source, p.name
