"""Random weights with the layer's shapes (a stand-in for a checkpoint: float32, seeded)."""

from __future__ import annotations

import math

import attrs
import torch

from kvformats.dsv4_layer.pipeline_config import CSA_RATIO, HCA_RATIO, LayerConfig


@attrs.define
class LayerWeights:
    q: torch.Tensor          # [hidden, heads * head_dim]
    kv: torch.Tensor         # [hidden, head_dim]
    csa_kv: torch.Tensor     # [hidden, 2 * head_dim] (overlapping windows: two halves)
    csa_score: torch.Tensor
    csa_ape: torch.Tensor    # [4, 2 * head_dim]
    csa_norm: torch.Tensor   # [head_dim]
    hca_kv: torch.Tensor     # [hidden, head_dim]
    hca_score: torch.Tensor
    hca_ape: torch.Tensor    # [128, head_dim]
    hca_norm: torch.Tensor
    idx_q: torch.Tensor      # [hidden, index_heads * index_dim]
    idx_w: torch.Tensor      # [hidden, index_heads]
    idx_kv: torch.Tensor     # [hidden, 2 * index_dim]
    idx_score: torch.Tensor
    idx_ape: torch.Tensor    # [4, 2 * index_dim]
    idx_norm: torch.Tensor   # [index_dim]
    sink: torch.Tensor       # [heads]

    @classmethod
    def random(cls, cfg: LayerConfig, *, device="cpu", seed: int = 0) -> "LayerWeights":
        g = torch.Generator().manual_seed(seed)
        s = 1.0 / math.sqrt(cfg.hidden)

        def mat(cols, scale=s):
            return (torch.randn(cfg.hidden, cols, generator=g) * scale).to(device)

        def vec(*shape, scale=0.1, offset=0.0):
            return (offset + scale * torch.randn(*shape, generator=g)).to(device)

        d, i = cfg.head_dim, cfg.index_dim
        return cls(q=mat(cfg.heads * d), kv=mat(d), csa_kv=mat(2 * d), csa_score=mat(2 * d),
                   csa_ape=vec(CSA_RATIO, 2 * d), csa_norm=vec(d, offset=1.0), hca_kv=mat(d), hca_score=mat(d),
                   hca_ape=vec(HCA_RATIO, d), hca_norm=vec(d, offset=1.0), idx_q=mat(cfg.index_heads * i),
                   idx_w=mat(cfg.index_heads), idx_kv=mat(2 * i), idx_score=mat(2 * i), idx_ape=vec(CSA_RATIO, 2 * i),
                   idx_norm=vec(i, offset=1.0), sink=vec(cfg.heads, scale=1.0))
