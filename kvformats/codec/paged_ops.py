"""Paged operations serving engines call: reads addressed by a block table instead of slots.

* ``dequantize_gather``: per request, the last ``gather_len`` positions of a sequence of
  ``seq_len`` tokens, decoded into a workspace ``out[b, offset + i]`` (tokenspeed's
  dequantize-and-gather of fp8_ds_mla for sparse prefill, spec/upstream.md §6.1). Missing pages
  (table entry < 0, page index out of the table, page beyond the cache) give zero rows; rows at
  or beyond ``gather_len`` are left untouched.
* ``gather_paged``: the raw records of the positions ``[cu[r], cu[r+1])`` of each request, in
  cu order, into DeepGEMM-ready workspaces (one per segment: values, scales). Rows not covered
  by ``cu_seq_lens`` are left untouched; a missing page gives a zero row (tokenspeed's FP8
  version would wrap a −1 entry to the last page).
* ``decode_topk``: decode by a ``[T, K]`` matrix of slots with −1 holes.

Each is validated here once, then dispatched to a backend; the references below address
slots through the table and reuse the layouts' row I/O. Each is declared once
(``kvformats.codec.op.Op``, as ``kvformats.codec.slot_ops``'s are): its record sites, its public
function, its torch op's arguments and implementations.
"""

from __future__ import annotations

import torch

from kvformats.codec import registry
from kvformats.codec.blocktable import table_slots
from kvformats.codec.op import CODEC, Op
from kvformats.codec.rows import read_rows
from kvformats.codec.torch_library import as_list, decoded, decoded_like, layout_of
from kvformats.errors import InputError, InputTypeError, LayoutError, describe
from kvformats.runtime import deferred
from kvformats.validation import (INDEX_DTYPES, capturing, check_cache, check_memory, check_no_overlap, check_slots,
                                  check_tensor)

PAGED_OPS = ("dequantize_gather", "gather_paged", "decode_topk")
DECODE_TOPK = Op(CODEC, "decode_topk", sites=("topk_slots",), result=decoded,
                 fake=lambda fmt, params, cache, topk_slots, *_: decoded_like(layout_of(fmt, params), cache,
                                                                             tuple(topk_slots.shape)))
DEQUANTIZE_GATHER = Op(CODEC, "dequantize_gather", mutates=("out",), sites=("gather_lens", "out"),
                       public_names={"base": "block_table_base_offsets"},
                       result=lambda a, output, layout: a["out"])
GATHER_PAGED = Op(CODEC, "gather_paged", mutates=("out",), sites=("cu_seq_lens",),
                  result=lambda a, output, layout: tuple(a["out"]))
_SITES = {"gather_lens": DEQUANTIZE_GATHER.site("gather_lens"), "out": DEQUANTIZE_GATHER.site("out"),
          "cu_seq_lens": GATHER_PAGED.site("cu_seq_lens"), "topk_slots": DECODE_TOPK.site("topk_slots")}


def _check_table(layout, cache, block_table, requests: int | None = None) -> None:
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES, shape=(requests, None), device=cache.device)


# ----- dequantize_gather ------------------------------------------------------------------------
@DEQUANTIZE_GATHER.layout_public
def dequantize_gather(layout, cache, out, *, block_table, seq_lens, gather_lens=None,
                      block_table_base_offsets=None, offset: int = 0, backend="auto", check=True):
    """Validate, then decode each request's last ``gather_lens[b]`` positions into ``out[b, offset:]``."""
    check_cache(layout, cache)
    if layout.decode_dtype is None:
        raise LayoutError(f"{layout.name} has no single decoded row type; dequantize_gather needs one")
    requests = seq_lens.shape[0] if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 1 else None
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, shape=(None,), device=cache.device)
    _check_table(layout, cache, block_table, requests)
    if gather_lens is not None:
        check_tensor("gather_lens", gather_lens, dtypes=INDEX_DTYPES, shape=(requests,), device=cache.device)
    if block_table_base_offsets is not None:
        check_tensor("block_table_base_offsets", block_table_base_offsets, dtypes=INDEX_DTYPES,
                     shape=(requests,), device=cache.device)
    check_tensor("out", out, dtypes=(layout.decode_dtype,), shape=(requests, None, layout.head_dim),
                 device=cache.device)
    check_no_overlap("out", out, "elements")
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= out.shape[1]:
        raise InputError(f"offset must be an int in [0, {out.shape[1]}] (the workspace width), got {offset!r}")
    fn = registry.resolve(layout.name, "dequantize_gather", backend, cache.device)
    if requests and deferred.on_host(check, seq_lens):
        _host_gather_len_checks(seq_lens, gather_lens, offset, out.shape[1])
    elif requests and not registry.is_kernel(fn):
        glen = seq_lens if gather_lens is None else gather_lens
        deferred.record_where((glen < 0) | (glen > seq_lens), glen, seq_lens, deferred.Check.GATHER_LEN,
                              _SITES["gather_lens"])
        deferred.record_where(offset + glen > out.shape[1], offset + glen, out.shape[1],
                              deferred.Check.WORKSPACE_WIDTH, _SITES["out"])
    fn(layout, cache, out, block_table, seq_lens, gather_lens, block_table_base_offsets, offset)
    return out


