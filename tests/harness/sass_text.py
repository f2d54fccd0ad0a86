"""Read SASS text (``cuobjdump -sass``): its instructions, and the global loads that wait behind a
global store. No Triton needed (tools/compile_check.py produces the text)."""

from __future__ import annotations

import re

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", re.M)


def instructions(code: str) -> list[tuple[str, str]]:
    """(predicate or '', opcode) of each instruction, in text order."""
    return [(pred.strip(), op) for pred, op in _INSTRUCTION.findall(code)]


def late_loads(found: list[tuple[str, str]]) -> int:
    """Global loads (LDG) after a global store (STG) of the same stretch of SASS. A load cannot
    move above a store that may alias it, so in straight-line code each such load can cost a
    wait on memory after the store. A stretch ends at an unpredicated EXIT, RET or BRA: the code
    after one is reached from elsewhere (another branch of the kernel, whose stores do not precede
    it), so the count starts again there. In a loop, later iterations' loads also count."""
    late, stored = 0, False
    for pred, op in found:
        if op == "STG":
            stored = True
        elif op == "LDG" and stored:
            late += 1
        elif op in ("EXIT", "RET", "BRA") and not pred:
            stored = False
    return late
