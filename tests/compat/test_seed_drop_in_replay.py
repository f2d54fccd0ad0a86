"""The seed-era drop-ins replayed as a whole (``kvformats.compat._replay.replayed``): with launches
logged (the path CUDA tensors take), their replayed calls make exactly the launches of their full
path and of the native call, a plan exists from the third call, and errors still raise."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats.compat import tokenspeed as ts
from tests.harness.compat_calls import compat_call_pairs

ROWS = 8
REPLAYED = {
    "save_compressor_state": ts.save_deepseek_v4_compressor_state,
    "global_topk_indices_and_lens": ts.deepseek_v4_compute_global_topk_indices_and_lens,
    "combine_dense_swa_indices": ts.deepseek_v4_combine_dense_swa_indices,
    "decode_swa_indices_and_lens": ts.deepseek_v4_decode_swa_indices_and_lens,
    "fp8_ds_mla.dequantize_gather": ts.deepseek_v4_dequantize_and_gather_k_cache,
}


def test_replayed_seed_drop_ins_launch_what_their_full_path_launches():
    pytest.importorskip("triton")
    from kvformats.runtime.replay_plan import Plan
    from replay_fuzz import addresses, normalized, outcome, stub_with_replay, tensors_of

    pairs = compat_call_pairs("cpu", ROWS)
    assert set(REPLAYED) <= set(pairs)
    with stub_with_replay() as log:
        for name, fn in REPLAYED.items():
            native, drop_in = pairs[name]
            inputs = tensors_of(native) + tensors_of(drop_in)
            full = outcome(drop_in, log, False)[0]
            runs = [outcome(drop_in, log, True)[0] for _ in range(4)]
            at = addresses(full, *runs)
            want = normalized(full, inputs, at)
            assert want, name
            for got in runs:
                assert normalized(got, inputs, at) == want, name
            if name != "save_compressor_state":  # the save passes a view of the runtime ape, not the ape
                theirs = outcome(native, log, False)[0]
                at = addresses(full, theirs)
                assert normalized(theirs, inputs, at) == normalized(full, inputs, at), name
            assert any(isinstance(p, Plan) for p in fn.__wrapped_plans__.values()), name


def test_a_replayed_save_still_refuses_what_its_full_path_refuses():
    """Once the save's plan exists, a call of other metadata (a block size that is not the state's
    rows per page) runs the full path and raises there: errors are never replayed."""
    pytest.importorskip("triton")
    from kvformats.runtime.replay_plan import Plan
    from replay_fuzz import stub_with_replay

    native, drop_in = compat_call_pairs("cpu", ROWS)["save_compressor_state"]
    with stub_with_replay():
        for _ in range(3):
            drop_in()
        assert any(isinstance(p, Plan) for p in ts.save_deepseek_v4_compressor_state.__wrapped_plans__.values())
    with pytest.raises(kvf.InputError):
        ts.save_deepseek_v4_compressor_state(torch.zeros(2, 1024), torch.zeros(2, 1024), torch.zeros(4, 1024),
                                             torch.zeros(3, 4, 2048), torch.tensor([0, 1]), torch.arange(2), 5, 4)
