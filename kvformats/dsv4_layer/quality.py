"""Accuracy of the DeepSeek V4 cache formats inside the layer step (``kvformats quality``).

The same tokens go through the layer-step reference (quantized caches, as an engine writes
them) and through an exact recomputation with bf16 rows (no quantization): the same compressor
states, pooled and rotated by the public ops and rounded to bf16, bf16 indexer queries and keys,
float32 attention. Reported per run: the relative error ``|o - o_exact| / |o_exact|`` (Frobenius,
over the measured tokens) of the attention output of each path (SWA, CSA, HCA, whole layer), and
the indexer's recall@k (overlap of its top-k with the exact bf16 indexer's top-k).

Runs: the pipeline with the MXFP4 and with the FP8 indexer cache (default profiles, every op
as the step runs it), then each numerics profile of ``kvformats.numerics.profiles.supported_profiles``
applied to the exact rows (``layout.encode`` with that profile, then decode): fp8_ds_mla
profiles for the attention error, indexer profiles for recall@k. The measured tokens are the
decode tokens after a prefill of each request.
"""

from __future__ import annotations

import math

from typing import cast

import attrs
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.dsv4_layer.pipeline import LayerStep, _mxfp4_query, index_scores, top_k, visible_rows
from kvformats.dsv4_layer.pipeline_attention import sparse_attention
from kvformats.dsv4_layer.pipeline_config import CSA_RATIO, HCA_RATIO, LayerConfig
from kvformats.formats import Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from kvformats.numerics.profiles import supported_profiles

PATHS = ("swa", "csa", "hca", "layer")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def recall(got: torch.Tensor, want: torch.Tensor) -> float:
    """Mean over tokens of |got ∩ want| / |want| (−1 entries ignored)."""
    hits = total = 0
    for g, w in zip(got.tolist(), want.tolist()):
        w = {i for i in w if i >= 0}
        hits += len(w & {i for i in g if i >= 0})
        total += len(w)
    return hits / max(total, 1)


class Run:
    """Prefill + decode of every request through one LayerStep; keeps what the report needs."""

    def __init__(self, cfg: LayerConfig, x: torch.Tensor, prefill: int, decode: int):
        self.step = LayerStep(cfg, seed=7)
        r = cfg.requests
        per = prefill + decode
        self.pos = torch.arange(per).repeat(r)
        self.req = torch.arange(r).repeat_interleave(per)
        first = self.pos < prefill
        self.step.step(x[first], self.pos[first], self.req[first])
        outs = [self.step.step(x[self.pos == p], self.pos[self.pos == p], self.req[self.pos == p])
                for p in range(prefill, per)]
        self.out = {k: torch.cat([getattr(o, k) for o in outs]) for k in PATHS + ("topk",)}
        self.dec_pos = torch.cat([self.pos[self.pos == p] for p in range(prefill, per)])
        self.dec_req = torch.cat([self.req[self.pos == p] for p in range(prefill, per)])
        self.dec_x = torch.cat([x[self.pos == p] for p in range(prefill, per)])
        self.x = x


class Exact:
    """bf16 rows of every cache, from the run's float32 states (the unquantized reference)."""

    def __init__(self, run: Run):
        s, cfg = run.step, run.step.cfg
        w, c, cs = s.weights, s.caches, s.cos_sin
        r = cfg.requests
        xf = run.x.float()
        kv = (xf @ w.kv).to(torch.bfloat16).float()
        self.swa = torch.zeros(r, cfg.max_context, cfg.head_dim)
        self.swa[run.req, run.pos] = dsv4.rope_tail(kv, run.pos, cs).to(torch.bfloat16).float()
        self.csa = self._pooled(s, c.csa_state, c.csa_state_table, w.csa_norm, CSA_RATIO, cfg.csa_rows)
        self.hca = self._pooled(s, c.hca_state, c.hca_state_table, w.hca_norm, HCA_RATIO, cfg.hca_rows)
        idx = self._pooled(s, c.idx_state, c.idx_state_table, w.idx_norm, CSA_RATIO, cfg.csa_rows)
        self.index = dsv4.hadamard_transform(idx.to(torch.bfloat16)).float()

    @staticmethod
    def _pooled(s, state, table, weight, ratio, rows):
        cfg = s.cfg
        i = torch.arange(rows)
        out = []
        for r in range(cfg.requests):
            end = i * ratio + ratio - 1
            pooled = dsv4.pool_compressor_state(state, ratio=ratio, positions=end, req_indices=torch.full_like(i, r),
                                                block_table=table, rms_weight=weight, rms_eps=cfg.rms_eps)
            out.append(dsv4.rope_tail(pooled, i * ratio, s.cos_sin).to(torch.bfloat16).float())
        return torch.stack(out)


def _queries(run: Run):
    """Exact (unquantized) attention and indexer queries of the measured tokens."""
    s, cfg = run.step, run.step.cfg
    w, cs = s.weights, s.cos_sin
    xf, pos = run.dec_x.float(), run.dec_pos
    q = (xf @ w.q).view(len(pos), cfg.heads, cfg.head_dim).to(torch.bfloat16).float()
    q = dsv4.rope_tail(dsv4.rms_norm(q, None, cfg.rms_eps), pos, cs).to(torch.bfloat16).float()
    iq = (xf @ w.idx_q).view(len(pos), cfg.index_heads, cfg.index_dim).to(torch.bfloat16).float()
    iq = dsv4.hadamard_transform(dsv4.rope_tail(iq, pos, cs).to(torch.bfloat16)).float()
    hw = (xf @ w.idx_w) / math.sqrt(cfg.index_dim) / math.sqrt(cfg.index_heads)
    return q, iq, hw


