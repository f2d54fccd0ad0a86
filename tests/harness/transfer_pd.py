"""Prefill/decode disaggregation on the layer-step reference, as two processes (tests, docs).

Process A (prefill) runs the prefill of some requests, moves each request's pages of every
cache to process B (decode) at B's own page ids with a transfer engine, then runs its own
decode step. B verifies the checksums, marks the pages valid (only then) and runs the same
decode step. Both send their decode outputs to the parent, which compares them bit for bit.
The processes talk over a multiprocessing pipe (hellos, page ids, "done" with checksums), every
wait bounded; the engine moves the bytes over 127.0.0.1.

``mode``: "ok"; "rows" (only the request's written rows move, not whole pages); "corrupt"
(A changes one byte of a source page after checksumming it, as a flip in flight would);
"mismatch" (B's indexer cache has another format: the handshake fails).
"""

from __future__ import annotations

import io
import time
import traceback

import torch

from kvformats.dsv4_layer.pipeline import LayerStep
from kvformats.dsv4_layer.pipeline_config import CSA_RATIO, HCA_RATIO, tiny_config
from kvformats.dsv4_layer.pipeline_weights import LayerWeights
from kvformats.errors import TransferError

WAIT_S = 120.0  # every wait on the other process
PREFILL = (40, 70)  # tokens per request

# cache name -> (block table attribute, rows per position ratio)
TABLES = {"swa": ("swa_table", 1), "csa": ("csa_table", CSA_RATIO), "index": ("csa_table", CSA_RATIO),
          "hca": ("hca_table", HCA_RATIO), "csa_state": ("csa_state_table", 1),
          "idx_state": ("idx_state_table", 1), "hca_state": ("hca_state_table", 1)}


def caches_of(step: LayerStep) -> dict:
    c = step.caches
    layouts = {"swa": c.kv_layout, "csa": c.kv_layout, "hca": c.kv_layout, "index": c.index_layout,
               "csa_state": c.csa_state_layout, "idx_state": c.idx_state_layout, "hca_state": c.hca_state_layout}
    return {name: (layouts[name], t) for name, t in c.tensors().items()}


