"""Triton kernels of ``kvformats.deepseek_v41``, read by the registry as its "triton" backend.

Each module of this package exports ``LAUNCHERS``: {operation name: implementation}; ``LAUNCHERS``
here joins those of every module found in the package (as ``kvformats_kernels.dsv4`` does), so a
new op's kernel module is picked up without a list to edit. An implementation takes exactly the
arguments the reference implementation of that operation takes (already validated by the public
function) and never synchronises with the host.
"""

import importlib
import pkgutil

from kvformats.dsv41_constants import FAMILY

MODULES = tuple(importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
                if not info.name.endswith("_jit"))
LAUNCHERS = {op: fn for module in MODULES for op, fn in getattr(module, "LAUNCHERS", {}).items()}

__all__ = ["FAMILY", "LAUNCHERS", "MODULES"]
