"""Compressor state save, window pooling and the compress inserts (CSA / HCA fp8_ds_mla, CSA
indexer FP8 / MXFP4): pooling against a float64 loop oracle; cache bytes against the codecs
composed by hand (pool -> rope -> encode); only the written rows change."""

from __future__ import annotations

import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from tests.harness import dsv4_oracle as orc
from tests.harness.dsv4_scenarios import make_batch, sentinel_cache, writers
from kvformats.testing.strategies import storage_bytes

CASES = {  # id: (ratio, head_dim, target page size)
    "csa": (4, 128, 4),
    "csa512": (4, 512, 64),
    "hca": (128, 128, 2),
}


def _batch(case, **kw):
    ratio, h, tps = CASES[case]
    if ratio == 128:
        kw.setdefault("seq_lens", (256, 130, 300))
        kw.setdefault("new_tokens", (3, 130, 50))
        kw.setdefault("base", (0, 0, 20))
        kw.setdefault("missing", ((0, 20),))
    return make_batch(ratio, h, tps, **kw)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pooling_matches_float64_oracle(case):
    b = _batch(case)
    got = dsv4.pool_compressor_state(b.state, ratio=b.ratio, positions=b.positions, req_indices=b.req,
                                     block_table=b.state_table, rms_weight=b.weight, rms_eps=b.eps,
                                     block_table_base_offsets=b.base)
    state, table, base, w = orc.nested(b.state), b.state_table.tolist(), b.base.tolist(), b.weight.double().tolist()
    for i, (p, r) in enumerate(zip(b.positions.tolist(), b.req.tolist())):
        want = torch.tensor(orc.pool(state, b.ratio, p, r, table, base, w, b.eps), dtype=torch.float64)
        assert torch.allclose(got[i].double(), want, rtol=2e-5, atol=2e-6), (case, p, r)


def test_first_csa_group_uses_only_the_newer_half():
    """p = 3: the 4 older window positions are negative and drop out (spec/upstream.md §5.3)."""
    b = make_batch(4, 128, 4, seq_lens=(4,), new_tokens=(4,), base=(0,), missing=())
    got = dsv4.pool_compressor_state(b.state, ratio=4, positions=torch.tensor([3]), req_indices=torch.tensor([0]),
                                     block_table=b.state_table, rms_weight=b.weight, rms_eps=b.eps)
    page = int(b.state_table[0, 0])
    kv, score = b.state[page, :, 128:256].double(), b.state[page, :, 256 + 128:].double()
    pooled = (torch.softmax(score, dim=0) * kv).sum(0)
    want = pooled * torch.rsqrt(pooled.square().mean() + b.eps) * b.weight.double()
    assert torch.allclose(got[0].double(), want, rtol=1e-5, atol=1e-6)


def test_all_missing_window_pools_to_zero():
    b = make_batch(4, 128, 4, seq_lens=(8,), new_tokens=(8,), base=(0,), missing=())
    empty = torch.full_like(b.state_table, -1)
    got = dsv4.pool_compressor_state(b.state, ratio=4, positions=torch.tensor([7]), req_indices=torch.tensor([0]),
                                     block_table=empty, rms_weight=b.weight, rms_eps=b.eps)
    assert torch.equal(got, torch.zeros_like(got))


