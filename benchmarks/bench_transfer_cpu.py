"""Move one request's V4 cache pages between two processes with NIXL or Mooncake (CPU, loopback).

    python3 -m benchmarks transfer_cpu [--engines nixl mooncake] [--tokens 8192 65536 131072]
        [--layers 4] [--repeat 5] [--json out.json] [--svg chart.svg]
    python3 -m benchmarks transfer_cpu --checksums [--tokens 8192 65536] [--layers 4] [--repeat 5]
        [--device cpu | cuda]
    python3 -m benchmarks transfer_cpu --geometry [--engines nixl mooncake] [--tokens 8192 65536]
        [--dst-pages 64 32 128] [--layers 4] [--repeat 5] [--json out.json] [--svg chart.svg]

A layer stack of DeepSeek V4 shapes (head_dim 512, rope 64, page_size 64, MXFP4 indexer),
alternating CSA layers (SWA window, CSA rows, indexer rows, CSA and indexer compressor states)
and HCA layers (SWA window, HCA rows, HCA compressor state); each cache is its own pool with
twice the request's pages, and the request's pages are a random choice of them on each side
(a fragmented pool). Per token count: bytes per cache, segments before and after coalescing,
and the best of ``--repeat`` times (after one untimed round) for (a) the engine pushing the plan, (b) the same engine
pushing one contiguous buffer of the same size, (c) an in-process copy of that buffer (one
thread). "in-order pools": the segments after coalescing had the request held consecutive pages
on both sides.

``--geometry`` (benchmarks/transfer_geometry.py) moves the request's rows from pages of 64 rows to
pages of ``--dst-pages`` rows: bytes, segments before and after coalescing, the plan's GB/s
against a contiguous buffer, and the time to the first verified layer in layer-wise mode.

``--checksums`` instead times the checksum of the same request's pages (``expected_checksums``'
path): the position-mixed words of issue 44 against the linear sums it replaced, per cache kind.
On the CPU both are the torch reference (the old one restated here as ``linear_checksums``); with
``--device cuda`` both are Triton kernels (the old one restated as ``linear_kernel``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import torch

from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer

try:  # the GPU baseline of --checksums --device cuda
    import triton
    import triton.language as tl
except ImportError:
    triton = None

PAGE = 64
WAIT_S = 300.0
KV = Fp8DsMla(head_dim=512, rope_dim=64, page_size=PAGE)
INDEX = Mxfp4Indexer(head_dim=128, page_size=PAGE)
STATES = {"csa_state": CompressorState(head_dim=512, ratio=4, page_size=PAGE),
          "idx_state": CompressorState(head_dim=128, ratio=4, page_size=PAGE),
          "hca_state": CompressorState(head_dim=512, ratio=128, page_size=PAGE)}
WINDOW = 128


def _pages(rows: int) -> int:
    return -(-rows // PAGE)


def request_caches(tokens: int, layer: int) -> dict[str, tuple[object, int]]:
    """Cache name -> (layout, pages of one request at ``tokens``) of one layer: what decode needs
    (the SWA window, every compressed row, the compressor-state pages of the open windows)."""
    out = {"swa": (KV, _pages(WINDOW) + (1 if tokens % PAGE else 0))}
    if layer % 2 == 0:  # a CSA layer
        out.update(csa=(KV, _pages(tokens // 4)), index=(INDEX, _pages(tokens // 4)),
                   csa_state=(STATES["csa_state"], 1), idx_state=(STATES["idx_state"], 1))
    else:  # an HCA layer
        out.update(hca=(KV, _pages(tokens // 128)), hca_state=(STATES["hca_state"], _pages(128) + 1))
    return out


def stack(tokens: int, layers: int, seed: int):
    """({name: (layout, cache)}, {name: request page ids}) of the whole stack on one side."""
    g = torch.Generator().manual_seed(seed)
    caches, pages = {}, {}
    for layer in range(layers):
        for name, (layout, n) in request_caches(tokens, layer).items():
            key = f"L{layer}.{name}"
            caches[key] = (layout, layout.allocate(2 * n))
            pages[key] = torch.randperm(2 * n, generator=g)[:n]
    return caches, pages


def _engine(name: str):
    from kvformats.transfer.engines import make_engine

    # NIXL without its progress thread: _recv progresses the engine while it waits, and the thread
    # would compete for one of the two cores (the figures on docs/transfer.md were taken so)
    if name == "nixl":
        return make_engine(name, loopback=True, progress_thread=False)
    return make_engine(name, host="127.0.0.1")


def _recv(conn, here):
    deadline = time.monotonic() + WAIT_S
    while not conn.poll(0.001):
        here.engine.progress()
        if time.monotonic() > deadline:
            raise SystemExit("benchmark: the peer did not answer in time")
    return conn.recv()


def receiver(conn, engine: str, tokens: int, layers: int, nbytes: int) -> None:
    from kvformats.transfer.endpoint import Endpoint

    caches, pages = stack(tokens, layers, seed=2)
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    here = Endpoint(_engine(engine), caches)
    here.engine.register(flat.data_ptr(), nbytes)
    conn.send((here.hello(), {k: v.tolist() for k, v in pages.items()}, flat.data_ptr()))
    _recv(conn, here)  # "bye"
    here.close()



def time_push(here, peer, plan, one, times: dict) -> None:
    """One timed push of ``plan`` and one of the same bytes as a single contiguous write (``one``),
    appended to ``times["plan"]`` and ``times["contiguous"]``."""
    t = time.perf_counter()
    here.push(peer, plan, timeout=60)
    times["plan"].append(time.perf_counter() - t)
    t = time.perf_counter()
    here._run("write", one, peer, 60)
    times["contiguous"].append(time.perf_counter() - t)

def measure(engine: str, tokens: int, layers: int, repeat: int) -> dict:
    from kvformats.transfer import describe_caches, plan_transfer
    from kvformats.transfer.endpoint import Endpoint

    caches, pages = stack(tokens, layers, seed=1)
    descs = describe_caches(caches)
    nbytes = plan_transfer(descs, descs, pages, pages).nbytes
    # the same request on pools where it holds consecutive pages on both sides (coalescing's best case)
    in_order = plan_transfer(descs, descs, *({k: torch.arange(len(v)) for k, v in pages.items()},) * 2)
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    proc = ctx.Process(target=receiver, args=(b, engine, tokens, layers, nbytes))
    proc.start()
    try:
        here = Endpoint(_engine(engine), caches)
        flat = torch.ones(nbytes, dtype=torch.uint8)
        here.engine.register(flat.data_ptr(), nbytes)
        if not a.poll(WAIT_S):
            raise SystemExit("benchmark: the receiver did not start in time")
        hello, dst_pages, remote_flat = a.recv()
        peer = here.connect(hello)
        plan = plan_transfer(here.descs, peer.descs, pages, dst_pages)
        times = {"plan": [], "contiguous": []}
        one = torch.tensor([[flat.data_ptr(), remote_flat, nbytes]])
        here.push(peer, plan, timeout=60)  # warm-up: first touch of every page on both sides
        here._run("write", one, peer, 60)
        for _ in range(repeat):
            time_push(here, peer, plan, one, times)
        a.send("bye")
        here.close()
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    dst = torch.zeros_like(flat)  # touched before timing, as the engines' buffers were
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one memcpy thread, as each engine moves bytes on one thread here
    copy = []
    for _ in range(repeat):
        t = time.perf_counter()
        dst.copy_(flat)
        copy.append(time.perf_counter() - t)
    torch.set_num_threads(threads)
    per_cache: dict[str, int] = {}
    for row in plan.table():
        kind = row["cache"].split(".", 1)[1]
        per_cache[kind] = per_cache.get(kind, 0) + row["bytes"]
    gbps = {k: nbytes / min(v) / 1e9 for k, v in (*times.items(), ("copy", copy))}
    return {"engine": engine, "tokens": tokens, "layers": layers, "bytes": nbytes, "bytes_per_cache": per_cache,
            "segments_before": plan.segments_before, "segments": plan.segments,
            "segments_in_order": in_order.segments,
            "GB/s plan": round(gbps["plan"], 2), "GB/s contiguous": round(gbps["contiguous"], 2),
            "GB/s in-process copy": round(gbps["copy"], 2)}


def linear_checksums(layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The checksum before issue 44 (s1 = sum x, s2 = sum (j + 1) x, mod 2**32, per region over
    the moved rows; page pad left out), restated as it was computed: the baseline of
    ``--checksums``."""
    from kvformats.caches.regions import region_nbytes
    from kvformats.layout import storage_bytes

    u8, stride = layout.byte_pages(cache)
    whole, start = storage_bytes(cache), u8.storage_offset()
    out = torch.zeros(pages.shape[0], len(layout.regions), 2, dtype=torch.int64, device=cache.device)
    for g, region in enumerate(layout.regions):
        nbytes = region_nbytes(layout, cache, region)
        if region.per_page or nbytes == 0:
            continue
        view = whole.as_strided((cache.shape[0], layout.page_size, nbytes), (stride, region.row_stride, 1),
                                start + region.offset)
        r = torch.arange(layout.page_size, device=cache.device)[None, :, None]
        k = torch.arange(nbytes, device=cache.device)[None, None, :]
        for c in range(0, pages.shape[0], 64):
            x = view[pages[c:c + 64]].to(torch.int64)
            a, b = rows[c:c + 64, 0, None, None], rows[c:c + 64, 1, None, None]
            x = torch.where((r >= a) & (r < b), x, 0)
            out[c:c + 64, g, 0] = x.sum((1, 2)) & 0xFFFFFFFF
            out[c:c + 64, g, 1] = (x * ((r - a) * nbytes + k + 1)).sum((1, 2)) & 0xFFFFFFFF
    return out


