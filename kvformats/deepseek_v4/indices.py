"""Index helpers of the sparse attention path (spec/upstream.md §6.3, §1.3): slot mappings and the
index rows FlashMLA reads. Pure tensor arithmetic, no host synchronisation in the references.

Where tokenspeed leaves a result undefined this module defines it (see each docstring):
rows of invalid tokens are written (−1 entries, length 0) rather than left as they were; a −1
inside the top-k range stays −1 instead of receiving the workspace offset; a missing page
(negative entry, page index outside the table) gives −1 instead of wrapping to the last page;
a sliding-window position before the gathered range gives −1 instead of pointing at another
request's rows; an entry that does not fit the result's dtype gives −1 instead of wrapping (a
block-table page whose slots would pass int64, or int32 for the index rows, counts as missing;
an index-row entry beyond int32 is −1), and a Python-int parameter that cannot fit raises
InputError.
"""

from __future__ import annotations

import torch

from kvformats.codec import registry
from kvformats.codec.blocktable import request_of_token, table_slots
from kvformats.codec.op import Op
from kvformats.codec.torch_library import rows
from kvformats.deepseek_v4 import _dispatch as D
from kvformats.deepseek_v4 import _validation as C
from kvformats.dsv4_constants import ALIGN, INT32_MAX, INT64_MAX, max_page_entry, round_up
from kvformats.errors import InputError
from kvformats.runtime import deferred


def _i32(like, *shape):
    return like.new_empty(shape, dtype=torch.int32)


def _rows_cols(t) -> tuple[int, int]:
    """(rows, columns) of a 2-D ``t``, (rows, 0) otherwise: sizes a workspace before validation."""
    return (t.shape[0], t.shape[1]) if t.dim() == 2 else (rows(t), 0)


LENS_MODES = ("count", "scan")  # global_topk_indices_and_lens' ``lens``


# The index helpers. Fakes compute shapes, dtypes and strides only; the ``out=`` workspaces a
# wrapper allocates where the caller passes None are exactly the size of the result.
TABLE_SLOT_MAPPING = Op(D.MODEL_FAMILY, "table_slot_mapping",
                        fake=lambda positions, *_: positions.new_empty(positions.shape, dtype=torch.int64))
COMPRESSED_SLOT_MAPPING = Op(
    D.MODEL_FAMILY, "compressed_slot_mapping", mutates=("out",), sites=("query_start_loc",),
    workspaces={"out": lambda v: v["block_table"].new_empty(max(v["num_tokens"], 0), dtype=torch.int64)},
    result=lambda a: a["out"][:a["num_tokens"]])
GLOBAL_TOPK_INDICES_AND_LENS = Op(
    D.MODEL_FAMILY, "global_topk_indices_and_lens", mutates=("out_indices", "out_lens", "out_valid_lens"),
    workspaces={"out_indices": lambda v: _i32(v["topk_indices"], *_rows_cols(v["topk_indices"])),
                "out_lens": lambda v: _i32(v["topk_indices"], rows(v["topk_indices"])),
                "out_valid_lens": lambda v: _i32(v["topk_indices"], rows(v["topk_indices"]))},
    result=lambda a: (a["out_indices"], a["out_lens"]))
COMBINE_TOPK_SWA_INDICES = Op(
    D.MODEL_FAMILY, "combine_topk_swa_indices", sites=("query_start_loc",),
    fake=lambda topk_idx, qsl, sl, gl, window, ratio, topk, *_: (
        _i32(topk_idx, topk_idx.shape[0], round_up(topk + window, ALIGN)), _i32(topk_idx, topk_idx.shape[0])))
COMBINE_DENSE_SWA_INDICES = Op(
    D.MODEL_FAMILY, "combine_dense_swa_indices",
    fake=lambda pos, req, sl, cl, gl, window, ratio, ww, cb, *_: (
        _i32(pos, pos.shape[0], round_up(max(cb + window, 1), ALIGN)), _i32(pos, pos.shape[0])))
DECODE_SWA_INDICES_AND_LENS = Op(
    D.MODEL_FAMILY, "decode_swa_indices_and_lens", mutates=("out_indices", "out_lens"), sites=("query_start_loc",),
    workspaces={"out_indices": lambda v: _i32(v["req_indices"], rows(v["req_indices"]), max(v["window_size"], 0)),
                "out_lens": lambda v: _i32(v["req_indices"], rows(v["req_indices"]))},
    result=lambda a: (a["out_indices"][:a["req_indices"].shape[0]], a["out_lens"][:a["req_indices"].shape[0]]))
