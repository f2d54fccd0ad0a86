"""The offload unit: a request's token rows of one cache, in request order, geometry-free; the
row rules of the DeepSeek V4 caches; and moving rows out of and into pages.

A request's row ``i`` of a cache lies at slot ``pages[i // page_size] * page_size + i %
page_size``, ``pages`` being the request's block-table row for that cache (``RequestPages``).
A tier keeps rows ``[start, stop)`` of each cache, as whole records in row order, so a restore
may use other page ids and another page size: each record lands in the destination page's own
place, the page-tail scale records of ``fp8_ds_mla`` in the destination page's own tail.

Which rows decode still needs after ``tokens`` positions, per kind of cache (what a tier keeps):

* SWA (``swa_rows``): the last ``window`` positions. An engine's SWA ring of ``window``
  positions holds exactly these; with a ring table (block-table column j holding page
  ``j % ring``) position p is found at its ring slot through the same formula.
* compressed rows, CSA / HCA / indexer (``compressed_rows``): every finished group,
  ``[0, tokens // ratio)``.
* compressor state (``state_rows``): the state rows of the open group, from
  ``(tokens // ratio) * ratio``, and for ratio 4 also the group before it: the CSA window that
  closes next is 8 positions long and reads both (``compressor_state.halves``). Restoring only
  the open group, or none, gives another compressed row when the group closes after the
  restore: the trap the tests show.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.formats.compressor_state import halves
from kvformats.layout import Layout
from kvformats.validation import check_cache

_WIDE = (torch.int64, torch.int32, torch.int16)


@attrs.frozen(eq=False)  # holds tensors: compared by identity
class RequestPages:
    """Where one cache holds a request's rows: ``pages[j]`` (int, on the host) is the cache page
    of the request's page j, its block-table row. A ring table may repeat page ids; the rows a
    tier moves must still fall on distinct slots."""

    layout: Layout
    cache: torch.Tensor
    pages: torch.Tensor


# ----- row rules -------------------------------------------------------------------------------
def swa_rows(tokens: int, window: int) -> tuple[int, int]:
    """The SWA rows decode reads after ``tokens`` positions: the last ``window``."""
    return max(0, tokens - window), tokens


def compressed_rows(tokens: int, ratio: int) -> tuple[int, int]:
    """Every compressed row of a finished group."""
    return 0, tokens // ratio


def state_rows(tokens: int, ratio: int) -> tuple[int, int]:
    """The compressor-state rows of the open group (and, for overlapping windows, the group
    before it): the positions the next compressed row will pool."""
    return max(0, (tokens // ratio - (halves(ratio) - 1)) * ratio), tokens


# ----- slots -----------------------------------------------------------------------------------
def check_rows_range(name: str, rows) -> tuple[int, int]:
    """``rows`` if it is a ``(start, stop)`` pair of ints with ``0 <= start <= stop``; InputError otherwise."""
    if not (isinstance(rows, tuple) and len(rows) == 2 and all(type(v) is int for v in rows)  # noqa: E721
            and 0 <= rows[0] <= rows[1]):
        raise InputError(f"rows of cache {name!r} must be a (start, stop) pair of ints with 0 <= start <= stop, "
                         f"got {rows!r}")
    return rows


def check_request_pages(name: str, where) -> RequestPages:
    """``where`` is a RequestPages whose cache fits its layout and whose pages are a host int tensor."""
    if not isinstance(where, RequestPages):
        raise InputTypeError(f"cache {name!r} must be given as a RequestPages(layout, cache, pages), "
                             f"got {describe(where)}")
    if not isinstance(where.layout, Layout):
        raise InputTypeError(f"cache {name!r}: layout must be a Layout, got {describe(where.layout)}")
    check_cache(where.layout, where.cache)
    pages = where.pages
    if not isinstance(pages, torch.Tensor) or pages.dim() != 1 or pages.dtype not in (torch.int32, torch.int64):
        raise InputTypeError(f"cache {name!r}: pages must be a 1-D int32/int64 tensor, got {describe(pages)}")
    if pages.device.type != "cpu":
        # the checks read them: a block-table row copied once to the host costs one transfer,
        # reading a device tensor here would synchronize with every queued kernel
        raise InputError(f"cache {name!r}: pages must be on the host (their range is checked before any byte "
                         f"moves); pass table_row.cpu(), got a tensor on {pages.device}")
    return where


def request_slots(name: str, where: RequestPages, start: int, stop: int) -> torch.Tensor:
    """int64 host ``[stop - start]``: the slots of the request's rows ``[start, stop)`` in
    ``where``. InputError, before anything moves, when a row lies past the request's pages
    (capacity), a page id lies outside the cache, or two rows share a slot (overlap)."""
    ps, n_pages = where.layout.page_size, where.cache.shape[0]
    if stop > where.pages.shape[0] * ps:
        raise InputError(f"cache {name!r}: rows [{start}, {stop}) run past the request's {where.pages.shape[0]} "
                         f"pages of {ps} rows (capacity {where.pages.shape[0] * ps})")
    i = torch.arange(start, stop, dtype=torch.int64)
    pages = where.pages.to(torch.int64)[i // ps]
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= n_pages):
        bad = int(pages[(pages < 0) | (pages >= n_pages)][0])
        raise InputError(f"cache {name!r}: page id {bad} of the request is outside the cache's {n_pages} pages")
    slots = pages * ps + i % ps
    if slots.unique().numel() != slots.numel():
        raise InputError(f"cache {name!r}: the request's pages give rows [{start}, {stop}) overlapping slots "
                         f"(a page id repeated where its rows are used twice)")
    return slots


# ----- moving rows -----------------------------------------------------------------------------
def _unit(*sizes: int) -> torch.dtype:
    """The widest integer type whose size divides every byte count and offset given."""
    return next((dt for dt in _WIDE if all(v % dt.itemsize == 0 for v in sizes)), torch.uint8)


def place_rows(layout: Layout, cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows`` (uint8 ``[N, row_bytes]``, on the cache's device) at ``slots`` (int64, the
    cache's device, checked by ``request_slots``): each segment's record at its own place in its
    page. No host read (unlike ``codec.rows.write_rows``, which filters invalid slots on the
    host): the slots are already known valid."""
    if slots.shape[0] == 0:
        return
    ps = layout.page_size
    page, row = slots // ps, slots % ps
    rows = rows.contiguous()
    at = 0
    for seg in layout.segments:
        view = layout.segment_view(cache, seg.name)  # uint8 [pages, page_size, record_bytes]
        rec = seg.record_bytes
        unit = _unit(rec, at, rows.shape[1], view.stride(0), int(view.storage_offset()))
        part = rows[:, at:at + rec]
        if unit != torch.uint8:  # whole records in a few wide moves, not byte by byte
            view, part = view.view(unit), part.view(unit)
        view[page, row] = part
        at += rec
