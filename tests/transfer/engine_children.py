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
