"""compressor_state_v41's Triton kernels (kvformats_kernels/state.py with APE=False) == the
reference, bit for bit: encode, decode and gather, under the Triton interpreter on CPU (compiled
with CUDA). -0.0, NaN payloads and Inf are stored verbatim; positions and ape are never read."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from kvformats.codec import slot_ops as ops

pytest.importorskip("triton")

from kvformats_kernels import state  # noqa: E402  (after conftest chose interpreter or GPU)

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SENTINEL = 0xA5
LAYOUTS = {
    "ring-16": kvf.CompressorStateV41(head_dim=16, page_size=8),
    "tokenspeed-48": kvf.CompressorStateV41(head_dim=48, page_size=2),
    "narrow-1": kvf.CompressorStateV41(head_dim=1, page_size=3),
}


def special_rows(n: int, w: int, dtype, seed: int) -> torch.Tensor:
    """``[n, w]`` of ``dtype``: random magnitudes with ±0.0, ±Inf, NaNs with payloads and a
    float32 subnormal, as a view with a padded row stride."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, w, generator=g) * torch.exp(torch.randn(n, 1, generator=g) * 4)
    specials = torch.tensor([0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA5A5A5, 0x00000001],
                            dtype=torch.int64).to(torch.int32).view(torch.float32)
    flat = x.view(-1)
    k = min(flat.numel(), specials.numel())
    flat[torch.randperm(flat.numel(), generator=g)[:k]] = specials[:k]
    if dtype == torch.bfloat16:  # NaN payloads the bf16 bits keep (the float32 -> bf16 cast drops them)
        x = x.to(dtype)
        x.view(-1)[: min(2, x.numel())] = torch.tensor([0x7FC1, -0x005B], dtype=torch.int16).view(dtype)[
            : min(2, x.numel())]
    x = x.to(dtype)
    wide = torch.zeros(n, w + 9, dtype=dtype)
    wide[:, 3:3 + w] = x
    return wide[:, 3:3 + w].to(DEV)


def arena_cache(layout, pages: int, pad: int, fill: int | None = SENTINEL):
    """(arena, cache): a cache viewing a sentinel-filled arena at an offset, page stride padded."""
    page_elems = layout.allocate(1)[0].numel()
    stride = page_elems + pad
    total = (max(pages - 1, 0) * stride + page_elems + 16) * 4
    if fill is None:
        raw = torch.randint(0, 256, (total,), generator=torch.Generator().manual_seed(pages), dtype=torch.uint8)
    else:
        raw = torch.full((total,), fill, dtype=torch.uint8)
    arena = raw.to(DEV).view(torch.float32)
    return arena, arena.as_strided(layout.cache_shape(pages), (stride, 2 * layout.width, 1), 3)


