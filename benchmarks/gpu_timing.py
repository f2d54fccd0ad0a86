"""Timing helpers shared by the GPU benchmarks: do_bench medians, the device-to-device copy
bandwidth every figure is compared with, and per-call time inside a replayed CUDA graph."""

from __future__ import annotations

import functools

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


_SAME_SIZE: dict[int, float] = {}


@functools.lru_cache(maxsize=None)
def _copy_kernel():
    """A plain Triton copy of int64 words, 16 KB per program: the SM copy a short op is held to."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_words(src, dst, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i, mask=i < n), mask=i < n)

    return copy_words


def same_size_copy_us(nbytes: int) -> float:
    """Per-call µs, inside a CUDA graph, of a plain Triton copy kernel that moves ``nbytes`` in all
    (nbytes / 2 read, nbytes / 2 written), cycling through enough buffers that no call finds its
    source in L2 (50 MB): the fair ceiling of an op that moves nbytes, since a short copy does not
    reach the bandwidth of the 2 GiB copy (launch, ramp-up and tail weigh more).

    A kernel of our own rather than ``Tensor.copy_``: captured in a graph, torch's copy of a
    contiguous tensor is a memcpy node, which measured 14.6 µs for 34.6 MB in one process and
    10.4 µs in another on the same H200 (docs/performance_gpu.md, sixth measurement)."""
    words = max(2, nbytes // 16)
    if words not in _SAME_SIZE:
        kernel = _copy_kernel()
        count = min(8, max(1, -(-256_000_000 // (16 * words))))
        pairs = [(torch.empty(words, dtype=torch.int64, device="cuda").random_(),
                  torch.empty(words, dtype=torch.int64, device="cuda")) for _ in range(count)]
        grid = ((words + 2047) // 2048,)
        fns = [(lambda s=s, d=d: kernel[grid](s, d, words, BLOCK=2048, num_warps=8)) for s, d in pairs]
        _SAME_SIZE[words] = graph_per_call_us(fns, max(count, 8 // count * count) if nbytes > 1 << 20 else 50)
        del pairs
    return _SAME_SIZE[words]
