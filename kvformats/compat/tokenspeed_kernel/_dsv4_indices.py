"""tokenspeed-kernel 0.1.4's DeepSeek V4 index, slot-mapping and metadata helpers
(``tokenspeed_kernel/ops/attention/dsv4/triton.py``, https://pypi.org/project/tokenspeed-kernel/0.1.4/,
https://github.com/lightseekorg/tokenspeed) under their released names, parameters (keyword-only,
defaults as released) and in-place semantics:

    # from tokenspeed_kernel.ops.attention.dsv4.triton import dsv4_decode_swa_indices_and_lens
    from kvformats.compat.tokenspeed_kernel.dsv4 import dsv4_decode_swa_indices_and_lens

Each is the kvformats model op where one exists (``kvformats.deepseek_v4.indices``, through the
``kvformats.compat.tokenspeed`` drop-ins), else vectorised torch on any device, with no host
synchronization (the length and shape rules below are read from shapes and Python ints only):

* ``dsv4_compressed_slot_mapping``, ``dsv4_decode_swa_indices_and_lens``,
  ``dsv4_combine_dense_swa_indices``: the ``deepseek_v4_*`` drop-ins themselves (0.1.4 kept their
  signatures and behaviour).
* ``dsv4_build_dense_prefill_local_compressed_indices``: ``dense_prefill_local_compressed_indices``;
  with the 0.1.4 parameters (base offsets, a table capacity below ``width``), torch here.
* ``dsv4_compute_global_topk_indices_and_lens``: ``global_topk_indices_and_lens`` with its base
  offsets, ``lens="scan"`` and ``out_valid_lens``, one native call (replayed as a whole);
  ``dsv4_decode_dense_compressed_indices_and_lens``: the same op maps the local entries, whose
  dense lengths are torch here.
* ``dsv4_compact_compressed_slot_mapping``: ``compressed_slot_mapping`` with per-token
  ``req_indices`` and ``is_valid_token``, one native call (replayed as a whole);
  ``dsv4_group_slot_mapping``: ``table_slot_mapping``.
* ``dsv4_combine_topk_swa_indices`` (0.1.4 compacts the valid top-k entries),
  ``dsv4_validate_active_cache_pages``, ``dsv4_indexer_decode_metadata_compute``: torch here
  (``_dsv4_indices_torch``).

Bad arguments raise kvformats' typed errors (``InputError``, ``InputTypeError``: ``ValueError`` /
``TypeError`` subclasses, as tokenspeed's refusals are) before anything is written. Where
kvformats departs from tokenspeed:

* CPU tensors run (``dsv4_group_slot_mapping`` and ``dsv4_validate_active_cache_pages`` refuse
  them there); the tensors of one call must share a device. Index tensors are int32 / int64,
  validity masks bool (tokenspeed converts any dtype to bool in the compact slot mapping and the
  dense decode indices, which take integer masks here too), positions 1-D.
* the metadata is checked on empty calls too (tokenspeed returns first: no tokens, width 0,
  ``actual_bs`` 0), and the ``deepseek_v4_*`` drop-ins' own rules apply to the three functions
  they are (docs/porting-from-tokenspeed.md: missing pages give -1 in
  ``dsv4_compressed_slot_mapping``, whose table has one row per request; invalid tokens get an all
  -1 decode SWA row; the dense combine caps compressed entries at ``compressed_base``).
* index-row entries beyond int32 are -1 (tokenspeed wraps them), as are window positions before
  ``seq_len - gather_len`` in ``dsv4_combine_topk_swa_indices`` (tokenspeed points them at the
  compressed rows or another request's); its rows outside every request and the lengths tokenspeed
  leaves unwritten (no request, or width 0 with allocated outputs) are -1 / 0.
* a request index outside ``block_table_base_offsets`` in
  ``dsv4_build_dense_prefill_local_compressed_indices`` gives an all -1 row (tokenspeed's torch
  path raises ``IndexError``, its kernel reads out of bounds); base offsets shorter than the
  table's rows in ``dsv4_group_slot_mapping``, ``dsv4_compute_global_topk_indices_and_lens`` and
  ``dsv4_indexer_decode_metadata_compute`` (than the requests in the top-k combine), or
  ``out_block_tables`` narrower than ``max_blocks``: ``InputError`` (tokenspeed reads or writes
  out of bounds).
* ``compressed_block_size`` and ``compress_ratio`` must be >= 1 (tokenspeed does not check them in
  the dense prefill indices, the top-k combine and the indexer metadata, where 0 divides by zero);
  ``dsv4_combine_topk_swa_indices`` takes any window size (tokenspeed's kernel needs a power of
  two) and ``topk`` at most ``topk_indices.shape[1]`` (tokenspeed reads past the row).
* outputs are written by logical index: ``out_block_tables`` of any strides; ``out_context_lens``
  must be contiguous (tokenspeed's kernels write the first T elements of the storage).
* ``query_start_loc`` that decreases in ``dsv4_combine_topk_swa_indices``: checked as kvformats'
  combine checks it (CPU: ``InputError``; GPU: recorded, spec/checks.md).
"""

