"""Triton kernel of the transfer checksum (kvformats.transfer.checksum defines the value)."""

import triton
import triton.language as tl


@triton.jit
def region_checksum_kernel(bytes_ptr, pages_ptr, rows_ptr, out_ptr, page_stride, offset, row_stride, out_stride,
                           NBYTES: tl.constexpr, N_ROWS: tl.constexpr, PER_PAGE: tl.constexpr,
                           INCLUDE_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """One program per listed page: (s1, s2) of one region's bytes over the page's moved rows
    [a, b) (the page pad: one row, counted when INCLUDE_PAD), in int64 then mod 2**32."""
    i = tl.program_id(0).to(tl.int64)
    page = tl.load(pages_ptr + i).to(tl.int64)
    if PER_PAGE:
        a = 0
        b = 1 if INCLUDE_PAD else 0
    else:
        a = tl.load(rows_ptr + 2 * i).to(tl.int64)
        b = tl.load(rows_ptr + 2 * i + 1).to(tl.int64)
    base = bytes_ptr + page * page_stride + offset
    s1 = tl.zeros([BLOCK], dtype=tl.int64)
    s2 = tl.zeros([BLOCK], dtype=tl.int64)
    for t0 in range(0, N_ROWS * NBYTES, BLOCK):
        t = t0 + tl.arange(0, BLOCK).to(tl.int64)
        row = t // NBYTES
        k = t % NBYTES
        live = (t < N_ROWS * NBYTES) & (row >= a) & (row < b)
        x = tl.load(base + row * row_stride + k, mask=live, other=0).to(tl.int64)
        s1 += x
        s2 += x * ((row - a) * NBYTES + k + 1)
    tl.store(out_ptr + i * out_stride, tl.sum(s1, 0) & 0xFFFFFFFF)
    tl.store(out_ptr + i * out_stride + 1, tl.sum(s2, 0) & 0xFFFFFFFF)
