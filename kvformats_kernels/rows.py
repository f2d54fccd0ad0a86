"""Record-copy launchers shared by the byte formats (fp8_ds_mla, fp8_indexer, mxfp4_indexer):
``gather`` by slots and ``gather_paged`` by block table + cu_seq_lens.

Bytes move in the widest unit (int64, int32, int16 or uint8) that divides every address
involved: the cache's and the outputs' start, the page stride, the segment offsets, the record
sizes and the output row strides. That is decided here, from the layout and the tensors'
metadata (no host synchronisation), so the kernels issue 8- or 16-byte accesses where the
geometry allows and fall back to narrower ones where it does not.
"""

from __future__ import annotations

import functools
import math

import torch

from kvformats.errors import LayoutError
from kvformats_kernels import _common as cm
from kvformats_kernels import rows_jit as jit
from kvformats_kernels import tuning
from kvformats_kernels.launch import fast

NAME = tuning.module_name(__name__)  # this module's name in the tuning tables (kvformats_kernels.tuning)
UNITS = (torch.int64, torch.int32, torch.int16, torch.uint8)


def _unit_of(g: int, cfg) -> torch.dtype:
    """The widest unit (at most the launch config ``cfg``'s ``max_unit`` bytes) whose size divides
    ``g``, the greatest common divisor of the values (0 when all are 0: every size divides them)."""
    widest = cfg.get("max_unit", 8)
    return next(u for u in UNITS if u.itemsize <= widest and g % u.itemsize == 0)


def unit_cache(layout, cache: torch.Tensor, unit: torch.dtype) -> tuple[torch.Tensor, int]:
    """(1-D ``unit`` alias of the cache's pages, page stride in units)."""
    u8, stride = cm.byte_cache(layout, cache)
    if cache.shape[0] == 0:
        return u8.reshape(-1)[:0].view(torch.uint8), 0
    span = (cache.shape[0] - 1) * stride + layout.min_page_bytes
    flat = u8.as_strided((span,), (1,), u8.storage_offset())
    return flat.view(unit), stride // unit.itemsize


