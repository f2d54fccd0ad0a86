"""Huge caches (int64 addressing): on the GPU, caches past 2^34 bytes (past 2^32 where memory is
short) for each format, with rows written and read at byte offsets beyond 2^31, 2^32, 2^33
and 2^34 (so every index a kernel forms, in bytes, bf16 / float32 words or 8-byte units,
crosses 2^31). Through ``backend="triton"``: encode (int32 and int64 slots, −1 holes, slots
beyond the capacity with ``check=False``), decode, gather, decode_topk, dequantize_gather and
gather_paged (where registered) must give the reference's bytes, computed on a small cache
holding copies of just the pages involved. The pages involved and sentinel-filled neighbours
on both sides (page pads included) are compared byte for byte, and the whole cache is counted:
every byte outside them is still zero.

The same check runs on the CPU on a small cache with scaled-down boundaries (the Triton
launchers under the interpreter), which tests the harness itself.
"""

from __future__ import annotations

import gc

import pytest
import torch

import kvformats as kvf
from kvformats.codec import registry
from tests.harness.reliability_harness import CUDA, DEVICE, run_op, triton_available
from kvformats.testing.strategies import storage_bytes

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SENTINEL = 0xA5
GIB = 1 << 30
PRODUCTION = {
    "fp8_ds_mla": lambda: kvf.Fp8DsMla(),
    "fp8_ds_mla_v32": lambda: kvf.get_format("fp8_ds_mla_v32"),
    "fp8_indexer": lambda: kvf.Fp8Indexer(),
    "mxfp4_indexer": lambda: kvf.Mxfp4Indexer(),
    "compressor_state": lambda: kvf.CompressorState(),
}
SMALL = {
    "fp8_ds_mla": lambda: kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4),
    "fp8_ds_mla_v32": lambda: kvf.get_format("fp8_ds_mla_v32", page_size=4),
    "fp8_indexer": lambda: kvf.Fp8Indexer(page_size=4),
    "mxfp4_indexer": lambda: kvf.Mxfp4Indexer(page_size=4),
    "compressor_state": lambda: kvf.CompressorState(head_dim=32, ratio=4, page_size=4),
}


def has_triton(fmt: str, op: str) -> bool:
    if CUDA:
        registry._load_kernels()
        return "triton" in registry._OPS.get((fmt, op), {})
    from tests.harness.reliability_harness import kernel_impl

    return kernel_impl(fmt, op) is not None