DENSE_PREFILL_LOCAL_COMPRESSED_INDICES = Op(
    D.MODEL_FAMILY, "dense_prefill_local_compressed_indices", mutates=("out",),
    workspaces={"out": lambda v: _i32(v["positions"], rows(v["positions"]), max(v["width"], 0))},
    result=lambda a: a["out"][:a["positions"].shape[0], :a["width"]])

def _table_limit(page_size: int, limit: int) -> int | None:
    """``table_slots``' num_pages for ``max_page_entry`` (None where every int64 entry fits)."""
    top = max_page_entry(page_size, limit)
    return None if top >= INT64_MAX else top + 1


def _check_fits(name: str, value: int, limit: int) -> None:
    """A Python-int parameter the result's entries are built from is at most ``limit``."""
    if value > limit:
        kind = "int32 index rows" if limit == INT32_MAX else "int64 slots"
        raise InputError(f"{name} = {value} cannot fit the {kind} (at most {limit} = 2**{limit.bit_length()} - 1); "
                         f"pass a smaller {name}")


def _check_sizes(*sizes: tuple[str, int, int]) -> None:
    """Python-int sizes ``(name, value, limit)``: each an int >= 1, then each at most its limit."""
    for name, value, _ in sizes:
        C.check_int(name, value, minimum=1)
    for name, value, limit in sizes:
        _check_fits(name, value, limit)


def _check_requests(block_table, base_offsets, query_start_loc, seq_lens, device) -> None:
    """A block table (optional base offsets) of R requests, their query_start_loc [R + 1] and
    seq_lens [R]."""
    r = C.check_table(block_table, None, device, base_offsets)
    C.check_index("query_start_loc", query_start_loc, r + 1, device)
    C.check_index("seq_lens", seq_lens, r, device)


def _int32_entries(x: torch.Tensor) -> torch.Tensor:
    """int64 index-row entries -> int32, −1 for those outside the int32 range (no wrapping)."""
    return torch.where((x >= -INT32_MAX - 1) & (x <= INT32_MAX), x, -1).to(torch.int32)


def _device(t):
    return t.device if isinstance(t, torch.Tensor) else None


def _check_offsets(qsl, check, fn, op: Op) -> None:
    """query_start_loc never decreases: on the host (CPU, strict) or on the device (a kernel
    records it; the reference records through torch operations)."""
    if deferred.on_host(check, qsl):
        C.check_sorted("query_start_loc", qsl)
    elif not registry.is_kernel(fn):
        deferred.record_decrease(qsl, op.site("query_start_loc"), start_zero=False)


def _valid_tokens(req, requests: int, is_valid_token):
    ok = (req >= 0) & (req < requests)
    return ok if is_valid_token is None else ok & is_valid_token.bool()


# ----- slot mappings ----------------------------------------------------------------------------
@TABLE_SLOT_MAPPING.public
def table_slot_mapping(*, positions: torch.Tensor, req_indices: torch.Tensor, block_table: torch.Tensor,
                       page_size: int, entry_stride: int = 1, block_table_base_offsets: torch.Tensor | None = None,
                       is_valid_token: torch.Tensor | None = None, backend: str = "auto",
                       check: bool | str = True) -> torch.Tensor:
    """int64 ``[T]`` slots of a cache group (spec/upstream.md §1.3): logical row ``p // entry_stride``
    (1 for SWA/state groups, ``ratio`` for compressed groups), page ``table[r, row // page_size
    - base[r]]``, slot ``page * page_size + row % page_size``; −1 for missing pages and invalid
    tokens, and for pages whose slots would pass int64 (entries above
    ``max_page_entry(page_size, 2**63 - 1)``). (Compressed groups: every token of a group maps to
    the group's slot; the compress inserts write only at the group's last token.) No value of
    these inputs is invalid: ``check`` (spec/checks.md) is validated and changes nothing."""
    C.check_mode(check)
    dev = _device(positions)
    n = C.check_index("positions", positions, None, dev)
    C.check_index("req_indices", req_indices, n, dev)
    C.check_table(block_table, None, dev, block_table_base_offsets)
    if is_valid_token is not None:
        C.check_tensor("is_valid_token", is_valid_token, dtypes=(torch.bool,), shape=(n,), device=dev)
    _check_sizes(("page_size", page_size, INT64_MAX), ("entry_stride", entry_stride, INT64_MAX))
    return TABLE_SLOT_MAPPING.resolve(backend, dev)(positions, req_indices, block_table, page_size,
                                                          entry_stride, block_table_base_offsets, is_valid_token)


