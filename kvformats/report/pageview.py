"""One page of a cache as HTML: its rows (click one for its values and bytes), the ``check``
findings linked to their rows, the rows that differ from the other file, a heatmap of the scale
exponents, maps of NaN, Inf and saturated codes, and a histogram of codes per value region."""

from __future__ import annotations

import math

import torch

from kvformats.report import png, svg, tables
from kvformats.report.compare import Comparison
from kvformats.report.cachetables import CacheTables
from kvformats.report.markup import count, esc, tag

COLOURS = {"nan": "#d62828", "inf": "#c200c2", "saturated": "#fb8500"}  # as style.py draws their markers


def page_id(prefix: str, page: int) -> str:
    return f"{prefix}-p{page}"


def row_link(page: int, row: int, text: str, prefix: str) -> str:
    """A link that opens a row's view (the report's script reads data-page and data-row)."""
    return tag("a", esc(text), href=f"#{page_id(prefix, page)}", class_="kvf-go", data_page=page, data_row=row)


def _figure(title: str, body: str, note: str = "") -> str:
    caption = tag("figcaption", esc(title) + (tag("span", esc(note), class_="kvf-note") if note else ""))
    return tag("figure", caption + body, class_="kvf-fig")


def row_strip(status: torch.Tensor, differ: torch.Tensor | None) -> str:
    """One cell per row, coloured by status, outlined where the row differs; click: row view."""
    rows = status.shape[0]
    w, h = svg.cell_size(1, rows)
    cells = [svg.text(svg.LEFT - 4, 18, "rows", "end")]
    for row in range(rows):
        name = tables.STATUS_NAMES[int(status[row])]
        differs = differ is not None and bool(differ[row])
        title = f"row {row}: {name}" + (", differs" if differs else "")
        cells.append(svg.rect(svg.LEFT + row * w, 6, w - 0.5, 16, title,
                              class_=f"kvf-st-{name}" + (" kvf-differs" if differs else ""), data_row=row))
    return svg.frame(svg.LEFT + rows * w + 4, 28, "".join(cells), "rows of the page, by status")


def _marker(rows: int, cols: int, row: int, col: int, title: str, kind: str, **values) -> str:
    x, y, w, h = svg.grid_place(rows, cols, row, col)
    return svg.rect(x, y, w, h, title, class_=f"kvf-{kind} kvf-marker", data_row=row, data_block=col, **values)


def scale_heatmap(name: str, exponents: torch.Tensor, written: torch.Tensor) -> str:
    """rows x blocks cells coloured by exponent; NaN and inf cells marked; zero scales and rows
    never written (``written``: bool ``[rows]``) blank: a ue8m0 zero byte reads 2^-127 and would
    stretch the colour scale."""
    exponents = torch.where(written[:, None], exponents, torch.full_like(exponents, -math.inf))
    rows, blocks = exponents.shape
    finite = torch.isfinite(exponents)
    lo, hi = (float(exponents[finite].min()), float(exponents[finite].max())) if finite.any() else (0.0, 0.0)
    t = (exponents - lo) / (hi - lo) if hi > lo else torch.full_like(exponents, 0.5)
    rgb = svg.colours(torch.where(finite, t, torch.zeros_like(t)))
    rgb[exponents == -math.inf] = torch.tensor(png.hex_rgb(svg.EMPTY), dtype=torch.uint8)
    rgb[exponents.isnan()] = torch.tensor(png.hex_rgb(COLOURS["nan"]), dtype=torch.uint8)
    rgb[exponents == math.inf] = torch.tensor(png.hex_rgb(COLOURS["inf"]), dtype=torch.uint8)
    titles, markers = [], []
    for row, line in enumerate(exponents.tolist()):
        shown = " ".join("-" if e == -math.inf else str(e) if math.isnan(e) or math.isinf(e) else str(int(e))
                         for e in line)
        titles.append(f"row {row}: exponents {shown}")
    special = (~finite & (exponents != -math.inf)).nonzero().tolist()
    for row, block in (special if len(special) <= svg.MAX_MARKERS else []):
        kind = "nan" if math.isnan(float(exponents[row, block])) else "inf"
        markers.append(_marker(rows, blocks, row, block, f"row {row} block {block}: scale {kind}", kind))
    note = f"exponent {int(lo)} (dark) to {int(hi)} (yellow); red NaN, magenta inf, blank zero" \
        if finite.any() else "no finite scale on this page"
    return _figure(f"scale exponents: {name} (rows x blocks)",
                   svg.grid(rgb, f"{name} exponents", "block", titles, markers), note)


