"""The drop-in computes tokenspeed's row count up front and calls the native op once: a padded
slot mapping (a CUDA-graph batch) costs about the Python calls of an exact one, and a refused call
raises the native op's first error, with nothing written (issue 46: no retry on shortened
tensors, which validated twice and could hide the first error's cause)."""

from __future__ import annotations

import sys

import pytest
import torch

from kvformats.compat import tokenspeed as ts
from kvformats.errors import InputError, InputTypeError

BLOCK = 64


def _python_calls(fn) -> int:
    """Python function calls made while ``fn`` runs (C calls not counted)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def _inputs(rows: int, padded: int):
    g = torch.Generator().manual_seed(rows)
    index_k = torch.randn(rows, 128, generator=g).to(torch.bfloat16)
    cache = torch.zeros(4, BLOCK * 132, dtype=torch.uint8)  # FP8 indexer rows: 128 codes + 4 scale bytes
    slots = torch.cat([torch.arange(rows) * 3, torch.full((padded - rows,), -1)]).to(torch.int64)
    return index_k, cache, slots


def test_a_padded_slot_mapping_costs_about_the_python_calls_of_an_exact_one():
    index_k, cache, exact = _inputs(16, 16)
    _, _, padded = _inputs(16, 64)
    ts.write_deepseek_v4_indexer_fp8_cache(index_k, cache, exact, BLOCK)  # warm
    ts.write_deepseek_v4_indexer_fp8_cache(index_k, cache, padded, BLOCK)
    n_exact = _python_calls(lambda: ts.write_deepseek_v4_indexer_fp8_cache(index_k, cache, exact, BLOCK))
    n_padded = _python_calls(lambda: ts.write_deepseek_v4_indexer_fp8_cache(index_k, cache, padded, BLOCK))
    # the padded call cuts the slot mapping once (a few helper calls); a retry would repeat the whole call
    assert n_padded <= n_exact + 6, (n_exact, n_padded)
    reference = torch.zeros_like(cache)
    ts.write_deepseek_v4_indexer_fp8_cache(index_k, reference, exact, BLOCK)
    assert torch.equal(cache, reference)


@pytest.mark.parametrize("case", ["index_k dtype", "slot beyond the cache"])
def test_a_refused_padded_call_raises_the_first_error_and_writes_nothing(case):
    index_k, cache, slots = _inputs(8, 32)
    cache.fill_(7)
    before = cache.clone()
    if case == "index_k dtype":
        index_k, want, named = index_k.to(torch.int32), InputTypeError, "got torch.int32"
    else:
        slots[3], want, named = cache.shape[0] * BLOCK + 5, InputError, "slot"
    with pytest.raises(want) as raised:
        ts.write_deepseek_v4_indexer_fp8_cache(index_k, cache, slots, BLOCK)
    assert named in str(raised.value)
    assert torch.equal(cache, before)
