"""fp8_ds_mla launchers: encode, decode, gather (registered as the "triton" backend)."""

from __future__ import annotations

import torch

from kvformats_kernels import _common as cm
from kvformats_kernels import fp8_ds_mla_jit as jit
from kvformats_kernels.rows import gather  # noqa: F401  (re-exported: the generic byte gather)


def _geometry(layout) -> dict:
    nope_off, nope_stride, _ = cm.region(layout, "nope")
    rope_off, rope_stride, _ = cm.region(layout, "rope")
    scale_off, scale_stride, _ = cm.region(layout, "scale")
    qb = layout.nope_dim // layout.num_blocks  # NoPE quantization block (64)
    return dict(PAGE_SIZE=layout.page_size, NOPE_OFF=nope_off, NOPE_STRIDE=nope_stride,
                ROPE_OFF=rope_off, ROPE_STRIDE=rope_stride, SCALE_OFF=scale_off, SCALE_STRIDE=scale_stride,
                NB=layout.num_blocks, NB_P2=cm.next_pow2(layout.num_blocks), QB=qb, ROPE=layout.rope_dim)


def encode(layout, x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize ``x [N, head_dim]`` (bf16/fp16/fp32) into the rows at ``slots [N]``; slots
    outside [0, capacity) are skipped."""
    n = x.shape[0]
    if n == 0 or cache.shape[0] == 0:
        return
    x, is_bf16 = cm.rows_input(x)
    u8, stride = cm.byte_cache(layout, cache)
    pad_off, pad_stride, pad_bytes = cm.region(layout, "scale_pad")
    cfg = cm.config("fp8_ds_mla", "encode")
    jit.encode_kernel[(cm.grid_rows(n, cfg["block_m"]),)](
        x, slots, u8, n, cm.row_stride(x), slots.stride(0), cm.capacity(layout, cache), stride,
        **_geometry(layout), PAD_OFF=pad_off, PAD_STRIDE=pad_stride, PAD_BYTES=pad_bytes,
        PAD_P2=cm.next_pow2(pad_bytes), ROPE_P2=cm.next_pow2(layout.rope_dim),
        **cm.rule_constants(layout.scale_rule),
        IS_BF16=is_bf16, BLOCK_M=cfg["block_m"], num_warps=cfg["num_warps"])


def decode(layout, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """bf16 ``[N, head_dim]`` rows at ``slots``; zero rows for invalid slots."""
    n = slots.shape[0]
    out = torch.empty((n, layout.head_dim), dtype=torch.int16, device=cache.device)
    if n > 0:
        u8, stride = cm.byte_cache(layout, cache)
        cfg = cm.config("fp8_ds_mla", "decode")
        jit.decode_kernel[(cm.grid_rows(n, cfg["block_m"]),)](
            u8, slots, out, n, slots.stride(0), cm.capacity(layout, cache), stride,
            **_geometry(layout), ROPE_P2=cm.next_pow2(layout.rope_dim), HEAD_DIM=layout.head_dim,
            BLOCK_M=cfg["block_m"], num_warps=cfg["num_warps"])
    return out.view(torch.bfloat16)
