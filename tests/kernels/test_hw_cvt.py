"""On the GPU the kernels may use the hardware float8 / bf16 conversions (``HW`` in numerics_jit,
``hw_cvt`` in the kernel configs): they must give exactly the integer helpers' results, which
tests/kernels/test_kernels.py checks against kvformats.numerics.codes. Compared here on every bf16
pattern, 2^22 random float32 patterns, the e4m3 rounding midpoints and all 256 e4m3 bytes."""

from __future__ import annotations

import pytest
import torch

from kvformats.numerics import codes as nx

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from kvformats_kernels import _common as cm  # noqa: E402
from kvformats_kernels import numerics_jit as nj  # noqa: E402
from kvformats_kernels.dsv4 import query_jit as qj  # noqa: E402

CUDA = torch.cuda.is_available()


@triton.jit
def _both(x_ptr, hw_ptr, sw_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if OP == 0:
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        hw, sw = nj.e4m3_code(x, True), nj.e4m3_code(x, False)
    elif OP == 1:
        b = tl.load(x_ptr + offs, mask=m, other=0)
        hw, sw = nj.f32_bits(nj.e4m3_to_f32(b, True)), nj.f32_bits(nj.e4m3_to_f32(b, False))
    elif OP == 2:
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        hw, sw = nj.bf16_bits(x, True), nj.bf16_bits(x, False)
    elif OP == 3:  # the query kernels' fast-path bf16 rounding (values that are not NaN)
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        hw, sw = nj.f32_bits(qj.bf16_value(x, False, True)), nj.f32_bits(qj.bf16_value(x, False, False))
    elif OP == 4:  # ... two values per conversion (the MXFP4 prep)
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        hw, sw = nj.f32_bits(qj.bf16_value(x, False, True, True)), nj.f32_bits(qj.bf16_value(x, False, False))
    else:  # the MXFP4 prep's e2m1 words (f16 pairs) against eight short codes (x: 8 per word)
        j = tl.arange(0, 8)
        y = tl.load(x_ptr + 8 * offs[:, None] + j[None, :], mask=m[:, None], other=0.0)
        hw = tl.reshape(nj.e2m1_words_hw(y), (BLOCK,))
        sw = tl.sum(nj.e2m1_code_short(y) << (4 * j)[None, :], axis=1)
    tl.store(hw_ptr + offs, hw, mask=m)
    tl.store(sw_ptr + offs, sw, mask=m)


def _run(op: int, x: torch.Tensor):
    n = x.numel() // 8 if op == 5 else x.numel()  # op 5 reads eights
    hw = torch.empty(n, dtype=torch.int32, device=x.device)
    sw = torch.empty_like(hw)
    _both[(triton.cdiv(n, 4096),)](x, hw, sw, n, OP=op, BLOCK=4096)
    return hw, sw


def _floats() -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    rand = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 22,), generator=g, dtype=torch.int64).to(torch.int32)
    grid = nx.e4m3_decode(torch.arange(0, 0x7F, dtype=torch.uint8))
    mids = (grid[1:] + grid[:-1]) / 2
    return torch.cat([every_bf16, rand.view(torch.float32), mids, -mids, torch.tensor([448.0, 464.0, 1e30, -1e30])])


def test_hw_cvt_is_off_under_the_interpreter(monkeypatch):
    from kvformats_kernels.settings import SETTINGS

    monkeypatch.setattr(SETTINGS, "interpret", True)  # read once at import (settings' module doc)
    assert not cm.hw_cvt({"hw_cvt": 1})
    monkeypatch.setattr(SETTINGS, "interpret", False)
    assert cm.hw_cvt({"hw_cvt": 1}) and not cm.hw_cvt({})


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_hw_e4m3_encode_equals_integer_rounding():
    x = _floats()
    x = x[~torch.isnan(x)].cuda()
    hw, sw = _run(0, x)
    bad = (hw != sw).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} differ; first x bits {hex(int(x.view(torch.int32)[bad[0, 0]]))}"
    nan = torch.tensor([float("nan"), -float("nan")], device="cuda")
    hw, _ = _run(0, nan)
    assert ((hw & 0x7F) == 0x7F).all()  # NaN stays a NaN code (sign free)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_hw_e4m3_decode_and_bf16_rounding_equal_integer_paths():
    b = torch.arange(256, dtype=torch.uint8, device="cuda")
    hw, sw = _run(1, b)
    nan = ((b & 0x7F) == 0x7F)
    assert torch.equal(hw[~nan], sw[~nan]) and torch.isnan(hw[nan].view(torch.float32)).all()
    x = _floats().cuda()
    hw, sw = _run(2, x)
    isnan = torch.isnan(x)
    assert torch.equal(hw[~isnan], sw[~isnan])
    assert (((hw[isnan] & 0x7F80) == 0x7F80) & ((hw[isnan] & 0x7F) != 0)).all()  # a bf16 NaN


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_query_fast_bf16_rounding_equals_integer_path():
    """``query_jit.bf16_value``'s hardware path (not SAFE: values that are not NaN) against its
    integer path, on every bf16 pattern, 2^22 random float32 patterns and the e4m3 midpoints."""
    x = _floats()
    x = x[~torch.isnan(x)].cuda()
    for op in (3, 4):  # one value per conversion, two
        hw, sw = _run(op, x)
        bad = (hw != sw).nonzero()
        first = hex(int(x.view(torch.int32)[bad[0, 0]])) if bad.numel() else None
        assert bad.numel() == 0, f"op {op}: {bad.numel()} differ; first x bits {first}"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_e2m1_words_equal_eight_short_codes():
    """``numerics_jit.e2m1_words_hw`` (f16 pairs, inline PTX) against ``e2m1_code_short`` on every
    finite bf16 value below 7 in magnitude (the short code's inputs: a bf16 value times a power of
    two), in eight random orders, and the thresholds."""
    every = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    v = every[torch.isfinite(every) & (every.abs() < 7)]
    edges = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 6.5, 0.0, 2.0 ** -20, 2.0 ** -126, 2.0 ** -133])
    v = torch.cat([v, edges, -edges])
    v = torch.cat([v, torch.zeros(-v.numel() % 8)])  # whole words
    g = torch.Generator().manual_seed(9)
    for _ in range(8):
        x = v[torch.randperm(v.numel(), generator=g)].cuda()
        hw, sw = _run(5, x)
        bad = (hw != sw).nonzero()
        first = x[8 * bad[0, 0]:8 * bad[0, 0] + 8].tolist() if bad.numel() else None
        assert bad.numel() == 0, f"{bad.numel()} words differ; first eight {first}"
    assert int((hw < 0).sum()) > 0  # sign bits and high codes reached the top nibble
