"""How decode reads a ue8m0 scale byte 0xFF, per numerics profile (spec/nan-policy.md §4,
spec/profiles.md): tokenspeed reads it as its readers compute it, 2^(255 - 127) in float32 =
+Inf, so non-zero codes decode to ±Inf with the code's sign and zero codes to NaN (0 * Inf);
the other profiles read float8_e8m0fnu's NaN, every element NaN.

The expected values come from oracles that share no code with kvformats (ue8m0_ff_oracle.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import kvformats as kvf
from kvformats.codec.rows import write_rows
from kvformats.errors import InputError
from kvformats.numerics import codes as nx
from kvformats.spec.formats import format_spec
from ue8m0_ff_oracle import CASES, ORACLES, READING, assert_reads, ff_rows, oracle_mxfp4, oracle_scales

def test_profiles_declare_the_reading():
    for (fmt, profile), reading in READING.items():
        assert kvf.get_format(fmt, profile=profile).numerics.ue8m0_ff == reading
    assert kvf.Fp8DsMla().numerics.ue8m0_ff == "inf"  # the default profile is tokenspeed
    spec = format_spec(kvf.Mxfp4Indexer(profile="ocp"))["numerics"]["profile"]
    assert spec["ue8m0_ff"] == "nan"
    assert format_spec(kvf.Mxfp4Indexer())["numerics"]["profile"]["ue8m0_ff"] == "inf"


@pytest.mark.parametrize("reading", ["nan", "inf"])
def test_ue8m0_decode_every_byte(reading):
    s = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = nx.ue8m0_decode(s, reading).numpy()
    want = oracle_scales(s.numpy(), reading)
    assert_reads(torch.from_numpy(got), want)
    assert np.isposinf(got[255]) if reading == "inf" else np.isnan(got[255])
    assert got[0] == 2.0 ** -127 and got[0] > 0  # the float32 subnormal, exactly, in both readings


def test_ue8m0_decode_refuses_other_readings():
    with pytest.raises(InputError, match="ff must be one of"):
        nx.ue8m0_decode(torch.zeros(2, dtype=torch.uint8), "zero")


@pytest.mark.parametrize("fmt,profile", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_reference_decode_reads_ff_as_the_profile_says(fmt, profile):
    layout = kvf.get_format(fmt, page_size=4, profile=profile)
    if fmt == "fp8_ds_mla":
        layout = kvf.get_format(fmt, head_dim=320, rope_dim=64, page_size=4, profile=profile)
    reading = READING[(fmt, profile)]
    rows = ff_rows(layout, seed=len(profile))
    got = layout.decode_rows(rows)
    for i in range(rows.shape[0]):
        assert_reads(got[i], ORACLES[fmt](layout, rows[i].numpy(), reading))
    # row 0: every scale byte 0xFF. NaN everywhere ("nan"), or ±Inf with the code's sign and NaN
    # for zero codes (and e4m3 NaN codes) ("inf")
    n_values = layout.nope_dim if fmt == "fp8_ds_mla" else layout.head_dim
    block = got[0, :n_values].float()
    if reading == "nan":
        assert bool(torch.isnan(block).all())
    else:
        if fmt == "fp8_ds_mla":
            codes = rows[0, :n_values].to(torch.int32)
            zero, nan_code, neg = (codes & 0x7F) == 0, (codes & 0x7F) == 0x7F, (codes & 0x80) != 0
        else:
            nib = nx.unpack_nibbles(rows[0, :layout.head_dim // 2]).to(torch.int32)
            zero, nan_code, neg = (nib & 7) == 0, torch.zeros_like(nib, dtype=torch.bool), (nib & 8) != 0
        assert torch.equal(torch.isnan(block), zero | nan_code)
        inf = ~(zero | nan_code)
        assert bool(torch.isinf(block[inf]).all()) and torch.equal(block[inf] < 0, neg[inf])


@pytest.mark.parametrize("profile", ["tokenspeed", "vllm"])
def test_public_reads_follow_the_profile(profile):
    """decode, decode_topk and dequantize_gather (reference backend) read 0xFF alike."""
    layout = kvf.get_format("mxfp4_indexer", head_dim=64, page_size=2, profile=profile)
    cache = layout.allocate(2)
    rows = ff_rows(layout, seed=3)[:4]
    write_rows(layout, cache, torch.arange(4), rows)
    want = np.stack([oracle_mxfp4(layout, r.numpy(), READING[("mxfp4_indexer", profile)]) for r in rows])
    assert_reads(layout.decode(cache, torch.arange(4), backend="reference"), want)
    topk = layout.decode_topk(cache, torch.tensor([[3, 0], [1, 2]]), backend="reference")
    assert_reads(topk, want[[3, 0, 1, 2]].reshape(2, 2, -1))
    out = torch.zeros(1, 4, layout.head_dim)
    layout.dequantize_gather(cache, out, block_table=torch.tensor([[0, 1]]), seq_lens=torch.tensor([4]),
                             backend="reference")
    assert_reads(out[0], want)


def test_fp8_ds_mla_scale_byte_zero_is_exact():
    """Scale byte 0x00 is 2^-127 (a float32 subnormal) times the code, exactly, then bf16: the
    reading of tokenspeed's torch reader (its Triton gather flushes it to 0: spec/nan-policy.md §5)."""
    layout = kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=1)
    row = torch.zeros(1, layout.row_bytes, dtype=torch.uint8)
    row[0, :3] = torch.tensor([0x7E, 0x08, 0xFE])  # 448, 2^-6, -448
    got = layout.decode_rows(row)[0, :3].float().tolist()
    want = np.array([448 * 2.0 ** -127, 2.0 ** -133, -448 * 2.0 ** -127]).astype(ml_dtypes.bfloat16)
    assert got == want.astype(np.float64).tolist() and got[0] > 0 and got[1] > 0
