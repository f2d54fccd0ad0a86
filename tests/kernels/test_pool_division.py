"""The pooling's softmax division (kvformats_kernels.dsv4.pool_jit.div_by) against div_rn.

The compress kernels divide the window's exponentials by their sum with a reciprocal made once
per feature and three products per value, in place of one div.rn.f32 per value. It is only
right if it returns div_rn's bits, so on the GPU these tests compare the two directly on
operands built to be hard (all-ones mantissas, quotients near a rounding midpoint, the ends of
the range) and end to end (the compress kernels with the division on and off give the same
bytes, also for windows that take the exact fallback). The sequence is GPU code (inline PTX);
the interpreter divides with div_rn and never reaches it.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl

from kvformats_kernels.dsv4 import compress as K
from kvformats_kernels.dsv4 import pool_jit as pj

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (the division is inline PTX)")


@triton.jit
def _divide_kernel(a_ptr, b_ptr, fast_ptr, exact_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    a = tl.load(a_ptr + i, mask=live, other=1.0)
    b = tl.load(b_ptr + i, mask=live, other=1.0)
    tl.store(fast_ptr + i, pj.div_by(a, b, pj.recip_for_div(b)), mask=live)
    tl.store(exact_ptr + i, tl.math.div_rn(a, b), mask=live)


def divide(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fast, exact = torch.empty_like(a), torch.empty_like(a)
    block = 1024
    _divide_kernel[(triton.cdiv(a.numel(), block),)](a, b, fast, exact, a.numel(), BLOCK=block,
                                                    enable_fp_fusion=False)
    return fast, exact


def floats(exp_lo: int, exp_hi: int, n: int, g: torch.Generator, mantissa=None) -> torch.Tensor:
    """Positive float32 [n] with exponents uniform in [exp_lo, exp_hi) and random (or the given)
    mantissas, on the GPU."""
    e = torch.randint(exp_lo + 127, exp_hi + 127, (n,), generator=g, dtype=torch.int64)
    m = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int64) if mantissa is None else mantissa
    return ((e << 23) | m).to(torch.int32).view(torch.float32).cuda()


def near_midpoints(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) with a / b within a few ulps of q + ulp / 2 for random q, b: a = RN((q + ulp/2) * b)."""
    b = floats(0, 7, n, g).double()
    q = floats(-30, 0, n, g).double()
    ulp = torch.ldexp(torch.ones_like(q), torch.frexp(q).exponent - 24)
    a = ((q + ulp / 2) * b).float()
    return a, b.float()


@gpu
@pytest.mark.gpu
def test_div_by_equals_div_rn_on_hard_operands():
    g = torch.Generator().manual_seed(11)
    n = 1 << 22
    ones = torch.full((n,), (1 << 23) - 1, dtype=torch.int64)
    cases = {
        "softmax range": (floats(-60, 1, n, g), floats(0, 7, n, g)),
        "whole range": (floats(-60, 60, n, g), floats(-60, 60, n, g)),
        "b all-ones mantissa": (floats(-60, 1, n, g), floats(0, 7, n, g, mantissa=ones)),
        "a all-ones mantissa": (floats(-60, 1, n, g, mantissa=ones), floats(0, 7, n, g)),
        "b power of two": (floats(-60, 1, n, g), floats(0, 7, n, g, mantissa=torch.zeros(n, dtype=torch.int64))),
        "near midpoints": near_midpoints(n, g),
    }
    for name, (a, b) in cases.items():
        fast, exact = divide(a, b)
        bad = (fast.view(torch.int32) != exact.view(torch.int32)).sum().item()
        assert bad == 0, f"{name}: {bad} of {n} quotients differ from div_rn"


def _pool(state, ratio, positions, req, table, weight, fast_div: int) -> torch.Tensor:
    from kvformats_kernels import settings

    what = "kv" if ratio == 128 or weight.shape[0] > 128 else "index"
    with settings.changed("compress", (what, ratio), {**K.CONFIG[(what, ratio)], "fast_div": fast_div}):
        return K.pool_compressor_state(state, ratio, positions, req, table, None, weight, 1e-6)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("every", [1, 0], ids=["every token", "group ends"])
@pytest.mark.parametrize("ratio,h", [(4, 512), (4, 128), (128, 512)])
def test_pool_bits_with_and_without_the_fast_division(ratio, h, every):
    """The pooled rows are bit-equal either way, including windows that take the exact
    fallback: a missing first half (p = 3), scores spread by more than 41 (weights below
    2^-60), and a NaN score. Every token: the calls of several tokens per program; group
    ends: one token per program (HCA: its chunks split over programs)."""
    g = torch.Generator().manual_seed(ratio + h)
    rows, pages = 64 if ratio == 4 else 128, 64
    state = torch.randn(pages, rows, 2 * h * (2 if ratio == 4 else 1), generator=g).cuda()
    state[..., state.shape[-1] // 2:] *= 2.0
    state[3, :5, state.shape[-1] // 2:] *= 60.0  # a spread of a few hundred: tiny weights
    state[5, 7, -1] = float("nan")
    table = torch.randperm(pages, generator=g).reshape(2, pages // 2).cuda()
    span = rows * pages // 2
    step = 1 if every else ratio
    own = torch.arange(ratio - 1 if step > 1 else 0, span, step)
    positions = torch.cat([own, own]).cuda()
    req = torch.cat([torch.zeros(own.numel()), torch.ones(own.numel())]).long().cuda()
    weight = (torch.rand(h, generator=g) + 0.5).cuda()
    fast = _pool(state, ratio, positions, req, table, weight, 1)
    exact = _pool(state, ratio, positions, req, table, weight, 0)
    assert torch.equal(fast.view(torch.int32), exact.view(torch.int32))
    assert fast.isnan().any() and (fast != 0).any()