def ring_slots(n: int, capacity: int, seed: int) -> torch.Tensor:
    """Distinct slots, -1 holes and a few at or beyond the capacity (skipped by both backends)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randperm(capacity, generator=g)[:n]
    if s.numel() < n:
        s = torch.cat([s, torch.full((n - s.numel(),), -1)])
    s[torch.rand(n, generator=g) < 0.2] = -1
    s[torch.rand(n, generator=g) < 0.1] = capacity + 2
    return s.to(torch.int32 if seed % 2 else torch.int64).to(DEV)


def bits(t) -> torch.Tensor:
    if isinstance(t, tuple):
        t = torch.cat([u.contiguous() for u in t], dim=1)
    return t.contiguous().view(torch.uint8)


@pytest.fixture(params=["small", "large"])
def launch_config(request, launch_settings):
    """The configuration of calls of few rows and that of large calls."""
    if request.param == "large":
        launch_settings("bounds", "few_rows", 0)
        launch_settings("bounds", "small_rows", 0)
    return request.param


@pytest.mark.parametrize("op", ["encode", "decode", "gather", "decode_topk"])
def test_the_state_module_serves_it(op):
    assert kvf.CompressorStateV41 in state.SERVES and registry.has_backend("compressor_state_v41", op, "triton")
    assert registry.resolve("compressor_state_v41", op, "triton", torch.device("cuda")) is getattr(state, op)


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pad", [0, 13])
def test_encode_matches_reference_bit_for_bit(name, dtype, pad, launch_config):
    layout = LAYOUTS[name]
    n = 19
    pages = n // layout.page_size + 2
    kv, score = special_rows(n, layout.width, dtype, seed=pad + 1), special_rows(n, layout.width, dtype, seed=pad + 2)
    slots = ring_slots(n, pages * layout.page_size, seed=pad + n)
    (arena_ref, ref), (arena_tri, tri) = arena_cache(layout, pages, pad), arena_cache(layout, pages, pad)
    ops.encode_reference(layout, (kv, score), ref, slots)
    state.encode(layout, (kv, score), tri, slots)
    assert torch.equal(bits(arena_tri), bits(arena_ref)), "bytes differ (or a write strayed outside its rows)"
    if dtype == torch.float32:  # verbatim: the cache holds the inputs' bit patterns
        live = (slots >= 0) & (slots < pages * layout.page_size)
        s = slots[live].long()
        rows = tri[s // layout.page_size, s % layout.page_size]
        assert torch.equal(bits(rows), bits((kv[live], score[live])))


def test_signed_zero_nan_and_inf_scores_stay_as_given():
    layout = LAYOUTS["ring-16"]
    kv = torch.zeros(4, 16, device=DEV)
    score = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan")], device=DEV)[:, None].expand(4, 16)
    score = score.contiguous()
    score.view(torch.int32)[3] = 0x7FC0BEEF  # a NaN payload
    cache = layout.allocate(1, device=DEV)
    state.encode(layout, (kv, score), cache, torch.tensor([7, 0, 3, 5], device=DEV))
    assert torch.equal(cache[0, [7, 0, 3, 5], 16:].contiguous().view(torch.int32), score.view(torch.int32))


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("pad", [0, 5])
def test_decode_and_gather_of_any_bits_match_reference(name, pad):
    layout = LAYOUTS[name]
    _, cache = arena_cache(layout, 3, pad, fill=None)
    capacity = 3 * layout.page_size
    g = torch.Generator().manual_seed(pad)
    slots = torch.randint(-1, capacity + 2, (34,), generator=g).to(DEV)[::2]  # repeats, holes, a strided view
    assert torch.equal(state.gather(layout, cache, slots), ops.gather_reference(layout, cache, slots))
    kv, score = state.decode(layout, cache, slots)
    want_kv, want_score = ops.decode_reference(layout, cache, slots)
    assert torch.equal(bits(kv), bits(want_kv)) and torch.equal(bits(score), bits(want_score))
    assert kv.is_contiguous() and score.is_contiguous()
    assert kv.untyped_storage().data_ptr() != score.untyped_storage().data_ptr()
    topk = torch.stack([slots[:8], slots[8:16]])
    got, want = state.decode_topk(layout, cache, topk), ops.decode_reference(layout, cache, topk.reshape(-1))
    assert all(torch.equal(bits(a.reshape(16, -1)), bits(b)) for a, b in zip(got, want))


def test_empty_calls_and_a_cache_of_no_pages():
    layout = LAYOUTS["ring-16"]
    cache = layout.allocate(2, device=DEV)
    none = torch.empty(0, dtype=torch.int64, device=DEV)
    empty = torch.empty(0, 16, device=DEV)
    state.encode(layout, (empty, empty), cache, none)
    assert not cache.view(torch.int32).any()
    kv, score = state.decode(layout, cache, none)
    assert kv.shape == score.shape == (0, 16)
    assert state.gather(layout, cache, none).shape == (0, layout.row_bytes)
    zero = layout.allocate(0, device=DEV)
    x = special_rows(4, 16, torch.float32, seed=0)
    state.encode(layout, (x, x), zero, torch.arange(4, device=DEV))
    assert not bits(state.gather(layout, zero, torch.arange(4, device=DEV))).any()