def request_pages(step: LayerStep, r: int, tokens: int) -> dict[str, torch.Tensor]:
    """Cache name -> the page ids holding request ``r``'s first ``tokens`` positions (caches
    with no row yet are left out)."""
    out = {}
    for name, (table, ratio) in TABLES.items():
        rows = tokens // ratio
        n = -(-rows // step.cfg.page_size)
        if n:
            out[name] = getattr(step.caches, table)[r, :n].clone()
    return out


def request_rows(step: LayerStep, tokens: int) -> dict[str, tuple[int, int]]:
    """Cache name -> the request's written rows [0, n) (mode "rows": only those move)."""
    return {name: (0, tokens // ratio) for name, (_, ratio) in TABLES.items() if tokens // ratio}


def batch(cfg, lengths, seed: int):
    g = torch.Generator().manual_seed(seed)
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    return torch.randn(pos.shape[0], cfg.hidden, generator=g), pos, req


def decode_batch(cfg, lengths, seed: int):
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(len(lengths), cfg.hidden, generator=g)
    return x, torch.tensor(lengths, dtype=torch.int64), torch.arange(len(lengths), dtype=torch.int64)


def outputs(o) -> dict:
    return {"swa": o.swa, "csa": o.csa, "hca": o.hca, "layer": o.layer, "topk": o.topk,
            "index_scores": o.index_scores, "out_fp8": tuple(o.out_fp8)}


def pack(obj) -> bytes:
    """Tensors between processes as bytes: torch's shared-memory handles die with their sender."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unpack(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


def _recv(conn, what: str, here=None):
    """The next message, driving this side's engine meanwhile (a peer's one-sided write or read
    may need it: NIXL runs without a progress thread)."""
    deadline = time.monotonic() + WAIT_S
    while not conn.poll(0.001):
        if here is not None:
            here.engine.progress()
        if time.monotonic() > deadline:
            raise TransferError(f"no {what} from the peer within {WAIT_S} s")
    msg = conn.recv()
    return unpack(msg) if isinstance(msg, bytes) and msg[:2] == b"PK" else msg


def _engine(name: str, **options):
    from kvformats.transfer.engines import make_engine

    if name == "nixl":
        return make_engine(name, loopback=True, **options)
    return make_engine(name, host="127.0.0.1")


def prefill_side(conn, results, engine_name: str, direction: str, mode: str) -> None:
    """Process A."""
    from kvformats.transfer import expected_checksums, plan_transfer
    from kvformats.transfer.endpoint import Endpoint

    try:
        cfg = tiny_config()
        step = LayerStep(cfg, seed=0, backend="reference")
        step.step(*batch(cfg, PREFILL, 0))
        caches = caches_of(step)
        here = Endpoint(_engine(engine_name), caches)
        conn.send(here.hello())
        try:
            peer = here.connect(_recv(conn, "hello"))
        except Exception as err:
            conn.send(("abort", type(err).__name__))
            raise
        dst_pages = _recv(conn, "page ids")
        for r, tokens in enumerate(PREFILL):
            src_pages = request_pages(step, r, tokens)
            rows = request_rows(step, tokens) if mode == "rows" else None
            plan = plan_transfer(here.descs, peer.descs, src_pages, dst_pages[r], rows=rows)
            sums = expected_checksums(plan, caches)
            if mode == "corrupt" and r == 1:
                layout, cache = caches["index"]
                page = int(plan.caches["index"].src_pages[0])
                cache[page, layout.region(layout.regions[-1].name).offset] ^= 0x40  # one byte, after checksumming
            if direction == "push":
                here.push(peer, plan, timeout=30)
                conn.send(pack(("done", src_pages, {k: v.cpu() for k, v in sums.items()})))
            else:
                conn.send(pack(("ready", src_pages, {k: v.cpu() for k, v in sums.items()})))
                _recv(conn, "pulled", here)
        out = outputs(step.step(*decode_batch(cfg, PREFILL, 0)))
        _recv(conn, "bye", here)
        here.close()
        results.put(("A", "ok", pack(out)))
    except Exception as err:  # reported to the parent, which fails the test with it
        results.put(("A", "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def decode_side(conn, results, engine_name: str, direction: str, mode: str) -> None:
    """Process B: other page ids (another table seed), the same weights."""
    from kvformats.transfer import plan_transfer, verify
    from kvformats.transfer.endpoint import Endpoint

    try:
        cfg = tiny_config(index_format="fp8_indexer") if mode == "mismatch" else tiny_config()
        step = LayerStep(cfg, seed=7, backend="reference", weights=LayerWeights.random(tiny_config(), seed=0))
        caches = caches_of(step)
        here = Endpoint(_engine(engine_name), caches)
        conn.send(here.hello())
        msg = _recv(conn, "hello")
        if isinstance(msg, tuple):  # the prefill side refused the handshake
            results.put(("B", "refused", msg[1]))
            return
        peer = here.connect(msg)
        conn.send(pack([request_pages(step, r, tokens) for r, tokens in enumerate(PREFILL)]))
        valid = []
        for r, tokens in enumerate(PREFILL):
            kind, src_pages, sums = _recv(conn, "done", here)
            rows = request_rows(step, tokens) if mode == "rows" else None
            plan = plan_transfer(peer.descs, here.descs, src_pages, request_pages(step, r, tokens), rows=rows)
            if kind == "ready":
                here.pull(peer, plan, timeout=30)
                conn.send("pulled")
            try:
                verify(plan, caches, sums)
            except Exception as err:
                conn.send("bye")
                results.put(("B", "rejected", f"{type(err).__name__}: {err}", valid))
                return
            valid.append(r)  # only now are the request's pages valid here
        conn.send("bye")
        out = outputs(step.step(*decode_batch(cfg, PREFILL, 0)))
        here.close()
        results.put(("B", "ok", pack(out), valid))
    except Exception as err:
        results.put(("B", "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def _arena(pages: int, seed: int | None):
    """An fp8_ds_mla field and an MXFP4 indexer field of one strided arena (tiny shapes)."""
    from kvformats.formats import Fp8DsMla, Mxfp4Indexer

    kv, idx = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16), Mxfp4Indexer(head_dim=128, page_size=16)
    stride = kv.page_bytes + idx.page_bytes
    buf = torch.zeros(pages * stride, dtype=torch.uint8)
    if seed is not None:
        buf.random_(0, 256, generator=torch.Generator().manual_seed(seed))
    return {"kv": (kv, buf.as_strided((pages, kv.page_bytes), (stride, 1), 0)),
            "index": (idx, buf.as_strided((pages, idx.page_bytes), (stride, 1), kv.page_bytes))}


def _arena_push(engine_name: str) -> str:
    """Fields of a strided arena moved per field, then as whole physical pages, each verified."""
    from kvformats.layout import storage_bytes
    from kvformats.transfer import expected_checksums, plan_transfer, verify
    from kvformats.transfer.endpoint import Endpoint

    src, dst = _arena(10, seed=5), _arena(12, seed=None)
    a = Endpoint(_engine(engine_name), src)
    b = Endpoint(_engine(engine_name, progress_thread=True), dst)
    peer = a.connect(b.hello())
    pages = {"kv": [1, 2, 3, 9], "index": [1, 2, 3, 9]}
    there = {"kv": [11, 4, 5, 0], "index": [11, 4, 5, 0]}
    for whole in (False, True):
        plan = plan_transfer(a.descs, peer.descs, pages, there, whole_pages=whole)
        a.push(peer, plan, timeout=30)
        verify(plan, dst, expected_checksums(plan, src))
    untouched = [p for p in range(12) if p not in there["kv"]]
    a.close()
    b.close()
    arena_pages = storage_bytes(dst["kv"][1]).view(12, -1)  # both fields of each physical page
    return "ok" if not arena_pages[torch.tensor(untouched)].any() else "bytes outside the plan changed"


def engine_checks(results, engine_name: str) -> None:
    """Two endpoints of one engine in this process: a push in batches of 4 lands byte for byte;
    a segment beyond the peer's registered memory is a TransferError; a stale plan is refused
    before the engine sees it. Reports {check: outcome} (run in a child: engines start threads)."""
    from kvformats.errors import InputError
    from kvformats.formats import Fp8DsMla
    from kvformats.transfer import describe_caches, plan_transfer
    from kvformats.transfer.endpoint import Endpoint

    out = {}
    try:
        layout = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
        src, dst = layout.allocate(12), layout.allocate(12)
        src.random_(0, 256, generator=torch.Generator().manual_seed(3))
        engine = _engine(engine_name)
        engine.max_batch = 4
        a = Endpoint(engine, {"kv": (layout, src)})
        # the target side of a one-process pair runs NIXL's progress thread: nobody polls it
        b = Endpoint(_engine(engine_name, progress_thread=True), {"kv": (layout, dst)})
        peer = a.connect(b.hello())
        pages = list(range(0, 12, 2))  # six pages, none adjacent: six segments, two batches
        plan = plan_transfer(a.descs, peer.descs, {"kv": pages}, {"kv": pages[::-1]})
        a.push(peer, plan, timeout=30)
        out["push"] = bool(torch.equal(dst[torch.tensor(pages[::-1])], src[torch.tensor(pages)]))
        dst.zero_()
        out["arena"] = _arena_push(engine_name)
        far = torch.tensor([[src.data_ptr(), peer.bases["kv"] + (1 << 40), 64]])
        try:
            a._run("write", far, peer, 30)
            out["beyond"] = "no error"
        except TransferError as err:
            out["beyond"] = f"TransferError: {err}"
        other = describe_caches({"kv": (layout, layout.allocate(5))})  # a peer with 5 pages, not this one
        stale = plan_transfer(a.descs, other, {"kv": [0]}, {"kv": [1]})
        try:
            a.push(peer, stale, timeout=30)
            out["stale"] = "no error"
        except InputError as err:
            out["stale"] = f"InputError: {err}"
        out["untouched"] = not bool(dst.any())
        a.close()
        b.close()
        results.put(("ok", out))
    except Exception as err:
        results.put(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
