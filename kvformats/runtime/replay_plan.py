"""What ``kvformats.runtime.replay`` records of one call, and the plan that repeats it for new tensors.

A ``Recording`` watches one call through torch's dispatch (a ``TorchDispatchMode``): where each
tensor comes from (an argument or an allocation, through views), which torch operations ran,
and, reported by ``kvformats_kernels.launch``, each compiled kernel it launched with its grid
and arguments. A ``Plan`` is the result: per launch, each tensor argument as (argument or
allocation, byte offset), everything else a constant. Its ``replay`` is a small function
generated for the plan (as Triton generates its own launchers), so that replaying costs the
allocations, one ``data_ptr`` per argument and the launches, and nothing per argument kind.

What this module knows of the kernel launcher comes through one registered object
(``register_launcher``; kvformats_kernels registers ``triton_abi.TritonLauncher``, the CPU stand-in
of ``tests.harness.launch_stub`` its own): the current device and stream, whether a launch
hook is set, the direct launch function behind a compiled kernel, and the watch that refuses a
recording when a kernel is launched any other way than through ``kvformats_kernels.launch``.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvformats.errors import BackendUnavailableError
from kvformats.runtime import deferred

DEBUG = os.environ.get("KVFORMATS_REPLAY_DEBUG", "0") not in ("", "0")  # say why a call is not recorded


class Launcher(Protocol):
    """What the replay engine asks of the kernel launcher."""

    def current_device(self) -> int: ...  # the current CUDA device (part of the replay key)

    def current_stream(self, device: int) -> int: ...  # its current raw stream (read per replay)

    def hooks_set(self) -> bool: ...  # a profiler wants every launch through Triton: no replay

    def direct(self, run): ...  # the C launch behind a compiled kernel's run, or None

    def watch(self, on: bool) -> None: ...  # refuse recordings that launch outside the launcher


def no_streams(device: int) -> int:
    """What ``current_stream`` is on a torch built without CUDA: no stream exists to launch on."""
    raise BackendUnavailableError("this torch build has no CUDA streams")


class _NoLauncher:
    """Before the kernel package is loaded no call launches anything, so nothing is recorded."""

    current_device = staticmethod(torch.cuda.current_device)
    current_stream = staticmethod(getattr(torch._C, "_cuda_getCurrentRawStream", no_streams))

    def hooks_set(self) -> bool:
        return False

    def direct(self, run):
        return None

    def watch(self, on: bool) -> None:
        pass


LAUNCHER: Launcher = _NoLauncher()


def register_launcher(launcher: Launcher) -> Launcher:
    """Make ``launcher`` the one the replay engine asks; returns the one it replaces."""
    global LAUNCHER
    before, LAUNCHER = LAUNCHER, launcher
    return before


def current_device() -> int:
    return LAUNCHER.current_device()


def hooks_set() -> bool:
    return LAUNCHER.hooks_set()


class Arg(NamedTuple):
    """A recorded launch argument: ``kind`` "in" (an argument of the call, index ``where``),
    "fresh" (an allocation of the call) at byte ``offset`` from its address, or "const"
    (``where`` passed as it was)."""

    kind: str
    where: object
    offset: int = 0


class Allocation(NamedTuple):
    """A tensor the call allocates: made anew (and zeroed where the call zeroed it) per replay."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    zeroed: bool


class Launch(NamedTuple):
    """One recorded kernel launch."""

    run: object  # the compiled kernel's launcher (CompiledKernel.run)
    function: object  # the driver's function handle
    metadata: object  # Triton's packed metadata
    device: int
    grid: tuple  # (x, y, z)
    args: tuple  # Arg per runtime argument
    tail: tuple  # the defaulted trailing arguments, as Triton would pass them


_KEEP: dict[int, torch.Tensor] = {}  # tensors that live for the process (besides the error records)
_local = threading.local()


