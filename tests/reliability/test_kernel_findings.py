"""Minimal reproductions of kernel/reference disagreements the reliability fuzzers found.
Each is xfail(strict=True): it fails loudly (XPASS) the day the kernel is fixed, and then the
matching exclusion in codec_machine.known_kernel_issue should go."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from reliability_harness import Arena, backend_has, run_op, same_values, triton_available


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=(
    "kvformats_kernels.fp8_ds_mla._decode_geometry views the cache span as int16 when the data pointer, "
    "page stride and RoPE offsets are even, but the span (pages - 1) * stride + min_page_bytes is odd when "
    "min_page_bytes is (e.g. head_dim 192 / rope 64 -> 259 B rows, page_size 1: layout.allocate(1) gives 512 B pages): "
    "RuntimeError 'self.size(-1) must be divisible by 2 to view Byte as Short'; the reference decodes it"))
def test_fp8_ds_mla_decode_odd_page_width():
    if not (triton_available() and backend_has("triton", "fp8_ds_mla", "decode")):
        pytest.skip("no Triton fp8_ds_mla decode here")
    layout = kvf.Fp8DsMla(head_dim=192, rope_dim=64, page_size=1)
    arena = Arena(layout, 1, pad=0, lead=0, tail=1, sentinel=0xA5, width=layout.page_bytes)
    slots = torch.tensor([0], dtype=torch.int32)
    layout.encode(torch.ones(1, 192), arena.cache, slots, backend="reference")
    got = run_op("triton", layout.decode, arena.cache, slots)
    assert same_values(got, layout.decode(arena.cache, slots, backend="reference"))
