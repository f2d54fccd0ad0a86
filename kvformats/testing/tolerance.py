"""How far two encodings of the same rows are apart, in codes: the bar for outputs that are
not bit-exact by design (the deepseek_v4 pooling path, spec/upstream.md §2.5 and §13.1: scale and
pad bytes equal, every value code equal or one code apart, few of them apart).

Codes are compared in value order: a sign-magnitude code maps to an integer so that adjacent
representable values differ by one and +0 / -0 both map to 0. Kernel authors compare their
own rows with this; the kvformats tests and the fuzz state machines use it too.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import LayoutError


@attrs.frozen
class CodeDistance:
    """``exact_equal``: the bytes that must match exactly (scales, pads) do; ``max_apart``: the
    largest distance of one value's codes; ``apart``: values whose codes differ; ``values``: all
    values compared."""

    exact_equal: bool
    max_apart: int
    apart: int
    values: int

    def within_one_code(self) -> bool:
        return self.exact_equal and self.max_apart <= 1


def ordinal(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Sign-magnitude ``bits``-bit codes -> int64 in value order (±0 -> 0)."""
    c = codes.to(torch.int64)
    mag = c & ((1 << (bits - 1)) - 1)
    return torch.where(c >> (bits - 1) == 1, -mag, mag)


def split_row(layout, rows: torch.Tensor) -> tuple[list[tuple[torch.Tensor, int]], torch.Tensor]:
    """(value codes ``[N, k]`` with their bit width, bytes that must be equal ``[N, m]``) of
    gathered rows (uint8 ``[N, row_bytes]``), read from the layout's regions: each data region's
    elements are codes of its (sign-magnitude) element type; scale and pad bytes must be equal. Defined for
    layouts with block-scaled values (not for exact copies such as compressor_state)."""
    if not any(r.scale for r in layout.data_regions):
        raise LayoutError(f"code distance is defined for rows with block-scaled values, not {layout.name!r}")
    values, exact = [], []
    for region in layout.regions:
        if region.per_page:
            continue
        raw = rows[:, region.row_span]
        if region.role == "data" and region.element.sign_magnitude:
            values.append((region.element.codes(raw), region.element.bits))
        else:
            exact.append(raw)
    return values, torch.cat(exact, dim=1)


def code_distance(layout, got_rows: torch.Tensor, want_rows: torch.Tensor) -> CodeDistance:
    """Compare two uint8 ``[N, row_bytes]`` row sets of ``layout`` (as ``layout.gather`` returns)."""
    if got_rows.shape != want_rows.shape:
        raise LayoutError(f"row sets of different shapes: {tuple(got_rows.shape)} and {tuple(want_rows.shape)}")
    got_v, got_exact = split_row(layout, got_rows)
    want_v, want_exact = split_row(layout, want_rows)
    max_apart = apart = values = 0
    for (g, bits), (w, _) in zip(got_v, want_v):
        if g.numel():
            max_apart = max(max_apart, int((ordinal(g, bits) - ordinal(w, bits)).abs().max()))
        apart += int((g != w).sum())
        values += g.numel()
    return CodeDistance(bool(torch.equal(got_exact, want_exact)), max_apart, apart, values)
