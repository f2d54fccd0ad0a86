"""Triton kernels of ``kvformats.deepseek_v4``, read by the registry as its "triton" backend.

Each launcher module of this package exports ``LAUNCHERS``: {operation name: implementation};
``LAUNCHERS`` here joins those of every module found in the package (the ``*_jit`` modules hold
the kernels themselves), so a new op's kernel module is picked up without a list to edit. An
implementation takes exactly the arguments the reference implementation of that operation
takes (already validated by the public function) and never synchronises with the host.
"""

import importlib
import pkgutil

from kvformats.dsv4_constants import FAMILY

MODULES = tuple(importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
                if not info.name.endswith("_jit"))
LAUNCHERS = {op: fn for module in MODULES for op, fn in getattr(module, "LAUNCHERS", {}).items()}

__all__ = ["FAMILY", "LAUNCHERS", "MODULES"]
