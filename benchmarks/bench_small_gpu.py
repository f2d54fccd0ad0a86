"""Launch configurations of calls of few rows (``kvformats_kernels.tuning.SMALL`` and ``FEW``),
on the GPU.

    python3 -m benchmarks small_gpu [--rows 64] [--rounds 2] [--sets 1] [--keys fp8_ds_mla.decode,...]

At ``--rows`` rows (at most SMALL_ROWS; FEW's overrides apply up to FEW_ROWS) a call's time is
one program's chain of dependent loads and instructions plus the launch, so rows per program
and warps per program trade parallel programs against each program's share of the arithmetic.
For every (kernel module, op) of SMALL, each candidate of CANDIDATES (the library's current setting
at ``--rows`` first, marked *) is set in turn and the codec ops that use it are timed: per-call
µs inside a CUDA graph, prefill-like slots (the rows in one page taken at random) and random
slots (a random permutation of a 1 GiB cache's slots), as in bench_kernels_gpu.py. The rounds
go over all candidates before repeating, so drift falls on each alike; the table prints every
round's figure (the same config can differ by ~0.2 µs between rounds: compare within a round
and across all of them). ``--sets 8`` cycles each call through 8 slot and input sets instead of
one (the yardsticks of bench_bounds_gpu.py do), so consecutive calls touch different pages.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess

import torch
from benchmarks.bench_kernels_gpu import GRAPH_CALLS, SWEEP_USES, allocate, make_input, make_slots, op_fns
from benchmarks.gpu_timing import graph_per_call_us

import kvformats as kvf

CANDIDATES: dict[tuple[str, str], list[dict[str, int]]] = {
    ("fp8_ds_mla", "encode"): [dict(block_m=m, num_warps=w) for m, w in ((1, 1), (1, 2), (2, 1), (2, 2))],
    ("fp8_ds_mla", "decode"): [dict(block_m=m, num_warps=w) for m, w in ((2, 1), (1, 1), (1, 2), (2, 2), (4, 2))],
    ("indexer", "encode"): [dict(block_m=m, num_warps=w) for m, w in ((2, 1), (1, 1), (4, 1), (2, 2))],
    # fewer than 32 (row, block) pairs per warp take the layout without a block per lane (indexer.py)
    ("indexer", "encode_mxfp4"): [dict(block_m=m, num_warps=w)
                                  for m, w in ((8, 1), (16, 2), (4, 1), (2, 1), (1, 1))],
    ("indexer", "decode"): [dict(block_m=m, num_warps=w) for m, w in ((2, 1), (1, 1), (4, 1), (4, 2), (8, 2))],
    **{("state", op): [dict(block_m=1, block_w=bw, num_warps=w)
                       for bw, w in ((1024, 4), (512, 2), (512, 4), (256, 1), (256, 2), (2048, 4), (2048, 8))]
       for op in ("encode", "gather")},
    ("rows", "gather"): [dict(tile_bytes=t, num_warps=w) for t, w in ((1024, 1), (512, 1), (2048, 1), (2048, 2))],
}
CODEC_OPS = ("encode", "decode", "gather")


def uses(key: tuple[str, str]) -> list[tuple[str, str]]:
    """(format, codec op) timed for config ``key``; the state gather's config also serves the state decode."""
    found = [(fmt, op) for fmt, op in SWEEP_USES[key] if op in CODEC_OPS]
    if key == ("state", "gather"):
        found.append(("compressor_state", "decode"))
    return found


def candidates_of(key: tuple[str, str], current: dict[str, int]) -> list[dict[str, int]]:
    """The library's current setting at this many rows (SMALL's, or FEW's on top; of the keys
    CANDIDATES varies), then the other candidates."""
    now = {k: current[k] for k in CANDIDATES[key][0]}
    return [now] + [c for c in CANDIDATES[key] if c != now]


def setups(formats: set[str], rows: int, sets: int, g: torch.Generator) -> dict:
    """format -> (layout, {pattern: [(x, kwargs, slots)] * sets}) on a 1 GiB cache each."""
    import kvformats_kernels as kk

    out = {}
    for fmt in sorted(formats):
        layout = kvf.get_format(fmt)
        impl = kk.IMPLEMENTATIONS[fmt]
        cache, pages = allocate(layout, 1.0)
        by_pattern = {}
        for pattern in ("prefill", "random"):
            by_pattern[pattern] = []
            for _ in range(sets):
                x, kw = make_input(layout, rows, g)
                slots = make_slots(layout, pages, rows, pattern, g)
                impl.encode(layout, x, cache, slots, **kw)  # the decoders read written rows
                by_pattern[pattern].append((x, kw, slots))
        out[fmt] = (layout, impl, cache, by_pattern)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sets", type=int, default=1)
    ap.add_argument("--keys", default=None, help="only these configs, e.g. fp8_ds_mla.decode,state.gather")
    args = ap.parse_args()
    from kvformats_kernels import _common as cm
    from kvformats_kernels import settings, tuning

    if args.rows > tuning.BOUNDS["small_rows"]:
        raise SystemExit(f"--rows {args.rows}: calls of more than {tuning.BOUNDS['small_rows']} rows do not take SMALL")
    keys = [k for k in CANDIDATES if args.keys is None or ".".join(k) in args.keys.split(",")]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"date {datetime.date.today()}  device {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"git {rev or '?'} (+ working tree)  rows {args.rows}  slot sets per call {args.sets}", flush=True)
    data = setups({fmt for k in keys for fmt, _ in uses(k)}, args.rows, args.sets, torch.Generator().manual_seed(0))
    results: dict = {}
    candidates = {key: candidates_of(key, cm.config(*key, args.rows)) for key in keys}
    for _ in range(args.rounds):
        for key in keys:
            default, few = dict(tuning.SMALL[key]), tuning.FEW.get(key)  # a candidate stands alone
            settings.change("few", key, None)
            for cand in candidates[key]:
                settings.change("small", key, {**default, **cand})
                for fmt, op in uses(key):
                    layout, impl, cache, by_pattern = data[fmt]
                    for pattern, sets in by_pattern.items():
                        fns = [op_fns(layout, impl, cache, x, kw, s)[op] for x, kw, s in sets]
                        us = graph_per_call_us(fns, GRAPH_CALLS)
                        results.setdefault((key, tuple(cand.items()), fmt, op, pattern), []).append(us)
            settings.change("small", key, default)
            settings.change("few", key, few)
    print("\n| config | candidate | format | op | prefill µs | random µs |\n| --- | --- | --- | --- | ---: | ---: |")
    for key in keys:
        for i, cand in enumerate(candidates[key]):
            for fmt, op in uses(key):
                figs = [" / ".join(f"{u:.2f}" for u in results[(key, tuple(cand.items()), fmt, op, p)])
                        for p in ("prefill", "random")]
                label = " ".join(f"{k}={v}" for k, v in cand.items()) + (" *" if i == 0 else "")
                print(f"| {'.'.join(key)} | {label} | {fmt} | {op} | {figs[0]} | {figs[1]} |")


if __name__ == "__main__":
    main()
