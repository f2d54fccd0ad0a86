"""Launchers of nvfp4_ds_mla (352 B rows: e2m1 NoPE with permuted e4m3 scales, e4m3 RoPE):
encode, decode, dequantize_gather, decode_topk; gather and gather_paged are the shared byte
copies (rows.py).

The geometry comes from the layout's regions (geometry.row_geometry: the scaled NoPE, its scale,
the unscaled RoPE tail) and the scale permutation from ``layout.scale_order`` (checked against
the quarters rule the kernels compute, ``(s % QUADS) * COLS + s // QUADS``).
"""

from __future__ import annotations

import functools

import torch

from kvformats.errors import LayoutError
from kvformats.formats import Nvfp4DsMla
from kvformats_kernels import _common as cm
from kvformats_kernels import nvfp4_jit as jit
from kvformats_kernels import settings
from kvformats_kernels.geometry import row_geometry
from kvformats_kernels.launch import fast
from kvformats_kernels.rows import gather, gather_paged  # noqa: F401  (re-exported: the byte copies)

SERVES = (Nvfp4DsMla,)
ENCODES_PROFILES = True  # the format's one profile, flashmla, is what the encode computes

# Rows per program and warps, by op (not swept on a GPU yet: the V4.1 fp4 kernels' shapes).
CONFIG = settings.declare("nvfp4", {
    "encode": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
    "decode": {"block_m": 4, "num_warps": 2, "hw_cvt": 1},
    "paged": {"block_m": 4, "num_warps": 4, "hw_cvt": 1},
})


@cm.per_layout
def _geometry(layout) -> dict:
    """The row's constexprs: NoPE nibbles, RoPE bytes and permuted scales, read off the layout."""
    g = row_geometry(layout)
    if not (g.fp4 and g.has_tail and g.tail.dtype == "float8_e4m3fn" and g.scale.dtype == "float8_e4m3fn"):
        raise LayoutError(f"the nvfp4 kernels take e2m1 data with e4m3 scales and an e4m3 tail; {layout.name} "
                          f"declares {g.data.dtype}, {g.scale.dtype}, {g.tail.dtype}")
    quads = layout.SCALE_QUADS
    cols = g.blocks // quads
    order = layout.scale_order(next(r.scale for r in layout.data_regions if r.scale))
    if g.blocks % quads or order != tuple((s % quads) * cols + s // quads for s in range(g.blocks)):
        raise LayoutError(f"{layout.name}: the scale order {order} is not the quarters permutation the kernels "
                          f"compute ({quads} quarters of {cols})")
    return dict(NOPE_OFF=g.data.offset, NOPE_STRIDE=g.data.stride, ROPE_OFF=g.tail.offset, ROPE_STRIDE=g.tail.stride,
                SCALE_OFF=g.scale.offset, SCALE_STRIDE=g.scale.stride, NOPE=g.data.count, NB=g.blocks,
                NB_P2=cm.next_pow2(g.blocks), QB=g.block, QUADS=quads, COLS=cols, ROPE=g.tail.count,
                ROPE_P2=cm.next_pow2(g.tail.count))


@functools.lru_cache(maxsize=256)
def _encode_plan(layout, is_bf16: bool, cfg_items: tuple, hw: bool):
    """(rows per program, every constexpr and launch option of the encode): nothing here
    depends on a tensor's values."""
    cfg = dict(cfg_items)
    rule = layout.scale_rule
    return cfg["block_m"], cm.frozen(dict(_geometry(layout), PAGE_SIZE=layout.page_size, FLOOR=cm.f32(rule.floor),
                                          ELEM_MAX=cm.f32(rule.element_max), IS_BF16=is_bf16,
                                          BLOCK_M=cfg["block_m"], SITE=cm.SITES["encode"], HW=hw,
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
    fast(jit.nvfp4_encode_kernel)[(cm.grid_rows(n, block_m),)](
        x, slots, u8, cm.error_record(cache), n, cm.row_stride(x), slots.stride(0), cm.capacity(layout, cache),
        stride, **consts)


def _body_constants(layout, hw: bool) -> dict:
    return dict(_geometry(layout), HW=hw)


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
