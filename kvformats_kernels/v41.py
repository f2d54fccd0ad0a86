"""Launchers of the DeepSeek V4.1 page formats (fp8_ds_mla_v41, fp4_ds_mla_v41 and their
token-interleaved layouts fp8_ds_mla_v41_interleaved, fp4_ds_mla_v41_interleaved): encode,
decode, dequantize_gather, decode_topk; gather and gather_paged are the shared byte copies
(rows.py).

Which codec a launch takes is read off the layout's declaration (the element type of its scaled
data region, geometry.row_geometry), not its name, and where its records lie off its regions'
offsets and strides (page-planar or interleaved alike). The encode's constexprs implement every
numerics profile of the four formats (_rule_constants).
"""

from __future__ import annotations

import functools

import torch

from kvformats.errors import LayoutError
from kvformats.formats import Fp4DsMlaV41, Fp4DsMlaV41Interleaved, Fp8DsMlaV41, Fp8DsMlaV41Interleaved
from kvformats_kernels import _common as cm
from kvformats_kernels import settings
from kvformats_kernels import v41_jit as jit
from kvformats_kernels.geometry import block_constants, row_geometry
from kvformats_kernels.launch import fast
from kvformats_kernels.rows import gather, gather_paged  # noqa: F401  (re-exported: the byte copies)

SERVES = (Fp8DsMlaV41, Fp8DsMlaV41Interleaved, Fp4DsMlaV41, Fp4DsMlaV41Interleaved)
ENCODES_PROFILES = True  # the encode's constexprs implement every numerics profile of all four

# Rows per program and warps, by op, chosen by sweeps (docs/explanation/measured-choices.md).
# encode_lanes, the fp4 encode of aligned bf16 rows, keeps one (row, block) pair per lane: a
# faster shape with several pairs a lane wrote wrong bytes for rows of wide magnitudes (see
# _lanes). hw_cvt: the GPU's float8 / bf16 conversions (cm.hw_cvt).
CONFIG = settings.declare("v41", {
    "encode": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
    "encode_lanes": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
    "decode": {"block_m": 4, "num_warps": 2, "hw_cvt": 1},
    "paged": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
})


@cm.per_layout
def _geometry(layout) -> dict:
    """The row's constexprs (geometry.block_constants) and whether its values are e2m1 nibbles."""
    return dict(block_constants(layout), FP4=row_geometry(layout).fp4)


@cm.per_layout
def _rule_constants(layout) -> dict:
    """The numerics profile as encode constexprs: the ScaleRule's (cm.rule_constants: FLOOR,
    ELEM_MAX, FLOOR_ON_SCALE, E_MIN, E_MAX), and
    SCALE_MAX: the fp4 scale's clamp (448; 0.0 for fp8's ue8m0 exponents);
    RECIPROCAL: the fp4 rule's ``reciprocal`` (vLLM: q = fl32(amax * RCP) instead of amax / ELEM_MAX);
    RCP: fl32(1 / ELEM_MAX), the factor RECIPROCAL multiplies by;
    POISON: the fp8 profile's ``poison_nonfinite`` (FlashMLA: a NaN or Inf block codes x / scale
    with a NaN or +Inf scale: NaN codes and signed zeros). The fp4 encode reads no such flag (an
    fp4 block's NaN already makes its scale NaN, and FlashMLA's fp4 writer takes an Inf for the
    largest float: scale 448, as the clamp rule), so POISON is False there;
    NAN_SIGN: the fp4 profile's ``e2m1_nan_sign`` (FlashMLA: a NaN element's nibble is 0x8 when
    that NaN's sign bit is set, else 0x0; False for fp8).
    Read off the layout (its profile), so every plan that holds them is keyed by it."""
    rule, prof = layout.scale_rule, layout.numerics
    fp4 = row_geometry(layout).fp4
    if fp4 and (prof.e2m1_rounding != "rne" or not prof.e2m1_signed_zero):
        raise LayoutError(f"the V4.1 fp4 encode codes e2m1 round-half-even with the sign of zero kept; profile "
                          f"{prof.name!r} of {layout.name} asks for {prof.e2m1_rounding!r}, signed zero "
                          f"{prof.e2m1_signed_zero}")
    return dict(cm.rule_constants(rule), SCALE_MAX=cm.f32(getattr(rule, "scale_max", 0.0)),
                RECIPROCAL=bool(getattr(rule, "reciprocal", False)), RCP=cm.f32(1.0 / rule.element_max),
                POISON=bool(prof.poison_nonfinite) and not fp4, NAN_SIGN=bool(prof.e2m1_nan_sign) and fp4)


@functools.lru_cache(maxsize=256)
def _encode_plan(layout, is_bf16: bool, cfg_items: tuple, hw: bool, words: bool, lanes: bool):
    """(rows per program, every constexpr and launch option of the encode): nothing here
    depends on a tensor's values; ``words``: every data address is a multiple of 4;
    ``lanes``: the fp4 one-pair-per-lane path (_encode_config)."""
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.frozen(dict(_geometry(layout), PAGE_SIZE=layout.page_size, **_rule_constants(layout),
                                          IS_BF16=is_bf16, BLOCK_M=cfg["block_m"], SITE=cm.SITES["encode"], HW=hw,
                                          WORDS=words, LANES=lanes, **cm.launch_opts(cfg)))


