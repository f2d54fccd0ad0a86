"""The library passes ruff with the rules pyproject.toml selects (pycodestyle, pyflakes, lines of at
most 120 columns): no unused import, undefined name or overlong line lands unseen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_library_passes_ruff():
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install -e '.[test]'")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "kvformats", "kvformats_kernels"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
