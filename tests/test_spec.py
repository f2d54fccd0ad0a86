"""The machine-readable spec: committed JSON equals what the layouts derive, round trips, drift
detection, fingerprints, and the prose files every registered format must have."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.spec.formats import check_specs, fingerprint, format_spec, spec_digest, spec_text, write_specs
from tests.harness.capabilities import has, require

ROOT = Path(__file__).resolve().parents[1]
SPEC_DIR = ROOT / "spec" / "formats"
FORMATS = kvf.list_formats()
# A non-default value of one parameter per format, to show the fingerprint follows the layout.
OTHER_PARAMS = {"fp8_ds_mla": {"page_size": 2}, "fp8_indexer": {"head_dim": 256},
                "mxfp4_indexer": {"head_dim": 64}, "compressor_state": {"ratio": 128}}


def test_committed_specs_match_layouts(published_only):
    assert check_specs(SPEC_DIR) == []


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_has_json_and_prose(name):
    require(name, "published")
    assert (SPEC_DIR / f"{name}.json").is_file()
    prose = (SPEC_DIR / f"{name}.md").read_text()
    assert name in prose and "Error bound" in prose


@pytest.mark.parametrize("name", FORMATS)
def test_json_round_trip(name):
    text = spec_text(kvf.get_format(name))
    data = json.loads(text)
    assert json.dumps(data, indent=2, sort_keys=True) + "\n" == text
    assert data == json.loads(json.dumps(format_spec(kvf.get_format(name))))


@pytest.mark.parametrize("name", FORMATS)
def test_spec_fields_come_from_the_layout(name):
    layout = kvf.get_format(name)
    data = format_spec(layout)
    assert (data["name"], data["spec_version"], data["params"]) == (name, kvf.SPEC_VERSION, layout.params)
    assert (data["row_bytes"], data["page_bytes"], data["min_page_bytes"]) == \
        (layout.row_bytes, layout.page_bytes, layout.min_page_bytes)
    assert [r["name"] for r in data["regions"]] == [r.name for r in layout.regions]
    assert [(r["offset"], r["row_stride"], r["nbytes"]) for r in data["regions"]] == \
        [(r.offset, r.row_stride, r.nbytes) for r in layout.regions]
    assert sum(s["record_bytes"] for s in data["segments"]) == layout.row_bytes
    rule = getattr(layout, "scale_rule", None)
    assert data["numerics"]["scale_rule"] == (rule.as_dict() if rule is not None else None)


def test_known_numbers():
    """spec/upstream.md §1.2, §1.3: row/page bytes and quant blocks of the default layouts."""
    got = {n: format_spec(kvf.get_format(n)) for n in FORMATS}
    want = {"fp8_ds_mla": (584, 37440, 64, "float8_e4m3fn"), "fp8_indexer": (132, 8448, 128, "float8_e4m3fn"),
            "mxfp4_indexer": (68, 4352, 32, "float4_e2m1fn_x2")}
    for name, (row, page, block, element) in want.items():
        n = got[name]["numerics"]
        assert (got[name]["row_bytes"], got[name]["page_bytes"], n["quant_block"], n["element_type"]) == \
            (row, page, block, element)
    assert got["fp8_ds_mla"]["example_offsets"]["offsets"]["nope"] == 40896
    assert got["fp8_ds_mla"]["example_offsets"]["offsets"]["scale"] == 74352
    assert got["fp8_ds_mla"]["numerics"]["input_rounding"].startswith("bfloat16")
    assert got["fp8_indexer"]["numerics"]["input_rounding"].startswith("none")
    state = got["compressor_state"]
    assert (state["row_bytes"], state["page_bytes"], state["container_dtype"]) == (8192, 32768, "float32")
    assert state["numerics"]["quantized"] is False and state["numerics"]["scale_rule"] is None


@pytest.mark.parametrize("name", FORMATS)
def test_fingerprint_is_stable_and_follows_params(name):
    layout = kvf.get_format(name)
    assert fingerprint(layout) == fingerprint(kvf.get_format(name))
    if has(name, "published"):
        committed = (SPEC_DIR / f"{name}.json").read_bytes()
        assert spec_digest(layout) == hashlib.sha256(committed).hexdigest()
    other = OTHER_PARAMS.get(name, {"page_size": layout.page_size + 1})
    assert fingerprint(kvf.get_format(name, **other)) != fingerprint(layout)
    assert spec_digest(kvf.get_format(name, **other)) != spec_digest(layout)


def test_write_then_check_and_drift_reports(tmp_path):
    written = write_specs(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{n}.json" for n in FORMATS)
    assert check_specs(tmp_path) == []
    stale = tmp_path / f"{FORMATS[0]}.json"
    stale.write_text(stale.read_text().replace('"row_bytes"', '"row_bytes_"'))
    (tmp_path / f"{FORMATS[1]}.json").unlink()
    (tmp_path / "no_such_format.json").write_text("{}\n")
    problems = check_specs(tmp_path)
    assert len(problems) == 3
    assert any(p.startswith("stale") and FORMATS[0] in p for p in problems)
    assert any(p.startswith("missing") and FORMATS[1] in p for p in problems)
    assert any(p.startswith("extra") and "no_such_format" in p for p in problems)


def test_check_specs_on_missing_directory(tmp_path):
    problems = check_specs(tmp_path / "absent")
    assert len(problems) == len(FORMATS) and all(p.startswith("missing") for p in problems)


def test_readme_states_every_bound(published_only):
    readme = (ROOT / "spec" / "README.md").read_text()
    for name in kvf.list_formats():
        assert f"`{name}`" in readme
    for formula in ("max(|x_bf16|/16, 2^(e_b-10))", "2^e", "max(|x|/16, 2^(e-10))", "exact"):
        assert formula in readme
    for word in ("MUST", "MAY", "MUST NOT"):
        assert word in readme
