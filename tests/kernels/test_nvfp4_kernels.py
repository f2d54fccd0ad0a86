"""nvfp4_ds_mla's Triton kernels == the reference, byte for byte (kvformats_kernels/nvfp4.py).

Without CUDA they run under the Triton interpreter (conftest) on CPU tensors; with CUDA the same
tests run compiled. Caches sit in sentinel-filled arenas with padded page strides (FlashMLA's
spare row per page among them), inputs in padded row views, so stray writes show.
"""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.codec import paged_ops as paged
from kvformats.codec import registry
from kvformats.codec import slot_ops as ops

triton = pytest.importorskip("triton")

import kvformats_kernels as kk  # noqa: E402  (after conftest chose interpreter or GPU)
from kvformats_kernels import nvfp4  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
SENTINEL = 0xA5
TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0)

LAYOUTS = {
    "default": kvf.Nvfp4DsMla(page_size=4),
    "192": kvf.Nvfp4DsMla(head_dim=192, rope_dim=64, page_size=3),
    "96-rope32": kvf.Nvfp4DsMla(head_dim=96, rope_dim=32, page_size=2),
    "264-rope8": kvf.Nvfp4DsMla(head_dim=264, rope_dim=8, page_size=5),
}


def _block(kind: int, g: torch.Generator) -> torch.Tensor:
    """16 values of one adversarial kind (float32, bf16-exact where it matters)."""
    k = int(torch.randint(-14, 9, (1,), generator=g))
    sign = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
    if kind == 0:  # random magnitudes, any scale
        return torch.randn(16, generator=g) * 10.0 ** float(torch.empty(1).uniform_(-5, 5, generator=g))
    if kind == 1:  # zeros, -0.0, tiny negatives
        return torch.where(torch.rand(16, generator=g) < 0.5, -0.0, 0.0) - (torch.rand(16, generator=g) < 0.3) * 1e-9
    if kind == 2:  # e2m1 ties at an exact scale 2^k (block max 6 * 2^k)
        v = torch.tensor(TIES)[torch.randint(0, len(TIES), (16,), generator=g)] * sign
        v[0] = 6.0
        return v * 2.0**k
    if kind == 3:  # a maximum whose amax / 6 rounds down in e4m3: the bump
        v = torch.randn(16, generator=g)
        v[3] = 6.0 * (1.0 + float(torch.randint(1, 8, (1,), generator=g)) / 256) * 2.0**k
        return v * 2.0**k / 8
    if kind == 4:  # saturated: amax / 6 at or above 448
        return torch.randn(16, generator=g) * 3000.0 * 2.0 ** int(torch.randint(0, 30, (1,), generator=g))
    if kind == 5:  # subnormal scales (amax / 6 below 2^-6), the floor
        return torch.randn(16, generator=g) * 2.0 ** float(torch.randint(-16, -6, (1,), generator=g))
    # float32 values on bf16 rounding ties
    v = torch.randn(16, generator=g).to(torch.bfloat16).float()
    return (v.view(torch.int32) | 0x8000).view(torch.float32) * 2.0**k


def rows(layout, n: int, seed: int, dtype, special: bool = False) -> torch.Tensor:
    """``[n, head_dim]`` rows: NoPE blocks of every kind, RoPE values over e4m3's whole range."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, layout.head_dim)
    nb = layout.num_blocks
    for i in range(n):
        for b in range(nb):
            x[i, 16 * b:16 * b + 16] = _block((i * nb + b) % 7, g)
    x[:, layout.nope_dim:] = torch.randn(n, layout.rope_dim, generator=g) * torch.exp2(
        torch.randint(-14, 12, (n, layout.rope_dim), generator=g).float())
    if special:  # non-finite blocks and RoPE dims (bf16 / fp32 keep them; fp16 is finite below)
        x[0, 0], x[1, 17], x[1, 20], x[2, 33] = float("nan"), float("inf"), float("-inf"), float("-inf")
        x[2, 34] = float("nan")
        x[0, layout.nope_dim:layout.nope_dim + 3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    x = x.to(dtype)
    if dtype == torch.float16:
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return x


def padded(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(t.shape[0], t.shape[1] + 24, dtype=t.dtype, device=t.device)
    wide[:, 5:5 + t.shape[1]] = t
    return wide[:, 5:5 + t.shape[1]]


def arena_cache(layout, pages: int, pad: int, fill: int | None = SENTINEL):
    """(arena, cache): a sentinel (or random) arena and a cache viewing it at offset 7 with page
    stride ``page_bytes + pad``."""
    stride = layout.page_bytes + pad
    total = max(pages - 1, 0) * stride + layout.page_bytes + 64
    if fill is None:
        raw = torch.randint(0, 256, (total,), generator=torch.Generator().manual_seed(pages), dtype=torch.uint8)
    else:
        raw = torch.full((total,), fill, dtype=torch.uint8)
    arena = raw.to(DEV)
    return arena, arena.as_strided((pages, layout.page_bytes), (stride, 1), 7)


def slots_for(n: int, capacity: int, seed: int) -> torch.Tensor:
    """Distinct slots with -1 holes and one beyond the capacity (skipped by every backend)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randperm(capacity, generator=g)[:n]
    s[torch.rand(n, generator=g) < 0.2] = -1
    s[-1] = capacity + 3
    return s.to(torch.int32 if seed % 2 else torch.int64).to(DEV)


