"""``transfer_cpu --geometry``: one request's V4 rows between pools of other page sizes, whole and
layer by layer (issue 45).

The prefill side holds the 4-layer stack of ``bench_transfer_cpu`` in pages of 64 rows, the
decode side in pages of ``dst_page`` rows (64, 32 or 128), each in a fragmented pool. What decode
needs moves by token rows (``kvformats.transfer.geometry``): the SWA window as a ring
(``Ring(tokens, 128)``), every CSA, indexer and HCA row, and the compressor states' open windows
as rings (8 positions of a CSA state, 128 of the HCA state). So each page size moves the same
bytes, and what differs is the segments: per cache, before and after coalescing.

Per (engine, tokens, decode page size), best of ``repeat`` after one untimed round: the time
to build the plan (host), the engine pushing the plan against the same engine pushing one
contiguous buffer of the same bytes and an in-process copy of it; then, layer by layer
(``LayerSender`` / ``LayerReceiver``: each layer's checksums, push and verification at the
receiver), the time from the first push to the first layer verified and to the last, against
the whole request pushed as one plan and verified at the end. Times at the receiver are read
on ``time.monotonic`` (CLOCK_MONOTONIC: one clock for both processes of a host). Each process
runs torch on one thread: two processes share the two cores of the machine the figures were
taken on, and more threads than cores made the checksums several times slower.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import time

import attrs
import torch

import benchmarks.bench_transfer_cpu as base
from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer

SRC_PAGE = 64
STATE_WINDOWS = {"csa_state": 8, "idx_state": 8, "hca_state": 128}  # positions an open window reads


def layouts(page: int) -> dict:
    """The stack's layouts at ``page`` rows per page (bench_transfer_cpu's shapes)."""
    return {"kv": Fp8DsMla(head_dim=512, rope_dim=64, page_size=page),
            "index": Mxfp4Indexer(head_dim=128, page_size=page),
            "csa_state": CompressorState(head_dim=512, ratio=4, page_size=page),
            "idx_state": CompressorState(head_dim=128, ratio=4, page_size=page),
            "hca_state": CompressorState(head_dim=512, ratio=128, page_size=page)}


def request_caches(tokens: int, layer: int, page: int) -> dict:
    """Cache name -> (layout, the request's pages, its rows) of one layer at ``page`` rows."""
    from kvformats.transfer.geometry import Ring

    lay = layouts(page)

    def pages(rows: int) -> int:
        return -(-rows // page)

    out = {"swa": (lay["kv"], pages(base.WINDOW) + (1 if tokens % page else 0), Ring(tokens, base.WINDOW))}
    if layer % 2 == 0:  # a CSA layer
        out.update(csa=(lay["kv"], pages(tokens // 4), tokens // 4),
                   index=(lay["index"], pages(tokens // 4), tokens // 4))
        for name in ("csa_state", "idx_state"):
            out[name] = (lay[name], pages(STATE_WINDOWS[name]), Ring(tokens, STATE_WINDOWS[name]))
    else:  # an HCA layer
        out.update(hca=(lay["kv"], pages(tokens // 128), tokens // 128),
                   hca_state=(lay["hca_state"], pages(STATE_WINDOWS["hca_state"]) + 1, Ring(tokens, 128)))
    return out


def stack(tokens: int, layers: int, page: int, seed: int):
    """({name: (layout, cache)}, {name: request page ids}, {name: rows}) of one side; pools of
    twice the request's pages, the request's a random half (random bytes at the source)."""
    g = torch.Generator().manual_seed(seed)
    caches, pages, rows = {}, {}, {}
    for layer in range(layers):
        for name, (layout, n, spec) in request_caches(tokens, layer, page).items():
            key = f"L{layer}.{name}"
            cache = layout.allocate(2 * n)
            u8 = layout.byte_pages(cache)[0]
            u8.copy_(torch.randint(0, 256, u8.shape, generator=g, dtype=torch.uint8))
            caches[key], pages[key], rows[key] = (layout, cache), torch.randperm(2 * n, generator=g)[:n], spec
    return caches, pages, rows


def _pack(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


def _layer_bytes(message) -> bytes:
    return _pack({"kind": type(message).__name__, **attrs.asdict(message, recurse=False)})


def _layer_message(data: bytes):
    from kvformats.transfer.layerwise import LayerFailed, LayerMessage

    d = _unpack(data)
    kind = d.pop("kind")
    return LayerMessage(**d) if kind == "LayerMessage" else LayerFailed(**d)


def receiver(conn, engine: str, tokens: int, layers: int, page: int, nbytes: int) -> None:
    """The decode side: answers "whole" and "layerwise" rounds with its verification times."""
    from kvformats.transfer import plan_transfer, verify
    from kvformats.transfer.endpoint import Endpoint
    from kvformats.transfer.layerwise import LayerReceiver, wait_layers

    torch.set_num_threads(1)  # module doc
    caches, pages, rows = stack(tokens, layers, page, seed=2)  # the rows do not depend on the page size
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    here = Endpoint(base._engine(engine), caches)
    here.engine.register(flat.data_ptr(), nbytes)
    conn.send((here.hello(), {k: v.tolist() for k, v in pages.items()}, flat.data_ptr()))
    peer = here.connect(base._recv(conn, here), geometry=True)
    src_pages = base._recv(conn, here)
    plan = plan_transfer(peer.descs, here.descs, src_pages, pages, rows=rows)
    while True:
        msg = base._recv(conn, here)
        if msg == "bye":
            break
        kind, start = msg
        if kind == "whole":
            sums = _unpack(base._recv(conn, here))
            verify(plan, caches, sums)
            conn.send([time.monotonic() - start])
        else:
            rx = LayerReceiver(plan, caches, request="b")
            times: list[float] = []

            def stamp(receivers, rx=rx, times=times) -> bool:
                times.extend(time.monotonic() - start for _ in rx.verified[len(times):])
                return rx.valid

            wait_layers({"b": rx}, here, conn.poll, lambda: _layer_message(conn.recv()), timeout=base.WAIT_S,
                        until=stamp)
            stamp(None)
            conn.send(times)
    here.close()


def measure(engine: str, tokens: int, layers: int, page: int, repeat: int) -> dict:
    """One row of the figures (module doc)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module doc
    try:
        return _measure(engine, tokens, layers, page, repeat)
    finally:
        torch.set_num_threads(threads)


def _measure(engine: str, tokens: int, layers: int, page: int, repeat: int) -> dict:
    from kvformats.transfer import describe_caches, expected_checksums, plan_transfer
    from kvformats.transfer.endpoint import Endpoint
    from kvformats.transfer.layerwise import LayerSender

    caches, pages, rows = stack(tokens, layers, SRC_PAGE, seed=1)
    far, far_pages, _ = stack(tokens, layers, page, seed=2)
    descs, far_descs = describe_caches(caches), describe_caches(far)
    plan_s = []
    for _ in range(repeat + 1):  # the first builds the layouts' caches (bounds.checked_layout)
        t = time.perf_counter()
        local = plan_transfer(descs, far_descs, pages, far_pages, rows=rows)
        plan_s.append(time.perf_counter() - t)
    nbytes = local.nbytes
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    proc = ctx.Process(target=receiver, args=(b, engine, tokens, layers, page, nbytes))
    proc.start()
    times: dict[str, list] = {"plan": [], "contiguous": [], "whole": [], "first": [], "last": []}
    try:
        here = Endpoint(base._engine(engine), caches)
        flat = torch.ones(nbytes, dtype=torch.uint8)
        here.engine.register(flat.data_ptr(), nbytes)
        if not a.poll(base.WAIT_S):
            raise SystemExit("benchmark: the receiver did not start in time")
        hello, dst_pages, remote_flat = a.recv()
        peer = here.connect(hello, geometry=True)
        a.send(here.hello())
        a.send({k: v.tolist() for k, v in pages.items()})
        plan = plan_transfer(here.descs, peer.descs, pages, dst_pages, rows=rows)
        one = torch.tensor([[flat.data_ptr(), remote_flat, nbytes]])
        for i in range(repeat + 1):  # round 0 untimed: first touch of every page on both sides
            base.time_push(here, peer, plan, one, times)
            a.send(("whole", time.monotonic()))  # the whole request: checksums, push, "done", verify
            sums = expected_checksums(plan, caches)
            here.push(peer, plan, timeout=60)
            a.send(_pack(sums))
            times["whole"].append(base._recv(a, here)[0])
            a.send(("layerwise", time.monotonic()))  # layer by layer: each verified as it lands
            sender = LayerSender(here, peer, plan, caches, send=lambda m: a.send(_layer_bytes(m)), request="b")
            for k in sender.layers:
                sender.push(k, timeout=60)
            stamps = base._recv(a, here)
            times["first"].append(stamps[0])
            times["last"].append(stamps[-1])
        a.send("bye")
        here.close()
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    copy = _copy_seconds(flat, repeat)
    best = {k: min(v[1:]) for k, v in times.items()}
    return {"engine": engine, "tokens": tokens, "layers": layers, "src_page": SRC_PAGE, "dst_page": page,
            "bytes": nbytes, "segments_before": plan.segments_before, "segments": plan.segments,
            "plan_ms": round(min(plan_s[1:]) * 1e3, 2),
            "GB/s plan": round(nbytes / best["plan"] / 1e9, 2),
            "GB/s contiguous": round(nbytes / best["contiguous"] / 1e9, 2),
            "GB/s in-process copy": round(nbytes / copy / 1e9, 2),
            "whole_verified_ms": round(best["whole"] * 1e3, 1),
            "first_layer_verified_ms": round(best["first"] * 1e3, 1),
            "all_layers_verified_ms": round(best["last"] * 1e3, 1)}


def _copy_seconds(flat: torch.Tensor, repeat: int) -> float:
    """Best of ``repeat`` one-thread copies of ``flat`` (the engines move bytes on one thread)."""
    dst = torch.zeros_like(flat)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        dst.copy_(flat)
        best = min(best, time.perf_counter() - t)
    return best


def table(rows: list[dict]) -> str:
    head = ("| engine | tokens | pages (prefill → decode) | MB moved | segments (before → after) | plan ms | "
            "GB/s plan | GB/s contiguous | GB/s in-process copy | first layer verified, ms | all layers, ms | "
            "whole request verified, ms |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['tokens']} | {r['src_page']} → {r['dst_page']} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['segments_before']} → {r['segments']} | {r['plan_ms']} | {r['GB/s plan']} | "
                     f"{r['GB/s contiguous']} | {r['GB/s in-process copy']} | {r['first_layer_verified_ms']} | "
                     f"{r['all_layers_verified_ms']} | {r['whole_verified_ms']} |")
    return "\n".join(lines)


def svg(rows: list[dict]) -> str:
    """Two panels per row (engine, tokens, page sizes): GB/s of the plan against a contiguous
    buffer, and ms to the first verified layer, to all layers and to the whole request. Plain SVG."""
    left, width, bar, gap, mid = 200, 900, 9, 12, 520
    top_gbps = max(max(r["GB/s plan"], r["GB/s contiguous"]) for r in rows) or 1.0
    top_ms = max(max(r["whole_verified_ms"], r["all_layers_verified_ms"]) for r in rows) or 1.0
    gb_scale, ms_scale = (mid - left - 60) / top_gbps, (width - mid - 60) / top_ms
    height = 70 + len(rows) * (3 * bar + gap) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">',
           '<text x="10" y="16" font-size="13">One request\'s V4 rows, prefill pages of 64 rows to decode pages of '
           '32 / 64 / 128 (2-core CPU, 127.0.0.1)</text>',
           f'<text x="{left}" y="34">GB/s</text><text x="{mid}" y="34">ms to verified</text>']
    legend = (("#1565c0", "plan's segments", left), ("#90caf9", "one contiguous buffer", left + 110),
              ("#2e7d32", "first layer", mid), ("#a5d6a7", "all layers", mid + 80),
              ("#bdbdbd", "whole request", mid + 160))
    for color, label, x in legend:
        out.append(f'<rect x="{x}" y="42" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="51">{label}</text>')
    y = 62
    for r in rows:
        out.append(f'<text x="{left - 6}" y="{y + 1.5 * bar + 4:.0f}" text-anchor="end">{r["engine"]} '
                   f'{r["tokens"] // 1024}k, {r["src_page"]} → {r["dst_page"]}</text>')
        for i, (key, color) in enumerate((("GB/s plan", "#1565c0"), ("GB/s contiguous", "#90caf9"))):
            w = r[key] * gb_scale
            out.append(f'<rect x="{left}" y="{y + i * bar}" width="{w:.1f}" height="{bar - 1}" fill="{color}"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + i * bar + bar - 1}">{r[key]:.2f}</text>')
        for i, (key, color) in enumerate((("first_layer_verified_ms", "#2e7d32"), ("all_layers_verified_ms", "#a5d6a7"),
                                          ("whole_verified_ms", "#bdbdbd"))):
            w = r[key] * ms_scale
            out.append(f'<rect x="{mid}" y="{y + i * bar}" width="{w:.1f}" height="{bar - 1}" fill="{color}"/>'
                       f'<text x="{mid + w + 4:.1f}" y="{y + i * bar + bar - 1}">{r[key]:.1f}</text>')
        y += 3 * bar + gap
    out.append("</svg>")
    return "\n".join(out) + "\n"
