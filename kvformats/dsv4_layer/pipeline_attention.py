"""Sparse attention over decoded cache rows, in float32 (the layer-step reference's core)."""

from __future__ import annotations

import torch


def sparse_attention(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, scale: float,
                     sink: torch.Tensor | None = None) -> torch.Tensor:
    """``q [T, H, D]``, ``rows [T, N, D]`` (keys = values), ``valid [T, N]`` -> ``[T, H, D]``.

    The optional per-head ``sink [H]`` is a logit with a zero value row: it only enlarges the
    softmax denominator. A token with no valid row (and no sink) gets a zero output, not NaN.
    """
    logits = torch.einsum("thd,tnd->thn", q, rows) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    m = logits.amax(-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.view(1, -1, 1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(logits - m)
    den = p.sum(-1, keepdim=True)
    if sink is not None:
        den = den + torch.exp(sink.view(1, -1, 1) - m)
    den = torch.where(den > 0, den, torch.ones_like(den))
    return torch.einsum("thn,tnd->thd", p / den, rows)
