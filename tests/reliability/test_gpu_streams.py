"""Concurrency on CUDA streams: encodes issued on 4 streams into disjoint slots of one cache give
exactly the bytes of the same encodes issued one after another on one stream; decodes and
gathers on side streams, while encodes on other streams write other slots, return exactly
what the same reads return on a quiet cache. Every format, ``backend="triton"``; the calls on
the streams skip the host-side slot checks (``check=False``, as inside a CUDA graph), so
nothing synchronises between launches and the streams really overlap.

The same sequence runs on the CPU without streams (the Triton launchers under the
interpreter, small shapes), which tests the harness itself.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import kvformats as kvf
from tests.harness.reliability_harness import CUDA, DEVICE, run_op, triton_available
from kvformats.testing.strategies import storage_bytes

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
STREAMS = 4
GPU_LAYOUTS = {  # production geometry; (layout, pages, rows per call, calls per stream)
    "fp8_ds_mla": (lambda: kvf.Fp8DsMla(), 512, 1024, 6),
    "fp8_ds_mla_v32": (lambda: kvf.get_format("fp8_ds_mla_v32"), 512, 1024, 6),
    "fp8_indexer": (lambda: kvf.Fp8Indexer(), 512, 1024, 6),
    "mxfp4_indexer": (lambda: kvf.Mxfp4Indexer(), 512, 1024, 6),
    "compressor_state": (lambda: kvf.CompressorState(), 4096, 512, 6),
}
CPU_LAYOUTS = {
    "fp8_ds_mla": (lambda: kvf.Fp8DsMla(head_dim=128, rope_dim=64, page_size=4), 6, 3, 2),
    "fp8_ds_mla_v32": (lambda: kvf.get_format("fp8_ds_mla_v32", page_size=4), 6, 3, 2),
    "fp8_indexer": (lambda: kvf.Fp8Indexer(page_size=4), 6, 3, 2),
    "mxfp4_indexer": (lambda: kvf.Mxfp4Indexer(page_size=4), 6, 3, 2),
    "compressor_state": (lambda: kvf.CompressorState(head_dim=32, ratio=4, page_size=4), 6, 3, 2),
}


def stream_contexts(n: int) -> list:
    """Factories of a context that makes a side stream current (no-op without CUDA)."""
    if not CUDA:
        return [contextlib.nullcontext] * n
    streams = [torch.cuda.Stream() for _ in range(n)]
    main = torch.cuda.current_stream()
    for s in streams:  # inputs were made on the main stream
        s.wait_stream(main)
    return [lambda s=s: torch.cuda.stream(s) for s in streams]


def join_streams() -> None:
    if CUDA:
        torch.cuda.synchronize()


def inputs(layout, n: int, g: torch.Generator):
    if layout.decode_dtype is None:  # compressor_state
        w = layout.width
        kv, score = (torch.randn(n, w, generator=g).to(DEVICE) for _ in range(2))
        return (kv, score), dict(positions=torch.randint(0, 1 << 20, (n,), generator=g).to(DEVICE),
                                 ape=(torch.randn(layout.ratio, w, generator=g) * 0.1).to(DEVICE))
    x = torch.randn(n, layout.head_dim, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    return x.to(torch.bfloat16).to(DEVICE), {}


def plan_encodes(layout, pages: int, rows: int, calls: int, streams: int, g, slots=None):
    """[stream][call] -> (x, kwargs, slots): disjoint slots, a few −1 holes."""
    cap = pages * layout.page_size
    pool = torch.randperm(cap, generator=g) if slots is None else slots[torch.randperm(len(slots), generator=g)]
    assert len(pool) >= streams * calls * rows, "too few slots for the plan"
    out, at = [], 0
    for _ in range(streams):
        mine = []
        for _ in range(calls):
            s = pool[at:at + rows].clone()
            s[::7] = -1
            at += rows
            x, kw = inputs(layout, rows, g)
            mine.append((x, kw, s.to(DEVICE)))
        out.append(mine)
    return out


def encode_serial(layout, cache, plan) -> None:
    for per_stream in plan:
        for x, kw, s in per_stream:
            run_op("triton", layout.encode, x, cache, s, check=False, **kw)


def encode_concurrent(layout, cache, plan, contexts) -> None:
    """Call c of every stream, then call c + 1 of every stream, ...: launches interleave."""
    for c in range(len(plan[0])):
        for ctx, per_stream in zip(contexts, plan):
            x, kw, s = per_stream[c]
            with ctx():
                run_op("triton", layout.encode, x, cache, s, check=False, **kw)


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(same(u, v) for u, v in zip(a, b))
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check_encodes_on_streams(layout, pages, rows, calls) -> None:
    g = torch.Generator().manual_seed(pages + rows)
    plan = plan_encodes(layout, pages, rows, calls, STREAMS, g)
    serial, concurrent = layout.allocate(pages, device=DEVICE), layout.allocate(pages, device=DEVICE)
    encode_serial(layout, serial, plan)
    contexts = stream_contexts(STREAMS)
    encode_concurrent(layout, concurrent, plan, contexts)
    join_streams()
    assert torch.equal(storage_bytes(concurrent), storage_bytes(serial)), "streams changed the bytes"
    assert int(torch.count_nonzero(storage_bytes(serial))) > 0


def check_reads_beside_writes(layout, pages, rows, calls) -> None:
    """Streams 0-1 encode into the second half of the slots while streams 2-3 decode and gather
    the first half, written before."""
    g = torch.Generator().manual_seed(pages * 3 + rows)
    cap = pages * layout.page_size
    order = torch.randperm(cap, generator=g)
    old, new = order[:cap // 2], order[cap // 2:]
    fill = plan_encodes(layout, pages, rows, calls, 1, g, slots=old)
    writes = plan_encodes(layout, pages, rows, calls, 2, g, slots=new)
    serial, cache = layout.allocate(pages, device=DEVICE), layout.allocate(pages, device=DEVICE)
    for c in (serial, cache):
        encode_serial(layout, c, fill)
    reads = [old[torch.randperm(len(old), generator=g)[:rows]].to(DEVICE) for _ in range(calls)]
    want = [(run_op("triton", layout.decode, cache, r), run_op("triton", layout.gather, cache, r)) for r in reads]
    encode_serial(layout, serial, writes)
    contexts = stream_contexts(STREAMS)
    got = []
    for c in range(calls):
        for i, ctx in enumerate(contexts):
            with ctx():
                if i < 2:
                    x, kw, s = writes[i][c]
                    run_op("triton", layout.encode, x, cache, s, check=False, **kw)
                else:
                    r = reads[(c + i) % calls]
                    got.append(((c + i) % calls, run_op("triton", layout.decode, cache, r, check=False),
                                run_op("triton", layout.gather, cache, r, check=False)))
    join_streams()
    for k, dec, gat in got:
        assert same(dec, want[k][0]), "a decode beside concurrent encodes differs"
        assert torch.equal(gat, want[k][1]), "a gather beside concurrent encodes differs"
    assert torch.equal(storage_bytes(cache), storage_bytes(serial)), "concurrent reads/writes changed the bytes"


@gpu
@pytest.mark.parametrize("fmt", sorted(GPU_LAYOUTS))
def test_encodes_on_four_streams_equal_serial(fmt):
    make, pages, rows, calls = GPU_LAYOUTS[fmt]
    check_encodes_on_streams(make(), pages, rows, calls)


@gpu
@pytest.mark.parametrize("fmt", sorted(GPU_LAYOUTS))
def test_reads_on_side_streams_beside_encodes(fmt):
    make, pages, rows, calls = GPU_LAYOUTS[fmt]
    check_reads_beside_writes(make(), pages, rows, calls)


@pytest.mark.skipif(not triton_available(), reason="needs Triton (compiled, or the interpreter on the CPU)")
@pytest.mark.parametrize("fmt", sorted(CPU_LAYOUTS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's overflowing numpy products
def test_stream_checks_rehearsal_on_cpu(fmt):
    make, pages, rows, calls = CPU_LAYOUTS[fmt]
    check_encodes_on_streams(make(), pages, rows, calls)
    check_reads_beside_writes(make(), pages, rows, calls)