from __future__ import annotations

import torch

from kvformats.compat._common import INT_DTYPES, check_int_out
from kvformats.compat._replay import replayed
from kvformats.compat.tokenspeed_kernel._dsv4_indices_torch import (
    ANY_INT, device_of, dsv4_combine_topk_swa_indices, dsv4_indexer_decode_metadata_compute,
    dsv4_validate_active_cache_pages, optional, vector)
from kvformats.compat.tokenspeed_paged import (
    deepseek_v4_build_dense_prefill_local_compressed_indices, deepseek_v4_combine_dense_swa_indices,
    deepseek_v4_compressed_slot_mapping, deepseek_v4_decode_swa_indices_and_lens)
from kvformats.deepseek_v4 import _validation as C
from kvformats.deepseek_v4.indices import compressed_slot_mapping, global_topk_indices_and_lens, table_slot_mapping
from kvformats.dsv4_constants import INT32_MAX
from kvformats.errors import InputError, InputTypeError, describe

__all__ = [
    "dsv4_build_dense_prefill_local_compressed_indices", "dsv4_combine_dense_swa_indices",
    "dsv4_combine_topk_swa_indices", "dsv4_compact_compressed_slot_mapping", "dsv4_compressed_slot_mapping",
    "dsv4_compute_global_topk_indices_and_lens", "dsv4_decode_dense_compressed_indices_and_lens",
    "dsv4_decode_swa_indices_and_lens", "dsv4_group_slot_mapping", "dsv4_indexer_decode_metadata_compute",
    "dsv4_validate_active_cache_pages",
]

# 0.1.4 kept these three as they were: one definition serves both names
dsv4_compressed_slot_mapping = deepseek_v4_compressed_slot_mapping
dsv4_decode_swa_indices_and_lens = deepseek_v4_decode_swa_indices_and_lens
dsv4_combine_dense_swa_indices = deepseek_v4_combine_dense_swa_indices

MASK_DTYPES = (torch.bool, *INT_DTYPES)  # the masks tokenspeed converts with .to(torch.bool)


def as_mask(t):
    return t if t is None or t.dtype is torch.bool else t != 0


def slot_mapping(positions, req, table, block_size: int, stride: int, base, valid) -> torch.Tensor:
    """The native ``table_slot_mapping`` (its public function takes the torch op under torch.compile)."""
    return table_slot_mapping(positions=positions, req_indices=req, block_table=table, page_size=block_size,
                              entry_stride=stride, block_table_base_offsets=base, is_valid_token=valid)


# ----- dense prefill local indices ---------------------------------------------------------------
def _native_dense_prefill(args, kwargs) -> bool:
    """Whether the dense prefill indices call is the native op's (no base offsets, no capacity
    below ``width``): the others are torch here, not replayed."""
    capacity = kwargs.get("compressed_table_capacity")
    return kwargs.get("block_table_base_offsets") is None and (capacity is None or (
        isinstance(capacity, int) and isinstance(kwargs.get("width"), int) and capacity >= kwargs["width"]))


