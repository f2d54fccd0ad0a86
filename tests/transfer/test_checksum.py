"""The transfer checksum (issue 44 items 1 and 4): what the old linear sums missed on real MXFP4
indexer pages is caught, the torch reference equals a plain-Python restatement of the
definition and the Triton kernel (interpreter on CPU) bit for bit, and nothing is read outside
the cache: invalid pages and rows are typed errors on the host path, masked and recorded (sums
-1) on the device path."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.errors import InputError, InputTypeError
from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer
from kvformats.runtime import deferred
from kvformats.transfer import describe_caches, expected_checksums, page_checksums, plan_transfer, verify

INDEX = Mxfp4Indexer(head_dim=128, page_size=64)
SCALE = INDEX.region("scale")  # ue8m0 scales: 4 bytes per row
M32 = 0xFFFFFFFF


def real_index_page(seed: int = 0) -> torch.Tensor:
    """A one-page MXFP4 indexer cache holding 64 encoded rows."""
    cache = INDEX.allocate(1)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(seed)).bfloat16()
    INDEX.encode(x, cache, torch.arange(64))
    return cache


def sums(cache: torch.Tensor) -> torch.Tensor:
    """Checksums of every page of an MXFP4 indexer cache, all rows."""
    n = cache.shape[0]
    return page_checksums(INDEX, cache, torch.arange(n), torch.tensor([[0, 64]] * n), backend="torch")


def test_swapped_scale_records_of_equal_byte_sum_are_caught():
    """Every pair of rows of a real page whose 4-byte scale records differ but have equal byte
    sums (the old s1 and s2 both unchanged by swapping them): each swap changes the checksum."""
    page = real_index_page()
    u8 = INDEX.byte_pages(page)[0][0]
    scale = u8[SCALE.offset:SCALE.offset + 64 * 4].view(64, 4)
    total = scale.long().sum(1)
    pairs = [(i, j) for i in range(64) for j in range(i + 1, 64)
             if total[i] == total[j] and not torch.equal(scale[i], scale[j])]
    assert len(pairs) >= 200  # 212 of 2016 pairs for this seed: the case is common in real pages
    variants = page.repeat(len(pairs) + 1, 1)
    for k, (i, j) in enumerate(pairs, 1):
        rec = INDEX.byte_pages(variants)[0][k, SCALE.offset:SCALE.offset + 256].view(64, 4)
        rec[[i, j]] = rec[[j, i]].clone()
    got = sums(variants)
    caught = (got[1:] != got[0]).any(-1)  # [pairs, regions]
    assert caught[:, 1].all() and not caught[:, 0].any()  # the scale region changed, the values did not


def test_three_byte_plus_minus_changes_are_caught():
    """(+d, -2d, +d) on three consecutive bytes (sum and position-weighted sum unchanged) at
    every feasible start in the page, inside one word and across word boundaries."""
    page = real_index_page(seed=1)
    flat = INDEX.byte_pages(page)[0][0].long()
    d = 1
    starts = [j for j in range(0, flat.numel() - 2)
              if flat[j] + d <= 255 and flat[j + 1] >= 2 * d and flat[j + 2] + d <= 255][::5]
    assert len(starts) == 848 and {j % 4 for j in starts} == {0, 1, 2, 3}  # docs/transfer.md gives the count
    variants = page.repeat(len(starts) + 1, 1)
    u8 = INDEX.byte_pages(variants)[0]
    for k, j in enumerate(starts, 1):
        u8[k, j] += d
        u8[k, j + 1] -= 2 * d
        u8[k, j + 2] += d
    got = sums(variants)
    assert (got[1:] != got[0]).any(-1).any(-1).all()


def fmix32(v: int) -> int:
    v ^= v >> 16
    v = (v * 0x85EBCA6B) & M32
    v ^= v >> 13
    v = (v * 0xC2B2AE35) & M32
    return v ^ (v >> 16)


def oracle(layout, cache, page: int, a: int, b: int, include_pad: bool) -> list[list[int]]:
    """The definition (kvformats/transfer/checksum.py) in plain Python on one page's bytes."""
    raw = layout.byte_pages(cache)[0][page].reshape(-1).tolist()
    out = []
    for r in layout.regions:
        rows = ([0] if include_pad else []) if r.per_page else range(a, b)
        stream = [raw[r.offset + row * r.row_stride + k] for row in rows for k in range(r.nbytes)]
        stream += [0] * (-len(stream) % 4)
        words = [int.from_bytes(bytes(stream[i:i + 4]), "little") for i in range(0, len(stream), 4)]
        out.append([sum(fmix32(word ^ fmix32(w ^ seed)) for w, word in enumerate(words)) & M32
                    for seed in (0x243F6A88, 0x85A308D3)])
    return out


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel's device (the interpreter's on CPU)
KV = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
SMALL = [KV, Mxfp4Indexer(head_dim=128, page_size=16), CompressorState(head_dim=128, ratio=4, page_size=16)]
PAGES, ROWS = torch.tensor([4, 0, 2]), torch.tensor([[0, 16], [3, 9], [15, 16]])


