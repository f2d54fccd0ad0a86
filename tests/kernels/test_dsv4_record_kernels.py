"""The deepseek_v4 operations' value checks in the default GPU mode (spec/checks.md §2): an
invalid row is skipped, the first violation is recorded as the reference records it, nothing
else changes; strict mode raises before any write; valid input records nothing.

Without CUDA the ops run on CPU tensors with the GPU's check path and ``backend="triton"``
routed to the Triton launchers under the interpreter (the ``routed`` fixture); with CUDA the
same tests run compiled. Each case runs both backends on equal copies of its inputs.
"""

from __future__ import annotations


import pytest
import torch

import kvformats as kvf
from kvformats import deepseek_v4 as dsv4
from kvformats.formats import CompressorState, Fp8DsMla
from kvformats.runtime import deferred
from tests.harness.dsv4_scenarios import make_batch, sentinel_cache, writers

pytest.importorskip("triton")
import kvformats_kernels.dsv4  # noqa: E402,F401  (registers the kernels)
from recording import DEV, expect, take_record  # noqa: E402

BACKENDS = ["reference", "triton"]
CHECK = deferred.Check


def to_dev(batch):
    for name in ("state", "state_table", "base", "positions", "req", "state_slots", "target_slots", "weight",
                 "cos_sin"):
        setattr(batch, name, getattr(batch, name).to(DEV))
    return batch


