"""Triton kernels shared by the byte formats: locating rows (by slot, by block table, by
cu_seq_lens), copying encoded records, and decoding rows through a format's decode body.

Records move in *units*: the widest integer type (8, 4, 2 or 1 bytes) dividing every offset,
stride and record size involved, chosen by the launcher (rows.py); all offsets here count
units. A record of REC units is copied as one tile of REC rounded up to a power of two, the
padding lanes masked off, and a row's two segments are both loaded before either is stored.
Why one tile and loads first: a load cannot move above a store that may alias it, so a row
copied in power-of-two pieces (72 = 64 + 8) one after another waits for memory once per piece.
"""

import triton
import triton.language as tl

from kvformats_kernels import record_jit as rj

# deferred.Check values, written out: a jitted function reads only constexpr globals
SLOT_RANGE = tl.constexpr(1)
GATHER_LEN = tl.constexpr(3)
WORKSPACE_WIDTH = tl.constexpr(4)
WORKSPACE_ROWS = tl.constexpr(6)


@triton.jit
def locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE: tl.constexpr):
    """For row ids ``rows`` (int64 [BM]): (in range of the call, slot valid, page, row in page,
    the slot as loaded: int64, -1 past the call's rows, for ``record_slots``).

    A slot is valid when 0 <= slot < capacity; invalid slots point at page 0, row 0 so every
    address stays inside the cache even where a mask is ignored.
    """
    in_range = rows < n_rows
    slot = tl.load(slots_ptr + rows * slot_stride, mask=in_range, other=-1).to(tl.int64)
    ok = in_range & (slot >= 0) & (slot < capacity)
    at = tl.where(ok, slot, 0)
    return in_range, ok, at // PAGE_SIZE, at % PAGE_SIZE, slot


@triton.jit
def record_slots(err_ptr, rows, slot, capacity, SITE: tl.constexpr):
    """Record a slot >= capacity among ``slot`` (from locate_slot) as Check.SLOT_RANGE at SITE:
    the row id (the flat index in the op's slots), the slot, the capacity; the reference
    records the same. Negative slots mean 'no row'. Kernels call it after their last store: a
    load cannot move above a store that may alias it, so a possible store to the record ahead
    of the row loads would hold them back until the slots had arrived."""
    cap = tl.zeros_like(slot) + capacity  # a block: capacity may arrive as a constexpr (Triton's 1)
    rj.record_violation(err_ptr, slot >= cap, rows, slot, cap, SLOT_RANGE, SITE)


@triton.jit
def table_page(table_ptr, t_stride0, t_stride1, table_cols, num_pages, req, pos, live, PAGE_SIZE):
    """Page and row of positions ``pos`` (int64 [BM]) of requests ``req`` through the block table:
    (ok, page, row), both inside the cache even where not ok; not ok where the row is not
    live, pos < 0, the page index is outside the table, or the entry is < 0 or >= num_pages
    (no base offsets: gather_paged)."""
    safe = tl.where(live & (pos >= 0), pos, 0)
    pidx = safe // PAGE_SIZE
    inside = live & (pos >= 0) & (pidx < table_cols)
    entry = tl.load(table_ptr + req * t_stride0 + pidx * t_stride1, mask=inside, other=-1).to(tl.int64)
    ok = inside & (entry >= 0) & (entry < num_pages)
    # the page clamped into the cache by arithmetic: Triton 3.6 fails to compile both a select
    # on these int64 values and a cast of ``ok`` to int64 here (TritonGPURemoveLayoutConversions,
    # some geometries); the row is in [0, PAGE_SIZE) already
    return ok, tl.minimum(tl.maximum(entry, 0), num_pages - 1), safe % PAGE_SIZE


