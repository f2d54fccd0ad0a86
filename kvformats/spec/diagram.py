"""SVG byte maps of a layout, drawn from its declaration: the page map (segments of records and
the page pad, to scale, offsets labelled) and the row map (each field of one encoded row).

The output is deterministic text, so checked-in diagrams can be compared for drift.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from kvformats.layout import Layout

WIDTH, LEFT, BAR = 960, 20, 44
LEGEND = 46  # the legend's first line, below the bar's two lines of offset labels
COLORS = {"data": "#8ecae6", "scale": "#ffb703", "pad": "#d9d9d9"}
ALT = {"data": "#219ebc", "scale": "#fb8500", "pad": "#bdbdbd"}


def _box(x, y, w, h, fill, text, title) -> str:
    label = f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 4:.1f}" text-anchor="middle">{escape(text)}</text>' \
        if w > 7 * len(text) else ""
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{h}" fill="{fill}" '
            f'stroke="#333" stroke-width="0.5"><title>{escape(title)}</title></rect>{label}')


def _tick(x, y, text, line=0) -> str:
    """An offset label under the bar, on label line 0 or (where line 0 is taken nearby) 1."""
    return (f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 6 + 12 * line}" stroke="#333"/>'
            f'<text x="{x:.1f}" y="{y + 18 + 12 * line}" text-anchor="middle" class="off">{text}</text>')


def _bar(parts, y, total) -> list[str]:
    """parts: (start, size, role, text, title); drawn to scale across the width, offsets below,
    then a legend naming every part with its byte range (small parts are slivers in the bar)."""
    span = WIDTH - 2 * LEFT
    out = []
    for i, (start, size, role, text, title) in enumerate(parts):
        x, w = LEFT + span * start / total, span * size / total
        fill = (COLORS if i % 2 == 0 else ALT)[role]
        out.append(_box(x, y, w, BAR, fill, text, title))
        lx, ly = LEFT + (i % 3) * 310, y + BAR + LEGEND + (i // 3) * 16
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{fill}" stroke="#333" '
                   f'stroke-width="0.5"/><text x="{lx + 14}" y="{ly}">{escape(text)}: '
                   f'[{start}, {start + size}) {size} B</text>')
    # every boundary labelled below the bar, the end (the page's or row's size) included: on the
    # first label line, or on the second where a label within 40 px holds the first; a label
    # with no room on either is left to the legend, which lists every range
    ends = sorted({p[0] for p in parts} | {p[0] + p[1] for p in parts})
    lines: tuple[list[int], list[int]] = ([], [])
    for off in [ends[0], ends[-1], *ends[1:-1]]:
        free = [n for n, taken in enumerate(lines) if all(abs(span * (off - k) / total) > 40 for k in taken)]
        if free:
            lines[free[0]].append(off)
    out += [_tick(LEFT + span * off / total, y + BAR, str(off), n) for n, taken in enumerate(lines)
            for off in sorted(taken)]
    return out


def layout_svg(layout: Layout) -> str:
    """One SVG with the page byte map (top) and the row byte map (bottom)."""
    page_parts, at = [], 0
    for seg in layout.segments:
        size = layout.page_size * seg.record_bytes
        fields = " | ".join(f.name for f in seg.fields)
        role = "scale" if all(f.role != "data" for f in seg.fields) else "data"
        page_parts.append((at, size, role, f"{seg.name} × {layout.page_size}",
                           f"{seg.name}: {layout.page_size} records of {seg.record_bytes} B ({fields})"))
        at += size
    if layout.page_bytes > at:
        page_parts.append((at, layout.page_bytes - at, "pad", "pad", "page pad: never written"))
    row_parts = [(r.row_offset, r.nbytes, r.role, r.name, f"{r.name}: {r.dtype} x {r.shape[0]}, {r.nbytes} B")
                 for r in layout.regions if not r.per_page]
    params = ", ".join(f"{k}={v}" for k, v in layout.params.items())
    row_y = 56 + BAR + LEGEND + 16 * ((len(page_parts) + 2) // 3) + 30
    body = [f'<text x="{LEFT}" y="22" class="h">{escape(layout.name)}({escape(params)})</text>',
            f'<text x="{LEFT}" y="46">page: {layout.page_bytes} B ({layout.page_size} rows; '
            f'minimum {layout.min_page_bytes} B)</text>',
            *_bar(page_parts, 56, layout.page_bytes),
            f'<text x="{LEFT}" y="{row_y - 10}">encoded row (gather order): {layout.row_bytes} B</text>',
            *_bar(row_parts, row_y, layout.row_bytes)]
    height = row_y + BAR + LEGEND + 16 * ((len(row_parts) + 2) // 3)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="sans-serif" font-size="12">\n'
            '<style>.h{font-weight:bold;font-size:14px}.off{font-size:10px}</style>\n'
            + "\n".join(body) + "\n</svg>\n")
