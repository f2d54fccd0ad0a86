"""The layer step against an independent recomputation (dsv4_layer_oracle: its own pooling,
RoPE, scoring, top-k and attention in float64; only the format codecs shared).

Two references: the exact one (bf16 rows and queries, nothing quantized) bounds what the formats
cost; the quantized one (the oracle's rows and indexer queries through the same codecs as the
caches) must agree with the step up to float32 rounding, so that any slip in the step's reads,
scoring, top-k or attention shows. Two requests of 300 and 150 tokens in one prefill step, every
token measured."""

from __future__ import annotations

import pytest
import torch
from dsv4_layer_oracle import F64, Oracle, roundtrip

from kvformats.dsv4_layer.pipeline import LayerStep
from kvformats.dsv4_layer.pipeline_config import tiny_config
from kvformats.formats import Fp8DsMla, Fp8Indexer, Mxfp4Indexer

LENS = (300, 150)
PATHS = ("swa", "csa", "hca", "layer")
# recall@k of the step's top-k against the exact indexer (measured 0.898 with MXFP4 queries and
# keys, 0.971 with FP8): the formats' coarse codes reorder close scores, nothing should more.
EXACT_RECALL = {"mxfp4_indexer": 0.85, "fp8_indexer": 0.94}
# fp8_ds_mla rows against exact bf16 rows: at most 2^-3 of a 64-value tile's max per element,
# measured 0.020-0.024 relative output error; same rows and codecs: float32 against float64
# sums, measured at most 3e-5.
EXACT_ERR, SAME_ERR = 0.05, 2e-4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.to(F64) - b).norm() / b.norm())


def sets(topk: torch.Tensor) -> list[set]:
    return [{i for i in row if i >= 0} for row in topk.tolist()]


def recall(got: list[set], want: list[set]) -> float:
    return sum(len(g & w) for g, w in zip(got, want)) / sum(len(w) for w in want)


@pytest.fixture(scope="module", params=["mxfp4_indexer", "fp8_indexer"])
def run(request):
    cfg = tiny_config(max_context=384, index_format=request.param)
    step = LayerStep(cfg, seed=1)
    pos = torch.cat([torch.arange(n) for n in LENS])
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(LENS)])
    x = torch.randn(len(pos), cfg.hidden, generator=torch.Generator().manual_seed(3))
    out = step.step(x, pos, req)
    oracle = Oracle(cfg, step.weights, x, pos, req)
    q, iq, head_w = oracle.queries(x, pos)
    exact_topk = oracle.select(iq, head_w, pos, req)
    # the indexer quantized as the step stores keys and prepares queries
    if cfg.index_format == "mxfp4_indexer":
        keys = roundtrip(Mxfp4Indexer(head_dim=cfg.index_dim, page_size=cfg.page_size), oracle.index)
        iq_q = roundtrip(Mxfp4Indexer(head_dim=cfg.index_dim, page_size=1), iq)
    else:
        keys = roundtrip(Fp8Indexer(head_dim=cfg.index_dim, page_size=cfg.page_size), oracle.index)
        iq_q = iq.clamp(-448, 448).to(torch.float8_e4m3fn).to(F64)  # FP8 queries carry no scale
    quant_topk = oracle.select(iq_q, head_w, pos, req, keys)
    kv = Fp8DsMla(head_dim=cfg.head_dim, rope_dim=cfg.rope_dim, page_size=cfg.page_size)
    return dict(cfg=cfg, out=out, step_topk=sets(out.topk), exact_topk=exact_topk, quant_topk=quant_topk,
                exact=oracle.outputs(q, pos, req, exact_topk),
                quant=oracle.outputs(q, pos, req, quant_topk, roundtrip(kv, oracle.swa), roundtrip(kv, oracle.csa),
                                     roundtrip(kv, oracle.hca)))


def test_indexer_recall_against_exact_scores(run):
    got = recall(run["step_topk"], run["exact_topk"])
    assert EXACT_RECALL[run["cfg"].index_format] <= got < 1, got  # < 1: the quantization is not vacuous


def test_indexer_matches_the_quantized_recomputation(run):
    """Same codes on both sides: only float32-vs-float64 near-ties may differ."""
    assert recall(run["step_topk"], run["quant_topk"]) >= 0.99
    same = sum(a == b for a, b in zip(run["step_topk"], run["quant_topk"]))
    assert same >= 0.95 * len(run["quant_topk"])


@pytest.mark.parametrize("path", ["swa", "hca"])
def test_paths_without_top_k(run, path):
    got = getattr(run["out"], path)
    assert 0 < rel(got, run["exact"][path]) < EXACT_ERR
    assert rel(got, run["quant"][path]) < SAME_ERR


@pytest.mark.parametrize("path", ["csa", "layer"])
def test_paths_through_top_k(run, path):
    """Over the tokens whose top-k set equals the reference's (the others attend other rows)."""
    got = getattr(run["out"], path)
    exact = torch.tensor([a == b for a, b in zip(run["step_topk"], run["exact_topk"])])
    quant = torch.tensor([a == b for a, b in zip(run["step_topk"], run["quant_topk"])])
    assert exact.sum() >= 100
    assert 0 < rel(got[exact], run["exact"][path][exact]) < EXACT_ERR
    assert rel(got[quant], run["quant"][path][quant]) < SAME_ERR
