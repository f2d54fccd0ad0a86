"""Replay a public call's kernel launches when its arguments' metadata was seen before.

Why: most of an eager call's host time is Python that validates the arguments and works out the
launches (layouts, configs, strides, grids), and all of it depends on the arguments' metadata
only: dtypes, shapes, strides, devices, address alignment and the Python scalars. No public
call reads a tensor's values on the host in its default mode (tests/test_deferred.py runs every
call on meta tensors, whose values cannot be read). So a call whose arguments have the same
metadata as an earlier call that succeeded makes the same launches, with the same compiled
kernels, grids and scalar arguments; only the addresses differ, each at a fixed byte offset from
an argument or from a tensor the call allocates. ``replayable`` records that once per metadata
signature and afterwards launches the compiled kernels directly.

A call is recorded only when everything it did on the device was a kernel launch through
``kvformats_kernels.launch`` and its torch operations were views and allocations
(``torch.empty`` and kin). Anything else (a fill, a copy, a host read in strict mode) keeps the
call on its full path, as does an error: errors are raised on every call, never replayed.
Bypassed: strict checks, tensors off CUDA, tensor subclasses, launch hooks (profilers),
``KVFORMATS_REPLAY=0``, calls nested in a recording, a Triton release whose launcher ABI was not
verified (``kvformats_kernels.triton_abi``). The first call of a signature is only counted, the
second is recorded, the third and later are replayed: a shape seen once (a prefill's token
count) never pays for a recording.

The key (``_signature``) holds everything the full path's host decisions read, so that equal
keys mean equal launches (spec/checks.md §4): per tensor its dtype, shape, strides, device and
16-byte alignment, and which earlier argument it shares memory with (same storage: the earlier
argument's index, the byte distance between them, and whether it is the very same object); per
Python scalar its type and value, floats by their bits (so 0.0 and -0.0, or two NaNs, are told
apart); the argument names; the current device; whether strict checks are on in this context.
Everything else the launchers read is a launch setting (``kvformats_kernels.settings``), whose
every change drops the plans.

A change may come from another thread while a call is being recorded: the recording would then
hold launches worked out with the old settings (or the implementation replaced), stored after the
tables were emptied, and replayed for every later call. So ``clear`` also moves a generation
counter, which a recording reads when it starts; a plan whose generation moved meanwhile is not
kept (the call's own result stands: it ran in full).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import struct
from typing import Any, Callable

import attrs
import torch

from kvformats.errors import InputTypeError, memory_problem
from kvformats.runtime import deferred
from kvformats.runtime import replay_plan as rp
from kvformats.runtime.replay_plan import recording  # noqa: F401  (the launcher's entry point)



@attrs.define
class Switches:
    """Replay's switches, one object (as ``kvformats_kernels.settings`` holds the launch settings):
    ``enabled`` (``KVFORMATS_REPLAY=0`` turns it off; benchmarks flip it to time the full path)
    and ``any_device`` (CUDA tensors only, unless a stand-in launcher keys CPU tensors too:
    ``tests.harness.launch_stub``). Change them with ``switched`` (restored on exit)."""

    enabled: bool = attrs.field(factory=lambda: os.environ.get("KVFORMATS_REPLAY", "1") not in ("", "0"))
    any_device: bool = False


SWITCHES = Switches()


@contextlib.contextmanager
def switched(**changes: bool):
    """``SWITCHES`` with ``changes`` (``enabled=``, ``any_device=``) inside the block, restored
    after it; an unknown name or a non-bool value is an InputTypeError."""
    for name, value in changes.items():
        if name not in ("enabled", "any_device") or not isinstance(value, bool):
            raise InputTypeError(f"replay.switched takes enabled= and any_device= booleans, got {name}={value!r}")
    before = attrs.asdict(SWITCHES)
    for name, value in changes.items():
        setattr(SWITCHES, name, value)
    try:
        yield SWITCHES
    finally:
        for name, value in before.items():
            setattr(SWITCHES, name, value)

# Non-tensor argument types keyed by identity (layouts: frozen, and kept alive by the plan, so
# an id is never reused while its plan exists).
BY_ID: tuple[type, ...] = ()
_SCALARS = (bool, float, str, type(None), torch.dtype, torch.device)
_TABLES: list[dict] = []  # every replayable function's plans and counts (cleared together)
# Set by every ``clear`` to a new token (module doc): a recording that began under another is dropped.
# A token, not a count: next() is atomic, so two threads clearing at once never store one value twice.
_TOKENS = itertools.count(1)
_GENERATION = [0]
MAX_PLANS = 4096  # per function; a table that fills up starts again (engines need a few dozen)
ATTEMPTS = 2  # recordings of one signature that may fail before it stays on the full path
_SLOW = object()
_DOUBLE = struct.Struct("<d")
_COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})  # the dtypes a conjugate bit comes with
_NO_MEMORY = (RuntimeError, NotImplementedError)  # what data_ptr / untyped_storage raise for a sparse tensor


def by_id(cls: type) -> type:
    """Class decorator: arguments of ``cls`` (immutable) are keyed by identity."""
    global BY_ID
    BY_ID = (*BY_ID, cls)
    return cls


def clear() -> None:
    """Forget every plan (the registry calls this when an implementation changes, the launch
    settings when they change)."""
    # Moved before the tables are emptied: a recording that stores its plan after this point sees
    # the new generation when it checks, one that stored it before has it removed below.
    _GENERATION[0] = next(_TOKENS)
    for table in _TABLES:
        table.clear()


def register_launcher(launcher) -> object:
    """Make ``launcher`` (``replay_plan.Launcher``) the one plans launch through and forget every
    plan; returns the launcher it replaces."""
    before = rp.register_launcher(launcher)
    clear()
    return before


def _signature(args, tensors: list, ptrs: list, keep: list, shared: dict) -> tuple | None:
    """A hashable key of everything the full path may read (metadata, scalars and which
    arguments share memory: module doc), collecting the tensors and their addresses in order;
    None for arguments it cannot key. ``shared``: storage address -> (index, address, tensor)
    of the first argument in that storage."""
    parts: list = []
    for a in args:
        t = type(a)
        if t is torch.Tensor:
            d = a.get_device()
            if d < 0 and not SWITCHES.any_device:
                return None
            # Tensors whose memory does not hold their values are refused before the key reads it
            # (kvformats.errors.memory_problem): a view with the negative or conjugate bit has the
            # metadata, and so the key, of a plain tensor, and a plan would launch on its raw
            # memory. The conjugate bit is read only for complex dtypes, the only ones that carry
            # it, and the layout only when the addresses cannot be read (every layout but strided
            # has no storage: data_ptr raises), keeping the common case at one extra call.
            dt = a.dtype
            if a.is_neg() or dt in _COMPLEX and a.is_conj():
                raise InputTypeError(f"a tensor argument {memory_problem(a)}")
            try:
                p = a.data_ptr()
                s = a.untyped_storage().data_ptr()
            except _NO_MEMORY:
                if a.layout is torch.strided:
                    raise
                raise InputTypeError(f"a tensor argument {memory_problem(a)}") from None
            first = shared.get(s)
            if first is None:
                shared[s] = (len(tensors), p, a)
                parts.append((dt, a.shape, a.stride(), d, p & 15))
            else:  # memory shared with an earlier argument: where, and whether it is that tensor
                parts.append((dt, a.shape, a.stride(), d, p & 15, first[0], p - first[1], a is first[2]))
            tensors.append(a)
            ptrs.append(p)
        elif t is int:
            parts.append(a)
        elif t is float:
            parts.append((t, _DOUBLE.pack(a)))  # by its bits: -0.0 is not 0.0, a NaN keys as itself
        elif t in _SCALARS:
            parts.append((t, a))
        elif t is tuple or t is list:
            inner = _signature(a, tensors, ptrs, keep, shared)
            if inner is None:
                return None
            parts.append((t, inner))
        elif isinstance(a, BY_ID):
            keep.append(a)
            parts.append((t, id(a)))
        else:
            return None
    return tuple(parts)


def replayable(fn: Callable) -> Callable:
    """Decorator for a public op: replay its launches for metadata seen before (module doc)."""
    plans: dict = {}
    seen: dict = {}  # signature -> calls that did not end in a plan
    _TABLES.append(plans)
    _TABLES.append(seen)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not SWITCHES.enabled or rp._local.__dict__.get("rec") is not None or kwargs.get("check") == "strict":
            return fn(*args, **kwargs)
        tensors: list = []
        ptrs: list = []
        keep: list = []
        shared: dict = {}
        positional = _signature(args, tensors, ptrs, keep, shared)
        named = _signature(kwargs.values(), tensors, ptrs, keep, shared) if positional is not None else None
        if named is None:
            return fn(*args, **kwargs)
        key = (positional, named, tuple(kwargs), rp.current_device() if tensors and tensors[0].is_cuda else -1,
               deferred.strict_on())
        plan = plans.get(key)
        if plan is not None:
            if plan is _SLOW or rp.hooks_set():
                return fn(*args, **kwargs)
            return plan.replay(ptrs, tensors)
        tries = seen.get(key, 0)
        if key[-1] or tries == 0:
            # strict checks read values on the host; and a signature seen once may never come
            # again (a prefill's token count), so it is recorded on its second call
            _store(seen, key, tries + 1)
            return fn(*args, **kwargs)
        generation = _GENERATION[0]
        try:
            with rp.Recording(tensors) as rec:
                result = fn(*args, **kwargs)
        except BaseException:
            # an error is raised on every call of the signature (no check reads a value in the
            # default mode), so it counts as a failed recording: not recorded again on every call
            _failed(plans, seen, key, tries)
            raise
        plan = rec.plan(result)
        if plan is not None:
            plan.keep = keep
            _store(plans, key, plan)
            seen.pop(key, None)
        else:
            _failed(plans, seen, key, tries)
        # Checked after the store, so that a clear() in another thread at any point is seen:
        # before the store it moved the generation (the entry is taken out here), after it the
        # clear itself emptied the table. What was recorded under other settings or another
        # implementation is dropped (a plan another thread stored meanwhile may go too, which
        # costs a recording, never a wrong launch); this call's result stands (it ran in full).
        if generation != _GENERATION[0]:
            plans.pop(key, None)
        return result

    call.__wrapped_plans__ = plans  # type: ignore[attr-defined]  # the tests read a wrapper's plans
    return call


def _failed(plans: dict, seen: dict, key, tries: int) -> None:
    """A recording of ``key`` that made no plan: counted, and after ``ATTEMPTS`` the signature
    stays on the full path (``_SLOW``)."""
    if tries >= ATTEMPTS:
        _store(plans, key, _SLOW)
        seen.pop(key, None)
    else:
        _store(seen, key, tries + 1)


def _store(table: dict, key, value) -> None:
    if len(table) >= MAX_PLANS:
        table.clear()
    table[key] = value
