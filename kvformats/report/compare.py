"""Two caches of one layout compared for a report: ``kvformats diff``'s report (counts per region,
largest decoded difference, first differing bytes: ``kvformats.caches.diff.diff_caches``) and,
for drawing, which rows of which pages differ in which region."""

from __future__ import annotations

import attrs
import torch

from kvformats.caches.diff import diff_caches
from kvformats.caches.regions import page_width, region_bytes
from kvformats.errors import KVFormatError
from kvformats.layout import Layout
from kvformats.report.tables import page_chunk

MAX_ITEMS = 20  # first differing bytes listed, as `kvformats diff --max-items`


@attrs.frozen
class Comparison:
    """``report``: diff's dict (None when the caches cannot be compared); ``rows``: region ->
    bool ``[pages, rows]`` of the rows differing in it (per-page regions: ``[pages, 1]``);
    ``note``: what was not compared, and why."""

    other_name: str
    report: dict | None
    rows: dict[str, torch.Tensor]
    note: str = ""

    def pages_differ(self, pages: int) -> torch.Tensor:
        """bool ``[pages]`` (pages beyond the compared ones: False)."""
        out = torch.zeros(pages, dtype=torch.bool)
        for bad in self.rows.values():
            out[: bad.shape[0]] |= bad.any(-1).cpu()
        return out

    def rows_differ(self, page: int, page_size: int) -> dict[str, torch.Tensor]:
        """Region -> bool ``[rows]`` for ``page``: the rows differing in that region (a per-page
        region marks every row); empty when the page was not compared."""
        out = {}
        for name, bad in self.rows.items():
            if page < bad.shape[0]:
                out[name] = bad[page].expand(page_size) if bad.shape[1] == 1 else bad[page]
        return out

    def any_row(self, page: int, page_size: int) -> torch.Tensor:
        out = torch.zeros(page_size, dtype=torch.bool)
        for bad in self.rows_differ(page, page_size).values():
            out |= bad.cpu()
        return out


def compare(layout: Layout, a: torch.Tensor, other_layout: Layout, b: torch.Tensor, other_name: str) -> Comparison:
    """Compare cache ``a`` with ``b``. Caches of different layouts or page widths are not compared
    (the note says so); of different page counts, the pages both hold are."""
    if other_layout != layout:
        return Comparison(other_name, None, {}, f"not compared: the other cache is {other_layout.name}"
                                                f"{other_layout.params}, this one {layout.name}{layout.params}")
    if page_width(layout, a) != page_width(layout, b):
        return Comparison(other_name, None, {}, f"not compared: pages of {page_width(layout, b)} B there, "
                                                f"{page_width(layout, a)} B here")
    pages = min(a.shape[0], b.shape[0])
    note = "" if a.shape[0] == b.shape[0] else \
        f"the other cache has {b.shape[0]} pages, this one {a.shape[0]}: the first {pages} are compared"
    a, b = a[:pages], b[:pages]
    try:
        report = diff_caches(layout, a, b, max_items=MAX_ITEMS)
    except KVFormatError as err:  # diff's own refusals, as a note in the report
        return Comparison(other_name, None, {}, f"not compared: {str(err).splitlines()[0]}")
    rows: dict[str, list[torch.Tensor]] = {r.name: [] for r in layout.regions}
    chunk = page_chunk(layout)
    for start in range(0, pages, chunk):
        sl = slice(start, min(start + chunk, pages))
        for region in layout.regions:
            rows[region.name].append((region_bytes(layout, a, region, sl) != region_bytes(layout, b, region, sl))
                                     .any(-1).cpu())
    return Comparison(other_name, report, {name: torch.cat(parts) if parts else torch.zeros((0, 1), dtype=torch.bool)
                                           for name, parts in rows.items()}, note)
