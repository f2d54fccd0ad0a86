"""Launchers of the DeepSeek V4 index helpers (kvformats.deepseek_v4.indices): one kernel launch
per call, no host synchronisation, output widths from argument shapes and Python ints only.
Each function takes exactly the arguments of the reference it replaces (already validated) and
returns the same tensors: every entry, −1 padding included, is written by the kernel, so
fresh outputs are ``torch.empty``."""

from __future__ import annotations

import torch

from kvformats.dsv4_constants import ALIGN, INT32_MAX, INT64_MAX, max_page_entry, round_up
from kvformats.runtime import deferred
from kvformats_kernels import _common as cm
from kvformats_kernels import settings
from kvformats_kernels.dsv4 import indices_jit as jit
from kvformats_kernels.launch import fast

_SITES = {"compressed": deferred.site("compressed_slot_mapping", "query_start_loc"),
          "combine": deferred.site("combine_topk_swa_indices", "query_start_loc"),
          "decode_swa": deferred.site("decode_swa_indices_and_lens", "query_start_loc")}

# 1-D mappings: tokens per program (block) and warps. Row kernels: a tile of block_m rows x
# block_j index columns per step (widths are multiples of 128, so 128-column steps waste no
# lane); at most few_rows rows (decode), one row per program and up to few_block_j columns per
# step instead, so a short call spreads over more programs and takes fewer dependent steps.
# Benchmarks may override entries.
_ROW_TILES = {"block_m": 16, "block_j": 128, "few_rows": 1024, "few_block_j": 2048, "num_warps": 4}
CONFIG = settings.declare("indices", {
    "table_slot_mapping": {"block": 512, "num_warps": 4},
    "compressed_slot_mapping": {"block": 256, "num_warps": 4},
    "global_topk_indices_and_lens": dict(_ROW_TILES),
    "combine_topk_swa_indices": dict(_ROW_TILES),
    "combine_dense_swa_indices": dict(_ROW_TILES),
    "decode_swa_indices_and_lens": dict(_ROW_TILES),
    "dense_prefill_local_compressed_indices": dict(_ROW_TILES),
})


def _steps(requests: int) -> int:
    """Binary-search steps over ``requests`` offsets."""
    return requests.bit_length()


def _optional(t, fallback):
    """(pointer argument, stride, present) of an optional 1-D tensor; bool is read as bytes."""
    if t is None:
        return fallback, 0, False
    return (t.view(torch.uint8) if t.dtype == torch.bool else t), t.stride(0), True


def _rows(op: str, n: int, width: int | None = None) -> tuple[tuple[int], dict]:
    """Grid and launch constants of ``op`` for ``n`` rows of ``width`` index columns."""
    cfg = CONFIG[op]
    if "block" in cfg:
        return (cm.grid_rows(n, cfg["block"]),), {"BLOCK": cfg["block"], "num_warps": cfg["num_warps"]}
    block_m, block_j = cfg["block_m"], cfg["block_j"]
    if n <= cfg["few_rows"]:
        block_m, block_j = 1, cfg["few_block_j"]
    block_j = min(block_j, max(16, cm.next_pow2(width or 0)))
    return (cm.grid_rows(n, block_m),), {"BLOCK_M": block_m, "BLOCK_J": block_j, "num_warps": cfg["num_warps"]}


def _table(table):
    return table.shape[0], table.shape[1], table.stride(0), table.stride(1)


def table_slot_mapping(positions, req, table, page_size, stride, base, is_valid):
    n = positions.shape[0]
    out = torch.empty(n, dtype=torch.int64, device=positions.device)
    if n == 0:
        return out
    valid, valid_stride, has_valid = _optional(is_valid, positions)
    base_t, base_stride, has_base = _optional(base, positions)
    requests, cols, ts0, ts1 = _table(table)
    grid, meta = _rows("table_slot_mapping", n)
    fast(jit.table_slot_mapping_kernel)[grid](
        positions, req, valid, table, base_t, out, n, requests, cols, stride, positions.stride(0), req.stride(0),
        valid_stride, ts0, ts1, base_stride, max_page_entry(page_size, INT64_MAX), HAS_VALID=has_valid,
        HAS_BASE=has_base, PAGE_SIZE=page_size, **meta)
    return out


def compressed_slot_mapping(num_tokens, qsl, seq_lens, table, page_size, ratio, base, out, req=None, is_valid=None):
    dest = torch.empty(num_tokens, dtype=torch.int64, device=table.device) if out is None else out
    total = dest.shape[0]  # the reference fills all of ``out`` with −1 first
    if total == 0:
        return dest[:num_tokens]
    base_t, base_stride, has_base = _optional(base, seq_lens)
    req_t, req_stride, has_req = _optional(req, seq_lens)
    valid, valid_stride, has_valid = _optional(is_valid, seq_lens)
    requests, cols, ts0, ts1 = _table(table)
    grid, meta = _rows("compressed_slot_mapping", total)
    fast(jit.compressed_slot_mapping_kernel)[grid](
        deferred.error_record(qsl.device), qsl, seq_lens, table, base_t, req_t, valid, dest, num_tokens, total,
        requests, cols, ratio, qsl.stride(0), seq_lens.stride(0), ts0, ts1, base_stride, req_stride, valid_stride,
        dest.stride(0), _steps(requests), max_page_entry(page_size, INT64_MAX), HAS_BASE=has_base, HAS_REQ=has_req,
        HAS_VALID=has_valid, PAGE_SIZE=page_size, SITE=_SITES["compressed"], **meta)
    return dest[:num_tokens]


