"""The Triton encode kernels honour every numerics profile their package declares (spec/profiles.md):
kernel bytes == reference bytes for each (format, profile), and the profile-only helpers
(e2m1 round-half-even / signed zero, exact floor_log2) equal kvformats.numerics.codes element for element."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.codec import slot_ops as ops
from kvformats.numerics import codes as nx

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import kvformats_kernels as kk  # noqa: E402
from kvformats_kernels import numerics_jit as nj  # noqa: E402
from test_kernels import DEV, arena_cache, bits, encode_slots, padded, rows  # noqa: E402

CUDA = torch.cuda.is_available()
FORMATS = {"fp8_ds_mla": (64, 448.0), "fp8_ds_mla_v32": (128, 448.0), "fp8_indexer": (128, 448.0), "mxfp4_indexer": (32, 6.0)}
CASES = [(f, p) for f in FORMATS for p in kvf.supported_profiles()[f]]


@triton.jit
def _probe(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if OP == 0:
        r = nj.e2m1_code(x, True, True)
    elif OP == 1:
        r = nj.e2m1_code(x, True, False)
    elif OP == 2:
        r = nj.e2m1_code(x, False, True)
    else:
        r = nj.floor_log2(x)
    tl.store(out_ptr + offs, r, mask=m)


def _probe_run(op: int, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    _probe[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), OP=op, BLOCK=4096)
    return out


def _floats(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(9)
    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    rand = torch.randint(-(1 << 31), (1 << 31) - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    grid = torch.tensor([*nx.E2M1_THRESHOLDS, *nx.E2M1_VALUES, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 8.0])
    near = torch.cat([grid, torch.nextafter(grid, torch.zeros(())), torch.nextafter(grid, grid * 2)])
    x = torch.cat([every_bf16, rand.view(torch.float32), near, -near])
    return x


@pytest.mark.parametrize("op,rounding,signed_zero", [(0, "rne", True), (1, "rne", False), (2, "threshold", True)])
def test_e2m1_code_variants_match_numerics(op, rounding, signed_zero):
    x = _floats(1 << 15)
    got = _probe_run(op, x.to(DEV)).cpu()
    want = nx.e2m1_encode(x, rounding, signed_zero).to(torch.int32)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"first mismatch at {x[bad[0, 0]].item()!r}: {got[bad[0, 0]]} != {want[bad[0, 0]]}"


def test_floor_log2_matches_numerics():
    x = _floats(1 << 15).abs()
    x = torch.cat([x, torch.tensor([0.0, 1e-45, 2.0**-149, 2.0**-127, 2.0**-126, float("inf")])])
    x = x[~torch.isnan(x)]
    assert torch.equal(_probe_run(3, x.to(DEV)).cpu(), nx.floor_log2(x))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflowing numpy products
@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_encode_matches_reference_for_every_profile(fmt, profile, dtype):
    block, elem_max = FORMATS[fmt]
    layout = kvf.get_format(fmt, page_size=4, profile=profile)
    n, pages = 24, 8
    x = padded(rows(n, layout.head_dim, block, elem_max, dtype, seed=len(profile)).to(DEV))
    x[0, :block] = 0.0  # an all-zero block: the floors decide (OCP's floor 0 -> exponent_min)
    slots = encode_slots(n, pages * layout.page_size, seed=3)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, 5), arena_cache(layout, pages, 5)
    ops.encode_reference(layout, x, ref, slots)
    kk.IMPLEMENTATIONS[fmt].encode(layout, x, tri, slots)
    assert torch.equal(bits(arena_tri), bits(arena_ref)), "bytes differ (or a write strayed outside its rows)"


def test_every_profile_of_a_kernel_format_resolves_to_the_kernel():
    cuda = torch.device("cuda")
    for fmt, profile in CASES:
        lay = kvf.get_format(fmt, profile=profile)
        assert registry.resolve_for(lay, "encode", "triton", cuda) is kk.IMPLEMENTATIONS[fmt].encode


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_gpu_public_encode_per_profile(fmt, profile):
    block, elem_max = FORMATS[fmt]
    layout = kvf.get_format(fmt, page_size=64, profile=profile)
    n = 4096
    x = rows(n, layout.head_dim, block, elem_max, torch.bfloat16, seed=11).cuda()
    slots = torch.randperm(64 * 80)[:n].cuda()
    a, b = layout.allocate(80, device="cuda"), layout.allocate(80, device="cuda")
    layout.encode(x, a, slots, backend="triton")
    layout.encode(x, b, slots, backend="reference")
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
