"""The worked offset examples in spec/formats/<name>.md (and their docs copies) are generated from
the layout declaration (kvformats.spec.examples): current, and drift is reported and repaired."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.spec.examples import BEGIN, END, check_examples, write_examples
from kvformats.spec.formats import check_specs
from tests.harness.capabilities import require

ROOT = Path(__file__).resolve().parents[1]
SPEC_DIR = ROOT / "spec" / "formats"


def test_committed_examples_are_current():
    assert check_examples(SPEC_DIR) == []


@pytest.mark.parametrize("name", kvf.list_formats())
def test_prose_and_docs_state_the_declared_slot_offsets(name):
    """Issue 35 item 14: the V4.1 page once said scale 66368 where the layout says 66656."""
    require(name, "published")
    layout = kvf.get_format(name)
    row = "| " + " | ".join(str(v) for v in layout.slot_offsets(70).values()) + " |"
    for path in (SPEC_DIR / f"{name}.md", ROOT / "docs" / "reference" / "formats" / f"{name}.md"):
        assert row in path.read_text(), path
    assert "66368" not in (SPEC_DIR / "fp8_ds_mla_v41.md").read_text()


def test_a_stale_example_is_reported_and_rewritten(tmp_path):
    shutil.copy(SPEC_DIR / "fp8_ds_mla_v41.md", tmp_path / "fp8_ds_mla_v41.md")
    page = tmp_path / "fp8_ds_mla_v41.md"
    page.write_text(page.read_text().replace("66656", "66368"))
    assert [p for p in check_examples(tmp_path) if "stale worked example" in p and "fp8_ds_mla_v41" in p]
    assert any("stale worked example" in p for p in check_specs(tmp_path))
    assert write_examples(tmp_path) == [page]
    assert check_examples(tmp_path) == [] and "66656" in page.read_text()


def test_prose_without_markers_is_reported(tmp_path):
    text = (SPEC_DIR / "fp8_indexer.md").read_text()
    (tmp_path / "fp8_indexer.md").write_text(text.replace(BEGIN, "").replace(END, ""))
    assert [p for p in check_examples(tmp_path) if "no generated worked example" in p]


def test_spec_write_adds_the_marker_lines_a_new_prose_lacks(tmp_path):
    """A new format's prose has no markers yet: ``spec --write`` appends a worked-example section
    with them and fills its table, after which the check passes and a second write changes nothing."""
    page = tmp_path / "fp8_indexer.md"
    page.write_text("# `fp8_indexer`\n\nProse without a worked example.\n")
    assert write_examples(tmp_path) == [page]
    text = page.read_text()
    assert text.startswith("# `fp8_indexer`\n\nProse without a worked example.\n\n## Worked example")
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "| parameters | slot |" in text
    assert check_examples(tmp_path) == [] and write_examples(tmp_path) == []