if triton is not None:
    @triton.jit
    def _linear_kernel(bytes_ptr, pages_ptr, rows_ptr, out_ptr, page_stride, offset, row_stride, out_stride,
                       NBYTES: tl.constexpr, N_ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """The kernel before issue 44 (page pad left out): (s1, s2) of one region of one page."""
        i = tl.program_id(0).to(tl.int64)
        page = tl.load(pages_ptr + i).to(tl.int64)
        a = tl.load(rows_ptr + 2 * i).to(tl.int64)
        b = tl.load(rows_ptr + 2 * i + 1).to(tl.int64)
        base = bytes_ptr + page * page_stride + offset
        s1 = tl.zeros([BLOCK], dtype=tl.int64)
        s2 = tl.zeros([BLOCK], dtype=tl.int64)
        for t0 in range(0, N_ROWS * NBYTES, BLOCK):
            t = t0 + tl.arange(0, BLOCK).to(tl.int64)
            row = t // NBYTES
            k = t % NBYTES
            x = tl.load(base + row * row_stride + k, mask=(t < N_ROWS * NBYTES) & (row >= a) & (row < b),
                        other=0).to(tl.int64)
            s1 += x
            s2 += x * ((row - a) * NBYTES + k + 1)
        tl.store(out_ptr + i * out_stride, tl.sum(s1, 0) & 0xFFFFFFFF)
        tl.store(out_ptr + i * out_stride + 1, tl.sum(s2, 0) & 0xFFFFFFFF)


def linear_kernel(layout, cache: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``linear_checksums`` by the Triton kernel it had before issue 44 (CUDA caches)."""
    from kvformats.layout import storage_bytes

    u8, stride = layout.byte_pages(cache)
    out = torch.zeros(pages.shape[0], len(layout.regions), 2, dtype=torch.int64, device=cache.device)
    for g, r in enumerate(layout.regions):
        if not r.per_page:
            _linear_kernel[(pages.shape[0],)](storage_bytes(cache), pages, rows, out[:, g], stride,
                                              u8.storage_offset() + r.offset, r.row_stride, out.stride(0),
                                              NBYTES=r.nbytes, N_ROWS=layout.page_size,
                                              BLOCK=min(1024, triton.next_power_of_2(layout.page_size * r.nbytes)))
    return out


def measure_checksums(tokens: int, layers: int, repeat: int, device: str = "cpu") -> list[dict]:
    """Best-of-``repeat`` seconds of both checksums over one request's pages, per cache kind."""
    from kvformats.transfer import page_checksums

    caches, pages = stack(tokens, layers, seed=1)
    g = torch.Generator().manual_seed(0)
    for name, (layout, cache) in caches.items():
        layout.byte_pages(cache)[0].copy_(torch.randint(0, 256, layout.byte_pages(cache)[0].shape, generator=g,
                                                        dtype=torch.uint8))
        caches[name], pages[name] = (layout, cache.to(device)), pages[name].to(device)
    cuda = device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    kinds: dict[str, list] = {}
    for name, (layout, cache) in caches.items():
        kinds.setdefault(name.split(".", 1)[1], []).append((layout, cache, pages[name]))
    out = []
    variants = (("linear", linear_kernel if cuda else linear_checksums), ("mixed", page_checksums))
    for kind, items in [*kinds.items(), ("request", [i for v in kinds.values() for i in v])]:
        nbytes = sum(layout.page_bytes * p.numel() for layout, _, p in items)
        times: dict[str, list[float]] = {"linear": [], "mixed": []}
        for _ in range(repeat + 1):  # the variants alternate, so both meet the same load; round 0 untimed
            for label, fn in variants:
                sync()
                t = time.perf_counter()
                for layout, cache, p in items:
                    fn(layout, cache, p, torch.tensor([[0, layout.page_size]] * p.numel(), device=device))
                sync()
                times[label].append(time.perf_counter() - t)
        best = {k: min(v[1:]) for k, v in times.items()}
        out.append({"device": device, "tokens": tokens, "cache": kind, "pages": sum(p.numel() for _, _, p in items),
                    "bytes": nbytes,
                    "linear_ms": round(best["linear"] * 1e3, 2), "mixed_ms": round(best["mixed"] * 1e3, 2),
                    "ratio": round(best["mixed"] / best["linear"], 2),
                    "mixed_GB/s": round(nbytes / best["mixed"] / 1e9, 3)})
    return out


def checksum_table(rows: list[dict]) -> str:
    lines = ["| device | tokens | cache | pages | MB | linear sums (before), ms | mixed words, ms | ratio | "
             "mixed GB/s |", "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['device']} | {r['tokens']} | {r['cache']} | {r['pages']} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['linear_ms']} | {r['mixed_ms']} | {r['ratio']} | {r['mixed_GB/s']} |")
    return "\n".join(lines)


def svg(rows: list[dict]) -> str:
    """Grouped bars: GB/s of plan / contiguous / in-process copy per (engine, tokens). Plain SVG."""
    series = (("GB/s plan", "#1565c0", "engine, the plan's segments"),
              ("GB/s contiguous", "#90caf9", "engine, one contiguous buffer"),
              ("GB/s in-process copy", "#bdbdbd", "in-process copy"))
    top = max(max(r[k] for k, _, _ in series) for r in rows) or 1.0
    left, width, bar, gap = 170, 760, 9, 10
    scale = (width - left - 70) / top
    height = 60 + len(rows) * (3 * bar + gap) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">',
           f'<text x="{left}" y="16" font-size="13">One request\'s V4 pages between two processes, GB/s '
           f'(2-core CPU, 127.0.0.1)</text>']
    for i, (_, color, label) in enumerate(series):
        out.append(f'<rect x="{left + i * 190}" y="26" width="10" height="10" fill="{color}"/>'
                   f'<text x="{left + i * 190 + 14}" y="35">{label}</text>')
    y = 50
    for r in rows:
        mb = r["bytes"] / 1e6
        out.append(f'<text x="{left - 6}" y="{y + 1.5 * bar + 4:.0f}" text-anchor="end">{r["engine"]} '
                   f'{r["tokens"] // 1024}k ({mb:.0f} MB)</text>')
        for key, color, _ in series:
            w = r[key] * scale
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 1}" fill="{color}"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar - 1}">{r[key]:.2f}</text>')
            y += bar
        y += gap
    out.append("</svg>")
    return "\n".join(out) + "\n"