@DEQUANTIZE_GATHER.lowering
def _dequantize_gather_arguments(layout, cache, out, *, block_table, seq_lens, gather_lens=None,
                                 block_table_base_offsets=None, offset: int = 0, backend="auto", check=True) -> tuple:
    return cache, out, block_table, seq_lens, gather_lens, block_table_base_offsets, offset, backend, check


@DEQUANTIZE_GATHER.op_level
def _dequantize_gather(fmt: str, params: str, cache: torch.Tensor, out: torch.Tensor, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, gather_lens: torch.Tensor | None, base: torch.Tensor | None,
                       offset: int, backend: str, check: bool = True) -> None:
    dequantize_gather(layout_of(fmt, params), cache, out, block_table=block_table, seq_lens=seq_lens,
                      gather_lens=gather_lens, block_table_base_offsets=base, offset=offset, backend=backend,
                      check=check)


def _host_gather_len_checks(seq_lens, gather_lens, offset: int, width: int) -> None:
    glen = seq_lens if gather_lens is None else gather_lens
    if bool(((glen < 0) | (glen > seq_lens)).any()):
        raise InputError("gather_lens must satisfy 0 <= gather_lens <= seq_lens for every request")
    widest = int(glen.max())
    if offset + widest > width:
        raise InputError(f"out has {width} rows per request, but offset {offset} + the longest "
                         f"gather_len {widest} = {offset + widest}; widen the workspace")


def dequantize_gather_reference(layout, cache, out, block_table, seq_lens, gather_lens, base, offset):
    requests, width = out.shape[0], out.shape[1] - offset
    if requests == 0 or width <= 0:
        return
    glen = (seq_lens if gather_lens is None else gather_lens).long()
    glen = torch.where((glen < 0) | (glen > seq_lens), 0, glen)  # a request with an invalid length: no rows
    i = torch.arange(width, device=cache.device)
    live = i[None, :] < glen[:, None]  # rows at or beyond gather_len stay untouched
    req, col = live.nonzero(as_tuple=True)
    pos = seq_lens.long()[req] - glen[req] + col
    slots = table_slots(block_table, req, pos, layout.page_size, base, cache.shape[0])
    # written as the kernels write it, as memory autograd does not track: a workspace that
    # requires grad is filled on both backends (an in-place write to it would raise here)
    out.detach()[req, offset + col] = layout.decode_rows(read_rows(layout, cache, slots)).to(out.dtype)


# ----- gather_paged -----------------------------------------------------------------------------
def _new_workspaces(layout, cache, total: int) -> list[torch.Tensor]:
    """A new zeroed uint8 [total, record_bytes] workspace per segment."""
    return [torch.zeros((total, seg.record_bytes), dtype=torch.uint8, device=cache.device) for seg in layout.segments]


