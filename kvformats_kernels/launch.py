"""Launch compiled Triton kernels with little host work.

``kernel[grid](*args, **constexprs)`` costs the host more per argument than the kernel of a
decode step takes on the GPU (docs/explanation/measured-choices.md): Triton binds and
specializes every argument, builds a cache key string, checks its globals and asks the driver
for the device and stream on each call. ``fast(kernel)[grid](...)`` does that work once per
*specialization* and then calls the compiled kernel's launcher directly.

A specialization is everything that can change the compiled code: for each positional argument,
a tensor's dtype and whether its address is a multiple of 16, an int's size class, whether it is
1 and whether it is a multiple of 16 (Triton's integer and alignment specializations), the
type of anything else; every keyword (constexprs and launch options) with its value; the current
device. The key built here is at least as fine as Triton's own, so a launch never reuses code
compiled for other facts. The first launch of a specialization goes through Triton itself
(compiling if needed) and keeps the compiled kernel it returns; the keywords must be the
kernel's constexprs and launch options only (runtime arguments positional), as every launcher
here calls them. Under the interpreter, with launch hooks set (profilers), with
``KVFORMATS_TRITON_LAUNCH=1``, or on a Triton release whose launcher ABI was not verified
(``triton_abi.VERIFIED``), every launch goes through Triton.
"""

from __future__ import annotations

import inspect
import os

import torch
import triton

from kvformats.errors import InputTypeError
from kvformats.runtime import replay, replay_plan
from kvformats_kernels import triton_abi
from kvformats_kernels.settings import SETTINGS

_INT32 = 1 << 31
# Tests set this: a call site that passes a runtime argument by keyword raises on every path
# (on the GPU it would silently keep Triton's slower launch).
STRICT_CALL_SITES = os.environ.get("KVFORMATS_STRICT_CALL_SITES", "0") == "1"


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, not a.data_ptr() & 15
    if type(a) is int:
        return -_INT32 <= a < _INT32, a == 1, not a & 15
    return type(a)


class FastKernel:
    """Wraps a ``@triton.jit`` function; ``FastKernel(fn)[grid](*args, **constexprs)`` launches
    it like ``fn[grid](...)``."""

    def __init__(self, fn):
        self.fn = fn
        self.names = tuple(fn.arg_names) if hasattr(fn, "arg_names") else ()
        self.defaults = _defaults(fn)
        self.runtime = _runtime_names(fn)
        self.compiled: dict[tuple, tuple] = {}
        self.direct = (type(fn).__name__ == "JITFunction" and not SETTINGS.interpret and not SETTINGS.triton_launch
                       and LAUNCHER.verified and torch.cuda.is_available())

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict) -> None:
        if STRICT_CALL_SITES and not self.runtime.isdisjoint(kwargs):
            raise InputTypeError(f"{self.fn.__name__}: runtime arguments {sorted(self.runtime & set(kwargs))} passed "
                            f"by keyword (the direct path would never be taken for this call site)")
        rec = replay_plan.recording()
        if not self.direct or replay_plan.hooks_set():
            _through_triton(self.fn, grid, args, kwargs, rec)
            if rec is not None:
                rec.refuse()
            return
        device = replay_plan.current_device()
        # _arg_key inlined for tensors and ints: a function call per argument was a large share
        # of the direct path's host time (docs/explanation/measured-choices.md)
        key = (device, tuple([(a.dtype, not a.data_ptr() & 15) if type(a) is torch.Tensor else
                              (-_INT32 <= a < _INT32, a == 1, not a & 15) if type(a) is int else _arg_key(a)
                              for a in args]), tuple(kwargs), tuple(kwargs.values()))
        entry = self.compiled.get(key)
        if entry is None:
            self._first(key, grid, args, kwargs, rec)
            entry = self.compiled.get(key)
            if rec is not None:
                if entry is None:
                    rec.refuse()
                else:
                    rec.launch(*entry[:3], device, _grid3(grid), args, entry[3])
            return
        run, function, metadata, tail = entry
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        run(grid[0], g1, g2, replay_plan.LAUNCHER.current_stream(device), function, metadata, None, None, None, *args,
            *tail)
        if rec is not None:
            rec.launch(run, function, metadata, device, (grid[0], g1, g2), args, tail)

    def _first(self, key, grid, args, kwargs, rec) -> None:
        compiled = _through_triton(self.fn, grid, args, kwargs, rec)
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            return  # a Triton whose launch returns no compiled kernel: keep Triton's path
        rest = self.names[len(args):]
        if any(n not in kwargs and n not in self.defaults for n in rest) or not self.runtime.isdisjoint(kwargs):
            # A runtime argument passed by keyword (or left out): its value would be part of the
            # key, one entry per call. This call site keeps Triton's path.
            return
        tail = tuple(kwargs[n] if n in kwargs else self.defaults[n] for n in rest)
        self.compiled[key] = (compiled.run, compiled.function, compiled.packed_metadata, tail)


def _through_triton(fn, grid, args, kwargs, rec):
    """``fn[grid](...)``, Triton's own launch path, marked as ours for a recording under way
    (whose watch refuses any other Triton launch: triton_abi.TritonLauncher.watch)."""
    if rec is None:
        return fn[grid](*args, **kwargs)
    rec.own += 1
    try:
        return fn[grid](*args, **kwargs)
    finally:
        rec.own -= 1


def _grid3(grid) -> tuple:
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


def _defaults(fn) -> dict:
    """The parameters of a jit function that have defaults, with them (from Triton's params, or
    under the interpreter from the function's signature)."""
    params = getattr(fn, "params", None)
    if params is not None:
        return {p.name: p.default for p in params if p.has_default}
    try:
        sig = inspect.signature(getattr(fn, "fn", fn))
    except (TypeError, ValueError):
        return {}
    return {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


def _runtime_names(fn) -> set[str]:
    """The parameters of a jit function that are not constexprs (from Triton's params, or under
    the interpreter, which keeps none, from the annotations)."""
    params = getattr(fn, "params", None)
    if params is not None:
        return {p.name for p in params if not p.is_constexpr}
    try:
        sig = inspect.signature(getattr(fn, "fn", fn))
    except (TypeError, ValueError):  # not a function (a stand-in that only launches): nothing to check
        return set()
    return {n for n, p in sig.parameters.items() if "constexpr" not in str(p.annotation)}


def fast(fn) -> FastKernel:
    """The FastKernel of ``fn`` (one per jit function)."""
    wrapped = _WRAPPED.get(fn)
    if wrapped is None:
        wrapped = _WRAPPED[fn] = FastKernel(fn)
    return wrapped


_WRAPPED: dict = {}
LAUNCHER = triton_abi.TritonLauncher(triton.__version__)
replay.register_launcher(LAUNCHER)
