"""Mooncake Transfer Engine (TCP) behind the engine interface: ``pip install 'kvformats[mooncake]'``.

Facts relied on (Mooncake Transfer Engine Python API,
https://github.com/kvcache-ai/Mooncake/blob/main/doc/en/transfer-engine-python.md):
``initialize(local_hostname, "P2PHANDSHAKE", "tcp", "")`` with peer-to-peer metadata (no
metadata server; the engine picks its RPC port, ``get_rpc_port``); ``register_memory(addr,
len)``; ``batch_transfer_async_write`` / ``_read(target "host:port", local addrs, peer addrs,
lengths)`` returning a batch id (negative: refused) and ``transfer_check_status(batch)``
answering 1 done, 0 in progress, -1 failed, -2 timed out. ``MC_TCP_BIND_ADDRESS`` keeps the TCP
listener on one address. The wheel that needs no GPU is ``mooncake-transfer-engine-non-cuda``
and it needs Debian's ``libibverbs1``. A batch of 4,096 segments overflows its default per-peer
queue, so batches here hold at most 256.
"""

from __future__ import annotations

import os

import torch

from kvformats.errors import BackendUnavailableError, TransferError
from kvformats.transfer.engines.base import BUSY, DONE, FAILED, Engine

INSTALL = ("pip install mooncake-transfer-engine-non-cuda and apt-get install libibverbs1 "
           "(see docs/transfer.md)")


def _import():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as err:
        raise BackendUnavailableError(f"the Mooncake engine needs mooncake ({err}): {INSTALL}") from None
    return TransferEngine


def available() -> bool:
    try:
        _import()
    except BackendUnavailableError:
        return False
    return True


class MooncakeEngine(Engine):
    name = "mooncake"

    def __init__(self, *, host: str = "127.0.0.1", protocol: str = "tcp", max_batch: int = 256):
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", host)
        self.engine = _import()()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise TransferError(f"mooncake could not start on {host} over {protocol} (returned {rc})")
        self.host, self.max_batch = host, max_batch
        self._registered = []

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
        local, remote, lengths = (c.tolist() for c in segments.cpu().unbind(1))
        submit = self.engine.batch_transfer_async_write if op == "write" else self.engine.batch_transfer_async_read
        batch = submit(peer, local, remote, lengths)
        if batch < 0:
            raise TransferError(f"mooncake refused a {op} of {len(lengths)} segments to {peer} (returned {batch})")
        return batch

    def poll(self, handle: object) -> str:
        status = self.engine.transfer_check_status(handle)
        return BUSY if status == 0 else DONE if status == 1 else FAILED

    def close(self) -> None:
        for addr in self._registered:
            self.engine.unregister_memory(addr)
        self._registered = []
