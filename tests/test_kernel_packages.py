"""Kernel packages register themselves: an entry point of the group ``kvformats.kernels`` (or
``registry.register_kernel_package``) names a module whose ``kernel_table()`` becomes the "triton"
backend of the keys it names. Run in fresh processes: registering changes the process's registry."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A vendor's package for a format declared outside kvformats (the new-format suite's one file): its
# "kernels" are Python stand-ins that count their calls and write the reference's bytes.
VENDOR = '''
import torch

from kvformats.codec import slot_ops

CALLS = []


def _counted(op, fn):
    def kernel(*args, **kwargs):
        CALLS.append(op)
        return fn(*args, **kwargs)
    return kernel


def kernel_table():
    return {("scratch_rows", "encode"): _counted("encode", slot_ops.encode_reference),
            ("scratch_rows", "decode"): _counted("decode", slot_ops.decode_reference),
            ("scratch_rows", "gather"): _counted("gather", slot_ops.gather_reference)}
'''

SCRIPT = '''
import sys
import torch
import scratch_rows_format
from kvformats.codec import registry, slot_ops

registry.register_format(scratch_rows_format.ScratchRows)
slot_ops.register_reference_ops("scratch_rows")
print("packages", registry.kernel_packages())
print("has", [registry.has_backend("scratch_rows", op, "triton") for op in ("encode", "decode", "gather")])
import vendor_kernels
lay = registry.get_format("scratch_rows")
x = torch.randn(5, lay.head_dim, generator=torch.Generator().manual_seed(0))
slots = torch.tensor([3, 0, 9, -1, 12])
want, got = lay.allocate(2), lay.allocate(2)
lay.encode(x, want, slots, backend="reference")
fn = registry._OPS[("scratch_rows", "encode")]["triton"]
fn(lay, x, got, slots)
print("same bytes", torch.equal(want, got), vendor_kernels.CALLS)
'''


def _tree(tmp_path: Path, entry_point: bool) -> dict:
    from tests.test_new_format_suite import FORMAT_MODULE

    (tmp_path / "scratch_rows_format.py").write_text(FORMAT_MODULE, encoding="utf-8")
    (tmp_path / "vendor_kernels.py").write_text(VENDOR, encoding="utf-8")
    if entry_point:  # the metadata an installed distribution carries
        info = tmp_path / "vendor_kernels-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-kernels\nVersion: 1.0\n", encoding="utf-8")
        (info / "entry_points.txt").write_text("[kvformats.kernels]\nvendor = vendor_kernels\n", encoding="utf-8")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          cwd=REPO)


def test_a_package_named_by_an_entry_point_registers_its_kernels(tmp_path):
    out = _run(SCRIPT, _tree(tmp_path, entry_point=True))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("packages ['kvformats_kernels'") and "'vendor_kernels'" in lines[0]
    assert lines[1] == "has [True, True, True]"
    assert lines[2] == "same bytes True ['encode']"


def test_without_the_entry_point_the_format_has_no_kernels(tmp_path):
    out = _run(SCRIPT.split("import vendor_kernels")[0], _tree(tmp_path, entry_point=False))
    assert out.returncode == 0, out.stderr
    assert "'vendor_kernels'" not in out.stdout and "has [False, False, False]" in out.stdout


def test_a_key_two_packages_register_is_refused_naming_both(tmp_path):
    code = '''
    import types
    from kvformats.codec import registry
    from kvformats.errors import BackendUnavailableError
    first, second = types.ModuleType("first_kernels"), types.ModuleType("second_kernels")
    first.kernel_table = lambda: {("fp8_indexer", "probe_op"): print}
    second.kernel_table = lambda: {("fp8_indexer", "other_op"): repr, ("fp8_indexer", "probe_op"): repr}
    registry.register_kernel_package(first)
    try:
        registry.register_kernel_package(second)
    except BackendUnavailableError as err:
        print("refused:", err)
    print("kept", registry._OPS[("fp8_indexer", "probe_op")]["triton"] is print,
          ("fp8_indexer", "other_op") not in registry._OPS)
    '''
    out = _run(code, dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "'second_kernels'" in out.stdout and "'first_kernels'" in out.stdout
    assert "kept True True" in out.stdout


def test_a_package_that_cannot_load_is_a_typed_error(tmp_path):
    code = '''
    from kvformats.codec import registry
    from kvformats.errors import BackendUnavailableError
    for bad in ("no_such_kernels_package", __import__("types").ModuleType("tableless")):
        try:
            registry.register_kernel_package(bad)
        except BackendUnavailableError as err:
            print("refused:", err)
    '''
    out = _run(code, dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused:") == 2 and "no_such_kernels_package" in out.stdout and "'tableless'" in out.stdout
