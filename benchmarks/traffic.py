"""DRAM traffic model for the kernel benchmarks: the bytes an op moves at 32-byte sector
granularity, which is what random slots cost on a GPU (a 584 B fp8_ds_mla row at an arbitrary
slot touches 19 sectors, 608 B, not 584).

Only the cache side depends on the slot pattern; inputs, outputs and the slot list are dense
tensors, counted as their bytes rounded up to whole sectors.
"""

from __future__ import annotations

import torch

SECTOR = 32


def cache_sectors(layout, slots: torch.Tensor, page_stride: int) -> int:
    """Distinct 32-byte sectors of the cache holding the records of ``slots`` (CPU, int64)."""
    slots = slots.to("cpu", torch.int64)
    slots = slots[slots >= 0]
    page, row = slots // layout.page_size, slots % layout.page_size
    ids = []
    for seg in layout.segments:
        start = page * page_stride + layout.segment_offsets[seg.name] + row * seg.record_bytes
        first, last = start // SECTOR, (start + seg.record_bytes - 1) // SECTOR
        span = int((last - first).max()) + 1 if slots.numel() else 0
        steps = torch.arange(span)
        sect = first[:, None] + steps[None, :]
        ids.append(sect[steps[None, :] <= (last - first)[:, None]])
    return int(torch.unique(torch.cat(ids)).numel()) if ids and slots.numel() else 0


def dense_sectors(nbytes: int) -> int:
    return -(-nbytes // SECTOR)


def sector_bytes(layout, op: str, slots: torch.Tensor, page_stride: int, dense_bytes: int) -> int:
    """Bytes moved at sector granularity: the cache records the op reads or writes, plus
    ``dense_bytes`` of row inputs / outputs / slots (each op touches each cache record once)."""
    return SECTOR * (cache_sectors(layout, slots, page_stride) + dense_sectors(dense_bytes))
