"""A layout as HTML, for ``Layout._repr_html_`` (Jupyter shows a layout as this): the byte map of
``kvformats diagram`` and the region table of ``kvformats show``."""

from __future__ import annotations

from kvformats.layout import Layout
from kvformats.report.markup import esc, table, tag


def layout_html(layout: Layout) -> str:
    from kvformats.spec.diagram import layout_svg

    params = ", ".join(f"{k}={v}" for k, v in layout.params.items())
    rows = [[esc(r.name), esc(r.dtype), esc(r.role), esc("page" if r.per_page else f"[{r.shape[0]}]"), esc(r.offset),
             esc("-" if r.per_page else r.row_stride), esc("-" if r.per_page else r.nbytes), esc(r.page_nbytes),
             esc(f"{r.scale} / {r.block}" if r.scale else "-"), esc(r.doc)] for r in layout.regions]
    head = tag("p", tag("b", esc(f"{layout.name}({params})")) + esc(
        f": row {layout.row_bytes} B, page {layout.page_bytes} B (min {layout.min_page_bytes} B)"))
    regions = table(["region", "dtype", "role", "shape", "offset", "row stride", "row B", "page B",
                     "scale / block", "doc"], rows)
    return tag("div", head + layout_svg(layout) + regions, class_="kvf-layout")