def _workspaces(layout, cache, out):
    """uint8 [T, record_bytes] views of the caller's per-segment workspaces."""
    if not isinstance(out, (tuple, list)) or len(out) != len(layout.segments):
        raise InputTypeError(f"out must be a tuple of {len(layout.segments)} workspaces "
                             f"({', '.join(s.name for s in layout.segments)}), got {describe(out)}")
    views = []
    for seg, ws in zip(layout.segments, out):
        if not isinstance(ws, torch.Tensor) or ws.device != cache.device or ws.dim() not in (1, 2):
            raise InputTypeError(f"{seg.name} workspace must be a tensor [T, ...] on {cache.device}, "
                                 f"got {describe(ws)}")
        check_memory(f"the {seg.name} workspace", ws)  # the kernel writes its memory as it lies
        raw = ws.view(torch.uint8) if ws.dim() == 2 else ws.unsqueeze(1).view(torch.uint8)
        if raw.shape[1] < seg.record_bytes or raw.stride(1) != 1:
            raise InputError(f"{seg.name} workspace rows must hold {seg.record_bytes} contiguous bytes, "
                             f"got {describe(ws)}")
        check_no_overlap(f"the {seg.name} workspace", raw[:, :seg.record_bytes])
        views.append(raw[:, :seg.record_bytes])
    if len({v.shape[0] for v in views}) != 1:
        raise InputError(f"workspaces must have the same number of rows, got {[v.shape[0] for v in views]}")
    return views


@GATHER_PAGED.layout_public
def gather_paged(layout, cache, *, block_table, cu_seq_lens, out=None, num_rows=None, backend="auto", check=True):
    """Validate, then copy the records of every request's positions, in cu order -> workspaces."""
    check_cache(layout, cache)
    check_tensor("cu_seq_lens", cu_seq_lens, dtypes=INDEX_DTYPES, shape=(None,), device=cache.device)
    if cu_seq_lens.shape[0] < 1:
        raise InputError("cu_seq_lens must have requests + 1 entries (at least [0]), got an empty tensor")
    _check_table(layout, cache, block_table, cu_seq_lens.shape[0] - 1)
    if num_rows is not None and (not isinstance(num_rows, int) or isinstance(num_rows, bool) or num_rows < 0):
        raise InputError(f"num_rows must be a non-negative int (the rows to copy, cu_seq_lens[-1]), got {num_rows!r}")
    if out is not None and num_rows is not None:
        raise InputError("pass out= (preallocated workspaces) or num_rows= (to allocate them), not both")
    views = None if out is None else _workspaces(layout, cache, out)
    fn = registry.resolve(layout.name, "gather_paged", backend, cache.device)
    # the workspaces' rows: the caller's, or num_rows= of those to allocate (a kernel checks
    # cu_seq_lens[-1] against the rows it is given, whichever way they came)
    rows = views[0].shape[0] if views is not None else num_rows
    if deferred.on_host(check, cu_seq_lens):
        _host_cu_checks(cu_seq_lens, rows)
    elif not registry.is_kernel(fn):
        _record_cu_checks(cu_seq_lens, rows)
    if views is None:
        if num_rows is None:
            if capturing(cu_seq_lens):
                raise InputError("inside CUDA-graph capture pass preallocated workspaces: out=(values, scales)")
            # the output's size is a value on the device: the one read this call cannot avoid
            # (pass out= or num_rows= to keep the host free)
            num_rows = max(int(cu_seq_lens[-1]), 0)
        views = _new_workspaces(layout, cache, num_rows)
    fn(layout, cache, views, block_table, cu_seq_lens)
    return tuple(out) if out is not None else tuple(views)


@GATHER_PAGED.lowering
def _gather_paged_arguments(layout, cache, *, block_table, cu_seq_lens, out=None, num_rows=None, backend="auto",
                            check=True) -> tuple:
    """The op takes preallocated workspaces: ``out``, or ``num_rows`` rows of new ones (an output
    sized by ``cu_seq_lens[-1]`` would need a data-dependent shape)."""
    if out is None:
        if num_rows is None:
            raise InputError("kvformats::gather_paged takes preallocated workspaces: pass out= or num_rows=")
        if not isinstance(num_rows, int) or isinstance(num_rows, bool) or num_rows < 0:
            raise InputError(f"num_rows must be a non-negative int (the rows to copy, cu_seq_lens[-1]), "
                             f"got {num_rows!r}")
        out = _new_workspaces(layout, cache, num_rows)
    elif num_rows is not None:
        raise InputError("pass out= (preallocated workspaces) or num_rows= (to allocate them), not both")
    return cache, block_table, cu_seq_lens, list(out), backend, check


