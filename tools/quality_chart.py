"""Turn ``kvformats quality --out`` JSON into a hand-written SVG bar chart and a Markdown table.

    python tools/quality_chart.py docs/data/quality_cpu.json --svg docs/diagrams/quality.svg --markdown

Two panels: the relative attention error of each run per path (SWA, CSA, HCA, layer), and the
indexer recall@k of each run that has one. No plotting library: the SVG is written as text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from xml.sax.saxutils import escape

PATHS = ("swa", "csa", "hca", "layer")
COLORS = {"swa": "#4e79a7", "csa": "#f28e2b", "hca": "#59a14f", "layer": "#e15759", "recall": "#b07aa1"}


def markdown_table(rep: dict) -> str:
    lines = ["| run | SWA | CSA | HCA | layer | recall@k |", "|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        cells = ["—" if r[k] is None else f"{r[k]:.4f}" for k in PATHS + ("recall",)]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _panel(rows, keys, y0, title, left, plot_w, vmax, fmt):
    out = [f'<text x="10" y="{y0}" font-size="14">{escape(title)}</text>']
    y = y0 + 12
    bar = 9
    for r in rows:
        vals = [(k, r[k]) for k in keys if r[k] is not None]
        if not vals:
            continue
        out.append(f'<text x="{left - 8}" y="{y + bar * len(vals) / 2 + 4:.0f}" text-anchor="end">'
                   f'{escape(r["run"])}</text>')
        for k, v in vals:
            w = plot_w * min(v / vmax, 1.0)
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 1}" fill="{COLORS[k]}">'
                       f'<title>{k}: {v:.4f}</title></rect>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar - 1}" font-size="9">{k} {fmt.format(v)}</text>')
            y += bar
        y += 8
    return out, y


def svg_chart(rep: dict, width: int = 980) -> str:
    left, plot_w = 330, width - 330 - 110
    err_rows = [r for r in rep["rows"] if any(r[k] is not None for k in PATHS)]
    emax = max(r[k] for r in err_rows for k in PATHS if r[k] is not None) * 1.05
    body, y = _panel(err_rows, PATHS, 24, "Relative error of the attention output vs bf16 caches",
                     left, plot_w, emax, "{:.3f}")
    rec, y = _panel(rep["rows"], ("recall",), y + 24, "Indexer recall@k vs the exact bf16 indexer",
                    left, plot_w, 1.0, "{:.3f}")
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
            f'font-family="sans-serif" font-size="11">')
    return "\n".join([head, *body, *rec, "</svg>"]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--svg", type=Path)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rep = json.loads(args.json.read_text())
    if args.svg:
        args.svg.write_text(svg_chart(rep))
    if args.markdown:
        print(markdown_table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
