"""docs/porting-from-tokenspeed.md's end-to-end example: the page shows examples/tokenspeed_port.py
as it is, and the script runs on CPU in a fresh interpreter and checks what it wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "tokenspeed_port.py"


def _code() -> str:
    text = SCRIPT.read_text()
    return text[text.index('"""', 3) + 3:].lstrip("\n")  # after the module docstring


def test_the_guide_shows_the_script():
    page = (ROOT / "docs" / "porting-from-tokenspeed.md").read_text()
    block = page.split("## End-to-end example", 1)[1].split("```python\n", 1)[1].split("```\n", 1)[0]
    assert block == _code()


def test_the_script_runs_on_cpu():
    out = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CSA rows written: [True, True, True, False]" in out.stdout
