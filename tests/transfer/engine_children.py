"""Child processes of tests/transfer/test_engines.py's real-engine checks (engines start threads,
so they run in spawned children; every wait is bounded). Each child sends its fd 2 to a file
first, so that what the engines log on a successful transfer can be read back."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
import traceback

import torch

ERROR_LINE = re.compile(rb"(?m)^(E\d{4} .*|.*\bERROR\b.*)$")  # glog's error lines, NIXL's and UCX's
WAIT_S = 60.0


def _capture_stderr():
    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 2)
    return log


def _exit(results) -> None:
    """Leave at once (a batch left at a deadline must not hold the exit), after the queue's
    feeder thread has sent what was put."""
    results.close()
    results.join_thread()
    os._exit(0)


def _errors(log) -> list[str]:
    log.seek(0)
    return [m.decode(errors="replace") for m in ERROR_LINE.findall(log.read())]


def _caches(pages: int, seed: int | None):
    from kvformats.formats import Fp8DsMla

    layout = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
    cache = layout.allocate(pages)
    if seed is not None:
        cache.random_(0, 256, generator=torch.Generator().manual_seed(seed))
    return {"kv": (layout, cache)}


def mooncake_peer(conn) -> None:
    """A Mooncake side that registers its cache, sends its hello and pid, then idles (the test's
    other child stops it with SIGSTOP: a stalled peer)."""
    from kvformats.transfer.endpoint import Endpoint
    from kvformats.transfer.engines import make_engine

    here = Endpoint(make_engine("mooncake", host="127.0.0.1"), _caches(8, None))
    conn.send((here.hello(), os.getpid()))
    time.sleep(WAIT_S)


def _wait_stopped(pid: int, limit_s: float = 10.0) -> None:
    """Until process ``pid`` is stopped (state T in /proc), at most ``limit_s`` seconds."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} did not stop within {limit_s} s of SIGSTOP")


