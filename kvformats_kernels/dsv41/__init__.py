"""Triton kernels of ``kvformats.deepseek_v41``, read by the registry as its "triton" backend.

Each module exports ``LAUNCHERS``: {operation name: implementation}; ``LAUNCHERS`` here joins
them. An implementation takes exactly the arguments the reference implementation of that
operation takes (already validated by the public function) and never synchronises with the host.
"""

from kvformats.dsv41_constants import FAMILY
from kvformats_kernels.dsv41 import compressor, rows

MODULES = (compressor, rows)
LAUNCHERS = {op: fn for module in MODULES for op, fn in module.LAUNCHERS.items()}

__all__ = ["FAMILY", "LAUNCHERS", "MODULES"]
