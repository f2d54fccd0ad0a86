"""kvformats.runtime.replay: a replayed call launches exactly what its full path launches, and every
case the full path must see (errors, strict checks, new metadata) still goes through it.

The launches are logged instead of run (tests.harness.launch_stub), so this runs on a CPU; the GPU
tests compare a replayed call's bytes with the reference (tests/kernels/test_replay_gpu.py).
"""

from __future__ import annotations

import functools
import threading
import types

import pytest
import torch

pytest.importorskip("triton")

import kvformats as kvf  # noqa: E402
from kvformats.codec import registry, slot_ops  # noqa: E402
from kvformats.errors import InputError, InputTypeError  # noqa: E402
from kvformats.runtime import replay, replay_plan  # noqa: E402
from tests.harness.calls import public_calls  # noqa: E402
from tests.harness.capabilities import require  # noqa: E402
from tests.harness.launch_stub import Address  # noqa: E402
from replay_fuzz import addresses, normalized, stub_with_replay  # noqa: E402  (tests/, as conftest's folder)

NAMES = sorted(public_calls("meta", 64))


@pytest.fixture
def stub():
    with stub_with_replay() as log:
        yield log


@functools.cache
def _call_sets(custom: bool) -> tuple[dict, dict]:
    """Two sets of prepared calls with the same metadata and other tensors."""
    return public_calls("cpu", 64, custom=custom), public_calls("cpu", 64, custom=custom)


def _tensors_in(fn) -> list[torch.Tensor]:
    """The tensors a prepared call holds (its closure, defaults, partials, dicts)."""
    found, stack, seen = [], [fn], set()
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            found.append(o)
        elif isinstance(o, types.FunctionType):
            stack += [c.cell_contents for c in (o.__closure__ or ())]
            stack += list(o.__defaults__ or ()) + list((o.__kwdefaults__ or {}).values())
        elif isinstance(o, functools.partial):
            stack += [o.func, *o.args, *o.keywords.values()]
        elif isinstance(o, dict):
            stack += list(o.values())
        elif isinstance(o, (list, tuple)):
            stack += list(o)
        elif type(o).__name__ == "Ops":  # tests.harness.calls' custom-op bundle
            stack += list(vars(o).values())
    return found


def _shape_of(r):
    if isinstance(r, torch.Tensor):
        return (r.dtype, tuple(r.shape), r.stride(), r.device)
    if isinstance(r, (tuple, list)):
        return type(r), tuple(_shape_of(x) for x in r)
    return r


def _plans() -> int:
    return sum(isinstance(p, replay_plan.Plan) for table in replay._TABLES for p in table.values())


@pytest.mark.parametrize("custom", [False, True], ids=["api", "custom_op"])
@pytest.mark.parametrize("name", NAMES)
def test_a_replayed_call_launches_what_its_full_path_launches(stub, name, custom):
    fmt, _, op = name.partition(".")
    if fmt in kvf.list_formats():  # a plan records kernel launches: a codec op needs its kernel
        require(fmt, "kernels", op=op)
    first, second = (calls[name] for calls in _call_sets(custom))
    # the full path's launches for the second call's tensors
    replay.SWITCHES.enabled = False
    stub.clear()
    want_result = second()
    want = list(stub)
    tensor_at = {(j, p) for j, (_, _, args) in enumerate(want) for p, a in enumerate(args) if isinstance(a, Address)}
    # ... and through a plan recorded on the first call's tensors
    replay.SWITCHES.enabled = True
    plans = _plans()
    first()
    first()
    assert _plans() > plans, f"{name}: no plan was recorded (run with KVFORMATS_REPLAY_DEBUG=1 to see why)"
    stub.clear()
    got_result = second()
    inputs = _tensors_in(second)
    assert normalized(list(stub), inputs, tensor_at) == normalized(want, inputs, tensor_at)
    assert _shape_of(got_result) == _shape_of(want_result)
    # a result that is an argument comes back as that very tensor
    for g, w in zip(got_result if isinstance(got_result, tuple) else (got_result,),
                    want_result if isinstance(want_result, tuple) else (want_result,)):
        if any(w is t for t in inputs):
            assert g is w


def _codec(rows=8):
    lay = kvf.get_format("fp8_indexer")
    cache = lay.allocate(2)
    return lay, cache, torch.randn(rows, lay.head_dim, dtype=torch.bfloat16), torch.arange(rows)


def test_metadata_errors_are_raised_on_every_call(stub):
    lay, cache, x, slots = _codec()
    lay.encode(x, cache, slots)
    lay.encode(x, cache, slots)  # a plan for these metadata
    for _ in range(3):
        with pytest.raises(InputTypeError):
            lay.encode(x, cache, slots.to(torch.float32))
        with pytest.raises(InputError):
            lay.encode(x[:4], cache, slots)  # rows and slots disagree
    n = len(stub)
    with pytest.raises(InputTypeError):
        lay.encode(x, cache, slots, check="loud")  # an invalid check mode is metadata too
    assert len(stub) == n