@triton.jit
def request_rows(table_ptr, t_stride0, t_stride1, table_cols, num_pages, seq_ptr, glen_ptr, base_ptr,
                 req, i, width, HAS_GLEN: tl.constexpr, HAS_BASE: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """dequantize_gather addressing for request ``req`` (scalar) and gather rows ``i`` (int64 [BM]):
    (live: the gather_len is valid (0 <= gather_len <= seq_len), i < gather_len and i < width,
    the workspace rows after the offset (so the kernel never writes past them), ok: the row's
    page exists, page, row, seq_len, gather_len: the last two for record_request). Position
    ``q = seq_len - gather_len + i``; page index ``q // PAGE_SIZE - base[req]``."""
    seq = tl.load(seq_ptr + req).to(tl.int64)
    glen = seq
    if HAS_GLEN:
        glen = tl.load(glen_ptr + req).to(tl.int64)
    valid = (glen >= 0) & (glen <= seq)
    live = (i < tl.where(valid, glen, 0)) & (i < width)  # an invalid gather_len: no rows, as the reference
    pos = seq - glen + i
    base = 0
    if HAS_BASE:
        base = tl.load(base_ptr + req).to(tl.int64)
    safe = tl.where(live & (pos >= 0), pos, 0)
    pidx = safe // PAGE_SIZE - base
    inside = live & (pos >= 0) & (pidx >= 0) & (pidx < table_cols)
    pidx = tl.where(inside, pidx, 0)
    entry = tl.load(table_ptr + req * t_stride0 + pidx * t_stride1, mask=inside, other=-1).to(tl.int64)
    ok = inside & (entry >= 0) & (entry < num_pages)
    return live, ok, tl.where(ok, entry, 0), tl.where(ok, safe % PAGE_SIZE, 0), seq, glen


@triton.jit
def record_request(err_ptr, req, seq, glen, width, offset, GLEN_SITE: tl.constexpr, OUT_SITE: tl.constexpr):
    """In the request's first program (axis 0): record an invalid gather_len (Check.GATHER_LEN
    at GLEN_SITE: req, gather_len, seq_len) or, for a valid one, ``offset + gather_len`` beyond
    the workspace (Check.WORKSPACE_WIDTH at OUT_SITE: req, offset + gather_len,
    offset + width), as the reference records them. Called after the kernel's stores (see
    record_slots), with request_rows' seq_len and gather_len."""
    if tl.program_id(0) == 0:
        at = glen + offset  # a tensor even where offset and width are specialized constexprs
        rj.record_scalar(err_ptr, (glen < 0) | (glen > seq), req, glen, seq, GATHER_LEN, GLEN_SITE)
        # a valid gather_len beyond the width (width >= 0, so glen > width implies glen >= 0)
        rj.record_scalar(err_ptr, (glen <= seq) & (glen > width), req, at, at - glen + width, WORKSPACE_WIDTH,
                         OUT_SITE)


@triton.jit
def search_step(cu_ptr, cu_stride, t, live, lo, hi):
    """One step of the branch-free binary search for r with cu[r] <= t < cu[r + 1] (rows ``t``,
    int64 [BM], where live): (lo, hi) narrowed by one dependent load of cu[mid + 1]. Started at
    (0, R), bit length of R steps leave lo = the number of entries of cu[1..R] at most t
    (searchsorted's right rule) for a cu that never decreases."""
    active = live & (lo < hi)
    mid = (lo + hi) // 2
    v = tl.load(cu_ptr + (mid + 1) * cu_stride, mask=active, other=0).to(tl.int64)
    right = (active & (v <= t)).to(tl.int64)
    left = (active & (v > t)).to(tl.int64)
    # arithmetic rather than tl.where: Triton 3.6 fails to compile a select here (layouts)
    return lo + right * (mid + 1 - lo), hi - left * (hi - mid)


@triton.jit
def cu_rows(cu_ptr, cu_stride, requests, t, T_rows, STEPS: tl.constexpr, SCAN: tl.constexpr = 0):
    """For output rows ``t`` (int64 [BM]) of gather_paged: (covered: t < T and t < cu[R],
    request r with cu[r] <= t < cu[r + 1], position t - cu[r]); no host read of cu[-1].

    SCAN > 0 (a power of two >= R, for few requests): r = the number of entries of cu[1..R]
    at most t (searchsorted's right rule), from one vector load of cu[1..R] and a compare
    against every row, so the row's page address waits on three dependent loads (cu[1..R],
    cu[r], the table entry) instead of STEPS + 2. Else the binary search of search_step (STEPS
    = bit length of R steps, one dependent load each). Both give the same r for a cu that
    never decreases (which the eager checks ensure)."""
    in_range = t < T_rows
    if SCAN > 0:
        k = tl.arange(0, SCAN) + 1
        ends = tl.load(cu_ptr + k * cu_stride, mask=k <= requests, other=0).to(tl.int64)
        below = (ends[None, :] <= t[:, None]) & (k <= requests)[None, :]
        lo = tl.sum(below.to(tl.int64), axis=1)
    else:
        lo = tl.zeros(t.shape, tl.int64)
        hi = tl.zeros(t.shape, tl.int64) + requests
        for _ in tl.static_range(STEPS):
            lo, hi = search_step(cu_ptr, cu_stride, t, in_range, lo, hi)
    covered = in_range & (lo < requests)
    req = lo * covered.to(tl.int64)
    start = tl.load(cu_ptr + req * cu_stride, mask=covered, other=0).to(tl.int64)
    return covered, req, t - start


@triton.jit
def load_record(src_ptr, src, ok, REC: tl.constexpr, REC_P2: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """One record of REC units per row at ``src_ptr + src`` as a [rows, REC_P2] tile (zeros
    where not ok or past REC). EVICT_FIRST marks the loads evict-first in L2."""
    cols = tl.arange(0, REC_P2)
    m = ok[:, None] & (cols < REC)[None, :]
    at = src_ptr + src[:, None] + cols[None, :]
    if EVICT_FIRST:
        return tl.load(at, mask=m, other=0, eviction_policy="evict_first")
    return tl.load(at, mask=m, other=0)


@triton.jit
def store_record(dst_ptr, dst, v, live, REC: tl.constexpr, REC_P2: tl.constexpr):
    """The tile of load_record at ``dst_ptr + dst`` (nothing where not live)."""
    cols = tl.arange(0, REC_P2)
    tl.store(dst_ptr + dst[:, None] + cols[None, :], v, mask=live[:, None] & (cols < REC)[None, :])


@triton.jit
def copy_segments(cache_ptr, base, row, ok, out0_ptr, dst0, out1_ptr, dst1, live,
                  S0_OFF: tl.constexpr, S0_REC: tl.constexpr, S0_P2: tl.constexpr,
                  S1_OFF: tl.constexpr, S1_REC: tl.constexpr, S1_P2: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """The records of row ``row`` of the pages at ``base`` (segment 0, and segment 1 where
    S1_REC > 0) to ``out0_ptr + dst0`` / ``out1_ptr + dst1``: zeros where not ok, nothing where
    not live. Both segments are loaded before either is stored: the compiler may not move a
    load above a store that could alias it, so load, store, load, store would wait for memory
    twice."""
    v0 = load_record(cache_ptr, base + S0_OFF + row * S0_REC, ok, S0_REC, S0_P2, EVICT_FIRST)
    if S1_REC > 0:
        v1 = load_record(cache_ptr, base + S1_OFF + row * S1_REC, ok, S1_REC, S1_P2, EVICT_FIRST)
        store_record(out0_ptr, dst0, v0, live, S0_REC, S0_P2)
        store_record(out1_ptr, dst1, v1, live, S1_REC, S1_P2)
    else:
        store_record(out0_ptr, dst0, v0, live, S0_REC, S0_P2)


@triton.jit
def gather_bytes_kernel(cache_ptr, slots_ptr, out_ptr, err_ptr, n_rows, slot_stride, capacity, page_stride,
                        PAGE_SIZE: tl.constexpr, ROW: tl.constexpr,
                        S0_OFF: tl.constexpr, S0_REC: tl.constexpr, S0_P2: tl.constexpr,
                        S1_OFF: tl.constexpr, S1_REC: tl.constexpr, S1_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                        SITE: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """out[n] = the encoded row at slots[n] (segment records in page order); zeros if invalid,
    a slot >= capacity recorded at SITE. Everything in units (see the module docstring)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    dst = rows * ROW
    copy_segments(cache_ptr, page * page_stride, row, ok, out_ptr, dst, out_ptr, dst + S0_REC, in_range,
                  S0_OFF, S0_REC, S0_P2, S1_OFF, S1_REC, S1_P2, EVICT_FIRST)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def gather_paged_kernel(cache_ptr, table_ptr, cu_ptr, v0_ptr, v1_ptr, err_ptr, t_rows, requests, cu_stride,
                        t_stride0, t_stride1, table_cols, num_pages, page_stride, v0_stride, v1_stride,
                        PAGE_SIZE: tl.constexpr, STEPS: tl.constexpr,
                        S0_OFF: tl.constexpr, S0_REC: tl.constexpr, S0_P2: tl.constexpr,
                        S1_OFF: tl.constexpr, S1_REC: tl.constexpr, S1_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                        SITE: tl.constexpr, SCAN: tl.constexpr = 0):
    """views[s][t] = segment s's record of position t - cu[r] of the request r holding row t;
    zeros for a missing page; rows not covered by cu_seq_lens untouched. Units as above.

    Program 0, after its copies (see record_slots), checks cu_seq_lens as the reference does,
    in its order: a first entry other than 0 or a decrease (Check.CU_ORDER), then cu[-1] beyond
    the workspaces' t_rows rows (Check.WORKSPACE_ROWS, index 0: the reference's flat index in
    cu[-1:]), both at SITE. Rows are copied regardless (a decreasing cu gives unspecified rows,
    never outside the workspaces); the launcher starts one program even for empty workspaces,
    so that program 0 runs."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    covered, req, pos = cu_rows(cu_ptr, cu_stride, requests, t, t_rows, STEPS, SCAN)
    ok, page, row = table_page(table_ptr, t_stride0, t_stride1, table_cols, num_pages, req, pos, covered, PAGE_SIZE)
    copy_segments(cache_ptr, page * page_stride, row, ok, v0_ptr, t * v0_stride, v1_ptr, t * v1_stride, covered,
                  S0_OFF, S0_REC, S0_P2, S1_OFF, S1_REC, S1_P2)
    if tl.program_id(0) == 0:
        rj.record_order(err_ptr, cu_ptr, cu_stride, requests + 1, True, SITE)
        last = tl.load(cu_ptr + requests * cu_stride).to(tl.int64)
        rj.record_scalar(err_ptr, last > t_rows, last * 0, last, last * 0 + t_rows, WORKSPACE_ROWS, SITE)


# ----- decoding: one kernel per addressing, the format's decode body a constexpr --------------
# A decode body is a @triton.jit function
#     BODY(cache_ptr, aux_ptr, page, row, ok, out_row, live, page_stride, aux_stride, G, BLOCK_M)
# that decodes the rows at (page, row) [BM] (zeros where not ok) into the rows ``out_row`` [BM
# pointers] where live. G holds the format's constants (a named tuple, read as G.NB:
# _common.constants); aux_ptr and aux_stride are a second view of the cache and its page
# stride, for a body that reads part of a row through one (fp8_ds_mla's int16 RoPE tail); the
# others are passed the cache itself. They come last among the kernels' arguments, so that the
# bodies that ignore them compile as when each format had kernels of its own.


@triton.jit
def decode_kernel(cache_ptr, slots_ptr, out_ptr, err_ptr, n_rows, slot_stride, capacity, page_stride, aux_ptr,
                  aux_stride, BODY: tl.constexpr, G: tl.constexpr, ROW: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  BLOCK_M: tl.constexpr, SITE: tl.constexpr):
    """out [N, ROW] = the rows at slots, decoded by BODY; zero rows for invalid slots (a slot >=
    capacity recorded at SITE)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    BODY(cache_ptr, aux_ptr, page, row, ok, out_ptr + rows * ROW, in_range, page_stride, aux_stride, G, BLOCK_M)
    record_slots(err_ptr, rows, slot, capacity, SITE)


@triton.jit
def paged_decode_kernel(cache_ptr, table_ptr, seq_ptr, glen_ptr, base_ptr, out_ptr, err_ptr,
                        t_stride0, t_stride1, table_cols, num_pages, page_stride,
                        out_stride0, out_stride1, offset, width, req0, aux_ptr, aux_stride,
                        BODY: tl.constexpr, G: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_GLEN: tl.constexpr,
                        HAS_BASE: tl.constexpr, BLOCK_M: tl.constexpr, GLEN_SITE: tl.constexpr,
                        OUT_SITE: tl.constexpr):
    """dequantize_gather: out[req, offset + i] = the row of position seq_len - gather_len + i of
    request req (program axis 1, plus req0) through the table, decoded by BODY; an invalid
    gather_len or workspace width recorded (request_rows)."""
    req = tl.program_id(1).to(tl.int64) + req0
    i = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live, ok, page, row, seq, glen = request_rows(table_ptr, t_stride0, t_stride1, table_cols, num_pages, seq_ptr,
                                                  glen_ptr, base_ptr, req, i, width, HAS_GLEN, HAS_BASE, PAGE_SIZE)
    out_row = out_ptr + req * out_stride0 + (offset + i) * out_stride1
    BODY(cache_ptr, aux_ptr, page, row, ok, out_row, live, page_stride, aux_stride, G, BLOCK_M)
    record_request(err_ptr, req, seq, glen, width, offset, GLEN_SITE, OUT_SITE)


@triton.jit
def lane_pairs(slots_ptr, slot_stride, n_rows, capacity, BLOCK_M: tl.constexpr, NB: tl.constexpr,
               NB_P2: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The (row, block) pairs of a program of BLOCK_M rows, one pair per lane, row-major (lanes
    k NB_P2 .. (k + 1) NB_P2 - 1 hold one row's blocks): (rows, blk, live: blk < NB, and
    locate_slot's in_range, ok, page, row, slot) [BLOCK_M * NB_P2]."""
    pr = tl.arange(0, BLOCK_M * NB_P2)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + pr // NB_P2
    blk = pr % NB_P2
    in_range, ok, page, row, slot = locate_slot(slots_ptr, slot_stride, rows, n_rows, capacity, PAGE_SIZE)
    return rows, blk, blk < NB, in_range, ok, page, row, slot
