"""NIXL (UCX backend) behind the engine interface: ``pip install 'kvformats[nixl]'``.

Facts relied on (NIXL Python API, https://github.com/ai-dynamo/nixl/blob/main/docs/api-reference/python-api.md):
``nixl_agent(name, nixl_agent_config(...))``; ``register_memory`` of (addr, len, dev, "") tuples
with memory type "DRAM" (or "VRAM" for CUDA memory); ``get_agent_metadata`` / ``add_remote_agent``
to connect; ``get_xfer_descs`` of an Nx3 numpy array (addr, len, dev); ``initialize_xfer("WRITE"
| "READ", local, remote, peer)``, ``transfer`` and ``check_xfer_state`` answering "DONE",
"PROC" or "ERR". UCX settings (https://openucx.readthedocs.io/en/master/faq.html):
``UCX_MODULES=^ib*`` (no InfiniBand modules: processes otherwise crash at exit on machines
without them), ``UCX_NET_DEVICES=lo`` keeps listeners on loopback in tests. A side that a
peer writes to or reads from completes the peer's transfer only while its agent progresses:
the progress thread does that, so it is on by default (the documented call pattern, where the
receiver waits in its own control channel, then works as written); with
``progress_thread=False`` (measured 3-5x faster on a 2-core machine, where the thread competes
for a core) the side must wait through ``Endpoint.wait`` or call ``progress`` itself.
"""

from __future__ import annotations

import os
import uuid

import torch

from kvformats.errors import BackendUnavailableError, HandshakeError, InputTypeError, TransferError
from kvformats.transfer.engines.base import BUSY, DONE, FAILED, Engine, batch_size

INSTALL = "pip install 'kvformats[nixl]' (nixl-cu12 and numpy; see docs/transfer.md)"


def _import():
    os.environ.setdefault("UCX_MODULES", "^ib*")
    try:
        import numpy
        try:
            from nixl._api import nixl_agent, nixl_agent_config
        except ImportError:
            # the wheel itself, without the "nixl" front package (which requires the wheels of
            # both CUDA majors): the same module under its own name
            from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError as err:
        raise BackendUnavailableError(f"the NIXL engine needs nixl ({err}): {INSTALL}") from None
    return numpy, nixl_agent, nixl_agent_config


class NixlEngine(Engine):
    name = "nixl"
    stall_hint = ("the peer's NIXL agent made no progress: a side that is written to or read from needs its "
                  "progress thread (NixlEngine(progress_thread=True), the default) or must wait through "
                  "Endpoint.wait (or call engine.progress()) while the transfer runs; else the peer stalled or "
                  "is unreachable")

    def __init__(self, *, agent_name: str | None = None, loopback: bool = False, max_batch: int = 1024,
                 progress_thread: bool = True):
        self.max_batch = batch_size(max_batch)
        if not isinstance(progress_thread, bool):
            raise InputTypeError(f"progress_thread must be a bool, got {progress_thread!r}")
        if loopback:
            os.environ.setdefault("UCX_NET_DEVICES", "lo")
        self._np, agent, config = _import()
        self.agent_name = agent_name or f"kvformats-{uuid.uuid4().hex[:12]}"
        self.agent = agent(self.agent_name, config(enable_prog_thread=progress_thread, enable_listen_thread=False,
                                                   backends=["UCX"]))
        self._registered: list = []

    def _mem(self, device: torch.device | None = None) -> str:
        return "VRAM" if device is not None and device.type == "cuda" else "DRAM"

    def register(self, addr: int, nbytes: int, device: torch.device | None = None) -> None:
        dev = device.index or 0 if device is not None and device.type == "cuda" else 0
        try:
            self._registered.append(self.agent.register_memory([(addr, nbytes, dev, "")], self._mem(device)))
        except Exception as err:  # nixl raises its own exception classes
            raise TransferError(f"nixl could not register {nbytes} bytes at {addr:#x}: {err}") from None
        self._dev = (self._mem(device), dev)

    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def connect(self, peer_metadata: bytes) -> object:
        if not isinstance(peer_metadata, bytes) or not peer_metadata:
            raise HandshakeError(f"the peer's NIXL metadata must be non-empty bytes, "
                                 f"got {type(peer_metadata).__name__}")
        try:
            return self.agent.add_remote_agent(peer_metadata)
        except Exception as err:
            raise TransferError(f"nixl could not add the peer agent: {err}") from None

    def post(self, op: str, peer: object, segments: torch.Tensor) -> object:
        mem, dev = getattr(self, "_dev", ("DRAM", 0))
        rows = segments.cpu().numpy()
        local = self._np.stack([rows[:, 0], rows[:, 2], self._np.full(len(rows), dev)], 1)
        remote = self._np.stack([rows[:, 1], rows[:, 2], self._np.full(len(rows), dev)], 1)
        try:
            handle = self.agent.initialize_xfer(op.upper(), self.agent.get_xfer_descs(local, mem),
                                                self.agent.get_xfer_descs(remote, mem), peer)
            state = self.agent.transfer(handle)
        except Exception as err:
            raise TransferError(f"nixl refused a {op} of {len(rows)} segments: {err}") from None
        if state == "ERR":
            self.agent.release_xfer_handle(handle)
            raise TransferError(f"nixl reported ERR posting a {op} of {len(rows)} segments")
        return handle

    def poll(self, handle: object) -> str:
        state = self.agent.check_xfer_state(handle)
        if state == "PROC":
            return BUSY
        self.agent.release_xfer_handle(handle)
        return DONE if state == "DONE" else FAILED

    def abandon(self, handle: object) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception:  # best effort: the handle may still be in flight
            pass

    def progress(self) -> None:
        self.agent.get_new_notifs()  # drives the UCX worker (no progress thread)

    def close(self) -> None:
        for reg in self._registered:
            self.agent.deregister_memory(reg)
        self._registered = []
