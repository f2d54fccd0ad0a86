"""Suite-wide settings: hypothesis profiles, and the Triton interpreter where there is no GPU.

TRITON_INTERPRET must be set before anything imports Triton (kernels bind to the interpreter
when their module is decorated, and torch.compile may import Triton early), so it is set here,
in the first conftest pytest loads, and only where CUDA is absent: on a GPU the same kernel
tests run compiled.
"""

import os

import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


settings.register_profile("default", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
