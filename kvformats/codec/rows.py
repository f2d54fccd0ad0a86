"""Reference row I/O shared by every format: read and write whole encoded rows by slot.

Rows move per segment as whole records. When the page stride, the segment offsets and the
record sizes allow it, the cache is reinterpreted as a table of records of the widest integer
type that divides them all (int64 for fp8_ds_mla's 576 B and 8 B records), so one index copies
a record in a few wide moves instead of byte by byte. Byte results are the same either way.
"""

from __future__ import annotations

import torch

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


def write_rows(layout, cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Store ``rows`` (uint8 ``[N, row_bytes]``) at their slots; skips negative and out-of-range
    slots and touches no byte outside the written rows."""
    if slots.shape[0] == 0 or cache.shape[0] == 0:
        return
    valid, page, row = locate(layout, cache, slots)
    if not bool(valid.all()):
        keep = valid.nonzero().squeeze(1)
        page, row, rows = page[keep], row[keep], rows[keep]
    tables, unit = _record_tables(layout, cache)
    rows = rows.contiguous().view(unit)
    for table, step, first, rec, at in tables:
        if step is not None:
            table.index_copy_(0, page * step + (first + row), rows[:, at:at + rec])
        else:
            table[page, row] = rows[:, at:at + rec]