def test_a_signature_whose_call_raises_is_not_recorded_on_every_call(stub, monkeypatch):
    """The error comes on every call; recording it stops after replay.ATTEMPTS tries, so a
    caller retrying a refused call does not pay for a recording each time."""
    lay, cache, x, slots = _codec()
    recordings = []
    real = replay_plan.Recording

    def counted(*args, **kwargs):
        recordings.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(replay_plan, "Recording", counted)
    for _ in range(10):
        with pytest.raises(InputError):
            lay.encode(x[:4], cache, slots)  # rows and slots disagree
    assert 1 <= len(recordings) <= replay.ATTEMPTS + 1


def test_strict_checks_always_take_the_full_path(stub):
    lay, cache, x, slots = _codec()
    lay.encode(x, cache, slots)
    lay.encode(x, cache, slots)
    bad = slots.clone()
    bad[3] = 10 ** 6  # beyond the cache: a value error, which only a host check sees before the launch
    n = len(stub)
    lay.encode(x, cache, bad)  # default mode: replayed, the kernel records it
    assert len(stub) == n + 1
    for strict in (lambda: lay.encode(x, cache, bad, check="strict"), ):
        with pytest.raises(InputError, match="beyond the cache"):
            strict()
    with kvf.strict_checks(), pytest.raises(InputError, match="beyond the cache"):
        lay.encode(x, cache, bad)
    assert len(stub) == n + 1  # neither strict call launched


def test_keys_tell_apart_what_the_full_path_reads(stub):
    lay, cache, x, slots = _codec(16)
    calls = [lambda: lay.decode(cache, slots), lambda: lay.decode(cache, slots[1:]),  # shape, alignment
             lambda: lay.decode(cache, slots[::2]),  # stride
             lambda: lay.decode(cache, slots.to(torch.int32)),  # dtype
             lambda: lay.decode(cache, slots, check=False)]
    for c in calls:
        c()
        c()
    table = slot_ops.decode.__wrapped_plans__
    assert sum(isinstance(p, replay_plan.Plan) for p in table.values()) == len(calls)
    for _ in range(2):  # 1 == True, but check=1 is keyed apart and refused each time
        with pytest.raises(InputTypeError):
            lay.decode(cache, slots, check=1)


def test_calls_nested_in_a_recording_run_in_full(stub):
    @replay.replayable
    def outer(lay, cache, slots):
        return lay.decode(cache, slots)

    lay, cache, x, slots = _codec()
    outer(lay, cache, slots)
    outer(lay, cache, slots)
    assert sum(isinstance(p, replay_plan.Plan) for p in outer.__wrapped_plans__.values()) == 1
    assert slot_ops.decode.__wrapped_plans__ == {}  # the inner call was recorded as part of the outer one
    n = len(stub)
    assert outer(lay, cache, slots).shape == (8, lay.head_dim) and len(stub) == n + 1


def test_new_tensors_are_made_for_each_replay(stub):
    lay, cache, x, slots = _codec()
    a, b, c = (lay.decode(cache, slots) for _ in range(3))
    assert len({a.data_ptr(), b.data_ptr(), c.data_ptr()}) == 3 and a.dtype == b.dtype == c.dtype == lay.decode_dtype


def test_launch_hooks_and_the_switch_turn_replay_off(stub, monkeypatch):
    lay, cache, x, slots = _codec()
    lay.decode(cache, slots)
    lay.decode(cache, slots)
    plan = next(p for p in slot_ops.decode.__wrapped_plans__.values() if isinstance(p, replay_plan.Plan))
    used = []
    monkeypatch.setattr(plan, "replay", lambda ptrs, tensors: used.append(1))
    lay.decode(cache, slots)
    assert used == [1]
    monkeypatch.setattr(replay_plan, "hooks_set", lambda: True)
    assert lay.decode(cache, slots).shape == (8, lay.head_dim) and used == [1]
    monkeypatch.setattr(replay_plan, "hooks_set", lambda: False)
    replay.SWITCHES.enabled = False
    lay.decode(cache, slots)
    assert used == [1]


def _change_during_the_recording(monkeypatch, change) -> list:
    """Make the next recorded launch run ``change`` in another thread first (joined there): a
    deterministic interleaving of a change from another thread with a recording under way."""
    real = replay_plan.Recording.launch
    done: list = []

    def launch(self, *args):
        if not done:
            other = threading.Thread(target=change)
            other.start()
            other.join()
            done.append(True)
        return real(self, *args)

    monkeypatch.setattr(replay_plan.Recording, "launch", launch)
    return done


