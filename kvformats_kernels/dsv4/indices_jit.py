"""Triton kernels of the DeepSeek V4 index helpers (launchers: indices.py).

Row kernels take BLOCK_M tokens per program (row quantities are [BLOCK_M] vectors, never
scalars: the interpreter rejects masks built from scalars) and walk the index row in
BLOCK_J-wide chunks, writing every entry, padding included, so outputs can start as
``torch.empty``. Selects between int64 values are written as ``keep * (v + 1) - 1`` or sums of
0/1 products instead of ``tl.where``: Triton 3.6 fails to compile some int64 selects whose
operands have different layouts (row vector vs tile). Integer division and remainder only see
non-negative operands (Triton truncates, the reference floors). Results never wrap: a table entry
above ``max_entry`` (``kvformats.dsv4_constants.max_page_entry``: its slots would pass the
result's dtype) is a missing page, and index-row entries outside int32 are −1, as in the reference.
"""

import inspect

import triton
import triton.language as tl

from kvformats_kernels.record_jit import record_order
from kvformats_kernels.rows_jit import search_step

# Counts and scalars that change from call to call, and strides of per-request arrays read by
# gathers: specialising on them (== 1, % 16) would only add compiles. The strides of the
# token-indexed arrays and of the index rows stay specialised (unit / aligned strides let
# loads and stores vectorise).
_RUNTIME = ("n", "total", "requests", "cols", "width", "topk", "ratio", "stride", "window", "ww", "cb",
            "t_stride0", "base_stride", "valid_stride", "qsl_stride", "seq_stride", "glen_stride", "clens_stride",
            "steps", "max_entry")


def _kernel(fn):
    runtime = [i for i, name in enumerate(inspect.signature(fn).parameters) if name in _RUNTIME]
    return triton.jit(fn, do_not_specialize=runtime)


@triton.jit
def table_slot(table_ptr, t_stride0, t_stride1, cols, req, first_page, pos, ok, max_entry, PAGE_SIZE: tl.constexpr):
    """Slots of positions ``pos`` of requests ``req`` (int64, broadcast to ``pos``; any value where
    the row is not ok) whose table row starts at logical page ``first_page``; −1 where not ok,
    pos < 0, the page index is outside [0, cols) or the entry is negative or above ``max_entry``
    (its slots would not fit the result's dtype)."""
    ok = ok & (pos >= 0)
    keep = ok.to(tl.int64)
    safe = pos * keep
    pidx = safe // PAGE_SIZE - first_page
    inside = ok & (pidx >= 0) & (pidx < cols)
    ins = inside.to(tl.int64)
    entry = tl.load(table_ptr + req * keep * t_stride0 + pidx * ins * t_stride1, mask=inside, other=-1)
    entry = entry.to(tl.int64)
    good = ((entry >= 0) & (entry <= max_entry)).to(tl.int64)  # masked lanes read −1
    return good * (entry * PAGE_SIZE + safe % PAGE_SIZE + 1) - 1


@triton.jit
def find_request(qsl_ptr, qsl_stride, requests, t, live, steps):
    """For absolute token indices ``t`` (int64 [BM]): (inside, request, qsl[r], qsl[r + 1]) with
    r = the number of qsl[1..R] entries <= t (torch.searchsorted(right=True) on sorted offsets),
    by rows_jit.search_step, ``steps`` = bit length of R times (a runtime bound: R changes every
    engine step, a constexpr would recompile); inside = t >= qsl[0] and r < R. Outside rows get
    request 0 and zero offsets."""
    lo = tl.zeros(t.shape, tl.int64)
    hi = lo + requests
    for _ in range(steps):
        lo, hi = search_step(qsl_ptr, qsl_stride, t, live, lo, hi)
    first = tl.load(qsl_ptr).to(tl.int64)
    inside = live & (t >= first) & (lo < requests)
    req = lo * inside.to(tl.int64)
    start = tl.load(qsl_ptr + req * qsl_stride, mask=inside, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + (req + 1) * qsl_stride, mask=inside, other=0).to(tl.int64)
    return inside, req, start, end


