"""The pieces of the replay differential fuzzer (tests/test_replay_fuzz.py): prepared public calls
rebuilt with other tensors, storage offsets, dtypes, aliased arguments and signed zeros, and the
comparison of two launch logs of the stand-in launcher (tests.harness.launch_stub)."""

from __future__ import annotations

import contextlib
import functools
import struct
import types

import torch

from kvformats.runtime import replay
from tests.harness.calls import public_calls
from tests.harness.launch_stub import Address, stubbed_launches

FLOAT_NAMES = ("sm", "hs", "rms_eps")  # float arguments a call may take as 0.0 or -0.0


@contextlib.contextmanager
def stub_with_replay(tables=()):
    """The stand-in launcher with no plan recorded and replay on; the launch-settings ``tables``
    put back afterwards."""
    from kvformats_kernels import settings

    before = replay.SWITCHES.enabled
    saved = {name: settings.snapshot(name) for name in tables}
    replay.SWITCHES.enabled = True
    try:
        with stubbed_launches() as log:
            yield log
    finally:
        replay.SWITCHES.enabled = before
        for name, table in saved.items():
            settings.restore(name, table)


@functools.lru_cache(maxsize=6)
def base_calls(rows: int, custom: bool, check, seed: int, device: str = "cpu") -> dict:
    """Prepared calls of every public op (a few sets cached: the fuzzer never changes them, it
    rebuilds; each set holds every op's inputs, tens of MB)."""
    return public_calls(device, rows, check=check, custom=custom, seed=seed)


def rebuild(obj, change, memo: dict, path=()):
    """A copy of a prepared call (lambdas with their closures and defaults, dicts, tuples) in
    which every tensor and float is ``change(path, value)``; one object changes once (``memo``)."""
    if isinstance(obj, torch.Tensor) or type(obj) is float:
        key = id(obj) if isinstance(obj, torch.Tensor) else (path[-1:], obj)
        if key not in memo:
            memo[key] = change(path, obj)
        return memo[key]
    if isinstance(obj, dict):
        return {k: rebuild(v, change, memo, path + (k,)) for k, v in obj.items()}
    if type(obj) in (tuple, list):
        return type(obj)(rebuild(v, change, memo, path + (i,)) for i, v in enumerate(obj))
    if isinstance(obj, types.FunctionType) and obj.__closure__ is not None or \
            isinstance(obj, types.FunctionType) and obj.__defaults__:
        names = obj.__code__.co_freevars
        cells = tuple(types.CellType(rebuild(c.cell_contents, change, memo, path + (n,)))
                      for n, c in zip(names, obj.__closure__ or ()))
        defaults = obj.__defaults__ and tuple(
            rebuild(v, change, memo, path + (n,))
            for n, v in zip(obj.__code__.co_varnames[obj.__code__.co_argcount - len(obj.__defaults__):],
                            obj.__defaults__))
        fn = types.FunctionType(obj.__code__, obj.__globals__, obj.__name__, defaults, cells or None)
        fn.__kwdefaults__ = obj.__kwdefaults__
        return fn
    return obj


def tensors_of(fn) -> list[torch.Tensor]:
    """The tensors a (rebuilt) prepared call holds, each once."""
    found: dict[int, torch.Tensor] = {}

    def note(path, value):
        if isinstance(value, torch.Tensor):
            found[id(value)] = value
        return value

    rebuild(fn, note, {})
    return list(found.values())


def at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """``t``'s values in a new storage, ``offset`` elements in (the same shape and strides)."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    buf = torch.zeros(span + offset, dtype=t.dtype, device=t.device)
    out = buf.as_strided(t.shape, t.stride(), offset)
    out.copy_(t)
    return out


def variant(fn, *, offset: int = 0, alias: bool = False, slots32: bool = False, x_dtype=None, zero=None):
    """``fn`` rebuilt: every tensor ``offset`` elements into a new storage; with ``alias`` each
    tensor replaced by an earlier one of the same dtype, shape and strides (one tensor passed
    for two arguments); ``slots32``: int64 ``slots`` as int32; ``x_dtype``: the bf16 rows ``x`` as
    that dtype; ``zero``: 0.0 or -0.0 for the float arguments of FLOAT_NAMES."""
    seen: dict = {}

    def change(path, v):
        name = path[-1] if path else None
        if type(v) is float:
            return zero if zero is not None and name in FLOAT_NAMES else v
        if slots32 and name == "slots" and v.dtype == torch.int64:
            v = v.to(torch.int32)
        if x_dtype is not None and name == "x" and v.dtype == torch.bfloat16:
            v = v.to(x_dtype)
        if alias:
            meta = (v.dtype, tuple(v.shape), v.stride())
            if meta in seen:
                return seen[meta]
        out = at_offset(v, offset) if offset else v
        seen.setdefault((v.dtype, tuple(v.shape), v.stride()), out)
        return out

    return rebuild(fn, change, {})


def _bits(v):
    return ("float", struct.pack("<d", v)) if type(v) is float else v


def addresses(*logs) -> set:
    """(launch, argument) places that hold a tensor's address in any of the logs (the full path
    logs an ``Address``; a replayed launch passes a plain int)."""
    return {(j, p) for log in logs for j, (_, _, args) in enumerate(log) for p, a in enumerate(args)
            if isinstance(a, Address)}


def normalized(log: list, inputs: list[torch.Tensor], tensor_at: set) -> list:
    """The launch log with floats as their bits, and every address (at ``tensor_at``) outside
    the inputs' storages named by its order of first use (the two paths allocate different
    memory; an address inside an input must be the same on both)."""
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
             for t in inputs]
    fresh: dict[int, int] = {}
    out = []
    for j, (kernel, grid, args) in enumerate(log):
        norm = []
        for p, a in enumerate(args):
            if (j, p) in tensor_at and not any(lo <= a < hi for lo, hi in spans):
                norm.append(("fresh", fresh.setdefault(int(a), len(fresh))))
            else:
                norm.append(_bits(a))
        out.append((kernel, grid, tuple(norm)))
    return out


def outcome(fn, log: list, enabled: bool):
    """(launches, result shape, exception) of one call with replay on or off."""
    before = replay.SWITCHES.enabled
    replay.SWITCHES.enabled = enabled
    log.clear()
    try:
        result, error = fn(), None
    except Exception as e:  # noqa: BLE001  (both paths must raise the same)
        result, error = None, (type(e), str(e))
    finally:
        replay.SWITCHES.enabled = before
    return list(log), result, error


def shape_of(r, inputs):
    if isinstance(r, torch.Tensor):
        same = next((i for i, t in enumerate(inputs) if r is t), None)
        return (r.dtype, tuple(r.shape), r.stride(), same)
    if isinstance(r, (tuple, list)):
        return type(r), tuple(shape_of(x, inputs) for x in r)
    return r


def check_replay(fn, log) -> None:
    """A replayed call of ``fn`` launches what its full path launches (the same kernels and
    arguments, addresses at the same places), raises the same error and returns the same shapes."""
    inputs = tensors_of(fn)
    got, got_result, got_error = outcome(fn, log, enabled=True)
    want, want_result, want_error = outcome(fn, log, enabled=False)
    assert got_error == want_error
    at = addresses(got, want)
    assert normalized(got, inputs, at) == normalized(want, inputs, at)
    assert shape_of(got_result, inputs) == shape_of(want_result, inputs)