def _index_rows(op: str, kernel, n: int, width: int, device, head: tuple, tail: tuple, records: bool = False,
                **constexprs):
    """int32 index rows [n, width] and their lengths [n], every element written by one launch of
    ``kernel(*head, rows, lengths, *tail)``, with the device's error record first where the
    kernel ``records``; nothing launched (nor any record allocated) for n == 0."""
    out = torch.empty((n, width), dtype=torch.int32, device=device)
    lens = torch.empty(n, dtype=torch.int32, device=device)
    if n:
        grid, meta = _rows(op, n, width)
        if records:
            head = (deferred.error_record(device), *head)
        fast(kernel)[grid](*head, out, lens, *tail, **constexprs, **meta)
    return out, lens


def global_topk_indices_and_lens(topk, req, table, page_size, is_valid, base=None, lens="count", out_indices=None,
                                 out_lens=None, out_valid_lens=None):
    n, width = topk.shape
    dev = topk.device
    out = torch.empty((n, width), dtype=torch.int32, device=dev) if out_indices is None else out_indices
    sizes = torch.empty(n, dtype=torch.int32, device=dev) if out_lens is None else out_lens
    if n == 0:
        return out, sizes
    valid, valid_stride, has_valid = _optional(is_valid, req)
    base_t, base_stride, has_base = _optional(base, req)
    counts, counts_stride, has_counts = _optional(out_valid_lens, sizes)
    requests, cols, ts0, ts1 = _table(table)
    grid, meta = _rows("global_topk_indices_and_lens", n, width)
    fast(jit.global_topk_kernel)[grid](
        topk, req, valid, table, base_t, out, sizes, counts, n, width, requests, cols, topk.stride(0), topk.stride(1),
        req.stride(0), valid_stride, ts0, ts1, base_stride, out.stride(0), out.stride(1), sizes.stride(0),
        counts_stride, max_page_entry(page_size, INT32_MAX), HAS_VALID=has_valid, HAS_BASE=has_base,
        SCAN=lens == "scan", HAS_COUNTS=has_counts, PAGE_SIZE=page_size, **meta)
    return out, sizes


def combine_topk_swa_indices(topk_idx, qsl, seq_lens, gather_lens, window, ratio, topk, ww, cb):
    n, requests = topk_idx.shape[0], seq_lens.shape[0]
    width = round_up(topk + window, ALIGN)
    return _index_rows("combine_topk_swa_indices", jit.combine_topk_swa_kernel, n, width, topk_idx.device,
                       (topk_idx, qsl, seq_lens, gather_lens),
                       (n, width, requests, topk, ratio, window, ww, cb, topk_idx.stride(0), topk_idx.stride(1),
                        qsl.stride(0), seq_lens.stride(0), gather_lens.stride(0), _steps(requests)),
                       records=True, SITE=_SITES["combine"])


def combine_dense_swa_indices(positions, req, seq_lens, compressed_lens, gather_lens, window, ratio, ww, cb):
    n, requests = positions.shape[0], seq_lens.shape[0]
    width = round_up(max(cb + window, 1), ALIGN)
    return _index_rows("combine_dense_swa_indices", jit.combine_dense_swa_kernel, n, width, positions.device,
                       (positions, req, seq_lens, compressed_lens, gather_lens),
                       (n, width, requests, ratio, window, ww, cb, positions.stride(0), req.stride(0),
                        seq_lens.stride(0), compressed_lens.stride(0), gather_lens.stride(0)),
                       HAS_COMPRESSED=ratio > 1 and requests > 0)


def decode_swa_indices_and_lens(qsl, seq_lens, req, table, window, page_size, base, is_valid, out_indices,
                                out_lens):
    n, dev = req.shape[0], req.device
    idx = torch.empty((n, window), dtype=torch.int32, device=dev) if out_indices is None else out_indices[:n]
    lens = torch.empty(n, dtype=torch.int32, device=dev) if out_lens is None else out_lens[:n]
    if n == 0:
        return idx, lens
    valid, valid_stride, has_valid = _optional(is_valid, req)
    base_t, base_stride, has_base = _optional(base, req)
    requests, cols, ts0, ts1 = _table(table)
    grid, meta = _rows("decode_swa_indices_and_lens", n, window)
    fast(jit.decode_swa_kernel)[grid](
        deferred.error_record(dev), qsl, seq_lens, req, valid, table, base_t, idx, lens, n, requests, cols, window,
        qsl.stride(0),
        seq_lens.stride(0), req.stride(0), valid_stride, ts0, ts1, base_stride, idx.stride(0), idx.stride(1),
        lens.stride(0), max_page_entry(page_size, INT32_MAX), HAS_VALID=has_valid, HAS_BASE=has_base,
        PAGE_SIZE=page_size, SITE=_SITES["decode_swa"], **meta)
    return idx, lens


def dense_prefill_local_compressed_indices(positions, ratio, width, out):
    n = positions.shape[0]
    idx = torch.empty((n, width), dtype=torch.int32, device=positions.device) if out is None else out[:n, :width]
    if n == 0 or width == 0:
        return idx
    grid, meta = _rows("dense_prefill_local_compressed_indices", n, width)
    fast(jit.dense_local_kernel)[grid](positions, idx, n, ratio, width, positions.stride(0), idx.stride(0),
                                 idx.stride(1), **meta)
    return idx


LAUNCHERS = {
    "table_slot_mapping": table_slot_mapping,
    "compressed_slot_mapping": compressed_slot_mapping,
    "global_topk_indices_and_lens": global_topk_indices_and_lens,
    "combine_topk_swa_indices": combine_topk_swa_indices,
    "combine_dense_swa_indices": combine_dense_swa_indices,
    "decode_swa_indices_and_lens": decode_swa_indices_and_lens,
    "dense_prefill_local_compressed_indices": dense_prefill_local_compressed_indices,
}


# launch settings change through settings.change
settings.guard(__name__, 'CONFIG')