def special_map(kind: str, region, mask: torch.Tensor) -> str:
    """rows x cells map of where ``mask`` holds (a cell: a quantization block, or
    ``tables.MAP_WIDTH`` elements); 'none' if nowhere."""
    name, width = region.name, tables.cell_width(region)
    total = int(mask.sum())
    if not total:
        return _figure(f"{kind}: {name}", tag("p", "none", class_="kvf-none", data_map=kind, data_region=name))
    counts = tables.cell_counts(mask, width)
    rows, cols = counts.shape
    rgb = torch.tensor(png.hex_rgb(svg.EMPTY), dtype=torch.uint8).repeat(rows, cols, 1)
    rgb[counts > 0] = torch.tensor(png.hex_rgb(COLOURS[kind]), dtype=torch.uint8)
    titles = []
    for row, line in enumerate(counts.tolist()):
        hits = [f"{n} in {col}" for col, n in enumerate(line) if n]
        titles.append(f"row {row}: " + (", ".join(hits[:12]) + (", ..." if len(hits) > 12 else "") if hits else "none"))
    cells = counts.nonzero().tolist()
    markers = [_marker(rows, cols, row, col, f"row {row} elements {col * width}..{col * width + width - 1}: "
                                             f"{int(counts[row, col])} {kind}", kind, data_count=int(counts[row, col]))
               for row, col in (cells if len(cells) <= svg.MAX_MARKERS else [])]
    unit = "block" if region.block else "cell"
    drawing = svg.grid(rgb, f"{kind} in {name}", unit, titles, markers)
    return _figure(f"{kind}: {name}", drawing, f"{count(total, 'element')} in {count(len(cells), unit)} "
                                               f"of {width} elements")


def histogram(region, counts: torch.Tensor) -> str:
    values = counts.tolist()
    wide = region.element.bits > 8
    decoded = tables.code_values(region.dtype)
    titles = []
    for code, n in enumerate(values):
        if wide:
            titles.append(f"top byte 0x{code:02x}: {count(n, 'element')}")
        else:
            titles.append(f"code 0x{code:02x} ({decoded[code]:g}): {count(n, 'element')}")
    what = "top byte of each code" if wide else "codes"
    return _figure(f"histogram of {what}: {region.name} ({region.dtype})",
                   svg.bars(values, titles, f"{region.name} code histogram"), "written rows; log scale")


def findings_list(page: int, by_row: dict[str, torch.Tensor], page_rules: list[str], prefix: str) -> str:
    items = [tag("li", esc(f"{name}: the page breaks it"), class_="kvf-finding", data_rule=name) for name in page_rules]
    for name, bad in by_row.items():
        rows = bad.nonzero().flatten().tolist()
        if rows:
            links = ", ".join(row_link(page, r, f"row {r}", prefix) for r in rows)
            items.append(tag("li", esc(f"{name}: ") + links, class_="kvf-finding", data_rule=name))
    if not items:
        return tag("p", "check: no findings on this page", class_="kvf-ok")
    return tag("h4", "check findings") + tag("ul", "".join(items), class_="kvf-findings")


def diff_list(page: int, differ: dict[str, torch.Tensor], prefix: str, other: str) -> str:
    by_row: dict[int, list[str]] = {}
    for name, bad in differ.items():
        for r in bad.nonzero().flatten().tolist():
            by_row.setdefault(r, []).append(name)
    if not by_row:
        return tag("p", esc(f"identical to {other}"), class_="kvf-ok")
    items = [tag("li", row_link(page, r, f"row {r}", prefix) + esc(": " + ", ".join(names)), class_="kvf-rowdiff",
                 data_row=r, data_regions=" ".join(names)) for r, names in sorted(by_row.items())]
    return tag("h4", esc(f"differs from {other}")) + tag("ul", "".join(items), class_="kvf-pagediff")


def page_section(ins: CacheTables, page: int, prefix: str, comparison: Comparison | None = None) -> str:
    layout = ins.layout
    status = ins.page_status(page)
    differ = comparison.rows_differ(page, layout.page_size) if comparison is not None else {}
    any_differ = comparison.any_row(page, layout.page_size) if comparison is not None else None
    first = page * layout.page_size
    zero, failing = int((status == tables.ZERO).sum()), int((status == tables.FAILING).sum())
    head = tag("h3", esc(f"page {page}")) + tag(
        "p", esc(f"slots {first}..{first + layout.page_size - 1}: {layout.page_size - zero} rows written "
                 f"({failing} failing check), {zero} zero"), class_="kvf-pagehead")
    parts = [head, tag("div", row_strip(status, any_differ), class_="kvf-strip"),
             findings_list(page, ins.findings(page), ins.page_findings(page), prefix)]
    if comparison is not None and comparison.report is not None:
        parts.append(diff_list(page, differ, prefix, comparison.other_name))
    figures = [scale_heatmap(name, e, status != tables.ZERO) for name, e in ins.scale_exponents(page).items()]
    nan, inf, sat = ins.nan_map(page), ins.inf_map(page), ins.saturated_map(page)
    hist = ins.code_histogram(page)
    for region in tables.data_regions(layout):
        figures += [special_map("nan", region, nan[region.name]), special_map("inf", region, inf[region.name]),
                    special_map("saturated", region, sat[region.name]),
                    histogram(region, hist[region.name])]
    parts.append(tag("div", "".join(figures), class_="kvf-figs"))
    parts.append(tag("div", tag("p", "click a row (in the strip, a map or a finding) to see its values and bytes"),
                     class_="kvf-rowview"))
    return tag("section", "".join(parts), id=page_id(prefix, page), class_="kvf-page", data_page=page)
