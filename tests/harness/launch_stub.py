"""Kernel launches logged instead of run, on a machine without a GPU.

Inside ``stubbed_launches()`` CPU tensors take the path CUDA tensors take: the Triton launchers,
value checks on the device, the direct launch of ``launch.fast`` and the replay of
``kvformats.runtime.replay``; each launch appends ``(kernel, grid, arguments)`` to the log instead of
running, with every tensor argument as its address (an ``Address``). What that is for: timing the Python
around the launches (benchmarks/host_overhead_cpu.py) and checking in CI that a replayed call
makes exactly the launches its full path makes (tests/test_replay.py). No byte is written.
"""

from __future__ import annotations

import contextlib

import torch

from kvformats.codec import registry
from kvformats.runtime import deferred, replay
from kvformats_kernels import launch, triton_abi


class Address(int):
    """A tensor argument's address in the log (a replayed launch passes plain ints)."""


def _address(a):
    return Address(a.data_ptr()) if isinstance(a, torch.Tensor) else a


class _Compiled:
    """Stands in for a compiled kernel: its ``run`` logs the launch."""

    def __init__(self, name: str, log: list | None):
        self.function = name
        self.packed_metadata = None
        self.log = log

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit_, *args):
        if self.log is not None:
            self.log.append((function, (g0, g1, g2), tuple(_address(a) for a in args)))


class StubLauncher(triton_abi.TritonLauncher):
    """The launcher protocol on a machine without a GPU: device 0, stream 0, and Triton's hooks
    as the Triton release ``version`` keeps them."""

    current_device = staticmethod(lambda: 0)
    current_stream = staticmethod(lambda device: 0)


@contextlib.contextmanager
def stubbed_launches(log: list | None = None, *, keep_log: bool = True, triton_version: str = "3.6.0"):
    """Within the block, launches go to ``log`` (a list; a new one when None), which is yielded;
    with ``keep_log=False`` nothing is logged (for timing the Python around the launches).
    ``triton_version``: the Triton release the launcher takes itself to run on (the direct paths
    and replay only on a verified one, ``triton_abi.VERIFIED``)."""
    from triton import knobs
    from triton.runtime import interpreter
    from triton.runtime import jit as triton_jit

    log = [] if log is None else log
    compiled: dict = {}
    real_run, real_interpreted = triton_jit.JITFunction.run, interpreter.InterpretedFunction.run
    real_resolve, real_init = registry._resolve, launch.FastKernel.__init__
    stub_launcher = StubLauncher(triton_version)
    host_checked = set(deferred.HOST_CHECKED)

    def run(self, *args, grid, warmup, **kwargs):
        knobs.runtime.launch_enter_hook(None)  # as Triton's own launch path calls its hooks
        c = compiled.get(self)
        if c is None:
            c = compiled[self] = _Compiled(self.__name__, log if keep_log else None)
        defaults = launch._defaults(self)
        tail = [kwargs[n] if n in kwargs else defaults[n] for n in self.arg_names[len(args):]]
        g = tuple(grid) + (1,) * (3 - len(grid))
        c.run(*g, 0, c.function, None, None, None, None, *args, *tail)
        return c

    def init(self, fn):
        real_init(self, fn)
        self.direct = stub_launcher.verified

    def resolve(fmt, op, backend, device):
        # a CPU device resolves as a CUDA one would: the Triton implementation
        return real_resolve(fmt, op, backend, torch.device("cuda") if device.type == "cpu" else device)

    triton_jit.JITFunction.run = interpreter.InterpretedFunction.run = run
    registry._resolve, launch.FastKernel.__init__ = resolve, init
    real_launcher = replay.register_launcher(stub_launcher)
    saved = dict(launch._WRAPPED)
    launch._WRAPPED.clear()
    replay.SWITCHES.any_device = True
    deferred.HOST_CHECKED.clear()
    registry._RESOLVED.clear()
    replay.clear()
    try:
        yield log
    finally:
        triton_jit.JITFunction.run, interpreter.InterpretedFunction.run = real_run, real_interpreted
        registry._resolve, launch.FastKernel.__init__ = real_resolve, real_init
        replay.register_launcher(real_launcher)
        launch._WRAPPED.clear()
        launch._WRAPPED.update(saved)
        replay.SWITCHES.any_device = False
        deferred.HOST_CHECKED.update(host_checked)
        registry._RESOLVED.clear()
        replay.clear()
