"""Reference row I/O shared by every format: read and write whole encoded rows by slot.

Rows move per segment through ``[pages, page_size, record_bytes]`` views with two index
tensors, so each copy is a contiguous record rather than a byte-by-byte scatter.
"""

from __future__ import annotations

import torch


def locate(layout, cache: torch.Tensor, slots: torch.Tensor):
    """(valid mask, page index, row index) for each slot; invalid slots point at row 0."""
    capacity = cache.shape[0] * layout.page_size
    s = slots.to(torch.int64)
    valid = (s >= 0) & (s < capacity)
    safe = torch.where(valid, s, torch.zeros_like(s))
    return valid, safe // layout.page_size, safe % layout.page_size


def read_rows(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, row_bytes]``: each slot's encoded row; zeros for negative or out-of-range slots."""
    n = slots.shape[0]
    out = torch.zeros((n, layout.row_bytes), dtype=torch.uint8, device=cache.device)
    if n == 0 or cache.shape[0] == 0:
        return out
    valid, page, row = locate(layout, cache, slots)
    at = 0
    for seg in layout.segments:
        out[:, at:at + seg.record_bytes] = layout.segment_view(cache, seg.name)[page, row]
        at += seg.record_bytes
    return out.mul_(valid.unsqueeze(1))


def write_rows(layout, cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Store ``rows`` (uint8 ``[N, row_bytes]``) at their slots; skips negative and out-of-range
    slots and touches no byte outside the written rows."""
    if slots.shape[0] == 0 or cache.shape[0] == 0:
        return
    valid, page, row = locate(layout, cache, slots)
    if not bool(valid.all()):
        keep = valid.nonzero().squeeze(1)
        page, row, rows = page[keep], row[keep], rows[keep]
    at = 0
    for seg in layout.segments:
        layout.segment_view(cache, seg.name)[page, row] = rows[:, at:at + seg.record_bytes]
        at += seg.record_bytes
