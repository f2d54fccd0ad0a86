"""Offload one request's V4 cache rows to host memory and to a file, and restore them (CPU).

    python3 -m benchmarks tiers_cpu [--tokens 8192 65536 131072] [--layers 4] [--repeat 5]
        [--dst-page-size 32] [--dir DIR] [--json out.json] [--svg chart.svg]
    python3 -m benchmarks tiers_cpu --quality [--tiny] [--json out.json]

A layer stack of DeepSeek V4 shapes (head_dim 512, rope 64, page_size 64, MXFP4 indexer),
alternating CSA layers (SWA, CSA rows, indexer rows, CSA and indexer compressor states) and HCA
layers (SWA, HCA rows, HCA compressor state), as ``transfer_cpu`` builds it: compressed rows in
pools of twice the request's pages at random page ids, the SWA cache and the compressor states
as rings (the SWA window in 3 pages, each state in 4). The tier holds the rows decode still
needs after ``tokens`` positions (``kvformats.transfer.tiers_rows``'s rules). The destination
has pages of ``--dst-page-size`` rows at other random ids.

Per token count, the best of ``--repeat`` times (after one untimed round) of: ``offload`` to
host memory (gather the rows, checksum them), ``restore`` from it (verify the checksums, write
the rows into the other pages), both without the checksums, ``save_tier`` (a cache file in
``--dir``), ``load_tier`` (read, check, verify) then ``restore`` without a second verification;
``offload`` and ``restore`` with the CSA and HCA rows in the cold record (``offload(cold=...)``);
and a one-thread copy of a contiguous buffer of the same bytes, the floor any of them could
reach. GB/s are the tier's (warm) bytes over each time.

``--quality`` instead prints the attention error the cold-tier codec adds
(``kvformats.transfer.tiers_quality.cold_report``) at ``kvformats quality``'s default shapes and
input (2 requests of 1000 synthetic tokens, the last 16 decoded and measured; ``--tiny``: its
tiny shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from kvformats.codec.cold import FP8_DS_MLA_MXFP4
from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer
from kvformats.layout import storage_bytes
from kvformats.transfer import RequestPages, load_tier, offload, restore, save_tier
from kvformats.transfer.tiers_rows import compressed_rows, state_rows, swa_rows

WINDOW = 128
SWA_RING, STATE_RING = 3, 4  # pages: the window (128 rows) over at most 3 pages of 64, a state window over 4


def layouts(page_size: int) -> dict:
    kv = Fp8DsMla(head_dim=512, rope_dim=64, page_size=page_size)
    return {"swa": kv, "csa": kv, "hca": kv, "index": Mxfp4Indexer(head_dim=128, page_size=page_size),
            "csa_state": CompressorState(head_dim=512, ratio=4, page_size=page_size),
            "idx_state": CompressorState(head_dim=128, ratio=4, page_size=page_size),
            "hca_state": CompressorState(head_dim=512, ratio=128, page_size=page_size)}


def layer_rows(tokens: int, layer: int) -> dict[str, tuple[int, int]]:
    """Cache name -> rows the tier keeps of one layer (CSA layers even, HCA layers odd)."""
    out = {"swa": swa_rows(tokens, WINDOW)}
    if layer % 2 == 0:
        out.update(csa=compressed_rows(tokens, 4), index=compressed_rows(tokens, 4),
                   csa_state=state_rows(tokens, 4), idx_state=state_rows(tokens, 4))
    else:
        out.update(hca=compressed_rows(tokens, 128), hca_state=state_rows(tokens, 128))
    return out


def _request_pages(layout, rows: tuple[int, int], ring: int, g) -> tuple[torch.Tensor, int]:
    """(the request's page ids, the pool's page count): a ring table (column j holding page
    j % ring) for a ring cache, else a random choice of a pool twice the request's pages."""
    ps = layout.page_size
    columns = -(-max(rows[1], 1) // ps)
    if ring:
        ring = max(ring, -(-rows[1] // ps) - rows[0] // ps)  # a ring at least as long as the rows it holds
        pool = 2 * ring
        phys = torch.randperm(pool, generator=g)[:ring]
        return phys[torch.arange(columns) % ring], pool
    pool = 2 * columns
    return torch.randperm(pool, generator=g)[:columns], pool


def stack(tokens: int, layers: int, page_size: int, seed: int, fill: bool):
    """({name: RequestPages}, {name: rows}) of the layer stack on one side (random bytes if ``fill``)."""
    g = torch.Generator().manual_seed(seed)
    lays = layouts(page_size)
    caches, rows = {}, {}
    for layer in range(layers):
        for name, span in layer_rows(tokens, layer).items():
            ring = SWA_RING * 64 // page_size if name == "swa" else STATE_RING * 64 // page_size \
                if name.endswith("state") else 0
            pages, pool = _request_pages(lays[name], span, ring, g)
            cache = lays[name].allocate(pool)
            if fill:
                raw = storage_bytes(cache)
                raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))
            key = f"L{layer}.{name}"
            caches[key], rows[key] = RequestPages(lays[name], cache, pages), span
    return caches, rows


def _best(fn, repeat: int) -> float:
    fn()  # untimed: first touch of every page
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(tokens: int, layers: int, repeat: int, dst_page_size: int, directory: str) -> dict:
    src, rows = stack(tokens, layers, 64, seed=1, fill=True)
    dst, _ = stack(tokens, layers, dst_page_size, seed=2, fill=False)
    cold = {k: FP8_DS_MLA_MXFP4 for k in rows if k.endswith((".csa", ".hca"))}
    path = os.path.join(directory, f"tier_{tokens}.kvc")
    tier, cold_tier = offload(src, rows), offload(src, rows, cold=cold)
    secs = {
        "offload host": _best(lambda: offload(src, rows), repeat),
        "restore host": _best(lambda: restore(tier, dst), repeat),
        "offload host, no checksums": _best(lambda: offload(src, rows, checksums=False), repeat),
        "restore host, unverified": _best(lambda: restore(tier, dst, verify=False), repeat),
        "save file": _best(lambda: save_tier(path, tier), repeat),
        "load+restore file": _best(lambda: restore(load_tier(path), dst, verify=False), repeat),
        "offload cold": _best(lambda: offload(src, rows, cold=cold), repeat),
        "restore cold": _best(lambda: restore(cold_tier, dst), repeat),
    }
    file_bytes = os.path.getsize(path)
    os.remove(path)
    flat = torch.ones(tier.nbytes, dtype=torch.uint8)
    out = torch.zeros_like(flat)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    secs["contiguous copy"] = _best(lambda: out.copy_(flat), repeat)
    torch.set_num_threads(threads)
    return {"tokens": tokens, "layers": layers, "dst_page_size": dst_page_size, "bytes": tier.nbytes,
            "cold_bytes": cold_tier.nbytes, "file_bytes": file_bytes,
            "ms": {k: round(v * 1e3, 2) for k, v in secs.items()},
            "GB/s": {k: round(tier.nbytes / v / 1e9, 2) for k, v in secs.items()}}


def table(rows: list[dict]) -> str:
    keys = list(rows[0]["ms"]) if rows else []
    head = "| tokens | MB (cold) | " + " | ".join(f"{k} ms (GB/s)" for k in keys) + " |"
    lines = [head, "|" + "---|" * (2 + len(keys))]
    for r in rows:
        cells = " | ".join(f"{r['ms'][k]} ({r['GB/s'][k]})" for k in keys)
        lines.append(f"| {r['tokens']} | {r['bytes'] / 1e6:.1f} ({r['cold_bytes'] / 1e6:.1f}) | {cells} |")
    return "\n".join(lines)


SERIES = (("offload host", "#1565c0"), ("restore host", "#64b5f6"), ("save file", "#2e7d32"),
          ("load+restore file", "#81c784"), ("contiguous copy", "#bdbdbd"))


def svg(rows: list[dict], machine: str) -> str:
    """Grouped bars: milliseconds of each operation per token count (log-free, plain SVG)."""
    top = max(max(r["ms"][k] for k, _ in SERIES) for r in rows) or 1.0
    left, width, bar, gap = 120, 760, 10, 12
    scale = (width - left - 80) / top
    height = 64 + len(rows) * (len(SERIES) * bar + gap) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">',
           f'<text x="{left}" y="16" font-size="13">Offload and restore one request\'s V4 rows, ms ({machine})</text>']
    for i, (label, color) in enumerate(SERIES):
        x = left + i * 125
        out.append(f'<rect x="{x}" y="26" width="10" height="10" fill="{color}"/><text x="{x + 14}" y="35">{label}'
                   f'</text>')
    y = 50
    for r in rows:
        out.append(f'<text x="{left - 6}" y="{y + len(SERIES) * bar / 2 + 4:.0f}" text-anchor="end">'
                   f'{r["tokens"] // 1024}k ({r["bytes"] / 1e6:.0f} MB)</text>')
        for key, color in SERIES:
            w = r["ms"][key] * scale
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 1}" fill="{color}"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar - 1}">{r["ms"][key]:.1f}</text>')
            y += bar
        y += gap
    out.append("</svg>")
    return "\n".join(out) + "\n"