def _expected_kv_cache(b, kv_layout, cache):
    want = torch.empty_like(storage_bytes(cache)).copy_(storage_bytes(cache))
    view = want.as_strided(cache.shape, cache.stride(), cache.storage_offset())
    w = writers(b)
    p = b.positions[w]
    normed = dsv4.pool_compressor_state(b.state, ratio=b.ratio, positions=p, req_indices=b.req[w],
                                        block_table=b.state_table, rms_weight=b.weight, rms_eps=b.eps,
                                        block_table_base_offsets=b.base)
    x = dsv4.rope_tail(normed, p // b.ratio * b.ratio, b.cos_sin)
    if isinstance(kv_layout, kvf.Fp8DsMla):
        kv_layout.encode(x, view, b.target_slots[w], backend="reference")
    else:
        kv_layout.encode(dsv4.hadamard_transform(x), view, b.target_slots[w], backend="reference")
    return want, int(w.sum())


@pytest.mark.parametrize("case", sorted(CASES))
def test_compress_kv_insert_equals_pool_rope_encode(case):
    b = _batch(case)
    ratio, h, tps = CASES[case]
    layout = kvf.Fp8DsMla(head_dim=h, rope_dim=64, page_size=tps)
    cache = sentinel_cache(layout, b.target_table.numel())
    want, n_written = _expected_kv_cache(b, layout, cache)
    assert n_written >= 2
    fn = dsv4.csa_compress_kv_insert if ratio == 4 else dsv4.hca_compress_kv_insert
    fn(b.state, cache, kv_page_size=tps, **b.kwargs())
    assert torch.equal(storage_bytes(cache), want)
    changed = (storage_bytes(cache) != 0xA5).sum().item()
    assert 0 < changed <= n_written * layout.row_bytes


@pytest.mark.parametrize("fmt", ["mxfp4_indexer", "fp8_indexer"])
def test_indexer_compress_insert_equals_pool_rope_hadamard_encode(fmt):
    b = make_batch(4, 128, 4, seed=3)
    layout = kvf.get_format(fmt, head_dim=128, page_size=4)
    cache = sentinel_cache(layout, b.target_table.numel(), extra_stride=12)
    want, n_written = _expected_kv_cache(b, layout, cache)
    assert n_written >= 2
    dsv4.indexer_compress_insert(b.state, cache, index_format=fmt, index_page_size=4, **b.kwargs("index_slots"))
    assert torch.equal(storage_bytes(cache), want)


def test_compress_insert_skips_non_group_ends_and_invalid_slots():
    b = make_batch(4, 128, 4, seq_lens=(16,), new_tokens=(16,), base=(0,), missing=())
    b.state_slots[3] = -1   # p = 3: no state row -> no write
    b.target_slots[7] = -1  # p = 7: no target row -> no write
    layout = kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4)
    cache = sentinel_cache(layout, b.target_table.numel())
    dsv4.csa_compress_kv_insert(b.state, cache, kv_page_size=4, **b.kwargs())
    rows = layout.gather(cache, b.target_slots.clamp_min(0))
    written = (rows != 0xA5).any(dim=1)
    p = b.positions
    for i in range(16):
        # each group's slot is shared by its four tokens; only groups 2 and 3 (p = 11, 15) are written
        assert bool(written[i]) == (int(p[i]) // 4 in (2, 3)), int(p[i])


def test_all_missing_window_writes_a_zero_row():
    b = make_batch(4, 128, 4, seq_lens=(8,), new_tokens=(1,), base=(0,), missing=())
    b.state_table = torch.full_like(b.state_table, -1)
    layout = kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4)
    cache = sentinel_cache(layout, b.target_table.numel())
    dsv4.csa_compress_kv_insert(b.state, cache, kv_page_size=4, **b.kwargs())
    row = layout.gather(cache, b.target_slots)[0]
    assert row[:64].tolist() == [0] * 64  # NoPE codes of +0.0
    assert torch.equal(layout.decode(cache, b.target_slots)[0].float(), torch.zeros(128))  # rope ±0
    assert row[192:].tolist() == [0x69, 0]  # e = -22 for a zero block, pad 0


def test_save_compressor_state_through_table_and_slots():
    g = torch.Generator().manual_seed(5)
    table = torch.tensor([[3, -1, 0], [1, 2, -1]])
    base = torch.tensor([1, 0])
    positions = torch.tensor([4, 5, 6, 9, 10, 0, 7, 8])
    req = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    kv, score = torch.randn(8, 128, generator=g), torch.randn(8, 128, generator=g)
    ape = torch.randn(4, 128, generator=g)
    cache = torch.full((4, 4, 256), 7.0)
    dsv4.save_compressor_state(kv, score, ape, cache, ratio=4, positions=positions, req_indices=req,
                               block_table=table, block_table_base_offsets=base)
    tl, want = table.tolist(), torch.full((4, 4, 256), 7.0)
    for i, (p, r) in enumerate(zip(positions.tolist(), req.tolist())):
        s = orc.table_slot(tl, r, p, 4, base.tolist(), 4)
        if s >= 0:
            want[s // 4, s % 4] = torch.cat([kv[i], score[i] + ape[p % 4]])
    assert torch.equal(cache, want)
    again = torch.full((4, 4, 256), 7.0)
    slots = dsv4.table_slot_mapping(positions=positions, req_indices=req, block_table=table, page_size=4,
                                    block_table_base_offsets=base)
    dsv4.save_compressor_state(kv, score, ape, again, ratio=4, positions=positions, slots=slots)
    assert torch.equal(again, want)
