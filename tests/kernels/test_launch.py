"""kvformats_kernels.launch: the direct launch path keys compiled kernels by every fact that
changes the compiled code, and gives the bytes Triton's own launch gives."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from kvformats_kernels import launch, triton_abi  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


@triton.jit
def axpy_kernel(x, y, out, n, shift, BLOCK: tl.constexpr, K: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m) * K + tl.load(y + i, mask=m) + shift, mask=m)


def test_keys_tell_apart_every_specialization():
    base = torch.zeros(64, dtype=torch.float32)
    assert launch._arg_key(base) != launch._arg_key(base[1:]), "16-byte alignment"
    assert launch._arg_key(base) != launch._arg_key(base.to(torch.float16)), "dtype"
    keys = {launch._arg_key(v) for v in (1, 16, 17, 2 ** 31, -(2 ** 31) - 1, 0)}
    assert len(keys) == 5  # 0 and 16 share (int32, not 1, multiple of 16)
    assert launch._arg_key(1.5) != launch._arg_key(1) and launch._arg_key(None) == type(None)


def test_launch_hooks_count_as_set_only_when_something_is_in_them():
    class Chain:  # Triton 3.6's HookChain keeps its hooks in .calls
        def __init__(self, calls):
            self.calls = calls

    ours = triton_abi._refuse_outside  # the recording's watch is not a request to see launches
    assert not triton_abi._chain_calls(None, ours) and not triton_abi._chain_calls(Chain([]), ours)
    assert not triton_abi._chain_calls(Chain([ours]), ours) and not triton_abi._chain_calls(ours, ours)
    assert triton_abi._chain_calls(Chain([print]), ours) and triton_abi._chain_calls(print, ours)
    assert launch.LAUNCHER.hooks_set() is False  # nothing in this process set a hook


def test_fast_is_one_wrapper_per_kernel_and_launches_like_triton():
    fk = launch.fast(axpy_kernel)
    assert launch.fast(axpy_kernel) is fk
    x, y = torch.randn(300, device=DEV), torch.randn(300, device=DEV)
    # three specializations: (aligned, n not a multiple of 16), (unaligned, ...), (aligned, n multiple of 16)
    for off, n in ((0, 300), (1, 299), (4, 256)):
        want, got = torch.full_like(x, 7.0), torch.full_like(x, 7.0)
        axpy_kernel[(3,)](x[off:], y[off:], want[off:], n, 2, BLOCK=128, K=3)
        for _ in range(2):  # the second launch of a specialization takes the direct path
            fk[(3,)](x[off:], y[off:], got[off:], n, 2, BLOCK=128, K=3)
        assert torch.equal(want, got)
    assert fk.direct == (CUDA and not launch.SETTINGS.interpret and launch.LAUNCHER.verified)
    if fk.direct:
        assert len(fk.compiled) == 3


def test_runtime_arguments_by_keyword_are_refused_in_tests():
    assert launch._runtime_names(axpy_kernel) == {"x", "y", "out", "n", "shift"}
    fk = launch.FastKernel(axpy_kernel)
    x = torch.randn(300, device=DEV)
    with pytest.raises(TypeError, match=r"runtime arguments \['shift'\] passed by keyword"):
        fk[(3,)](x, x, torch.zeros_like(x), 300, shift=2, BLOCK=128, K=3)


def test_runtime_arguments_by_keyword_are_never_kept(monkeypatch):
    monkeypatch.setattr(launch, "STRICT_CALL_SITES", False)
    fk = launch.FastKernel(axpy_kernel)
    x, y = torch.randn(300, device=DEV), torch.randn(300, device=DEV)
    want, got = torch.zeros_like(x), torch.zeros_like(x)
    axpy_kernel[(3,)](x, y, want, 300, 2, BLOCK=128, K=3)
    for _ in range(3):
        fk[(3,)](x, y, got, 300, shift=2, BLOCK=128, K=3)
    assert torch.equal(want, got) and fk.compiled == {}


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
def test_direct_launches_capture_in_a_graph():
    fk = launch.fast(axpy_kernel)
    x, y, out = (torch.randn(1000, device="cuda") for _ in range(3))
    fk[(8,)](x, y, out, 1000, 1, BLOCK=128, K=2)
    fk[(8,)](x, y, out, 1000, 1, BLOCK=128, K=2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fk[(8,)](x, y, out, 1000, 1, BLOCK=128, K=2)
    out.zero_()
    x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2 + y + 1)
