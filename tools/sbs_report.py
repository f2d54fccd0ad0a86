"""Turn a side-by-side run (tokenspeed's kernels and ours, one GPU run) into the tables and the
chart of docs/performance.md.

    python3 tools/sbs_report.py side_by_side.json [--host bench_host.json] \
        [--svg docs/figures/host_cost.svg] [--markdown]

``side_by_side.json`` is what the side-by-side tool writes (``meta`` and ``results``: per op and
size, the ``host`` µs per call of 50 back-to-back calls and the ``graph20`` µs per call inside a
CUDA graph, for tokenspeed ``ts`` and kvformats ``kvf``). ``--host`` adds the floors measured by
``benchmarks/bench_host_gpu.py --json`` in its run (an empty Triton launch, a 1-element torch
``add_``). ``--markdown`` prints the tables; ``--svg`` writes a bar chart of the host µs per call
at the smallest size of each op (plain SVG, no plotting library).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BAR_H, GAP, LEFT, WIDTH = 11, 8, 230, 760
COLORS = {"tokenspeed": "#9e9e9e", "kvformats": "#1565c0"}


def _rows(results: list[dict], mode: str) -> list[tuple[str, str, float, float]]:
    """(op, size, tokenspeed µs, kvformats µs) of every case that has ``mode`` for both."""
    out = []
    for r in results:
        m = r.get("modes", {}).get(mode, {})
        if m.get("ts") is not None and m.get("kvf") is not None:
            out.append((r["op"], r["size"], m["ts"], m["kvf"]))
    return out


def markdown(data: dict, floors: dict | None) -> str:
    lines = []
    for mode, what in (("host", "host µs per eager call (50 back-to-back calls, no synchronization)"),
                       ("graph20", "GPU µs per call, 20 calls captured in one CUDA graph")):
        rows = _rows(data["results"], mode)
        if not rows:
            continue
        lines += [f"{what[0].upper()}{what[1:]}:", "", "| op | size | tokenspeed | kvformats | tokenspeed / kvformats |",
                  "| --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {op} | {size} | {ts:.1f} | **{kvf:.1f}** | {ts / kvf:.2f} |" if kvf <= ts else
                  f"| {op} | {size} | {ts:.1f} | {kvf:.1f} | {ts / kvf:.2f} |" for op, size, ts, kvf in rows]
        lines.append("")
    if floors:
        lines.append("Floors of the same host: " + "; ".join(f"{k} {v:.1f} µs" for k, v in floors.items()) + ".")
    return "\n".join(lines)


def host_table(host: dict) -> str:
    """Every public op's host µs per call (bench_host_gpu.py): default checks (replayed), the
    full path (not replayed), check=False and the torch.library custom op, at each row count."""
    sizes = sorted({r["rows"] for r in host["ops"]})
    head = " | ".join(f"{n} rows: default / full path / check=False / custom op" for n in sizes)
    lines = [f"| op | {head} |", "| --- |" + " ---: |" * len(sizes)]
    by_op: dict[str, dict] = {}
    for r in host["ops"]:
        by_op.setdefault(r["op"], {})[r["rows"]] = r

    def cell(r):
        vals = [r.get(k) for k in ("default_us", "full_us", "nocheck_us", "custom_op_us")] if r else []
        return " / ".join("-" if v is None else f"{v:.0f}" for v in vals) or "-"

    for op, rows in by_op.items():
        lines.append(f"| {op} | " + " | ".join(cell(rows.get(n)) for n in sizes) + " |")
    return "\n".join(lines)


def svg(data: dict, floors: dict | None) -> str:
    rows, seen = [], set()
    for op, size, ts, kvf in _rows(data["results"], "host"):
        if op not in seen:  # the smallest size of each op (the tool runs sizes in increasing order)
            seen.add(op)
            rows.append((op, ts, kvf))
    top = max([v for _, ts, kvf in rows for v in (ts, kvf)] + list((floors or {}).values()) + [1.0])
    scale = (WIDTH - LEFT - 60) / top
    height = 40 + len(rows) * (2 * BAR_H + GAP) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{LEFT}" y="16" font-size="13">host µs per eager call (lower is better)</text>']
    y = 30
    for op, ts, kvf in rows:
        parts.append(f'<text x="{LEFT - 6}" y="{y + BAR_H + 3}" text-anchor="end">{op}</text>')
        for i, (who, v) in enumerate((("tokenspeed", ts), ("kvformats", kvf))):
            yy = y + i * BAR_H
            parts.append(f'<rect x="{LEFT}" y="{yy}" width="{v * scale:.1f}" height="{BAR_H - 1}" '
                         f'fill="{COLORS[who]}"/>')
            parts.append(f'<text x="{LEFT + v * scale + 4:.1f}" y="{yy + BAR_H - 2}">{v:.0f}</text>')
        y += 2 * BAR_H + GAP
    for k, v in (floors or {}).items():
        x = LEFT + v * scale
        parts.append(f'<line x1="{x:.1f}" y1="26" x2="{x:.1f}" y2="{y}" stroke="#c62828" stroke-dasharray="3,3"/>')
        parts.append(f'<text x="{x + 3:.1f}" y="{y + 12}" fill="#c62828">{k}</text>')
        y += 13
    legend_y = height - 10
    for i, (who, color) in enumerate(COLORS.items()):
        parts.append(f'<rect x="{LEFT + i * 120}" y="{legend_y - 9}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{LEFT + i * 120 + 14}" y="{legend_y}">{who}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side_by_side")
    ap.add_argument("--host", help="benchmarks/bench_host_gpu.py --json output of the same run (floors)")
    ap.add_argument("--svg")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.side_by_side).read_text())
    floors = None
    if args.host:
        all_floors = json.loads(Path(args.host).read_text())["floors"]
        floors = {k: v for k, v in all_floors.items() if "20 args" not in k}
    if args.markdown:
        print(markdown(data, floors))
        if args.host:
            print()
            print(host_table(json.loads(Path(args.host).read_text())))
    if args.svg:
        Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
        Path(args.svg).write_text(svg(data, floors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
