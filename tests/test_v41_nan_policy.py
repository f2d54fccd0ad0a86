"""spec/nan-policy.md §2 rows of the V4.1 formats, checked on the reference encoder: the bytes a
block holding NaN or ±Inf gets, including the declared NaN element byte (0x7F or 0xFF)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kvformats as kvf
from kvformats.numerics import codes as nx

POLICY = Path(__file__).resolve().parents[1] / "spec" / "nan-policy.md"
NAN, INF = float("nan"), float("inf")
E4M3_NAN_BYTES = {0x7F, 0xFF}  # the declared NaN element byte: either sign (nan-policy.md §2)


def encode(name: str, special: float, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row bytes with ``special`` at dim 3, row bytes of the same input with 0 there, the input)."""
    layout = kvf.get_format(name)
    x = torch.randn(1, layout.head_dim, generator=torch.Generator().manual_seed(5)) * 3
    clean = x.clone()
    clean[0, 3] = 0.0
    x[0, 3] = special
    return layout.encode_rows(x.to(dtype))[0], layout.encode_rows(clean.to(dtype))[0], x[0]


def test_policy_table_lists_the_v41_formats():
    section = POLICY.read_text().split("## 2.")[1].split("## 3.")[0]
    for name in ("fp8_ds_mla_v41", "fp4_ds_mla_v41"):
        assert f"| `{name}`" in section, name
    assert "`0x7F` or `0xFF`" in section


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("special", [NAN, -NAN, INF, -INF], ids=["nan", "-nan", "inf", "-inf"])
def test_fp8_v41_nonfinite_block(special, dtype):
    row, clean, x = encode("fp8_ds_mla_v41", special, dtype)
    values, scales = row[:512], row[512:]
    assert int(scales[0]) == 0xFF and torch.equal(scales[1:], clean[513:])  # E = 128; other blocks as without it
    if special != special:
        assert int(values[3]) in E4M3_NAN_BYTES
    else:
        assert int(values[3]) == (0x7E if special > 0 else 0xFE)
    # the finite elements at 2^-128: e4m3 zeros carrying their sign (|x| < 20 here)
    for i in [*range(3), *range(4, 32)]:
        assert int(values[i]) == (0x80 if x[i] < 0 else 0x00), i
    assert torch.equal(values[32:], clean[32:512])
    decoded = kvf.get_format("fp8_ds_mla_v41").decode_rows(row[None])[0, :32].float()
    assert bool(decoded.isnan().all())  # profile kvformats reads scale 0xFF as NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("special", [NAN, -NAN, INF, -INF], ids=["nan", "-nan", "inf", "-inf"])
def test_fp4_v41_nonfinite_block(special, dtype):
    layout = kvf.get_format("fp4_ds_mla_v41")
    row, clean, x = encode("fp4_ds_mla_v41", special, dtype)
    codes, scales = nx.unpack_nibbles(row[:256]), row[256:]
    assert torch.equal(scales[1:], clean[257:]) and torch.equal(row[8:256], clean[8:256])
    decoded = layout.decode_rows(row[None])[0, :16].float()
    if special != special:
        assert int(scales[0]) == 0x7F and codes[:16].tolist() == [0] * 16
        assert bool(decoded.isnan().all())
    else:
        assert int(scales[0]) == 0x7E  # 448, the scale's clamp
        assert int(codes[3]) == (0x7 if special > 0 else 0xF)
        others = torch.cat([x[:3], x[4:16]]).to(torch.bfloat16).float() / 448
        assert torch.cat([codes[:3], codes[4:16]]).tolist() == nx.e2m1_encode(others, "rne", True).tolist()
        assert decoded[3].item() == (2688.0 if special > 0 else -2688.0)  # the Inf is lost
        assert bool(decoded.isfinite().all())


def test_oracle_writes_0x7f_for_positive_nan():
    """The other declared byte: ml_dtypes (the oracle's casts) keeps a +NaN's sign."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np

    assert int(np.array([np.nan], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0]) == 0x7F
