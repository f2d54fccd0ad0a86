"""Layer-step reference: one DeepSeek V4 attention layer's cache side on kvformats' public ops.

Not a model: random weights stand in for the checkpoint, and every matmul is plain torch. The
point is the order of the cache ops and the tensors passed between them, for a batch of
requests with paged block tables. One ``step`` (prefill chunk or decode batch) runs:

    projections (torch)
      -> slots: table_slot_mapping (SWA, compressor states, CSA/HCA/indexer rows)
      -> swa_insert (q RMSNorm + RoPE, kv -> fp8_ds_mla SWA cache)
      -> save_compressor_state x3 (CSA, indexer, HCA)
      -> csa_compress_kv_insert, indexer_compress_insert, hca_compress_kv_insert
      -> prepare_indexer_q_{mxfp4,fp8} -> decode_topk(indexer) -> scores (torch) -> top-k
      -> global_topk_indices_and_lens (CSA top-k, HCA rows) -> decode_topk (CSA, HCA, SWA)
      -> sparse attention in float32 (torch; optional sink)
      -> inv_rope_fp8_quant (output for the o-projection)

A real V4 layer is either a CSA or an HCA layer; this reference runs both compressed paths in
one step so that every op is exercised, and reports each path's attention output plus the
attention over all rows together ("layer"). The decode step has static shapes and no host reads
(no ``.item()``, ``nonzero``, data-dependent sizes), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.dsv4_layer.pipeline_attention import sparse_attention
from kvformats.dsv4_layer.pipeline_caches import LayerCaches
from kvformats.dsv4_layer.pipeline_config import CSA_RATIO, HCA_RATIO, LayerConfig
from kvformats.dsv4_layer.pipeline_weights import LayerWeights
from kvformats.errors import InputError
from kvformats.numerics.codes import e2m1_decode, unpack_nibbles


@attrs.define
class StepOutput:
    """Attention outputs (float32 ``[T, H, D]``) per path, the indexer's local top-k rows
    (int32 ``[T, K]``, −1 = none), the FP8 output of ``inv_rope_fp8_quant`` and the cache slots
    each path read (``reads``: name -> int ``[T, N]``, −1 = none)."""

    swa: torch.Tensor
    csa: torch.Tensor
    hca: torch.Tensor
    layer: torch.Tensor
    topk: torch.Tensor
    index_scores: torch.Tensor | None  # kept only with keep_scores
    out_fp8: tuple
    reads: dict


def _mxfp4_query(q_packed, q_scale, dim: int) -> torch.Tensor:
    """float32 ``[T, H, dim]`` values of prepare_indexer_q_mxfp4's packed queries."""
    vals = e2m1_decode(unpack_nibbles(q_packed)).float()
    shifts = torch.arange(dim // 32, device=q_scale.device, dtype=torch.int32) * 8
    e = ((q_scale[..., None] >> shifts) & 0xFF).float() - 127.0
    return (vals.unflatten(-1, (dim // 32, 32)) * torch.exp2(e)[..., None]).flatten(-2)


class LayerStep:
    """Caches, weights and the step function of one layer; ``backend`` goes to every op."""

    def __init__(self, cfg: LayerConfig, *, device="cpu", seed: int = 0, backend: str = "auto",
                 weights: LayerWeights | None = None):
        self.cfg = cfg.check()
        self.device = torch.device(device)
        self.backend = backend
        self.weights = weights or LayerWeights.random(cfg, device=self.device, seed=seed)
        self.caches = LayerCaches(cfg, device=self.device, seed=seed)
        self.cos_sin = dsv4.cos_sin_cache(cfg.rope_dim, cfg.max_context + 1).to(self.device)
        self.phase_hook = None  # called with a phase name at the end of each phase (benchmarks)

    def _mark(self, name: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name)

    def check_batch(self, x, positions, req) -> None:
        """Shapes and ranges of a step's inputs (host reads: call before capture, not inside; a
        step on CPU tensors calls it itself)."""
        cfg = self.cfg
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != cfg.hidden:
            raise InputError(f"x must be a [T, {cfg.hidden}] tensor, got {getattr(x, 'shape', type(x))}")
        for name, t in (("positions", positions), ("req", req)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (x.shape[0],):
                raise InputError(f"{name} must be int64 [{x.shape[0]}], got {getattr(t, 'shape', type(t))}")
        if x.shape[0] and (int(positions.min()) < 0 or int(positions.max()) >= cfg.max_context):
            raise InputError(f"positions must lie in [0, {cfg.max_context}) (max_context)")
        if x.shape[0] and (int(req.min()) < 0 or int(req.max()) >= cfg.requests):
            raise InputError(f"req must lie in [0, {cfg.requests}) (requests)")
        if cfg.state_ring_pages and x.shape[0]:
            self._check_ring(positions, req)

    def _check_ring(self, positions, req) -> None:
        """Each request's positions, and the older positions their compressor windows read, must
        fit in the state ring: a longer chunk would overwrite (or repeat) ring rows the same step
        still reads, after the SWA cache was already written."""
        cfg, ps, ring = self.cfg, self.cfg.page_size, self.cfg.state_ring_pages
        lo = torch.full((cfg.requests,), cfg.max_context, dtype=torch.int64, device=positions.device)
        hi = torch.full((cfg.requests,), -1, dtype=torch.int64, device=positions.device)
        firsts = lo.scatter_reduce(0, req, positions, "amin").tolist()
        lasts = hi.scatter_reduce(0, req, positions, "amax").tolist()
        for r, (first, last) in enumerate(zip(firsts, lasts)):
            if last < 0:
                continue  # request r has no token in this step
            # oldest position a window of this chunk reads: its HCA group's start, or the older
            # half of an overlapping CSA window
            oldest = max(0, min(first // HCA_RATIO * HCA_RATIO, first // CSA_RATIO * CSA_RATIO - CSA_RATIO))
            pages = last // ps - oldest // ps + 1
            if pages > ring:
                raise InputError(f"request {r}: positions {first}..{last} need {pages} compressor-state pages "
                                 f"(from position {oldest}) but state_ring_pages is {ring}; split the chunk")

    def step(self, x: torch.Tensor, positions: torch.Tensor, req: torch.Tensor) -> StepOutput:
        cfg, w, c, b, cs = self.cfg, self.weights, self.caches, self.backend, self.cos_sin
        if not (isinstance(positions, torch.Tensor) and positions.is_cuda):
            self.check_batch(x, positions, req)  # host reads cost nothing here; a GPU caller checks first
        t = x.shape[0]
        if t == 0:
            return self._idle(x.device)
        xf = x.float()
        q = (xf @ w.q).view(t, cfg.heads, cfg.head_dim).to(torch.bfloat16).contiguous()
        kv = (xf @ w.kv).to(torch.bfloat16)
        self._mark("projections")

        # slots of this step's tokens in every group
        swa_slots = dsv4.table_slot_mapping(positions=positions, req_indices=req, block_table=c.swa_table,
                                            page_size=cfg.page_size, backend=b)
        csa_state_slots = c.state_slots(positions, req, "csa", b)
        idx_state_slots = c.state_slots(positions, req, "index", b)
        hca_state_slots = c.state_slots(positions, req, "hca", b)
        csa_slots = dsv4.table_slot_mapping(positions=positions, req_indices=req, block_table=c.csa_table,
                                            page_size=cfg.page_size, entry_stride=CSA_RATIO, backend=b)
        hca_slots = dsv4.table_slot_mapping(positions=positions, req_indices=req, block_table=c.hca_table,
                                            page_size=cfg.page_size, entry_stride=HCA_RATIO, backend=b)
        self._mark("slots")

        # writes
        dsv4.swa_insert(q, kv, c.swa, swa_slots, positions, cs, cfg.rms_eps, page_size=cfg.page_size, backend=b)
        self._mark("swa_insert")
        dsv4.save_compressor_state(xf @ w.csa_kv, xf @ w.csa_score, w.csa_ape, c.csa_state, ratio=CSA_RATIO,
                                   positions=positions, slots=csa_state_slots, backend=b)
        dsv4.save_compressor_state(xf @ w.idx_kv, xf @ w.idx_score, w.idx_ape, c.idx_state, ratio=CSA_RATIO,
                                   positions=positions, slots=idx_state_slots, backend=b)
        dsv4.save_compressor_state(xf @ w.hca_kv, xf @ w.hca_score, w.hca_ape, c.hca_state, ratio=HCA_RATIO,
                                   positions=positions, slots=hca_state_slots, backend=b)
        self._mark("save_state")
        common = dict(positions=positions, req_indices=req, rms_eps=cfg.rms_eps, cos_sin_cache=cs, backend=b)
        dsv4.csa_compress_kv_insert(c.csa_state, c.csa, state_slots=csa_state_slots, block_table=c.csa_state_table,
                                    rms_weight=w.csa_norm, kv_slots=csa_slots, kv_page_size=cfg.page_size, **common)
        dsv4.indexer_compress_insert(c.idx_state, c.index, index_format=cfg.index_format,
                                     state_slots=idx_state_slots, block_table=c.idx_state_table,
                                     rms_weight=w.idx_norm, index_slots=csa_slots, index_page_size=cfg.page_size,
                                     **common)
        dsv4.hca_compress_kv_insert(c.hca_state, c.hca, state_slots=hca_state_slots, block_table=c.hca_state_table,
                                    rms_weight=w.hca_norm, kv_slots=hca_slots, kv_page_size=cfg.page_size, **common)
        self._mark("compress")

        # reads and attention, a fixed number of query tokens at a time (bounded workspaces at
        # long prefill; a decode batch up to query_chunk tokens is one chunk)
        parts = [self.read_attend(q[i:i + cfg.query_chunk], xf[i:i + cfg.query_chunk],
                                  positions[i:i + cfg.query_chunk], req[i:i + cfg.query_chunk])
                 for i in range(0, t, cfg.query_chunk)]
        o: dict[str, Any] = {k: torch.cat([p_[k] for p_ in parts]) if parts[0][k] is not None else None
                             for k in parts[0]}
        o_all = o["layer"]
        out = dsv4.inv_rope_fp8_quant(o_all.to(torch.bfloat16), positions, cs, n_groups=cfg.out_groups,
                                      heads_per_group=cfg.heads // cfg.out_groups,
                                      tma_aligned_scales=cfg.head_dim == 512, backend=b)
        self._mark("out_quant")
        reads = {"swa": o["swa_read"], "csa": o["csa_read"], "hca": o["hca_read"]}
        return StepOutput(o["swa"], o["csa"], o["hca"], o_all, o["topk"], o["scores"], out, reads)

    def _idle(self, device) -> StepOutput:
        """The output of a step without tokens: every tensor with zero rows; no cache is touched."""
        cfg = self.cfg

        def empty(cols, dtype=torch.int32):
            return torch.zeros(0, cols, dtype=dtype, device=device)

        o = torch.zeros(0, cfg.heads, cfg.head_dim, device=device)
        # the reference backend: nothing to compute, and no kernel launch over zero tokens
        out = dsv4.inv_rope_fp8_quant(o.to(torch.bfloat16), empty(1, torch.int64)[:, 0], self.cos_sin,
                                      n_groups=cfg.out_groups, heads_per_group=cfg.heads // cfg.out_groups,
                                      tma_aligned_scales=cfg.head_dim == 512, backend="reference")
        scores = empty(cfg.csa_rows, torch.float32) if cfg.keep_scores else None
        reads = {"swa": empty(cfg.window, torch.int64), "csa": empty(cfg.topk), "hca": empty(cfg.hca_rows)}
        return StepOutput(o, o.clone(), o.clone(), o.clone(), empty(cfg.topk), scores, out, reads)

    def read_attend(self, q, xf, positions, req) -> dict:
        """Indexer, reads and float32 sparse attention for a chunk of query tokens."""
        cfg, w, c, b = self.cfg, self.weights, self.caches, self.backend
        # indexer: queries, scores over every visible compressed row, top-k
        topk, scores = self.index_topk(xf, positions, req)
        self._mark("indexer")

        # reads
        csa_rows_slots, _ = dsv4.global_topk_indices_and_lens(topk_indices=topk, req_indices=req,
                                                               block_table=c.csa_table, page_size=cfg.page_size,
                                                               backend=b)
        hca_local = visible_rows(positions, cfg.hca_rows, HCA_RATIO)
        hca_rows_slots, _ = dsv4.global_topk_indices_and_lens(topk_indices=hca_local, req_indices=req,
                                                              block_table=c.hca_table, page_size=cfg.page_size,
                                                              backend=b)
        swa_pos = positions[:, None] - cfg.window + 1 + torch.arange(cfg.window, device=positions.device)
        swa_read = dsv4.table_slot_mapping(positions=swa_pos.clamp_min(0).flatten(),
                                           req_indices=req[:, None].expand_as(swa_pos).flatten(),
                                           block_table=c.swa_table, page_size=cfg.page_size, backend=b)
        swa_read = torch.where(swa_pos >= 0, swa_read.view_as(swa_pos), -1)
        swa_rows = c.kv_layout.decode_topk(c.swa, swa_read, backend=b).float()
        csa_rows = c.kv_layout.decode_topk(c.csa, csa_rows_slots, backend=b).float()
        hca_rows = c.kv_layout.decode_topk(c.hca, hca_rows_slots, backend=b).float()
        self._mark("reads")

        # attention in float32 over the decoded rows (K = V: the MLA latent)
        qf = q.float()
        sink = w.sink if cfg.sink else None
        scale = 1.0 / math.sqrt(cfg.head_dim)
        o_swa = sparse_attention(qf, swa_rows, swa_read >= 0, scale, sink)
        o_csa = sparse_attention(qf, csa_rows, csa_rows_slots >= 0, scale, sink)
        o_hca = sparse_attention(qf, hca_rows, hca_rows_slots >= 0, scale, sink)
        o_all = sparse_attention(qf, torch.cat([swa_rows, csa_rows, hca_rows], 1),
                                 torch.cat([swa_read >= 0, csa_rows_slots >= 0, hca_rows_slots >= 0], 1),
                                 scale, sink)
        self._mark("attention")
        return {"swa": o_swa, "csa": o_csa, "hca": o_hca, "layer": o_all, "topk": topk,
                "scores": scores if cfg.keep_scores else None, "swa_read": swa_read, "csa_read": csa_rows_slots,
                "hca_read": hca_rows_slots}

    def index_topk(self, xf, positions, req):
        """Indexer: (local top-k int32 ``[T, K]`` (−1 = none), float32 scores ``[T, rows]``)."""
        cfg, w, c, b = self.cfg, self.weights, self.caches, self.backend
        t = xf.shape[0]
        iq = (xf @ w.idx_q).view(t, cfg.index_heads, cfg.index_dim).to(torch.bfloat16)
        hw = xf @ w.idx_w
        sm = 1.0 / math.sqrt(cfg.index_dim)
        hs = 1.0 / math.sqrt(cfg.index_heads)
        if cfg.index_format == "mxfp4_indexer":
            (qp, qs), hw = dsv4.prepare_indexer_q_mxfp4(iq, positions, self.cos_sin, hw, sm, hs, backend=b)
            qv = _mxfp4_query(qp, qs, cfg.index_dim)
        else:
            q8, hw = dsv4.prepare_indexer_q_fp8(iq, positions, self.cos_sin, hw, sm, hs, backend=b)
            qv = q8.float()
        local = visible_rows(positions, cfg.csa_rows, CSA_RATIO)
        slots, _ = dsv4.global_topk_indices_and_lens(topk_indices=local, req_indices=req, block_table=c.csa_table,
                                                     page_size=cfg.page_size, backend=b)
        keys = c.index_layout.decode_topk(c.index, slots, backend=b).float()
        scores = index_scores(qv, keys, hw, slots >= 0)
        return top_k(scores, cfg.topk), scores


def visible_rows(positions: torch.Tensor, rows: int, ratio: int) -> torch.Tensor:
    """int32 ``[T, rows]``: compressed row i where a token at p sees it (i < (p + 1) // ratio), else −1."""
    i = torch.arange(rows, device=positions.device, dtype=torch.int64)
    seen = i[None, :] < (positions[:, None] + 1) // ratio
    return torch.where(seen, i[None, :], -1).to(torch.int32)


def index_scores(q: torch.Tensor, keys: torch.Tensor, head_weights: torch.Tensor, valid: torch.Tensor):
    """float32 ``[T, N]``: ``sum_h w[t, h] * relu(q[t, h] . k[t, n])``, −inf where not valid."""
    logits = torch.einsum("thd,tnd->thn", q, keys).relu()
    s = (logits * head_weights[:, :, None]).sum(1)
    return s.masked_fill(~valid, float("-inf"))


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """int32 ``[T, k]`` local rows of the k best scores (−1 where fewer than k are visible)."""
    val, idx = torch.topk(scores, k, dim=1)
    return torch.where(torch.isfinite(val), idx, -1).to(torch.int32)
