"""The tokenspeed-kernel 0.1.4 index helpers kvformats has no model op for (part of
``_dsv4_indices``, whose docstring lists the departures; import them from
``kvformats.compat.tokenspeed_kernel.dsv4``): torch on any device, no host synchronization; the
argument helpers ``_dsv4_indices`` shares; and ``replayed``, the launch replay of the drop-ins
that adapt arguments only."""

from __future__ import annotations


import torch

from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.indices import _int32_entries, _swa_entries, _token_positions
from kvformats.dsv4_constants import ALIGN, round_up
from kvformats.errors import InputError, InputTypeError, describe
from kvformats.runtime import deferred

__all__ = ["dsv4_combine_topk_swa_indices", "dsv4_indexer_decode_metadata_compute", "dsv4_validate_active_cache_pages"]

_QSL_SITE = deferred.site("combine_topk_swa_indices", "query_start_loc")
ANY_INT = -(2**63)  # check_int minimum for a parameter that takes any int


def device_of(t):
    return t.device if isinstance(t, torch.Tensor) else None


def vector(name: str, t, n: int | None, device, dtypes=C.INDEX_DTYPES):
    """``t``'s first ``n`` entries: a 1-D tensor of ``dtypes`` on ``device`` with at least ``n``
    (tokenspeed reads the first entries of a longer per-token or per-request tensor); all of it
    for ``n`` None."""
    C.check_tensor(name, t, dtypes=dtypes, shape=(None,), device=device)
    if n is None or t.shape[0] == n:
        return t
    if t.shape[0] < n:
        raise InputError(f"{name} must have at least {n} entries, got {describe(t)}")
    return t[:n]


def optional(name: str, t, n: int | None, device, dtypes=C.INDEX_DTYPES):
    return None if t is None else vector(name, t, n, device, dtypes)


def dsv4_combine_topk_swa_indices(*, topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio,
                                  topk, workspace_width, compressed_base, block_table_base_offsets=None,
                                  compressed_block_size=1, compressed_table_capacity=None):
    """Sparse-prefill rows ``(int32 [T, roundup(topk + window_size, 128)], lens int32 [T])``.

    Row t is token ``qsl[0] + t`` of request b, at position p (``seq_lens[b]`` minus the request's
    query length plus its index in the request). Its top-k part is the entries ``i >= 0`` among the
    first ``topk_len = min(max(min((p + 1) // compress_ratio - base[b] * compressed_block_size,
    capacity), 0), topk)`` of ``topk_indices[t]``, in order, each ``i + b * workspace_width``
    (capacity: ``compressed_table_capacity``, default ``compressed_base``); then ``min(p + 1,
    window_size)`` window rows ``b * workspace_width + compressed_base + q - gather_start`` of the
    positions q up to p (``gather_start = seq_lens[b] - gather_lens[b]``; -1 for q before it), then
    -1. lens counts both parts; rows outside every request: all -1, length 0."""
    dev = device_of(topk_indices)
    C.check_tensor("topk_indices", topk_indices, dtypes=C.INDEX_DTYPES, shape=(None, None), device=dev)
    n, k = topk_indices.shape
    requests = C.check_index("seq_lens", seq_lens, None, dev)
    qsl = vector("query_start_loc", query_start_loc, requests + 1, dev)
    gather_lens = vector("gather_lens", gather_lens, requests, dev)
    base = optional("block_table_base_offsets", block_table_base_offsets, requests, dev)
    C.check_int("window_size", window_size, minimum=1)
    C.check_int("compress_ratio", compress_ratio, minimum=1)
    C.check_int("topk", topk)
    C.check_int("workspace_width", workspace_width)
    C.check_int("compressed_base", compressed_base)
    C.check_int("compressed_block_size", compressed_block_size, minimum=1)
    if compressed_table_capacity is not None:
        C.check_int("compressed_table_capacity", compressed_table_capacity, minimum=ANY_INT)
    if topk > k:
        raise InputError(f"topk = {topk} exceeds topk_indices' {k} columns")
    width = round_up(topk + window_size, ALIGN)
    if n == 0 or requests == 0:
        return (torch.full((n, width), -1, dtype=torch.int32, device=dev),
                torch.zeros(n, dtype=torch.int32, device=dev))
    if deferred.on_host(True, qsl):
        C.check_sorted("query_start_loc", qsl)
    else:
        deferred.record_decrease(qsl, _QSL_SITE, start_zero=False)
    req, inside, p = _token_positions(qsl, seq_lens, qsl.long()[0] + torch.arange(n, device=dev), requests)
    live = torch.div(p + 1, compress_ratio, rounding_mode="floor")
    if base is not None:
        live = live - base.long()[req] * compressed_block_size
    cap = compressed_base if compressed_table_capacity is None else compressed_table_capacity
    topk_len = live.clamp(max=cap).clamp(min=0).clamp(max=topk)
    swa_len = (p + 1).clamp(0, window_size)
    row_base = req * workspace_width
    # the valid entries of the top-k range, compacted to the front in order (column `width`
    # takes the rest and is dropped)
    src = topk_indices[:, :topk].long()
    keep = (torch.arange(topk, device=dev) < topk_len.unsqueeze(1)) & (src >= 0)
    kept = keep.sum(dim=1)
    dest = torch.where(keep, keep.cumsum(dim=1) - 1, width)
    front = torch.full((n, width + 1), -1, dtype=torch.int64, device=dev)
    front.scatter_(1, dest, torch.where(keep, src + row_base.unsqueeze(1), -1))
    j = torch.arange(width, device=dev)
    window = _swa_entries(j, kept, swa_len, p, seq_lens.long()[req] - gather_lens.long()[req],
                          row_base + compressed_base)
    rows = torch.where(j < kept.unsqueeze(1), front[:, :width],
                       torch.where(j < (kept + swa_len).unsqueeze(1), window, -1))
    rows = torch.where(inside.unsqueeze(1), rows, -1)
    return _int32_entries(rows), torch.where(inside, kept + swa_len, 0).to(torch.int32)