def _encode_config(layout, is_bf16: bool, aligned: bool) -> tuple[dict, bool]:
    """(launch config, whether it takes the lane path): the fp4 encode of bf16 rows that start
    on 16 bytes takes encode_lanes where its shape allows (_lanes); every other encode the
    per-row kernel's."""
    lanes = CONFIG["encode_lanes"]
    if is_bf16 and aligned and _lanes(layout, lanes, one_per_lane=True):
        return lanes, True
    return CONFIG["encode"], False


def _lanes(layout, cfg: dict, one_per_lane: bool = False) -> bool:
    """Whether an fp4 kernel may take its one-(row, block)-pair-per-lane layout: its blocks hold
    whole words (eight values) and the program has a pair for every lane (with fewer, Triton
    spreads a block over lanes that repeat each other: see indexer._whole_blocks_per_lane).
    The encode also needs bf16 rows on 16 bytes (a block in one lane's two vector loads) and
    exactly one pair per lane (``one_per_lane``): from float32 rows, rows Triton cannot load in
    vectors, or programs of four pairs a lane, it built programs that wrote wrong bytes on the
    H200 (Triton 3.6: blocks scaled by part of their maximum). The decode's two pairs a lane
    are checked byte for byte on the H200."""
    g = _geometry(layout)
    pairs, lanes = cfg["block_m"] * g["NB_P2"], 32 * cfg["num_warps"]
    return g["FP4"] and g["QB"] % 8 == 0 and (pairs == lanes if one_per_lane else pairs >= lanes)


def encode(layout, x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize ``x [N, head_dim]`` into the rows at ``slots [N]``; slots outside [0, capacity)
    are skipped (those >= capacity recorded: an empty cache still takes the launch)."""
    n = x.shape[0]
    if n == 0:
        return
    x, is_bf16 = cm.rows_input(x)
    u8, stride = cm.byte_cache(layout, cache)
    cfg, lanes = _encode_config(layout, is_bf16, (x.data_ptr() | cm.row_stride(x) * x.element_size()) % 16 == 0)
    words = cm.words_aligned(u8, stride, _geometry(layout))
    block_m, consts = _encode_plan(layout, is_bf16, tuple(cfg.items()), cm.hw_cvt(cfg), words, lanes)
    fast(jit.v41_encode_kernel)[(cm.grid_rows(n, block_m),)](
        x, slots, u8, cm.error_record(cache), n, cm.row_stride(x), slots.stride(0), cache.shape[0] * layout.page_size,
        stride, **consts)


@functools.lru_cache(maxsize=256)
def _decode_plan(layout, cfg_items: tuple, hw: bool, site: int):
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.decode_constants(jit.decode_body, _body_constants(layout, hw), layout.page_size, cfg,
                                               ROW=layout.head_dim, SITE=site)


def _decode_launch(layout, u8: torch.Tensor, stride: int, n: int, site: int):
    cfg = CONFIG["decode"]
    return (*_decode_plan(layout, tuple(cfg.items()), cm.hw_cvt(cfg), site), u8, 0)


def decode(layout, cache: torch.Tensor, slots: torch.Tensor, site: int = cm.SITES["decode"]) -> torch.Tensor:
    """bf16 ``[N, head_dim]`` rows at ``slots``; zero rows for invalid slots (those >= capacity
    recorded at ``site``). fp4 rows in word-aligned records take the one-pair-per-lane kernel."""
    n = slots.shape[0]
    cfg = CONFIG["decode"]
    if n > 0 and _lanes(layout, cfg):
        u8, stride = cm.byte_cache(layout, cache)
        if cm.words_aligned(u8, stride, _geometry(layout)):
            out = torch.empty((n, layout.head_dim), dtype=torch.int16, device=cache.device)
            block_m, consts = _lanes_decode_plan(layout, tuple(cfg.items()), cm.hw_cvt(cfg), site)
            fast(jit.fp4_decode_lanes_kernel)[(cm.grid_rows(n, block_m),)](
                u8, slots, out, cm.error_record(cache), n, slots.stride(0), cm.capacity(layout, cache), stride,
                **consts)
            return out.view(torch.bfloat16)
    return cm.decode_rows(layout, cache, slots, torch.int16, _decode_launch, site).view(torch.bfloat16)


@functools.lru_cache(maxsize=256)
def _lanes_decode_plan(layout, cfg_items: tuple, hw: bool, site: int):
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.frozen(dict(_geometry(layout), PAGE_SIZE=layout.page_size, BLOCK_M=cfg["block_m"],
                                          SITE=site, HW=hw, **cm.launch_opts(cfg)))


def _body_constants(layout, hw: bool) -> dict:
    """The decode body's constants: the row's geometry, the profile's reading of 0xFF, HW."""
    return dict(_geometry(layout), **cm.read_constants(layout), HW=hw)


@functools.lru_cache(maxsize=256)
def _paged_plan(layout, has_glen: bool, has_base: bool, cfg_items: tuple, hw: bool):
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.paged_constants(jit.decode_body, _body_constants(layout, hw), layout.page_size,
                                              has_glen, has_base, cfg)


def dequantize_gather(layout, cache, out, block_table, seq_lens, gather_lens, base, offset) -> None:
    """bf16 ``out [R, W, head_dim]``: see kvformats.codec.paged_ops.dequantize_gather (validated there)."""
    cm.dequantize_gather_bf16(layout, cache, out, block_table, seq_lens, gather_lens, base, offset, CONFIG["paged"],
                              _paged_plan)


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[T, K, head_dim]`` rows at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)


# launch settings change through settings.change
settings.guard(__name__, 'CONFIG')
