"""Synthetic layer inputs with the structure real attention keys have, for the quality report.

``activations(cfg, lengths, seed)`` returns float32 ``x [sum(lengths), hidden]`` (requests one
after the other) built as:

- a Gaussian base, plus a slowly varying component shared along each request's positions
  (neighbouring tokens resemble each other, as in text);
- outlier channels: ``outlier_channels`` hidden channels scaled by ``outlier_scale``, so that
  every projection (keys, compressor inputs, indexer keys) has a few large channels, which is
  what stresses per-tile scales;
- heavy-hitter tokens: the first token of each request and ``heavy_fraction`` of the others
  scaled by ``heavy_scale`` (attention-sink-like tokens whose keys dominate their neighbours).

RoPE is not in the activations: the pipeline rotates q, kv and the compressed rows itself.
"""

from __future__ import annotations

import torch


def activations(hidden: int, lengths, *, seed: int = 0, outlier_channels: int = 4, outlier_scale: float = 12.0,
                heavy_fraction: float = 0.02, heavy_scale: float = 6.0, smooth: float = 0.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    parts = []
    outliers = torch.randperm(hidden, generator=g)[:outlier_channels]
    for n in lengths:
        base = torch.randn(n, hidden, generator=g)
        drift = torch.cumsum(torch.randn(n, hidden, generator=g), 0) / torch.arange(1, n + 1).sqrt()[:, None]
        x = base + smooth * drift
        x[:, outliers] *= outlier_scale
        heavy = torch.rand(n, generator=g) < heavy_fraction
        heavy[0] = True
        x[heavy] *= heavy_scale
        parts.append(x)
    return torch.cat(parts)
