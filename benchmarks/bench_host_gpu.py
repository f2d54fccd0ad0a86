"""Host time per eager call of every public op: what an engine's CPU pays per call.

    python3 -m benchmarks host_gpu [--rows 64,131072] [--calls 50] [--rounds 5] [--json out.json]
    python3 -m benchmarks host_gpu --compat [--rows 64]   # native call vs its tokenspeed drop-in

For each prepared call of ``tests.harness.calls.public_calls`` (through the API and through the
``torch.library`` custom ops), the wall-clock µs per call of ``--calls`` back-to-back calls with
no synchronization between them (the GPU work overlaps unless the launch queue fills; the
queue is drained before each round), median of ``--rounds`` rounds; in the default check mode
and with ``check=False``, and in the default mode on the full path (``full``: every call
validated and worked out anew, as before ``kvformats.runtime.replay`` keeps a plan). Beside them, the floors of the same run: an empty Triton kernel
launch (one argument and twenty), a 1-element torch ``add_``, and the GPU time of each call
(median of CUDA events over a replayed graph of 20 calls) so that host time can be read against
the work it launches. Prints a table; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import kvformats as kvf
from benchmarks.gpu_timing import graph_per_call_us, host_per_call_us
from kvformats.runtime import replay
from tests.harness.calls import public_calls


def floors(calls: int, rounds: int) -> dict:
    import triton

    @triton.jit
    def empty1(x):
        pass

    @triton.jit
    def empty20(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q, r, s, t, u):
        pass

    x = torch.zeros(1, device="cuda")
    ints = list(range(3, 22))
    return {"empty Triton launch, 1 arg": host_per_call_us(lambda: empty1[(1,)](x), calls, rounds),
            "empty Triton launch, 20 args": host_per_call_us(lambda: empty20[(1,)](x, *ints), calls, rounds),
            "torch add_ (1 element)": host_per_call_us(lambda: x.add_(1), calls, rounds)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="64,131072")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated substrings of op names to keep")
    ap.add_argument("--no-graph", action="store_true", help="skip the GPU time column")
    ap.add_argument("--json", default="")
    ap.add_argument("--compat", action="store_true",
                    help="the tokenspeed drop-ins (kvformats.compat.tokenspeed) beside the native calls, and their ratio")
    args = ap.parse_args(argv)
    if args.compat:
        return compat_main(args)
    keep = [s for s in args.only.split(",") if s]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "floors": {}, "ops": []}
    result["floors"] = floors(args.calls, args.rounds)
    for label, us in result["floors"].items():
        print(f"{label:<60} {us:8.1f} us")
    print(f"\n{'op':<48} {'rows':>7} {'default':>8} {'full':>8} {'nocheck':>8} {'op':>8} {'GPU us':>8}")
    for rows in (int(r) for r in args.rows.split(",")):
        default, nocheck = public_calls("cuda", rows), public_calls("cuda", rows, check=False)
        custom = public_calls("cuda", rows, custom=True)
        for name, call in default.items():
            if keep and not any(k in name for k in keep):
                continue
            row = {"op": name, "rows": rows}
            for key, fn in (("default_us", call), ("full_us", call), ("nocheck_us", nocheck[name]),
                            ("custom_op_us", custom[name]), ("gpu_us", None if args.no_graph else call)):
                replay.SWITCHES.enabled = key != "full_us"  # the full path: what a call costs before it is replayed
                try:
                    row[key] = None if fn is None else (graph_per_call_us([fn], 20) if key == "gpu_us"
                                                        else host_per_call_us(fn, args.calls, args.rounds))
                except Exception as err:  # a failing path is reported in its cell, the run goes on
                    row[key], row[key + "_error"] = None, f"{type(err).__name__}: {str(err)[:200]}"
                finally:
                    replay.SWITCHES.enabled = True
            result["ops"].append(row)
            cells = [("-" if row[k] is None else f"{row[k]:.1f}") for k in
                     ("default_us", "full_us", "nocheck_us", "custom_op_us")]
            gpu = "-" if row["gpu_us"] is None else f"{row['gpu_us']:.2f}"
            print(f"{name:<48} {rows:>7} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8} {cells[3]:>8} {gpu:>8}",
                  flush=True)
        del default, nocheck, custom
        torch.cuda.empty_cache()
    if kvf.pending_error("cuda") is not None:
        print("error record set: a call recorded a violation", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def _tokenspeed_api():
    """tokenspeed's own functions by their names (files at ``$TOKENSPEED_SRC``, import shims at
    ``$TOKENSPEED_SHIMS``, as tests/compat/test_tokenspeed_compat_gpu.py takes them), or None."""
    import importlib
    import os
    import types

    src, shims = os.environ.get("TOKENSPEED_SRC", ".tokenspeed"), os.environ.get("TOKENSPEED_SHIMS", "")
    if not shims or not Path(src, "tokenspeed").is_dir():
        return None
    sys.path[:0] = [shims, src]
    api = types.SimpleNamespace()
    for module in ("tokenspeed_kernel.ops.attention.triton.deepseek_v4", "tokenspeed.runtime.layers.attention.deepseek_v4_ops"):
        vars(api).update({k: v for k, v in vars(importlib.import_module(module)).items() if not k.startswith("_")})
    return api


def _best(fn, args) -> float | None:
    try:
        return min(host_per_call_us(fn, args.calls, 1) for _ in range(args.rounds))
    except Exception:  # a tokenspeed function that needs its CUDA extension, or a name it lacks
        return None


def compat_main(args) -> int:
    """Host µs per call of each native kvformats call and its kvformats.compat.tokenspeed drop-in on
    the same inputs (``tests.harness.compat_calls``), default check mode; with tokenspeed's files
    (``$TOKENSPEED_SRC``, ``$TOKENSPEED_SHIMS``) also tokenspeed's own function by the same name."""
    from tests.harness.compat_calls import compat_call_pairs

    keep = [s for s in args.only.split(",") if s]
    api = _tokenspeed_api()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ops": []}
    print(f"{'op':<44} {'rows':>7} {'native':>8} {'compat':>8} {'ratio':>6} {'tokenspeed':>10}")
    for rows in (int(r) for r in args.rows.split(",")):
        theirs = compat_call_pairs("cuda", rows, api=api) if api is not None else {}
        for name, (native, compat) in compat_call_pairs("cuda", rows).items():
            if keep and not any(k in name for k in keep):
                continue
            a = b = float("inf")
            for _ in range(args.rounds):  # interleaved: the same machine state for both sides
                a = min(a, host_per_call_us(native, args.calls, 1))
                b = min(b, host_per_call_us(compat, args.calls, 1))
            t = _best(theirs[name][1], args) if name in theirs else None
            result["ops"].append({"op": name, "rows": rows, "native_us": a, "compat_us": b, "ratio": b / a,
                                  "tokenspeed_us": t})
            print(f"{name:<44} {rows:>7} {a:8.1f} {b:8.1f} {b / a:6.2f} {'-' if t is None else f'{t:.1f}':>10}",
                  flush=True)
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if kvf.pending_error("cuda") is None else 1


if __name__ == "__main__":
    sys.exit(main())