@replayed(plain=_native_dense_prefill)
def dsv4_build_dense_prefill_local_compressed_indices(*, positions, compress_ratio, width, out,
                                                      token_to_req_indices=None, block_table_base_offsets=None,
                                                      compressed_block_size=1, compressed_table_capacity=None):
    """``out[:T, :width]`` filled and returned: entry j of token t is ``base_row + j`` for ``j <
    clamp((p + 1) // compress_ratio - base_row, 0, min(width, capacity))``, else -1, where p =
    ``positions[t]`` and ``base_row = block_table_base_offsets[token_to_req_indices[t]] *
    compressed_block_size`` (0 without offsets; capacity: ``compressed_table_capacity``, default
    ``width``). ``out``: integer ``[>= T, >= width]``, unit column stride."""
    C.check_int("compressed_block_size", compressed_block_size, minimum=1)
    if compressed_table_capacity is not None:
        C.check_int("compressed_table_capacity", compressed_table_capacity, minimum=ANY_INT)
    if not isinstance(out, torch.Tensor):
        raise InputTypeError(f"out must be an integer tensor [>= T, >= width], got {describe(out)}")
    if out.dim() == 2 and out.stride(1) != 1:
        raise InputError(f"out must be contiguous in the last dim (stride 1), got strides {list(out.stride())}")
    if block_table_base_offsets is None and (compressed_table_capacity is None or (
            isinstance(width, int) and compressed_table_capacity >= width)):
        return deepseek_v4_build_dense_prefill_local_compressed_indices(positions=positions,
                                                                        compress_ratio=compress_ratio, width=width,
                                                                        out=out)
    dev = device_of(positions)
    n = C.check_index("positions", positions, None, dev)
    C.check_int("compress_ratio", compress_ratio, minimum=1)
    C.check_int("width", width)
    check_int_out("out", out, n, width, dev, min_cols=True)
    cap = width if compressed_table_capacity is None else min(width, compressed_table_capacity)
    base_row = 0
    ok = None
    if block_table_base_offsets is not None:
        if token_to_req_indices is None:
            raise InputError("token_to_req_indices is required with block_table_base_offsets")
        req = vector("token_to_req_indices", token_to_req_indices, n, dev).long()
        base = vector("block_table_base_offsets", block_table_base_offsets, None, dev)
        rows = base.shape[0]
        ok = (req >= 0) & (req < rows)
        base_row = base.long()[req.clamp(0, max(rows - 1, 0))] * compressed_block_size if rows else 0
    ends = torch.div(positions.long() + 1, compress_ratio, rounding_mode="floor")
    count = (ends - base_row).clamp(min=0).clamp(max=cap)  # clamp(0, cap) keeps cap < 0 at no entries
    if ok is not None:
        count = torch.where(ok, count, 0)
    j = torch.arange(width, device=positions.device)
    rows_j = j + (base_row.unsqueeze(1) if isinstance(base_row, torch.Tensor) else 0)
    values = torch.where((j < count.unsqueeze(1)) & (rows_j <= INT32_MAX), rows_j, -1)
    result = out[:n, :width]
    result.copy_(values)
    return result


# ----- top-k and dense decode indices ------------------------------------------------------------
@replayed
def dsv4_compute_global_topk_indices_and_lens(*, topk_indices, token_to_req_indices, block_table, block_size,
                                              is_valid_token=None, block_table_base_offsets=None,
                                              out_valid_lens=None):
    """``(slots int32 [T, K], scan lens int32 [T])``: each entry ``i >= 0`` of ``topk_indices``
    (int32 ``[T, K]``) through the request's table row (``i - base[r] * block_size`` with base
    offsets), -1 where none, missing or out of the table; lens is one past the last entry ``i >= 0``
    of a valid token (0 for invalid tokens). ``out_valid_lens`` (int32 ``[T]``, contiguous)
    receives the number of mapped entries of each token. One native call (its base offsets,
    ``lens="scan"`` and ``out_valid_lens``), replayed as a whole."""
    dev = device_of(topk_indices)
    C.check_tensor("topk_indices", topk_indices, dtypes=(torch.int32,), shape=(None, None), device=dev)
    n = topk_indices.shape[0]
    C.check_table(block_table, None, dev)
    if topk_indices.stride(1) != 1 or block_table.stride(1) != 1:
        raise InputError(f"topk_indices and block_table need unit column stride, got strides "
                         f"{list(topk_indices.stride())} and {list(block_table.stride())}")
    if out_valid_lens is not None:
        C.check_tensor("out_valid_lens", out_valid_lens, dtypes=(torch.int32,), shape=(n,), device=dev)
        if not out_valid_lens.is_contiguous():
            raise InputError(f"out_valid_lens must be contiguous, got strides {list(out_valid_lens.stride())}")
    C.check_int("block_size", block_size, minimum=1)
    req = vector("token_to_req_indices", token_to_req_indices, n, dev)
    valid = optional("is_valid_token", is_valid_token, n, dev, (torch.bool,))
    base = optional("block_table_base_offsets", block_table_base_offsets, block_table.shape[0], dev)
    return global_topk_indices_and_lens(topk_indices=topk_indices, req_indices=req, block_table=block_table,
                                        page_size=block_size, is_valid_token=valid, block_table_base_offsets=base,
                                        lens="scan", out_valid_lens=out_valid_lens)