def quality(tiny: bool) -> dict:
    """The cold tier's attention error (``cold_report``) as ``kvformats quality`` runs."""
    from kvformats.cli.quality import DEFAULTS
    from kvformats.dsv4_layer.pipeline_config import LayerConfig
    from kvformats.dsv4_layer.synthetic import activations
    from kvformats.transfer.tiers_quality import cold_report

    shapes: dict = dict(DEFAULTS)
    tokens, topk = 1000, 64
    if tiny:
        shapes.update(head_dim=128, index_heads=4, window=16, page_size=16, hidden=64)
        tokens, topk = 200, 8
    cfg = LayerConfig(topk=topk, requests=2, max_context=-(-tokens // 128) * 128, **shapes).check()
    x = activations(cfg.hidden, [tokens] * 2, seed=0)
    torch.manual_seed(0)
    return cold_report(cfg, x, tokens - 16, 16)


def quality_table(rep: dict) -> str:
    lines = ["| run | SWA | CSA | HCA | layer |", "|---|---|---|---|---|"]
    for row in rep["rows"]:
        lines.append(f"| {row['run']} | " + " | ".join(f"{row[k]:.4f}" for k in ("swa", "csa", "hca", "layer")) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks tiers_cpu", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", nargs="+", type=int, default=[8192, 65536, 131072])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dst-page-size", type=int, default=32)
    p.add_argument("--dir", help="where the tier files go (default: a temporary directory)")
    p.add_argument("--json")
    p.add_argument("--svg")
    p.add_argument("--quality", action="store_true", help="the cold tier's attention error instead of timings")
    p.add_argument("--tiny", action="store_true", help="with --quality: tiny shapes (seconds)")
    args = p.parse_args()
    if args.quality:
        rep = quality(args.tiny)
        print(f"{rep['tokens_measured']} decode tokens; bytes per token {rep['bytes_per_token']}")
        print(quality_table(rep))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rep, f, indent=1)
                f.write("\n")
        return 0
    machine = f"{os.cpu_count()}-core CPU, {torch.get_num_threads()} torch threads"
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        rows = []
        for tokens in args.tokens:
            rows.append(measure(tokens, args.layers, args.repeat, args.dst_page_size, directory))
            print(json.dumps(rows[-1]), flush=True)
    print(f"torch {torch.__version__}, {machine}")
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)
            f.write("\n")
    if args.svg and rows:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(svg(rows, machine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
