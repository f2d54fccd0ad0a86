"""The DeepSeek V4 transform device functions (kvformats_kernels/dsv4/transforms_jit.py) against
the torch references: RoPE and the Hadamard butterfly bit for bit, RMSNorm within float32
rounding of the sum (compiled on a GPU, under the interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from kvformats.deepseek_v4.rope import cos_sin_cache, rope_tail
from kvformats.deepseek_v4.transforms import hadamard_reference, rms_norm

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from kvformats_kernels.dsv4 import transforms_jit as tj  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@triton.jit
def _apply(x_ptr, pos_ptr, cs_ptr, out_ptr, cs_stride, eps, D: tl.constexpr, ROPE: tl.constexpr,
           LOG2_D: tl.constexpr, BM: tl.constexpr, MODE: tl.constexpr):
    r = tl.arange(0, BM)
    c = tl.arange(0, D)
    x = tl.load(x_ptr + r[:, None] * D + c[None, :])
    if MODE == 0:
        y = tj.hadamard_rows(x, LOG2_D)
    elif MODE == 3:
        y = tj.rms_rows(x, eps, D)
    else:
        y = tj.rope_rows(x, tl.load(pos_ptr + r).to(tl.int64), cs_ptr, cs_stride, D, ROPE, MODE == 2)
    tl.store(out_ptr + r[:, None] * D + c[None, :], y)


def _run(x, mode, pos=None, cs=None, eps=1e-6):
    bm, d = x.shape
    out = torch.empty_like(x)
    pos = x if pos is None else pos
    cs = x if cs is None else cs
    _apply[(1,)](x, pos, cs, out, cs.stride(0), eps, D=d, ROPE=cs.shape[1] if cs is not x else 0,
                 LOG2_D=d.bit_length() - 1, BM=bm, MODE=mode, enable_fp_fusion=False)
    return out


@pytest.mark.parametrize("d", [8, 64, 128])
def test_hadamard_butterfly_bit_exact(d):
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(8, d, generator=g) * 10.0 ** torch.randint(-3, 4, (8, 1), generator=g)).to(torch.bfloat16)
    x = x.float().to(DEV)
    got = _run(x, 0)
    want = hadamard_reference(x, 1.0).float()  # scale 1: the unscaled sums, rounded to bf16
    assert torch.equal(got.to(torch.bfloat16).float(), want)


@pytest.mark.parametrize("inverse", [False, True])
def test_rope_rows_bit_exact_and_nope_untouched(inverse):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 128, generator=g)
    x[0, :4] = -0.0  # NoPE signed zeros pass through
    x[1, 64:70] = torch.tensor([-0.0, 0.0, 3e38, -3e38, 1e-40, -1e-40])
    x[0, 64:72] = torch.tensor([-0.0, -0.0, 0.0, -0.0, -0.0, 0.0, 0.0, 0.0])  # at position 0: sin = +-0
    cs = cos_sin_cache(64, 4096)
    pos = torch.tensor([0, 1, 4095, 17, 64, 63, 1000, 2047])
    got = _run(x.to(DEV), 2 if inverse else 1, pos.to(DEV), cs.to(DEV)).cpu()
    want = rope_tail(x, pos, cs, inverse=inverse)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_rms_rows_within_sum_rounding():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(8, 512, generator=g) * torch.tensor([1e-3, 1.0, 1e3, 7.0, 1e-20, 1e20, 0.5, 2.0])[:, None]
    got = _run(x.to(DEV), 3).cpu()
    want = rms_norm(x, None, 1e-6)
    assert torch.allclose(got, want, rtol=4e-7 * 8, atol=0)
