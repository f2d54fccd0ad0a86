"""The index helpers' kernels record query_start_loc that decreases in the device error record
(program 0 scans the offsets), and write the same rows as the reference all the same."""

from __future__ import annotations

import pytest
import torch

from kvformats.runtime import deferred

pytest.importorskip("triton")

from kvformats_kernels.dsv4 import indices as K  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _words():
    return deferred.error_record(DEV).tolist()


@pytest.mark.parametrize("qsl, bad", [([0, 3, 2, 6], (2, 2, 3)), ([0, 2, 4, 6], None), ([1, 0], (1, 0, 1))])
def test_compressed_slot_mapping_records_a_decrease(qsl, bad):
    q = torch.tensor(qsl, device=DEV)
    r = q.shape[0] - 1
    seq = torch.full((r,), 9, device=DEV)
    table = torch.arange(4 * r, dtype=torch.int32, device=DEV).reshape(r, 4)
    out = torch.empty(8, dtype=torch.int64, device=DEV)
    K.compressed_slot_mapping(6, q, seq, table, 4, 4, None, out)
    words = _words()
    if bad is None:
        assert words == [0] * deferred.WORDS
    else:
        site = deferred.site("compressed_slot_mapping", "query_start_loc")
        assert words[:6] == [1, int(deferred.Check.CU_ORDER), site, *bad]


def test_combine_topk_swa_records_a_decrease_and_valid_offsets_leave_it_clear():
    seq = torch.tensor([9, 9], device=DEV)
    topk = torch.zeros(3, 8, dtype=torch.int32, device=DEV)
    args = (seq, seq, 4, 4, 8, 64, 16)
    K.combine_topk_swa_indices(topk, torch.tensor([0, 1, 3], device=DEV), *args)
    assert _words() == [0] * deferred.WORDS
    K.combine_topk_swa_indices(topk, torch.tensor([0, 3, 2], device=DEV), *args)
    assert _words()[3:6] == [2, 2, 3]


@pytest.mark.parametrize("qsl, bad", [([0, 1, 0, 2], (2, 0, 1)), ([0, 1, 2, 3], None)])
def test_decode_swa_indices_records_a_decrease_and_matches_the_reference(qsl, bad):
    from kvformats.deepseek_v4.indices import decode_swa_indices_and_lens_reference as reference

    q = torch.tensor(qsl, device=DEV)
    r = q.shape[0] - 1
    seq = torch.tensor([5, 9, 200][:r], device=DEV)
    req = torch.arange(r, device=DEV)
    table = torch.arange(8 * r, dtype=torch.int32, device=DEV).reshape(r, 8)
    got = K.decode_swa_indices_and_lens(q, seq, req, table, 16, 4, None, None, None, None)
    words = _words()
    deferred.error_record(DEV).zero_()
    want = reference(q, seq, req, table, 16, 4, None, None, None, None)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    if bad is None:
        assert words == [0] * deferred.WORDS
    else:
        site = deferred.site("decode_swa_indices_and_lens", "query_start_loc")
        assert words[:6] == [1, int(deferred.Check.CU_ORDER), site, *bad]
