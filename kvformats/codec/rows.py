"""Reference row I/O shared by every format: read and write whole encoded rows by slot.

Rows move per segment as whole records. When the page stride, the segment offsets and the
record sizes allow it, the cache is reinterpreted as a table of records of the widest integer
type that divides them all (int64 for fp8_ds_mla's 576 B and 8 B records), so one index copies
a record in a few wide moves instead of byte by byte. Byte results are the same either way.
"""

from __future__ import annotations

import torch

from kvformats.errors import LayoutError

_WIDE = (torch.int64, torch.int32, torch.int16, torch.uint8)


def locate(layout, cache: torch.Tensor, slots: torch.Tensor):
    """(valid mask, page index, row index) for each slot; invalid slots point at row 0."""
    capacity = cache.shape[0] * layout.page_size
    s = slots.to(torch.int64)
    valid = (s >= 0) & (s < capacity)
    safe = torch.where(valid, s, torch.zeros_like(s))
    return valid, safe // layout.page_size, safe % layout.page_size


def _record_tables(layout, cache: torch.Tensor):
    """For each segment: (table, per-page step, first index, record width, row offset), where
    ``table`` is a 2-D ``[records, width]`` view of the cache storage in a unit dtype and a slot's
    record is ``table[page * step + first + row]``; plus the unit dtype."""
    u8, stride = layout.byte_pages(cache)
    base_off = u8.storage_offset()
    segs = layout.segments
    offs = [layout.segment_offsets[s.name] for s in segs]
    sizes = [base_off, stride, layout.row_bytes, *offs, *(s.record_bytes for s in segs)]
    unit = next(dt for dt in _WIDE if all(v % dt.itemsize == 0 for v in sizes))
    w = unit.itemsize
    span = (cache.shape[0] - 1) * stride + layout.min_page_bytes
    flat = u8.as_strided((span,), (1,), base_off).view(unit)
    out, row_at = [], 0
    for seg, off in zip(segs, offs):
        rec = seg.record_bytes // w
        if stride % seg.record_bytes == 0 and off % seg.record_bytes == 0:
            table = flat.as_strided((flat.shape[0] // rec, rec), (rec, 1), flat.storage_offset())
            out.append((table, stride // seg.record_bytes, off // seg.record_bytes, rec, row_at // w))
        else:  # records not on a grid of their own size: index [page, row] directly
            table = flat.as_strided((cache.shape[0], layout.page_size, rec), (stride // w, rec, 1),
                                    flat.storage_offset() + off // w)
            out.append((table, None, None, rec, row_at // w))
        row_at += seg.record_bytes
    return out, unit


def read_rows(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, row_bytes]``: each slot's encoded row; zeros for negative or out-of-range slots."""
    n = slots.shape[0]
    if n == 0 or cache.shape[0] == 0:
        return torch.zeros((n, layout.row_bytes), dtype=torch.uint8, device=cache.device)
    valid, page, row = locate(layout, cache, slots)
    tables, unit = _record_tables(layout, cache)
    out = torch.empty((n, layout.row_bytes // unit.itemsize), dtype=unit, device=cache.device)
    for table, step, first, rec, at in tables:
        if step is not None:
            out[:, at:at + rec] = table.index_select(0, page * step + (first + row))
        else:
            out[:, at:at + rec] = table[page, row]
    out.mul_(valid.unsqueeze(1))  # zero rows for invalid slots, without asking the host
    return out.view(torch.uint8)


def _as_units(rows: torch.Tensor, unit: torch.dtype) -> torch.Tensor:
    """uint8 ``rows`` viewed as ``unit`` (``[N, row_bytes / width]``). A format's ``encode_rows``
    may return any uint8 tensor, a view of its input among them: where its storage offset or row
    stride is not a multiple of the unit's width, no such view exists and the rows are first
    copied to a fresh contiguous tensor (none of the shipped formats' results needs the copy)."""
    rows = rows.contiguous()
    w = unit.itemsize
    if rows.storage_offset() % w or rows.stride(0) % w:
        rows = torch.empty(rows.shape, dtype=torch.uint8, device=rows.device).copy_(rows)
    return rows.view(unit)


def write_rows(layout, cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Store ``rows`` (uint8 ``[N, row_bytes]``, any strides and storage offset) at their slots;
    skips negative and out-of-range slots and touches no byte outside the written rows.
    LayoutError, naming the format, for rows of another dtype or shape (a format's
    ``encode_rows`` that returns them is wrong)."""
    if slots.shape[0] == 0 or cache.shape[0] == 0:
        return
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[0] != slots.shape[0] \
            or rows.shape[1] != layout.row_bytes:
        raise LayoutError(f"{layout.name}: rows to store must be uint8 [{slots.shape[0]}, {layout.row_bytes}] "
                          f"(what its encode_rows returns), got {rows.dtype} {list(rows.shape)}")
    valid, page, row = locate(layout, cache, slots)
    if not bool(valid.all()):
        keep = valid.nonzero().squeeze(1)
        page, row, rows = page[keep], row[keep], rows[keep]
    tables, unit = _record_tables(layout, cache)
    rows = _as_units(rows, unit)
    for table, step, first, rec, at in tables:
        if step is not None:
            table.index_copy_(0, page * step + (first + row), rows[:, at:at + rec])
        else:
            table[page, row] = rows[:, at:at + rec]
