"""The op tests on an op declared here, in one file and nothing else: tests/harness/example_op.py
declares ``scaled_gather`` (a reference and a Triton kernel) with ``kvformats.codec.op.Op``, and
no other file of the package or of the suite names it.

Here, for every op declared in that file (and in the modules named in ``KVFORMATS_EXTRA_OPS``):
the schema derived from its signature, ``torch.library.opcheck`` (which runs its fake), the
wrapper's and the op's bytes against the public function's, every check mode, a
``torch.compile(fullgraph=True)`` call of the public function itself (routed through the op),
the Triton kernel against the reference, and the replay fuzzer's base and flipped variants
(tests/replay_fuzz.py, as tests/test_replay_fuzz.py draws them). Then the suite itself is run in
a subprocess with ``KVFORMATS_EXTRA_OPS`` naming the file: tests/harness/calls.py builds the op's
prepared call from its declared example, so the no-sync guard (tests/test_deferred.py) and the
replay test (tests/test_replay.py) cover it too. None may fail, and each must have run.

This is what docs/howto/add-an-op.md walks through.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.codec.op import DECLARED
from kvformats.testing.strategies import storage_bytes
from tests.harness.calls import EXTRA_OP_MODULES, call_name, example_call

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "tests.harness.example_op"
MODULES = {EXAMPLE, *(m.__name__ for m in EXTRA_OP_MODULES)}
for _module in MODULES:
    importlib.import_module(_module)
OPS = [op for op in DECLARED.values() if op.function is not None and op.function.__module__ in MODULES]
IDS = [call_name(op) for op in OPS]


def _example(op, rows: int = 5, seed: int = 0) -> dict:
    return op.example(rows, torch.Generator().manual_seed(seed))


def _flat(x) -> list:
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _flat(item)]
    return [] if x is None else [x]


def _same(a, b) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _written(op, before: dict, after: dict) -> None:
    """The arguments ``op`` mutates hold the same bytes after both calls."""
    for name in op.mutates:
        if isinstance(before.get(name), torch.Tensor):
            assert torch.equal(storage_bytes(before[name]), storage_bytes(after[name])), name


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_the_schema_is_read_off_the_signature(op):
    import inspect

    schema = op.torch_op._schema
    assert str(schema) == f"kvformats::{op.torch_name}{op.schema.text}"
    assert [a.name for a in schema.arguments] == list(inspect.signature(op.function).parameters)
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] \
        == list(op.mutates)


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_opcheck(op, rows):
    torch.library.opcheck(op.torch_op, tuple(op.op_arguments(**_example(op, rows)).values()))


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_the_wrapper_and_the_op_give_the_functions_bytes(op):
    want_kw, got_kw, raw_kw = _example(op), _example(op), _example(op)
    want = op.function(**want_kw)
    got = op.wrapper(**got_kw)
    arguments = op.op_arguments(**raw_kw)
    raw = op.results(arguments, op.torch_op(*arguments.values()))
    assert type(got) is type(want) and len(_flat(got)) == len(_flat(want)) == len(_flat(raw))
    for a, b, c in zip(_flat(got), _flat(want), _flat(raw)):
        _same(a, b)
        _same(c, b)
    _written(op, want_kw, got_kw)
    _written(op, want_kw, raw_kw)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_every_check_mode_and_no_other(op):
    """spec/checks.md §1: True, False and "strict" give the same results on valid arguments;
    anything else is an InputTypeError before any write, from the function and the wrapper."""
    import inspect

    assert inspect.signature(op.function).parameters["check"].default is True
    want = op.function(**_example(op))
    for fn in (op.function, op.wrapper):
        for mode in (True, False, "strict"):
            got = fn(**_example(op), check=mode)
            for a, b in zip(_flat(got), _flat(want)):
                _same(a, b)
        for bad in (1, None, "STRICT"):
            kwargs = _example(op)
            before = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
            with pytest.raises(kvf.InputTypeError, match="check must be True, False or 'strict'"):
                fn(**kwargs, check=bad)
            assert all(torch.equal(kwargs[k], v) for k, v in before.items())


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_the_public_function_compiles_fullgraph_through_its_op(op):
    """Under torch.compile the public function goes through its torch.library op (no graph
    break, the eager bytes): callers need no second spelling for compiled code."""
    kw_c, kw_e = _example(op), _example(op)
    compiled = torch.compile(lambda kw: op.function(**kw), fullgraph=True, backend="aot_eager")
    got, want = compiled(kw_c), op.function(**kw_e)
    for a, b in zip(_flat(got), _flat(want)):
        _same(a, b)
    _written(op, kw_e, kw_c)
    torch._dynamo.reset()


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_the_kernel_gives_the_references_bytes(op, routed):
    """The Triton kernel (compiled on a GPU, under the interpreter elsewhere) against the
    reference on the example's arguments."""
    if "triton" not in registry._OPS.get((op.key, op.name), {}):
        pytest.skip(f"{op.name} has no Triton kernel")
    for rows in (1, 5, 33):
        kw_t, kw_r = _example(op, rows), _example(op, rows)
        got, want = op.function(**kw_t, backend="triton"), op.function(**kw_r, backend="reference")
        for a, b in zip(_flat(got), _flat(want)):
            _same(a, b)
        _written(op, kw_r, kw_t)
        assert kvf.pending_error("cpu") is None