def dsv4_validate_active_cache_pages(*, seq_lens, block_table, actual_bs, raw_tokens_per_page, max_page_id, out):
    """``out`` (bool ``[1]``) set to whether every live request (the first ``actual_bs``) is
    valid, and returned: ``seq_lens[r] >= 0`` and, when positive, the page holding its last token
    (``block_table[r, (seq_lens[r] - 1) // raw_tokens_per_page]``) is in the table and in ``[1,
    max_page_id]``. The verdict is a device tensor, as tokenspeed's (it asserts on it with
    ``torch._assert_async``); nothing is raised or recorded here for a False verdict."""
    dev = device_of(seq_lens)
    C.check_tensor("seq_lens", seq_lens, dtypes=C.INDEX_DTYPES, shape=(None,), device=dev)
    C.check_table(block_table, None, dev)
    C.check_int("actual_bs", actual_bs)
    C.check_int("raw_tokens_per_page", raw_tokens_per_page, minimum=1)
    C.check_int("max_page_id", max_page_id, minimum=1)
    if actual_bs > min(seq_lens.shape[0], block_table.shape[0]):
        raise InputError(f"actual_bs = {actual_bs} exceeds seq_lens ({seq_lens.shape[0]}) or the table's rows "
                         f"({block_table.shape[0]})")
    if block_table.shape[1] == 0:
        raise InputError("block_table must have at least one column")
    C.check_tensor("out", out, dtypes=(torch.bool,), shape=(1,), device=dev)
    if actual_bs == 0:
        return out.fill_(True)
    lens = seq_lens[:actual_bs].long()
    page = torch.div(lens.clamp(min=1) - 1, raw_tokens_per_page, rounding_mode="floor")
    inside = page < block_table.shape[1]
    entry = block_table[:actual_bs].gather(1, page.clamp(max=block_table.shape[1] - 1).unsqueeze(1)).squeeze(1)
    bad = (lens < 0) | ((lens > 0) & (~inside | (entry <= 0) | (entry > max_page_id)))
    return out.copy_((~bad).all(dim=0, keepdim=True))


def dsv4_indexer_decode_metadata_compute(*, positions, token_to_req_indices, block_table, cache_block_size,
                                         compress_ratio, max_blocks, out_context_lens, out_block_tables,
                                         block_table_base_offsets=None):
    """The decode indexer's per-token metadata, written in place (returns None): row t of
    ``out_block_tables`` (int32 ``[>= T, >= max_blocks]``) is the first ``max_blocks`` entries of
    its request's table row with negative entries, columns beyond the table and invalid requests
    as 0; ``out_context_lens`` (int32, contiguous, ``>= T`` elements; its first T) is
    ``min(max((p + 1) // compress_ratio - base[r] * cache_block_size, 0), cache_block_size *
    (entries >= 0 among them))``, 0 for invalid requests."""
    dev = device_of(positions)
    n = C.check_index("positions", positions, None, dev)
    req = vector("token_to_req_indices", token_to_req_indices, n, dev)
    C.check_table(block_table, None, dev)
    rows, cols = block_table.shape
    base = optional("block_table_base_offsets", block_table_base_offsets, rows, dev)
    C.check_int("cache_block_size", cache_block_size, minimum=1)
    C.check_int("compress_ratio", compress_ratio, minimum=1)
    C.check_int("max_blocks", max_blocks)
    C.check_tensor("out_block_tables", out_block_tables, dtypes=(torch.int32,), shape=(None, None), device=dev)
    if not isinstance(out_context_lens, torch.Tensor) or out_context_lens.dtype != torch.int32 or \
            out_context_lens.device != dev:
        raise InputTypeError(f"out_context_lens must be an int32 tensor on {dev}, got {describe(out_context_lens)}")
    if out_block_tables.shape[0] < n or out_block_tables.shape[1] < max_blocks:
        raise InputError(f"out_block_tables must be at least [{n}, {max_blocks}], got {tuple(out_block_tables.shape)}")
    if out_context_lens.numel() < n or not out_context_lens.is_contiguous():
        raise InputError(f"out_context_lens must be contiguous with at least {n} elements, got "
                         f"{tuple(out_context_lens.shape)} with strides {list(out_context_lens.stride())}")
    if n == 0:
        return None
    r = req.long()
    ok = (r >= 0) & (r < rows)
    tables = out_block_tables[:n, :max_blocks]
    used = min(cols, max_blocks)
    if rows == 0 or used == 0:
        tables.zero_()
        out_context_lens.view(-1)[:n].zero_()
        return None
    safe = r.clamp(0, rows - 1)
    entries = block_table[safe, :used]
    live = (entries >= 0) & ok.unsqueeze(1)
    tables[:, :used] = torch.where(live, entries, 0)
    tables[:, used:].zero_()
    compressed = torch.div(positions.long() + 1, compress_ratio, rounding_mode="floor")
    if base is not None:
        compressed = compressed - base.long()[safe] * cache_block_size
    pages = live.sum(dim=1)
    lens = torch.minimum(compressed.clamp(min=0), pages * cache_block_size)
    out_context_lens.view(-1)[:n] = torch.where(ok, lens, 0)
    return None