def attention(run: Run, q, swa, csa, hca, topk):
    """Per-path and whole-layer outputs of the measured tokens over the given row tables."""
    cfg, pos, req = run.step.cfg, run.dec_pos, run.dec_req
    win = pos[:, None] - cfg.window + 1 + torch.arange(cfg.window)
    swa_rows, swa_ok = swa[req[:, None], win.clamp_min(0)], win >= 0
    csa_rows, csa_ok = csa[req[:, None], topk.long().clamp_min(0)], topk >= 0
    hv = visible_rows(pos, cfg.hca_rows, HCA_RATIO)
    hca_rows, hca_ok = hca[req[:, None], hv.long().clamp_min(0)], hv >= 0
    sink = run.step.weights.sink if cfg.sink else None
    sc = 1.0 / math.sqrt(cfg.head_dim)
    return {"swa": sparse_attention(q, swa_rows, swa_ok, sc, sink),
            "csa": sparse_attention(q, csa_rows, csa_ok, sc, sink),
            "hca": sparse_attention(q, hca_rows, hca_ok, sc, sink),
            "layer": sparse_attention(q, torch.cat([swa_rows, csa_rows, hca_rows], 1),
                                      torch.cat([swa_ok, csa_ok, hca_ok], 1), sc, sink)}


def exact_topk(run: Run, iq, hw, keys):
    cfg = run.step.cfg
    local = visible_rows(run.dec_pos, cfg.csa_rows, CSA_RATIO)
    k = keys[run.dec_req[:, None], local.long().clamp_min(0)]
    return top_k(index_scores(iq, k, hw, local >= 0), cfg.topk)


def _roundtrip(layout, rows: torch.Tensor) -> torch.Tensor:
    """Encode ``rows [R, N, d]`` with ``layout`` (its profile) and decode them back (float32)."""
    flat = rows.reshape(-1, rows.shape[-1])
    cache = layout.allocate(-(-flat.shape[0] // layout.page_size))
    slots = torch.arange(flat.shape[0])
    layout.encode(flat.to(torch.bfloat16), cache, slots)
    return layout.decode(cache, slots).float().view_as(rows)


def _query_for(fmt: str, run: Run):
    """The indexer queries as the step quantizes them for ``fmt`` (prepare_indexer_q_*)."""
    s, cfg = run.step, run.step.cfg
    xf = run.dec_x.float()
    iq = (xf @ s.weights.idx_q).view(len(xf), cfg.index_heads, cfg.index_dim).to(torch.bfloat16)
    hw = xf @ s.weights.idx_w
    args = (iq, run.dec_pos, s.cos_sin, hw, 1 / math.sqrt(cfg.index_dim), 1 / math.sqrt(cfg.index_heads))
    if fmt == "mxfp4_indexer":
        (qp, qs), hw = dsv4.prepare_indexer_q_mxfp4(*args)
        return _mxfp4_query(qp, qs, cfg.index_dim), hw
    q8, hw = dsv4.prepare_indexer_q_fp8(*args)
    return q8.float(), hw


def report(cfg: LayerConfig, x: torch.Tensor, prefill: int, decode: int) -> dict:
    """The quality figures as a JSON-ready dict (see the module docstring)."""
    rows = []
    base = None
    for fmt in ("mxfp4_indexer", "fp8_indexer"):
        run = Run(attrs.evolve(cfg, index_format=fmt), x, prefill, decode)
        if base is None:
            base = run
            exact = Exact(run)
            q, iq, hw = _queries(run)
            want_topk = exact_topk(run, iq, hw, exact.index)
            want = attention(run, q, exact.swa, exact.csa, exact.hca, want_topk)
        rows.append({"run": f"pipeline, {fmt} (default profiles)",
                     **{p: rel(run.out[p], want[p]) for p in PATHS}, "recall": recall(run.out["topk"], want_topk)})
    run = cast(Run, base)  # the first format's run: the loop above always sets it
    ds = supported_profiles()
    for prof in ds["fp8_ds_mla"]:
        lay = Fp8DsMla(head_dim=cfg.head_dim, rope_dim=cfg.rope_dim, page_size=cfg.page_size, profile=prof)
        got = attention(run, q, _roundtrip(lay, exact.swa), _roundtrip(lay, exact.csa), _roundtrip(lay, exact.hca),
                        want_topk)
        rows.append({"run": f"fp8_ds_mla profile {prof} (exact top-k)", **{p: rel(got[p], want[p]) for p in PATHS},
                     "recall": None})
    for fmt, cls in (("mxfp4_indexer", Mxfp4Indexer), ("fp8_indexer", Fp8Indexer)):
        qv, hwq = _query_for(fmt, run)
        for prof in ds[fmt]:
            keys = _roundtrip(cls(head_dim=cfg.index_dim, page_size=cfg.page_size, profile=prof), exact.index)
            rows.append({"run": f"{fmt} profile {prof}", **dict.fromkeys(PATHS),
                         "recall": recall(exact_topk(run, qv, hwq, keys), want_topk)})
    # the fewest compressed rows a measured token sees: a top-k that takes them all selects them
    # whatever the scores, so recall@k is 1.0 by construction there and says nothing
    fewest = int((visible_rows(run.dec_pos, cfg.csa_rows, CSA_RATIO) >= 0).sum(1).min()) if len(run.dec_pos) else 0
    return {"config": attrs.asdict(cfg), "prefill": prefill, "decode": decode, "tokens_measured": len(run.dec_pos),
            "fewest_visible_rows": fewest, "rows": rows}