def _insert(batch, cache, backend, **extra):
    kwargs = batch.kwargs() | extra
    dsv4.compress_kv_insert(batch.state, cache, ratio=batch.ratio, kv_page_size=4, backend=backend, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compress_insert_skips_and_records_a_slot_beyond_the_cache(backend, routed):
    b = to_dev(make_batch(4, 512, 4))
    layout = Fp8DsMla(page_size=4)
    cache = sentinel_cache(layout, int(b.target_slots.max()) // 4 + 1).to(DEV)
    capacity = cache.shape[0] * 4
    bad = int(writers(b).nonzero()[1, 0])
    want = cache.clone()
    skipped = b.target_slots.clone()
    skipped[bad] = -1
    _insert(b, want, backend, kv_slots=skipped)
    assert take_record()[0] == 0
    slots = b.target_slots.clone()
    slots[bad] = capacity + 5
    _insert(b, cache, backend, kv_slots=slots)
    assert take_record() == expect(CHECK.SLOT_RANGE, "compress_kv_insert", "kv_slots", bad, capacity + 5, capacity)
    assert torch.equal(cache, want)  # every other row written, nothing else touched


@pytest.mark.parametrize("backend", BACKENDS)
def test_compress_insert_skips_and_records_a_rope_position_beyond_the_table(backend, routed):
    b = to_dev(make_batch(4, 512, 4))
    layout = Fp8DsMla(page_size=4)
    cache = sentinel_cache(layout, int(b.target_slots.max()) // 4 + 1).to(DEV)
    ends = writers(b)
    rope_pos = b.positions // 4 * 4
    rows = int(rope_pos[ends].max())  # the last writer's rope position is one row too far
    short = b.cos_sin[:rows]
    bad = int(((rope_pos >= rows) & ends).nonzero()[0, 0])
    want = cache.clone()
    _insert(b, want, backend, cos_sin_cache=short, kv_slots=torch.where(rope_pos >= rows, -1, b.target_slots))
    take_record()
    _insert(b, cache, backend, cos_sin_cache=short)
    assert take_record() == expect(CHECK.POSITION_RANGE, "compress_kv_insert", "rope positions", bad,
                                   int(rope_pos[bad]), rows)
    assert torch.equal(cache, want)


def test_compress_insert_strict_raises_before_any_write(routed):
    b = to_dev(make_batch(4, 512, 4))
    cache = sentinel_cache(Fp8DsMla(page_size=4), int(b.target_slots.max()) // 4 + 1).to(DEV)
    before = cache.clone()
    slots = b.target_slots.clone()
    slots[int(writers(b).nonzero()[0, 0])] = 10 ** 6
    with pytest.raises(kvf.InputError, match="beyond the cache's capacity"):
        _insert(b, cache, "triton", kv_slots=slots, check="strict")
    assert torch.equal(cache, before) and take_record()[0] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_compressor_state_records_at_its_own_site(backend, routed):
    layout = CompressorState(head_dim=64, ratio=4, page_size=4)
    state = torch.zeros(2, 4, 2 * layout.width, device=DEV)
    kv, score = (torch.randn(3, layout.width, device=DEV) for _ in range(2))
    ape = torch.randn(4, layout.width, device=DEV)
    slots = torch.tensor([0, 9, 3], device=DEV)
    dsv4.save_compressor_state(kv, score, ape, state, ratio=4, positions=torch.arange(3, device=DEV), slots=slots,
                               backend=backend)
    assert take_record() == expect(CHECK.SLOT_RANGE, "save_compressor_state", "slots", 1, 9, 8)
    assert state[0, 0].any() and state[0, 3].any() and not state[1].any()


def _query_case(op: str, backend: str, positions, cos_sin):
    g = torch.Generator().manual_seed(1)
    if op == "inv_rope_fp8_quant":
        o = torch.randn(len(positions), 4, 512, generator=g).to(DEV, torch.bfloat16)
        return dsv4.inv_rope_fp8_quant(o, positions, cos_sin, n_groups=2, heads_per_group=2, backend=backend)
    q = torch.randn(len(positions), 8, 128, generator=g).to(DEV, torch.bfloat16)
    w = torch.randn(len(positions), 8, generator=g).to(DEV)
    return getattr(dsv4, op)(q, positions, cos_sin, w, 0.5, 2.0, backend=backend)


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out.contiguous().view(torch.uint8).reshape(-1)]


@pytest.mark.parametrize("op", ["prepare_indexer_q_mxfp4", "prepare_indexer_q_fp8", "inv_rope_fp8_quant"])
def test_query_ops_pass_an_invalid_position_through_unrotated_and_record_it(op, routed):
    cos_sin = dsv4.cos_sin_cache(64, 16)
    positions = torch.tensor([3, 40, 7, 5], device=DEV)  # one violation: which of several is kept is not specified
    outs = {}
    for backend in BACKENDS:
        outs[backend] = _flat(_query_case(op, backend, positions, cos_sin.to(DEV)))
        assert take_record() == expect(CHECK.POSITION_RANGE, op, "positions", 1, 40, 16), backend
    assert all(torch.equal(a, b) for a, b in zip(outs["reference"], outs["triton"]))
    # the token at position 40 comes out as if its position had been 0 (cos 1, sin 0): unrotated
    unrotated = _flat(_query_case(op, "reference", torch.tensor([3, 0, 7, 5], device=DEV),
                                  torch.cat([cos_sin[:1] * 0 + torch.cat([torch.ones(32), torch.zeros(32)]),
                                             cos_sin[1:]]).to(DEV)))
    take_record()
    assert all(torch.equal(a, b) for a, b in zip(outs["reference"], unrotated))


@pytest.mark.parametrize("op", ["prepare_indexer_q_fp8", "inv_rope_fp8_quant"])
def test_query_ops_strict_raise_and_valid_input_records_nothing(op, routed):
    cos_sin = dsv4.cos_sin_cache(64, 16).to(DEV)
    _query_case(op, "triton", torch.tensor([3, 15, 0], device=DEV), cos_sin)
    assert take_record()[0] == 0
    with pytest.raises(kvf.InputError, match="positions must lie in"):
        deferred.HOST_CHECKED.add(DEV.type)
        try:
            _query_case(op, "triton", torch.tensor([3, 16], device=DEV), cos_sin)
        finally:
            deferred.HOST_CHECKED.discard(DEV.type)


@pytest.mark.parametrize("backend", BACKENDS)
def test_swa_insert_invalid_position_normalises_q_writes_no_row_and_records(backend, routed):
    g = torch.Generator().manual_seed(2)
    t = 4
    q = torch.randn(t, 2, 512, generator=g).to(DEV, torch.bfloat16)
    kv = torch.randn(t, 512, generator=g).to(DEV, torch.bfloat16)
    layout = Fp8DsMla(page_size=4)
    cache = torch.full((2, layout.page_bytes), 0xA5, dtype=torch.uint8, device=DEV)
    cos_sin = dsv4.cos_sin_cache(64, 8).to(DEV)
    positions = torch.tensor([1, 2, 9, 3], device=DEV)
    slots = torch.tensor([0, 1, 2, 3], device=DEV)
    want_cache = cache.clone()
    dsv4.swa_insert(q.clone(), kv, want_cache, torch.tensor([0, 1, -1, 3], device=DEV), positions.clamp(max=7),
                    cos_sin, 1e-6, page_size=4, backend=backend)
    take_record()
    got_q = dsv4.swa_insert(q.clone(), kv, cache, slots, positions, cos_sin, 1e-6, page_size=4, backend=backend)
    assert take_record() == expect(CHECK.POSITION_RANGE, "swa_insert", "positions", 2, 9, 8)
    assert torch.equal(cache, want_cache)  # row 2 never written
    normed = dsv4.rms_norm(q[2:3].float(), None, 1e-6).to(q.dtype)
    assert torch.equal(got_q[2:3], normed)
