"""Block-table addressing shared by the paged ops and the DeepSeek V4 operations (spec/upstream.md
§1.3): a position of a request maps to
``table[req, pos // page_size - base[req]] * page_size + pos % page_size``, or −1 when the
position is negative, the request or page index falls outside the table, or the entry is
negative ("missing"). tokenspeed's Triton helpers skip some of these checks (a −1 entry then
wraps to the last page); here every one of them gives −1.
"""

from __future__ import annotations

import torch


def table_slots(block_table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, page_size: int,
                base: torch.Tensor | None = None, num_pages: int | None = None) -> torch.Tensor:
    """int64 slots (same shape as ``pos``, ``req`` broadcast to it); −1 where missing."""
    req = req.long()
    pos = pos.long()
    if req.dim() < pos.dim():
        req = req.reshape(*req.shape, *([1] * (pos.dim() - req.dim()))).expand_as(pos)
    rows, width = block_table.shape
    pidx = torch.div(pos, page_size, rounding_mode="floor")
    if base is not None and rows:
        pidx = pidx - base.long()[req.clamp(0, rows - 1)]
    ok = (pos >= 0) & (req >= 0) & (req < rows) & (pidx >= 0) & (pidx < width)
    if rows == 0 or width == 0:
        return torch.full_like(pos, -1)
    entry = block_table.long()[req.clamp(0, rows - 1), pidx.clamp(0, width - 1)]
    ok &= entry >= 0
    if num_pages is not None:
        ok &= entry < num_pages
    return torch.where(ok, entry * page_size + pos % page_size, torch.full_like(pos, -1))


def request_of_token(query_start_loc: torch.Tensor, tokens: torch.Tensor, requests: int):
    """(request index, inside) of absolute token indices ``tokens`` given cumulative offsets
    ``query_start_loc [requests + 1]``; ``inside`` is False for tokens outside every request."""
    qsl = query_start_loc.long()
    req = torch.searchsorted(qsl[1:requests + 1].contiguous(), tokens, right=True)
    inside = (tokens >= qsl[0]) & (req < requests)
    return req.clamp(max=max(requests - 1, 0)), inside
