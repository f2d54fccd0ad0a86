"""Run the reliability state machines (tests/reliability) at scale and print what ran.

    python tools/fuzz_at_scale.py --examples 100000                  # reference (+ kernels on CUDA)
    python tools/fuzz_at_scale.py --examples 20000 --interpreter     # + Triton launchers on CPU

``--examples N`` is the number of fuzzed operations (state-machine steps: encodes, decodes,
gathers, paged reads, page reuse, re-encodes, compressor saves/inserts) to run, split evenly over
the machines: one per registered format and backend, plus the compressor pipeline. Each step
draws fresh hypothesis data and ends with a byte-for-byte check of the whole guarded arena
against the model. Prints a table of counts per format, backend and op, the hypothesis examples
(machine runs), and the bytes changed outside written rows (0 unless a check failed, which also
ends the run with the failing example, shrunk, and exit status 1). Runs are random (no
example database): each invocation explores new inputs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=100_000, help="fuzzed operations in all (default 100000)")
    p.add_argument("--interpreter", action="store_true",
                   help="without CUDA, also fuzz the Triton launchers under TRITON_INTERPRET=1 (slow)")
    p.add_argument("--steps", type=int, default=25, help="steps per state-machine run (default 25)")
    p.add_argument("--formats", nargs="*", default=None, help="only these formats (default: all registered)")
    p.add_argument("--no-pipeline", action="store_true", help="skip the compressor pipeline machine")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.interpreter and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "reliability")]
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    import kvformats as kvf
    from codec_machine import make_codec_machine
    from compress_machine import make_compress_machine
    from reliability_harness import ARENA_BYTES_CHECKED, COUNTS, MISMATCHED, backend_has, triton_available

    backends = ["reference"]
    if torch.cuda.is_available() or args.interpreter:
        if triton_available():
            backends.append("triton")
        else:
            print("note: Triton is not importable; fuzzing the reference only")
    machines = []
    for fmt in args.formats or kvf.list_formats():
        for b in backends:
            if b == "reference" or backend_has(b, fmt, "encode"):
                machines.append((fmt, b, make_codec_machine(fmt, b)))
    if not args.no_pipeline:
        machines.append(("compress_pipeline", "reference", make_compress_machine("reference")))

    per_machine = max(1, args.examples // len(machines))
    runs = {}
    started = time.time()
    for name, b, cls in machines:
        done, n_runs, batch = 0, 0, 0
        t0 = time.time()
        while done < per_machine:
            batch = max(1, min(200, (per_machine - done) // args.steps + 1))
            cfg = settings(max_examples=batch, stateful_step_count=args.steps, deadline=None, database=None,
                           phases=[Phase.explicit, Phase.generate, Phase.shrink],
                           suppress_health_check=list(HealthCheck))
            run_state_machine_as_test(cls, settings=cfg)
            n_runs += batch
            done = sum(v for k, v in COUNTS.items() if k[0] == name and k[1] == b)
        runs[(name, b)] = (n_runs, time.time() - t0)
        print(f"[{time.time() - started:7.1f}s] {name:<18} {b:<9} {done:>8} ops in {n_runs} examples", flush=True)

    print()
    print(f"date: {datetime.date.today().isoformat()}   machine: {platform.node()} ({platform.machine()}, "
          f"{os.cpu_count()} CPUs, {'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'})"
          f"   triton: {'compiled' if torch.cuda.is_available() and 'triton' in backends else 'interpreter' if 'triton' in backends else 'not run'}"
          f"   --examples {args.examples} --steps {args.steps}")
    print(f"{'format':<18} {'backend':<9} {'op':<24} {'count':>9}")
    total = 0
    for (name, b, op), v in sorted(COUNTS.items()):
        print(f"{name:<18} {b:<9} {op:<24} {v:>9}")
        total += v
    examples = sum(r[0] for r in runs.values())
    print(f"total fuzzed operations: {total}   hypothesis examples (machine runs): {examples}   "
          f"arena bytes compared: {ARENA_BYTES_CHECKED[0]}   wall: {time.time() - started:.0f}s")
    print(f"bytes changed outside written rows: {MISMATCHED[0]}")
    return 0 if MISMATCHED[0] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
