"""Turn bench_pipeline_gpu.py's JSON into a hand-written SVG bar chart and a Markdown table.

    python tools/pipeline_chart.py results.json --svg docs/diagrams/pipeline.svg
    python tools/pipeline_chart.py results.json --markdown            # prints the table
    python tools/pipeline_chart.py results.json --update-doc docs/pipeline.md [--side-by-side sbs.json]

``--update-doc`` replaces the text between the ``<!-- pipeline-table -->`` and
``<!-- /pipeline-table -->`` markers of the page with the table. ``--side-by-side`` adds, for
the phases whose cache ops tokenspeed also has, the GPU time of those ops alone, ours and
tokenspeed's, from the side-by-side tool's JSON of the same lease (run at the steps' token
counts: the decode batches and the prefill chunk). No plotting library: the SVG is written as
text.
"""

from __future__ import annotations

import argparse
import json
import re
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


# phase -> the side-by-side ops that make up its cache work ({fmt}: the indexer format's name)
PHASE_OPS = {"swa_insert": ("fp8_ds_mla_write",), "save_state": ("save_state_csa", "save_state_hca"),
             "compress": ("csa_compress_insert", "hca_compress_insert", "indexer_{fmt}_compress_insert"),
             "indexer": ("indexer_q_{fmt}",), "out_quant": ("inv_rope_fp8_quant",)}


def _tokens(r: dict) -> int:
    return r["batch"] if r["kind"] == "decode" else r["chunk"]


def ops_table(doc: dict, sbs: dict) -> str:
    """Per step and phase: our phase time (events, eager) beside the GPU µs of the phase's
    cache ops alone, kvformats' and tokenspeed's, on the side-by-side at the step's tokens."""
    fmt = doc.get("index_format", "mxfp4_indexer").split("_")[0]
    by = {}
    for r in sbs["results"]:
        mode = r.get("modes", {}).get("graph20" if r.get("decode") else "graph1", {})
        tokens = re.match(r"(?:decode|prefill) (\d+)", r["size"])  # rows counts heads too for the query ops
        if tokens:
            by[(r["op"], int(tokens.group(1)))] = (mode.get("kvf"), mode.get("ts"))
    lines = ["| step | phase | phase µs (ours, in the step) | its ops alone, kvformats µs | "
             "its ops alone, tokenspeed µs |", "|---|---|---:|---:|---:|"]
    for r in doc["results"]:
        if "error" in r or (r["kind"] == "prefill" and r["tokens"] != r["chunk"]):
            continue
        n = _tokens(r)
        for phase, ops in PHASE_OPS.items():
            pairs = [by.get((op.format(fmt=fmt), n)) for op in ops]
            if any(p is None or None in p for p in pairs):
                continue
            kvf, ts = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            lines.append(f"| {r['label']} | {phase} | {r['phases_ms'][phase] * 1e3:.1f} | {kvf:.1f} | {ts:.1f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


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
    ap.add_argument("--side-by-side", type=Path, help="the side-by-side tool's JSON at the steps' token counts")
    args = ap.parse_args(argv)
    doc = json.loads(args.json.read_text())
    table = markdown_table(doc)
    if args.side_by_side:
        ops = ops_table(doc, json.loads(args.side_by_side.read_text()))
        if ops:
            table += ("\n\nThe phases' cache ops alone on the GPU (µs per call: 20 calls in a CUDA graph at "
                      "decode sizes, one call with the L2 flushed at the prefill chunk), kvformats and "
                      "tokenspeed on the same inputs in the same lease. The side-by-side writes every "
                      "token's compressed row, where a step writes one per ratio tokens, so its compress "
                      "figures bound the step's from above.\n\n" + ops)
    if args.svg:
        args.svg.write_text(svg_chart(doc))
    if args.markdown:
        print(table)
    if args.update_doc:
        update_doc(args.update_doc, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
