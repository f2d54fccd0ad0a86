"""Step time of the DeepSeek V4 layer-step reference (kvformats.dsv4_layer.pipeline) on a GPU.

Cases: prefill of 8k, 64k and 128k tokens (one request, chunks of --chunk tokens, one step
each; eager only: a prefill step's shapes change with the chunk), and decode batches of 1, 64
and 256 requests at contexts 8k and 64k (one token per request; eager and replayed as one CUDA
graph). Per-op times come from CUDA events at the step's phase marks (eager); totals are median
milliseconds. A case that runs out of memory is reported and skipped.

    python3 -m benchmarks pipeline_gpu --json out.json [--topk 2048] [--quick]
    python tools/pipeline_chart.py out.json --svg docs/diagrams/pipeline.svg --markdown
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import traceback
from pathlib import Path

import torch

from kvformats.dsv4_layer.pipeline import LayerStep
from kvformats.dsv4_layer.pipeline_config import LayerConfig

PHASES = ("projections", "slots", "swa_insert", "save_state", "compress", "indexer", "reads", "attention",
          "out_quant")
K = 1024


class PhaseTimer:
    """Records a CUDA event at each phase mark; ``times()`` sums the milliseconds per phase."""

    def __init__(self):
        self.marks = []

    def start(self):
        self.marks = [("start", self._event())]

    def __call__(self, name):
        self.marks.append((name, self._event()))

    @staticmethod
    def _event():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def times(self) -> dict:
        torch.cuda.synchronize()
        out = dict.fromkeys(PHASES, 0.0)
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + a.elapsed_time(b)
        return out


def median(xs):
    return sorted(xs)[len(xs) // 2]


def flash(topk, ctx, requests, **kw) -> LayerConfig:
    return LayerConfig(topk=topk, max_context=ctx, requests=requests, keep_scores=False, hidden=4096, **kw)


def bench_prefill(tokens, topk, chunk, reps, fmt) -> dict:
    step = LayerStep(flash(topk, tokens, 1, index_format=fmt), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    timer = PhaseTimer()
    step.phase_hook = timer
    phases = dict.fromkeys(PHASES, 0.0)
    total = 0.0
    for i in range(0, tokens, chunk):
        n = min(chunk, tokens - i)
        x = torch.randn(n, step.cfg.hidden, device="cuda", generator=g)
        pos = torch.arange(i, i + n, device="cuda")
        req = torch.zeros(n, dtype=torch.int64, device="cuda")
        if i == 0:
            step.step(x, pos, req)  # warm-up (compiles); rewriting the same rows is idempotent
        runs = []
        for _ in range(reps if i == 0 else 1):
            timer.start()
            step.step(x, pos, req)
            t = timer.times()
            runs.append(t)
        t = min(runs, key=lambda r: sum(r.values()))
        for k, v in t.items():
            phases[k] += v
        total += sum(t.values())
    return {"kind": "prefill", "tokens": tokens, "chunk": chunk, "eager_ms": total, "phases_ms": phases}


def bench_decode(batch, ctx, topk, reps, fmt) -> dict:
    step = LayerStep(flash(topk, ctx + 128, batch, index_format=fmt, state_ring_pages=4, query_chunk=max(batch, 1)),
                     device="cuda")
    cfg = step.cfg
    # the caches hold whatever bytes allocate() gave them: the step time does not depend on the
    # values, and prefilling batch x 64k tokens would dominate the run
    x = torch.randn(batch, cfg.hidden, device="cuda")
    pos = torch.full((batch,), ctx, dtype=torch.int64, device="cuda")
    req = torch.arange(batch, dtype=torch.int64, device="cuda")
    timer = PhaseTimer()
    step.phase_hook = timer
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step.step(x, pos, req)
    torch.cuda.current_stream().wait_stream(side)
    runs = []
    for _ in range(reps):
        timer.start()
        step.step(x, pos, req)
        runs.append(timer.times())
    phases = {k: median([r[k] for r in runs]) for k in PHASES}
    eager = median([sum(r.values()) for r in runs])
    step.phase_hook = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.step(x, pos, req)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del graph
    return {"kind": "decode", "batch": batch, "context": ctx, "eager_ms": eager, "graph_ms": median(times),
            "phases_ms": phases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topk", type=int, default=512, choices=(512, 1024, 2048))
    ap.add_argument("--index-format", default="mxfp4_indexer", choices=("mxfp4_indexer", "fp8_indexer"))
    ap.add_argument("--quick", action="store_true", help="8k prefill and decode at 8k only, fewer repetitions")
    ap.add_argument("--chunk", type=int, default=8 * K, help="prefill tokens per step")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--only", choices=("prefill", "decode"), help="run one kind of case (split a long run)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    reps = 3 if args.quick else 10
    prefill = [8 * K] if args.quick else [8 * K, 64 * K, 128 * K]
    decode = [(b, c) for c in ([8 * K] if args.quick else [8 * K, 64 * K]) for b in (1, 64, 256)]
    cases = [("prefill", n) for n in prefill] + [("decode", bc) for bc in decode]
    cases = [c for c in cases if args.only in (None, c[0])]
    results = []
    for kind, arg in cases:
        label = f"prefill {arg // K}k" if kind == "prefill" else f"decode batch {arg[0]} @ {arg[1] // K}k"
        try:
            r = (bench_prefill(arg, args.topk, args.chunk, reps, args.index_format) if kind == "prefill"
                 else bench_decode(*arg, args.topk, reps, args.index_format))
        except torch.cuda.OutOfMemoryError as e:
            r = {"kind": kind, "error": f"out of memory: {str(e).splitlines()[0]}"}
            r.update({"tokens": arg} if kind == "prefill" else {"batch": arg[0], "context": arg[1]})
        except Exception:  # report and continue: one case's failure must not lose the others
            r = {"kind": kind, "error": traceback.format_exc(limit=3)}
            r.update({"tokens": arg} if kind == "prefill" else {"batch": arg[0], "context": arg[1]})
        r["label"] = label
        results.append(r)
        torch.cuda.empty_cache()
        print(f"{label:28s} " + (f"eager {r['eager_ms']:9.2f} ms" + (f"  graph {r['graph_ms']:9.2f} ms"
                                                                       if "graph_ms" in r else "")
                                  if "error" not in r else "FAILED: " + r["error"].splitlines()[-1]), flush=True)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "topk": args.topk,
           "index_format": args.index_format, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "quick": args.quick, "results": results}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
