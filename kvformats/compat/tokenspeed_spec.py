"""tokenspeed's DeepSeek V4 cache-geometry helpers and constants, under tokenspeed's names.

The names ``deepseek_v4_ops.py`` imports from tokenspeed's cache spec at f3e4d1e2
(``python/tokenspeed/runtime/configs/deepseek_v4_cache_spec.py``; signatures in
``spec/tokenspeed-signatures.json``, facts in ``spec/upstream.md`` §1). Same arguments and
results; a geometry tokenspeed refuses raises :class:`kvformats.LayoutError` (a ``ValueError``,
as there) instead of a bare ``ValueError``.
"""

from __future__ import annotations

from kvformats.errors import LayoutError

__all__ = [
    "DEEPSEEK_V4_FP8_MAX", "DEEPSEEK_V4_FP8_QUANT_BLOCK", "DEEPSEEK_V4_MXFP4_BLOCK_SIZE",
    "deepseek_v4_indexer_fp8_layout_from_row_bytes", "deepseek_v4_indexer_fp8_row_bytes",
    "deepseek_v4_indexer_fp8_scale_bytes", "deepseek_v4_indexer_mxfp4_layout_from_row_bytes",
    "deepseek_v4_indexer_mxfp4_row_bytes", "deepseek_v4_nope_dim", "deepseek_v4_swa_row_bytes",
    "deepseek_v4_swa_scale_dim", "deepseek_v4_swa_token_stride",
]

DEEPSEEK_V4_FP8_MAX = 448.0  # largest finite e4m3fn value
DEEPSEEK_V4_FP8_QUANT_BLOCK = 64  # fp8_ds_mla: NoPE values per ue8m0 scale byte
DEEPSEEK_V4_MXFP4_BLOCK_SIZE = 32  # MXFP4 indexer: values per ue8m0 scale byte
# not imported by deepseek_v4_ops.py, but what its helpers are made of
DEEPSEEK_V4_FP8_INDEXER_BLOCK_SIZE = 128  # FP8 indexer: values per fp32 scale
DEEPSEEK_V4_FP8_SCALE_BYTES = 4
DEEPSEEK_V4_MXFP4_SCALE_BYTES = 1


def deepseek_v4_nope_dim(head_dim: int, rope_dim: int) -> int:
    """The NoPE dims of an fp8_ds_mla row: ``head_dim - rope_dim`` (must be positive)."""
    nope = int(head_dim) - int(rope_dim)
    if nope <= 0:
        raise LayoutError(f"head_dim {head_dim} must exceed rope_dim {rope_dim}")
    return nope


def deepseek_v4_swa_token_stride(head_dim: int, rope_dim: int) -> int:
    """Data bytes of an fp8_ds_mla row: one fp8 byte per NoPE dim, two per bf16 RoPE dim."""
    return deepseek_v4_nope_dim(head_dim, rope_dim) + 2 * int(rope_dim)


def deepseek_v4_swa_scale_dim(head_dim: int, rope_dim: int) -> int:
    """Scale bytes of an fp8_ds_mla row: one per 64 NoPE dims, plus one pad byte."""
    nope = deepseek_v4_nope_dim(head_dim, rope_dim)
    if nope % DEEPSEEK_V4_FP8_QUANT_BLOCK:
        raise LayoutError(f"the NoPE dims ({nope}) must be a multiple of {DEEPSEEK_V4_FP8_QUANT_BLOCK}")
    return nope // DEEPSEEK_V4_FP8_QUANT_BLOCK + 1


def deepseek_v4_swa_row_bytes(head_dim: int, rope_dim: int) -> int:
    """Bytes of one fp8_ds_mla row: data plus scales (584 for DeepSeek V4)."""
    return deepseek_v4_swa_token_stride(head_dim, rope_dim) + deepseek_v4_swa_scale_dim(head_dim, rope_dim)


def _mxfp4_value_bytes(index_head_dim: int) -> int:
    d = int(index_head_dim)
    if d % 2:
        raise LayoutError(f"an MXFP4 indexer head dim must be even, got {d}")
    return d // 2


def _mxfp4_scale_bytes(index_head_dim: int) -> int:
    d = int(index_head_dim)
    if d % DEEPSEEK_V4_MXFP4_BLOCK_SIZE:
        raise LayoutError(f"an MXFP4 indexer head dim must be a multiple of {DEEPSEEK_V4_MXFP4_BLOCK_SIZE}, got {d}")
    return d // DEEPSEEK_V4_MXFP4_BLOCK_SIZE * DEEPSEEK_V4_MXFP4_SCALE_BYTES


def deepseek_v4_indexer_mxfp4_row_bytes(index_head_dim: int) -> int:
    """Bytes of one MXFP4 indexer row: ``d / 2`` nibble bytes and ``d / 32`` scale bytes (68)."""
    return _mxfp4_value_bytes(index_head_dim) + _mxfp4_scale_bytes(index_head_dim)


def deepseek_v4_indexer_mxfp4_layout_from_row_bytes(row_bytes: int) -> tuple[int, int, int]:
    """``(index_head_dim, value_bytes, scale_bytes)`` of an MXFP4 indexer row of ``row_bytes``."""
    row_bytes = int(row_bytes)
    per_block = DEEPSEEK_V4_MXFP4_BLOCK_SIZE // 2 + DEEPSEEK_V4_MXFP4_SCALE_BYTES  # 17 bytes per 32 values
    if row_bytes % per_block:
        raise LayoutError(f"an MXFP4 indexer row is a multiple of {per_block} bytes, got {row_bytes}")
    blocks = row_bytes // per_block
    return (blocks * DEEPSEEK_V4_MXFP4_BLOCK_SIZE, blocks * (DEEPSEEK_V4_MXFP4_BLOCK_SIZE // 2),
            blocks * DEEPSEEK_V4_MXFP4_SCALE_BYTES)


def deepseek_v4_indexer_fp8_scale_bytes(index_head_dim: int) -> int:
    """Scale bytes of one FP8 indexer row: 4 (one fp32) per 128 dims."""
    d = int(index_head_dim)
    if d % DEEPSEEK_V4_FP8_INDEXER_BLOCK_SIZE:
        raise LayoutError(f"an FP8 indexer head dim must be a multiple of {DEEPSEEK_V4_FP8_INDEXER_BLOCK_SIZE}, "
                          f"got {d}")
    return d // DEEPSEEK_V4_FP8_INDEXER_BLOCK_SIZE * DEEPSEEK_V4_FP8_SCALE_BYTES


def deepseek_v4_indexer_fp8_row_bytes(index_head_dim: int) -> int:
    """Bytes of one FP8 indexer row: ``d`` fp8 bytes and the scale bytes (132)."""
    return int(index_head_dim) + deepseek_v4_indexer_fp8_scale_bytes(index_head_dim)


def deepseek_v4_indexer_fp8_layout_from_row_bytes(row_bytes: int) -> tuple[int, int]:
    """``(index_head_dim, scale_bytes)`` of an FP8 indexer row of ``row_bytes``."""
    row_bytes = int(row_bytes)
    per_block = DEEPSEEK_V4_FP8_INDEXER_BLOCK_SIZE + DEEPSEEK_V4_FP8_SCALE_BYTES  # 132 bytes per 128 values
    if row_bytes % per_block:
        raise LayoutError(f"an FP8 indexer row is a multiple of {per_block} bytes, got {row_bytes}")
    d = row_bytes // per_block * DEEPSEEK_V4_FP8_INDEXER_BLOCK_SIZE
    return d, deepseek_v4_indexer_fp8_scale_bytes(d)
