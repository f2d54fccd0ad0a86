"""Launchers of the DeepSeek V4.1 page formats (fp8_ds_mla_v41, fp4_ds_mla_v41): encode, decode,
dequantize_gather, decode_topk; gather and gather_paged are the shared byte copies (rows.py).

Which codec a launch takes is read off the layout's declaration (the element type of its data
region), not its name. Launch shapes are first guesses, not yet measured on a GPU.
"""

from __future__ import annotations

import functools

import torch

from kvformats_kernels import _common as cm
from kvformats_kernels import v41_jit as jit
from kvformats_kernels.launch import fast
from kvformats_kernels.rows import gather, gather_paged  # noqa: F401  (re-exported: the byte copies)

# Rows per program and warps, by op (decode: 2 warps, chosen by an H200 sweep of 2-16 rows per
# program and 2-8 warps); hw_cvt: the GPU's float8 / bf16 conversions (cm.hw_cvt).
CONFIG = {
    "encode": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
    "decode": {"block_m": 4, "num_warps": 2, "hw_cvt": 1},
    "paged": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
}


def _data_region(layout):
    """The layout's scaled data region (the one whose elements carry a block scale)."""
    return next(r for r in layout.regions if r.role == "data" and r.scale)


@cm.per_layout
def _geometry(layout) -> dict:
    data = _data_region(layout)
    val_off, val_stride, _ = cm.region(layout, data.name)
    scale_off, scale_stride, _ = cm.region(layout, data.scale)
    return dict(VAL_OFF=val_off, VAL_STRIDE=val_stride, SCALE_OFF=scale_off, SCALE_STRIDE=scale_stride,
                NB=layout.num_blocks, NB_P2=cm.next_pow2(layout.num_blocks), QB=data.block,
                FP4=data.dtype == "float4_e2m1fn_x2")


@cm.per_layout
def _rule_constants(layout) -> dict:
    rule = layout.scale_rule
    return dict(cm.rule_constants(rule), SCALE_MAX=cm.f32(getattr(rule, "scale_max", 0.0)))


@functools.lru_cache(maxsize=256)
def _encode_plan(layout, is_bf16: bool, cfg_items: tuple, hw: bool):
    """(rows per program, every constexpr and launch option of the encode): nothing here
    depends on a tensor's values or addresses."""
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.frozen(dict(_geometry(layout), PAGE_SIZE=layout.page_size, **_rule_constants(layout),
                                          IS_BF16=is_bf16, BLOCK_M=cfg["block_m"], SITE=cm.SITES["encode"], HW=hw,
                                          **cm.launch_opts(cfg)))


def encode(layout, x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize ``x [N, head_dim]`` into the rows at ``slots [N]``; slots outside [0, capacity)
    are skipped (those >= capacity recorded: an empty cache still takes the launch)."""
    n = x.shape[0]
    if n == 0:
        return
    x, is_bf16 = cm.rows_input(x)
    u8, stride = cm.byte_cache(layout, cache)
    cfg = CONFIG["encode"]
    block_m, consts = _encode_plan(layout, is_bf16, tuple(cfg.items()), cm.hw_cvt(cfg))
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
    recorded at ``site``)."""
    return cm.decode_rows(layout, cache, slots, torch.int16, _decode_launch, site).view(torch.bfloat16)


def _body_constants(layout, hw: bool) -> dict:
    """The decode body's constants: the row's geometry, the profile's reading of 0xFF, HW."""
    return dict(_geometry(layout), **cm.read_constants(layout), HW=hw)


@functools.lru_cache(maxsize=256)
def _paged_plan(layout, has_glen: bool, has_base: bool, cfg_items: tuple, hw: bool):
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.paged_constants(jit.decode_body, _body_constants(layout, hw), layout.page_size,
                                              has_glen, has_base, cfg)


def dequantize_gather(layout, cache, out, block_table, seq_lens, gather_lens, base, offset) -> None:
    """bf16 ``out [R, W, head_dim]``: see kvformats.paged.dequantize_gather (validated there)."""
    u8, stride = cm.byte_cache(layout, cache)
    cfg = CONFIG["paged"]
    block_m, consts = _paged_plan(layout, gather_lens is not None, base is not None, tuple(cfg.items()),
                                  cm.hw_cvt(cfg))
    cm.launch_paged(u8, stride, out.view(torch.int16), block_table, seq_lens, gather_lens, base, offset,
                    cache.shape[0], block_m, consts)


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[T, K, head_dim]`` rows at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)
