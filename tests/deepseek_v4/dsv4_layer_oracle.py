"""An independent recomputation of the layer step (kvformats.dsv4_layer.pipeline) for its tests.

It shares only the format codecs with the library (``layout.encode`` / ``layout.decode``, used
to quantize rows the way a cache stores them); everything else is written here, plainly, in
float64 from the spec's definitions: RoPE (GPT-J pairs on the last ``rope_dim`` dims), RMSNorm,
the Sylvester Hadamard transform, softmax pooling of the compressor windows, the indexer's
scores, its top-k, which rows each token sees, and the attention with a sink. No op of
kvformats.deepseek_v4 runs here, so a bug in the step's own scoring, top-k or attention cannot
hide by appearing on both sides of a comparison.
"""

from __future__ import annotations

import math

import torch

CSA, HCA = 4, 128
F64 = torch.float64


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(F64)


def rope(x: torch.Tensor, pos: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Rotate pairs (x[n + 2i], x[n + 2i + 1]) of the last ``rope_dim`` dims by pos * 10000^(-2i/rope_dim)."""
    x = x.to(F64).clone()
    nope = x.shape[-1] - rope_dim
    freq = 10000.0 ** (-2.0 * torch.arange(rope_dim // 2, dtype=F64) / rope_dim)
    ang = pos.to(F64).view(-1, *[1] * (x.dim() - 2), 1) * freq
    even, odd = x[..., nope::2].clone(), x[..., nope + 1::2].clone()
    x[..., nope::2] = even * ang.cos() - odd * ang.sin()
    x[..., nope + 1::2] = even * ang.sin() + odd * ang.cos()
    return x


def rms_norm(x: torch.Tensor, weight, eps: float) -> torch.Tensor:
    x = x.to(F64)
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(F64)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """bf16-rounded Sylvester-order Walsh-Hadamard transform of the last dim, scaled by D^-1/2."""
    h = torch.ones(1, 1, dtype=F64)
    while h.shape[0] < x.shape[-1]:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return bf16(bf16(x) @ h / math.sqrt(x.shape[-1]))


def pooled_rows(x, w_kv, w_score, ape, norm, ratio: int, rows: int, eps: float, rope_dim: int) -> torch.Tensor:
    """bf16 ``[rows, h]`` compressed rows of one request's activations ``x [L, hidden]``: row i
    pools positions ``i*ratio - (ratio if CSA) .. i*ratio + ratio - 1`` (a CSA window's older
    half uses the first half of each state, its newer half the second), softmax over positions
    per feature of ``score + ape[p % ratio]``, RMSNorm with ``norm``, RoPE at ``i * ratio``."""
    kv = x.to(F64) @ w_kv.to(F64)
    score = x.to(F64) @ w_score.to(F64) + ape.to(F64)[torch.arange(len(x)) % ratio]
    h = norm.shape[0]
    out = torch.zeros(rows, h, dtype=F64)
    for i in range(min(rows, len(x) // ratio)):
        new = torch.arange(i * ratio, i * ratio + ratio)
        if ratio == CSA:
            old = new[new >= ratio] - ratio
            k = torch.cat([kv[old, :h], kv[new, h:]])
            s = torch.cat([score[old, :h], score[new, h:]])
        else:
            k, s = kv[new], score[new]
        out[i] = (torch.softmax(s, 0) * k).sum(0)
    out = rope(rms_norm(out, norm, eps), torch.arange(rows) * ratio, rope_dim)
    return bf16(out)


def roundtrip(layout, rows: torch.Tensor) -> torch.Tensor:
    """``rows [..., d]`` stored in ``layout`` (its codec) and read back, float64."""
    flat = rows.reshape(-1, rows.shape[-1]).to(torch.bfloat16)
    cache = layout.allocate(-(-flat.shape[0] // layout.page_size))
    slots = torch.arange(flat.shape[0])
    layout.encode(flat, cache, slots)
    return layout.decode(cache, slots).to(F64).view(rows.shape)


def scores(q: torch.Tensor, keys: torch.Tensor, head_w: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """``[T, N]``: sum over heads of ``w[t, h] * max(q[t, h] . k[t, n], 0)``; -inf where not seen."""
    s = torch.zeros(keys.shape[:2], dtype=F64)
    for h in range(q.shape[1]):
        s += head_w[:, h, None] * torch.clamp((keys * q[:, h, None, :]).sum(-1), min=0)
    return torch.where(seen, s, -math.inf)


def best_rows(s: torch.Tensor, k: int) -> list[set]:
    """Per token, the set of the (at most) k highest-scoring seen rows."""
    order = torch.argsort(s, dim=1, descending=True, stable=True)
    return [{int(i) for i in row[:k] if s[t, i] > -math.inf} for t, row in enumerate(order)]


def attend(q: torch.Tensor, rows: torch.Tensor, seen: torch.Tensor, sink) -> torch.Tensor:
    """``[T, H, D]``: per head, softmax over the seen rows (and the sink, a logit with no value)
    of ``q . row / sqrt(D)``, times the rows (keys are the values)."""
    t, heads, d = q.shape
    out = torch.zeros(t, heads, d, dtype=F64)
    for i in range(t):
        r = rows[i][seen[i]]
        if not len(r):
            continue  # nothing to attend: zero output (the sink has no value row)
        logit = q[i] @ r.T / math.sqrt(d)  # [H, n]
        if sink is not None:
            logit = torch.cat([logit, sink.to(F64)[:, None]], 1)
        out[i] = torch.softmax(logit, 1)[:, :len(r)] @ r
    return out


class Oracle:
    """Rows and queries of a step run over ``x, pos, req`` (every token the caches hold, by
    request, positions 0..L-1 in order), recomputed from the step's weights and configuration."""

    def __init__(self, cfg, weights, x, pos, req):
        self.cfg, self.w = cfg, weights
        d, rd, eps = cfg.head_dim, cfg.rope_dim, cfg.rms_eps
        self.swa, self.csa, self.hca, self.index = [], [], [], []
        for r in range(cfg.requests):
            mine = req == r
            xr = x[mine][torch.argsort(pos[mine])].to(F64)
            assert torch.equal(torch.sort(pos[mine]).values, torch.arange(len(xr)))  # a test's own setup
            kv = torch.zeros(cfg.max_context, d, dtype=F64)
            kv[:len(xr)] = bf16(rope(bf16(xr @ weights.kv.to(F64)), torch.arange(len(xr)), rd))
            self.swa.append(kv)
            w = weights
            self.csa.append(pooled_rows(xr, w.csa_kv, w.csa_score, w.csa_ape, w.csa_norm, CSA, cfg.csa_rows, eps, rd))
            self.hca.append(pooled_rows(xr, w.hca_kv, w.hca_score, w.hca_ape, w.hca_norm, HCA, cfg.hca_rows, eps, rd))
            idx = pooled_rows(xr, w.idx_kv, w.idx_score, w.idx_ape, w.idx_norm, CSA, cfg.csa_rows, eps, rd)
            self.index.append(hadamard(idx))
        self.swa, self.csa, self.hca, self.index = map(torch.stack, (self.swa, self.csa, self.hca, self.index))

    def queries(self, x, pos):
        """(attention q ``[T, H, D]``, indexer q ``[T, Hi, 128]``, head weights ``[T, Hi]``)."""
        cfg, w = self.cfg, self.w
        x = x.to(F64)
        q = bf16(x @ w.q.to(F64)).view(len(x), cfg.heads, cfg.head_dim)
        q = bf16(rope(rms_norm(q, None, cfg.rms_eps), pos, cfg.rope_dim))
        iq = bf16(x @ w.idx_q.to(F64)).view(len(x), cfg.index_heads, cfg.index_dim)
        iq = hadamard(bf16(rope(iq, pos, cfg.rope_dim)))
        head_w = (x @ w.idx_w.to(F64)) / math.sqrt(cfg.index_dim) / math.sqrt(cfg.index_heads)
        return q, iq, head_w

    def select(self, iq, head_w, pos, req, index=None) -> list[set]:
        """The indexer's top-k local CSA rows of each token (over ``index`` rows, default exact)."""
        index = self.index if index is None else index
        seen = torch.arange(self.cfg.csa_rows)[None, :] < ((pos + 1) // CSA)[:, None]
        return best_rows(scores(iq, index[req], head_w, seen), self.cfg.topk)

    def outputs(self, q, pos, req, chosen: list[set], swa=None, csa=None, hca=None) -> dict:
        """Per-path and whole-layer attention of the tokens (rows default: exact bf16)."""
        cfg = self.cfg
        swa, csa, hca = (self.swa if swa is None else swa), (self.csa if csa is None else csa), \
            (self.hca if hca is None else hca)
        win = pos[:, None] - cfg.window + 1 + torch.arange(cfg.window)
        paths = {"swa": (swa[req[:, None], win.clamp_min(0)], win >= 0)}
        idx = torch.tensor([sorted(c) + [0] * (cfg.topk - len(c)) for c in chosen])
        paths["csa"] = (csa[req[:, None], idx], torch.arange(cfg.topk)[None, :] < torch.tensor(
            [len(c) for c in chosen])[:, None])
        paths["hca"] = (hca[req], torch.arange(cfg.hca_rows)[None, :] < ((pos + 1) // HCA)[:, None])
        sink = self.w.sink if cfg.sink else None
        out = {name: attend(q, rows, seen, sink) for name, (rows, seen) in paths.items()}
        out["layer"] = attend(q, torch.cat([p[0] for p in paths.values()], 1),
                              torch.cat([p[1] for p in paths.values()], 1), sink)
        return out
