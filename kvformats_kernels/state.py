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
           ape: torch.Tensor, site: int = cm.SITES["encode"]) -> None:
    """Store ``kv [N, W]`` and ``score + ape[positions % ratio]`` at ``slots [N]`` (float32);
    slots outside [0, capacity) are skipped, those >= capacity recorded at ``site`` (encode's;
    save_compressor_state passes its own). An empty cache still takes the launch, so that its
    slots are checked."""
    (kv, kv_bf16), (score, score_bf16), (ape, ape_bf16) = (cm.rows_input(t) for t in (*x, ape))
    n = kv.shape[0]
    if n == 0:
        return
    kv_off, row_stride, _ = cm.region(layout, "kv")
    score_off, _, _ = cm.region(layout, "score")
    cfg = cm.config("state", "copy", n)
    jit.encode_kernel[_grid(n, layout.width, cfg)](
        kv, score, positions, ape, slots, cache, cm.error_record(cache), n, cm.row_stride(kv), cm.row_stride(score),
        positions.stride(0), cm.row_stride(ape), slots.stride(0), cm.capacity(layout, cache), cache.stride(0),
        PAGE_SIZE=layout.page_size, ROW_STRIDE=_floats(row_stride), KV_OFF=_floats(kv_off),
        SCORE_OFF=_floats(score_off), W=layout.width, RATIO=layout.ratio,
        KV_BF16=kv_bf16, SCORE_BF16=score_bf16, APE_BF16=ape_bf16,
        BLOCK_M=cfg["block_m"], BLOCK_W=cfg["block_w"], SITE=site, **cm.launch_opts(cfg))


def _gather_words(layout, cache: torch.Tensor, slots: torch.Tensor, split: int, dtype,
                  site: int) -> list[torch.Tensor]:
    """The rows' 32-bit words as one ``[N, words]`` tensor (split 0), or as ``[N, split]`` and
    ``[N, words - split]``, of ``dtype`` (4 bytes; the kernel copies bits through int32 views);
    slots >= capacity recorded at ``site``."""
    n = slots.shape[0]
    seg = layout.segments[0]
    elems = _floats(seg.record_bytes)
    widths = [split, elems - split] if split else [elems]
    outs = [torch.empty((n, w), dtype=dtype, device=cache.device) for w in widths]
    if n > 0:
        cfg = cm.config("state", "copy", n)
        jit.gather_kernel[_grid(n, elems, cfg)](
            cache.view(torch.int32), slots, outs[0].view(torch.int32), outs[-1].view(torch.int32),
            cm.error_record(cache), n,
            slots.stride(0), cm.capacity(layout, cache), cache.stride(0), PAGE_SIZE=layout.page_size,
            ROW_STRIDE=_floats(seg.record_bytes), ROW_OFF=_floats(layout.segment_offsets[seg.name]), ROW_ELEMS=elems,
            SPLIT=split, BLOCK_M=cfg["block_m"], BLOCK_W=cfg["block_w"], SITE=site, **cm.launch_opts(cfg))
    return outs


def gather(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The rows' bytes, uint8 ``[N, 8W]``; zero rows for invalid slots."""
    return _gather_words(layout, cache, slots, 0, torch.int32, cm.SITES["gather"])[0].view(torch.uint8)


def decode(layout, cache: torch.Tensor, slots: torch.Tensor, site: int = cm.SITES["decode"]):
    """``(kv [N, W], score_state [N, W])`` float32, two tensors of their own (not views of one
    gathered row), so the custom op returns them without copies (outputs must not alias)."""
    return tuple(_gather_words(layout, cache, slots, layout.width, torch.float32, site))


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor):
    """``(kv [T, K, W], score_state [T, K, W])`` at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)
