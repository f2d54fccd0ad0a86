"""What kvformats_kernels assumes of Triton's launcher, in one place, and the launcher protocol
it registers with the replay engine (``kvformats.runtime.replay_plan.register_launcher``).

Launching a compiled kernel without Triton's ``JITFunction.run`` (``launch.fast``, and the plans
of ``kvformats.runtime.replay``) calls Triton's compiled launcher with its positional calling
convention: ``CompiledKernel.run(gridX, gridY, gridZ, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *args)``, or, one level lower, the C ``launch`` of
Triton 3.6's ``CudaLauncher``. Neither is a public API; both changed between releases (Triton
3.9's ``CudaLauncher.__call__`` takes other arguments). So the direct paths are taken only on the
releases in ``VERIFIED``, whose launches a GPU run checked byte for byte (tests/test_replay.py,
tests/kernels/test_launch.py on an H200). On any other release every launch goes through
Triton's own path and no call is recorded for replay: the same bytes, Triton's host cost.
"""

from __future__ import annotations

import inspect
import threading

import torch

from kvformats.runtime.replay_plan import no_streams

VERIFIED = ("3.6",)  # Triton releases (major.minor) whose launcher ABI was verified on a GPU


def release(version: str) -> str:
    """``"3.6"`` of ``"3.6.0"`` / ``"3.6.0+git1234"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def verified(version: str) -> bool:
    """Whether the direct launch paths may be taken with Triton ``version``."""
    return release(version) in VERIFIED


def _chain_calls(hook, ours) -> bool:
    """Whether a Triton launch hook asks to see launches: Triton 3.6 keeps each hook as a chain
    object (empty: ``.calls == []``), earlier releases as None or a callable. Our own watch
    (``TritonLauncher.watch``) is not a request to see launches."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    if calls is None:
        return hook is not ours
    return any(c is not ours for c in calls)


class TritonLauncher:
    """The launcher protocol of kvformats_kernels (``replay_plan.Launcher``), for Triton
    ``version``."""

    def __init__(self, version: str):
        self.version = version
        self.verified = verified(version)
        self._runtime = None
        self._watchers = 0
        self._lock = threading.Lock()

    # -- what a plan needs at replay time ---------------------------------------------------
    current_device = staticmethod(torch.cuda.current_device)
    current_stream = staticmethod(getattr(torch._C, "_cuda_getCurrentRawStream", no_streams))

    def _knobs(self):
        if self._runtime is None:
            from triton import knobs

            self._runtime = knobs.runtime
        return self._runtime

    def hooks_set(self) -> bool:
        """Whether a profiler (or anything) asked Triton to see every launch. Read on every launch
        and every replay, so the common case (two empty hook chains) is two attribute reads."""
        rt = self._runtime or self._knobs()
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        try:
            if not enter.calls and not leave.calls:
                return False
        except AttributeError:  # a Triton that keeps its hooks as None or a callable
            pass
        return _chain_calls(enter, _refuse_outside) or _chain_calls(leave, None)

    def direct(self, run):
        """(C launch function, cooperative flag, PDL flag) behind a compiled kernel's ``run`` when
        calling that function is what ``run`` would do (Triton 3.6's CudaLauncher with no scratch
        memory), else None (the plan then calls ``run`` itself)."""
        if not self.verified or type(run).__name__ != "CudaLauncher" or getattr(run, "global_scratch_size", 1) or \
                getattr(run, "profile_scratch_size", 1):
            return None
        params = list(inspect.signature(type(run).__call__).parameters)
        if params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]:
            return None
        return getattr(run, "launch", None), run.launch_cooperative_grid, run.launch_pdl

    def watch(self, on: bool) -> None:
        """While any recording is under way, Triton's launch-enter hook refuses the recording of
        the thread that launched through Triton's own path (anything but ``launch.fast``)."""
        with self._lock:
            chain = self._knobs().launch_enter_hook
            self._watchers += 1 if on else -1
            if not hasattr(chain, "add"):
                return  # a Triton without hook chains: those releases are not VERIFIED (no recording)
            if on and self._watchers == 1:
                chain.add(_refuse_outside)
            elif not on and self._watchers == 0:
                chain.remove(_refuse_outside)


def _refuse_outside(*_):
    from kvformats.runtime import replay_plan

    rec = replay_plan.recording()
    if rec is not None and not rec.own:
        rec.refuse("a kernel launched through Triton's own path, outside kvformats_kernels.launch")
