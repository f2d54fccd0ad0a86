"""Independent plain-Python oracles for the DeepSeek V4 operations: scalar loops in float64 (or
float32 where the op defines float32 rounding), no kvformats code."""

from __future__ import annotations

import math

import torch


def table_slot(table, r, pos, page_size, base=None, num_pages=None) -> int:
    """Slot of position ``pos`` of request ``r`` through a nested-list table; −1 when missing."""
    if pos < 0 or r < 0 or r >= len(table):
        return -1
    pidx = pos // page_size - (base[r] if base is not None else 0)
    if pidx < 0 or pidx >= len(table[r]):
        return -1
    entry = table[r][pidx]
    if entry < 0 or (num_pages is not None and entry >= num_pages):
        return -1
    return entry * page_size + pos % page_size


def pool(state, ratio, p, r, table, base, weight, eps) -> list[float]:
    """float64 softmax pooling + RMSNorm of the window ending at p (state: [pages][rows][2W] lists)."""
    pages, rows = len(state), len(state[0])
    h = len(weight)
    w_state = len(state[0][0]) // 2
    overlap = ratio == 4
    L = ratio * (2 if overlap else 1)
    entries = []
    for o in range(L):
        s = table_slot(table, r, p - L + 1 + o, rows, base, pages)
        if s >= 0:
            off = h if overlap and o >= ratio else 0
            row = state[s // rows][s % rows]
            entries.append((row[off:off + h], row[w_state + off:w_state + off + h]))
    if not entries:
        return [0.0] * h
    pooled = []
    for d in range(h):
        m = max(sc[d] for _, sc in entries)
        ex = [math.exp(sc[d] - m) for _, sc in entries]
        z = sum(ex)
        pooled.append(sum(e / z * kv[d] for e, (kv, _) in zip(ex, entries)))
    inv = 1.0 / math.sqrt(sum(c * c for c in pooled) / h + eps)
    return [c * inv * w for c, w in zip(pooled, weight)]


def rope(x, p, cos_sin, inverse=False) -> list[float]:
    """float64 GPT-J rotation of the tail of one vector."""
    rope_dim = len(cos_sin[0])
    half = rope_dim // 2
    nope = len(x) - rope_dim
    out = list(x)
    for i in range(half):
        c, s = cos_sin[p][i], cos_sin[p][half + i]
        s = -s if inverse else s
        e, o = x[nope + 2 * i], x[nope + 2 * i + 1]
        out[nope + 2 * i] = e * c - o * s
        out[nope + 2 * i + 1] = e * s + o * c
    return out


def hadamard(x) -> list[float]:
    """float64 natural-order Hadamard with scale n^-0.5."""
    n = len(x)
    return [sum(v if bin(i & j).count("1") % 2 == 0 else -v for i, v in enumerate(x)) * n ** -0.5
            for j in range(n)]


def rms(x, eps, weight=None) -> list[float]:
    inv = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * inv * (1.0 if weight is None else weight[i]) for i, v in enumerate(x)]


def nested(t: torch.Tensor):
    return t.double().tolist() if t.is_floating_point() else t.tolist()
