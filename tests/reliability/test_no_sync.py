"""No host synchronization in the default mode of any public op (issue: serving-grade hot path).

On a GPU every prepared call of ``tests.harness.calls.public_calls`` runs under
``torch.cuda.set_sync_debug_mode("error")``, eagerly and captured in a CUDA graph, through the
public functions and through the ``torch.library`` custom ops. On the CPU (CI) the same calls
run with the GPU's default check path (``device_mode``) and must leave the error record clear;
``tests/test_deferred.py`` guards the validation path with meta tensors.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from tests.harness.calls import public_calls

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.mark.parametrize("custom", [False, True], ids=["api", "custom_ops"])
def test_every_public_call_runs_and_records_nothing_on_valid_input(custom, device_mode):
    calls = public_calls("cpu", rows=8, custom=custom)
    assert len(calls) >= 40
    for name, call in calls.items():
        call()
        err = kvf.pending_error("cpu")
        assert err is None, f"{name} recorded {err} on valid input"


def _under_sync_errors(fn) -> str | None:
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as err:
        return str(err).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return None


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("custom", [False, True], ids=["api", "custom_ops"])
@pytest.mark.parametrize("rows", [64, 8192])
def test_default_calls_never_synchronize(rows, custom):
    calls = public_calls("cuda", rows, custom=custom)
    for call in calls.values():  # compile the kernels and allocate the error record first
        call()
    torch.cuda.synchronize()
    eager = {name: err for name, call in calls.items() if (err := _under_sync_errors(call))}
    captured = {}
    for name, call in calls.items():
        graph = torch.cuda.CUDAGraph()

        def capture(call=call, graph=graph):
            with torch.cuda.graph(graph):
                call()
            graph.replay()

        if err := _under_sync_errors(capture):
            captured[name] = err
    torch.cuda.synchronize()
    assert not eager, f"eager calls synchronized: {eager}"
    assert not captured, f"captured calls synchronized: {captured}"
    assert kvf.pending_error("cuda") is None


@gpu
@pytest.mark.gpu
def test_a_bad_slot_on_the_gpu_is_recorded_without_synchronizing():
    lay = kvf.Fp8DsMla(page_size=64)
    cache = lay.allocate(2, device="cuda")
    x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([0, 500, 2], device="cuda")
    lay.encode(x, cache, torch.tensor([0, 1, 2], device="cuda"))  # warm-up
    before = cache.clone()
    assert _under_sync_errors(lambda: lay.encode(x, cache, slots)) is None
    with pytest.raises(kvf.InputError, match=r"encode: slots\[1\] = 500 is beyond the cache's capacity of 128"):
        kvf.raise_pending("cuda")
    assert kvf.pending_error("cuda") is None
    rows = lay.gather(cache, torch.tensor([0, 2], device="cuda"))
    assert torch.equal(rows, lay.gather(before, torch.tensor([0, 2], device="cuda")))
    with pytest.raises(kvf.InputError, match="beyond the cache's capacity"):
        lay.encode(x, cache, slots, check="strict")
