"""Suite-wide settings: hypothesis profiles, and the Triton interpreter where there is no GPU.

TRITON_INTERPRET must be set before anything imports Triton (kernels bind to the interpreter
when their module is decorated, and torch.compile may import Triton early), so it is set here,
in the first conftest pytest loads, and only where CUDA is absent: on a GPU the same kernel
tests run compiled.
"""

import os
import textwrap
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KVFORMATS_STRICT_CALL_SITES", "1")  # kvformats_kernels.launch: no runtime argument by keyword

from kvformats.runtime import deferred  # noqa: E402  (after the interpreter choice)


def _add_extra_formats() -> None:
    """Register the formats named in ``KVFORMATS_EXTRA_FORMATS`` (``module:Class`` separated by
    commas) before any test module is collected, so every list of formats the suite
    parametrizes over includes them: how tests/test_new_format_suite.py runs the suite on a format
    declared outside the package."""
    import importlib

    from kvformats.codec import registry
    from kvformats.codec.slot_ops import register_reference_ops

    for spec in filter(None, os.environ.get("KVFORMATS_EXTRA_FORMATS", "").split(",")):
        module, _, cls_name = spec.strip().partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        registry.register_format(cls)
        register_reference_ops(cls.name)


_add_extra_formats()


settings.register_profile("default", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _clear_error_records():
    """Every test starts with clear error records (kvformats.runtime.deferred): a test that records a
    violation must not leave it for the next one to find."""
    for rec in deferred._RECORDS.values():
        rec.zero_()
    yield


@pytest.fixture
def device_mode(monkeypatch):
    """Run CPU tensors through the GPU's default check path: no host value checks, violations
    recorded in the device record (read it with kvformats.pending_error('cpu'))."""
    monkeypatch.setattr(deferred, "HOST_CHECKED", set())


@pytest.fixture
def routed(monkeypatch):
    """The default GPU check path for CPU tensors, and ``backend="triton"`` resolving to the
    Triton launchers whatever the device (after the public op validated its arguments), so that
    kernel tests run under the interpreter without CUDA; with CUDA nothing changes."""
    if not torch.cuda.is_available():
        from kvformats.codec import registry

        monkeypatch.setattr(deferred, "HOST_CHECKED", set())
        registry._load_kernels()  # the Triton launchers, read from the kernel package's table
        real = registry.resolve

        def resolve(fmt, op, backend, device):
            if backend == "triton":
                return registry._OPS[(fmt, op)]["triton"]
            return real(fmt, op, backend, device)

        monkeypatch.setattr(registry, "resolve", resolve)


@pytest.fixture
def published_only(monkeypatch):
    """The registry holding only the package's formats (kvformats.formats.FORMATS) for one test:
    for the tests of files committed for them (spec JSON, generated docs, the format lists),
    which a format registered from KVFORMATS_EXTRA_FORMATS has none of."""
    from kvformats.codec import registry
    from kvformats.formats import FORMATS

    monkeypatch.setattr(registry, "_FORMATS", {n: c for n, c in registry._FORMATS.items() if c in FORMATS})


@pytest.fixture
def launch_settings():
    """``change(table, key, value)``: a launch setting of kvformats_kernels for one test, through
    the settings' own function (which drops recorded replay plans); every table is restored after
    the test."""
    from kvformats_kernels import settings

    saved: dict = {}

    def change(name, key, value):
        saved.setdefault(name, settings.snapshot(name))
        settings.change(name, key, value)

    yield change
    for name, table in saved.items():
        settings.restore(name, table)


SKIP_REASONS_SHOWN = 8


def skip_reason(report) -> str:
    """A skipped test's reason, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """Skips as one short line per reason, most frequent first (pyproject's -rfE leaves skips
    out of the summary; -ra listed each test location with its full reason, ~200 columns)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter(skip_reason(r) for r in skipped)
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by reason")
    for reason, n in reasons.most_common(SKIP_REASONS_SHOWN):
        terminalreporter.write_line(f"{n:6}  {textwrap.shorten(reason, 88, placeholder=' ...')}")
    if len(reasons) > SKIP_REASONS_SHOWN:
        rest = sum(n for _, n in reasons.most_common()[SKIP_REASONS_SHOWN:])
        others = len(reasons) - SKIP_REASONS_SHOWN
        terminalreporter.write_line(f"{rest:6}  ({others} other reasons; pytest -rs lists them all)")
