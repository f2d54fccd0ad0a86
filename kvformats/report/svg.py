"""Small SVG drawings from plain numbers: grids of cells (heatmaps and maps), bar charts and
strips of clickable cells. Every title and label goes through ``markup.esc``."""

from __future__ import annotations

import math

import torch

from kvformats.report.markup import attrs, esc
from kvformats.report.png import data_uri

# A colour scale for exponents, low to high (viridis' stops): a jump of one exponent shows.
_STOPS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
EMPTY = "#f2f2f2"


def frame(width: float, height: float, body: str, label: str, class_: str = "kvf-svg") -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg"{attrs(class_=class_, role="img", aria_label=label)} '
            f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">{body}</svg>')


def rect(x: float, y: float, w: float, h: float, title: str, **values) -> str:
    """A rectangle with a hover title; ``values`` are its attributes (class_, fill, data_row=...)."""
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"{attrs(**values)}>'
            f"<title>{esc(title)}</title></rect>")


def text(x: float, y: float, content: str, anchor: str = "start", class_: str = "kvf-axis") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{attrs(class_=class_)}>{esc(content)}</text>'


def cell_size(rows: int, cols: int) -> tuple[float, float]:
    """(width, height) of one cell of a rows x cols grid: big enough to click, small enough that
    a page of 64 rows stays on screen."""
    return min(max(480 / max(cols, 1), 4.0), 28.0), min(max(256 / max(rows, 1), 3.0), 12.0)


LEFT, TOP = 34, 16  # room for the row numbers and the column axis
MAX_MARKERS = 64  # marked cells drawn as elements of their own (clickable, titled) when this few


def grid(rgb: torch.Tensor, label: str, col_name: str, row_titles: list[str], markers: list[str]) -> str:
    """A rows x cols grid of colours (uint8 ``[rows, cols, 3]``, one PNG pixel per cell, scaled
    up), with a transparent band per row (its title, and ``data-row`` so that a click opens the
    row), row numbers every few rows, the column axis named ``col_name``, and ``markers`` (``rect``
    markup placed by ``grid_place``) on top."""
    rows, cols, _ = rgb.shape
    w, h = cell_size(rows, cols)
    width, height = LEFT + cols * w + 4, TOP + rows * h + 4
    step = 1
    while step * h < 11:  # a row number every `step` rows, where their text does not overlap
        step *= 2
    marks = [text(LEFT - 4, TOP + (r + 0.8) * h, str(r), "end") for r in range(0, rows, step)]
    top = [text(LEFT, TOP - 4, f"{col_name} 0"), text(LEFT + cols * w, TOP - 4, str(cols - 1), "end")] \
        if cols > 1 else [text(LEFT, TOP - 4, col_name)]
    image = (f'<image x="{LEFT}" y="{TOP}" width="{cols * w:.1f}" height="{rows * h:.1f}" '
             f'preserveAspectRatio="none" image-rendering="optimizeSpeed" class="kvf-pixels" href="{data_uri(rgb)}"/>')
    bands = [rect(LEFT, TOP + r * h, cols * w, h, title, class_="kvf-band", fill="transparent", data_row=r)
             for r, title in enumerate(row_titles)]
    return frame(width, height, "".join([image, *marks, *top, *bands, *markers]), label)


def grid_place(rows: int, cols: int, row: int, col: int) -> tuple[float, float, float, float]:
    """(x, y, w, h) of cell (row, col) in a ``grid`` of rows x cols."""
    w, h = cell_size(rows, cols)
    return LEFT + col * w, TOP + row * h, w, h


def colours(t: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 3]`` colours of the exponent scale at ``t`` in [0, 1]."""
    stops = torch.tensor(_STOPS, dtype=torch.float32)
    pos = t.clamp(0, 1) * (len(_STOPS) - 1)
    i = pos.floor().clamp(max=len(_STOPS) - 2).long()
    f = (pos - i).unsqueeze(-1)
    return (stops[i] + (stops[i + 1] - stops[i]) * f).round().to(torch.uint8)


def bars(counts: list[int], titles: list[str], label: str, height: int = 90) -> str:
    """A bar chart of ``counts`` (log-scaled heights: one NaN code among thousands stays visible);
    only non-zero bars are drawn, each with its title and ``data-code``."""
    n = max(len(counts), 1)
    w = min(max(512 / n, 2.0), 24.0)
    top = max(counts) if counts else 0
    out = [f'<line x1="0" y1="{height}" x2="{n * w:.1f}" y2="{height}" stroke="#999"/>']
    if top:
        scale = math.log1p(top)
        for i, c in enumerate(counts):
            if c:
                bar = max(1.0, (height - 4) * math.log1p(c) / scale)
                out.append(rect(i * w, height - bar, max(w - 0.5, 1.0), bar, titles[i], class_="kvf-bar",
                                data_code=i))
    out.append(text(0, height + 12, "code 0"))
    out.append(text(n * w, height + 12, f"code {n - 1}", "end"))
    return frame(n * w + 2, height + 16, "".join(out), label)
