"""Configuration of the layer-step reference (``pipeline.py``): shapes, ratios, table sizes.

``LayerConfig.check()`` raises typed errors from ``kvformats.errors`` before any cache is
allocated or written, so a bad configuration never leaves half-written state behind.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvformats.errors import InputError

INDEX_FORMATS = ("mxfp4_indexer", "fp8_indexer")
CSA_RATIO = 4
HCA_RATIO = 128


@attrs.define(frozen=True)
class LayerConfig:
    """Shapes of one DeepSeek V4 attention layer's cache side (defaults: V4-Flash)."""

    heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64
    index_heads: int = 64
    index_dim: int = 128
    window: int = 128
    topk: int = 512
    page_size: int = 64
    index_format: str = "mxfp4_indexer"
    requests: int = 1
    max_context: int = 8192
    hidden: int = 1024
    out_groups: int = 8
    sink: bool = True
    rms_eps: float = 1e-6
    # Compressor-state pages per request: 0 keeps the whole context (any chunk size); a small
    # ring (page j at table column j % ring) holds only the windows decode needs, for steps of
    # one token per request (the decode benchmark at large batch x context).
    state_ring_pages: int = 0
    query_chunk: int = 256  # query tokens per read/attention chunk (bounds the workspaces)
    keep_scores: bool = True  # return the indexer scores [T, csa_rows] (tests, quality report)

    @property
    def csa_rows(self) -> int:
        """Compressed CSA rows a request can hold (one per 4 positions)."""
        return self.max_context // CSA_RATIO

    @property
    def hca_rows(self) -> int:
        return self.max_context // HCA_RATIO

    def check(self) -> "LayerConfig":
        for name in ("heads", "head_dim", "rope_dim", "index_heads", "index_dim", "window", "topk",
                     "page_size", "requests", "max_context", "hidden", "out_groups", "query_chunk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"{name} must be a positive int, got {v!r}")
        if self.index_format not in INDEX_FORMATS:
            raise InputError(f"index_format must be one of {', '.join(INDEX_FORMATS)}, got {self.index_format!r}")
        if self.rope_dim % 2 or (self.head_dim - self.rope_dim) % 64 or self.head_dim <= self.rope_dim:
            raise InputError(f"head_dim - rope_dim must be a positive multiple of 64 and rope_dim even, "
                             f"got head_dim={self.head_dim}, rope_dim={self.rope_dim}")
        if self.index_dim != 128:
            raise InputError(f"index_dim must be 128 (the indexer query preparation's width), got {self.index_dim}")
        if self.max_context % HCA_RATIO or self.max_context % self.page_size:
            raise InputError(f"max_context must be a multiple of {HCA_RATIO} and of page_size "
                             f"({self.page_size}), got {self.max_context}")
        if self.topk > self.csa_rows:
            raise InputError(f"topk ({self.topk}) is larger than the compressed context "
                             f"(max_context / {CSA_RATIO} = {self.csa_rows} rows)")
        if self.heads % self.out_groups or self.head_dim % 128:
            raise InputError(f"heads ({self.heads}) must split into out_groups ({self.out_groups}) and "
                             f"head_dim ({self.head_dim}) into 128-wide quantization groups")
        need = -(-HCA_RATIO // self.page_size) + 2
        if self.state_ring_pages and not need <= self.state_ring_pages <= self.max_context // self.page_size:
            raise InputError(f"state_ring_pages must be 0 or in [{need}, max_context / page_size] (the HCA window "
                             f"of {HCA_RATIO} positions plus the current page), got {self.state_ring_pages}")
        if self.window > self.max_context:
            raise InputError(f"window ({self.window}) is larger than max_context ({self.max_context})")
        return self


def tiny_config(**overrides) -> LayerConfig:
    """Small shapes for CPU tests and the quality report."""
    base: dict[str, Any] = dict(heads=4, head_dim=128, rope_dim=64, index_heads=4, index_dim=128, window=16, topk=8,
                page_size=16, requests=2, max_context=256, hidden=64, out_groups=2)
    base.update(overrides)
    return LayerConfig(**base)
