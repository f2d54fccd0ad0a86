"""Host time per call of every public op's Triton path, without a GPU: the Python work of
validation, dispatch, launchers and replay, with the kernel launch itself stubbed out.

    python3 -m benchmarks host_overhead_cpu [--calls 2000] [--rows 64] [--only encode,dsv4]
    python3 -m benchmarks host_overhead_cpu --compat --calls 200   # native vs its tokenspeed drop-in

The prepared calls of ``tests.harness.calls.public_calls`` run on CPU tensors inside
``tests.harness.launch_stub.stubbed_launches`` (the path CUDA tensors take, each launch logged
instead of run), back to back. Two columns: the full path (``KVFORMATS_REPLAY=0``: checks,
dispatch, launcher) and a replayed call (``kvformats.runtime.replay``: the metadata key, the
allocations, the launch arguments). Triton's C launcher and the driver come on top on a GPU
(benchmarks/bench_host_gpu.py).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.pop("TRITON_INTERPRET", None)  # the stub replaces the launch; nothing is interpreted

import torch

from kvformats.runtime import replay
from tests.harness.calls import public_calls
from tests.harness.launch_stub import stubbed_launches


def per_call_us(fn, calls: int) -> float:
    for _ in range(min(50, calls)):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--only", default="", help="comma-separated substrings of the call names")
    p.add_argument("--custom", action="store_true", help="through the torch.library custom ops")
    p.add_argument("--rounds", type=int, default=15, help="--compat: interleaved rounds (best of each side)")
    p.add_argument("--compat", action="store_true",
                   help="the tokenspeed drop-ins (kvformats.compat.tokenspeed; tokenspeed_kernel's dsv4 / dsv41: the "
                        "names dsv4.* / dsv41.*) beside the native calls, and their ratio")
    p.add_argument("--compat-set", choices=("all", "seed", "kernel"), default="all",
                   help="--compat: the seed-era drop-ins (kvformats.compat.tokenspeed), the tokenspeed-kernel 0.1.4 "
                        "ones (kvformats.compat.tokenspeed_kernel), or both")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    only = [s for s in args.only.split(",") if s]
    if args.compat:
        return compat_table(args, only)
    print(f"host µs per call, {args.rows} rows, kernel launch stubbed (torch {torch.__version__})")
    print("| op | full path | replayed |")
    print("| --- | ---: | ---: |")
    with stubbed_launches(keep_log=False):
        calls = public_calls("cpu", args.rows, custom=args.custom)
        for name, fn in calls.items():
            if only and not any(s in name for s in only):
                continue
            figures = []
            for enabled in (False, True):
                replay.SWITCHES.enabled = enabled
                figures.append(per_call_us(fn, args.calls))
            print(f"| {name} | {figures[0]:.1f} | {figures[1]:.1f} |")
    replay.SWITCHES.enabled = True


def _round_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def compat_table(args, only) -> None:
    """Native call and its tokenspeed drop-in on the same inputs, replayed (the path an engine's
    steady state takes) and on the full path; the ratio compat / native. The seed-era drop-ins
    (``tests.harness.compat_calls``), then tokenspeed-kernel 0.1.4's (``dsv41.*``, ``dsv4.*``:
    ``tests.harness.compat_kernel_calls``)."""
    from tests.harness.compat_calls import compat_call_pairs
    from tests.harness.compat_kernel_calls import kernel_call_pairs

    which = getattr(args, "compat_set", "all")
    print(f"host µs per call, {args.rows} rows, kernel launch stubbed (torch {torch.__version__}): native kvformats "
          f"call vs its kvformats.compat.tokenspeed / .tokenspeed_kernel drop-in")
    print("| op | native replayed | compat replayed | ratio | native full | compat full | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with stubbed_launches(keep_log=False):
        pairs = {}
        if which in ("all", "seed"):
            pairs.update(compat_call_pairs("cpu", args.rows))
        if which in ("all", "kernel"):
            pairs.update(kernel_call_pairs("cpu", args.rows))
        for name, (native, compat) in pairs.items():
            if only and not any(s in name for s in only):
                continue
            cells = []
            for enabled in (True, False):
                replay.SWITCHES.enabled = enabled
                for _ in range(50):
                    native(), compat()
                a = b = float("inf")
                for _ in range(args.rounds):  # interleaved rounds, the best of each: a shared CPU's noise drops out
                    a, b = min(a, _round_us(native, args.calls)), min(b, _round_us(compat, args.calls))
                cells += [f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}"]
            print(f"| {name} | {' | '.join(cells)} |", flush=True)
    replay.SWITCHES.enabled = True


if __name__ == "__main__":
    main()
