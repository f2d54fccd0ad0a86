"""docs/transfer.md's call pattern is examples/transfer_two_process.py as it is, and the script
runs: two processes on CPU move a request's pages with NIXL and verify them (the decode side
waiting in a plain blocking receive, as the page shows). The API reference page lists the
transfer API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvformats.transfer.engines import available

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "transfer_two_process.py"


def _code() -> str:
    text = SCRIPT.read_text(encoding="utf-8")
    return text[text.index('"""', 3) + 3:].lstrip("\n")  # after the module docstring


def test_the_page_shows_the_script():
    page = (ROOT / "docs" / "transfer.md").read_text(encoding="utf-8")
    block = page.split("## The call pattern", 1)[1].split("```python\n", 1)[1].split("```\n", 1)[0]
    assert block == _code()


def test_the_script_runs_on_cpu_with_nixl():
    if not available("nixl"):
        pytest.skip("the nixl engine is not installed here (pip install 'kvformats[nixl]')")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(SCRIPT), "nixl"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180, env=env)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "decode: 125376 bytes of 2 caches verified; pages [0, 4, 1] valid" in out.stdout
    assert "exit codes [0, 0]" in out.stdout


def test_the_reference_page_lists_the_transfer_api():
    import kvformats.transfer as transfer

    page = (ROOT / "docs" / "reference" / "transfer.md").read_text(encoding="utf-8")
    directives = set(re.findall(r"^::: (\S+)$", page, flags=re.M))
    for name in transfer.__all__:
        obj = getattr(transfer, name)
        assert f"{obj.__module__}.{name}" in directives, f"docs/reference/transfer.md lacks {name}"
    for name in ("endpoint.Endpoint", "engines.make_engine", "engines.base.Engine", "engines.nixl.NixlEngine",
                 "engines.mooncake.MooncakeEngine"):
        assert f"kvformats.transfer.{name}" in directives
    assert "      - Transfer API: reference/transfer.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
