"""Run the reliability state machines (tests/reliability) at scale and print what ran.

    python tools/fuzz_at_scale.py --examples 100000                  # reference (+ kernels on CUDA)
    python tools/fuzz_at_scale.py --examples 100000 --seconds 240    # stop at whichever comes first
    python tools/fuzz_at_scale.py --examples 20000 --interpreter     # + Triton launchers on CPU
    python tools/fuzz_at_scale.py --examples 100000 --workers 8      # 8 processes, tables summed

``--examples N`` is the number of fuzzed operations (state-machine steps: encodes, decodes,
gathers, paged reads, page reuse, re-encodes, compressor saves/inserts) to run, split evenly over
the machines: one per registered format and backend, plus the compressor pipeline (and its
Triton variant once kernels for its operations are registered). With CUDA, the "triton"
machines run the compiled kernels through the public API on CUDA tensors (``backend="triton"``,
no interpreter); the run counts the compiled Triton launches it saw (Triton's launch hook) and
prints them, so a zero there means no compiled kernel ran. Machines take turns in short batches,
so ``--seconds S`` (a wall-clock budget) stops every machine at about the same share; the count
reached is printed. Each step draws fresh hypothesis data and ends with a byte-for-byte check of
the whole guarded arena against the model. Prints a table of counts per format, backend and op,
the hypothesis examples (machine runs), and the arena bytes that differ from the model (0 unless a
check failed, which also ends the run with the failing example, shrunk, and exit status 1; the
operations hypothesis replays while shrinking are counted too). Compressed rows written by a
kernel are held to the pooling bar (scale bytes equal, values at most one code apart: the
reference pools in another order); the count of values apart is printed. Runs are random (no
example database): each invocation explores new inputs.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH_SECONDS = 2.0  # target length of one machine's batch: the --seconds budget overruns by about this
OVERRUN_SECONDS = 30.0  # a batch still running this long after the budget (kernel compiles) is cut short


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=100_000, help="fuzzed operations in all (default 100000)")
    p.add_argument("--seconds", type=float, default=None,
                   help="wall-clock budget: stop after the batch in progress once it is spent (default: none)")
    p.add_argument("--interpreter", action="store_true",
                   help="without CUDA, also fuzz the Triton launchers under TRITON_INTERPRET=1 (slow)")
    p.add_argument("--steps", type=int, default=25, help="steps per state-machine run (default 25)")
    p.add_argument("--formats", nargs="*", default=None, help="only these formats (default: all registered)")
    p.add_argument("--no-pipeline", action="store_true", help="skip the compressor pipeline machine")
    p.add_argument("--workers", type=int, default=1,
                   help="processes fuzzing in parallel, each with its share of --examples (default 1)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a worker's result, for the parent
    return p.parse_args(argv)


def fuzz(machines, args, counts, started: float) -> dict:
    """Round-robin batches of hypothesis runs until each machine has its share of ``--examples``
    operations or ``--seconds`` is spent (a batch running OVERRUN_SECONDS past it is cut short).
    Returns {(name, backend): {done, runs, seconds}}."""
    from tests.harness.reliability_harness import OutOfTime

    share = max(1, args.examples // max(1, len(machines)))
    state = {(name, b): dict(done=0, runs=0, seconds=0.0, batch=1, share=share) for name, b, _ in machines}
    base = {key: _ops(counts, *key) for key in state}  # counts of earlier runs in this process
    budget = float("inf") if args.seconds is None else args.seconds
    # the budget (plus OVERRUN_SECONDS) cuts a running batch at its next operation (OpCounter);
    # SIGTERM (a --workers parent at its deadline) does the same at once
    if args.seconds is not None:
        counts.deadline = time.monotonic() + budget - (time.time() - started) + OVERRUN_SECONDS

    def stop_now(signum, frame):
        counts.deadline = float("-inf")

    previous = signal.signal(signal.SIGTERM, stop_now)
    try:
        _batches(machines, args, counts, started, state, base, share, budget)
    except OutOfTime:
        print(f"[{time.time() - started:7.1f}s] out of time: a batch was cut short", flush=True)
    finally:
        counts.deadline = float("inf")
        signal.signal(signal.SIGTERM, previous)
    for (name, b), st in state.items():  # operations of a batch cut short count too (each was checked)
        st["done"] = _ops(counts, name, b) - base[(name, b)]
    return state


def _batches(machines, args, counts, started, state, base, share, budget) -> None:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    last_report = started
    while time.time() - started < budget:
        pending = [(name, b, cls) for name, b, cls in machines if state[(name, b)]["done"] < share]
        if not pending:
            break
        # the machine furthest behind goes next, so a budget cut leaves them all near one count
        name, b, cls = min(pending, key=lambda m: state[(m[0], m[1])]["done"])
        st = state[(name, b)]
        batch = max(1, min(st["batch"], (share - st["done"]) // args.steps + 1))
        cfg = settings(max_examples=batch, stateful_step_count=args.steps, deadline=None, database=None,
                       phases=[Phase.explicit, Phase.generate, Phase.shrink],
                       suppress_health_check=list(HealthCheck))
        t0 = time.time()
        run_state_machine_as_test(cls, settings=cfg)
        took = time.time() - t0
        st["runs"] += batch
        st["seconds"] += took
        st["done"] = _ops(counts, name, b) - base[(name, b)]
        # next batch: about BATCH_SECONDS at this machine's measured rate, growing at most 2x (the
        # first examples are the cheap ones), at most 200 runs
        st["batch"] = max(1, min(200, 2 * batch, int(BATCH_SECONDS * batch / max(took, 1e-3))))
        if time.time() - last_report > 30:
            last_report = time.time()
            print(f"[{last_report - started:7.1f}s] {sum(x['done'] for x in state.values()):>8} operations", flush=True)


def unregistered_ops(machines, backend_has) -> list[str]:
    """``fmt.op`` that the harness offers to a triton machine but the registry does not hold."""
    from kvformats.codec import paged_ops as paged
    from kvformats.codec import registry

    registry._load_kernels()
    return [f"{fmt}.{op}" for fmt, b, _ in machines if b == "triton" and fmt != "compress_pipeline"
            for op in ("encode", "decode", "gather", *paged.PAGED_OPS)
            if backend_has(b, fmt, op) and "triton" not in registry._OPS.get((fmt, op), {})]


def triton_mode(torch, backends) -> str:
    if "triton" not in backends:
        return "not run"
    compiled = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    return "compiled" if compiled else "interpreter"


def _ops(counts, name: str, backend: str) -> int:
    return sum(v for k, v in counts.items() if k[0] == name and k[1] == backend)


def run_workers(args, argv) -> int:
    """--workers N: N processes of this script with --examples / N each (fresh hypothesis data
    in each; compiled kernels shared through Triton's on-disk cache); their tables summed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--workers" in argv:
        i = argv.index("--workers")
        del argv[i:i + 2]
    argv = [a for a in argv if not a.startswith("--workers=")]
    share = -(-args.examples // args.workers)
    started = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--examples", str(share), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(args.workers)]
    counts, runs, outside, arena, launches, lines, failed = collections.Counter(), {}, 0, 0, 0, [], 0
    pooled = [0, 0]
    deadline = None if args.seconds is None else started + args.seconds + OVERRUN_SECONDS + 60
    for p in procs:
        try:
            out, _ = p.communicate(timeout=None if deadline is None else max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:  # stuck past its own deadline: SIGTERM makes it report
            p.terminate()
            try:
                out, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
        result = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
        if not result:
            failed += 1
            lines.append(out[-4000:])
            continue
        r = json.loads(result[-1][len(RESULT):])
        for name, b, op, v in r["counts"]:
            counts[(name, b, op)] += v
        for name, b, st in r["runs"]:
            acc = runs.setdefault((name, b), dict(done=0, runs=0, seconds=0.0, share=0))
            for k in acc:
                acc[k] += st[k]
        outside += r["mismatched"]
        arena += r["arena"]
        launches += r["launches"]
        pooled = [a + b for a, b in zip(pooled, r["pooled_apart"])]
        if r["mismatched"] or p.returncode:  # its failing example and error (the result line is summed above)
            lines.append("\n".join(ln for ln in out.splitlines() if not ln.startswith(RESULT))[-8000:])
        header = r["header"].replace(f"--examples {share}", f"--examples {args.examples} ({share} per worker)")
    for text in lines:
        print(text)
    if failed == len(procs):
        print(f"every worker failed ({failed})")
        return 1
    report(header + f"   workers: {args.workers} ({failed} failed)", counts, runs, arena, started, args,
           r["triton"], launches, outside, pooled)
    return 1 if outside or failed else 0


def report(header, counts, runs, arena, started, args, triton_line, launches, mismatched, pooled) -> None:
    print()
    print(header)
    print(f"{'format':<18} {'backend':<9} {'op':<24} {'count':>9}")
    total = 0
    for (name, b, op), v in sorted(counts.items()):
        print(f"{name:<18} {b:<9} {op:<24} {v:>9}")
        total += v
    for (name, b), st in runs.items():
        print(f"{name:<18} {b:<9} {'(machine total)':<24} {st['done']:>9}   in {st['runs']} examples, "
              f"{st['seconds']:.1f} s ({st['done'] / max(st['seconds'], 1e-9):.0f} ops/s)")
    examples = sum(r["runs"] for r in runs.values())
    print(f"total fuzzed operations: {total}   hypothesis examples (machine runs): {examples}   "
          f"arena bytes compared: {arena}   wall: {time.time() - started:.0f}s")
    if any(st["done"] < st["share"] for st in runs.values()):
        print(f"stopped by the --seconds {args.seconds:g} budget: {total} of --examples {args.examples} operations")
    if triton_line:
        print(triton_line.replace("{launches}", str(launches)))
    if pooled[1]:
        print(f"compressed rows written by kernels: {pooled[0]} of {pooled[1]} values one code apart from the "
              f"reference ({pooled[0] / pooled[1]:.1e}; the pooling bar, kvformats.testing.tolerance; every other byte exact)")
    print(f"arena bytes differing from the model (outside written rows or in them): {mismatched}")


RESULT = "FUZZ-WORKER-RESULT "


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.workers > 1:
        return run_workers(args, argv)
    import torch

    if args.interpreter and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    sys.path.insert(0, str(ROOT))  # the repository's kvformats, installed or not
    import kvformats as kvf
    from tests.harness.codec_machine import make_codec_machine
    from tests.harness.compress_machine import make_compress_machine
    from tests.harness.launch_count import LaunchCounter
    from tests.harness.reliability_harness import (ARENA_BYTES_CHECKED, COUNTS, MISMATCHED, POOLED_APART,
                                                       backend_has, family_kernel, triton_available)

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "1":
        print("warning: TRITON_INTERPRET=1 is set: the triton machines run the interpreter, not compiled kernels")
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
        if "triton" in backends and all(family_kernel("deepseek_v4", op)
                                        for op in ("save_compressor_state", "compress_kv_insert")):
            machines.append(("compress_pipeline", "triton", make_compress_machine("triton")))

    missing = unregistered_ops(machines, backend_has) if torch.cuda.is_available() else []
    if missing:  # the machine would call them through backend="triton" and stop at BackendUnavailableError
        print("the triton machines would call ops that have a launcher but no registered Triton kernel on CUDA: "
              + ", ".join(missing) + "; reliability_harness.backend_has must consult kvformats.codec.registry on CUDA")
        return 2
    counter = LaunchCounter()
    counted = counter.install()
    before, mismatched_before = collections.Counter(COUNTS), MISMATCHED[0]
    started = time.time()
    runs = fuzz(machines, args, COUNTS, started)
    counter.remove()
    counts = COUNTS - before
    mismatched = MISMATCHED[0] - mismatched_before
    header = (f"date: {datetime.date.today().isoformat()}   machine: {platform.node()} ({platform.machine()}, "
              f"{os.cpu_count()} CPUs, {'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'})"
              f"   triton: {triton_mode(torch, backends)}   --examples {args.examples} --steps {args.steps}")
    triton_line = ""
    if "triton" in backends:
        triton_line = ("compiled Triton launches: " + ("{launches}" if counted else "not counted")
                       + ("" if torch.cuda.is_available() else " (the interpreter launches nothing compiled)"))
    if args.json:
        print(RESULT + json.dumps(dict(
            counts=[[*k, v] for k, v in counts.items()], runs=[[*k, st] for k, st in runs.items()],
            mismatched=mismatched, arena=ARENA_BYTES_CHECKED[0], header=header, triton=triton_line,
            pooled_apart=POOLED_APART,
            launches=counter.total() if counted else 0)), flush=True)
    else:
        report(header, counts, runs, ARENA_BYTES_CHECKED[0], started, args, triton_line,
               counter.total() if counted else 0, mismatched, POOLED_APART)
    return 0 if mismatched == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
