"""Turn bench_pipeline_gpu.py's JSON into a hand-written SVG bar chart and a Markdown table.

    python tools/pipeline_chart.py results.json --svg docs/diagrams/pipeline.svg
    python tools/pipeline_chart.py results.json --markdown            # prints the table
    python tools/pipeline_chart.py results.json --update-doc docs/pipeline.md

``--update-doc`` replaces the text between the ``<!-- pipeline-table -->`` and
``<!-- /pipeline-table -->`` markers of the page with the table. No plotting library: the SVG
is written as text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from xml.sax.saxutils import escape

PHASES = ("projections", "slots", "swa_insert", "save_state", "compress", "indexer", "reads", "attention",
          "out_quant")
COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
BEGIN, END = "<!-- pipeline-table -->", "<!-- /pipeline-table -->"


def markdown_table(doc: dict) -> str:
    """One row per case: eager and graph totals (ms) and the per-phase eager times."""
    head = ["case", "eager ms", "graph ms"] + list(PHASES)
    lines = [f"Device: {doc.get('device', '?')}, torch {doc.get('torch', '?')}, top-k {doc.get('topk', '?')}, "
             f"{doc.get('index_format', '?')}, {doc.get('date', '?')[:10]}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        if "error" in r:
            lines.append(f"| {r['label']} | not run: {r['error'].splitlines()[-1][:80]} |" + " |" * (len(head) - 2))
            continue
        ph = r.get("phases_ms", {})
        cells = [r["label"], f"{r['eager_ms']:.2f}", f"{r['graph_ms']:.2f}" if "graph_ms" in r else "—"]
        cells += [f"{ph.get(p, 0.0):.2f}" for p in PHASES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def svg_chart(doc: dict, width: int = 900) -> str:
    """Horizontal stacked bars: per-phase eager time of each case, scaled per bar to its total
    (the label gives the absolute total), so cases of very different sizes stay readable."""
    rows = [r for r in doc["results"] if "error" not in r]
    bar_h, gap, left, top = 22, 10, 190, 40
    legend_h = 30
    height = top + len(rows) * (bar_h + gap) + legend_h + 20
    plot_w = width - left - 130
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="20" font-size="14">Layer step: share of each phase (eager), '
           f'{escape(str(doc.get("device", "")))}</text>']
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(r["label"])}</text>')
        total = sum(r["phases_ms"].values()) or 1.0
        x = float(left)
        for p, color in zip(PHASES, COLORS):
            w = plot_w * r["phases_ms"].get(p, 0.0) / total
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}">'
                           f'<title>{p}: {r["phases_ms"][p]:.3f} ms</title></rect>')
            x += w
        graph = f", graph {r['graph_ms']:.2f}" if "graph_ms" in r else ""
        out.append(f'<text x="{left + plot_w + 6}" y="{y + 15}">{r["eager_ms"]:.2f} ms{graph}</text>')
    y = top + len(rows) * (bar_h + gap) + 10
    for j, (p, color) in enumerate(zip(PHASES, COLORS)):
        x = 10 + j * (width - 20) // len(PHASES)
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{y + 10}">{p}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def update_doc(path: Path, table: str) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers")
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:a] + "\n" + table + "\n" + text[b:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--svg", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--update-doc", type=Path)
    args = ap.parse_args(argv)
    doc = json.loads(args.json.read_text())
    if args.svg:
        args.svg.write_text(svg_chart(doc))
    if args.markdown:
        print(markdown_table(doc))
    if args.update_doc:
        update_doc(args.update_doc, markdown_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