def random_cache(layout, pages: int, seed: int):
    cache = layout.allocate(pages)
    layout.byte_pages(cache)[0].copy_(torch.randint(0, 256, layout.byte_pages(cache)[0].shape, dtype=torch.uint8,
                                                    generator=torch.Generator().manual_seed(seed)))
    return cache


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("layout", SMALL, ids=lambda lay: lay.name)
def test_reference_and_kernel_equal_an_independent_oracle(layout, include_pad):
    cache = random_cache(layout, 5, seed=3)
    want = torch.tensor([oracle(layout, cache, int(p), int(r[0]), int(r[1]), include_pad)
                         for p, r in zip(PAGES, ROWS)])
    got = page_checksums(layout, cache, PAGES, ROWS, include_pad=include_pad, backend="torch")
    assert torch.equal(got, want)
    pytest.importorskip("triton")  # on CPU the kernel runs in Triton's interpreter (tests/conftest.py)
    on = cache.to(DEVICE)
    assert torch.equal(page_checksums(layout, on, PAGES, ROWS, include_pad=include_pad, backend="triton").cpu(), want)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("pages, rows, match", [
    ([4], [[0, 16]], r"pages\[0\] = 4 is not a page of the cache \(valid: 0..3\)"),
    ([0, 10**6], [[0, 16]] * 2, r"pages\[1\] = 1000000 is not a page"),
    ([-1], [[0, 16]], r"pages\[0\] = -1 is not a page"),
    ([1], [[0, 17]], r"rows\[0\] = \[0, 17\] is not a row range \[start, stop\) of a 16-row page"),
    ([1], [[5, 4]], r"rows\[0\] = \[5, 4\]"),
    ([1], [[-1, 4]], r"rows\[0\] = \[-1, 4\]"),
])
def test_pages_and_rows_outside_the_cache_are_refused_before_any_read(backend, pages, rows, match):
    if backend == "triton":
        pytest.importorskip("triton")
    cache = random_cache(KV, 4, seed=1)
    with pytest.raises(InputError, match=match):
        page_checksums(KV, cache, torch.tensor(pages), torch.tensor(rows), backend=backend)


