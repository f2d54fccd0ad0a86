"""Mooncake Transfer Engine (TCP) behind the engine interface: ``pip install 'kvformats[mooncake]'``.

Facts relied on (Mooncake Transfer Engine Python API,
https://github.com/kvcache-ai/Mooncake/blob/main/doc/en/transfer-engine-python.md):
``initialize(local_hostname, "P2PHANDSHAKE", "tcp", "")`` with peer-to-peer metadata (no
metadata server; the engine picks its RPC port, ``get_rpc_port``); ``register_memory(addr,
len)``; ``batch_transfer_async_write`` / ``_read(target "host:port", local addrs, peer addrs,
lengths)`` and ``batch_transfer_sync_write`` / ``_read`` (same arguments) returning 0 when every
segment is done and -1 otherwise, each wait bounded by ``MC_TRANSFER_TIMEOUT`` seconds (read at
start). Measured here (0.3.13.post1, TCP): after an asynchronous batch,
``transfer_check_status(batch)`` answers 1 ("done") while some of its bytes have not landed
(64 MiB in 256 segments: 40-53 MB in place when it said done), and an asynchronous write to an
unreachable peer crashed the process (SIGSEGV); the blocking batch calls do neither, so they
are used. A blocking call to a stalled peer returns only after ``MC_TRANSFER_TIMEOUT`` (30 s by
default), and it releases the GIL (measured: another thread ran throughout), so each batch runs
on a worker thread and ``Endpoint`` keeps the caller's deadline across batches; a batch left
behind at the deadline still runs until Mooncake's own timeout, and ``close`` waits for it
before unregistering the memory it may still touch. ``initialize`` logs one ERROR line ("Local
segment descriptor not found", transfer_metadata.cpp) on every successful start; that line
alone is dropped from what it writes to stderr, every other line is passed on.
Mooncake takes its bind address (``MC_TCP_BIND_ADDRESS``, read by ``initialize``) and its batch
timeout (``MC_TRANSFER_TIMEOUT``, read by the ``TransferEngine()`` constructor; the current
source raises a value under 5 to 5) from the environment only: its Python API has no argument
for either. So each engine sets them (``host``; ``timeout_s`` where given) for its own
constructor and ``initialize`` alone, under ``base.ENV_LOCK``, and restores what was there after
(``base.scoped_environ``): a second engine gets its own values, and no process-wide variable is
left behind. Even so this version's handshake listener binds 0.0.0.0 and its TCP listener all
addresses (traffic goes only where peers are told: ``host``).
The wheel that needs no GPU is ``mooncake-transfer-engine-non-cuda``; it needs Debian's
``libibverbs1``. A batch of 4,096 segments overflowed its default per-peer queue in the
feasibility run of issue 37, so batches here hold at most 256.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from typing import cast

import torch

from kvformats.errors import BackendUnavailableError, HandshakeError, InputError, TransferError
from kvformats.transfer.engines.base import BUSY, DONE, FAILED, Engine, batch_size, scoped_environ

INSTALL = ("pip install mooncake-transfer-engine-non-cuda and apt-get install libibverbs1 "
           "(see docs/transfer.md)")
BENIGN = b"Local segment descriptor not found"  # logged as an error by every successful initialize
DEFAULT_TIMEOUT_S = 30  # Mooncake's MC_TRANSFER_TIMEOUT when the environment sets none
MIN_TIMEOUT_S = 5  # the least MC_TRANSFER_TIMEOUT Mooncake applies (TransferEnginePy's constructor)


def _import():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as err:
        raise BackendUnavailableError(f"the Mooncake engine needs mooncake ({err}): {INSTALL}") from None
    return TransferEngine


def _quiet_call(fn, *args):
    """``fn(*args)`` with file descriptor 2 sent to a temporary file, then every line of it but
    the BENIGN one written back to stderr (Mooncake logs through glog straight to fd 2)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            return fn(*args)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            kept = b"".join(line for line in log.read().splitlines(keepends=True) if BENIGN not in line)
            if kept:
                os.write(2, kept)


