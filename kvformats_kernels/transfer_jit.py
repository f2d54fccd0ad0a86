"""Triton kernel of the transfer checksum (kvformats.transfer.checksum defines the value)."""

import triton
import triton.language as tl

SEED0 = tl.constexpr(0x243F6A88)  # kvformats.transfer.checksum.SEEDS
SEED1 = tl.constexpr(0x85A308D3)


@triton.jit
def fmix32(v):
    """MurmurHash3's finalizer on uint32 (wrapping products, logical shifts)."""
    v ^= v >> 16
    v *= 0x85EBCA6B
    v ^= v >> 13
    v *= 0xC2B2AE35
    v ^= v >> 16
    return v


@triton.jit
def region_checksum_kernel(bytes_ptr, pages_ptr, rows_ptr, out_ptr, page_stride, offset, row_stride, out_stride,
                           num_pages, page_rows,
                           NBYTES: tl.constexpr, N_ROWS: tl.constexpr, PER_PAGE: tl.constexpr,
                           INCLUDE_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """One program per listed page: both lanes of one region over the page's moved rows [a, b)
    (the page pad: one row, counted when INCLUDE_PAD), the stream read as little-endian words.
    An entry whose page is outside [0, num_pages) or whose rows are not 0 <= a <= b <= page_rows
    reads nothing (every load is masked by it) and stores -1 in both lanes."""
    i = tl.program_id(0).to(tl.int64)
    page = tl.load(pages_ptr + i).to(tl.int64)
    ra = tl.load(rows_ptr + 2 * i).to(tl.int64)
    rb = tl.load(rows_ptr + 2 * i + 1).to(tl.int64)
    ok = (page >= 0) & (page < num_pages) & (ra >= 0) & (ra <= rb) & (rb <= page_rows)
    if PER_PAGE:
        a = 0
        b = 1 if INCLUDE_PAD else 0
    else:
        a = tl.minimum(tl.maximum(ra, 0), N_ROWS)
        b = tl.maximum(tl.minimum(tl.maximum(rb, 0), N_ROWS), a)
    # stream bytes; 0 for an invalid entry, so every load below is masked off (the validity is
    # folded into the length rather than and-ed into the masks: one int compare per element)
    n = tl.where(ok, (b - a) * NBYTES, 0)
    base = bytes_ptr + tl.where(ok, page, 0) * page_stride + offset
    acc0 = tl.zeros([BLOCK], dtype=tl.uint32)
    acc1 = tl.zeros([BLOCK], dtype=tl.uint32)
    for w0 in range(0, (N_ROWS * NBYTES + 3) // 4, BLOCK):
        w = w0 + tl.arange(0, BLOCK).to(tl.int64)
        word = tl.zeros([BLOCK], dtype=tl.uint32)
        for t in tl.static_range(4):  # the word's four stream bytes, low byte first
            s = 4 * w + t
            row = a + s // NBYTES
            x = tl.load(base + row * row_stride + s % NBYTES, mask=s < n, other=0)
            word |= x.to(tl.uint32) << (8 * t)
        live = 4 * w < n
        pos = w.to(tl.uint32)
        acc0 += tl.where(live, fmix32(word ^ fmix32(pos ^ SEED0)), 0)
        acc1 += tl.where(live, fmix32(word ^ fmix32(pos ^ SEED1)), 0)
    # per element each accumulator wrapped mod 2**32; the sum of BLOCK of them fits an int64
    s0 = tl.sum(acc0.to(tl.int64), 0) & 0xFFFFFFFF
    s1 = tl.sum(acc1.to(tl.int64), 0) & 0xFFFFFFFF
    tl.store(out_ptr + i * out_stride, tl.where(ok, s0, -1))
    tl.store(out_ptr + i * out_stride + 1, tl.where(ok, s1, -1))
