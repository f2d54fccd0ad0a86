"""compressor_state launchers: encode (with ape), decode and gather."""

from __future__ import annotations

import torch

from kvformats_kernels import _common as cm
from kvformats_kernels import state_jit as jit

_WORD = 4  # bytes per float32 element of the cache


def _floats(nbytes: int) -> int:
    return nbytes // _WORD


def _grid(n: int, width: int, cfg: dict) -> tuple[int, int]:
    return cm.grid_rows(n, cfg["block_m"]), cm.grid_rows(width, cfg["block_w"])


def encode(layout, x, cache: torch.Tensor, slots: torch.Tensor, *, positions: torch.Tensor,
           ape: torch.Tensor) -> None:
    """Store ``kv [N, W]`` and ``score + ape[positions % ratio]`` at ``slots [N]`` (float32);
    slots outside [0, capacity) are skipped."""
    (kv, kv_bf16), (score, score_bf16), (ape, ape_bf16) = (cm.rows_input(t) for t in (*x, ape))
    n = kv.shape[0]
    if n == 0 or cache.shape[0] == 0:
        return
    kv_off, row_stride, _ = cm.region(layout, "kv")
    score_off, _, _ = cm.region(layout, "score")
    cfg = cm.config("state", "copy", n)
    jit.encode_kernel[_grid(n, layout.width, cfg)](
        kv, score, positions, ape, slots, cache, n, cm.row_stride(kv), cm.row_stride(score),
        positions.stride(0), cm.row_stride(ape), slots.stride(0), cm.capacity(layout, cache), cache.stride(0),
        PAGE_SIZE=layout.page_size, ROW_STRIDE=_floats(row_stride), KV_OFF=_floats(kv_off),
        SCORE_OFF=_floats(score_off), W=layout.width, RATIO=layout.ratio,
        KV_BF16=kv_bf16, SCORE_BF16=score_bf16, APE_BF16=ape_bf16,
        BLOCK_M=cfg["block_m"], BLOCK_W=cfg["block_w"], num_warps=cfg["num_warps"])


def _gather_words(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    n = slots.shape[0]
    seg = layout.segments[0]
    elems = _floats(seg.record_bytes)
    out = torch.empty((n, elems), dtype=torch.int32, device=cache.device)
    if n > 0:
        cfg = cm.config("state", "copy", n)
        jit.gather_kernel[_grid(n, elems, cfg)](
            cache.view(torch.int32), slots, out, n, slots.stride(0), cm.capacity(layout, cache), cache.stride(0),
            PAGE_SIZE=layout.page_size, ROW_STRIDE=_floats(seg.record_bytes),
            ROW_OFF=_floats(layout.segment_offsets[seg.name]), ROW_ELEMS=elems,
            BLOCK_M=cfg["block_m"], BLOCK_W=cfg["block_w"], num_warps=cfg["num_warps"])
    return out


def gather(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The rows' bytes, uint8 ``[N, 8W]``; zero rows for invalid slots."""
    return _gather_words(layout, cache, slots).view(torch.uint8)


def decode(layout, cache: torch.Tensor, slots: torch.Tensor):
    """``(kv [N, W], score_state [N, W])`` float32 views of the gathered rows."""
    values = _gather_words(layout, cache, slots).view(torch.float32)
    return values[:, :layout.width], values[:, layout.width:]


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor):
    """``(kv [T, K, W], score_state [T, K, W])`` at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)