class _Batch:
    """One blocking batch call on a worker thread; ``rc`` is its return once the thread ends."""

    def __init__(self, fn, args):
        self.rc: int | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, args), name="kvformats-mooncake", daemon=True)
        self.thread.start()

    def _run(self, fn, args):
        try:
            self.rc = fn(*args)
        except Exception:  # noqa: BLE001 - any failure of the call is a failed batch
            self.rc = -1


class MooncakeEngine(Engine):
    name = "mooncake"
    stall_hint = "the peer stalled or is unreachable (Mooncake gives each batch MC_TRANSFER_TIMEOUT seconds as well)"

    def __init__(self, *, host: str = "127.0.0.1", protocol: str = "tcp", max_batch: int = 256,
                 timeout_s: int | None = None):
        """``timeout_s``: Mooncake's own bound on each batch call, for this engine (None: the
        environment's ``MC_TRANSFER_TIMEOUT``, else Mooncake's 30 s); ``host``: the address this
        engine binds and gives its peers."""
        self.max_batch = batch_size(max_batch)
        if timeout_s is not None and (type(timeout_s) is not int or timeout_s < 1):  # noqa: E721 - a bool is refused too
            raise InputError(f"timeout_s must be a positive int of seconds or None, got {timeout_s!r}")
        settings = {"MC_TCP_BIND_ADDRESS": host}
        if timeout_s is not None:
            settings["MC_TRANSFER_TIMEOUT"] = str(timeout_s)  # bounds each batch's wait
        cls = _import()
        with scoped_environ(settings):  # Mooncake reads both from the environment only (module doc)
            try:  # what the constructor reads, when this engine sets no timeout
                bound = int(os.environ.get("MC_TRANSFER_TIMEOUT", DEFAULT_TIMEOUT_S))
            except ValueError:
                bound = DEFAULT_TIMEOUT_S
            self.engine = cls()
            rc = _quiet_call(self.engine.initialize, host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise TransferError(f"mooncake could not start on {host} over {protocol} (returned {rc})")
        self.host = host
        self.timeout_s = max(MIN_TIMEOUT_S, bound)  # the engine's own bound on a batch
        self.wait_s = self.timeout_s + 5  # how long close() waits for a batch left at a deadline
        self._registered: list = []
        self._left: list[_Batch] = []  # batches abandoned at a deadline, maybe still running

    def register(self, addr: int, nbytes: int, device: torch.device | None = None) -> None:
        rc = self.engine.register_memory(addr, nbytes)
        if rc != 0:
            raise TransferError(f"mooncake could not register {nbytes} bytes at {addr:#x} (returned {rc})")
        self._registered.append(addr)

    def metadata(self) -> bytes:
        return f"{self.host}:{self.engine.get_rpc_port()}".encode()

    def connect(self, peer_metadata: bytes) -> object:
        try:
            target = peer_metadata.decode("utf-8")
        except (AttributeError, UnicodeDecodeError) as err:
            raise HandshakeError(f"the peer's Mooncake metadata is not UTF-8 'host:port' text: {err}") from None
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise HandshakeError(f"the peer's Mooncake metadata must be 'host:port', got {target[:100]!r}")
        return target

    def post(self, op: str, peer: object, segments: torch.Tensor, notify: bytes | None = None) -> object:
        # The blocking batch call (the asynchronous pair was measured unfit here: module doc), on
        # a worker thread so that the caller's deadline, not MC_TRANSFER_TIMEOUT, bounds the wait.
        local, remote, lengths = (c.tolist() for c in segments.cpu().unbind(1))
        run = self.engine.batch_transfer_sync_write if op == "write" else self.engine.batch_transfer_sync_read
        return _Batch(run, (peer, local, remote, lengths))

    def poll(self, handle: object) -> str:
        batch = cast(_Batch, handle)
        if batch.thread.is_alive():
            return BUSY
        return DONE if batch.rc == 0 else FAILED  # the batch call's return: 0 done, -1 failed

    def abandon(self, handle: object) -> None:
        self._left.append(cast(_Batch, handle))

    def close(self) -> None:
        for batch in self._left:  # the engine may still touch registered memory until these end
            batch.thread.join(self.wait_s)
        self._left = []
        for addr in self._registered:
            self.engine.unregister_memory(addr)
        self._registered = []
