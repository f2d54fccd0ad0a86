"""What the torch.library custom-op path costs per call over a direct launcher call (the
target, TARGET_US: at most 5 µs at 64 rows on the H200).

    python3 -m benchmarks custom_ops_gpu [--rows 64] [--calls 200] [--repeats 9] [--formats ...]

For encode / decode / gather of every format with Triton kernels, at ``--rows`` random slots of
a production-geometry cache, times the same call made
  (a) ``launcher``: ``kvformats_kernels.<family>.<op>(layout, ...)`` (no validation, no dispatch),
  (b) ``public``: ``layout.<op>(..., backend="triton")`` (validation, including the slot checks
      that read the slots on the host, then dispatch); ``public nc``: the same with ``check=False``,
  (c) ``op``: ``torch.ops.kvformats.<op>(fmt, params, ..., "triton")`` with the layout key made
      once; ``op nc``: the same with ``check=False``; ``wrapper``: ``kvformats.codec.torch_ops.<op>(layout,
      ...)``, which makes the key each call; ``bare op``: a bench-only op of the same schema whose
      kernel is the bare launcher (``bare_ops``: what the dispatch alone costs),
each (eager) as the wall-clock time of ``--calls`` back-to-back calls synchronised once at the
end, per call, median of ``--repeats`` rounds in which every path runs once in turn (the
overheads are medians of the differences within a round); and (graph) per call inside a
replayed CUDA graph (``gpu_timing.graph_per_call_us``; in capture the host checks are skipped,
so there all paths launch the same kernel). The table gives the overhead in µs over the
launcher of ``bare op`` (the dispatch), ``public nc`` (the shape and dtype checks), ``op nc``
(both: the issue's figure) and ``op`` (adding the host slot checks, whose copy of the slots to
the host is a synchronisation the launcher does not make), eagerly and inside a graph; and,
last, the dispatcher's own floor on this host (an op of the same schema doing nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import kvformats as kvf

TARGET_US = 5.0
OPS = ("encode", "decode", "gather")
EAGER_PATHS = ("launcher", "bare op", "public", "public nc", "op", "op nc", "wrapper")
GRAPH_PATHS = ("launcher", "op")
FORMATS = {  # production geometry
    "fp8_ds_mla": lambda: kvf.Fp8DsMla(),
    "fp8_ds_mla_v32": lambda: kvf.get_format("fp8_ds_mla_v32"),
    "fp8_indexer": lambda: kvf.Fp8Indexer(),
    "mxfp4_indexer": lambda: kvf.Mxfp4Indexer(),
    "compressor_state": lambda: kvf.CompressorState(),
}


def make_case(layout, rows: int, g: torch.Generator, pages: int = 1024):
    """(cache, encode input, encode keyword arguments, slots) on the GPU, the rows written once."""
    cache = layout.allocate(pages, device="cuda")
    slots = torch.randperm(pages * layout.page_size, generator=g)[:rows].cuda()
    if layout.decode_dtype is None:
        w = layout.width
        x = (torch.randn(rows, w, generator=g).cuda(), torch.randn(rows, w, generator=g).cuda())
        kw = dict(positions=torch.arange(rows).cuda(), ape=(torch.randn(layout.ratio, w, generator=g) * 0.1).cuda())
    else:
        x, kw = torch.randn(rows, layout.head_dim, generator=g).to(torch.bfloat16).cuda(), {}
    layout.encode(x, cache, slots, backend="triton", **kw)
    return cache, x, kw, slots


_BENCH: dict = {}


def op_schema(op: str) -> str:
    """``(arguments) -> returns`` of the codec op ``kvformats::<op>``, from its declaration."""
    from kvformats.codec import torch_ops  # noqa: F401  (defines the codec ops)
    from kvformats.codec.op import CODEC

    schema = CODEC.declared[op].schema
    return f"({schema.args}) -> {schema.returns}"
  # the bench-only op library fragment and the ops defined in it


def bare_ops(fmt: str, layout, impl) -> dict:
    """{op: a bench-only op with kvformats' schema for ``op`` whose kernel is the bare launcher
    (no validation, no layout lookup)}: its cost over calling the launcher is the dispatcher's
    plus that of running the launcher inside an op kernel, the part of the custom-op path that
    no validation work can shorten."""
    def encode(fmt_, params, inputs, cache, slots, backend, check=True):
        if len(inputs) == 1:
            impl.encode(layout, inputs[0], cache, slots)
        else:
            impl.encode(layout, (inputs[0], inputs[1]), cache, slots, positions=inputs[2], ape=inputs[3])

    def decode(fmt_, params, cache, slots, backend, check=True):
        out = impl.decode(layout, cache, slots)
        return list(out) if isinstance(out, tuple) else [out]

    def gather(fmt_, params, cache, slots, backend, check=True):
        return impl.gather(layout, cache, slots)

    lib = _BENCH.setdefault("lib", torch.library.Library("kvformats_bench", "FRAGMENT"))
    out = {}
    for op, kernel in (("encode", encode), ("decode", decode), ("gather", gather)):
        name = f"bare_{op}_{fmt}"
        if name not in _BENCH:
            lib.define(name + op_schema(op))
            lib.impl(name, kernel, "CompositeExplicitAutograd")
            _BENCH[name] = getattr(torch.ops.kvformats_bench, name)
        out[op] = _BENCH[name]
    return out


def path_fns(layout, impl, cache, x, kw, slots, bare: dict) -> dict:
    """{(op, path): zero-argument call}; ``bare``: bare_ops of this format."""
    import kvformats.codec.torch_ops as kops

    fmt, params = kops.layout_key(layout)
    inputs = [*x, kw["positions"], kw["ape"]] if isinstance(x, tuple) else [x]
    ops = torch.ops.kvformats
    return {
        ("encode", "launcher"): lambda: impl.encode(layout, x, cache, slots, **kw),
        ("encode", "bare op"): lambda: bare["encode"](fmt, params, inputs, cache, slots, "triton", False),
        ("encode", "public"): lambda: layout.encode(x, cache, slots, backend="triton", **kw),
        ("encode", "public nc"): lambda: layout.encode(x, cache, slots, backend="triton", check=False, **kw),
        ("encode", "op"): lambda: ops.encode(fmt, params, inputs, cache, slots, "triton"),
        ("encode", "op nc"): lambda: ops.encode(fmt, params, inputs, cache, slots, "triton", False),
        ("encode", "wrapper"): lambda: kops.encode(layout, x, cache, slots, backend="triton", **kw),
        ("decode", "launcher"): lambda: impl.decode(layout, cache, slots),
        ("decode", "bare op"): lambda: bare["decode"](fmt, params, cache, slots, "triton", False),
        ("decode", "public"): lambda: layout.decode(cache, slots, backend="triton"),
        ("decode", "public nc"): lambda: layout.decode(cache, slots, backend="triton", check=False),
        ("decode", "op"): lambda: ops.decode(fmt, params, cache, slots, "triton"),
        ("decode", "op nc"): lambda: ops.decode(fmt, params, cache, slots, "triton", False),
        ("decode", "wrapper"): lambda: kops.decode(layout, cache, slots, backend="triton"),
        ("gather", "launcher"): lambda: impl.gather(layout, cache, slots),
        ("gather", "bare op"): lambda: bare["gather"](fmt, params, cache, slots, "triton", False),
        ("gather", "public"): lambda: layout.gather(cache, slots, backend="triton"),
        ("gather", "public nc"): lambda: layout.gather(cache, slots, backend="triton", check=False),
        ("gather", "op"): lambda: ops.gather(fmt, params, cache, slots, "triton"),
        ("gather", "op nc"): lambda: ops.gather(fmt, params, cache, slots, "triton", False),
        ("gather", "wrapper"): lambda: kops.gather(layout, cache, slots, backend="triton"),
    }


def eager_rounds(fns: dict, calls: int, repeats: int) -> dict:
    """{path: [µs per call in each round]}: each round times ``calls`` back-to-back calls of every
    path in turn (synchronised once per path), so that the paths of one round share the host's
    state of the moment (this host's eager times drift by tens of µs over a run)."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = {p: [] for p in fns}
    for _ in range(repeats):
        for p, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[p].append((time.perf_counter() - t0) / calls * 1e6)
    return times


def measure(fmt: str, rows: int, calls: int, repeats: int, graph_calls: int) -> list[dict]:
    import kvformats_kernels as kk
    from gpu_timing import graph_per_call_us

    layout = FORMATS[fmt]()
    impl = kk.IMPLEMENTATIONS[fmt]
    cache, x, kw, slots = make_case(layout, rows, torch.Generator().manual_seed(rows))
    fns = path_fns(layout, impl, cache, x, kw, slots, bare_ops(fmt, layout, impl))
    out = []
    for op in OPS:
        rounds = eager_rounds({p: fns[(op, p)] for p in EAGER_PATHS}, calls, repeats)
        eager = {p: statistics.median(v) for p, v in rounds.items()}
        paired = {p: statistics.median(a - b for a, b in zip(rounds[p], rounds["launcher"])) for p in rounds}
        graph = {p: graph_per_call_us([fns[(op, p)]], graph_calls) for p in GRAPH_PATHS}
        out.append(dict(fmt=fmt, op=op, rows=rows, eager=eager, paired=paired, graph=graph))
    return out


def dispatch_floor_us(calls: int, repeats: int) -> float:
    """µs per call of an op with ``kvformats::encode``'s schema whose kernel does nothing: what
    torch's dispatcher alone costs this host for a Python kernel (the part of the custom-op
    path kvformats cannot shorten)."""
    lib = _BENCH.setdefault("lib", torch.library.Library("kvformats_bench", "FRAGMENT"))
    if "noop" not in _BENCH:
        lib.define("noop" + op_schema("encode"))
        lib.impl("noop", lambda *args: None, "CompositeExplicitAutograd")
        _BENCH["noop"] = torch.ops.kvformats_bench.noop
    x, cache, slots = torch.zeros(1, device="cuda"), torch.zeros(1, dtype=torch.uint8, device="cuda"), torch.zeros(
        1, dtype=torch.int64, device="cuda")
    params = '{"head_dim":512,"page_size":64,"profile":"tokenspeed","rope_dim":64}'
    noop = _BENCH["noop"]
    rounds = eager_rounds({"noop": lambda: noop("fp8_ds_mla", params, [x], cache, slots, "triton", False)},
                          calls, repeats)
    return statistics.median(rounds["noop"])


def overhead(row: dict, mode: str, path: str = "op nc") -> float:
    """The custom op (layout key made once; ``op nc``: check=False) over the launcher, in µs:
    eagerly the median over rounds of the difference within a round, in a graph the difference."""
    if mode == "eager":
        return row["paired"][path]
    return row[mode][path] - row[mode]["launcher"]


def format_table(rows: list[dict]) -> str:
    """A markdown table of the measurements and a closing line against the 5 µs target."""
    head = (["format", "op", "rows"] + [f"eager {p} µs" for p in EAGER_PATHS]
            + ["eager bare op − launcher µs", "eager public nc − launcher µs", "eager op nc − launcher µs",
               "eager op − launcher µs"]
            + [f"graph {p} µs" for p in GRAPH_PATHS] + ["graph op − launcher µs"])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([" --- "] * 3 + [" ---: "] * (len(head) - 3)) + "|"]
    for r in rows:
        cells = ([r["fmt"], r["op"], str(r["rows"])] + [f"{r['eager'][p]:.1f}" for p in EAGER_PATHS]
                 + [f"{overhead(r, 'eager', 'bare op'):+.1f}", f"{overhead(r, 'eager', 'public nc'):+.1f}",
                    f"{overhead(r, 'eager'):+.1f}",
                    f"{overhead(r, 'eager', 'op'):+.1f}"]
                 + [f"{r['graph'][p]:.2f}" for p in GRAPH_PATHS] + [f"{overhead(r, 'graph', 'op'):+.2f}"])
        lines.append("| " + " | ".join(cells) + " |")
    if rows:
        worst = max(rows, key=lambda r: overhead(r, "eager"))
        checked = max(overhead(r, "eager", "op") for r in rows)
        verdict = "met" if overhead(worst, "eager") <= TARGET_US else "NOT met"
        lines.append("")
        lines.append(f"largest eager custom-op overhead (op nc − launcher): {overhead(worst, 'eager'):+.1f} µs "
                     f"({worst['fmt']} {worst['op']}); with the host slot checks (op − launcher) up to "
                     f"{checked:+.1f} µs; target ≤ {TARGET_US:g} µs per call at {worst['rows']} rows: {verdict}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--calls", type=int, default=200, help="back-to-back calls per eager timing (default 200)")
    p.add_argument("--repeats", type=int, default=9, help="eager timings per path, median taken (default 9)")
    p.add_argument("--graph-calls", type=int, default=50, help="calls captured in one CUDA graph (default 50)")
    p.add_argument("--formats", nargs="*", default=None, help="default: every format with Triton kernels")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    import kvformats_kernels as kk

    fmts = args.formats or [f for f in FORMATS if f in getattr(kk, "IMPLEMENTATIONS", {})]
    print(f"device: {torch.cuda.get_device_name()}   torch {torch.__version__}   rows {args.rows}   "
          f"eager: {args.calls} calls x {args.repeats} repeats   graph: {args.graph_calls} calls", flush=True)
    floor = dispatch_floor_us(args.calls, args.repeats)
    rows = []
    for fmt in fmts:
        rows += measure(fmt, args.rows, args.calls, args.repeats, args.graph_calls)
        print(f"  {fmt} done", flush=True)
    print(format_table(rows))
    print(f"dispatcher floor (an op of the same schema whose kernel does nothing): {floor:.1f} µs per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