# ----- the cache and the pages involved ------------------------------------------------------------
class Huge:
    """A zeroed cache of ``num_pages`` pages every ``stride`` elements (a padded page stride) in
    one allocation of ``num_pages * stride`` elements."""

    def __init__(self, layout, num_pages: int, device):
        self.layout = layout
        shape = layout.cache_shape(num_pages)
        self.page_elems = 1
        for d in shape[1:]:
            self.page_elems *= d
        item = torch.empty(0, dtype=layout.container_dtype).element_size()
        self.stride = self.page_elems + 512 // item
        arena = torch.zeros(num_pages * self.stride, dtype=layout.container_dtype, device=device)
        inner = torch.empty(shape[1:]).stride()
        self.cache = arena.as_strided(shape, (self.stride, *inner))
        self.stride_bytes, self.width_bytes = self.stride * item, self.page_elems * item
        self.pages = storage_bytes(self.cache).view(num_pages, self.stride_bytes)
        self.num_pages = num_pages

    def page_at(self, byte: int) -> int:
        return min(byte // self.stride_bytes, self.num_pages - 1)


def plan(h: Huge, boundaries: list[int]) -> tuple[list[int], list[int]]:
    """(pages to write: the one holding each boundary byte, the next one and the last page;
    pages involved: those plus a sentinel neighbour on each side), sorted."""
    written = set()
    for b in boundaries:
        p = h.page_at(b)
        written |= {p, min(p + 1, h.num_pages - 1)}
    written.add(h.num_pages - 1)
    involved = set(written)
    for p in written:
        involved |= {max(p - 1, 0), min(p + 1, h.num_pages - 1)}
    return sorted(written), sorted(involved)


def small_copy(h: Huge, involved: list[int]) -> torch.Tensor:
    """A cache of the involved pages (same page stride), in order: page ``involved[i]`` -> ``i``."""
    small = Huge(h.layout, len(involved), h.cache.device)
    small.pages.copy_(h.pages[torch.tensor(involved, device=h.cache.device)])
    return small


def remap(slots: list[int], involved: list[int], ps: int) -> list[int]:
    where = {p: i for i, p in enumerate(involved)}
    return [where[s // ps] * ps + s % ps if s >= 0 and s // ps in where else -1 for s in slots]


def inputs(layout, n: int, g: torch.Generator, device):
    if layout.decode_dtype is None:  # compressor_state
        w = layout.width
        kv, score = (torch.randn(n, w, generator=g).to(device) for _ in range(2))
        return (kv, score), dict(positions=torch.arange(n, device=device) * 3 + 1,
                                 ape=(torch.randn(layout.ratio, w, generator=g) * 0.1).to(device))
    x = torch.randn(n, layout.head_dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    return x.to(torch.bfloat16).to(device), {}


def same_bits(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_bits(u, v) for u, v in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def nonzero_bytes(u8: torch.Tensor, chunk: int = GIB) -> int:
    flat = u8.reshape(-1)
    return sum(int(torch.count_nonzero(flat[i:i + chunk])) for i in range(0, flat.numel(), chunk))


# ----- the check -----------------------------------------------------------------------------------
def check_huge(layout, num_pages: int, boundaries: list[int], device) -> None:
    ps, g = layout.page_size, torch.Generator().manual_seed(num_pages)
    h = Huge(layout, num_pages, device)
    written, involved = plan(h, boundaries)
    assert all(b < num_pages * h.stride_bytes for b in boundaries), "a boundary lies beyond the cache"
    idx = torch.tensor(involved, device=device)
    h.pages[idx] = SENTINEL
    s = small_copy(h, involved)
    cap = num_pages * ps

    # encode: int32 slots (rows 0 and ps-1, a hole), then int64 with check=False (rows 1 and ps//2,
    # slots beyond the capacity)
    first = [p * ps for p in written] + [p * ps + ps - 1 for p in written] + [-1]
    second = [p * ps + 1 for p in written] + [p * ps + ps // 2 for p in written if ps // 2 > 1]
    wild = [cap, cap + 5, 2**40, -1]
    for slots, dtype, extra, check in ((first, torch.int32, [], True), (second, torch.int64, wild, False)):
        x, kw = inputs(layout, len(slots) + len(extra), g, device)
        big = torch.tensor(slots + extra, dtype=dtype, device=device)
        ref = torch.tensor(remap(slots, involved, ps) + [-1] * len(extra), dtype=dtype, device=device)
        run_op("triton", layout.encode, x, h.cache, big, check=check, **kw)
        layout.encode(x, s.cache, ref, backend="reference", check=False, **kw)
    assert torch.equal(h.pages[idx], s.pages), "encode: bytes of the involved pages differ from the reference"
    assert nonzero_bytes(h.pages) == nonzero_bytes(h.pages[idx]), "encode changed bytes outside the involved pages"

    reads = first + second + [involved[0] * ps + ps - 2, -1]
    for dtype in (torch.int32, torch.int64):
        big = torch.tensor(reads, dtype=dtype, device=device)
        ref = torch.tensor(remap(reads, involved, ps), dtype=dtype, device=device)
        for op in ("decode", "gather"):
            if has_triton(layout.name, op):
                got = run_op("triton", getattr(layout, op), h.cache, big)
                want = getattr(layout, op)(s.cache, ref, backend="reference")
                assert same_bits(got, want), f"{op} ({dtype}) differs from the reference"
    if has_triton(layout.name, "decode_topk"):
        n = len(reads) // 2 * 2
        big = torch.tensor(reads[:n], device=device).reshape(-1, 2)
        ref = torch.tensor(remap(reads[:n], involved, ps), device=device).reshape(-1, 2)
        assert same_bits(run_op("triton", layout.decode_topk, h.cache, big),
                         layout.decode_topk(s.cache, ref, backend="reference")), "decode_topk differs"
    check_paged(layout, h, s, written, involved, device)
    assert torch.equal(h.pages[idx], s.pages), "a read changed the cache"


def check_paged(layout, h: Huge, s: Huge, written: list[int], involved: list[int], device) -> None:
    ps = layout.page_size
    beyond = h.num_pages  # a page past the cache: missing
    rows = [written[:3] + [-1], [written[-1], beyond, *written[3:5]]]
    rows = [(r + [-1] * 4)[:4] for r in rows]
    where = {p: i for i, p in enumerate(involved)}
    small_rows = [[where.get(p, len(involved)) if p >= 0 else -1 for p in r] for r in rows]
    big_t = torch.tensor(rows, dtype=torch.int32, device=device)
    small_t = torch.tensor(small_rows, dtype=torch.int32, device=device)
    if layout.decode_dtype is not None and has_triton(layout.name, "dequantize_gather"):
        seq = torch.tensor([4 * ps, 3 * ps + 1], device=device)
        glen = torch.tensor([4 * ps - 1, 2 * ps], device=device)
        outs = [torch.full((2, 4 * ps + 1, layout.head_dim), -3.0, dtype=layout.decode_dtype, device=device)
                for _ in range(2)]
        run_op("triton", layout.dequantize_gather, h.cache, outs[0], block_table=big_t, seq_lens=seq,
               gather_lens=glen, offset=1)
        layout.dequantize_gather(s.cache, outs[1], block_table=small_t, seq_lens=seq, gather_lens=glen, offset=1,
                                 backend="reference")
        assert same_bits(outs[0], outs[1]), "dequantize_gather differs from the reference"
    if has_triton(layout.name, "gather_paged"):
        cu = torch.tensor([0, 4 * ps, 7 * ps + 1], dtype=torch.int32, device=device)
        ws = [tuple(torch.full((7 * ps + 3, seg.record_bytes), 0xEE, dtype=torch.uint8, device=device)
                    for seg in layout.segments) for _ in range(2)]
        run_op("triton", layout.gather_paged, h.cache, block_table=big_t, cu_seq_lens=cu, out=ws[0])
        layout.gather_paged(s.cache, block_table=small_t, cu_seq_lens=cu, out=ws[1], backend="reference")
        assert same_bits(ws[0], ws[1]), "gather_paged differs from the reference"


# ----- tests ----------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("fmt", sorted(PRODUCTION))
def test_huge_cache_past_int32_offsets(fmt):
    layout = PRODUCTION[fmt]()
    free = torch.cuda.mem_get_info()[0]
    size = (1 << 34) + 64 * (1 << 20) if free > 24 * GIB else (1 << 32) + 64 * (1 << 20)
    if free < size + 2 * GIB:
        pytest.skip(f"needs {(size + 2 * GIB) / GIB:.1f} GiB free on the GPU, {free / GIB:.1f} GiB are")
    stride = probe_stride(layout)
    num_pages = -(-size // stride)
    boundaries = [b for b in (1 << 31, 1 << 32, 1 << 33, 1 << 34) if b < num_pages * stride]
    try:
        check_huge(layout, num_pages, boundaries, DEVICE)
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def probe_stride(layout) -> int:
    return Huge(layout, 1, "cpu").stride_bytes


@pytest.mark.skipif(not triton_available(), reason="needs Triton (compiled, or the interpreter on the CPU)")
@pytest.mark.parametrize("fmt", sorted(SMALL))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflowing numpy products
def test_huge_check_rehearsal_on_cpu(fmt):
    layout = SMALL[fmt]()
    stride = probe_stride(layout)
    check_huge(layout, 40, [5 * stride + 3, 17 * stride, 30 * stride - 1], DEVICE)
