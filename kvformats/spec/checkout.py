"""Whether a directory is a kvformats source checkout: ``kvformats spec`` and ``kvformats docs``
read and write files of one (spec/formats, docs/), so elsewhere they refuse to run rather than
report every file missing or create them in a stranger's directory."""

from __future__ import annotations

import re
from pathlib import Path

NAME_LINE = re.compile(r"""^name\s*=\s*["']kvformats["']\s*$""", re.MULTILINE)


def is_checkout(root) -> bool:
    """True if ``root`` holds a ``spec/`` directory and a ``pyproject.toml`` naming kvformats."""
    root = Path(root)
    if not (root / "spec").is_dir():
        return False
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return NAME_LINE.search(text) is not None


def not_a_checkout(flag: str) -> str:
    """The one-line message of a spec/docs command run outside a checkout."""
    return f"not a kvformats checkout; run from the repository root or pass {flag}"
