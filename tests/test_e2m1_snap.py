"""Why the fp4_ds_mla_v41 GPU encode may multiply by a block's reciprocal scale: its lane
arithmetic (kvformats_kernels.numerics_jit.e2m1_rne_words, PTX) replayed here in numpy on
every bf16 x and every e4m3 scale s the encode can choose (2^-9 .. 448, subnormal scales
included) gives exactly the
reference's e2m1(fl32(x / s)). The same pairs go through the real PTX in
tests/kernels/test_fp4_words_hw.py on a GPU; this test keeps the argument checkable without
one and fails if a step of it (the f16 snap, the kept-bit tie rule, the clamp) is changed, or
if the reciprocal's error it allows (2 ulps) is not enough."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvformats.numerics import codes as nx


def _lanes(y: np.ndarray) -> np.ndarray:
    """The PTX's per-lane steps on float32 y: nibble codes (uint8)."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = y.astype(np.float16)  # cvt.rn.f16x2.f32
    hb = h.view(np.uint16).astype(np.int32)
    m = np.minimum(hb & 0x7FFF, 0x4600)  # and, min.u16x2 (6.0)
    lt = m < 0x3C00  # set.lt.f16x2 against 1.0
    mh = m.astype(np.uint16).view(np.float16)
    a1 = np.where(lt, mh + np.float16(1.0), mh).astype(np.float16).view(np.uint16).astype(np.int32)
    t = a1 + ((a1 >> 9) & 1) - np.where(lt, 0x400, 0) - 0x3701
    assert ((t >= 0) & (t < 0x1000)).all()  # no lane borrows or carries into its neighbour
    code = (t >> 9) & 7
    return (code | ((hb >> 15) << 3)).astype(np.uint8)  # NaN: some code (the encode zeroes NaN blocks)


@pytest.mark.parametrize("ulps", [-2, 0, 2])
def test_reciprocal_product_snapped_to_f16_gives_the_division_codes(ulps):
    """r = fl32(1 / s) moved by ``ulps`` (the GPU's rcp.approx is within one)."""
    every_bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    s = nx.e4m3_decode(torch.arange(0x01, 0x7F, dtype=torch.uint8)).numpy()
    x = np.tile(every_bf16, s.size)
    per_value = np.repeat(s, every_bf16.size)
    r = ((np.float32(1) / s).view(np.int32) + ulps).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x * np.repeat(r, every_bf16.size)  # fl32(x * r)
    got = _lanes(y)
    q = torch.from_numpy(x) / torch.from_numpy(per_value)
    want = nx.e2m1_encode(q, "rne", True).numpy()
    live = ~np.isnan(q.numpy())
    bad = np.flatnonzero((got != want) & live)
    assert bad.size == 0, f"{bad.size} differ; first x={x[bad[0]]} s={per_value[bad[0]]}"
    # the pairs reach every code, both signs, the midpoints and the clamp
    assert set(np.unique(got[live]).tolist()) == set(range(16))
    ties = np.isin(np.abs(q.numpy()), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert ties.sum() > 1000


def test_without_the_snap_the_reciprocal_product_misses_midpoints():
    """The f16 conversion is what makes the reciprocal safe: the same codes taken from the
    unsnapped float32 product (round half even on its bits) differ at midpoints."""
    s = np.float32(nx.e4m3_decode(torch.tensor([0x0F], dtype=torch.uint8)).item())  # 0.029296875: 1/s inexact
    x = np.float32(1.25) * s  # a bf16 value: x / s is the midpoint 1.25
    y = x * (np.float32(1) / s)
    assert y > np.float32(1.25)  # the product lands above the midpoint
    assert int(nx.e2m1_encode(torch.tensor([y]), "rne", True)) == 3  # unsnapped: 1.5, the wrong code
    assert _lanes(np.array([y], dtype=np.float32))[0] == 2  # snapped: the tie goes to 1.0, as x / s does
