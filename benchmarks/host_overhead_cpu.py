"""Host time per call of the codec and paged ops' Triton path, without a GPU: the Python work of
validation, dispatch and the launchers, with the kernel launch itself stubbed out.

    PYTHONPATH=. python3 benchmarks/host_overhead_cpu.py [--calls 2000] [--rows 64] [--formats ...]

CPU tensors are routed to the Triton launchers (as on a GPU: the default check mode with no
host value checks, ``backend="triton"``), and ``JITFunction.run`` (Triton's argument binding,
specialization and launch) does nothing, so the figures are what kvformats itself costs per
call, back to back. Two columns: the public op (``layout.decode(...)``: checks + dispatch +
launcher) and the launcher alone (``kvformats_kernels.<family>.decode(...)``). Triton's own
launch cost comes on top on a GPU (benchmarks/bench_host_gpu.py, kvformats_kernels/launch.py).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.pop("TRITON_INTERPRET", None)  # the stub replaces the launch; nothing is interpreted

import torch  # noqa: E402
from triton.runtime import jit as triton_jit  # noqa: E402

import kvformats as kvf  # noqa: E402
from kvformats import deferred, registry  # noqa: E402

FORMATS = ("fp8_ds_mla", "fp8_ds_mla_v32", "fp8_indexer", "mxfp4_indexer", "compressor_state")


def route_to_launchers() -> None:
    """CPU tensors take the GPU's default path: device checks, Triton launchers."""
    import kvformats_kernels  # noqa: F401  (registers the launchers)

    deferred.HOST_CHECKED.clear()
    real = registry.resolve

    def resolve(fmt, op, backend, device):
        if backend == "triton":
            return registry._OPS[(fmt, op)]["triton"]
        return real(fmt, op, backend, device)

    registry.resolve = resolve
    triton_jit.JITFunction.run = lambda self, *args, **kwargs: None


def per_call_us(fn, calls: int) -> float:
    for _ in range(min(50, calls)):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def cases(fmt: str, rows: int):
    """[(op, public call, launcher call)] for one format at ``rows`` rows."""
    import kvformats_kernels as kk

    lay = kvf.get_format(fmt)
    impl = kk.IMPLEMENTATIONS[fmt]
    pages = -(-rows // lay.page_size) + 2
    cache = lay.allocate(pages)
    slots = torch.arange(rows)
    if fmt == "compressor_state":
        w = lay.width
        x = (torch.randn(rows, w), torch.randn(rows, w))
        kw = {"positions": torch.arange(rows), "ape": torch.randn(lay.ratio, w)}
    else:
        x, kw = torch.randn(rows, lay.head_dim, dtype=torch.bfloat16), {}
    topk = slots.reshape(rows // 8, 8)
    out = [
        ("encode", lambda: lay.encode(x, cache, slots, backend="triton", **kw),
         lambda: impl.encode(lay, x, cache, slots, **kw)),
        ("decode", lambda: lay.decode(cache, slots, backend="triton"), lambda: impl.decode(lay, cache, slots)),
        ("gather", lambda: lay.gather(cache, slots, backend="triton"), lambda: impl.gather(lay, cache, slots)),
        ("decode_topk", lambda: lay.decode_topk(cache, topk, backend="triton"),
         lambda: impl.decode_topk(lay, cache, topk)),
    ]
    if fmt != "compressor_state":
        requests = 4
        per = rows // requests
        table = torch.arange(requests * pages, dtype=torch.int32).reshape(requests, pages) % pages
        seq = torch.full((requests,), per, dtype=torch.int32)
        ws = torch.empty((requests, per, lay.head_dim), dtype=lay.decode_dtype)
        cu = torch.arange(0, rows + 1, per, dtype=torch.int32)
        views = tuple(torch.empty((rows, s.record_bytes), dtype=torch.uint8) for s in lay.segments)
        out += [
            ("dequantize_gather",
             lambda: lay.dequantize_gather(cache, ws, block_table=table, seq_lens=seq, backend="triton"),
             lambda: impl.dequantize_gather(lay, cache, ws, table, seq, None, None, 0)),
            ("gather_paged",
             lambda: lay.gather_paged(cache, block_table=table, cu_seq_lens=cu, out=views, backend="triton"),
             lambda: impl.gather_paged(lay, cache, views, table, cu)),
        ]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--formats", nargs="*", default=list(FORMATS))
    args = p.parse_args(argv)
    route_to_launchers()
    torch.set_num_threads(1)
    print(f"host µs per call, {args.rows} rows, kernel launch stubbed (torch {torch.__version__})")
    print("| format | op | public op | launcher |")
    print("| --- | --- | ---: | ---: |")
    for fmt in args.formats:
        for op, public, launcher in cases(fmt, args.rows):
            print(f"| {fmt} | {op} | {per_call_us(public, args.calls):.1f} | {per_call_us(launcher, args.calls):.1f} |")


if __name__ == "__main__":
    main()
