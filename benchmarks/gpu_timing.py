"""Timing helpers shared by the GPU benchmarks: do_bench medians, the device-to-device copy
bandwidth every figure is compared with, per-call time inside a replayed CUDA graph, and the
host's time per eager call."""

from __future__ import annotations

import statistics
import time

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


_SAME_SIZE: dict[int, float] = {}


def same_size_copy_us(nbytes: int, footprint: int = 256_000_000) -> float:
    """Per-call µs, inside a CUDA graph, of an SM kernel that reads nbytes / 2 and writes
    nbytes / 2 (torch.add on int32 words: torch's vectorised elementwise kernel): the time an op
    moving ``nbytes`` takes at memory speed, launch, ramp-up and tail included. Not
    ``copy_``: inside a graph that is a memcpy node, which runs well below the copy bandwidth
    (about half of it on an H200), so it would flatter the ops. Calls cycle through enough
    buffers that none finds its source in L2, as the op benchmarks do; cached per size."""
    if nbytes not in _SAME_SIZE:
        words = max(nbytes // 8, 1)
        pairs = min(8, max(1, -(-footprint // nbytes)))
        bufs = [(torch.randint(0, 1 << 30, (words,), dtype=torch.int32, device="cuda"),
                 torch.empty(words, dtype=torch.int32, device="cuda")) for _ in range(pairs)]
        fns = [lambda s=s, d=d: torch.add(s, 1, out=d) for s, d in bufs]
        _SAME_SIZE[nbytes] = graph_per_call_us(fns, max(pairs, 8 // pairs * pairs))
        del bufs, fns
    return _SAME_SIZE[nbytes]


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


def host_per_call_us(fn, calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the host's wall µs per call of ``calls`` back-to-back calls with
    no synchronization between them (what an engine's CPU pays per eager call); the launch queue
    is drained before each round."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)
