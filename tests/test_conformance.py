"""The conformance matrix (docs/conformance.md, kvformats.spec.conformance): one row per (format,
profile), one column per engine, every cell "byte-equal on N vectors", "departs (...)" or
"not captured (why)", computed from the committed golden and captured vectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvformats.numerics.profiles import profile_tables
from kvformats.spec import conformance

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    return conformance.conformance_rows(ROOT)


@pytest.fixture(scope="module")
def page():
    return conformance.conformance_page(ROOT)


def _cell(rows, fmt, profile, engine):
    return next(r["cells"][engine] for r in rows if (r["format"], r["profile"]) == (fmt, profile))


def test_one_row_per_profile_one_column_per_engine(rows):
    assert [(r["format"], r["profile"]) for r in rows] == [(f, p) for f, t in profile_tables().items()
                                                           for p in t.names]
    captured = {p.parent.name for p in (ROOT / "spec" / "vectors" / "captured").glob("*/*.json")}
    assert captured <= set(conformance.ENGINES)
    for r in rows:
        assert set(r["cells"]) == set(conformance.ENGINES)
        for engine, c in r["cells"].items():
            assert c["status"] in ("equal", "departs", "not captured"), (r["format"], r["profile"], engine, c)
            if c["status"] == "not captured":
                assert c["why"] and not c["equal"] and not c["departs"]
            else:
                assert c["text"].startswith(("byte-equal on", "departs on"))


def test_every_captured_vector_is_counted_under_its_own_profile(rows):
    """A captured vector either reproduces under the profile it was captured for or is a declared
    departure; no cell is FAILING."""
    for vec in conformance.captured_vectors(ROOT):
        c = _cell(rows, vec["format"], conformance._profile(vec), vec["_engine"])
        if vec["id"] in conformance.DEPARTURES:
            assert vec["id"] in c["departs"] and f"`{vec['id']}`" in c["text"]
        else:
            assert vec["id"] in c["equal"], (vec["id"], c["text"])


@pytest.mark.parametrize("fmt, profile, engine, n", [
    ("fp8_ds_mla_v41", "tokenspeed", "tokenspeed", 2),         # swa: cache_scatter, swa_rope_scatter
    ("fp4_ds_mla_v41", "tokenspeed", "tokenspeed", 1),
    ("fp4_ds_mla_v41", "flashmla", "tokenspeed", 1),           # same bytes on finite input
    ("fp8_ds_mla_v41_interleaved", "vllm", "vllm", 2),
    ("fp8_ds_mla_v41_interleaved", "tokenspeed", "vllm", 2),   # vllm's and tokenspeed's rules agree
    ("fp4_ds_mla_v41_interleaved", "vllm", "vllm", 1),
    ("fp4_ds_mla_v41_interleaved", "flashmla", "vllm", 1),
    ("fp8_ds_mla_v41", "flashmla", "sglang", 1),
    ("fp4_ds_mla_v41", "flashmla", "sglang", 1),
])
def test_v41_release_writers_are_byte_equal(rows, fmt, profile, engine, n):
    c = _cell(rows, fmt, profile, engine)
    assert c["status"] == "equal" and c["text"] == f"byte-equal on {n} vector{'s' if n > 1 else ''}", c


@pytest.mark.parametrize("fmt, profile, engine", [
    ("fp8_ds_mla_v41", "flashmla", "tokenspeed"),           # amax floor 1e-4 vs scale floor 1e-4
    ("fp8_ds_mla_v41_interleaved", "flashmla", "vllm"),
    ("fp8_ds_mla_v41", "tokenspeed", "sglang"),
])
def test_v41_floor_rules_depart(rows, fmt, profile, engine):
    c = _cell(rows, fmt, profile, engine)
    assert c["status"] == "departs" and not c["equal"] and "captured for profile" in c["text"], c


def test_not_captured_cells_give_a_reason(rows, page):
    c = _cell(rows, "fp8_ds_mla_v41_interleaved", "vllm", "tokenspeed")
    assert c["status"] == "not captured" and "page-planar" in c["why"]
    for r in rows:
        for engine, c in r["cells"].items():
            if c["status"] == "not captured":
                assert c["why"] in page
    assert "## Why not captured" in page and "## Declared departures" in page


def test_page_lists_every_captured_vector_and_departure(page):
    for vec in conformance.captured_vectors(ROOT):
        assert f"`{vec['id']}`" in page
        assert conformance.source_of(vec) in page
    for vid in conformance.DEPARTURES:
        assert f"- `{vid}`:" in page


def test_committed_page_is_current(page, published_only):
    """docs/conformance.md is what ``python -m kvformats docs --write`` writes now (``--check``
    reports it stale otherwise)."""
    assert (ROOT / "docs" / conformance.PAGE).read_text() == page
