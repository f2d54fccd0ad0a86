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