@triton.jit
def token_request(req_ptr, req_stride, valid_ptr, valid_stride, t, live, requests, HAS_VALID: tl.constexpr):
    """(ok, request) of tokens t: ok where live, req[t] in [0, requests) and (HAS_VALID) is_valid[t];
    the request is 0 where not ok, so every address made from it stays inside its table."""
    r = tl.load(req_ptr + t * req_stride, mask=live, other=-1).to(tl.int64)
    ok = live & (r >= 0) & (r < requests)
    if HAS_VALID:
        ok = ok & (tl.load(valid_ptr + t * valid_stride, mask=live, other=0) != 0)
    return ok, r * ok.to(tl.int64)


@triton.jit
def int32_entries(x):
    """int64 index-row entries -> int32, −1 outside the int32 range (as the reference)."""
    fits = ((x >= -2147483648) & (x <= 2147483647)).to(tl.int64)
    return (fits * (x + 1) - 1).to(tl.int32)


@triton.jit
def load_row(ptr, stride, req, mask):
    """``ptr[req]`` as int64 where mask, 0 elsewhere (req: int64 [BM])."""
    return tl.load(ptr + req * stride, mask=mask, other=0).to(tl.int64)


@_kernel
def table_slot_mapping_kernel(pos_ptr, req_ptr, valid_ptr, table_ptr, base_ptr, out_ptr, n, requests, cols,
                              stride, pos_stride, req_stride, valid_stride, t_stride0, t_stride1, base_stride,
                              max_entry, HAS_VALID: tl.constexpr, HAS_BASE: tl.constexpr, PAGE_SIZE: tl.constexpr,
                              BLOCK: tl.constexpr):
    """out[t] = slot of logical row positions[t] // stride of request req[t], −1 if invalid."""
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = t < n
    p = tl.load(pos_ptr + t * pos_stride, mask=live, other=-1).to(tl.int64)
    r = tl.load(req_ptr + t * req_stride, mask=live, other=-1).to(tl.int64)
    ok = live & (p >= 0) & (r >= 0) & (r < requests)
    if HAS_VALID:
        ok = ok & (tl.load(valid_ptr + t * valid_stride, mask=live, other=0) != 0)
    r = r * ok.to(tl.int64)
    first = 0
    if HAS_BASE:
        first = load_row(base_ptr, base_stride, r, ok)
    row = (p * ok.to(tl.int64)) // stride
    slot = table_slot(table_ptr, t_stride0, t_stride1, cols, r, first, row, ok, max_entry, PAGE_SIZE)
    tl.store(out_ptr + t, slot, mask=live)