def same_bytes_nan_signs_aside(layout, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal arenas, except that an e4m3 NaN RoPE byte may carry either sign (the sign of a NaN
    after the input's bf16 rounding, which spec/nan-policy.md §1.3 leaves open)."""
    differ = got != want
    nan_both = ((got & 0x7F) == 0x7F) & ((want & 0x7F) == 0x7F)
    return not bool((differ & ~nan_both).any())


def assert_same_values(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
    assert torch.equal(nan_a, nan_b)
    assert torch.equal(a.view(torch.int16)[~nan_a], b.view(torch.int16)[~nan_b])


def encode_both(layout, x: torch.Tensor, pad: int, seed: int):
    n = x.shape[0]
    pages = n // layout.page_size + 2
    slots = slots_for(n, pages * layout.page_size, seed)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, pad), arena_cache(layout, pages, pad)
    ops.encode_reference(layout, x, ref, slots)
    nvfp4.encode(layout, x, tri, slots)
    return arena_ref, arena_tri, ref


# ----------------------------------------------------------------------------- registration


@pytest.mark.parametrize("op", ["encode", "decode", "gather", *paged.PAGED_OPS])
def test_registered_for_every_op(op):
    assert kk.IMPLEMENTATIONS["nvfp4_ds_mla"] is nvfp4
    assert registry.resolve("nvfp4_ds_mla", op, "triton", torch.device("cuda")) is getattr(nvfp4, op)
    assert kk.kernel_profiles()["nvfp4_ds_mla"] == ("flashmla",)


def test_constants_read_off_the_layout():
    c = nvfp4._geometry(kvf.Nvfp4DsMla())
    offsets = (c["NOPE_OFF"], c["NOPE_STRIDE"], c["ROPE_OFF"], c["SCALE_OFF"], c["SCALE_STRIDE"])
    assert offsets == (0, 352, 256, 320, 352)
    assert (c["NB"], c["QB"], c["QUADS"], c["COLS"], c["ROPE"], c["NOPE"]) == (32, 16, 4, 8, 64, 512)


# ----------------------------------------------------------------------------- encode


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pad", [0, 37])
def test_encode_matches_reference(name, dtype, pad):
    layout = LAYOUTS[name]
    x = padded(rows(layout, 14, seed=len(name) + pad, dtype=dtype).to(DEV))
    arena_ref, arena_tri, _ = encode_both(layout, x, pad, seed=pad + 1)
    assert torch.equal(arena_tri, arena_ref), "bytes differ (or a write strayed outside its rows)"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_encode_non_finite_blocks_match_reference(dtype):
    """NaN blocks (scale 0x7F, nibbles 0x7), ±Inf blocks (scale 448), non-finite RoPE dims;
    FlashMLA's spare row per page as the page stride."""
    layout = LAYOUTS["default"]
    x = rows(layout, 6, seed=3, dtype=dtype, special=True).to(DEV)
    arena_ref, arena_tri, _ = encode_both(layout, x, layout.row_bytes, seed=4)
    assert same_bytes_nan_signs_aside(layout, arena_tri, arena_ref)


def test_encode_of_an_empty_cache_and_no_rows():
    layout = LAYOUTS["192"]
    cache = layout.allocate(0, device=DEV)
    nvfp4.encode(layout, rows(layout, 3, 0, torch.bfloat16).to(DEV), cache, torch.arange(3, device=DEV))
    cache = layout.allocate(1, device=DEV)
    nvfp4.encode(layout, torch.zeros(0, layout.head_dim, device=DEV), cache, torch.zeros(0, dtype=torch.int64,
                                                                                          device=DEV))
    assert not cache.any()


# ----------------------------------------------------------------------------- reads


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("pad", [0, 11])
def test_decode_and_gather_match_reference(name, pad):
    layout = LAYOUTS[name]
    x = rows(layout, 10, seed=5, dtype=torch.float32, special=name == "default").to(DEV)
    _, _, cache = encode_both(layout, x, pad, seed=6)
    g = torch.Generator().manual_seed(7)
    slots = torch.randint(-1, cache.shape[0] * layout.page_size + 2, (34,), generator=g).to(DEV)[::2]
    assert torch.equal(nvfp4.gather(layout, cache, slots), ops.gather_reference(layout, cache, slots))
    assert_same_values(nvfp4.decode(layout, cache, slots), ops.decode_reference(layout, cache, slots))


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's inf products
def test_decode_arbitrary_bytes(name):
    """Every byte pattern (NaN and negative scales, NaN RoPE codes) decodes like the reference."""
    layout = LAYOUTS[name]
    _, cache = arena_cache(layout, 3, 5, fill=None)
    slots = torch.arange(-1, 3 * layout.page_size + 1, device=DEV)
    assert_same_values(nvfp4.decode(layout, cache, slots), ops.decode_reference(layout, cache, slots))
    assert torch.equal(nvfp4.gather(layout, cache, slots), ops.gather_reference(layout, cache, slots))


@pytest.mark.parametrize("name", ["default", "264-rope8"])
@pytest.mark.parametrize("with_glen,with_base", [(True, True), (False, False)])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dequantize_gather_matches_reference(name, with_glen, with_base):
    layout = LAYOUTS[name]
    pages, requests, width, offset = 7, 4, 13, 2
    _, cache = arena_cache(layout, pages, 5, fill=None)
    seq = torch.tensor([9, 30, 4, 11]) if with_glen else torch.tensor([9, 11, 0, 5])
    glen = torch.tensor([6, 11, 0, 11]).to(DEV) if with_glen else None
    base = torch.tensor([0, 3, 1, 2]).to(DEV) if with_base else None
    table = torch.randint(-1, pages + 2, (requests, 18), generator=torch.Generator().manual_seed(2)).to(DEV)
    out = torch.full((requests, width, layout.head_dim), -7.0, dtype=torch.bfloat16, device=DEV)
    want = out.clone()
    paged.dequantize_gather_reference(layout, cache, want, table, seq.to(DEV), glen, base, offset)
    nvfp4.dequantize_gather(layout, cache, out, table, seq.to(DEV), glen, base, offset)
    assert_same_values(out, want)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_decode_topk_and_gather_paged_match_reference():
    layout = LAYOUTS["192"]
    _, cache = arena_cache(layout, 4, 3, fill=None)
    topk = torch.randint(-1, 4 * layout.page_size, (3, 5), generator=torch.Generator().manual_seed(1)).to(DEV)
    assert_same_values(nvfp4.decode_topk(layout, cache, topk), paged.decode_topk_reference(layout, cache, topk))
    table = torch.tensor([[1, 0, 3], [2, -1, 0]], device=DEV)
    cu = torch.tensor([0, 5, 8], device=DEV)
    got = [torch.full((9, layout.row_bytes), SENTINEL, dtype=torch.uint8, device=DEV)]
    want = [g.clone() for g in got]
    nvfp4.gather_paged(layout, cache, got, table, cu)
    paged.gather_paged_reference(layout, cache, want, table, cu)
    assert torch.equal(got[0], want[0])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (backend='triton' refuses CPU tensors)")
def test_public_api_takes_the_kernels_where_asked():
    """backend="triton" through the public ops gives the reference's bytes and values."""
    layout = LAYOUTS["default"]
    x = rows(layout, 5, seed=9, dtype=torch.bfloat16).to(DEV)
    slots = torch.tensor([0, 9, 3, -1, 15], device=DEV)
    ref, tri = layout.allocate(4, device=DEV), layout.allocate(4, device=DEV)
    layout.encode(x, ref, slots, backend="reference")
    layout.encode(x, tri, slots, backend="triton")
    assert torch.equal(tri, ref)
    assert_same_values(layout.decode(tri, slots, backend="triton"), layout.decode(ref, slots, backend="reference"))
