"""fp8_ds_mla launchers (also the V3.2 656 B rows, fp8_ds_mla_v32): encode, decode, gather, and
the paged dequantize_gather / decode_topk (registered as the "triton" backend)."""

from __future__ import annotations

import torch

from kvformats_kernels import _common as cm
from kvformats_kernels import fp8_ds_mla_jit as jit
from kvformats_kernels.rows import gather, gather_paged  # noqa: F401  (re-exported: the byte copies)


@cm.per_layout
def _geometry(layout) -> dict:
    nope_off, nope_stride, _ = cm.region(layout, "nope")
    rope_off, rope_stride, _ = cm.region(layout, "rope")
    scale_off, scale_stride, _ = cm.region(layout, "scale")
    qb = layout.nope_dim // layout.num_blocks  # NoPE quantization block (64)
    return dict(PAGE_SIZE=layout.page_size, NOPE_OFF=nope_off, NOPE_STRIDE=nope_stride,
                ROPE_OFF=rope_off, ROPE_STRIDE=rope_stride, SCALE_OFF=scale_off, SCALE_STRIDE=scale_stride,
                NB=layout.num_blocks, NB_P2=cm.next_pow2(layout.num_blocks), QB=qb, ROPE=layout.rope_dim,
                SCALE_F32=layout.name == "fp8_ds_mla_v32")


def _decode_geometry(layout, u8: torch.Tensor, stride: int) -> tuple[dict, torch.Tensor, int]:
    """Decode constants, an int16 alias of the cache for the RoPE tail (or the bytes), and the
    page stride in int16 words. The tail is read as int16 words when every address is even."""
    geo = dict(_geometry(layout))
    if geo["ROPE"] == geo["QB"]:  # one [NB + 1, QB] tile per row (decode_body)
        geo["NB_P2"] = cm.next_pow2(layout.num_blocks + 1)
    even = all(v % 2 == 0 for v in (u8.data_ptr(), stride, geo["ROPE_OFF"], geo["ROPE_STRIDE"]))
    rope16, stride16 = u8, 0
    if even and u8.shape[0] > 0:
        span = (u8.shape[0] - 1) * stride + layout.min_page_bytes
        span -= span % 2  # an odd row size makes the span odd; the last RoPE byte still ends at or before it
        rope16, stride16 = u8.as_strided((span,), (1,), u8.storage_offset()).view(torch.int16), stride // 2
    geo.update(ROPE_P2=cm.next_pow2(layout.rope_dim), ROPE16=bool(even and u8.shape[0] > 0))
    return geo, rope16, stride16


@cm.per_layout
def _encode_constants(layout) -> dict:
    """Every layout constexpr of the encode kernel: geometry, scale pad, numerics profile."""
    has_pad = any(r.name == "scale_pad" for r in layout.regions)
    pad_off, pad_stride, pad_bytes = cm.region(layout, "scale_pad") if has_pad else (0, 0, 0)
    return dict(_geometry(layout), PAD_OFF=pad_off, PAD_STRIDE=pad_stride, PAD_BYTES=pad_bytes,
                PAD_P2=cm.next_pow2(pad_bytes), ROPE_P2=cm.next_pow2(layout.rope_dim),
                **cm.rule_constants(layout.scale_rule), **cm.profile_constants(layout),
                POW2=layout.scale_rule.power_of_two, **cm.short_exponent(layout.scale_rule))


def encode(layout, x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize ``x [N, head_dim]`` (bf16/fp16/fp32) into the rows at ``slots [N]``; slots
    outside [0, capacity) are skipped (those >= capacity recorded: an empty cache still takes
    the launch, so that its slots are checked)."""
    n = x.shape[0]
    if n == 0:
        return
    x, is_bf16 = cm.rows_input(x)
    u8, stride = cm.byte_cache(layout, cache)
    cfg = cm.config("fp8_ds_mla", "encode", n)
    jit.encode_kernel[(cm.grid_rows(n, cfg["block_m"]),)](
        x, slots, u8, cm.error_record(cache), n, cm.row_stride(x), slots.stride(0), cm.capacity(layout, cache),
        stride, **_encode_constants(layout), IS_BF16=is_bf16, EXP_FLAT=bool(cfg.get("flat", 0)),
        BLOCK_M=cfg["block_m"], SITE=cm.SITES["encode"], HW=cm.hw_cvt(cfg), **cm.launch_opts(cfg))


def decode(layout, cache: torch.Tensor, slots: torch.Tensor, site: int = cm.SITES["decode"]) -> torch.Tensor:
    """bf16 ``[N, head_dim]`` rows at ``slots``; zero rows for invalid slots (those >= capacity
    recorded at ``site``)."""
    n = slots.shape[0]
    out = torch.empty((n, layout.head_dim), dtype=torch.int16, device=cache.device)
    if n > 0:
        u8, stride = cm.byte_cache(layout, cache)
        geo, rope16, stride16 = _decode_geometry(layout, u8, stride)
        cfg = cm.config("fp8_ds_mla", "decode", n)
        jit.decode_kernel[(cm.grid_rows(n, cfg["block_m"]),)](
            u8, rope16, slots, out, cm.error_record(cache), n, slots.stride(0), cm.capacity(layout, cache), stride,
            stride16, **geo, HEAD_DIM=layout.head_dim, BLOCK_M=cfg["block_m"], SITE=site, HW=cm.hw_cvt(cfg),
            **cm.launch_opts(cfg))
    return out.view(torch.bfloat16)


def dequantize_gather(layout, cache, out, block_table, seq_lens, gather_lens, base, offset) -> None:
    """bf16 ``out [R, W, head_dim]``: see kvformats.paged.dequantize_gather (validated there)."""
    u8, stride = cm.byte_cache(layout, cache)
    geo, rope16, stride16 = _decode_geometry(layout, u8, stride)
    cfg = cm.config("fp8_ds_mla", "paged")
    cm.launch_paged(jit.paged_decode_kernel, (u8, rope16), out.view(torch.int16), block_table, seq_lens,
                    gather_lens, base, offset, cache.shape[0], (stride, stride16), dict(geo, HW=cm.hw_cvt(cfg)), cfg)


def decode_topk(layout, cache: torch.Tensor, topk_slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[T, K, head_dim]`` rows at ``topk_slots [T, K]``; zero rows for −1 holes."""
    return cm.topk(decode, layout, cache, topk_slots)
