"""Launch replay for the tokenspeed-kernel drop-ins whose own work is checks and views of their
arguments (``replayed``), and the index tensors they read, made once per shape (``aranged``)."""

from __future__ import annotations

import functools

import torch

from kvformats.compat._common import compiling
from kvformats.runtime import replay
from kvformats.runtime.replay_plan import persistent

def replayed(fn=None, *, plain=None):
    """``fn``, a drop-in whose work besides its checks is views of its arguments and native calls,
    with its launches replayed for arguments whose metadata was seen before, as the native calls'
    are (``kvformats.runtime.replay``: the drop-in's checks, the native call's and its launch
    arguments are worked out once per metadata signature; none of them reads a value, errors are
    never replayed, a call that does other device work is never recorded). The steady-state host
    cost is then the native call's. ``plain(args, kwargs)``: False for a call form that does other
    device work (a copy, a mask), which then runs as it is, without building a replay key. Under
    torch.compile ``fn`` is traced as it is."""
    if fn is None:
        return functools.partial(replayed, plain=plain)
    fast = replay.replayable(fn)
    # The compiling() forks below are about this compat-level replay, not the ops' routing (which
    # the ops' declarations derive): a drop-in's replay key reads addresses, which a traced tensor
    # has none of, so while dynamo traces the drop-in runs as written and its ops route themselves.
    switches = replay.SWITCHES  # read here too: with replay off (KVFORMATS_REPLAY=0) one call layer, not two
    if plain is None:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            return fast(*args, **kwargs) if switches.enabled and not compiling() else fn(*args, **kwargs)
    else:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if switches.enabled and plain(args, kwargs) and not compiling():
                return fast(*args, **kwargs)
            return fn(*args, **kwargs)
    call.__wrapped_plans__ = fast.__wrapped_plans__  # as replayable's (tests)
    return call


# (device, start, n, dtype) -> torch.arange(start, start + n): one per engine step shape, kept for the
# process (a CUDA graph that captured one, or a replay plan that launches with it, reads it at every
# replay: never freed), ARANGES_KEPT at most
_ARANGES: dict = {}
ARANGES_KEPT, ARANGE_MAX = 64, 8192  # at most 4 MiB of int64 per process


def aranged(n: int, device, start: int = 0, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``torch.arange(start, start + n, dtype=dtype, device=device)`` for the drop-ins to read (never
    write): made once per (device, start, n, dtype) and kept, for n up to ``ARANGE_MAX``; made anew
    per call beyond ``ARANGES_KEPT`` kept ones, inside CUDA-graph capture (filled only when the
    graph runs: captured with it, as before), under a fake-tensor mode and while torch.compile
    traces."""
    if compiling():
        return torch.arange(start, start + n, dtype=dtype, device=device)
    key = (device, start, n, dtype)
    t = _ARANGES.get(key)
    if t is None:
        t = torch.arange(start, start + n, dtype=dtype, device=device)
        if n <= ARANGE_MAX and len(_ARANGES) < ARANGES_KEPT and type(t) is torch.Tensor and not (
                t.is_cuda and torch.cuda.is_current_stream_capturing()):  # not a fake (traced) tensor either
            _ARANGES[key] = persistent(t)  # a replayed drop-in passes its address as a constant
    return t