@_kernel
def compressed_slot_mapping_kernel(err_ptr, qsl_ptr, seq_ptr, table_ptr, base_ptr, req_ptr, valid_ptr, out_ptr, n,
                                   total, requests, cols, ratio, qsl_stride, seq_stride, t_stride0, t_stride1,
                                   base_stride, req_stride, valid_stride, out_stride, steps, max_entry,
                                   HAS_BASE: tl.constexpr, HAS_REQ: tl.constexpr, HAS_VALID: tl.constexpr,
                                   PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, SITE: tl.constexpr):
    """out[t] for t < total: the compressed slot of token t when it ends a group (t < n), else −1.
    The token's request is found in query_start_loc, and program 0 records offsets that decrease
    (rows found for such offsets are whatever the search gives; never outside out); HAS_REQ:
    it is req[t] instead (−1 outside [0, requests); nothing searched or recorded). HAS_VALID:
    tokens whose is_valid entry is 0 get −1."""
    if not HAS_REQ:
        if tl.program_id(0) == 0:
            record_order(err_ptr, qsl_ptr, qsl_stride, requests + 1, False, SITE)
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = t < total
    if HAS_REQ:
        inside, r = token_request(req_ptr, req_stride, valid_ptr, valid_stride, t, t < n, requests, HAS_VALID)
        start = load_row(qsl_ptr, qsl_stride, r, inside)
        end = load_row(qsl_ptr, qsl_stride, r + 1, inside)
    else:
        inside, r, start, end = find_request(qsl_ptr, qsl_stride, requests, t, t < n, steps)
        if HAS_VALID:
            inside = inside & (tl.load(valid_ptr + t * valid_stride, mask=t < n, other=0) != 0)
    p = load_row(seq_ptr, seq_stride, r, inside) - (end - start) + (t - start)
    ok = inside & (p >= 0)
    p = p * ok.to(tl.int64)
    ok = ok & ((p + 1) % ratio == 0)
    first = 0
    if HAS_BASE:
        first = load_row(base_ptr, base_stride, r, ok)
    slot = table_slot(table_ptr, t_stride0, t_stride1, cols, r, first, p // ratio, ok, max_entry, PAGE_SIZE)
    tl.store(out_ptr + t * out_stride, slot, mask=live)


@_kernel
def global_topk_kernel(topk_ptr, req_ptr, valid_ptr, table_ptr, base_ptr, out_ptr, lens_ptr, counts_ptr, n, width,
                       requests, cols, k_stride0, k_stride1, req_stride, valid_stride, t_stride0, t_stride1,
                       base_stride, out_stride0, out_stride1, lens_stride, counts_stride, max_entry,
                       HAS_VALID: tl.constexpr, HAS_BASE: tl.constexpr, SCAN: tl.constexpr,
                       HAS_COUNTS: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_J: tl.constexpr):
    """out[t, j] = slot of compressed index topk[t, j] through req[t]'s table row (−1 stays −1;
    HAS_BASE: the index minus base[r] * PAGE_SIZE, −1 where that is negative or beyond int32);
    lens[t] = count of the (shifted) indices >= 0, or (SCAN) one past the last topk[t, j] >= 0;
    HAS_COUNTS: counts[t] = the slots >= 0 of row t. Invalid rows: all −1, lengths 0."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = t < n
    ok, r = token_request(req_ptr, req_stride, valid_ptr, valid_stride, t, live, requests, HAS_VALID)
    shift = tl.zeros([BLOCK_M], tl.int64)
    if HAS_BASE:
        shift = load_row(base_ptr, base_stride, r, ok) * PAGE_SIZE
    count = tl.zeros([BLOCK_M], tl.int32)
    mapped = tl.zeros([BLOCK_M], tl.int32)
    extent = tl.zeros([BLOCK_M], tl.int64)
    for j0 in range(0, width, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J).to(tl.int64)
        in_row = live[:, None] & (j < width)[None, :]
        v = tl.load(topk_ptr + t[:, None] * k_stride0 + j[None, :] * k_stride1,
                    mask=in_row & ok[:, None], other=-1).to(tl.int64)
        if SCAN:  # masked lanes read −1: they add nothing
            extent = tl.maximum(extent, tl.max((j[None, :] + 1) * (v >= 0).to(tl.int64), axis=1))
        if HAS_BASE:
            moved = v - shift[:, None]
            keep = ((v >= 0) & (moved >= 0) & (moved <= 2147483647)).to(tl.int64)
            v = keep * (moved + 1) - 1
        count += tl.sum((v >= 0).to(tl.int32), axis=1)
        slot = table_slot(table_ptr, t_stride0, t_stride1, cols, r[:, None], 0, v, ok[:, None], max_entry, PAGE_SIZE)
        if HAS_COUNTS:
            mapped += tl.sum(((slot >= 0) & in_row).to(tl.int32), axis=1)
        tl.store(out_ptr + t[:, None] * out_stride0 + j[None, :] * out_stride1, slot.to(tl.int32), mask=in_row)
    if SCAN:
        count = extent.to(tl.int32)
    tl.store(lens_ptr + t * lens_stride, count, mask=live)
    if HAS_COUNTS:
        tl.store(counts_ptr + t * counts_stride, mapped, mask=live)


@triton.jit
def window_entries(j, start, swa_len, p, gather_start, row_base):
    """Workspace entries of the sliding window for index columns ``j`` ([1, BJ]) of rows whose
    window starts at column ``start`` ([BM, 1]); −1 before the gathered range or outside the
    window columns."""
    q = p - swa_len + 1 + (j - start)
    keep = ((j >= start) & (j < start + swa_len) & (q >= gather_start)).to(tl.int64)
    return keep * (row_base + q - gather_start + 1) - 1


@_kernel
def combine_topk_swa_kernel(err_ptr, topk_ptr, qsl_ptr, seq_ptr, glen_ptr, out_ptr, lens_ptr, n, width, requests,
                            topk, ratio, window, ww, cb, k_stride0, k_stride1, qsl_stride, seq_stride, glen_stride,
                            steps, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, SITE: tl.constexpr):
    """Row t (absolute token qsl[0] + t): [topk_len top-k entries + b * ww | swa_len window
    entries | −1]; rows outside every request: all −1, length 0. Program 0 also records
    query_start_loc that decreases."""
    if tl.program_id(0) == 0:
        record_order(err_ptr, qsl_ptr, qsl_stride, requests + 1, False, SITE)
    t = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = t < n
    t_abs = t + tl.load(qsl_ptr).to(tl.int64)
    inside, r, start, end = find_request(qsl_ptr, qsl_stride, requests, t_abs, live, steps)
    seq = load_row(seq_ptr, seq_stride, r, inside)
    p = seq - (end - start) + (t_abs - start)
    keep = inside.to(tl.int64)
    p1 = tl.maximum(p + 1, 0)
    topk_len = tl.minimum(p1 // ratio, topk) * keep
    swa_len = tl.minimum(p1, window) * keep
    row_base = r * ww
    gather_start = seq - load_row(glen_ptr, glen_stride, r, inside)
    for j0 in range(0, width, BLOCK_J):
        j = (j0 + tl.arange(0, BLOCK_J).to(tl.int64))[None, :]
        in_topk = j < topk_len[:, None]
        v = tl.load(topk_ptr + t[:, None] * k_stride0 + j * k_stride1, mask=in_topk, other=-1).to(tl.int64)
        v = v + row_base[:, None] * (v >= 0).to(tl.int64)  # a negative index stays as it is
        sw = window_entries(j, topk_len[:, None], swa_len[:, None], p[:, None], gather_start[:, None],
                            (row_base + cb)[:, None])
        out = in_topk.to(tl.int64) * (v - sw) + sw  # sw is −1 in the top-k columns
        tl.store(out_ptr + t[:, None] * width + j, int32_entries(out), mask=live[:, None] & (j < width))
    tl.store(lens_ptr + t, (topk_len + swa_len).to(tl.int32), mask=live)


@_kernel
def combine_dense_swa_kernel(pos_ptr, req_ptr, seq_ptr, clens_ptr, glen_ptr, out_ptr, lens_ptr, n, width, requests,
                             ratio, window, ww, cb, pos_stride, req_stride, seq_stride, clens_stride, glen_stride,
                             HAS_COMPRESSED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr):
    """Row t: [r * ww + j for the compressed_len compressed rows | window entries | −1];
    request index outside [0, R): all −1, length 0."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = t < n
    r = tl.load(req_ptr + t * req_stride, mask=live, other=-1).to(tl.int64)
    ok = live & (r >= 0) & (r < requests)
    keep = ok.to(tl.int64)
    r = r * keep
    p = tl.load(pos_ptr + t * pos_stride, mask=ok, other=0).to(tl.int64)
    p1 = tl.maximum(p + 1, 0)
    comp_len = tl.zeros([BLOCK_M], tl.int64)
    if HAS_COMPRESSED:
        comp_len = tl.minimum(p1 // ratio, load_row(clens_ptr, clens_stride, r, ok))
        comp_len = tl.minimum(tl.maximum(comp_len, 0), cb) * keep
    swa_len = tl.minimum(p1, window) * keep
    row_base = r * ww
    gather_start = load_row(seq_ptr, seq_stride, r, ok) - load_row(glen_ptr, glen_stride, r, ok)
    for j0 in range(0, width, BLOCK_J):
        j = (j0 + tl.arange(0, BLOCK_J).to(tl.int64))[None, :]
        in_comp = (j < comp_len[:, None]).to(tl.int64)
        sw = window_entries(j, comp_len[:, None], swa_len[:, None], p[:, None], gather_start[:, None],
                            (row_base + cb)[:, None])
        out = in_comp * (row_base[:, None] + j - sw) + sw
        tl.store(out_ptr + t[:, None] * width + j, int32_entries(out), mask=live[:, None] & (j < width))
    tl.store(lens_ptr + t, (comp_len + swa_len).to(tl.int32), mask=live)


@_kernel
def decode_swa_kernel(err_ptr, qsl_ptr, seq_ptr, req_ptr, valid_ptr, table_ptr, base_ptr, out_ptr, lens_ptr, n,
                      requests, cols, window, qsl_stride, seq_stride, req_stride, valid_stride, t_stride0, t_stride1,
                      base_stride, out_stride0, out_stride1, lens_stride, max_entry,
                      HAS_VALID: tl.constexpr, HAS_BASE: tl.constexpr, PAGE_SIZE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, SITE: tl.constexpr):
    """Row t: slots of the window positions max(p - window + 1, 0) .. p of token t of request
    req[t] (−1 for a missing page, −1 after the window); invalid tokens: all −1, length 0.
    Program 0 also records query_start_loc that decreases, after its stores."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = t < n
    ok, r = token_request(req_ptr, req_stride, valid_ptr, valid_stride, t, live, requests, HAS_VALID)
    keep = ok.to(tl.int64)
    start = load_row(qsl_ptr, qsl_stride, r, ok)
    end = load_row(qsl_ptr, qsl_stride, r + 1, ok)
    p = load_row(seq_ptr, seq_stride, r, ok) - (end - start) + (t - start)
    first_pos = tl.maximum(p - window + 1, 0)
    swa_len = tl.maximum(p - first_pos + 1, 0) * keep
    first = 0
    if HAS_BASE:
        first = load_row(base_ptr, base_stride, r, ok)[:, None]
    for j0 in range(0, window, BLOCK_J):
        j = (j0 + tl.arange(0, BLOCK_J).to(tl.int64))[None, :]
        m = j < swa_len[:, None]
        slot = table_slot(table_ptr, t_stride0, t_stride1, cols, r[:, None], first, first_pos[:, None] + j, m,
                          max_entry, PAGE_SIZE)
        tl.store(out_ptr + t[:, None] * out_stride0 + j * out_stride1, slot.to(tl.int32),
                 mask=live[:, None] & (j < window))
    tl.store(lens_ptr + t * lens_stride, swa_len.to(tl.int32), mask=live)
    if tl.program_id(0) == 0:
        record_order(err_ptr, qsl_ptr, qsl_stride, requests + 1, False, SITE)


@_kernel
def dense_local_kernel(pos_ptr, out_ptr, n, ratio, width, pos_stride, out_stride0, out_stride1,
                       BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr):
    """out[t, j] = j if j < min((p + 1) // ratio, width) else −1."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = t < n
    p = tl.load(pos_ptr + t * pos_stride, mask=live, other=0).to(tl.int64)
    count = tl.maximum(p + 1, 0) // ratio
    for j0 in range(0, width, BLOCK_J):
        j = (j0 + tl.arange(0, BLOCK_J).to(tl.int64))[None, :]
        keep = (j < count[:, None]).to(tl.int64)
        tl.store(out_ptr + t[:, None] * out_stride0 + j * out_stride1, (keep * (j + 1) - 1).to(tl.int32),
                 mask=live[:, None] & (j < width))