def _launches(stub, fn, enabled: bool) -> list:
    replay.SWITCHES.enabled = enabled
    stub.clear()
    fn()
    replay.SWITCHES.enabled = True
    return list(stub)


def test_a_settings_change_during_a_recording_drops_its_plan(stub, launch_settings, monkeypatch):
    """Issue 44 item 9: the settings' change emptied the plan tables while a call was being
    recorded; the recording then stored a plan of the old settings, replayed by every later call."""
    lay, cache, x, slots = _codec()
    call = lambda: lay.encode(x, cache, slots)  # noqa: E731
    call()  # counted: the next call of these metadata is recorded
    # without the small-call overrides, the indexer encode takes another block of rows (its grid)
    done = _change_during_the_recording(monkeypatch, lambda: launch_settings("bounds", "small_rows", 0))
    call()
    monkeypatch.undo()
    assert done
    assert not any(isinstance(p, replay_plan.Plan) for p in slot_ops.encode.__wrapped_plans__.values())
    want = _launches(stub, call, enabled=False)
    for _ in range(3):  # counted, recorded (under the new settings), replayed
        got = _launches(stub, call, enabled=True)
        at = addresses(got, want)
        assert normalized(got, [x, cache, slots], at) == normalized(want, [x, cache, slots], at)


def test_an_implementation_registered_during_a_recording_drops_its_plan(stub, monkeypatch):
    """The registry's changes drop the plans the same way: a plan recorded while another thread
    registers a new implementation would replay the launches of the one it replaced."""
    lay, cache, x, slots = _codec()
    call = lambda: lay.encode(x, cache, slots)  # noqa: E731
    key = (lay.name, "encode")
    kernel = registry._OPS[key]["triton"]
    call()
    # the new "triton" encode: the reference (torch operations, no kernel launch: never recorded)
    done = _change_during_the_recording(
        monkeypatch, lambda: registry.register_op(lay.name, "encode", "triton")(slot_ops.encode_reference))
    try:
        call()
        monkeypatch.undo()
        assert done
        assert not any(isinstance(p, replay_plan.Plan) for p in slot_ops.encode.__wrapped_plans__.values())
        for _ in range(3):
            assert _launches(stub, call, enabled=True) == []  # the reference launches nothing
    finally:
        registry._OPS[key]["triton"] = kernel
        registry._KERNEL_FNS.discard(slot_ops.encode_reference)
        registry._RESOLVED.clear()
        replay.clear()


CUDA = torch.cuda.is_available()


def _state(fn, result):
    """Clones of every tensor a prepared call holds, and of its result."""
    res = result if isinstance(result, (tuple, list)) else (result,)
    return [t.clone() for t in _tensors_in(fn)], [r.clone() for r in res if isinstance(r, torch.Tensor)]


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.element_size() == 1 else
                                              a.contiguous().view(-1).view(torch.uint8),
                                              b.view(torch.uint8) if b.element_size() == 1 else
                                              b.contiguous().view(-1).view(torch.uint8))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [64, 4100], ids=["decode", "prefill"])
@pytest.mark.parametrize("custom", [False, True], ids=["api", "custom_op"])
def test_replayed_calls_write_the_bytes_of_the_full_path_on_the_gpu(rows, custom, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    first, second = public_calls("cuda", rows, custom=custom), public_calls("cuda", rows, custom=custom)
    before = replay.SWITCHES.enabled
    mismatched, unplanned = [], []
    try:
        for name in sorted(first):
            held = _tensors_in(second[name])
            start = [t.clone() for t in held]
            replay.SWITCHES.enabled = False
            want = _state(second[name], second[name]())
            for t, s in zip(held, start):
                t.copy_(s)
            replay.SWITCHES.enabled = True
            plans = _plans()
            first[name]()
            first[name]()
            if _plans() == plans:
                unplanned.append(name)
            got = _state(second[name], second[name]())  # replayed on other tensors
            if not all(_bitwise(a, b) for a, b in zip(got[0] + got[1], want[0] + want[1])):
                mismatched.append(name)
        torch.cuda.synchronize()
    finally:
        replay.SWITCHES.enabled = before
    assert not unplanned and not mismatched, (unplanned, mismatched)


def test_switched_changes_the_switches_inside_its_block_only():
    before = (replay.SWITCHES.enabled, replay.SWITCHES.any_device)
    with replay.switched(enabled=not before[0], any_device=True) as s:
        assert (s.enabled, s.any_device) == (not before[0], True)
    assert (replay.SWITCHES.enabled, replay.SWITCHES.any_device) == before
    for bad in ({"enabled": 1}, {"fast": True}):
        with pytest.raises(InputTypeError):
            with replay.switched(**bad):
                pass
    assert (replay.SWITCHES.enabled, replay.SWITCHES.any_device) == before
