"""The replay differential fuzzer on a GPU (tests/test_replay_fuzz.py has the CPU one, on launch
logs): the bytes a replayed call writes and returns equal those of its full path, eagerly, when
the replayed calls are captured in a CUDA graph, and from two threads on two streams. A step's
compressed caches take ~20 MB a token here, hence steps of at most 200 tokens."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_fuzz import base_calls, tensors_of, variant  # (tests/, as conftest's folder)

from kvformats.runtime import replay

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]
NAMES = sorted(base_calls(8, False, True, 0)) if CUDA else []


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).view(torch.uint8)


def _written(fn, enabled: bool, repeats: int = 1) -> list[torch.Tensor]:
    """Each tensor the call holds and returns after ``repeats`` calls from the same starting
    bytes (the inputs are put back before every call), as bytes."""
    held = tensors_of(fn)
    start = [t.clone() for t in held]
    before = replay.SWITCHES.enabled
    replay.SWITCHES.enabled = enabled
    try:
        for _ in range(repeats):
            for t, s in zip(held, start):
                t.copy_(s)
            result = fn()
    finally:
        replay.SWITCHES.enabled = before
    res = result if isinstance(result, (tuple, list)) else (result,)
    out = [_bytes(t).clone() for t in held] + [_bytes(r).clone() for r in res if isinstance(r, torch.Tensor)]
    for t, s in zip(held, start):
        t.copy_(s)
    return out


def _cfg(draw) -> dict:
    return {"rows": draw(st.sampled_from([8, 64, 200])), "custom": draw(st.booleans()),
            "check": draw(st.sampled_from([True, False])), "seed": draw(st.integers(0, 1)),
            "offset": draw(st.sampled_from([0, 1, 4])), "alias": draw(st.booleans()), "slots32": draw(st.booleans()),
            "x_dtype": draw(st.sampled_from([None, torch.float16, torch.float32])),
            "zero": draw(st.sampled_from([None, 0.0, -0.0]))}


def _call(name: str, cfg: dict):
    base = base_calls(cfg["rows"], cfg["custom"], cfg["check"], cfg["seed"], "cuda")[name]
    return variant(base, offset=cfg["offset"], alias=cfg["alias"], slots32=cfg["slots32"], x_dtype=cfg["x_dtype"],
                   zero=cfg["zero"])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES or ["none"]), data=st.data())
def test_replayed_calls_write_the_full_paths_bytes(name, data):
    replay.clear()
    recorded = _call(name, _cfg(data.draw))
    checked = _call(name, _cfg(data.draw))
    want = _written(checked, enabled=False)
    _written(recorded, enabled=True, repeats=2)  # a plan for the first variant's key
    got = _written(checked, enabled=True, repeats=3)  # replayed when the keys agree
    torch.cuda.synchronize()
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("name", NAMES)
def test_replayed_calls_captured_in_a_graph_write_the_full_paths_bytes(name):
    cfg = {"rows": 8, "custom": False, "check": True, "seed": 0, "offset": 0, "alias": False, "slots32": False,
           "x_dtype": None, "zero": None}
    fn = _call(name, cfg)
    want = _written(fn, enabled=False)
    held = tensors_of(fn)
    start = [t.clone() for t in held]
    replay.clear()
    for _ in range(3):  # counted, recorded, replayed
        fn()
    for t, s in zip(held, start):
        t.copy_(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    graph.replay()
    torch.cuda.synchronize()
    res = result if isinstance(result, (tuple, list)) else (result,)
    got = [_bytes(t) for t in held] + [_bytes(r) for r in res if isinstance(r, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_two_threads_on_two_streams_replay_their_own_calls():
    cfg = {"rows": 8, "custom": False, "check": True, "offset": 0, "alias": False, "slots32": False,
           "x_dtype": None, "zero": None}
    sets = [[_call(n, dict(cfg, seed=s)) for n in NAMES] for s in (0, 1)]
    wants = [[_written(f, enabled=False) for f in fns] for fns in sets]
    replay.clear()
    barrier, errors, gots = threading.Barrier(2), [], [None, None]

    def run(i):
        try:
            stream = torch.cuda.Stream()
            barrier.wait(timeout=60)
            with torch.cuda.stream(stream):
                gots[i] = [_written(f, enabled=True, repeats=4) for f in sets[i]]
            stream.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors
    for got, want in zip(gots, wants):
        assert all(len(g) == len(w) and all(torch.equal(a, b) for a, b in zip(g, w)) for g, w in zip(got, want))
