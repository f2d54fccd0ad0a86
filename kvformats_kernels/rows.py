"""Record-copy launchers shared by the byte formats (fp8_ds_mla, fp8_indexer, mxfp4_indexer):
``gather`` by slots and ``gather_paged`` by block table + cu_seq_lens.

Bytes move in the widest unit (int64, int32, int16 or uint8) that divides every address
involved: the cache's and the outputs' start, the page stride, the segment offsets, the record
sizes and the output row strides. That is decided here, from the layout and the tensors'
metadata (no host synchronisation), so the kernels issue 8- or 16-byte accesses where the
geometry allows and fall back to narrower ones where it does not.
"""

from __future__ import annotations

import torch

from kvformats.errors import LayoutError
from kvformats_kernels import _common as cm
from kvformats_kernels import rows_jit as jit

UNITS = (torch.int64, torch.int32, torch.int16, torch.uint8)


def pick_unit(values) -> torch.dtype:
    """The widest unit dtype (at most CONFIG's ``max_unit`` bytes) whose size divides every
    value (byte counts and addresses)."""
    widest = cm.config("gather", "bytes").get("max_unit", 8)
    return next(u for u in UNITS if u.itemsize <= widest and all(int(v) % u.itemsize == 0 for v in values))


def unit_cache(layout, cache: torch.Tensor, unit: torch.dtype) -> tuple[torch.Tensor, int]:
    """(1-D ``unit`` alias of the cache's pages, page stride in units)."""
    u8, stride = cm.byte_cache(layout, cache)
    if cache.shape[0] == 0:
        return u8.reshape(-1)[:0].view(torch.uint8), 0
    span = (cache.shape[0] - 1) * stride + layout.min_page_bytes
    flat = u8.as_strided((span,), (1,), u8.storage_offset())
    return flat.view(unit), stride // unit.itemsize


def _segment_constants(layout, unit: torch.dtype) -> dict:
    """Each segment's offset, record size and record size rounded up to a power of two, in units."""
    segs = layout.segments
    if len(segs) > 2:
        raise LayoutError(f"the Triton byte kernels handle layouts of at most 2 segments; "
                          f"{layout.name} has {len(segs)}")
    w = unit.itemsize
    out = {}
    for i in range(2):
        if i < len(segs):
            rec = segs[i].record_bytes // w
            vals = [layout.segment_offsets[segs[i].name] // w, rec, cm.next_pow2(rec)]
        else:
            vals = [0, 0, 1]
        out.update(zip((f"S{i}_OFF", f"S{i}_REC", f"S{i}_P2"), vals))
    return out


def _layout_bytes(layout, cache: torch.Tensor) -> list[int]:
    u8, stride = cm.byte_cache(layout, cache)
    segs = layout.segments
    return [u8.data_ptr(), stride, *(layout.segment_offsets[s.name] for s in segs), *(s.record_bytes for s in segs)]


def _block_m(row_bytes: int, rows: int | None = None, op: str = "bytes") -> tuple[int, int]:
    """(rows per program, warps) of the slot gather (``op`` "bytes") or gather_paged ("paged")."""
    cfg = cm.config("gather", op, rows)
    return cm.rows_per_tile(cfg["tile_bytes"], cm.next_pow2(row_bytes)), cfg["num_warps"]


def gather(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Encoded rows at ``slots [N]`` -> uint8 ``[N, row_bytes]``; zero rows for invalid slots."""
    n = slots.shape[0]
    out = torch.empty((n, layout.row_bytes), dtype=torch.uint8, device=cache.device)
    if n == 0:
        return out
    unit = pick_unit([*_layout_bytes(layout, cache), layout.row_bytes]) if cache.shape[0] else torch.uint8
    src, stride = unit_cache(layout, cache, unit)
    block_m, warps = _block_m(layout.row_bytes, n)
    jit.gather_bytes_kernel[(cm.grid_rows(n, block_m),)](
        src, slots, out.view(unit), cm.error_record(cache), n, slots.stride(0), cm.capacity(layout, cache), stride,
        PAGE_SIZE=layout.page_size, ROW=layout.row_bytes // unit.itemsize, **_segment_constants(layout, unit),
        BLOCK_M=block_m, SITE=cm.SITES["gather"],
        EVICT_FIRST=layout.row_bytes <= cm.config("gather", "bytes")["evict_first_rows"], num_warps=warps)
    return out


def gather_paged(layout, cache: torch.Tensor, views, block_table: torch.Tensor, cu_seq_lens: torch.Tensor) -> None:
    """Fill the per-segment workspace views (uint8 ``[T, record_bytes]``) with the records of
    each request's positions, in cu order; rows past ``cu[-1]`` untouched. cu_seq_lens is
    checked by the kernel's program 0 (recorded, as the reference records it), so there is one
    program even for empty workspaces or no requests."""
    t_rows = views[0].shape[0]
    requests = cu_seq_lens.shape[0] - 1
    row_strides = [v.stride(0) if v.shape[0] > 1 else v.shape[1] for v in views]
    facts = [*(v.data_ptr() for v in views), *row_strides]
    unit = pick_unit([*_layout_bytes(layout, cache), *facts]) if cache.shape[0] else torch.uint8
    src, stride = unit_cache(layout, cache, unit)
    outs = [v.view(unit) for v in views]
    while len(outs) < 2:
        outs.append(outs[0])
    block_m, warps = _block_m(layout.row_bytes, op="paged")
    scan = cm.next_pow2(requests) if requests <= cm.config("gather", "paged")["cu_scan_max"] else 0
    jit.gather_paged_kernel[(max(1, cm.grid_rows(t_rows, block_m)),)](
        src, block_table, cu_seq_lens, outs[0], outs[1], cm.error_record(cache), t_rows, requests,
        cu_seq_lens.stride(0),
        block_table.stride(0), block_table.stride(1), block_table.shape[1], cache.shape[0], stride,
        outs[0].stride(0), outs[1].stride(0), PAGE_SIZE=layout.page_size, STEPS=max(1, requests.bit_length()),
        **_segment_constants(layout, unit),
        BLOCK_M=block_m, SITE=cm.SITES["cu_seq_lens"], SCAN=scan, num_warps=warps)
