"""Triton kernels shared by the byte formats: locating slots and gathering encoded rows."""

import triton
import triton.language as tl


@triton.jit
def locate(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE: tl.constexpr):
    """For row ids ``rows`` (int64 [BM]): (in range of the call, slot valid, page, row in page).

    A slot is valid when 0 <= slot < capacity; invalid slots point at page 0, row 0 so every
    address stays inside the cache even where a mask is ignored.
    """
    in_range = rows < n_rows
    slot = tl.load(slots_ptr + rows * slot_stride, mask=in_range, other=-1).to(tl.int64)
    ok = in_range & (slot >= 0) & (slot < capacity)
    slot = tl.where(ok, slot, 0)
    return in_range, ok, slot // PAGE_SIZE, slot % PAGE_SIZE


@triton.jit
def _copy_record(cache_ptr, out_ptr, src, dst, ok, in_range, REC: tl.constexpr, REC_P2: tl.constexpr):
    """Copy one REC-byte record per row from ``cache + src`` to ``out + dst`` (zeros where not
    ok): one masked tile load, then one store, so a row's bytes are all in flight at once."""
    cols = tl.arange(0, REC_P2)
    live = (cols < REC)[None, :]
    b = tl.load(cache_ptr + src[:, None] + cols[None, :], mask=ok[:, None] & live, other=0)
    tl.store(out_ptr + dst[:, None] + cols[None, :], b, mask=in_range[:, None] & live)


@triton.jit
def gather_bytes_kernel(cache_ptr, slots_ptr, out_ptr, n_rows, slot_stride, capacity, page_stride,
                        PAGE_SIZE: tl.constexpr, ROW_BYTES: tl.constexpr,
                        SEG0_OFF: tl.constexpr, SEG0_REC: tl.constexpr, SEG0_P2: tl.constexpr,
                        SEG1_OFF: tl.constexpr, SEG1_REC: tl.constexpr, SEG1_P2: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    """out[n] = the encoded row at slots[n] (segment records in page order); zeros if invalid."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row = locate(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    base = page * page_stride
    dst = rows * ROW_BYTES
    _copy_record(cache_ptr, out_ptr, base + SEG0_OFF + row * SEG0_REC, dst, ok, in_range, SEG0_REC, SEG0_P2)
    if SEG1_REC > 0:
        _copy_record(cache_ptr, out_ptr, base + SEG1_OFF + row * SEG1_REC, dst + SEG0_REC, ok, in_range,
                     SEG1_REC, SEG1_P2)
