"""Launchers of the indexer key formats (fp8_indexer, mxfp4_indexer): encode, decode, gather."""

from __future__ import annotations

import functools

import torch

from kvformats.formats import Fp8Indexer, Mxfp4Indexer
from kvformats_kernels import _common as cm
from kvformats_kernels import indexer_jit as jit
from kvformats_kernels import tuning
from kvformats_kernels.geometry import block_constants, row_geometry
from kvformats_kernels.launch import fast
from kvformats_kernels.rows import gather, gather_paged  # noqa: F401  (re-exported: the byte copies)

NAME = tuning.module_name(__name__)  # this module's name in the tuning tables (kvformats_kernels.tuning)

SERVES = (Fp8Indexer, Mxfp4Indexer)
ENCODES_PROFILES = True  # the encodes' constexprs implement every numerics profile of both

_KERNELS = {  # e2m1 values or not -> (encode kernel, decode body)
    False: (jit.fp8_encode_kernel, jit.fp8_decode_body),
    True: (jit.mxfp4_encode_kernel, jit.mxfp4_decode_body),
}


def _kernels(layout) -> tuple:
    return _KERNELS[_mxfp4(layout)]


def _mxfp4(layout) -> bool:
    """Whether the values are e2m1 nibbles (the MXFP4 kernels and constexprs)."""
    return row_geometry(layout).fp4


def _profile(layout, hw: bool) -> dict:
    if not _mxfp4(layout):
        return dict(cm.profile_constants(layout), POW2=layout.scale_rule.power_of_two, HW=hw,
                    **cm.short_exponent(layout.scale_rule))
    # e2m1 has no hardware conversion on Hopper (the GPU path's f16 pairs: _mxfp4_constants)
    return dict(cm.profile_constants(layout, e2m1=True), **cm.short_exponent(layout.scale_rule))


def _mxfp4_constants(layout, cfg: dict, hw: bool, words: bool) -> dict:
    """The MXFP4 encode's launch constexprs beyond geometry and profile: its layout (LANE), the
    GPU's f16-pair nibbles (HW) and whether they may be stored as int32 words (WORDS: every
    value address a multiple of 4)."""
    return dict(LANE=_whole_blocks_per_lane(layout, cfg), HW=hw and row_geometry(layout).block % 8 == 0, WORDS=words)


def _whole_blocks_per_lane(layout, cfg: dict) -> bool:
    """Whether the MXFP4 encode takes its one-block-per-lane layout: asked for, and the program
    has at least one (row, block) pair per lane. With fewer (a head dim of 32 gives one block
    per row) Triton spreads a block over lanes that also repeat each other, and on the H200
    (Triton 3.6) such programs stored wrong codes (blocks scaled by a part's maximum, or zero
    rows), found by the GPU fuzz (docs/reliability.md); those take the earlier layout."""
    pairs = cfg["block_m"] * cm.next_pow2(layout.num_blocks)
    return bool(cfg["lane"]) and pairs >= 32 * cfg["num_warps"]


@functools.lru_cache(maxsize=512)
def _encode_plan(layout, is_bf16: bool, cfg_items: tuple, hw: bool, words: bool):
    """(rows per program, every constexpr and launch option of the encode) for a layout, an
    input dtype, a launch config (its items: an overridden config is another key), the
    conversion choice and, for MXFP4, the word alignment; no tensor value or address."""
    cfg = dict(cfg_items)
    tail = _mxfp4_constants(layout, cfg, hw, words) if _mxfp4(layout) else {}
    return cfg["block_m"], cm.frozen(dict(
        G=cm.constants(block_constants(layout)), PAGE_SIZE=layout.page_size, **cm.rule_constants(layout.scale_rule),
        **_profile(layout, hw), IS_BF16=is_bf16,
        EXP_FLAT=bool(cfg.get("flat", 0)), BLOCK_M=cfg["block_m"], SITE=cm.SITES["encode"], **cm.launch_opts(cfg),
        **tail))


def encode(layout, x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize ``x [N, head_dim]`` into the rows at ``slots [N]``; slots outside
    [0, capacity) are skipped (those >= capacity recorded: an empty cache still takes the
    launch, so that its slots are checked)."""
    n = x.shape[0]
    if n == 0:
        return
    x, is_bf16 = cm.rows_input(x)
    u8, stride = cm.byte_cache(layout, cache)
    mxfp4 = _mxfp4(layout)
    cfg = cm.config(NAME, "encode_mxfp4" if mxfp4 else "encode", n)
    words = mxfp4 and cm.words_aligned(u8, stride, block_constants(layout))
    block_m, consts = _encode_plan(layout, is_bf16, tuple(cfg.items()), cm.hw_cvt(cfg), words)
    fast(_kernels(layout)[0])[(cm.grid_rows(n, block_m),)](
        x, slots, u8, cm.error_record(cache), n, cm.row_stride(x), slots.stride(0), cache.shape[0] * layout.page_size,
        stride, **consts)


@functools.lru_cache(maxsize=512)
def _decode_plan(layout, cfg_items: tuple, hw: bool, site: int):
    """(rows per program, the slot decode's constexprs and launch options); as _encode_plan."""
    cfg = dict(cfg_items)
    reads = cm.read_constants(layout) if _mxfp4(layout) else {}
    body = dict(block_constants(layout), **reads, HW=hw, STREAM=False)
    return cfg["block_m"], cm.decode_constants(_kernels(layout)[1], body, layout.page_size, cfg,
                                               ROW=layout.head_dim, SITE=site)


def _decode_launch(layout, u8: torch.Tensor, stride: int, n: int, site: int):
    cfg = cm.config(NAME, "decode", n)
    return (*_decode_plan(layout, tuple(cfg.items()), cm.hw_cvt(cfg), site), u8, 0)


def decode(layout, cache: torch.Tensor, slots: torch.Tensor, site: int = cm.SITES["decode"]) -> torch.Tensor:
    """float32 ``[N, head_dim]`` rows at ``slots``; zero rows for invalid slots (those >=
    capacity recorded at ``site``)."""
    return cm.decode_rows(layout, cache, slots, torch.float32, _decode_launch, site)


@functools.lru_cache(maxsize=512)
def _paged_plan(layout, has_glen: bool, has_base: bool, cfg_items: tuple, hw: bool):
    """(rows per program, dequantize_gather's constexprs and launch options); as _encode_plan."""
    cfg = dict(cfg_items)
    mxfp4 = _mxfp4(layout)
    body = dict(block_constants(layout), **cm.read_constants(layout), HW=hw,
                STREAM=mxfp4 and bool(cfg["mxfp4_cs_stores"]))
    return cfg["block_m"], cm.paged_constants(_kernels(layout)[1], body, layout.page_size, has_glen, has_base,
                                              cfg)


def dequantize_gather(layout, cache, out, block_table, seq_lens, gather_lens, base, offset) -> None:
    """float32 ``out [R, W, head_dim]``: see kvformats.codec.paged_ops.dequantize_gather (validated there)."""
    u8, stride = cm.byte_cache(layout, cache)
    cfg = cm.config(NAME, "dequantize_gather")
    block_m, consts = _paged_plan(layout, gather_lens is not None, base is not None, tuple(cfg.items()),
                                  cm.hw_cvt(cfg))
    cm.launch_paged(u8, stride, out, block_table, seq_lens, gather_lens, base, offset, cache.shape[0], block_m,
                    consts)


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor) -> torch.Tensor:
    """float32 ``[T, K, head_dim]`` rows at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)
