"""Every page of a cache at a glance: one cell per page (per run of pages, beyond MAX_CELLS)
coloured by its share of rows written, zero and failing ``check``, outlined where it differs from
the other file; a shown page's cell links to its view."""

from __future__ import annotations

import torch

from kvformats.report import svg
from kvformats.report.cachetables import CacheTables
from kvformats.report.markup import count, esc, tag

MAX_CELLS = 4096  # beyond this many pages a cell stands for a run of pages: the SVG stays small
COLUMNS = 64
CELL = 11


def _binned(values: torch.Tensor, per: int) -> list[int]:
    """Sums of ``values [pages]`` over runs of ``per`` pages."""
    pad = (-values.shape[0]) % per
    return torch.nn.functional.pad(values.to(torch.int64), (0, pad)).reshape(-1, per).sum(-1).tolist()


def page_class(written: int, failing: int, bad_pages: int, rows: int) -> str:
    if failing or bad_pages:
        return "failing"
    if written == rows:
        return "written"
    return "zero" if written == 0 else "partial"


def overview(ins: CacheTables, shown: list[int], prefix: str, differs: torch.Tensor | None = None) -> str:
    data = ins.page_overview()
    pages, size = ins.pages, ins.layout.page_size
    if not pages:
        return tag("p", "the cache has no pages", class_="kvf-none")
    per = -(-pages // MAX_CELLS)
    written, zero, failing = (_binned(data[k], per) for k in ("written", "zero", "failing"))
    bad_pages = _binned(data["page_failing"], per)
    differ = _binned(differs, per) if differs is not None else [0] * len(written)
    shown_set = set(shown)
    cells = []
    for i, start in enumerate(range(0, pages, per)):
        stop = min(start + per, pages)
        rows = (stop - start) * size
        kind = page_class(written[i], failing[i], bad_pages[i], rows)
        what = f"page {start}" if per == 1 else f"pages {start}-{stop - 1}"
        title = f"{what}: {written[i]} rows written ({failing[i]} failing check), {zero[i]} zero"
        title += f"; {count(bad_pages[i], 'page')} breaking a page rule" if bad_pages[i] else ""
        title += "; differs from the other file" if differ[i] else ""
        target = next((p for p in range(start, stop) if p in shown_set), None)
        title += "; shown below" if target is not None else "; summarised only (--pages shows it)"
        x, y = 2 + (i % COLUMNS) * CELL, 2 + (i // COLUMNS) * CELL
        cls = f"kvf-pg-{kind}" + (" kvf-differs" if differ[i] else "")
        cell = svg.rect(x, y, CELL - 1, CELL - 1, title, class_=cls, data_page=start,
                        data_last=stop - 1 if per > 1 else None)
        cells.append(f'<a href="#{esc(prefix)}-p{target}">{cell}</a>' if target is not None else cell)
    lines = -(-len(cells) // COLUMNS)
    width = 4 + min(len(cells), COLUMNS) * CELL
    drawing = svg.frame(width, 4 + lines * CELL, "".join(cells), "page overview", class_="kvf-svg kvf-overview")
    legend = tag("p", esc(f"one cell per {'page' if per == 1 else f'{per} pages'}: ") +
                 "".join(tag("span", esc(name), class_=f"kvf-key kvf-pg-{key}") for key, name in
                         (("written", "every row written"), ("partial", "some rows written"),
                          ("zero", "no row written"), ("failing", "fails check"))) +
                 (tag("span", "differs", class_="kvf-key kvf-differs") if differs is not None else ""),
                 class_="kvf-legend")
    return tag("div", drawing + legend + totals(ins, prefix, shown_set, differs), class_="kvf-pages")


def totals(ins: CacheTables, prefix: str, shown: set[int], differs: torch.Tensor | None) -> str:
    data = ins.page_overview()
    rows = ins.pages * ins.layout.page_size
    findings = ins.pages_with_findings()

    def listed(pages: list[int]) -> str:
        links = [tag("a", str(p), href=f"#{prefix}-p{p}") if p in shown else esc(p) for p in pages[:20]]
        return ", ".join(links) + (", ..." if len(pages) > 20 else "")

    items = [tag("li", esc(f"{count(ins.pages, 'page')} of {ins.layout.page_size} rows: {int(data['written'].sum())} "
                           f"of {rows} rows written ({int(data['failing'].sum())} failing check), "
                           f"{int(data['zero'].sum())} zero"), data_field="pages", data_pages=ins.pages),
             tag("li", esc(f"pages with findings: {len(findings)}") + (": " + listed(findings) if findings else ""),
                 data_field="pages-with-findings", data_count=len(findings))]
    if differs is not None:
        pages = differs.nonzero().flatten().tolist()
        items.append(tag("li", esc(f"pages that differ: {len(pages)}") + (": " + listed(pages) if pages else ""),
                         data_field="pages-that-differ", data_count=len(pages)))
    return tag("ul", "".join(items), class_="kvf-totals")
