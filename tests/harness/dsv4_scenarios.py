"""Paged batches for the compress tests: several requests with their own block tables (base
offsets, missing pages), a random compressor state, sentinel-filled target caches with padded
page strides, and the tokens of one engine step."""

from __future__ import annotations

import attrs
import torch

from kvformats import deepseek_v4 as dsv4
from kvformats.formats import CompressorState
from tests.harness import dsv4_oracle as orc
from kvformats.testing.strategies import storage_bytes

SENTINEL = 0xA5


@attrs.define
class Batch:
    ratio: int
    state: torch.Tensor
    state_table: torch.Tensor
    base: torch.Tensor
    positions: torch.Tensor
    req: torch.Tensor
    state_slots: torch.Tensor
    target_table: torch.Tensor
    target_slots: torch.Tensor
    weight: torch.Tensor
    cos_sin: torch.Tensor
    eps: float = 1e-6

    def kwargs(self, target_name="kv_slots"):
        return dict(positions=self.positions, req_indices=self.req, state_slots=self.state_slots,
                    block_table=self.state_table, rms_weight=self.weight, rms_eps=self.eps,
                    cos_sin_cache=self.cos_sin, block_table_base_offsets=self.base,
                    **{target_name: self.target_slots})


def make_batch(ratio: int, head_dim: int, target_page_size: int, *, seed: int = 0, rope_dim: int = 64,
               seq_lens=(13, 40, 9), new_tokens=(13, 6, 9), base=(0, 2, 0), missing=((1, 8), (2, 1))) -> Batch:
    """Requests with ``seq_lens`` positions, of which the last ``new_tokens`` are this step's
    tokens. State table of request r starts at logical page ``base[r]`` (older pages dropped);
    ``missing`` lists (request, logical page) whose entry is −1. Target (compressed) slots come
    from a separate table, one entry per ``ratio`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lay = CompressorState(head_dim=head_dim, ratio=ratio, page_size=4 if ratio == 4 else 8)
    rows = lay.page_size
    max_pages = max(-(-n // rows) for n in seq_lens) + 1
    num_pages = len(seq_lens) * max_pages + 2
    state = torch.randn(num_pages, rows, 2 * lay.width, generator=g)
    state[:, :, lay.width:] *= 0.5
    perm = torch.randperm(num_pages, generator=g)
    table = torch.full((len(seq_lens), max_pages), -1, dtype=torch.int64)
    for r, n in enumerate(seq_lens):
        for lp in range(base[r], -(-n // rows)):
            table[r, lp - base[r]] = int(perm[r * max_pages + lp])
    for r, lp in missing:
        if 0 <= lp - base[r] < max_pages:
            table[r, lp - base[r]] = -1
    tgt_pages = max(-(-(n // ratio + 1) // target_page_size) for n in seq_lens)
    tgt_table = torch.randperm(len(seq_lens) * tgt_pages, generator=g).reshape(len(seq_lens), tgt_pages)
    pos, req = [], []
    for r, (n, k) in enumerate(zip(seq_lens, new_tokens)):
        pos += list(range(n - k, n))
        req += [r] * k
    positions, req_t = torch.tensor(pos), torch.tensor(req)
    base_t = torch.tensor(base)
    tl = table.tolist()
    state_slots = torch.tensor([orc.table_slot(tl, r, p, rows, base, num_pages) for p, r in zip(pos, req)])
    ttl = tgt_table.tolist()
    target_slots = torch.tensor([orc.table_slot(ttl, r, p // ratio, target_page_size) for p, r in zip(pos, req)])
    weight = 1 + 0.1 * torch.randn(head_dim, generator=g)
    cos_sin = dsv4.cos_sin_cache(rope_dim, max(seq_lens) + 1)
    return Batch(ratio, state, table, base_t, positions, req_t, state_slots, tgt_table, target_slots, weight, cos_sin)


def sentinel_cache(layout, num_pages: int, extra_stride: int = 64) -> torch.Tensor:
    cache = layout.allocate(num_pages, page_stride=layout.page_bytes + extra_stride)
    storage_bytes(cache).fill_(SENTINEL)
    return cache


def writers(b: Batch) -> torch.Tensor:
    p = b.positions
    return ((p + 1) % b.ratio == 0) & (b.state_slots >= 0) & (b.target_slots >= 0)


def state_c():
    """Example C: ratio 4, head_dim 2 (W = 4), tokens 0..7 saved through save_compressor_state."""
    state = torch.zeros(2, 4, 8)
    kv = torch.tensor([[0.5 * p + j for j in range(4)] for p in range(8)])
    score = torch.tensor([[0.1 * ((3 * p + j) % 5) for j in range(4)] for p in range(8)])
    ape = torch.tensor([[0.01 * (10 * r + j) for j in range(4)] for r in range(4)])
    dsv4.save_compressor_state(kv, score, ape, state, ratio=4, positions=torch.arange(8),
                               req_indices=torch.zeros(8, dtype=torch.int64), block_table=torch.tensor([[0, 1]]))
    return state