def dsv4_decode_dense_compressed_indices_and_lens(*, positions, token_to_req_indices, block_table, block_size,
                                                  compress_ratio, width, block_table_base_offsets, is_valid_token,
                                                  out_indices, out_lens):
    """``(slots int32 [T, width], lens int32 [T])``: ``lens = clamp((p + 1) // compress_ratio, 0,
    width)`` (0 for invalid tokens), entry j < lens the slot of compressed row j through the
    request's table row (page ``j // block_size - base[r]``), -1 otherwise. ``out_indices`` /
    ``out_lens`` (int32, exactly ``[T, width]`` / ``[T]``) are written and returned when given."""
    for name, value, low in (("block_size", block_size, 1), ("compress_ratio", compress_ratio, 1),
                             ("width", width, 0)):
        C.check_int(name, value, minimum=low)
    if width > INT32_MAX:
        raise InputError(f"width must fit int32 index rows, got {width}")
    dev = device_of(positions)
    n = C.check_index("positions", positions, None, dev)
    req = vector("token_to_req_indices", token_to_req_indices, n, dev)
    C.check_table(block_table, None, dev)
    base = optional("block_table_base_offsets", block_table_base_offsets, None, dev)
    valid = as_mask(optional("is_valid_token", is_valid_token, n, dev, MASK_DTYPES))
    for name, out, shape in (("out_indices", out_indices, (n, width)), ("out_lens", out_lens, (n,))):
        if out is not None:
            C.check_tensor(name, out, dtypes=(torch.int32,), shape=shape, device=dev)
    if n == 0 or width == 0:
        return (torch.empty((n, width), dtype=torch.int32, device=dev) if out_indices is None else out_indices,
                torch.zeros(n, dtype=torch.int32, device=dev) if out_lens is None else out_lens)
    lens = torch.div(positions.long() + 1, compress_ratio, rounding_mode="floor").clamp(0, width)
    if valid is not None:
        lens = torch.where(valid, lens, 0)
    j = torch.arange(width, dtype=torch.int32, device=dev)
    local = torch.where(j < lens.unsqueeze(1), j, -1)
    table = block_table
    if base is not None:  # tokens of requests beyond the offsets read no page
        rows = min(table.shape[0], base.shape[0])
        table, base = table[:rows], base[:rows]
    slots = global_topk_indices_and_lens(topk_indices=local, req_indices=req, block_table=table,
                                         page_size=block_size, block_table_base_offsets=base)[0]
    lens = lens.to(torch.int32)
    if out_indices is not None:
        slots = out_indices.copy_(slots)
    if out_lens is not None:
        lens = out_lens.copy_(lens)
    return slots, lens


