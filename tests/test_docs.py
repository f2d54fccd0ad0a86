"""Docs: generated pages match the declarations, the site builds with warnings as errors, and
every registered format appears in spec/, the docs and the CLI."""

import subprocess
import sys
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.cli import build_parser
from kvformats.spec.docgen import check_docs
from tests.harness.capabilities import require

REPO = Path(__file__).resolve().parents[1]


def test_generated_docs_match_the_declarations(published_only):
    assert check_docs(REPO, build_parser()) == []


@pytest.mark.parametrize("name", kvf.list_formats())
def test_every_format_is_in_spec_docs_and_cli(name, capsys):
    from kvformats.cli import main

    require(name, "published")
    assert (REPO / "spec" / "formats" / f"{name}.json").is_file()
    assert (REPO / "spec" / "formats" / f"{name}.md").is_file()
    assert (REPO / "docs" / "reference" / "formats" / f"{name}.md").is_file()
    assert (REPO / "docs" / "diagrams" / f"{name}.svg").is_file()
    assert f"reference/formats/{name}.md" in (REPO / "mkdocs.yml").read_text()
    assert main(["list"]) == 0
    assert name in capsys.readouterr().out.split()


def test_site_builds_strict(tmp_path):
    """The README's ``mkdocs build --strict`` (into tmp_path), at its default log level: ``-q``
    hid the warnings and with them strict mode's failure (griffe's docstring warnings)."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    warnings = [line for line in output.splitlines() if line.lstrip().startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "reference" / "formats" / "fp8_ds_mla" / "index.html").is_file()


def test_format_lists_are_generated_and_drift_names_the_command(tmp_path, published_only):
    """docs/index.md's table, mkdocs.yml's format nav and spec/README.md's list are regenerated
    between their marker lines from the registered formats (kvformats.spec.format_lists)."""
    from kvformats.spec.format_lists import MARKED, expected_lists

    for rel in MARKED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text())
    assert all(text == (REPO / rel).read_text() for rel, text in expected_lists(tmp_path).items())
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text().replace("| [fp8_indexer]", "| [fp8_indexer_old]"))
    nav = tmp_path / "mkdocs.yml"
    nav.write_text(nav.read_text().replace("# end of the generated formats", "# end"))
    got = expected_lists(tmp_path)
    assert got["mkdocs.yml"] is None and got["spec/README.md"] == (REPO / "spec" / "README.md").read_text()
    assert got["docs/index.md"] == (REPO / "docs" / "index.md").read_text()  # the stale row is rewritten
    problems = [p for p in check_docs(tmp_path, build_parser()) if not p.startswith(("docs/reference", "docs/diag",
                                                                                     "docs/conformance"))]
    assert problems == ["docs/index.md is stale (run: kvformats docs --write)",
                        "mkdocs.yml is missing or lacks the marker lines of its generated format list "
                        "(kvformats.spec.format_lists.MARKED)"]
    for name in kvf.list_formats():
        assert f"- {name}: reference/formats/{name}.md" in (REPO / "mkdocs.yml").read_text()
        assert f"| [{name}](reference/formats/{name}.md) | {kvf.get_format(name).row_bytes} B |" in \
            (REPO / "docs" / "index.md").read_text()
