"""The ue8m0 0xFF readings of each (format, profile) and their oracles, shared by the reference
tests (test_ue8m0_ff.py) and the kernel tests (kernels/test_ue8m0_ff_kernels.py).

The oracles share no code with kvformats: ml_dtypes for the element and scale types, numpy
float32 arithmetic on Python's ``2.0 ** (b - 127)``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

READING = {  # (format, profile) -> how 0xFF reads
    ("fp8_ds_mla", "tokenspeed"): "inf", ("fp8_ds_mla", "vllm"): "nan", ("fp8_ds_mla", "flashmla-ref"): "nan",
    ("mxfp4_indexer", "tokenspeed"): "inf", ("mxfp4_indexer", "vllm"): "nan",
    ("mxfp4_indexer", "deepgemm-ref"): "nan", ("mxfp4_indexer", "ocp"): "nan",
}
CASES = sorted(READING)


def oracle_scales(s: np.ndarray, reading: str) -> np.ndarray:
    """float32 scales of ue8m0 bytes ``s``: ml_dtypes' float8_e8m0fnu (0xFF NaN), or Python's
    exact 2.0 ** (b - 127) rounded to float32 (2^128 overflows to +Inf)."""
    s = np.asarray(s, dtype=np.uint8)
    if reading == "nan":
        return s.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    with np.errstate(over="ignore"):
        return np.array([2.0 ** (int(b) - 127) for b in s.reshape(-1)], dtype=np.float64).astype(
            np.float32).reshape(s.shape)


def oracle_fp8_ds_mla(layout, row: np.ndarray, reading: str) -> np.ndarray:
    """float32 values of the bf16 decode of one fp8_ds_mla row (NoPE then RoPE)."""
    nope, nb = layout.nope_dim, layout.num_blocks
    token = nope + 2 * layout.rope_dim
    codes = row[:nope].view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(nb, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        values = codes * oracle_scales(row[token:token + nb], reading)[:, None]  # float32 products
    values = values.reshape(-1).astype(ml_dtypes.bfloat16).astype(np.float32)
    rope = row[nope:token].copy().view(ml_dtypes.bfloat16).astype(np.float32)
    return np.concatenate([values, rope])


def oracle_mxfp4(layout, row: np.ndarray, reading: str) -> np.ndarray:
    d = layout.head_dim
    packed = row[:d // 2]
    nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(-1)  # element 2k in the low nibble
    values = nib.view(ml_dtypes.float4_e2m1fn).astype(np.float32).reshape(layout.num_blocks, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        return (values * oracle_scales(row[d // 2:], reading)[:, None]).reshape(-1)


ORACLES = {"fp8_ds_mla": oracle_fp8_ds_mla, "mxfp4_indexer": oracle_mxfp4}


def assert_reads(got: torch.Tensor, want: np.ndarray) -> None:
    """NaN at the same positions; every other value equal bit for bit (±Inf and ±0 included)."""
    got = got.float().cpu().numpy()
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_got, nan_want), f"NaN at {np.flatnonzero(nan_got != nan_want)[:8]}"
    assert np.array_equal(got[~nan_got].view(np.uint32), want[~nan_want].view(np.uint32))


def ff_rows(layout, seed: int) -> torch.Tensor:
    """Rows whose element bytes cover every code (e4m3 NaN bytes and both zeros included) and
    whose scale bytes are 0xFF, 0x00, 0xFE and ordinary ones, 0xFF in every block of row 0."""
    g = torch.Generator().manual_seed(seed)
    n = 6
    rows = torch.randint(0, 256, (n, layout.row_bytes), generator=g, dtype=torch.uint8)
    if layout.name == "fp8_ds_mla":
        nope, nb = layout.nope_dim, layout.num_blocks
        token = nope + 2 * layout.rope_dim
        rows[:, :nope] = (torch.arange(nope) * 7 + torch.arange(n)[:, None] * 3).remainder(256).to(torch.uint8)
        scale_at = token
    else:
        nb = layout.num_blocks
        scale_at = layout.head_dim // 2
        rows[:, :scale_at] = (torch.arange(scale_at) * 5 + torch.arange(n)[:, None]).remainder(256).to(torch.uint8)
    specials = torch.tensor([0xFF, 0x00, 0xFE, 0x7F, 0x01, 0xFF], dtype=torch.uint8)
    rows[:, scale_at:scale_at + nb] = specials[(torch.arange(nb) + torch.arange(n)[:, None]) % 6]
    rows[0, scale_at:scale_at + nb] = 0xFF
    return rows