@TABLE_SLOT_MAPPING.reference
def table_slot_mapping_reference(positions, req, table, page_size, stride, base, is_valid):
    p = positions.long()
    slots = table_slots(table, req, torch.div(p, stride, rounding_mode="floor"), page_size, base,
                        _table_limit(page_size, INT64_MAX))
    ok = _valid_tokens(req, table.shape[0], is_valid) & (p >= 0)
    return torch.where(ok, slots, torch.full_like(slots, -1))


@COMPRESSED_SLOT_MAPPING.public
def compressed_slot_mapping(*, num_tokens: int, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            block_table: torch.Tensor, page_size: int, ratio: int,
                            block_table_base_offsets: torch.Tensor | None = None,
                            req_indices: torch.Tensor | None = None, is_valid_token: torch.Tensor | None = None,
                            out: torch.Tensor | None = None, backend: str = "auto",
                            check: bool | str = True) -> torch.Tensor:
    """int64 ``[num_tokens]``: the compressed-cache slot of each group-ending token, −1 elsewhere.

    Request r (``query_start_loc [R + 1]``, ``seq_lens [R]``, ``block_table [R, P]``) owns tokens
    ``[qsl[r], qsl[r+1])``; token t is at ``p = seq_lens[r] - (qsl[r+1] - qsl[r]) + (t - qsl[r])``.
    If ``(p + 1) % ratio == 0``: ``c = p // ratio``, slot ``table[r, c // page_size - base[r]] *
    page_size + c % page_size`` (−1 when that page is missing, or its slots would pass int64).
    Tokens outside every request: −1.
    ``req_indices`` (int ``[num_tokens]``, optional): token t's request is ``req_indices[t]``
    rather than the one whose ``query_start_loc`` range holds t (tokenspeed's per-token requests);
    a request outside ``[0, R)`` gives −1, and ``query_start_loc`` is read only in the position
    above (any values; not checked, nothing recorded). ``is_valid_token`` (bool ``[num_tokens]``,
    optional): tokens where it is False get −1.
    ``out`` (int64 ``[>= num_tokens]``) is filled with −1 entirely, then the first num_tokens
    entries are written; the returned tensor is a view of it. Without ``req_indices``,
    ``query_start_loc`` must never decrease: checked as ``check`` says (spec/checks.md; on a GPU
    recorded, not raised).
    """
    dev = _device(block_table)
    C.check_int("num_tokens", num_tokens)
    _check_requests(block_table, block_table_base_offsets, query_start_loc, seq_lens, dev)
    _check_sizes(("page_size", page_size, INT64_MAX), ("ratio", ratio, INT64_MAX))
    if req_indices is not None:
        C.check_index("req_indices", req_indices, num_tokens, dev)
    if is_valid_token is not None:
        C.check_tensor("is_valid_token", is_valid_token, dtypes=(torch.bool,), shape=(num_tokens,), device=dev)
    if out is not None:
        C.check_tensor("out", out, dtypes=(torch.int64,), shape=(None,), device=dev)
        if out.shape[0] < num_tokens:
            raise InputError(f"out must hold at least num_tokens = {num_tokens} entries, got {out.shape[0]}")
    fn = COMPRESSED_SLOT_MAPPING.resolve(backend, dev)
    if req_indices is None:
        _check_offsets(query_start_loc, check, fn, COMPRESSED_SLOT_MAPPING)
    else:
        C.check_mode(check)
    return fn(num_tokens, query_start_loc, seq_lens, block_table, page_size, ratio, block_table_base_offsets, out,
              req_indices, is_valid_token)


def _token_positions(query_start_loc, seq_lens, t_abs, requests):
    """(request, inside, position) of absolute token indices."""
    req, inside = request_of_token(query_start_loc, t_abs, requests)
    qsl = query_start_loc.long()
    if requests == 0:
        return req, inside, torch.zeros_like(t_abs)
    qlen = qsl[req + 1] - qsl[req]
    return req, inside, seq_lens.long()[req] - qlen + (t_abs - qsl[req])


