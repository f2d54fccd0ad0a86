"""Gather launcher shared by the byte formats (fp8_ds_mla, fp8_indexer, mxfp4_indexer)."""

from __future__ import annotations

import torch

from kvformats.errors import LayoutError
from kvformats_kernels import _common as cm
from kvformats_kernels.rows_jit import gather_bytes_kernel


def gather(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Encoded rows at ``slots [N]`` -> uint8 ``[N, row_bytes]``; zero rows for invalid slots."""
    n = slots.shape[0]
    out = torch.empty((n, layout.row_bytes), dtype=torch.uint8, device=cache.device)
    if n == 0:
        return out
    segs = layout.segments
    if len(segs) > 2:
        raise LayoutError(f"the Triton gather handles layouts of at most 2 segments; {layout.name} has {len(segs)}")
    u8, stride = cm.byte_cache(layout, cache)
    geo = []
    for i in range(2):
        if i < len(segs):
            rec = segs[i].record_bytes
            geo += [layout.segment_offsets[segs[i].name], rec, cm.next_pow2(rec)]
        else:
            geo += [0, 0, 1]
    cfg = cm.config("gather", "bytes")
    block_m = cm.rows_per_tile(cfg["tile_bytes"], cm.next_pow2(layout.row_bytes))
    gather_bytes_kernel[(cm.grid_rows(n, block_m),)](
        u8, slots, out, n, slots.stride(0), cm.capacity(layout, cache), stride,
        PAGE_SIZE=layout.page_size, ROW_BYTES=layout.row_bytes,
        SEG0_OFF=geo[0], SEG0_REC=geo[1], SEG0_P2=geo[2], SEG1_OFF=geo[3], SEG1_REC=geo[4], SEG1_P2=geo[5],
        BLOCK_M=block_m, num_warps=cfg["num_warps"])
    return out
