"""Engine settings stay with their engine (issue 46): the adapters write no process-wide
environment variable. NIXL: importing it, probing it and constructing engines leave os.environ
as it was, and UCX_MODULES=^ib* still reaches UCX where a loopback engine needs it (no
InfiniBand module loaded, a clean exit). Mooncake: two engines with their own host and timeout
each start with theirs (Mooncake reads both from the environment: they are set for that engine's
start alone), from one thread or two, and os.environ is as it was after."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from kvformats.errors import InputError, InputTypeError, TransferError
from kvformats.transfer.engines import available

VARS = ("MC_TCP_BIND_ADDRESS", "MC_TRANSFER_TIMEOUT")


def _child(target, timeout: float = 120):
    """Run ``target(results)`` in a spawned child; (its result, its exit code)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=target, args=(results,))
    proc.start()
    try:
        got = results.get(timeout=timeout)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    return got, proc.exitcode


def test_importing_and_probing_nixl_leaves_the_environment_alone(monkeypatch):
    """Before: the import (``_import``, which ``available`` calls too) set UCX_MODULES=^ib* for the
    whole process, turning InfiniBand off where NIXL is deployed for it."""
    monkeypatch.delenv("UCX_MODULES", raising=False)
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    before = dict(os.environ)
    from kvformats.transfer.engines import nixl

    available("nixl")
    try:
        nixl._import()
    except Exception:  # noqa: BLE001 - not installed here: only the environment matters
        pass
    assert dict(os.environ) == before


def test_nixl_options_are_checked_before_anything_starts():
    from kvformats.transfer.engines.nixl import NixlEngine

    for bad in ("", 1, ["^ib*"]):
        with pytest.raises(InputTypeError, match="ucx_modules must be a non-empty str"):
            NixlEngine(ucx_modules=bad)


def test_nixl_engines_leave_the_environment_alone_and_load_no_infiniband_module_on_loopback():
    if not available("nixl"):
        pytest.skip("the nixl engine is not installed here (pip install 'kvformats[nixl]')")
    from tests.transfer import engine_children as kids

    (kind, out), code = _child(kids.nixl_settings)
    assert kind == "ok", out
    assert out["env_changed"] == {} and out["env_removed"] == [], out
    assert out["available"] is True and out["ucx_before"] is False and out["ucx_after"] is True
    assert out["ib_loaded"] is False  # UCX_MODULES=^ib* reached UCX, for the engine's start only
    assert out["other_modules"].startswith("ucx_modules='^tcp' cannot apply: UCX reads UCX_MODULES once per "
                                           "process, when its library loads, and it was loaded here with '^ib*'")
    assert out["landed"] is True
    assert code == 0  # no crash at exit (the InfiniBand modules, loaded, crash it here)


class FakeMooncake:
    """Mooncake's TransferEngine as the adapter calls it; records the environment each engine's
    constructor and initialize see (where Mooncake reads its bind address and timeout)."""

    pause = 0.0
    rc = 0

    def __init__(self):
        self.seen = {"constructor": tuple(os.environ.get(v) for v in VARS)}
        time.sleep(self.pause)  # another thread's engine may start meanwhile

    def initialize(self, host, *args):
        self.seen["initialize"] = tuple(os.environ.get(v) for v in VARS)
        time.sleep(self.pause)
        return self.rc

    def get_rpc_port(self):
        return 12345


@pytest.fixture
def fake(monkeypatch):
    from kvformats.transfer.engines import mooncake

    monkeypatch.setattr(mooncake, "_import", lambda: FakeMooncake)
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    return mooncake


def test_two_mooncake_engines_each_start_with_their_own_host_and_timeout(fake):
    """Before: ``os.environ.setdefault`` kept the first engine's values for every later one, and
    left them set for the process."""
    a = fake.MooncakeEngine(host="127.0.0.1", timeout_s=7)
    b = fake.MooncakeEngine(host="127.0.0.2", timeout_s=12)
    assert a.engine.seen == {"constructor": ("127.0.0.1", "7"), "initialize": ("127.0.0.1", "7")}
    assert b.engine.seen == {"constructor": ("127.0.0.2", "12"), "initialize": ("127.0.0.2", "12")}
    assert (a.timeout_s, a.wait_s, b.timeout_s, b.wait_s) == (7, 12, 12, 17)
    assert (a.metadata(), b.metadata()) == (b"127.0.0.1:12345", b"127.0.0.2:12345")
    assert all(v not in os.environ for v in VARS)


def test_the_users_settings_stand_where_an_engine_sets_none_and_come_back_after(fake, monkeypatch):
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "40")
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "10.0.0.1")
    before = dict(os.environ)
    a = fake.MooncakeEngine(host="127.0.0.3")  # no timeout_s: the environment's 40 s
    assert a.engine.seen["initialize"] == ("127.0.0.3", "40") and (a.timeout_s, a.wait_s) == (40, 45)
    b = fake.MooncakeEngine(timeout_s=2)  # Mooncake applies at least 5 s: close() waits for that
    assert b.engine.seen["initialize"] == ("127.0.0.1", "2") and (b.timeout_s, b.wait_s) == (5, 10)
    monkeypatch.setattr(FakeMooncake, "rc", -1)
    with pytest.raises(TransferError, match="could not start on 127.0.0.4"):
        fake.MooncakeEngine(host="127.0.0.4", timeout_s=9)
    assert dict(os.environ) == before  # after a failed start too
    with pytest.raises(InputError, match="timeout_s must be a positive int"):
        fake.MooncakeEngine(timeout_s=True)


def test_mooncake_engines_started_on_two_threads_each_see_their_own_settings(fake, monkeypatch):
    monkeypatch.setattr(FakeMooncake, "pause", 0.05)
    engines: dict = {}

    def start(host, timeout_s):
        engines[host] = fake.MooncakeEngine(host=host, timeout_s=timeout_s)

    threads = [threading.Thread(target=start, args=(f"127.0.0.{i}", 10 + i)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i in range(1, 5):
        seen = engines[f"127.0.0.{i}"].engine.seen
        assert seen == {"constructor": (f"127.0.0.{i}", str(10 + i)), "initialize": (f"127.0.0.{i}", str(10 + i))}
    assert all(v not in os.environ for v in VARS)


def test_real_mooncake_engines_keep_their_own_settings():
    if not available("mooncake"):
        pytest.skip("the mooncake engine is not installed here (pip install 'kvformats[mooncake]', "
                    "apt-get install libibverbs1)")
    from tests.transfer import engine_children as kids

    (kind, out), _ = _child(kids.mooncake_settings)
    assert kind == "ok", out
    assert out["hosts"] == ["127.0.0.1", "127.0.0.2"] and out["timeouts"] == [7, 40]
    assert out["env_same"] is True and out["landed"] is True
