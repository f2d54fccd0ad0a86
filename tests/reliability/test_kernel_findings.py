"""Minimal reproductions of kernel/reference disagreements the reliability fuzzers found, kept
as regression tests once fixed."""

from __future__ import annotations

import torch

import kvformats as kvf
from tests.harness.reliability_harness import DEVICE, Arena, run_op, same_values


def test_fp8_ds_mla_decode_odd_page_width():
    """Found by the fuzzer: the decode launcher viewed an odd-length span of the cache (odd
    min_page_bytes, e.g. 259 B rows with page_size 1) as int16 words and raised; fixed by rounding
    the span down to even (the last RoPE byte ends on an even address inside it)."""
    layout = kvf.Fp8DsMla(head_dim=192, rope_dim=64, page_size=1)
    arena = Arena(layout, 1, pad=0, lead=0, tail=1, sentinel=0xA5, width=layout.page_bytes)
    slots = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    layout.encode(torch.ones(1, 192, device=DEVICE), arena.cache, slots, backend="reference")
    got = run_op("triton", layout.decode, arena.cache, slots)
    assert same_values(got, layout.decode(arena.cache, slots, backend="reference"))