@GATHER_PAGED.op_level
def _gather_paged(fmt: str, params: str, cache: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                  out: list[torch.Tensor], backend: str, check: bool = True) -> None:
    gather_paged(layout_of(fmt, params), cache, block_table=block_table, cu_seq_lens=cu_seq_lens, out=tuple(out),
                 backend=backend, check=check)


def _host_cu_checks(cu_seq_lens, rows: int | None) -> None:
    values = cu_seq_lens.tolist()
    if values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
        raise InputError(f"cu_seq_lens must start at 0 and never decrease, got {values[:16]}"
                         f"{' ...' if len(values) > 16 else ''}")
    if rows is not None and values[-1] > rows:
        raise InputError(f"cu_seq_lens[-1] = {values[-1]} rows requested, but the workspaces hold {rows}; "
                         f"pass larger workspaces")


def _record_cu_checks(cu_seq_lens, rows: int | None) -> None:
    where = _SITES["cu_seq_lens"]
    deferred.record_decrease(cu_seq_lens, where, start_zero=True)
    if rows is not None:
        deferred.record_where(cu_seq_lens[-1:] > rows, cu_seq_lens[-1:], rows, deferred.Check.WORKSPACE_ROWS, where)


def gather_paged_reference(layout, cache, views, block_table, cu_seq_lens):
    rows_out = views[0].shape[0]
    requests = cu_seq_lens.shape[0] - 1
    if rows_out == 0 or requests <= 0:
        return
    cu = cu_seq_lens.long()
    t = torch.arange(rows_out, device=cache.device)
    t = t[t < cu[-1]]  # rows not covered by cu_seq_lens stay untouched
    req = torch.searchsorted(cu[1:], t, right=True)
    slots = table_slots(block_table, req, t - cu[req], layout.page_size, num_pages=cache.shape[0])
    rows = read_rows(layout, cache, slots)
    at = 0
    for seg, view in zip(layout.segments, views):
        view[t] = rows[:, at:at + seg.record_bytes]
        at += seg.record_bytes


# ----- decode_topk ------------------------------------------------------------------------------
@DECODE_TOPK.layout_public
def decode_topk(layout, cache, topk_slots, *, backend="auto", check=True):
    """Validate, then decode a ``[T, K]`` matrix of slots (−1 holes give zero rows) -> ``[T, K, ...]``."""
    check_cache(layout, cache)
    check_tensor("topk_slots", topk_slots, dtypes=INDEX_DTYPES, shape=(None, None), device=cache.device)
    fn = registry.resolve(layout.name, "decode_topk", backend, cache.device)
    check_slots(layout, topk_slots.reshape(-1), None, cache, check_range=check, unique=False,
                site=_SITES["topk_slots"], kernel=registry.is_kernel(fn))
    return fn(layout, cache, topk_slots)


@DECODE_TOPK.lowering
def _decode_topk_arguments(layout, cache, topk_slots, *, backend="auto", check=True) -> tuple:
    return cache, topk_slots, backend, check


@DECODE_TOPK.op_level
def _decode_topk(fmt: str, params: str, cache: torch.Tensor, topk_slots: torch.Tensor, backend: str,
                 check: bool = True) -> list[torch.Tensor]:
    return as_list(decode_topk(layout_of(fmt, params), cache, topk_slots, backend=backend, check=check),
                   cache, topk_slots)


def decode_topk_reference(layout, cache, topk_slots):
    decoded = layout.decode_rows(read_rows(layout, cache, topk_slots.reshape(-1)))
    shape = tuple(topk_slots.shape)
    if isinstance(decoded, tuple):
        return tuple(d.reshape(*shape, d.shape[-1]) for d in decoded)
    return decoded.reshape(*shape, decoded.shape[-1])  # explicit width: [0, K] inputs have no -1 to infer


def register_reference_paged_ops(fmt: str) -> None:
    for op, fn in zip(PAGED_OPS, (dequantize_gather_reference, gather_paged_reference, decode_topk_reference)):
        registry.register_op(fmt, op, "reference")(fn)
