"""Triton kernels of ``kvformats.deepseek_v4``, read by the registry as its "triton" backend.

Each module exports ``OPS``: {operation name: implementation}; ``OPS`` here joins them. An
implementation takes exactly the arguments the reference implementation of that operation
takes (already validated by the public function) and never synchronises with the host.
"""

from kvformats.dsv4_constants import FAMILY
from kvformats_kernels.dsv4 import compress, indices, query, swa

MODULES = (compress, indices, query, swa)
OPS = {op: fn for module in MODULES for op, fn in module.OPS.items()}

__all__ = ["FAMILY", "MODULES", "OPS"]
