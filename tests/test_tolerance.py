"""kvformats.testing.tolerance: code distances in value order, checked on hand-made byte changes."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.errors import LayoutError
from kvformats.testing.tolerance import code_distance, ordinal


def rows(layout, n=3, seed=0):
    x = torch.randn(n, layout.head_dim, generator=torch.Generator().manual_seed(seed))
    return layout.encode_rows(x.to(torch.bfloat16))


def test_ordinal_orders_sign_magnitude_codes():
    codes = torch.tensor([0x81, 0x80, 0x00, 0x01, 0x7E])  # -min, -0, +0, +min, the largest e4m3 code
    assert ordinal(codes, 8).tolist() == [-1, 0, 0, 1, 126]
    assert ordinal(torch.tensor([0x9, 0x8, 0x0, 0x1, 0x7]), 4).tolist() == [-1, 0, 0, 1, 7]


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_indexer", "mxfp4_indexer"])
def test_identical_rows_are_zero_apart(fmt):
    layout = kvf.get_format(fmt)
    r = rows(layout)
    d = code_distance(layout, r, r.clone())
    assert d.within_one_code() and d.apart == 0 and d.max_apart == 0 and d.exact_equal
    assert d.values == r.shape[0] * (layout.nope_dim + layout.rope_dim if fmt == "fp8_ds_mla" else layout.head_dim)


def test_fp8_ds_mla_value_and_scale_changes():
    layout = kvf.get_format("fp8_ds_mla")
    want = rows(layout)
    got = want.clone()
    got[0, 5] = (int(want[0, 5]) & 0x80) | 0x10  # a NoPE byte set to a fixed magnitude...
    want[0, 5] = (int(want[0, 5]) & 0x80) | 0x11  # ...one code from the other
    d = code_distance(layout, got, want)
    assert (d.max_apart, d.apart, d.within_one_code()) == (1, 1, True)
    got[1, 7], want[1, 7] = 0x01, 0x81  # +min and -min: two codes apart across zero
    assert code_distance(layout, got, want).max_apart == 2
    assert not code_distance(layout, got, want).within_one_code()
    got[1, 7], want[1, 7] = 0x00, 0x80  # +0 and -0: different bytes, no distance
    d = code_distance(layout, got, want)
    assert (d.max_apart, d.apart) == (1, 2)
    nope_rope = layout.nope_dim + 2 * layout.rope_dim
    got[2, nope_rope] ^= 1  # the first scale byte
    assert not code_distance(layout, got, want).exact_equal


def test_fp8_ds_mla_rope_is_compared_as_bf16():
    layout = kvf.get_format("fp8_ds_mla")
    want = rows(layout)
    got = want.clone()
    at = layout.nope_dim  # the first RoPE value, bf16 little-endian
    value = int(want[0, at]) | (int(want[0, at + 1]) << 8)
    bumped = (value & 0x8000) | ((value & 0x7FFF) + 1)
    got[0, at], got[0, at + 1] = bumped & 0xFF, bumped >> 8
    d = code_distance(layout, got, want)
    assert (d.max_apart, d.apart) == (1, 1)


def test_mxfp4_nibbles_are_separate_values():
    layout = kvf.get_format("mxfp4_indexer")
    want = rows(layout)
    got = want.clone()
    got[0, 0] = 0x21  # low nibble +0.5, high nibble +1.0
    want[0, 0] = 0x32  # low +1.0, high +1.5: each one code apart
    d = code_distance(layout, got, want)
    assert (d.max_apart, d.apart) == (1, 2)
    want[0, 0] = 0x92  # high nibble -0.5: three codes from +1.0
    assert code_distance(layout, got, want).max_apart == 3


def test_unsupported_layout_and_shapes_raise():
    with pytest.raises(LayoutError, match="not 'compressor_state'"):
        layout = kvf.get_format("compressor_state")
        code_distance(layout, torch.zeros(1, layout.row_bytes, dtype=torch.uint8),
                      torch.zeros(1, layout.row_bytes, dtype=torch.uint8))
    layout = kvf.get_format("fp8_indexer")
    with pytest.raises(LayoutError, match="different shapes"):
        code_distance(layout, rows(layout, 2), rows(layout, 3))
