"""Install instructions and packaging metadata (issue 35 items 15, 17, 19): what the README's
install command brings, the extras, the license and the pytest options."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_readme_says_what_the_install_command_brings():
    """PyPI's torch on Linux is the CUDA build: the README must not promise the CPU build, and
    must say how to get it."""
    for page in (ROOT / "README.md", ROOT / "docs" / "tutorial.md"):
        text = page.read_text()
        assert "CPU build of torch" not in text, page
        assert CPU_INDEX in text and "CUDA" in text, page