def _request_positions(query_start_loc, seq_lens, t, req, requests):
    """(request clamped into the table, inside, position) of tokens ``t`` of requests ``req``
    (``compressed_slot_mapping``'s ``req_indices``): inside where ``0 <= req < requests``."""
    r = req.long()
    inside = (r >= 0) & (r < requests)
    if requests == 0:
        return r.clamp(0, 0), inside, torch.zeros_like(t)
    r = r.clamp(0, requests - 1)
    qsl = query_start_loc.long()
    return r, inside, seq_lens.long()[r] - (qsl[r + 1] - qsl[r]) + (t - qsl[r])


@COMPRESSED_SLOT_MAPPING.reference
def compressed_slot_mapping_reference(num_tokens, qsl, seq_lens, table, page_size, ratio, base, out, req_indices=None,
                                      is_valid=None):
    t = torch.arange(num_tokens, device=table.device)
    if req_indices is None:
        req, inside, p = _token_positions(qsl, seq_lens, t, table.shape[0])
    else:
        req, inside, p = _request_positions(qsl, seq_lens, t, req_indices, table.shape[0])
    if is_valid is not None:
        inside = inside & is_valid
    slots = table_slots(table, req, torch.div(p, ratio, rounding_mode="floor"), page_size, base,
                        _table_limit(page_size, INT64_MAX))
    ok = inside & (p >= 0) & ((p + 1) % ratio == 0)
    slots = torch.where(ok, slots, torch.full_like(slots, -1))
    if out is None:
        return slots
    out.fill_(-1)
    out[:num_tokens] = slots
    return out[:num_tokens]


