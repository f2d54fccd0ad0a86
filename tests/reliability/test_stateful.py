"""Stateful fuzzing of every registered format (a new format is covered the day it registers):
the reference backend, and the Triton launchers (compiled with CUDA, else under the
interpreter). Sizes: modest by default and under HYPOTHESIS_PROFILE=ci, larger with
``thorough``."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import kvformats as kvf
from tests.harness.codec_machine import make_codec_machine
from tests.harness.reliability_harness import backend_has, triton_available

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
# (max_examples, stateful_step_count) per backend; thorough: ~10x more.
SIZES = {
    "thorough": {"reference": (150, 40), "triton": (40, 30)},
}.get(PROFILE, {"reference": (25, 20), "triton": (10, 16)})


def machine_settings(backend: str) -> settings:
    examples, steps = SIZES[backend]
    return settings(settings.default, max_examples=examples, stateful_step_count=steps, deadline=None)


@pytest.mark.parametrize("fmt", kvf.list_formats())
def test_codec_machine_reference(fmt):
    run_state_machine_as_test(make_codec_machine(fmt, "reference"), settings=machine_settings("reference"))


WITH_KERNELS = [f for f in kvf.list_formats() if triton_available() and backend_has("triton", f, "encode")]


@pytest.mark.parametrize("fmt", WITH_KERNELS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflowing numpy products
def test_codec_machine_triton(fmt):
    run_state_machine_as_test(make_codec_machine(fmt, "triton"), settings=machine_settings("triton"))
