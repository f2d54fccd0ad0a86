"""fp8_ds_mla launchers (also the V3.2 656 B rows, fp8_ds_mla_v32): encode, decode, gather, and
the paged dequantize_gather / decode_topk (registered as the "triton" backend)."""

from __future__ import annotations

import functools

import torch

from kvformats.formats import Fp8DsMla, Fp8DsMlaV32
from kvformats_kernels import _common as cm
from kvformats_kernels import fp8_ds_mla_jit as jit
from kvformats_kernels import tuning
from kvformats_kernels.geometry import nope_rope_constants, row_geometry
from kvformats_kernels.launch import fast
from kvformats_kernels.rows import gather, gather_paged  # noqa: F401  (re-exported: the byte copies)

NAME = tuning.module_name(__name__)  # this module's name in the tuning tables (kvformats_kernels.tuning)

# The V3.2 656 B rows take the same kernels, with float32 scales (SCALE_F32); the encode's
# constexprs implement every numerics profile of both.
SERVES = (Fp8DsMla, Fp8DsMlaV32)
ENCODES_PROFILES = True


@cm.per_layout
def _geometry(layout) -> dict:
    """The row's constexprs (geometry.nope_rope_constants), its RoPE tail's length and whether
    its scales are float32 multipliers (the V3.2 rows) rather than ue8m0 bytes."""
    g = row_geometry(layout)
    return dict(nope_rope_constants(layout), ROPE=g.tail.count, SCALE_F32=g.scale.dtype == "float32")


def _rope_alias(layout, u8: torch.Tensor, stride: int) -> tuple[torch.Tensor, int, bool]:
    """An int16 alias of the cache for the RoPE tail (or the bytes), the page stride in int16
    words, and whether the tail is read as int16 words (every address even, a cache with pages)."""
    tail = row_geometry(layout).tail
    if u8.shape[0] > 0 and (u8.data_ptr() | stride | tail.offset | tail.stride) % 2 == 0:
        span = (u8.shape[0] - 1) * stride + layout.min_page_bytes
        span -= span % 2  # an odd row size makes the span odd; the last RoPE byte still ends at or before it
        return u8.as_strided((span,), (1,), u8.storage_offset()).view(torch.int16), stride // 2, True
    return u8, 0, False


@cm.per_layout
def _decode_constants(layout, rope16: bool) -> dict:
    """The decode body's constants, with ROPE16 (the tail read as int16 words) and the
    profile's reading of scale byte 0xFF (FF_NAN)."""
    geo = dict(_geometry(layout))
    if geo["ROPE"] == geo["QB"]:  # one [NB + 1, QB] tile per row (decode_body)
        geo["NB_P2"] = cm.next_pow2(layout.num_blocks + 1)
    geo.update(ROPE_P2=cm.next_pow2(layout.rope_dim), ROPE16=rope16, **cm.read_constants(layout))
    return geo


@cm.per_layout
def _encode_constants(layout) -> dict:
    """Every layout constexpr of the encode kernel: geometry, page size, numerics profile."""
    return dict(_geometry(layout), PAGE_SIZE=layout.page_size, ROPE_P2=cm.next_pow2(layout.rope_dim),
                **cm.rule_constants(layout.scale_rule), **cm.profile_constants(layout),
                POW2=layout.scale_rule.power_of_two, **cm.short_exponent(layout.scale_rule))


@functools.lru_cache(maxsize=512)
def _encode_plan(layout, is_bf16: bool, cfg_items: tuple, hw: bool):
    """(rows per program, every constexpr and launch option of the encode) for a layout, an
    input dtype, a launch config (its items: an overridden config is another key) and the
    conversion choice; nothing here depends on a tensor's values or addresses."""
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.frozen(dict(
        _encode_constants(layout), IS_BF16=is_bf16, EXP_FLAT=bool(cfg.get("flat", 0)), BLOCK_M=cfg["block_m"],
        SITE=cm.SITES["encode"], HW=hw, **cm.launch_opts(cfg)))


def encode(layout, x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize ``x [N, head_dim]`` (bf16/fp16/fp32) into the rows at ``slots [N]``; slots
    outside [0, capacity) are skipped (those >= capacity recorded: an empty cache still takes
    the launch, so that its slots are checked)."""
    n = x.shape[0]
    if n == 0:
        return
    x, is_bf16 = cm.rows_input(x)
    u8, stride = cm.byte_cache(layout, cache)
    cfg = cm.config(NAME, "encode", n)
    block_m, consts = _encode_plan(layout, is_bf16, tuple(cfg.items()), cm.hw_cvt(cfg))
    fast(jit.encode_kernel)[(cm.grid_rows(n, block_m),)](
        x, slots, u8, cm.error_record(cache), n, cm.row_stride(x), slots.stride(0), cache.shape[0] * layout.page_size,
        stride, **consts)


@functools.lru_cache(maxsize=512)
def _decode_plan(layout, rope16: bool, cfg_items: tuple, hw: bool, site: int):
    """(rows per program, the slot decode's constexprs and launch options); as _encode_plan."""
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.decode_constants(jit.decode_body, dict(_decode_constants(layout, rope16), HW=hw),
                                               layout.page_size, cfg, ROW=layout.head_dim, SITE=site)


def _decode_launch(layout, u8: torch.Tensor, stride: int, n: int, site: int):
    alias, stride16, rope16 = _rope_alias(layout, u8, stride)
    cfg = cm.config(NAME, "decode", n)
    return (*_decode_plan(layout, rope16, tuple(cfg.items()), cm.hw_cvt(cfg), site), alias, stride16)


def decode(layout, cache: torch.Tensor, slots: torch.Tensor, site: int = cm.SITES["decode"]) -> torch.Tensor:
    """bf16 ``[N, head_dim]`` rows at ``slots``; zero rows for invalid slots (those >= capacity
    recorded at ``site``)."""
    return cm.decode_rows(layout, cache, slots, torch.int16, _decode_launch, site).view(torch.bfloat16)


@functools.lru_cache(maxsize=512)
def _paged_plan(layout, rope16: bool, has_glen: bool, has_base: bool, cfg_items: tuple, hw: bool):
    """(rows per program, dequantize_gather's constexprs and launch options); as _encode_plan."""
    cfg = dict(cfg_items)
    return cfg["block_m"], cm.paged_constants(jit.decode_body, dict(_decode_constants(layout, rope16), HW=hw),
                                              layout.page_size, has_glen, has_base, cfg)


def dequantize_gather(layout, cache, out, block_table, seq_lens, gather_lens, base, offset) -> None:
    """bf16 ``out [R, W, head_dim]``: see kvformats.codec.paged_ops.dequantize_gather (validated there)."""
    u8, stride = cm.byte_cache(layout, cache)
    alias, stride16, rope16 = _rope_alias(layout, u8, stride)
    cfg = cm.config(NAME, "dequantize_gather")
    block_m, consts = _paged_plan(layout, rope16, gather_lens is not None, base is not None, tuple(cfg.items()),
                                  cm.hw_cvt(cfg))
    cm.launch_paged(u8, stride, out.view(torch.int16), block_table, seq_lens, gather_lens, base, offset,
                    cache.shape[0], block_m, consts, aux=(alias, stride16))


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[T, K, head_dim]`` rows at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)