# ----- top-k / sparse index rows ----------------------------------------------------------------
@GLOBAL_TOPK_INDICES_AND_LENS.public
def global_topk_indices_and_lens(*, topk_indices: torch.Tensor, req_indices: torch.Tensor, block_table: torch.Tensor,
                                 page_size: int, is_valid_token: torch.Tensor | None = None,
                                 block_table_base_offsets: torch.Tensor | None = None, lens: str = "count",
                                 out_indices: torch.Tensor | None = None, out_lens: torch.Tensor | None = None,
                                 out_valid_lens: torch.Tensor | None = None, backend: str = "auto",
                                 check: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Map local compressed indices to global compressed-cache slots.

    ``topk_indices`` int32 ``[T, K]`` (−1 = none), ``req_indices [T]``, ``block_table [R, P]``.
    Returns ``(global int32 [T, K], lens int32 [T])``: ``i >= 0`` becomes ``table[r, i // page_size]
    * page_size + i % page_size`` (−1 if that page is missing, or its slots would pass int32:
    entries above ``max_page_entry(page_size, 2**31 - 1)``), −1 stays −1. Invalid tokens
    (``is_valid_token`` False or request out of range) get an all −1 row and length 0 (tokenspeed
    leaves their row unwritten).

    ``block_table_base_offsets`` (int ``[R]``, optional): the entries are absolute, the table row
    starts at logical page ``base[r]``: ``i`` is first shifted to ``i - base[r] * page_size``, −1
    where that is negative or beyond int32, then mapped as above. ``lens``: ``"count"`` (default)
    counts the (shifted) entries ``>= 0``; ``"scan"`` is one past the last entry ``i >= 0`` of the
    given row (tokenspeed's scan extent, unaffected by the shift and the table). ``out_valid_lens``
    (int32 ``[T]``, optional) receives the number of entries ``>= 0`` of each result row (the slots
    that were mapped). ``out_indices`` (int32 ``[T, K]``) and ``out_lens`` (int32 ``[T]``) receive the
    results and are returned when given. No value of these inputs is invalid: ``check``
    (spec/checks.md) is validated and changes nothing.
    """
    C.check_mode(check)
    dev = _device(topk_indices)
    C.check_tensor("topk_indices", topk_indices, dtypes=(torch.int32,), shape=(None, None), device=dev)
    n, k = topk_indices.shape
    C.check_index("req_indices", req_indices, n, dev)
    C.check_table(block_table, None, dev, block_table_base_offsets)
    _check_sizes(("page_size", page_size, INT64_MAX))
    if is_valid_token is not None:
        C.check_tensor("is_valid_token", is_valid_token, dtypes=(torch.bool,), shape=(n,), device=dev)
    if not isinstance(lens, str) or lens not in LENS_MODES:
        raise InputError(f"lens must be one of {LENS_MODES}, got {lens!r}")
    for name, out, shape in (("out_indices", out_indices, (n, k)), ("out_lens", out_lens, (n,)),
                             ("out_valid_lens", out_valid_lens, (n,))):
        if out is not None:
            C.check_tensor(name, out, dtypes=(torch.int32,), shape=shape, device=dev)
    fn = GLOBAL_TOPK_INDICES_AND_LENS.resolve(backend, dev)
    return fn(topk_indices, req_indices, block_table, page_size, is_valid_token, block_table_base_offsets, lens,
              out_indices, out_lens, out_valid_lens)


def _shifted_entries(topk, req, table, base, page_size: int) -> torch.Tensor:
    """int64 entries ``i - base[r] * page_size`` of int ``[T, K]`` local entries, −1 where ``i < 0``
    or the result is negative or beyond int32 (``global_topk_indices_and_lens``' base offsets)."""
    rows = table.shape[0]
    local = topk.long()
    if base is None or rows == 0:
        return local
    moved = local - base.long()[req.long().clamp(0, rows - 1)].unsqueeze(1) * page_size
    return torch.where((local >= 0) & (moved >= 0) & (moved <= INT32_MAX), moved, torch.full_like(moved, -1))


def _scan_extent(topk) -> torch.Tensor:
    """int64 ``[T]``: one past the last entry ``>= 0`` of each row (0 for none)."""
    n, k = topk.shape
    if k == 0:
        return topk.new_zeros(n, dtype=torch.int64)
    ends = torch.arange(1, k + 1, device=topk.device)
    return torch.where(topk >= 0, ends, 0).amax(dim=1)


@GLOBAL_TOPK_INDICES_AND_LENS.reference
def global_topk_indices_and_lens_reference(topk, req, table, page_size, is_valid, base=None, lens="count",
                                           out_indices=None, out_lens=None, out_valid_lens=None):
    ok = _valid_tokens(req.long(), table.shape[0], is_valid)
    local = _shifted_entries(topk, req, table, base, page_size)
    glob = table_slots(table, req, local, page_size, None, _table_limit(page_size, INT32_MAX))
    glob = torch.where(ok[:, None], glob, torch.full_like(glob, -1)).to(torch.int32)
    extent = _scan_extent(topk) if lens == "scan" else (local >= 0).sum(dim=1)
    size = torch.where(ok, extent, torch.zeros_like(extent)).to(torch.int32)
    if out_valid_lens is not None:
        out_valid_lens.copy_((glob >= 0).sum(dim=1))
    if out_indices is not None:
        glob = out_indices.copy_(glob)
    if out_lens is not None:
        size = out_lens.copy_(size)
    return glob, size


def _swa_entries(j, start, swa_len, p, gather_start, row_base):
    """Workspace rows of the sliding window (entry j - start of the window); −1 before the gather."""
    pos = p[:, None] - swa_len[:, None] + 1 + (j[None, :] - start[:, None])
    ok = pos >= gather_start[:, None]
    return torch.where(ok, row_base[:, None] + pos - gather_start[:, None], torch.full_like(pos, -1))


def _check_workspace_args(window_size, ratio, workspace_width, compressed_base):
    C.check_int("window_size", window_size, minimum=1)
    C.check_int("ratio", ratio, minimum=0)
    C.check_int("workspace_width", workspace_width, minimum=1)
    C.check_int("compressed_base", compressed_base)
    # int32 index rows: a workspace row stride or offset beyond int32 addresses no row past the
    # first request's, and a row's length (up to compressed_base or topk, plus the window) is int32
    _check_fits("ratio", ratio, INT64_MAX)
    _check_fits("workspace_width", workspace_width, INT32_MAX)
    _check_fits("compressed_base + window_size", compressed_base + window_size, INT32_MAX)


@COMBINE_TOPK_SWA_INDICES.public
def combine_topk_swa_indices(*, topk_indices: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                             gather_lens: torch.Tensor, window_size: int, ratio: int, topk: int,
                             workspace_width: int, compressed_base: int, backend: str = "auto",
                             check: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-prefill index rows ``[top-k compressed | sliding window]`` into the per-request
    workspace (rows ``[compressed | SWA]``, flattened with row stride ``workspace_width``).

    Token row t (absolute token ``qsl[0] + t`` of request b, position p as in
    ``compressed_slot_mapping``) gets ``topk_len = min((p + 1) // ratio, topk)`` entries
    ``topk_indices[t, j] + b * workspace_width`` (a −1 stays −1), then ``swa_len = min(p + 1,
    window_size)`` entries ``b * workspace_width + compressed_base + (q - gather_start)`` for the
    window positions q, ``gather_start = seq_lens[b] - gather_lens[b]`` (a q before gather_start
    gives −1), then −1. Returns ``(int32 [T, roundup(topk + window_size, 128)], lens int32 [T] =
    topk_len + swa_len)``; rows outside every request: all −1, length 0. An entry beyond the int32
    range (e.g. ``b * workspace_width`` past 2**31 - 1) is −1; ``workspace_width``,
    ``compressed_base + window_size`` and ``topk + window_size`` must fit int32 (InputError).
    ``query_start_loc`` must never decrease: checked as ``check`` says (spec/checks.md).
    """
    dev = _device(topk_indices)
    C.check_tensor("topk_indices", topk_indices, dtypes=C.INDEX_DTYPES, shape=(None, None), device=dev)
    r = C.check_index("seq_lens", seq_lens, None, dev)
    C.check_index("query_start_loc", query_start_loc, r + 1, dev)
    C.check_index("gather_lens", gather_lens, r, dev)
    _check_workspace_args(window_size, ratio, workspace_width, compressed_base)
    C.check_int("ratio", ratio, minimum=1)
    C.check_int("topk", topk)
    _check_fits("topk + window_size", topk + window_size, INT32_MAX)
    if topk_indices.shape[1] < topk:
        raise InputError(f"topk_indices must have at least topk = {topk} columns, got {topk_indices.shape[1]}")
    fn = COMBINE_TOPK_SWA_INDICES.resolve(backend, dev)
    _check_offsets(query_start_loc, check, fn, COMBINE_TOPK_SWA_INDICES)
    return fn(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, ratio, topk, workspace_width,
              compressed_base)


@COMBINE_TOPK_SWA_INDICES.reference
def combine_topk_swa_indices_reference(topk_idx, qsl, seq_lens, gather_lens, window, ratio, topk, ww, cb):
    n, dev = topk_idx.shape[0], topk_idx.device
    width = round_up(topk + window, ALIGN)
    req, inside, p = _token_positions(qsl, seq_lens, qsl.long()[0] + torch.arange(n, device=dev), seq_lens.shape[0])
    topk_len = torch.div(p + 1, ratio, rounding_mode="floor").clamp(0, topk)
    swa_len = (p + 1).clamp(0, window)
    row_base = req * ww
    j = torch.arange(width, device=dev)
    tk = torch.full((n, width), -1, dtype=torch.int64, device=dev)
    tk[:, :topk] = topk_idx[:, :topk]
    tk = torch.where(tk >= 0, tk + row_base[:, None], tk)
    gather_start = seq_lens.long()[req] - gather_lens.long()[req] if seq_lens.shape[0] else p
    sw = _swa_entries(j, topk_len, swa_len, p, gather_start, row_base + cb)
    out = torch.where(j < topk_len[:, None], tk, torch.where(j < (topk_len + swa_len)[:, None], sw, -1))
    out = torch.where(inside[:, None], out, -1)
    return _int32_entries(out), torch.where(inside, topk_len + swa_len, 0).to(torch.int32)


@COMBINE_DENSE_SWA_INDICES.public
def combine_dense_swa_indices(*, positions: torch.Tensor, req_indices: torch.Tensor, seq_lens: torch.Tensor,
                              compressed_lens: torch.Tensor, gather_lens: torch.Tensor, window_size: int, ratio: int,
                              workspace_width: int, compressed_base: int, backend: str = "auto",
                              check: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense-prefill index rows ``[all compressed entries | sliding window]`` into the workspace.

    Token t of request r at ``positions[t]`` = p: ``compressed_len = min((p + 1) // ratio,
    compressed_lens[r], compressed_base)`` (0 when ratio <= 1; the cap at compressed_base keeps
    compressed entries out of the SWA rows) entries ``r * workspace_width + j``, then the window
    entries as in ``combine_topk_swa_indices``, then −1. Returns ``(int32 [T, roundup(max(
    compressed_base + window_size, 1), 128)], lens int32 [T])``; tokens with a request index
    outside ``[0, R)``: all −1, length 0. Entries beyond the int32 range are −1; ``workspace_width``
    and ``compressed_base + window_size`` must fit int32 (InputError). No value of these inputs
    is invalid: ``check`` (spec/checks.md) is validated and changes nothing.
    """
    C.check_mode(check)
    dev = _device(positions)
    n = C.check_index("positions", positions, None, dev)
    C.check_index("req_indices", req_indices, n, dev)
    r = C.check_index("seq_lens", seq_lens, None, dev)
    C.check_index("compressed_lens", compressed_lens, r, dev)
    C.check_index("gather_lens", gather_lens, r, dev)
    _check_workspace_args(window_size, ratio, workspace_width, compressed_base)
    fn = COMBINE_DENSE_SWA_INDICES.resolve(backend, dev)
    return fn(positions, req_indices, seq_lens, compressed_lens, gather_lens, window_size, ratio, workspace_width,
              compressed_base)


@COMBINE_DENSE_SWA_INDICES.reference
def combine_dense_swa_indices_reference(positions, req, seq_lens, compressed_lens, gather_lens, window, ratio,
                                        ww, cb):
    dev, rq = positions.device, seq_lens.shape[0]
    width = round_up(max(cb + window, 1), ALIGN)
    ok = _valid_tokens(req.long(), rq, None)
    r = req.long().clamp(0, max(rq - 1, 0))
    p = positions.long()
    if ratio <= 1 or rq == 0:
        comp_len = torch.zeros_like(p)
    else:
        comp_len = torch.minimum(torch.div(p + 1, ratio, rounding_mode="floor"), compressed_lens.long()[r])
        comp_len = comp_len.clamp(0, cb)
    swa_len = (p + 1).clamp(0, window)
    row_base = r * ww
    gather_start = seq_lens.long()[r] - gather_lens.long()[r] if rq else p
    j = torch.arange(width, device=dev)
    sw = _swa_entries(j, comp_len, swa_len, p, gather_start, row_base + cb)
    out = torch.where(j < comp_len[:, None], row_base[:, None] + j,
                      torch.where(j < (comp_len + swa_len)[:, None], sw, -1))
    out = torch.where(ok[:, None], out, -1)
    return _int32_entries(out), torch.where(ok, comp_len + swa_len, 0).to(torch.int32)


@DECODE_SWA_INDICES_AND_LENS.public
def decode_swa_indices_and_lens(*, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, req_indices: torch.Tensor,
                                block_table: torch.Tensor, window_size: int, page_size: int,
                                block_table_base_offsets: torch.Tensor | None = None,
                                is_valid_token: torch.Tensor | None = None, out_indices: torch.Tensor | None = None,
                                out_lens: torch.Tensor | None = None, backend: str = "auto",
                                check: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """SWA-cache slots of each decode token's window -> ``(int32 [T, window_size], lens int32 [T])``.

    Token t of request r = ``req_indices[t]`` is at ``p = seq_lens[r] - (qsl[r+1] - qsl[r]) +
    (t - qsl[r])``; its window is ``max(p - window + 1, 0) .. p`` (``swa_len`` positions), entry j
    = the slot of window position j through ``block_table`` (with base offsets), −1 for a
    missing page (or one whose slots would pass int32); entries >= swa_len are −1. Invalid tokens
    get an all −1 row and length 0 (tokenspeed leaves their row unwritten). ``out_indices``
    (int32 ``[>= T, window_size]``) and ``out_lens`` (int32 ``[>= T]``) receive the first T rows
    when given. ``query_start_loc`` that decreases is checked as ``check`` says (spec/checks.md;
    on a GPU recorded, not raised; the rows are then whatever the offsets give, never outside the
    outputs).
    """
    dev = _device(req_indices)
    n = C.check_index("req_indices", req_indices, None, dev)
    _check_requests(block_table, block_table_base_offsets, query_start_loc, seq_lens, dev)
    _check_sizes(("window_size", window_size, INT32_MAX), ("page_size", page_size, INT64_MAX))
    if is_valid_token is not None:
        C.check_tensor("is_valid_token", is_valid_token, dtypes=(torch.bool,), shape=(n,), device=dev)
    for name, out, shape in (("out_indices", out_indices, (None, window_size)), ("out_lens", out_lens, (None,))):
        if out is not None:
            C.check_tensor(name, out, dtypes=(torch.int32,), shape=shape, device=dev)
            if out.shape[0] < n:
                raise InputError(f"{name} must have at least T = {n} rows, got {out.shape[0]}")
    fn = DECODE_SWA_INDICES_AND_LENS.resolve(backend, dev)
    _check_offsets(query_start_loc, check, fn, DECODE_SWA_INDICES_AND_LENS)
    return fn(query_start_loc, seq_lens, req_indices, block_table, window_size, page_size, block_table_base_offsets,
              is_valid_token, out_indices, out_lens)


@DECODE_SWA_INDICES_AND_LENS.reference
def decode_swa_indices_and_lens_reference(qsl, seq_lens, req, table, window, page_size, base, is_valid,
                                          out_indices, out_lens):
    n, dev, rq = req.shape[0], req.device, table.shape[0]
    ok = _valid_tokens(req.long(), rq, is_valid)
    r = req.long().clamp(0, max(rq - 1, 0))
    t = torch.arange(n, device=dev)
    if rq:
        q0 = qsl.long()
        p = seq_lens.long()[r] - (q0[r + 1] - q0[r]) + (t - q0[r])
    else:
        p = torch.full_like(t, -1)
    start = (p - window + 1).clamp_min(0)
    swa_len = (p - start + 1).clamp_min(0)
    j = torch.arange(window, device=dev)
    slots = table_slots(table, r, start[:, None] + j[None, :], page_size, base, _table_limit(page_size, INT32_MAX))
    idx = torch.where(ok[:, None] & (j[None, :] < swa_len[:, None]), slots, -1).to(torch.int32)
    lens = torch.where(ok, swa_len, 0).to(torch.int32)
    if out_indices is not None:
        out_indices[:n] = idx
        idx = out_indices[:n]
    if out_lens is not None:
        out_lens[:n] = lens
        lens = out_lens[:n]
    return idx, lens


@DENSE_PREFILL_LOCAL_COMPRESSED_INDICES.public
def dense_prefill_local_compressed_indices(*, positions: torch.Tensor, ratio: int, width: int,
                                           out: torch.Tensor | None = None, backend: str = "auto",
                                           check: bool | str = True) -> torch.Tensor:
    """int32 ``[T, width]``: ``j`` where ``j < min((p + 1) // ratio, width)``, else −1 (the local
    compressed rows a dense-prefill token may attend). ``out`` (int32 ``[>= T, >= width]``)
    receives ``out[:T, :width]`` and that view is returned. No value of ``positions`` is invalid:
    ``check`` (spec/checks.md) is validated and changes nothing."""
    C.check_mode(check)
    dev = _device(positions)
    n = C.check_index("positions", positions, None, dev)
    C.check_int("ratio", ratio, minimum=1)
    C.check_int("width", width)
    _check_fits("ratio", ratio, INT64_MAX)
    _check_fits("width", width, INT32_MAX)
    if out is not None:
        C.check_tensor("out", out, dtypes=(torch.int32,), shape=(None, None), device=dev)
        if out.shape[0] < n or out.shape[1] < width:
            raise InputError(f"out must be at least [{n}, {width}], got {tuple(out.shape)}")
    fn = DENSE_PREFILL_LOCAL_COMPRESSED_INDICES.resolve(backend, dev)
    return fn(positions, ratio, width, out)


@DENSE_PREFILL_LOCAL_COMPRESSED_INDICES.reference
def dense_prefill_local_compressed_indices_reference(positions, ratio, width, out):
    p = positions.long()
    count = torch.div(p + 1, ratio, rounding_mode="floor").clamp(0, width)
    j = torch.arange(width, device=p.device)
    idx = torch.where(j[None, :] < count[:, None], j[None, :], -1).to(torch.int32)
    if out is None:
        return idx
    out[:p.shape[0], :width] = idx
    return out[:p.shape[0], :width]
