"""The tuning tables (kvformats_kernels.tuning) are keyed by the kernel module and the op it
launches: every key names a module of kvformats_kernels and an op of it, every launch reads a key
the tables hold, from the module the key names, and every key is read by some launch (a key
nobody reads fails here). The launches run through the stand-in launcher (nothing executes), so
this is cheap on a machine without a GPU."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kvformats.runtime import replay  # noqa: E402
from kvformats_kernels import _common as cm  # noqa: E402
from kvformats_kernels import tuning  # noqa: E402
from tests.harness.calls import public_calls  # noqa: E402
from tests.harness.launch_stub import stubbed_launches  # noqa: E402

TABLES = {"config": tuning.CONFIG, "small": tuning.SMALL, "few": tuning.FEW}


def _ops_of(module) -> set[str]:
    """The public functions of a kernel module (the ops it launches)."""
    return {name for name, fn in vars(module).items() if inspect.isfunction(fn) and not name.startswith("_")}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_key_names_a_kernel_module_and_its_op(table):
    for module_name, op in TABLES[table]:
        module = importlib.import_module(f"{tuning.PACKAGE}.{module_name}")
        ops = _ops_of(module)
        # the op itself, or one of its variants (indexer's encode_mxfp4: the MXFP4 encode)
        assert op in ops or any(op.startswith(f"{fn}_") for fn in ops), \
            f"{table}: ({module_name!r}, {op!r}) names no op of {module.__name__} (its ops: {sorted(ops)})"
    assert set(TABLES[table]) <= set(tuning.CONFIG), f"{table} overrides keys CONFIG lacks"


def test_only_the_plumbing_reads_the_tables():
    """The launchers read their configuration through ``_common.config`` (which the test below
    watches), never the tables directly."""
    root = Path(tuning.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if path.name in ("tuning.py", "_common.py"):
            continue
        text = path.read_text(encoding="utf-8")
        for name in ("CONFIG", "SMALL", "FEW", "BOUNDS"):
            assert f"tuning.{name}" not in text, f"{path.relative_to(root)} reads tuning.{name} directly"


@pytest.mark.parametrize("rows", [4, 600], ids=["few-rows", "many-rows"])
def test_every_launch_reads_an_existing_key_and_every_key_is_read(rows, monkeypatch):
    read: dict[tuple[str, str], set[str]] = {}
    real = cm.config

    def config(module, op, n=None):
        caller = sys._getframe(1).f_globals["__name__"]
        read.setdefault((module, op), set()).add(caller)
        assert (module, op) in tuning.CONFIG, f"{caller} launches with ({module!r}, {op!r}), not in the tables"
        return real(module, op, n)

    monkeypatch.setattr(cm, "config", config)
    replay.clear()  # every call takes its full path, which reads the tables
    with replay.switched(enabled=False), stubbed_launches() as log, torch.no_grad():
        for fn in public_calls("cpu", rows=rows).values():
            fn()
    assert log
    for (module, op), callers in read.items():
        assert callers == {f"{tuning.PACKAGE}.{module}"}, f"({module!r}, {op!r}) read by {sorted(callers)}"
    assert set(read) == set(tuning.CONFIG), f"keys no launch reads: {sorted(set(tuning.CONFIG) - set(read))}"
