"""The device side of ``kvformats.runtime.deferred``: record a value-check violation without the host.

A kernel that skips rows failing a value check (a slot beyond the cache, a position beyond the
cos/sin table, ...) calls ``record_violation`` with the mask of those rows. Only programs that
met a violation do any work here: one reduction decides, so a valid call pays a compare and a
branch. The first program to claim the record (one atomic compare-and-swap on its state word)
writes what it saw; later violations leave it as it is until the host reads it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def record_violation(err_ptr, bad, index, value, bound, CHECK: tl.constexpr, SITE: tl.constexpr):
    """``bad``: a block of booleans; ``index`` / ``value`` / ``bound``: blocks of its shape (or
    scalars) giving the element index in its argument, its value, and the limit it broke. The
    lowest bad index of this program is the one recorded."""
    if tl.max(bad.to(tl.int32), axis=None) > 0:
        big: tl.constexpr = 0x7FFFFFFFFFFFFFFF
        idx = tl.where(bad, index.to(tl.int64), big)
        first = tl.min(idx, axis=None)
        pick = bad & (idx == first)
        val = tl.max(tl.where(pick, value.to(tl.int64), -big), axis=None)
        lim = tl.max(tl.where(pick, bound.to(tl.int64), -big), axis=None)
        _claim_and_write(err_ptr, first, val, lim, CHECK, SITE)


@triton.jit
def record_scalar(err_ptr, bad, index, value, bound, CHECK: tl.constexpr, SITE: tl.constexpr):
    """``record_violation`` for a program that checks one element: ``bad`` and the rest are
    scalars."""
    if bad:
        _claim_and_write(err_ptr, index.to(tl.int64), value.to(tl.int64), bound.to(tl.int64), CHECK, SITE)


@triton.jit
def _claim_and_write(err_ptr, index, value, bound, CHECK: tl.constexpr, SITE: tl.constexpr):
    # The record is int64 and compare-and-swap needs operands of the pointer's type (Triton 3.6
    # refuses int32 literals on an int64 pointer when it compiles; the interpreter does not).
    zero = tl.full([], 0, tl.int64)
    if tl.atomic_cas(err_ptr, zero, zero + 1) == 0:
        tl.store(err_ptr + 1, zero + CHECK)
        tl.store(err_ptr + 2, zero + SITE)
        tl.store(err_ptr + 3, index)
        tl.store(err_ptr + 4, value)
        tl.store(err_ptr + 5, bound)


@triton.jit
def record_order(err_ptr, cu_ptr, cu_stride, count, START_ZERO: tl.constexpr, SITE: tl.constexpr,
                 CHUNK: tl.constexpr = 128):
    """Check that the ``count`` cumulative offsets at ``cu_ptr`` never decrease (and, with
    START_ZERO, start at 0), recording the first break as ``Check.CU_ORDER`` (5): index, value,
    previous value. One program calls it (program 0 of the op's launch), reading the offsets in
    chunks of CHUNK."""
    for c0 in range(0, count, CHUNK):
        i = c0 + tl.arange(0, CHUNK).to(tl.int64)
        live = i < count
        cur = tl.load(cu_ptr + i * cu_stride, mask=live, other=0).to(tl.int64)
        prev = tl.load(cu_ptr + (i - 1) * cu_stride, mask=live & (i > 0), other=0).to(tl.int64)
        bad = live & (cur < prev)
        if START_ZERO:
            bad = bad | (live & (i == 0) & (cur != 0))
        record_violation(err_ptr, bad, i, cur, prev, 5, SITE)
