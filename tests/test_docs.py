"""Docs: generated pages match the declarations, the site builds with warnings as errors, and
every registered format appears in spec/, the docs and the CLI."""

import subprocess
import sys
from pathlib import Path

import pytest

import kvformats as kvf
from kvformats.cli import build_parser
from kvformats.spec.docgen import check_docs
from kvformats.testing.capabilities import require

REPO = Path(__file__).resolve().parents[1]


def test_generated_docs_match_the_declarations():
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
