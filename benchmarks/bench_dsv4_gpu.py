"""GPU benchmark of the kvformats.deepseek_v4 Triton kernels against the copy bandwidth and the
reference backend.

    python3 -m benchmarks dsv4_gpu [--parts compress,query,indices] [--sizes 64,131072] [--out f.md]
    python3 -m benchmarks dsv4_gpu --parts query --ops hadamard_transform --set query.hadamard.lane_store=0
    python3 -m benchmarks dsv4_gpu --parts compress --ops compress_kv_insert --sizes 64 \
        --sweep compress.kv:128.split_bd=16,32,64 --sweep compress.kv:128.split_warps=2,4

Cases come from ``dsv4_cases_<part>.py`` (each a ``cases(sizes)`` list of ``dsv4_case.Case``).
Per case it prints: eager µs (do_bench median, L2 flushed between calls; at decode sizes this is
Python launch cost), graph µs (median per-call time replayed inside a CUDA graph: 50 calls for
rows <= 512, else 4), the fewest bytes the op must move, GB/s and % of the device-to-device
copy bandwidth measured in the same run (from the graph time), and the reference backend's
do_bench median on the same GPU. A case that raises prints its error in the table and the run
goes on. ``--sweep`` instead times every combination of the listed launch constants on the same
cases (graph µs and % of copy bandwidth only), the cases built once.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import subprocess
import sys
import traceback
from pathlib import Path

import torch

from benchmarks.gpu_timing import bench, copy_bandwidth, graph_per_call_us

PARTS = ("compress", "query", "indices")


def time_case(case, bw: float, reference: bool) -> str:
    eager_us = bench(case.run_triton) * 1e3
    graph_us = graph_per_call_us([case.run_triton], 50 if case.rows <= 512 else 4)
    gbs = case.min_bytes / graph_us / 1e3
    ref_us = f"{bench(case.run_reference, rep_ms=100) * 1e3:.1f}" if reference else "-"
    return (f"| {case.op} | {case.label} | {eager_us:.1f} | {graph_us:.2f} | {case.min_bytes / 1e6:.2f} | "
            f"{gbs:.0f} | {100 * gbs / bw:.1f} | {ref_us} |")


def apply_setting(item: str) -> None:
    """``MODULE.ENTRY.KEY=INT``: CONFIG[ENTRY][KEY] = INT in kvformats_kernels.dsv4.MODULE (an
    ENTRY of the form ``what:ratio`` names a tuple key such as ("kv", 4))."""
    path, _, value = item.partition("=")
    _set(_config_slot(path), int(value))


def _set(slot, value: int) -> None:
    """Through the settings' own function, which drops recorded replay plans."""
    from kvformats_kernels import settings

    module, entry, key = slot
    settings.change(module, entry, {**settings.SETTINGS.tables[module][entry], key: value})


def _config_slot(path: str):
    """(settings table, entry key, constant name) of ``MODULE.ENTRY.KEY`` (the table of
    kvformats_kernels.dsv4.MODULE.CONFIG is named after its module)."""
    module, entry, key = path.split(".")
    config = importlib.import_module(f"kvformats_kernels.dsv4.{module}").CONFIG
    if ":" in entry:
        what, ratio = entry.split(":")
        entry = (what, int(ratio))
    if entry not in config or not hasattr(config[entry], "keys") or key not in config[entry]:
        raise SystemExit(f"{path}: no {key!r} in {module}.CONFIG[{entry!r}]")
    return config.name, entry, key


def sweep(cases, sweeps: list[str], bw: float, log) -> int:
    """Time every combination of ``MODULE.ENTRY.KEY=V1,V2,...`` on ``cases``; returns failures."""
    axes = []
    for item in sweeps:
        path, _, values = item.partition("=")
        axes.append((path, _config_slot(path), [int(v) for v in values.split(",")]))
    log("| settings | op | case | graph µs | GB/s | % copy BW |")
    log("| --- | --- | --- | ---: | ---: | ---: |")
    from kvformats_kernels import settings

    saved = {slot[0]: settings.snapshot(slot[0]) for _, slot, _ in axes}
    failures = 0
    for combo in itertools.product(*(values for _, _, values in axes)):
        for (path, slot, _), value in zip(axes, combo):
            _set(slot, value)
        label = " ".join(f"{path.split('.', 1)[1]}={v}" for (path, _, _), v in zip(axes, combo))
        for case in cases:
            try:
                us = graph_per_call_us([case.run_triton], 50 if case.rows <= 512 else 4)
                gbs = case.min_bytes / us / 1e3
                log(f"| {label} | {case.op} | {case.label} | {us:.2f} | {gbs:.0f} | {100 * gbs / bw:.1f} |")
            except Exception as err:
                failures += 1
                log(f"| {label} | {case.op} | {case.label} | ERROR {type(err).__name__}: {str(err)[:100]} | | |")
    for name, table in saved.items():
        settings.restore(name, table)
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--sizes", default="64,131072")
    ap.add_argument("--no-reference", dest="reference", action="store_false")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--ops", default=None, help="only these operations (comma-separated)")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.ENTRY.KEY=INT",
                    help="override a launch constant of kvformats_kernels.dsv4.MODULE.CONFIG, e.g. "
                         "query.inv_rope.lane_store=0 or compress.kv:4.block_t=8 (repeatable)")
    ap.add_argument("--sweep", action="append", default=[], metavar="MODULE.ENTRY.KEY=V1,V2,...",
                    help="time every combination of these values instead of the table (repeatable)")
    args = ap.parse_args(argv)
    for item in args.set:
        apply_setting(item)
    import triton

    lines: list[str] = []

    def log(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    log(f"date {datetime.date.today()}  device {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"triton {triton.__version__}  git {rev or '?'} (+ working tree)"
        + (f"  settings {' '.join(args.set)}" if args.set else ""))
    bw = copy_bandwidth()
    log(f"device-to-device copy bandwidth (read + write): {bw:.0f} GB/s")
    log()
    if not args.sweep:
        log("| op | case | eager µs | graph µs | min MB | GB/s | % copy BW | reference µs |")
        log("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    sizes = tuple(int(s) for s in args.sizes.split(","))
    failures = 0
    hows: dict[str, str] = {}
    for part in args.parts.split(","):
        try:
            cases = importlib.import_module(f"benchmarks.dsv4_cases_{part}").cases(sizes)
        except Exception as err:  # a part that cannot build its inputs is reported, the rest still runs
            failures += 1
            log(f"| {part} | (building cases) | ERROR {type(err).__name__}: {err} | | | | | |")
            traceback.print_exc()
            continue
        cases = [c for c in cases if not args.ops or c.op in args.ops.split(",")]
        if args.sweep:
            failures += sweep(cases, args.sweep, bw, log)
            continue
        for case in cases:
            hows.setdefault(case.op, case.how)
            try:
                log(time_case(case, bw, args.reference))
            except Exception as err:
                failures += 1
                log(f"| {case.op} | {case.label} | ERROR {type(err).__name__}: {str(err)[:120]} | | | | | |")
            torch.cuda.empty_cache()
    log()
    for op, how in hows.items():
        log(f"* {op}: min bytes = {how}")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
