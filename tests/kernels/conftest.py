"""Kernel tests run compiled on a GPU when one is present, else under the Triton interpreter.

TRITON_INTERPRET must be set before Triton is imported (kernels are bound to the interpreter
when their module is imported), so it is set here, before any test module imports the
kernels, and only where CUDA is absent.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
