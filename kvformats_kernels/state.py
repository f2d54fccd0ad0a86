"""compressor_state launchers: encode (with ape), decode and gather; the same kernels serve
compressor_state_v41, whose encode stores the score as given (no ape, no positions)."""

from __future__ import annotations

import functools

import torch

from kvformats.formats import CompressorState, CompressorStateV41
from kvformats_kernels import _common as cm
from kvformats_kernels import state_jit as jit
from kvformats_kernels import tuning
from kvformats_kernels.launch import fast

NAME = tuning.module_name(__name__)  # this module's name in the tuning tables (kvformats_kernels.tuning)

SERVES = (CompressorState, CompressorStateV41)

_WORD = 4  # bytes per float32 element of the cache


def _floats(nbytes: int) -> int:
    return nbytes // _WORD


@functools.lru_cache(maxsize=512)
def _encode_plan(layout, bf16: tuple, ape_half: int, cfg_items: tuple, site: int):
    """(rows per program, column programs, every constexpr and launch option of the encode)
    for a layout, the inputs' bf16 flags (kv, score, ape), a launch config (its items: an
    overridden config is another key) and the record site; no tensor value or address. A layout
    without APE (compressor_state_v41) compiles the kernel with APE=False: score stored as given."""
    cfg = dict(cfg_items)
    has_ape = isinstance(layout, CompressorState)
    kv_off, row_stride, _ = cm.region(layout, "kv")
    score_off, _, _ = cm.region(layout, "score")
    kv_bf16, score_bf16, ape_bf16 = bf16
    return cfg["block_m"], cm.grid_rows(layout.width, cfg["block_w"]), cm.frozen(dict(
        PAGE_SIZE=layout.page_size, ROW_STRIDE=_floats(row_stride), KV_OFF=_floats(kv_off),
        SCORE_OFF=_floats(score_off), W=layout.width, APE=has_ape, RATIO=layout.ratio if has_ape else 1,
        APE_HALF=ape_half,
        KV_BF16=kv_bf16, SCORE_BF16=score_bf16, APE_BF16=ape_bf16,
        BLOCK_M=cfg["block_m"], BLOCK_W=cfg["block_w"], SITE=site, **cm.launch_opts(cfg)))


@functools.lru_cache(maxsize=512)
def _gather_plan(layout, split: int, cfg_items: tuple, site: int):
    """(rows per program, column programs, the word gather's constexprs and launch options);
    as _encode_plan."""
    cfg = dict(cfg_items)
    seg = layout.segments[0]
    elems = _floats(seg.record_bytes)
    return cfg["block_m"], cm.grid_rows(elems, cfg["block_w"]), cm.frozen(dict(
        PAGE_SIZE=layout.page_size, ROW_STRIDE=elems, ROW_OFF=_floats(layout.segment_offsets[seg.name]),
        ROW_ELEMS=elems, SPLIT=split, BLOCK_M=cfg["block_m"], BLOCK_W=cfg["block_w"], SITE=site,
        **cm.launch_opts(cfg)))


def encode(layout, x, cache: torch.Tensor, slots: torch.Tensor, *, positions: torch.Tensor | None = None,
           ape: torch.Tensor | None = None, site: int = cm.SITES["encode"]) -> None:
    """Store ``kv [N, W]`` and ``score + ape[positions % ratio]`` at ``slots [N]`` (float32; for
    compressor_state_v41, which takes no positions and no ape, ``score`` as given);
    slots outside [0, capacity) are skipped, those >= capacity recorded at ``site`` (encode's;
    save_compressor_state passes its own). An empty cache still takes the launch, so that its
    slots are checked."""
    if ape is None or positions is None:  # never read by the APE-free kernel: any pointers do
        ape, positions = x[0], slots
    if ape.dim() == 3:  # the halves [ratio, 2, W/2]: two row strides, unit element stride
        if ape.stride(2) != 1:
            ape = ape.contiguous()
        ape_half, ape_half_stride = ape.shape[2], ape.stride(1)
        ape, ape_bf16 = (ape.view(torch.int16), True) if ape.dtype == torch.bfloat16 else (ape, False)
        ape_stride = ape.stride(0)
    else:
        (ape, ape_bf16), ape_half, ape_half_stride = cm.rows_input(ape), layout.width, 0
        ape_stride = cm.row_stride(ape)
    (kv, kv_bf16), (score, score_bf16) = (cm.rows_input(t) for t in x)
    n = kv.shape[0]
    if n == 0:
        return
    block_m, cols, consts = _encode_plan(layout, (kv_bf16, score_bf16, ape_bf16), ape_half,
                                         tuple(cm.config(NAME, "encode", n).items()), site)
    fast(jit.encode_kernel)[(cm.grid_rows(n, block_m), cols)](
        kv, score, positions, ape, slots, cache, cm.error_record(cache), n, cm.row_stride(kv), cm.row_stride(score),
        positions.stride(0), ape_stride, ape_half_stride, slots.stride(0), cache.shape[0] * layout.page_size,
        cache.stride(0), **consts)


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
        block_m, cols, consts = _gather_plan(layout, split, tuple(cm.config(NAME, "gather", n).items()), site)
        fast(jit.gather_kernel)[(cm.grid_rows(n, block_m), cols)](
            cache.view(torch.int32), slots, outs[0].view(torch.int32), outs[-1].view(torch.int32),
            cm.error_record(cache), n, slots.stride(0), cache.shape[0] * layout.page_size, cache.stride(0), **consts)
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
