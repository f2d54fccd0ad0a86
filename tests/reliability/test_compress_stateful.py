"""Stateful fuzzing of the compressor pipeline (save_compressor_state -> CSA/HCA compress
insert) on the reference backend and on the Triton kernels (compiled on CUDA, the interpreter
on CPU), the kernels' compressed rows held to the pooling bar (compress_machine)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from tests.harness.compress_machine import make_compress_machine
from tests.harness.reliability_harness import family_kernel, triton_available

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
EXAMPLES, STEPS = (120, 30) if PROFILE == "thorough" else (25, 15)


# The Triton variant where kernels for these ops are registered (Triton importable).
BACKENDS = ["reference"] + (["triton"] if all(family_kernel("deepseek_v4", op) for op in
                                              ("save_compressor_state", "compress_kv_insert")) else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_compress_pipeline_machine(backend):
    run_state_machine_as_test(make_compress_machine(backend), settings=settings(
        settings.default, max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None))


def test_the_triton_machine_runs_where_triton_imports():
    """The kernels' variant is not dropped silently: with Triton importable, the deepseek_v4
    launchers are found (from the kernel package's table, as the registry reads it)."""
    assert ("triton" in BACKENDS) == triton_available()
