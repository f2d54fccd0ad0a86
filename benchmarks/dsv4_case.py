"""One benchmark case of a DeepSeek V4 operation, as the case modules (dsv4_cases_*.py) build
them and bench_dsv4_gpu.py times them."""

from __future__ import annotations

from typing import Callable

import attrs
import torch


@attrs.frozen
class Case:
    """``run_triton`` / ``run_reference``: one call of the op on prepared CUDA inputs (the same
    inputs every call, so a call may be replayed in a CUDA graph). ``min_bytes``: the fewest
    bytes the op must move (inputs read once, outputs written once), the basis of GB/s and of the
    % of copy bandwidth; ``how`` says how they were counted."""

    op: str
    label: str  # e.g. "prefill 131072 tokens" or "decode 64 rows"
    rows: int
    min_bytes: int
    how: str
    run_triton: Callable[[], object]
    run_reference: Callable[[], object]


def implementation(op: str, backend: str):
    """The registered ``backend`` implementation of ``deepseek_v4.op`` for CUDA tensors (called
    with prepared arguments, so the public functions' validation is not timed)."""
    from kvformats.codec import registry
    from kvformats.deepseek_v4 import FAMILY

    return registry.resolve_model_op(FAMILY, op, backend, torch.device("cuda"))


def registered_case(op: str, label: str, rows: int, min_bytes: int, how: str, args: tuple) -> Case:
    """A Case running the registered triton and reference implementations on ``args``."""
    tri, ref = implementation(op, "triton"), implementation(op, "reference")
    return Case(op=op, label=label, rows=rows, min_bytes=int(min_bytes), how=how,
                run_triton=lambda: tri(*args), run_reference=lambda: ref(*args))
