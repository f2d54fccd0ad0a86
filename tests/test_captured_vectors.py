"""Vectors captured by running the engines' own code (spec/vectors/captured/<engine>/, written by
tools/capture/from_<engine>.py from a source checkout, or tools/capture/from_<engine>_release.py
from a released wheel): kvformats' reference under the vector's profile reproduces every one byte
for byte (decoded values exactly, NaN positions equal). The tests read the committed JSON only; no
engine code is needed here (tests/interop/test_released_writers.py re-runs the released writers).

A vector kvformats disagrees with stays, declared in ``kvformats.spec.conformance.DEPARTURES``
with the reason (docs/conformance.md lists them; strict: a vector that starts passing must be
moved out of the list).

e4m3 NaN codes: an engine may write 0x7F or 0xFF for a NaN (spec/nan-policy.md §1.3), so the
bytes of float8_e4m3fn data regions compare with the two codes equal (``run_vector(...,
nan_codes_equal=True)``); scales and every other byte stay exact."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.spec import conformance
from kvformats.spec.vectors import E4M3_NAN_CODES, load_vector, run_vector

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "spec" / "vectors" / "captured"
PATHS = sorted(DIR.glob("*/*.json"))

DEPARTURES = conformance.DEPARTURES


def _failures(vec) -> list[str]:
    return [f"{c.name}: got {c.actual[:96]} want {c.expected[:96]}"
            for c in run_vector(vec, nan_codes_equal=True) if not c.ok]


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
        if "package" in cap:  # code from a released wheel: the wheel and the file, both by sha256
            for key in ("package", "version", "wheel", "wheel_sha256", "file", "sha256", "function", "url", "device",
                        "command"):
                assert cap[key], (p, key)
            assert cap["url"] == f"https://pypi.org/project/{cap['package']}/{cap['version']}/"
            assert cap["wheel"].startswith(f"{cap['package'].replace('-', '_')}-{cap['version']}-"), p
            assert len(cap["sha256"]) == len(cap["wheel_sha256"]) == 64, p
            script = re.escape(f"from_{p.parent.name}_release.py")
        else:  # a source checkout: the public upstream file at its commit, never a path of this machine
            for key in ("repo", "commit", "file", "function", "url", "blob", "device", "command"):
                assert cap[key], (p, key)
            assert cap["url"] == f"https://github.com/{cap['repo']}/blob/{cap['commit']}/{cap['file']}"
            # from_<engine>.py or from_<engine>_<anything>.py (e.g. from_flashmla_v41.py)
            script = re.escape(f"from_{p.parent.name}") + r"(_[A-Za-z0-9_]+)?\.py"
        m = re.match(rf"python3 tools/capture/({script})(\s|$)", cap["command"])
        assert m, (p, cap["command"])
        assert (ROOT / "tools" / "capture" / m.group(1)).is_file(), (p, m.group(1))
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
                                         "from_vllm.py", "from_tokenspeed_release.py", "from_vllm_release.py",
                                         "from_sglang_release.py", "from_flashmla_v41.py"}
    harness = ROOT / "tests" / "harness" / "released.py"  # the release scripts run the writers through it
    for p in [*scripts, harness]:
        source = p.read_text()
        assert "import kvformats" not in source and "from kvformats" not in source, p.name


FP8_V41 = DIR / "flashmla" / "flashmla_fork_v41_fp8_encode.json"


def _with_cache_byte(vec: dict, offset: int, value: int) -> dict:
    """``vec`` with byte ``offset`` of its expected cache_bytes set to ``value``."""
    vec = copy.deepcopy(vec)
    entry = vec["expected"]["cache_bytes"][0]
    raw = bytearray.fromhex(entry["hex"])
    raw[offset - entry["offset"]] = value
    entry["hex"] = raw.hex()
    return vec


def test_captured_fp8_v41_writes_the_other_e4m3_nan_code():
    """FlashMLA's V4.1 writer puts 0xFF in NaN tiles where kvformats writes 0x7F: equal only with
    nan_codes_equal (spec/nan-policy.md §1.3)."""
    vec = load_vector(FP8_V41)
    assert [c.name for c in run_vector(vec) if not c.ok] == ["cache bytes [0:33792]"]
    assert _failures(vec) == []


def test_nan_codes_equal_is_only_the_two_codes_in_e4m3_data():
    """0x7F == 0xFF in the e4m3 values region, and nothing else: another byte there, or the
    ue8m0 scale bytes, still fail."""
    vec = load_vector(FP8_V41)
    layout = kvf.get_format(vec["format"], **vec["params"])
    values, scale = layout.region("values"), layout.region("scale")
    assert values.dtype == "float8_e4m3fn" and scale.dtype != "float8_e4m3fn"
    raw = bytes.fromhex(vec["expected"]["cache_bytes"][0]["hex"])
    nan_at = next(i for i in range(values.offset, values.offset + values.page_nbytes) if raw[i] in E4M3_NAN_CODES)
    other = E4M3_NAN_CODES[1] if raw[nan_at] == E4M3_NAN_CODES[0] else E4M3_NAN_CODES[0]
    assert _failures(_with_cache_byte(vec, nan_at, other)) == []  # the other NaN code: equal
    assert _failures(_with_cache_byte(vec, nan_at, 0x7E)) != []  # a finite code: not
    finite_at = next(i for i in range(values.offset, values.offset + values.page_nbytes)
                     if raw[i] not in E4M3_NAN_CODES and raw[i] & 0x7F)
    assert _failures(_with_cache_byte(vec, finite_at, raw[finite_at] ^ 0x80)) != []  # a sign flip: not
    assert _failures(_with_cache_byte(vec, finite_at, 0xFF)) != []  # a finite value read as NaN: not
    s_at = scale.offset
    assert _failures(_with_cache_byte(vec, s_at, 0xFF if raw[s_at] == 0x7F else 0x7F)) != []  # scales: exact


def test_nan_codes_equal_leaves_e4m3_scales_exact():
    """fp4_ds_mla_v41 stores its scales as e4m3: those bytes stay exact (only e4m3 data relaxes)."""
    vec = load_vector(DIR / "flashmla" / "flashmla_fork_v41_fp4_encode.json")
    layout = kvf.get_format(vec["format"], **vec["params"])
    scale = layout.region("scale")
    assert scale.dtype == "float8_e4m3fn" and scale.role == "scale"
    raw = bytes.fromhex(vec["expected"]["cache_bytes"][0]["hex"])
    at = next((i for i in range(scale.offset, scale.offset + scale.page_nbytes) if raw[i] in E4M3_NAN_CODES),
              scale.offset)
    assert _failures(_with_cache_byte(vec, at, 0xFF if raw[at] == 0x7F else 0x7F)) != []
