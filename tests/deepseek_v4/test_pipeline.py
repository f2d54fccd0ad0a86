"""Layer-step reference on CPU at small shapes: indices against hand computation, the SWA path
against an unquantized float32 recomputation, prefill+decode against one-shot prefill, and
bad configurations raising typed errors before anything is written."""

from __future__ import annotations

import math

import pytest
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.dsv4_layer.pipeline import LayerStep, visible_rows
from kvformats.dsv4_layer.pipeline_attention import sparse_attention
from kvformats.dsv4_layer.pipeline_config import LayerConfig, tiny_config
from kvformats.errors import InputError

LENS = (150, 37)  # request 0 passes one HCA group (128), request 1 does not


def _batch(cfg, lens=LENS, seed=3):
    pos = torch.cat([torch.arange(n) for n in lens])
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(lens)])
    x = torch.randn(len(pos), cfg.hidden, generator=torch.Generator().manual_seed(seed))
    return x, pos, req


@pytest.fixture(scope="module")
def prefilled():
    cfg = tiny_config()
    step = LayerStep(cfg, seed=1)
    x, pos, req = _batch(cfg)
    return cfg, step, x, pos, req, step.step(x, pos, req)


def test_swa_reads_are_the_window_slots(prefilled):
    cfg, step, _, pos, req, out = prefilled
    table = step.caches.swa_table
    ps = cfg.page_size
    for t in (0, 5, 100, 149, 150, 186):
        p, r = int(pos[t]), int(req[t])
        want = [int(table[r, q // ps]) * ps + q % ps if q >= 0 else -1 for q in range(p - cfg.window + 1, p + 1)]
        assert out.reads["swa"][t].tolist() == want


def test_compressed_reads_follow_causality(prefilled):
    cfg, step, _, pos, req, out = prefilled
    for t in range(len(pos)):
        p, r = int(pos[t]), int(req[t])
        seen = (p + 1) // 4
        local = [i for i in out.topk[t].tolist() if i >= 0]
        assert len(local) == min(cfg.topk, seen) and len(set(local)) == len(local)
        assert all(i < seen for i in local)
        hca = [s for s in out.reads["hca"][t].tolist() if s >= 0]
        assert len(hca) == (p + 1) // 128
    # token at position 127 of request 0 sees HCA row 0 through the table
    t = 127
    assert out.reads["hca"][t, 0] == int(step.caches.hca_table[0, 0]) * cfg.page_size


def test_topk_picks_the_best_index_scores(prefilled):
    cfg, _, _, pos, _, out = prefilled
    t = 149
    s = out.index_scores[t]
    chosen = s[out.topk[t].long()]
    rest = s[[i for i in range((int(pos[t]) + 1) // 4) if i not in set(out.topk[t].tolist())]]
    assert chosen.min() >= rest.max()


def test_visible_rows_by_hand():
    v = visible_rows(torch.tensor([0, 3, 4, 8]), 3, 4)
    assert v.tolist() == [[-1, -1, -1], [0, -1, -1], [0, -1, -1], [0, 1, -1]]


def test_swa_path_matches_float32_recomputation(prefilled):
    """Unquantized: q = rope(rmsnorm(q)), rows = bf16(rope(kv)) over the window, float32 softmax.
    Bound: fp8_ds_mla stores the 448-dim nope part in e4m3 with a power-of-two scale per 64
    values, a relative error of at most 2^-3 of the tile's max per element (RoPE tail exact in
    bf16); through the softmax and the value sum that gives a relative output error well under
    0.1 (measured at most 0.04 here)."""
    cfg, step, x, pos, req, out = prefilled
    w = step.weights
    q = (x @ w.q).view(len(pos), cfg.heads, cfg.head_dim).to(torch.bfloat16).float()
    q = dsv4.rope_tail(dsv4.rms_norm(q, None, cfg.rms_eps), pos, step.cos_sin).to(torch.bfloat16).float()
    kv = dsv4.rope_tail((x @ w.kv).to(torch.bfloat16).float(), pos, step.cos_sin).to(torch.bfloat16).float()
    err = []
    for t in range(len(pos)):
        p, r = int(pos[t]), int(req[t])
        keep = [(r, q_) for q_ in range(p - cfg.window + 1, p + 1)]
        rows = torch.zeros(cfg.window, cfg.head_dim)
        valid = torch.zeros(cfg.window, dtype=torch.bool)
        for j, (_, qq) in enumerate(keep):
            if qq >= 0:
                rows[j] = kv[(req == r) & (pos == qq)][0]
                valid[j] = True
        o = sparse_attention(q[t:t + 1], rows[None], valid[None], 1 / math.sqrt(cfg.head_dim), w.sink)
        err.append(((o[0] - out.swa[t]).norm() / o.norm()).item())
    assert max(err) < 0.1
    assert max(err) > 0  # the fp8 cache is not lossless: the comparison is not vacuous


def test_decode_steps_match_one_shot_prefill():
    cfg = tiny_config()
    x, pos, req = _batch(cfg, lens=(140, 40))
    whole = LayerStep(cfg, seed=2).step(x, pos, req)
    split = LayerStep(cfg, seed=2)
    last = {0: 139, 1: 179}  # decode the last token of each request after a prefill of the rest
    head = torch.ones(len(pos), dtype=torch.bool)
    head[list(last.values())] = False
    split.step(x[head], pos[head], req[head])
    idx = torch.tensor(list(last.values()))
    dec = split.step(x[idx], pos[idx], req[idx])
    for name in ("swa", "csa", "hca", "layer"):
        torch.testing.assert_close(getattr(dec, name), getattr(whole, name)[idx], rtol=1e-5, atol=1e-5)
    assert torch.equal(dec.topk, whole.topk[idx])


@pytest.mark.parametrize("bad", [dict(topk=65), dict(index_format="nvfp4"), dict(max_context=200),
                                 dict(index_dim=64), dict(head_dim=100), dict(heads=3),
                                 dict(requests=0), dict(window=512)])
def test_bad_configuration_raises_typed_error(bad):
    with pytest.raises(InputError):
        LayerStep(tiny_config(**bad))


def test_flash_shapes_validate():
    cfg = LayerConfig(topk=2048).check()
    assert cfg.csa_rows == 2048
    with pytest.raises(InputError, match="topk"):
        LayerConfig(topk=2048, max_context=4096).check()


def test_bad_batch_raises_before_writing():
    cfg = tiny_config()
    step = LayerStep(cfg)
    before = {k: v.clone() for k, v in step.caches.tensors().items()}
    x = torch.randn(2, cfg.hidden)
    for pos, req in ((torch.tensor([0, cfg.max_context]), torch.tensor([0, 0])),
                     (torch.tensor([0, 1]), torch.tensor([0, cfg.requests])),
                     (torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 0]))):
        with pytest.raises(InputError):
            step.check_batch(x, pos, req)
    with pytest.raises(InputError):
        step.check_batch(torch.randn(2, cfg.hidden + 1), torch.tensor([0, 1]), torch.tensor([0, 0]))
    assert all(torch.equal(before[k], v) for k, v in step.caches.tensors().items())


@pytest.mark.parametrize("fmt", ["fp8_indexer", "mxfp4_indexer"])
def test_both_indexer_formats_run(fmt):
    cfg = tiny_config(index_format=fmt, requests=1)
    x, pos, req = _batch(cfg, lens=(64,))
    out = LayerStep(cfg).step(x, pos, req)
    assert torch.isfinite(out.layer).all() and out.out_fp8[0].dtype == torch.float8_e4m3fn


def test_state_ring_decode_matches_whole_context_states():
    """Decode with compressor states in a ring of 6 pages of 32 rows equals full-context states
    (the prefill chunk of 120 positions stays shorter than the ring's 192)."""
    outs = []
    for ring in (0, 6):
        cfg = tiny_config(requests=1, page_size=32, state_ring_pages=ring)
        step = LayerStep(cfg, seed=4)
        x, pos, req = _batch(cfg, lens=(200,))
        step.step(x[:120], pos[:120], req[:120])
        outs.append(torch.cat([step.step(x[i:i + 1], pos[i:i + 1], req[i:i + 1]).layer for i in range(120, 200)]))
    assert outs[0].abs().sum() > 0
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    with pytest.raises(InputError, match="state_ring_pages"):
        tiny_config(page_size=32, state_ring_pages=5).check()


def test_query_chunks_do_not_change_the_result():
    cfg = tiny_config()
    x, pos, req = _batch(cfg)
    one = LayerStep(cfg, seed=5).step(x, pos, req)
    many = LayerStep(tiny_config(query_chunk=50, keep_scores=False), seed=5).step(x, pos, req)
    torch.testing.assert_close(many.layer, one.layer, rtol=1e-6, atol=1e-6)
    assert torch.equal(many.topk, one.topk) and many.index_scores is None


def test_every_path_matches_unquantized_recomputation():
    """SWA, CSA, HCA and the layer against bf16 rows from the same float32 states (no fp8),
    attending the rows the step's indexer chose: only the fp8_ds_mla row error remains, within
    the same 0.1 bound as the SWA test (measured 0.02-0.03 here)."""
    from kvformats.dsv4_layer.quality import PATHS, Exact, Run, _queries, attention, rel
    from kvformats.dsv4_layer.synthetic import activations

    cfg = tiny_config(requests=1, max_context=384)
    run = Run(cfg, activations(cfg.hidden, [300], seed=1), 296, 4)
    exact = Exact(run)
    q, _, _ = _queries(run)
    want = attention(run, q, exact.swa, exact.csa, exact.hca, run.out["topk"])
    errs = {p: rel(run.out[p], want[p]) for p in PATHS}
    assert all(0 < e < 0.1 for e in errs.values()), errs


@pytest.mark.parametrize("first,last", [(0, 249), (128, 319)])
def test_ring_smaller_than_the_chunk_is_refused_before_writing(first, last):
    """Ring of 6 pages of 32 positions: 250 positions repeat ring rows; 128..319 (192 positions)
    would overwrite the state of positions 124..127 that the CSA window ending at 131 reads."""
    cfg = tiny_config(requests=1, page_size=32, state_ring_pages=6, max_context=384)
    step = LayerStep(cfg, seed=4)
    before = {k: v.clone() for k, v in step.caches.tensors().items()}
    pos = torch.arange(first, last + 1)
    x, req = torch.randn(len(pos), cfg.hidden), torch.zeros(len(pos), dtype=torch.int64)
    with pytest.raises(InputError, match="state_ring_pages"):
        step.check_batch(x, pos, req)
    with pytest.raises(InputError, match="state_ring_pages"):
        step.step(x, pos, req)  # on CPU the step checks its batch itself
    assert all(torch.equal(before[k], v) for k, v in step.caches.tensors().items())
    # the same positions split at the ring's reach pass, one step per chunk
    step.check_batch(x[:100], pos[:100], req[:100])


def test_ring_check_accepts_decode_at_every_position():
    cfg = tiny_config(requests=2, page_size=32, state_ring_pages=6)
    step = LayerStep(cfg)
    for p in range(cfg.max_context):
        step.check_batch(torch.zeros(2, cfg.hidden), torch.tensor([p, cfg.max_context - 1 - p]), torch.tensor([0, 1]))


@pytest.mark.parametrize("keep_scores", [True, False])
def test_idle_step_returns_empty_output(keep_scores):
    cfg = tiny_config(keep_scores=keep_scores)
    step = LayerStep(cfg, seed=1)
    before = {k: v.clone() for k, v in step.caches.tensors().items()}
    none = torch.zeros(0, dtype=torch.int64)
    step.check_batch(torch.zeros(0, cfg.hidden), none, none)
    idle = step.step(torch.zeros(0, cfg.hidden), none, none)
    assert all(torch.equal(before[k], v) for k, v in step.caches.tensors().items())
    x, pos, req = _batch(cfg, lens=(5, 3))
    busy = step.step(x, pos, req)  # same dtypes and trailing shapes, zero rows
    pairs = [(getattr(idle, k), getattr(busy, k)) for k in ("swa", "csa", "hca", "layer", "topk")]
    pairs += [(idle.reads[k], busy.reads[k]) for k in busy.reads] + list(zip(idle.out_fp8, busy.out_fp8))
    if keep_scores:
        pairs.append((idle.index_scores, busy.index_scores))
    else:
        assert idle.index_scores is None
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == (0, *b.shape[1:])
