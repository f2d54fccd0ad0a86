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
are used. ``MC_TCP_BIND_ADDRESS`` is set to ``host``; even so this version's handshake
listener binds 0.0.0.0 and its TCP listener all addresses (traffic goes only where peers are
told: ``host``). The wheel that needs no GPU is ``mooncake-transfer-engine-non-cuda``; it needs
Debian's ``libibverbs1``. A batch of 4,096 segments overflowed its default per-peer queue in the
feasibility run of issue 37, so batches here hold at most 256.
"""

from __future__ import annotations

import os

import torch

from kvformats.errors import BackendUnavailableError, TransferError
from kvformats.transfer.engines.base import DONE, FAILED, Engine

INSTALL = ("pip install mooncake-transfer-engine-non-cuda and apt-get install libibverbs1 "
           "(see docs/transfer.md)")


def _import():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as err:
        raise BackendUnavailableError(f"the Mooncake engine needs mooncake ({err}): {INSTALL}") from None
    return TransferEngine


class MooncakeEngine(Engine):
    name = "mooncake"

    def __init__(self, *, host: str = "127.0.0.1", protocol: str = "tcp", max_batch: int = 256,
                 timeout_s: int = 30):
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", host)
        os.environ.setdefault("MC_TRANSFER_TIMEOUT", str(timeout_s))  # bounds each batch's wait
        self.engine = _import()()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise TransferError(f"mooncake could not start on {host} over {protocol} (returned {rc})")
        self.host, self.max_batch = host, max_batch
        self._registered: list = []

    def register(self, addr: int, nbytes: int, device: torch.device | None = None) -> None:
        rc = self.engine.register_memory(addr, nbytes)
        if rc != 0:
            raise TransferError(f"mooncake could not register {nbytes} bytes at {addr:#x} (returned {rc})")
        self._registered.append(addr)

    def metadata(self) -> bytes:
        return f"{self.host}:{self.engine.get_rpc_port()}".encode()

    def connect(self, peer_metadata: bytes) -> object:
        return peer_metadata.decode()

    def post(self, op: str, peer: object, segments: torch.Tensor) -> object:
        # The blocking batch call: it returns only when every segment is done or failed (bounded
        # by MC_TRANSFER_TIMEOUT). The asynchronous pair was measured unfit here (module doc).
        local, remote, lengths = (c.tolist() for c in segments.cpu().unbind(1))
        run = self.engine.batch_transfer_sync_write if op == "write" else self.engine.batch_transfer_sync_read
        return run(peer, local, remote, lengths)

    def poll(self, handle: object) -> str:
        return DONE if handle == 0 else FAILED  # the batch call's return: 0 done, -1 failed

    def close(self) -> None:
        for addr in self._registered:
            self.engine.unregister_memory(addr)
        self._registered = []