@cm.per_layout
def _segment_constants(layout, unit: torch.dtype) -> dict:
    """Each segment's offset, record size and record size rounded up to a power of two, in units."""
    segs = layout.segments
    if len(segs) > 2:
        raise LayoutError(f"the Triton byte kernels handle layouts of at most 2 segments; "
                          f"{layout.name} has {len(segs)}")
    w = unit.itemsize
    out: dict = {}
    for i in range(2):
        if i < len(segs):
            rec = segs[i].record_bytes // w
            vals = [layout.segment_offsets[segs[i].name] // w, rec, cm.next_pow2(rec)]
        else:
            vals = [0, 0, 1]
        out.update(zip((f"S{i}_OFF", f"S{i}_REC", f"S{i}_P2"), vals))
    return out


@functools.lru_cache(maxsize=256)
def _layout_gcd(layout, row_bytes: bool) -> int:
    """gcd of the layout's byte counts that the unit must divide: segment offsets and record
    sizes (and, with ``row_bytes``, the row size: the slot gather's output rows)."""
    segs = layout.segments
    values = [*(layout.segment_offsets[s.name] for s in segs), *(s.record_bytes for s in segs)]
    return math.gcd(*values, layout.row_bytes if row_bytes else 0)


@functools.lru_cache(maxsize=512)
def _gather_plan(layout, unit: torch.dtype, cfg_items: tuple, evict_first_rows: int):
    """(rows per program, the slot gather's constexprs and launch options) for a layout, a
    unit and a launch config (its items: a config a benchmark or test overrides is another
    key): everything of a launch that no tensor value or address changes."""
    cfg = dict(cfg_items)
    block_m = cm.rows_per_tile(cfg["tile_bytes"], cm.next_pow2(layout.row_bytes))
    return block_m, cm.frozen(dict(
        PAGE_SIZE=layout.page_size, ROW=layout.row_bytes // unit.itemsize, **_segment_constants(layout, unit),
        BLOCK_M=block_m, SITE=cm.SITES["gather"], EVICT_FIRST=layout.row_bytes <= evict_first_rows,
        num_warps=cfg["num_warps"]))


def gather(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Encoded rows at ``slots [N]`` -> uint8 ``[N, row_bytes]``; zero rows for invalid slots."""
    n = slots.shape[0]
    out = torch.empty((n, layout.row_bytes), dtype=torch.uint8, device=cache.device)
    if n == 0:
        return out
    pages = cache.shape[0]
    cfg = cm.config(NAME, "gather", n)
    if pages:
        u8, stride = cm.byte_cache(layout, cache)
        unit = _unit_of(math.gcd(u8.data_ptr(), stride, _layout_gcd(layout, True)), cfg)
    else:
        unit = torch.uint8
    src, stride = unit_cache(layout, cache, unit)
    block_m, consts = _gather_plan(layout, unit, tuple(cfg.items()), cfg["evict_first_rows"])
    fast(jit.gather_bytes_kernel)[(cm.grid_rows(n, block_m),)](
        src, slots, out.view(unit), cm.error_record(cache), n, slots.stride(0), pages * layout.page_size, stride,
        **consts)
    return out


@functools.lru_cache(maxsize=512)
def _paged_plan(layout, unit: torch.dtype, cfg_items: tuple, requests: int):
    """(rows per program, gather_paged's constexprs and launch options) for a layout, a unit, a
    launch config (its items) and a request count; as _gather_plan."""
    cfg = dict(cfg_items)
    block_m = cm.rows_per_tile(cfg["tile_bytes"], cm.next_pow2(layout.row_bytes))
    scan = cm.next_pow2(requests) if requests <= cfg["cu_scan_max"] else 0
    return block_m, cm.frozen(dict(
        PAGE_SIZE=layout.page_size, STEPS=max(1, requests.bit_length()), **_segment_constants(layout, unit),
        BLOCK_M=block_m, SITE=cm.SITES["cu_seq_lens"], SCAN=scan, num_warps=cfg["num_warps"]))


def gather_paged(layout, cache: torch.Tensor, views, block_table: torch.Tensor, cu_seq_lens: torch.Tensor) -> None:
    """Fill the per-segment workspace views (uint8 ``[T, record_bytes]``) with the records of
    each request's positions, in cu order; rows past ``cu[-1]`` untouched. cu_seq_lens is
    checked by the kernel's program 0 (recorded, as the reference records it), so there is one
    program even for empty workspaces or no requests."""
    t_rows = views[0].shape[0]
    requests = cu_seq_lens.shape[0] - 1
    pages = cache.shape[0]
    cfg = cm.config(NAME, "gather_paged")
    if pages:
        u8, stride = cm.byte_cache(layout, cache)
        g = math.gcd(u8.data_ptr(), stride, _layout_gcd(layout, False))
        for v in views:
            g = math.gcd(g, v.data_ptr(), v.stride(0) if v.shape[0] > 1 else v.shape[1])
        unit = _unit_of(g, cfg)
    else:
        unit = torch.uint8
    src, stride = unit_cache(layout, cache, unit)
    outs = [v.view(unit) for v in views]
    while len(outs) < 2:
        outs.append(outs[0])
    block_m, consts = _paged_plan(layout, unit, tuple(cfg.items()), requests)
    fast(jit.gather_paged_kernel)[(max(1, cm.grid_rows(t_rows, block_m)),)](
        src, block_table, cu_seq_lens, outs[0], outs[1], cm.error_record(cache), t_rows, requests,
        cu_seq_lens.stride(0), block_table.stride(0), block_table.stride(1), block_table.shape[1], pages, stride,
        outs[0].stride(0), outs[1].stride(0), **consts)
