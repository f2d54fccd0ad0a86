"""The Triton reads of ue8m0 scales (decode, decode_topk, dequantize_gather of fp8_ds_mla and
mxfp4_indexer) read scale byte 0xFF as the layout's profile says (tokenspeed: +Inf; the others:
NaN), equal to the reference and to the oracles of tests/test_ue8m0_ff.py: NaN at the same
positions, every other value (±Inf included) bit for bit.

Without CUDA they run under the Triton interpreter (integer rounding); with CUDA compiled, on
the GPU's conversions (HW), and the ``gpu`` test goes through the public API.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import kvformats as kvf
from kvformats.codec import paged_ops as paged
from kvformats.codec import slot_ops as ops
from kvformats.codec.rows import write_rows
from tests.harness.capabilities import require

triton = pytest.importorskip("triton")

import kvformats_kernels as kk  # noqa: E402  (after conftest chose interpreter or GPU)

from ue8m0_ff_oracle import CASES, ORACLES, READING, assert_reads, ff_rows  # noqa: E402  (tests/, as conftest's folder)

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
# the interpreter's numpy products: 0 * Inf and code * 2^128
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")


def layout_of(fmt: str, profile: str, page_size: int = 2):
    if fmt == "fp8_ds_mla":  # 4 NoPE blocks and a RoPE tail one block wide (the one-tile body)
        return kvf.get_format(fmt, head_dim=320, rope_dim=64, page_size=page_size, profile=profile)
    return kvf.get_format(fmt, head_dim=128, page_size=page_size, profile=profile)


def filled(layout, seed: int, device=DEV):
    """(cache, rows [N, row_bytes], oracle values [N, head_dim] float32) with ff_rows at slots 0..N-1."""
    rows = ff_rows(layout, seed)
    n = rows.shape[0]
    cache = layout.allocate((n + layout.page_size - 1) // layout.page_size, device=device)
    write_rows(layout, cache, torch.arange(n, device=device), rows.to(device))
    reading = layout.numerics.ue8m0_ff
    want = np.stack([ORACLES[layout.name](layout, r.numpy(), reading) for r in rows])
    return cache, rows, want


@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_kernel_decode_reads_ff_as_the_profile_says(fmt, profile):
    layout = layout_of(fmt, profile)
    assert layout.numerics.ue8m0_ff == READING[(fmt, profile)]
    cache, rows, want = filled(layout, seed=len(profile))
    slots = torch.tensor([0, 5, -1, 1, 2, 3, 4, 0], device=DEV)
    got = kk.IMPLEMENTATIONS[fmt].decode(layout, cache, slots)
    ref = ops.decode_reference(layout, cache, slots)
    live = (slots >= 0).cpu()
    assert_reads(got[live], want[slots.cpu()[live].numpy()])
    assert_reads(got, ref.float().cpu().numpy())
    assert not bool(got[~live].view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32).any())
    topk = slots.reshape(2, 4)
    assert_reads(kk.IMPLEMENTATIONS[fmt].decode_topk(layout, cache, topk),
                 paged.decode_topk_reference(layout, cache, topk).float().cpu().numpy())


@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_kernel_dequantize_gather_reads_ff_as_the_profile_says(fmt, profile):
    layout = layout_of(fmt, profile)
    cache, rows, want = filled(layout, seed=len(profile) + 1)
    n = rows.shape[0]
    table = torch.tensor([[0, 1, 2], [2, 0, -1]], device=DEV)
    seq = torch.tensor([n, 4], device=DEV)
    out = torch.zeros((2, n + 1, layout.head_dim), dtype=layout.decode_dtype, device=DEV)
    ref = out.clone()
    kk.IMPLEMENTATIONS[fmt].dequantize_gather(layout, cache, out, table, seq, None, None, 1)
    paged.dequantize_gather_reference(layout, cache, ref, table, seq, None, None, 1)
    assert_reads(out[0, 1:], want)  # request 0: slots 0..n-1 through pages 0, 1, 2
    assert_reads(out[1, 1:5], want[[4, 5, 0, 1]])  # request 1: pages 2, 0
    assert_reads(out, ref.float().cpu().numpy())


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_gpu_public_reads_ff_as_the_profile_says(fmt, profile):
    """Compiled, through the public API (backend="triton"), at the default geometry."""
    layout = kvf.get_format(fmt, profile=profile)
    cache, rows, want = filled(layout, seed=7)
    slots = torch.arange(rows.shape[0], device=DEV)
    assert_reads(layout.decode(cache, slots, backend="triton"), want)
    assert_reads(layout.decode_topk(cache, slots[None], backend="triton")[0], want)
    out = torch.zeros((1, rows.shape[0], layout.head_dim), dtype=layout.decode_dtype, device=DEV)
    layout.dequantize_gather(cache, out, block_table=torch.tensor([[0]], device=DEV),
                             seq_lens=torch.tensor([rows.shape[0]], device=DEV), backend="triton")
    assert_reads(out[0], want)


def _e8m0_formats() -> list[str]:
    return [f for f in kvf.list_formats() if any(
        v.dtype == torch.float8_e8m0fnu for v in kvf.get_format(f).views(kvf.get_format(f).allocate(1)).values())]


@pytest.mark.parametrize("fmt", _e8m0_formats())
def test_every_ue8m0_format_kernel_reads_ff_as_its_reference(fmt):
    """Every registered format with ue8m0 scales (found from its regions, so a new one is covered
    without an edit here): a kernel decode of rows whose scale bytes are partly 0xFF equals the
    reference decode, NaN at the same positions and every other value bit for bit."""
    require(fmt, "kernels", op="decode")
    layout = kvf.get_format(fmt)
    n = 2 * layout.page_size
    cache = layout.allocate(2, device=DEV)
    slots = torch.arange(n, device=DEV)
    x = torch.randn(n, layout.head_dim, generator=torch.Generator().manual_seed(1)).to(DEV)
    ops.encode(layout, x, cache, slots, backend="reference")
    for v in layout.views(cache).values():
        if v.dtype == torch.float8_e8m0fnu:
            v.view(torch.uint8)[..., 0] = 0xFF
            v.view(torch.uint8)[0, 1] = 0xFF
    want = ops.decode(layout, cache, slots, backend="reference").float()
    got = kk.IMPLEMENTATIONS[fmt].decode(layout, cache, slots).float()
    assert torch.isnan(want).any() or torch.isinf(want).any()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.nan_to_num(got, 0.0), torch.nan_to_num(want, 0.0))
