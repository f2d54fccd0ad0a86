"""Chart the Triton kernels' bandwidth: % of the device's copy bandwidth by op and size, from the
JSON of ``python3 -m benchmarks kernels_gpu --json``.

    python3 tools/bandwidth_chart.py kernels.json --svg docs/figures/bandwidth.svg [--markdown]

One group of bars per (format, op), one bar per row count (prefill-like slots; the paged ops'
single-request cases), each the op's fewest bytes over its time per call inside a CUDA graph,
as a % of a 2 GiB device-to-device copy measured in the same run. Plain SVG, no plotting
library.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLORS = ("#90caf9", "#42a5f5", "#1565c0", "#0d47a1")
BAR_H, GAP, LEFT, WIDTH = 9, 10, 250, 820


def bars(doc: dict) -> list[tuple[str, int, float]]:
    """(format op, rows, % copy BW) of every codec row with prefill slots and every paged row of
    one request (``1x...``) or the byte copy ``gather_paged``."""
    out = []
    for r in doc["rows"]:
        pct = r.get("% copy BW")
        try:
            pct, rows = float(pct), int(r["rows"])
        except (TypeError, ValueError, KeyError):
            continue  # a failed case, or a table without these columns
        if "op" in r and r.get("slots") == "prefill":
            out.append((f"{r['format']} {r['op']}", rows, pct))
        elif "paged op" in r and (r["paged op"].startswith("dequantize_gather 1x")
                                  or r["paged op"].startswith("gather_paged")):
            out.append((f"{r['format']} {r['paged op'].split()[0]}", rows, pct))
    return out


def svg(doc: dict) -> str:
    data = bars(doc)
    groups: dict[str, dict[int, float]] = {}
    for label, rows, pct in data:
        groups.setdefault(label, {})[rows] = pct
    sizes = sorted({rows for _, rows, _ in data})
    color = {n: COLORS[i % len(COLORS)] for i, n in enumerate(sizes)}
    scale = (WIDTH - LEFT - 60) / 100.0
    height = 50 + sum(len(g) * BAR_H + GAP for g in groups.values()) + 30
    head = doc.get("head", [""])[0]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{LEFT}" y="16" font-size="13">% of the copy bandwidth inside a CUDA graph '
             f'(higher is better)</text>',
             f'<text x="{LEFT}" y="30" fill="#555">{head[:110]}</text>']
    y = 42
    for label, by_size in groups.items():
        parts.append(f'<text x="{LEFT - 6}" y="{y + len(by_size) * BAR_H / 2 + 4:.0f}" text-anchor="end">{label}</text>')
        for n in sizes:
            if n not in by_size:
                continue
            w = max(0.0, by_size[n]) * scale
            parts.append(f'<rect x="{LEFT}" y="{y}" width="{w:.1f}" height="{BAR_H - 1}" fill="{color[n]}"/>')
            parts.append(f'<text x="{LEFT + w + 3:.1f}" y="{y + BAR_H - 1}" font-size="9">{by_size[n]:.0f}</text>')
            y += BAR_H
        y += GAP
    for pct in (50, 85, 100):
        x = LEFT + pct * scale
        parts.append(f'<line x1="{x:.1f}" y1="36" x2="{x:.1f}" y2="{y}" stroke="#bbb" stroke-dasharray="3,3"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + 11}" text-anchor="middle" fill="#777">{pct} %</text>')
    for i, n in enumerate(sizes):
        parts.append(f'<rect x="{LEFT + i * 110}" y="{height - 14}" width="10" height="10" fill="{color[n]}"/>')
        parts.append(f'<text x="{LEFT + i * 110 + 14}" y="{height - 5}">{n} rows</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def markdown(doc: dict) -> str:
    data = bars(doc)
    sizes = sorted({rows for _, rows, _ in data})
    table: dict[str, dict[int, float]] = {}
    for label, rows, pct in data:
        table.setdefault(label, {})[rows] = pct
    lines = ["| op | " + " | ".join(f"{n} rows" for n in sizes) + " |", "| --- |" + " ---: |" * len(sizes)]
    for label, by_size in table.items():
        lines.append(f"| {label} | " + " | ".join(f"{by_size[n]:.0f} %" if n in by_size else "—" for n in sizes)
                     + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--svg", type=Path)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    doc = json.loads(args.json.read_text())
    if args.svg:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(svg(doc))
    if args.markdown:
        print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