def mooncake_pusher(conn, results) -> None:
    """Push to the peer once (no error line may be logged), stop the peer, push again with a
    1 s deadline: the TransferError must come about then, not after MC_TRANSFER_TIMEOUT."""
    log = _capture_stderr()
    out: dict = {}
    try:
        from kvformats.errors import TransferError
        from kvformats.transfer import plan_transfer
        from kvformats.transfer.endpoint import Endpoint
        from kvformats.transfer.engines import make_engine

        os.environ["MC_TRANSFER_TIMEOUT"] = "20"
        here = Endpoint(make_engine("mooncake", host="127.0.0.1"), _caches(8, seed=1))
        if not conn.poll(WAIT_S):
            raise TimeoutError("no hello from the peer")
        hello, pid = conn.recv()
        peer = here.connect(hello)
        plan = plan_transfer(here.descs, peer.descs, {"kv": [0, 2, 4]}, {"kv": [1, 3, 5]})
        here.push(peer, plan, timeout=20)
        out["errors_on_success"] = _errors(log)
        os.kill(pid, signal.SIGSTOP)
        _wait_stopped(pid)  # the signal is delivered asynchronously: a busy host may still run the peer
        start = time.monotonic()
        try:
            here.push(peer, plan, timeout=1)
            out["stalled"] = "no error"
        except TransferError as err:
            out["stalled"] = str(err)
        out["stalled_s"] = time.monotonic() - start
        results.put(("ok", out))
    except Exception as err:  # reported to the test, which fails with it
        results.put(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    _exit(results)  # the stalled batch's thread runs on until MC_TRANSFER_TIMEOUT: do not wait for it


def nixl_checks(results) -> None:
    """With the engines' defaults, a push to a side that never calls progress lands (its progress
    thread serves it) and logs no error line; to a side built with progress_thread=False that
    never progresses, the push times out with a message naming that cause."""
    log = _capture_stderr()
    out: dict = {}
    try:
        from kvformats.errors import TransferError
        from kvformats.transfer import plan_transfer
        from kvformats.transfer.endpoint import Endpoint
        from kvformats.transfer.engines import make_engine

        src, dst = _caches(8, seed=2), _caches(8, None)
        a = Endpoint(make_engine("nixl", loopback=True), src)
        b = Endpoint(make_engine("nixl", loopback=True), dst)
        peer = a.connect(b.hello())
        plan = plan_transfer(a.descs, peer.descs, {"kv": [0, 2, 4]}, {"kv": [1, 3, 5]})
        a.push(peer, plan, timeout=10)
        out["landed"] = bool(torch.equal(dst["kv"][1][[1, 3, 5]], src["kv"][1][[0, 2, 4]]))
        out["errors_on_success"] = _errors(log)
        c = Endpoint(make_engine("nixl", loopback=True, progress_thread=False), _caches(8, None))
        idle = a.connect(c.hello())
        try:
            a.push(idle, plan_transfer(a.descs, idle.descs, {"kv": [0]}, {"kv": [1]}), timeout=1)
            out["idle"] = "no error"
        except TransferError as err:
            out["idle"] = str(err)
        results.put(("ok", out))
    except Exception as err:
        results.put(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    _exit(results)  # an abandoned NIXL transfer must not hold the exit


def _maps(name: str) -> bool:
    """Whether a shared library whose path contains ``name`` is loaded in this process."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return any(name in line for line in f)


def nixl_settings(results) -> None:
    """NIXL engines leave os.environ as it was; a loopback engine (the first, so it loads UCX)
    loads no InfiniBand module; a later engine asking UCX for other modules is refused; two
    loopback engines still move pages. The child returns normally: the parent checks its exit
    code, since a process that loaded the InfiniBand modules here crashes at exit."""
    out: dict = {}
    try:
        from kvformats.errors import InputError
        from kvformats.transfer import plan_transfer
        from kvformats.transfer.endpoint import Endpoint
        from kvformats.transfer.engines import available, make_engine

        for var in ("UCX_MODULES", "UCX_NET_DEVICES"):  # as on a machine where nobody set them
            os.environ.pop(var, None)
        before = dict(os.environ)
        out["available"] = available("nixl")
        out["ucx_before"] = _maps("libucs")
        src, dst = _caches(8, seed=3), _caches(8, None)
        a = Endpoint(make_engine("nixl", loopback=True), src)
        b = Endpoint(make_engine("nixl", loopback=True, ucx_modules="^ib*"), dst)  # the same: accepted
        out["ucx_after"], out["ib_loaded"] = _maps("libucs"), _maps("libuct_ib")
        try:
            make_engine("nixl", loopback=True, ucx_modules="^tcp")
            out["other_modules"] = "no error"
        except InputError as err:
            out["other_modules"] = str(err)
        peer = a.connect(b.hello())
        a.push(peer, plan_transfer(a.descs, peer.descs, {"kv": [0, 2, 4]}, {"kv": [1, 3, 5]}), timeout=10)
        out["landed"] = bool(torch.equal(dst["kv"][1][[1, 3, 5]], src["kv"][1][[0, 2, 4]]))
        out["env_changed"] = {k: (before.get(k), v) for k, v in dict(os.environ).items() if before.get(k) != v}
        out["env_removed"] = sorted(set(before) - set(os.environ))
        a.close()
        b.close()
        results.put(("ok", out))
    except Exception as err:
        results.put(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    results.close()
    results.join_thread()  # then a normal exit, through UCX's own teardown


def mooncake_settings(results) -> None:
    """Two real Mooncake engines of one process with their own host and timeout: each keeps its
    own, os.environ is as it was after both, and a push from one to the other lands."""
    out: dict = {}
    try:
        from kvformats.transfer import plan_transfer
        from kvformats.transfer.endpoint import Endpoint
        from kvformats.transfer.engines import make_engine

        os.environ.pop("MC_TCP_BIND_ADDRESS", None)
        os.environ["MC_TRANSFER_TIMEOUT"] = "40"  # a user's setting: an engine without timeout_s takes it
        before = dict(os.environ)
        src, dst = _caches(8, seed=4), _caches(8, None)
        a = Endpoint(make_engine("mooncake", host="127.0.0.1", timeout_s=7), src)
        b = Endpoint(make_engine("mooncake", host="127.0.0.2"), dst)
        out["hosts"] = [e.engine.metadata().decode().rpartition(":")[0] for e in (a, b)]
        out["timeouts"] = [a.engine.timeout_s, b.engine.timeout_s]
        out["env_same"] = dict(os.environ) == before
        peer = a.connect(b.hello())
        a.push(peer, plan_transfer(a.descs, peer.descs, {"kv": [0, 2, 4]}, {"kv": [1, 3, 5]}), timeout=20)
        out["landed"] = bool(torch.equal(dst["kv"][1][[1, 3, 5]], src["kv"][1][[0, 2, 4]]))
        results.put(("ok", out))
    except Exception as err:
        results.put(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    _exit(results)


# ----- P/D across page geometries, whole requests and layer by layer (issue 45) -----------------
# Process A prefills with pages of 64 rows, process B decodes with pages of 32 or 128; the
# request's token rows of every cache move between them (plan_transfer across geometries). Both
# report each request's rows of every cache per token (gathered and decoded) and their decode
# step's outputs; the parent compares them bit for bit.
PREFILL_PAGE = 64


def _steps(page: int, seed: int, layers: int):
    """(config, one layer-step reference per layer): layer k's weights are seed k on both sides,
    the block tables each side's own (``seed``)."""
    from kvformats.dsv4_layer.pipeline import LayerStep
    from kvformats.dsv4_layer.pipeline_config import tiny_config
    from kvformats.dsv4_layer.pipeline_weights import LayerWeights

    cfg = tiny_config(page_size=page)
    return cfg, [LayerStep(cfg, seed=seed + k, backend="reference", weights=LayerWeights.random(tiny_config(), seed=k))
                 for k in range(layers)]


def _per_layer(steps, fn) -> dict:
    """{"L<k>.<cache>": value} of ``fn(step)``'s {cache: value} for every layer."""
    return {f"L{k}.{name}": v for k, step in enumerate(steps) for name, v in fn(step).items()}


def _token_rows(steps, r: int, tokens: int) -> dict:
    """Cache name -> (encoded rows, decoded rows) of request ``r``'s rows [0, tokens // ratio),
    read through this side's block tables: what the bytes mean, whatever the pages."""
    from tests.harness import transfer_pd as pd

    def rows(step):
        out = {}
        for name, (table, ratio) in pd.TABLES.items():
            n = tokens // ratio
            if n:
                layout, cache = pd.caches_of(step)[name]
                i = torch.arange(n)
                slots = getattr(step.caches, table)[r, i // layout.page_size] * layout.page_size + i % layout.page_size
                out[name] = (layout.gather(cache, slots), layout.decode(cache, slots))
        return out

    return _per_layer(steps, rows)


def _message(m) -> bytes:
    """A LayerMessage or LayerFailed as bytes (torch's shared-memory tensors die with their sender)."""
    import attrs

    from tests.harness import transfer_pd as pd

    return pd.pack({"kind": type(m).__name__, **attrs.asdict(m, recurse=False)})


def _layer_message(data):
    from kvformats.transfer.layerwise import LayerFailed, LayerMessage
    from tests.harness import transfer_pd as pd

    d = pd.unpack(data)
    kind = d.pop("kind")
    return LayerMessage(**d) if kind == "LayerMessage" else LayerFailed(**d)


def _geometry_side(conn, engine: str, page: int, seed: int, layers: int):
    """One side of the geometry run: its model steps (pages of ``page`` rows), their caches and an
    endpoint connected to the other side's (another geometry of the same records allowed)."""
    from kvformats.transfer.endpoint import Endpoint
    from tests.harness import transfer_pd as pd

    cfg, steps = _steps(page, seed, layers)
    caches = _per_layer(steps, pd.caches_of)
    here = Endpoint(pd._engine(engine), caches)
    conn.send(here.hello())
    return cfg, steps, caches, here, here.connect(pd._recv(conn, "hello"), geometry=True)


def geometry_prefill(conn, results, engine: str, direction: str, layers: int, layerwise: bool) -> None:
    """Process A: prefill (pages of 64 rows), then move each request's rows to B: whole
    requests (push or pull) or layer by layer, each layer pushed once prefill wrote it."""
    from tests.harness import transfer_pd as pd

    try:
        from kvformats.transfer import expected_checksums, plan_transfer
        from kvformats.transfer.layerwise import LayerSender

        cfg, steps, caches, here, peer = _geometry_side(conn, engine, PREFILL_PAGE, 0, layers)
        dst_pages = pd._recv(conn, "page ids")
        src_pages = [_per_layer(steps, lambda s: pd.request_pages(s, r, n)) for r, n in enumerate(pd.PREFILL)]
        conn.send(pd.pack(src_pages))
        plans = [plan_transfer(here.descs, peer.descs, src_pages[r], dst_pages[r],
                               rows=_per_layer(steps, lambda s: pd.request_rows(s, n)))
                 for r, n in enumerate(pd.PREFILL)]
        if layerwise:
            senders = [LayerSender(here, peer, plan, caches, send=lambda m: conn.send(_message(m)), request=str(r))
                       for r, plan in enumerate(plans)]
            for k, step in enumerate(steps):
                step.step(*pd.batch(cfg, pd.PREFILL, 0))  # prefill of layer k ...
                for sender in senders:
                    sender.push(k, timeout=30)  # ... moves at once
        else:
            for step in steps:
                step.step(*pd.batch(cfg, pd.PREFILL, 0))
            for plan in plans:
                sums = {k: v.cpu() for k, v in expected_checksums(plan, caches).items()}
                if direction == "push":
                    here.push(peer, plan, timeout=30)
                    conn.send(pd.pack(("done", sums)))
                else:
                    conn.send(pd.pack(("ready", sums)))
                    pd._recv(conn, "pulled", here)
        rows = [_token_rows(steps, r, n) for r, n in enumerate(pd.PREFILL)]
        out = [pd.outputs(step.step(*pd.decode_batch(cfg, pd.PREFILL, 0))) for step in steps]
        pd._recv(conn, "bye", here)
        here.close()
        results.put(("A", "ok", pd.pack({"rows": rows, "out": out})))
    except Exception as err:  # reported to the parent, which fails the test with it
        results.put(("A", "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def geometry_decode(conn, results, engine: str, direction: str, layers: int, layerwise: bool,
                    page: int = 32) -> None:
    """Process B: pages of ``page`` rows, its own block tables; verifies every request (layer
    by layer as each lands, in layer-wise mode) and marks it valid only then; then decodes."""
    from tests.harness import transfer_pd as pd

    try:
        from kvformats.transfer import plan_transfer, verify
        from kvformats.transfer.layerwise import LayerReceiver, wait_layers

        cfg, steps, caches, here, peer = _geometry_side(conn, engine, page, 7, layers)
        my_pages = [_per_layer(steps, lambda s: pd.request_pages(s, r, n)) for r, n in enumerate(pd.PREFILL)]
        conn.send(pd.pack(my_pages))
        src_pages = pd._recv(conn, "page ids", here)
        plans = [plan_transfer(peer.descs, here.descs, src_pages[r], my_pages[r],
                               rows=_per_layer(steps, lambda s: pd.request_rows(s, n)))
                 for r, n in enumerate(pd.PREFILL)]
        valid, order = [], []
        if layerwise:
            receivers = {str(r): LayerReceiver(plan, caches, request=str(r)) for r, plan in enumerate(plans)}
            wait_layers(receivers, here, conn.poll, lambda: _layer_message(conn.recv()), timeout=WAIT_S)
            valid = [int(r) for r, rx in receivers.items() if rx.valid]
            order = {r: rx.verified for r, rx in receivers.items()}
        else:
            for r, plan in enumerate(plans):
                kind, sums = pd._recv(conn, "done", here)
                if kind == "ready":
                    here.pull(peer, plan, timeout=30)
                    conn.send("pulled")
                verify(plan, caches, sums)
                valid.append(r)  # only now are the request's pages valid here
        conn.send("bye")
        rows = [_token_rows(steps, r, n) for r, n in enumerate(pd.PREFILL)]
        out = [pd.outputs(step.step(*pd.decode_batch(cfg, pd.PREFILL, 0))) for step in steps]
        here.close()
        results.put(("B", "ok", pd.pack({"rows": rows, "out": out}), valid, order))
    except Exception as err:
        results.put(("B", "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
