"""Triton kernels of ``kvformats.deepseek_v4``, registered as its "triton" backend.

Each module exports ``OPS``: {operation name: implementation}. An implementation takes exactly
the arguments the reference implementation of that operation takes (already validated by the
public function) and never synchronises with the host.
"""

from kvformats.deepseek_v4 import FAMILY
from kvformats.registry import register_op
from kvformats_kernels.dsv4 import compress, indices, query, swa

MODULES = (compress, indices, query, swa)

for _module in MODULES:
    for _op, _fn in _module.OPS.items():
        register_op(FAMILY, _op, "triton")(_fn)