def table(rows: list[dict]) -> str:
    head = "| engine | tokens | layers | MB moved | segments (before → after coalescing) | in-order pools | " \
           "GB/s plan | GB/s contiguous | GB/s in-process copy |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['tokens']} | {r['layers']} | {r['bytes'] / 1e6:.1f} | "
                     f"{r['segments_before']} → {r['segments']} | {r['segments_in_order']} | {r['GB/s plan']} | "
                     f"{r['GB/s contiguous']} | {r['GB/s in-process copy']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks transfer_cpu", description=__doc__.splitlines()[0])
    p.add_argument("--engines", nargs="+", default=["nixl", "mooncake"])
    p.add_argument("--tokens", nargs="+", type=int, default=[8192, 65536, 131072])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--svg")
    p.add_argument("--checksums", action="store_true", help="time the checksums instead of the engines")
    p.add_argument("--device", default="cpu", help="with --checksums: cpu (torch) or cuda (the Triton kernels)")
    p.add_argument("--geometry", action="store_true", help="pages of 64 rows to pages of --dst-pages rows, "
                   "whole and layer by layer")
    p.add_argument("--dst-pages", nargs="+", type=int, default=[64, 32, 128])
    args = p.parse_args()
    if args.geometry:
        return geometry_main(args)
    if args.checksums:
        rows = [r for tokens in args.tokens for r in measure_checksums(tokens, args.layers, args.repeat, args.device)]
        where = torch.cuda.get_device_name() if args.device != "cpu" else f"{torch.get_num_threads()} CPU threads"
        print(f"torch {torch.__version__}, {where}")
        print(checksum_table(rows))
        return 0
    rows = engine_rows(args, lambda engine, tokens: [measure(engine, tokens, args.layers, args.repeat)])
    return report(args, rows, table, svg)


def engine_rows(args, measure_engine) -> list:
    """``measure_engine(engine, tokens)``'s rows for each installed engine of ``args.engines`` and
    each of ``args.tokens``, each printed as JSON as it comes."""
    from kvformats.transfer.engines import available

    rows = []
    for engine in args.engines:
        if not available(engine):
            print(f"{engine}: not installed, skipped")
            continue
        for tokens in args.tokens:
            for row in measure_engine(engine, tokens):
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def report(args, rows: list, table_of, svg_of) -> int:
    """The table of ``rows``, and ``--json`` / ``--svg`` files of them where asked."""
    print(table_of(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": "2-core CPU, loopback (127.0.0.1), no GPU", "rows": rows}, f, indent=1)
            f.write("\n")
    if args.svg and rows:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(svg_of(rows))
    return 0


def geometry_main(args) -> int:
    """``--geometry``: one row per (engine, tokens, decode page size)."""
    from benchmarks import transfer_geometry as geo

    rows = engine_rows(args, lambda engine, tokens: [geo.measure(engine, tokens, args.layers, page, args.repeat)
                                                      for page in args.dst_pages])
    return report(args, rows, geo.table, geo.svg)


if __name__ == "__main__":
    raise SystemExit(main())
