"""Where the host time of an eager call goes: cProfile over back-to-back calls of public ops.

    python3 -m benchmarks profile_host_gpu --only csa_compress,dequantize_gather [--rows 64] [--calls 400]

For each prepared call of ``tests.harness.calls.public_calls`` whose name contains one of ``--only``
(default mode), prints the µs per call without the profiler, then the functions with the most
own time per call under it (the profiler's overhead inflates small functions; read the ranking,
not the sums). Also reports whether each Triton kernel launched took the direct path
(``kvformats_kernels.launch``: compiled kernels kept per specialization).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

from tests.harness.calls import public_calls


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="comma-separated substrings of op names")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--top", type=int, default=18)
    args = ap.parse_args(argv)
    keep = args.only.split(",")
    calls = {n: c for n, c in public_calls("cuda", args.rows).items() if any(k in n for k in keep)}
    from kvformats_kernels import launch

    for name, fn in calls.items():
        for _ in range(5):
            fn()
        us = per_call_us(fn, args.calls)
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"\n== {name} ({args.rows} rows): {us:.1f} µs per call")
        stats = pstats.Stats(prof)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
        print(f"{'own µs/call':>12} {'calls/call':>10}  function")
        for (path, line, func), (_, ncalls, tottime, _, _) in rows:
            print(f"{tottime / args.calls * 1e6:12.2f} {ncalls / args.calls:10.1f}  {Path(path).name}:{line} {func}")
    direct = {fk.fn.__name__: (fk.direct, len(fk.compiled)) for fk in launch._WRAPPED.values()}
    print("\nkernel: (direct path on, specializations kept)")
    for name, (on, kept) in sorted(direct.items()):
        print(f"  {name}: {on}, {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