def test_argument_types_and_devices_are_typed_errors():
    cache = random_cache(KV, 4, seed=1)
    ok_pages, ok_rows = torch.tensor([0]), torch.tensor([[0, 16]])
    with pytest.raises(InputError, match="meta"):
        page_checksums(KV, cache, torch.tensor([0], device="meta"), ok_rows)
    with pytest.raises(InputError, match="meta device"):
        page_checksums(KV, KV.allocate(4, device="meta"), ok_pages, ok_rows)
    with pytest.raises(InputTypeError, match="include_pad must be a bool"):
        page_checksums(KV, cache, ok_pages, ok_rows, include_pad="no")
    with pytest.raises(InputTypeError, match="pages must be a 1-D int32/int64 tensor"):
        page_checksums(KV, cache, torch.tensor([0.0]), ok_rows)
    with pytest.raises(InputError, match=r"rows must be \[1, 2\]"):
        page_checksums(KV, cache, ok_pages, torch.tensor([[0, 16, 0]]))
    with pytest.raises(InputTypeError, match="check must be"):
        page_checksums(KV, cache, ok_pages, ok_rows, check="yes")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_device_path_masks_invalid_entries_and_records_them(backend, monkeypatch):
    """Page and row tensors on the device (on a CPU-only machine: CPU tensors treated as a
    device's, deferred.HOST_CHECKED emptied as the test knob says): no host check, no read
    outside the cache (the kernel's loads are masked: page 10**6 segfaulted the interpreter
    before), sums -1 for the invalid entries, the valid ones unchanged, and the first violation
    recorded for raise_pending."""
    if backend == "triton":
        pytest.importorskip("triton")
    cache = random_cache(KV, 4, seed=2).to(DEVICE)
    pages = torch.tensor([1, 10**6, -1, 4, 2, 3], device=DEVICE)
    rows = torch.tensor([[0, 16]] * 4 + [[3, 17], [0, 16]], device=DEVICE)
    want = page_checksums(KV, cache, torch.tensor([1, 3]), torch.tensor([[0, 16]] * 2), backend=backend)
    kvf.pending_error(DEVICE)  # start from a clear record
    monkeypatch.setattr(deferred, "HOST_CHECKED", set())
    got = page_checksums(KV, cache, pages, rows, backend=backend)
    assert torch.equal(got[[0, 5]], want) and (got[1:5] == -1).all()
    err = kvf.pending_error(DEVICE)
    assert isinstance(err, InputError) and "[1] = 1000000" in str(err)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_kernel_equals_the_reference_on_a_gpu():
    """Compiled for the GPU (the interpreter proves the arithmetic, not the compiled kernel):
    every layout, partial rows, the page pad, pages in any order."""
    for layout in SMALL:
        cache = random_cache(layout, 64, seed=5)
        pages = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:40]
        starts = torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(1))
        rows = torch.stack([starts, torch.maximum(starts, torch.randint(0, 17, (40,)))], 1)
        for pad in (False, True):
            want = page_checksums(layout, cache, pages, rows, include_pad=pad, backend="torch")
            got = page_checksums(layout, cache.cuda(), pages.cuda(), rows.cuda(), include_pad=pad)  # auto: Triton
            assert torch.equal(got.cpu(), want), layout.name


def test_verify_refuses_caches_that_are_not_the_plans():
    """A 2-page cache for an 8-page plan (an IndexError before), another layout, another
    stride: InputError before anything is read."""
    src = {"kv": (KV, random_cache(KV, 8, seed=4))}
    plan = plan_transfer(describe_caches(src), describe_caches(src), {"kv": [7, 6]}, {"kv": [7, 6]})
    sums = expected_checksums(plan, src)
    with pytest.raises(InputError, match=r"cache 'kv' given for the plan's destination has num_pages = 2, the "
                                         r"plan's cache has 8"):
        verify(plan, {"kv": (KV, KV.allocate(2))}, sums)
    with pytest.raises(InputError, match="cache 'kv' given for the plan's source has layout mxfp4_indexer"):
        expected_checksums(plan, {"kv": (INDEX, INDEX.allocate(8))})
    wide = KV.allocate(8, page_stride=KV.page_bytes + 64)
    with pytest.raises(InputError, match=f"page_stride = {KV.page_bytes + 64}"):
        expected_checksums(plan, {"kv": (KV, wide)})
    verify(plan, src, sums)  # the plan's own caches pass