def persistent(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as living for the process: a plan may pass its address to every replay."""
    _KEEP[id(t)] = t
    return t


def recording():
    """The recording under way on this thread, or None."""
    return getattr(_local, "rec", None)


def _lasting(t: torch.Tensor) -> bool:
    return id(t) in _KEEP or any(t is r for r in deferred._RECORDS.values())


_ALLOCATIONS = {
    torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default, torch.ops.aten.empty_like.default,
}
_ZEROED = {torch.ops.aten.zeros.default, torch.ops.aten.new_zeros.default, torch.ops.aten.zeros_like.default}


class Recording(TorchDispatchMode):
    """One call under watch (module doc); ``launch`` is called by the kernel launcher."""

    def __init__(self, inputs: list):
        super().__init__()
        self.ok = True
        self.inputs = inputs
        self.fresh: list[torch.Tensor] = []
        self.zeroed: list[bool] = []  # allocations made by torch.zeros (a fill on the device)
        self.origin: dict[int, tuple] = {}
        for i, t in enumerate(inputs):  # a tensor passed twice is named by its first place
            self.origin.setdefault(id(t), ("in", i))
        self.own = 0  # > 0 while kvformats_kernels.launch launches through Triton's own path
        self.alive: list = list(inputs)  # no id is reused while the call runs
        self.launches: list = []
        self.retyped: dict[int, tuple] = {}  # allocation -> the (shape, strides, dtype) it is returned as

    def __enter__(self):
        _local.rec = self
        LAUNCHER.watch(True)
        return super().__enter__()

    def __exit__(self, *exc):
        _local.rec = None
        LAUNCHER.watch(False)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func in _ALLOCATIONS or func in _ZEROED) and type(out) is torch.Tensor:
            self.origin[id(out)] = ("fresh", len(self.fresh))
            self.fresh.append(out)
            self.zeroed.append(func in _ZEROED)
        elif func.is_view:
            src = self.origin.get(id(args[0])) if args and type(args[0]) is torch.Tensor else None
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if src is not None and type(o) is torch.Tensor:
                    self.origin[id(o)] = src
        else:
            self._refuse(func)  # device work that is not a kernel launch (or a host read)
        self.alive.append(out)
        return out

    def _base(self, kind: str, i: int) -> torch.Tensor:
        return self.inputs[i] if kind == "in" else self.fresh[i]

    def launch(self, run, function, metadata, device: int, grid: tuple, args: tuple, tail: tuple) -> None:
        """One launch of a compiled kernel: each tensor argument becomes (origin, byte offset)."""
        if not self.ok:
            return
        built = []
        for a in args:
            if type(a) is torch.Tensor:
                src = self.origin.get(id(a))
                if src is not None:
                    built.append(Arg(src[0], src[1], a.data_ptr() - self._base(*src).data_ptr()))
                elif _lasting(a):
                    built.append(Arg("const", a.data_ptr()))
                else:
                    self._refuse("a tensor argument that is neither an argument's view nor an allocation")
                    return
            elif a is None or type(a) in (int, float, bool):
                built.append(Arg("const", a))
            else:
                self._refuse(f"a kernel argument of type {type(a).__name__}")
                return
        self.launches.append(Launch(run, function, metadata, device, grid, tuple(built), tuple(tail)))

    def refuse(self, why: str = "a launch through Triton's own path") -> None:
        """A launch this recording cannot replay."""
        self._refuse(why)

    def _refuse(self, why) -> None:
        if self.ok and DEBUG:
            print(f"kvformats.runtime.replay: not recorded: {why}")
        self.ok = False

    def plan(self, result):
        """The Plan of this call, or None when it cannot be replayed."""
        if not self.ok:
            return None
        rebuilt = self._result(result)
        if rebuilt is None:
            self._refuse("a result that is not an argument, an allocation or its view")
            return None
        fresh = [Allocation(tuple(f.shape), tuple(f.stride()), f.dtype, f.device, z)
                 for f, z in zip(self.fresh, self.zeroed)]
        for k, (shape, stride, dtype) in self.retyped.items():
            fresh[k] = fresh[k]._replace(shape=shape, stride=stride, dtype=dtype)
        return Plan(self.launches, fresh, rebuilt)

    def _result(self, r):
        """How to rebuild a result from the arguments and allocations, or None when it cannot be."""
        if type(r) is torch.Tensor:
            for i, t in enumerate(self.inputs):
                if r is t:
                    return ("in", i)
            for k, t in enumerate(self.fresh):
                if r is t and k not in self.retyped:
                    self.retyped[k] = (tuple(t.shape), tuple(t.stride()), t.dtype)
                    return ("fresh", k)
            src = self.origin.get(id(r))
            if src is None:
                return None
            base = self._base(*src)
            if src[0] == "fresh" and src[1] not in self.retyped and r.is_contiguous() and base.is_contiguous() \
                    and r.storage_offset() == 0 and r.numel() * r.element_size() == base.numel() * base.element_size():
                # the whole of an allocation in another shape or dtype: allocate it so (kernels see
                # only its address), and return it without a view per call
                self.retyped[src[1]] = (tuple(r.shape), tuple(r.stride()), r.dtype)
                return ("fresh", src[1])
            # a view of an argument or an allocation, possibly as another dtype of the same width
            # (int16 -> bf16); its storage offset is kept relative to its base's
            if r.element_size() != base.element_size():
                return None
            return ("view", src, r.dtype, tuple(r.shape), tuple(r.stride()),
                    r.storage_offset() - self._base(*src).storage_offset())
        if r is None:
            return ("none",)
        if type(r) in (tuple, list):
            items = tuple(self._result(x) for x in r)
            return None if any(x is None for x in items) else (type(r), items)
        return None


class Plan:
    """The recorded launches of one metadata signature; ``replay(ptrs, tensors)`` repeats them
    for arguments at the addresses ``ptrs`` and returns the call's result."""

    def __init__(self, launches: list, fresh: list, rebuilt):
        self.launches, self.fresh, self.rebuilt = launches, fresh, rebuilt
        self.source, self.replay = _generate(launches, fresh, rebuilt)
        self.keep: list = []  # objects keyed by identity live as long as their plan


def _generate(launches: list, fresh: list, rebuilt):
    ns: dict = {"_empty": torch.empty_strided, "_stream": LAUNCHER.current_stream, "_view": _view}
    lines = ["def replay(ptr, tensors):"]
    for k, a in enumerate(fresh):  # shapes and strides as literals: no lookups per replay
        ns[f"D{k}"], ns[f"E{k}"] = a.dtype, a.device
        lines.append(f"    m{k} = _empty({tuple(a.shape)!r}, {tuple(a.stride)!r}, dtype=D{k}, device=E{k})")
        if a.zeroed:
            lines.append(f"    m{k}.zero_()")
        lines.append(f"    q{k} = m{k}.data_ptr()")
    for device in sorted({launch.device for launch in launches}):
        lines.append(f"    s{device} = _stream({device})")
    for j, launch in enumerate(launches):
        ns[f"F{j}"], ns[f"M{j}"], ns[f"T{j}"] = launch.function, launch.metadata, launch.tail
        args = []
        for p, arg in enumerate(launch.args):
            if arg.kind == "in":
                args.append(f"ptr[{arg.where}] + {arg.offset}" if arg.offset else f"ptr[{arg.where}]")
            elif arg.kind == "fresh":
                args.append(f"q{arg.where} + {arg.offset}" if arg.offset else f"q{arg.where}")
            elif type(arg.where) is int or arg.where is None:
                args.append(repr(arg.where))
            else:  # floats (repr would lose a NaN's payload) and bools
                ns[f"C{j}_{p}"] = arg.where
                args.append(f"C{j}_{p}")
        gx, gy, gz = launch.grid
        head = f"{gx}, {gy}, {gz}, s{launch.device}, F{j}"
        direct = LAUNCHER.direct(launch.run)
        if direct is None:
            ns[f"R{j}"] = launch.run
            call = f"R{j}({head}, M{j}, None, None, None"
        else:
            ns[f"R{j}"], coop, pdl = direct
            call = f"R{j}({head}, {coop!r}, {pdl!r}, None, None, M{j}, None, None, None"
        lines.append(f"    {call}, {', '.join(args)}, *T{j})" if args else f"    {call}, *T{j})")
    lines.append(f"    return {_expression(rebuilt, ns)}")
    source = "\n".join(lines)
    exec(compile(source, "<kvformats.runtime.replay plan>", "exec"), ns)  # noqa: S102  (our own generated code)
    return source, ns["replay"]


def _expression(r, ns: dict) -> str:
    """Python source that rebuilds a recorded result (Recording._result) in a generated replay."""
    kind = r[0]
    if kind == "in":
        return f"tensors[{r[1]}]"
    if kind == "fresh":
        return f"m{r[1]}"
    if kind == "none":
        return "None"
    if kind == "view":
        (where, i), dtype, shape, stride, offset = r[1:]
        base = f"tensors[{i}]" if where == "in" else f"m{i}"
        name = f"V{len(ns)}"
        ns[name] = (dtype, shape, stride, offset)
        return f"_view({base}, {name})"
    items = ", ".join(_expression(x, ns) for x in r[1])
    return f"[{items}]" if kind is list else f"({items},)"


def _view(base: torch.Tensor, spec: tuple) -> torch.Tensor:
    dtype, shape, stride, offset = spec
    return (base if base.dtype == dtype else base.view(dtype)).as_strided(shape, stride, base.storage_offset() + offset)