# ----- the replay fuzzer's variants: each field flipped after a plan of the base exists ---------
def _fields(call) -> list[str]:
    """The variant fields that change something in ``call`` (as tests/test_replay_fuzz.py
    finds them for the prepared calls)."""
    from replay_fuzz import FLOAT_NAMES, tensors_of

    held = tensors_of(call)
    metas = [(t.dtype, tuple(t.shape), t.stride()) for t in held]
    names = call.__code__.co_freevars
    fields = ["seed", "offset"]
    if len(set(metas)) < len(metas):
        fields.append("alias")
    if any(n in names for n in FLOAT_NAMES):
        fields.append("zero")
    if "slots" in names:
        fields.append("slots32")
    if "x" in names:
        fields.append("x_dtype")
    return fields


_FLIPS = {"seed": lambda v: 1 - v, "alias": lambda v: not v, "offset": lambda v: {0: 4, 4: 1, 1: 0}[v],
          "zero": lambda v: -v, "slots32": lambda v: not v, "x_dtype": lambda v: torch.float32 if v is None else None}


def _check(fn, log) -> None:
    from replay_fuzz import check_replay

    check_replay(fn, log)


@pytest.mark.parametrize("custom", [False, True], ids=["api", "custom_op"])
@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_the_replay_fuzzers_base_and_flipped_variants(op, custom):
    pytest.importorskip("triton")
    from replay_fuzz import stub_with_replay, variant

    from kvformats.runtime import replay

    base = {"seed": 0, "offset": 0, "alias": False, "zero": 0.0, "slots32": False, "x_dtype": None}

    def call(cfg):
        made = example_call(op, 8, "cpu", torch.Generator().manual_seed(cfg["seed"]), custom=custom)
        return variant(made, offset=cfg["offset"], alias=cfg["alias"], slots32=cfg["slots32"],
                       x_dtype=cfg["x_dtype"], zero=cfg["zero"])

    fields = _fields(call(base))
    with stub_with_replay() as log:
        for field in fields:
            flipped = call(dict(base, **{field: _FLIPS[field](base[field])}))
            first = call(base)
            for fn in (None, first, first, flipped, None, flipped, flipped, first):
                if fn is None:
                    replay.clear()
                else:
                    _check(fn, log)
    assert {"seed", "offset"} <= set(fields)


# ----- the suite, with the op named to it --------------------------------------------------------
# The suite's files whose op-parametrized tests must have run it (not only skipped it).
COVERED_FILES = ("test_deferred.py", "test_replay.py", "test_new_op_suite.py")


def test_the_suite_covers_an_op_declared_in_one_file(tmp_path):
    report = tmp_path / "report.xml"
    env = dict(os.environ, KVFORMATS_EXTRA_OPS=EXAMPLE, HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    files = [f"tests/{name}" for name in COVERED_FILES]
    proc = subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-k", "example and not covers_an_op", f"--junitxml={report}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    cases = list(ET.parse(report).getroot().iter("testcase"))
    outcome = {id(c): next((child.tag for child in c if child.tag in ("failure", "error", "skipped")), "passed")
               for c in cases}
    assert not [c.get("name") for c in cases if outcome[id(c)] in ("failure", "error")], tail
    ran = Counter(c.get("classname", "").split(".")[-1] + ".py" for c in cases if outcome[id(c)] == "passed")
    assert not [f for f in COVERED_FILES if not ran[f]], ran
    assert sum(ran.values()) >= 14, ran  # 14 when this was written: a drop means a test stopped covering it
