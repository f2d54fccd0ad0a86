"""Timing helpers shared by the GPU benchmarks: do_bench medians, the device-to-device copy
bandwidth every figure is compared with, and per-call time inside a replayed CUDA graph."""

from __future__ import annotations

import torch


def bench(fn, rep_ms=40) -> float:
    """Median milliseconds of fn (L2 flushed before each call)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def copy_bandwidth(nbytes=2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), rep_ms=200)
    return 2 * nbytes / ms / 1e6


def graph_per_call_us(fns, calls: int) -> float:
    """Median per-call µs of ``calls`` calls cycling through ``fns``, replayed as one CUDA graph."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return sorted(times)[len(times) // 2]