# ----- slot mappings -----------------------------------------------------------------------------
def _expanded(name: str, t, n: int, device, dtypes):
    """A per-token (or per-group: ``n`` a multiple of its length) 1-D tensor as ``n`` entries."""
    C.check_tensor(name, t, dtypes=dtypes, shape=(None,), device=device)
    m = t.shape[0]
    if m == n:
        return t
    if m == 0 or n % m:
        raise InputError(f"{name} must cover or evenly expand across the {n} tokens, got {describe(t)}")
    return t.unsqueeze(1).expand(m, n // m).reshape(n)


@replayed
def dsv4_compact_compressed_slot_mapping(*, num_tokens, token_to_req_indices, query_start_loc, seq_lens, block_table,
                                         block_size, compress_ratio, block_table_base_offsets, is_valid_token, out):
    """int64 compressed-cache slots of the first ``num_tokens`` tokens (a view of ``out``, whose
    other entries become -1): token t of request r = ``token_to_req_indices[t]`` is at ``p =
    seq_lens[r] - (qsl[r + 1] - qsl[r]) + t - qsl[r]``; where ``(p + 1) % compress_ratio == 0`` its
    slot is that of compressed row ``p // compress_ratio`` through the table row (page minus
    ``base[r]``), else -1. ``is_valid_token`` covers the tokens or expands evenly across them. One
    native call (``compressed_slot_mapping`` with ``req_indices`` and ``is_valid_token``), replayed
    as a whole where the mask is bool and per token (other masks are converted first)."""
    C.check_int("num_tokens", num_tokens)
    C.check_int("block_size", block_size, minimum=1)
    C.check_int("compress_ratio", compress_ratio, minimum=1)
    dev = device_of(seq_lens)
    C.check_tensor("seq_lens", seq_lens, dtypes=C.INDEX_DTYPES, shape=(None,), device=dev)
    C.check_tensor("query_start_loc", query_start_loc, dtypes=C.INDEX_DTYPES, shape=(None,), device=dev)
    C.check_table(block_table, None, dev)
    req = vector("token_to_req_indices", token_to_req_indices, num_tokens, dev)
    base = optional("block_table_base_offsets", block_table_base_offsets, None, dev)
    valid = None if is_valid_token is None else as_mask(_expanded("is_valid_token", is_valid_token, num_tokens, dev,
                                                                  MASK_DTYPES))
    if out is None:
        out = torch.empty(num_tokens, dtype=torch.int64, device=dev)
    else:
        C.check_tensor("out", out, dtypes=(torch.int64,), shape=(None,), device=dev)
        if out.shape[0] < num_tokens or out.stride(0) != 1:
            raise InputError(f"out must be a contiguous int64 [>= {num_tokens}] tensor, got {describe(out)} with "
                             f"strides {list(out.stride())}")
    result = out[:num_tokens]
    requests = min(seq_lens.shape[0], max(0, query_start_loc.shape[0] - 1), block_table.shape[0],
                   seq_lens.shape[0] if base is None else base.shape[0])
    if num_tokens == 0 or requests == 0:
        out.fill_(-1)
        return result
    # the first R = requests entries of each per-request tensor (views); the native call fills the
    # rest of ``out`` with -1 and returns ``out[:num_tokens]``
    return compressed_slot_mapping(
        num_tokens=num_tokens, query_start_loc=_first(query_start_loc, requests + 1),
        seq_lens=_first(seq_lens, requests), block_table=_first(block_table, requests), page_size=block_size,
        ratio=compress_ratio, block_table_base_offsets=None if base is None else _first(base, requests),
        req_indices=req, is_valid_token=valid, out=out)


def _first(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if t.shape[0] == n else t[:n]


@replayed
def dsv4_group_slot_mapping(*, positions, req_indices, block_table, rows_per_block, entry_stride_tokens,
                            base_offsets, is_valid_token):
    """int64 ``[T]``: the slot of logical row ``positions[t] // entry_stride_tokens`` through the
    request's table row (page minus ``base_offsets[r]``), -1 for negative positions, invalid
    tokens, requests and pages and missing entries. ``req_indices`` / ``is_valid_token`` cover the
    tokens or expand evenly across them (packed token groups)."""
    C.check_int("rows_per_block", rows_per_block, minimum=1)
    C.check_int("entry_stride_tokens", entry_stride_tokens, minimum=1)
    dev = device_of(positions)
    n = C.check_index("positions", positions, None, dev)
    C.check_tensor("req_indices", req_indices, dtypes=C.INDEX_DTYPES, shape=(None,), device=dev)
    C.check_table(block_table, None, dev)
    rows, cols = block_table.shape
    base = optional("base_offsets", base_offsets, rows, dev)
    if is_valid_token is not None:
        C.check_tensor("is_valid_token", is_valid_token, dtypes=(torch.bool,), shape=(None,), device=dev)
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=dev)
    req = _expanded("req_indices", req_indices, n, dev, C.INDEX_DTYPES)
    valid = None if is_valid_token is None else _expanded("is_valid_token", is_valid_token, n, dev, (torch.bool,))
    if rows == 0 or cols == 0:
        return torch.full((n,), -1, dtype=torch.int64, device=dev)
    return slot_mapping(positions, req, block_table, rows_per_block, entry_stride_tokens, base, valid)


