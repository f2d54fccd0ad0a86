"""Paged caches of the layer-step reference and their block tables.

Every group has its own block table ``[requests, pages]`` whose entries are a random
permutation of the cache's pages, so no request's rows are contiguous (as in an engine). The
compressor states keep every page of the context for readability; an engine keeps only the
pages its windows still need (``block_table_base_offsets``).
"""

from __future__ import annotations

import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.dsv4_layer.pipeline_config import CSA_RATIO, HCA_RATIO, LayerConfig
from kvformats.formats import CompressorState, Fp8DsMla, Fp8Indexer, Mxfp4Indexer


def _table(requests: int, pages: int, gen: torch.Generator, device, ring: int = 0) -> torch.Tensor:
    """int64 ``[requests, pages]``: a random permutation of ``requests * pages`` page ids, or of
    ``requests * ring`` ids with column j holding the request's page ``j % ring``."""
    if not ring:
        return torch.randperm(requests * pages, generator=gen).view(requests, pages).to(device)
    phys = torch.randperm(requests * ring, generator=gen).view(requests, ring)
    return phys[:, torch.arange(pages) % ring].contiguous().to(device)


class LayerCaches:
    """SWA, CSA, HCA and indexer caches plus the three compressor states, with their tables."""

    def __init__(self, cfg: LayerConfig, *, device, seed: int = 0):
        g = torch.Generator().manual_seed(seed + 1)
        r, ps = cfg.requests, cfg.page_size
        self.kv_layout = Fp8DsMla(head_dim=cfg.head_dim, rope_dim=cfg.rope_dim, page_size=ps)
        index_cls = Mxfp4Indexer if cfg.index_format == "mxfp4_indexer" else Fp8Indexer
        self.index_layout = index_cls(head_dim=cfg.index_dim, page_size=ps)
        self.csa_state_layout = CompressorState(head_dim=cfg.head_dim, ratio=CSA_RATIO, page_size=ps)
        self.idx_state_layout = CompressorState(head_dim=cfg.index_dim, ratio=CSA_RATIO, page_size=ps)
        self.hca_state_layout = CompressorState(head_dim=cfg.head_dim, ratio=HCA_RATIO, page_size=ps)

        ctx_pages = cfg.max_context // ps
        csa_pages = -(-cfg.csa_rows // ps)
        hca_pages = -(-cfg.hca_rows // ps)
        self.swa_table = _table(r, ctx_pages, g, device)
        self.csa_table = _table(r, csa_pages, g, device)  # shared by the CSA rows and the indexer rows
        self.hca_table = _table(r, hca_pages, g, device)
        ring = cfg.state_ring_pages
        state_pages = ring or ctx_pages
        self.csa_state_table = _table(r, ctx_pages, g, device, ring)
        self.idx_state_table = _table(r, ctx_pages, g, device, ring)
        self.hca_state_table = _table(r, ctx_pages, g, device, ring)

        self.swa = self.kv_layout.allocate(r * ctx_pages, device=device)
        self.csa = self.kv_layout.allocate(r * csa_pages, device=device)
        self.hca = self.kv_layout.allocate(r * hca_pages, device=device)
        self.index = self.index_layout.allocate(r * csa_pages, device=device)
        self.csa_state = self.csa_state_layout.allocate(r * state_pages, device=device)
        self.idx_state = self.idx_state_layout.allocate(r * state_pages, device=device)
        self.hca_state = self.hca_state_layout.allocate(r * state_pages, device=device)
        self.page_size = ps

    def state_slots(self, positions, req, which: str, backend: str) -> torch.Tensor:
        table = {"csa": self.csa_state_table, "index": self.idx_state_table, "hca": self.hca_state_table}[which]
        return dsv4.table_slot_mapping(positions=positions, req_indices=req, block_table=table,
                                       page_size=self.page_size, backend=backend)

    def tensors(self) -> dict:
        """Every cache tensor by name (to compare two runs' bytes)."""
        return {"swa": self.swa, "csa": self.csa, "hca": self.hca, "index": self.index,
                "csa_state": self.csa_state, "idx_state": self.idx_state, "hca_state": self.hca_state}
