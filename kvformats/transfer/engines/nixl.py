"""NIXL (UCX backend) behind the engine interface: ``pip install 'kvformats[nixl]'``.

Facts relied on (NIXL Python API, https://github.com/ai-dynamo/nixl/blob/main/docs/api-reference/python-api.md):
``nixl_agent(name, nixl_agent_config(...))``; ``register_memory`` of (addr, len, dev, "") tuples
with memory type "DRAM" (or "VRAM" for CUDA memory); ``get_agent_metadata`` / ``add_remote_agent``
to connect; ``get_xfer_descs`` of an Nx3 numpy array (addr, len, dev); ``initialize_xfer("WRITE"
| "READ", local, remote, peer)``, ``transfer`` and ``check_xfer_state`` answering "DONE",
"PROC" or "ERR"; ``create_backend("UCX", {"ucx_devices": "lo"})`` (the UCX plugin's device list,
as ``get_plugin_params("UCX")`` names it) keeps UCX on the loopback device (``loopback=True``).
UCX settings (https://openucx.readthedocs.io/en/master/faq.html): ``UCX_MODULES=^ib*`` loads no
InfiniBand module; measured here (nixl-cu12 1.5.1, no InfiniBand), a process that loaded them
crashes at exit (SIGSEGV). UCX reads ``UCX_MODULES`` from the environment only, once per process,
when its library loads (the first UCX backend): the adapter sets it for that call alone
(``ucx_modules=``; ``"^ib*"`` by default with ``loopback=True``, where no InfiniBand device is
ever used) and writes no process-wide variable, so InfiniBand stays on wherever it is wanted.
A side that a peer writes to or reads from completes the peer's transfer only while its agent
progresses: the progress thread does that, so it is on by default (the documented call pattern,
where the receiver waits in its own control channel, then works as written); with
``progress_thread=False`` (measured 3-5x faster on a 2-core machine, where the thread competes
for a core) the side must wait through ``Endpoint.wait`` or call ``progress`` itself.
Notifications (``initialize_xfer``'s ``notif_msg``, ``send_notif``, ``get_new_notifs``): the
message attached to a transfer reaches the peer after that transfer's bytes; the adapter keeps
what ``progress`` fetches until ``notifications`` is called, so that none is lost.
"""

from __future__ import annotations

import os
import uuid

import torch

from kvformats.errors import BackendUnavailableError, HandshakeError, InputError, InputTypeError, TransferError
from kvformats.transfer.engines.base import BUSY, DONE, FAILED, ENV_LOCK, Engine, batch_size, scoped_environ

INSTALL = "pip install 'kvformats[nixl]' (nixl-cu12 and numpy; see docs/transfer.md)"
LOOPBACK_MODULES = "^ib*"  # ucx_modules with loopback=True: no InfiniBand module (module doc)
# The UCX_MODULES this process's UCX library was loaded with (None: UCX's default, every module),
# once an engine here has started one: UCX reads the variable then and never again.
_LOADED: list[str | None] = []


def _import():
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
    notifies = True
    stall_hint = ("the peer's NIXL agent made no progress: a side that is written to or read from needs its "
                  "progress thread (NixlEngine(progress_thread=True), the default) or must wait through "
                  "Endpoint.wait (or call engine.progress()) while the transfer runs; else the peer stalled or "
                  "is unreachable")

    def __init__(self, *, agent_name: str | None = None, loopback: bool = False, max_batch: int = 1024,
                 progress_thread: bool = True, ucx_modules: str | None = None):
        """``loopback``: UCX on the loopback device only (tests, one host). ``ucx_modules``: the
        UCX_MODULES (UCX's syntax, e.g. ``"^ib*"``) to load UCX with, set for this engine's start
        alone; it applies only to the process's first NIXL engine (UCX reads it once), a
        different one later is an InputError. None: the environment's UCX_MODULES where set, else
        ``"^ib*"`` with ``loopback=True`` and UCX's default (every module) without."""
        self.max_batch = batch_size(max_batch)
        if not isinstance(progress_thread, bool):
            raise InputTypeError(f"progress_thread must be a bool, got {progress_thread!r}")
        if ucx_modules is not None and (not isinstance(ucx_modules, str) or not ucx_modules):
            raise InputTypeError(f"ucx_modules must be a non-empty str (UCX_MODULES syntax) or None, "
                                 f"got {ucx_modules!r}")
        self._np, agent, config = _import()
        self.agent_name = agent_name or f"kvformats-{uuid.uuid4().hex[:12]}"
        with ENV_LOCK:  # no other engine of this process starts UCX meanwhile
            modules = self._ucx_modules(ucx_modules, loopback)
            self.agent = agent(self.agent_name, config(enable_prog_thread=progress_thread, enable_listen_thread=False,
                                                       backends=[]))
            # UCX through create_backend, not the config's backend list, so that it gets its device list
            params = {"ucx_devices": "lo"} if loopback else {}
            if _LOADED:  # UCX is loaded: UCX_MODULES would not be read again
                self._create_backend(params)
            else:
                try:
                    with scoped_environ({"UCX_MODULES": modules} if modules is not None else {}):
                        self._create_backend(params)
                finally:  # a failed start may have loaded UCX all the same
                    _LOADED.append(modules if modules is not None else os.environ.get("UCX_MODULES"))
        self._registered: list = []
        self._notes: list[bytes] = []  # notifications fetched by progress, until notifications()

    @staticmethod
    def _ucx_modules(ucx_modules: str | None, loopback: bool) -> str | None:
        """The UCX_MODULES to start UCX with (None: leave the environment's, or UCX's default);
        InputError for an explicit one that cannot apply because UCX is already loaded."""
        if _LOADED:
            if ucx_modules is not None and ucx_modules != _LOADED[0]:
                loaded = repr(_LOADED[0]) if _LOADED[0] is not None else "its default (every module)"
                raise InputError(f"ucx_modules={ucx_modules!r} cannot apply: UCX reads UCX_MODULES once per process, "
                                 f"when its library loads, and it was loaded here with {loaded}; pass ucx_modules "
                                 f"to the first NIXL engine of the process")
            return None
        if ucx_modules is None and loopback and "UCX_MODULES" not in os.environ:  # the user's own setting stands
            return LOOPBACK_MODULES
        return ucx_modules

    def _create_backend(self, params: dict) -> None:
        try:
            self.agent.create_backend("UCX", params)
        except Exception as err:  # nixl raises its own exception classes
            where = params or "default devices"
            raise TransferError(f"nixl could not start its UCX backend ({where}): {err}") from None

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

    def post(self, op: str, peer: object, segments: torch.Tensor, notify: bytes | None = None) -> object:
        mem, dev = getattr(self, "_dev", ("DRAM", 0))
        rows = segments.cpu().numpy()
        local = self._np.stack([rows[:, 0], rows[:, 2], self._np.full(len(rows), dev)], 1)
        remote = self._np.stack([rows[:, 1], rows[:, 2], self._np.full(len(rows), dev)], 1)
        try:
            handle = self.agent.initialize_xfer(op.upper(), self.agent.get_xfer_descs(local, mem),
                                                self.agent.get_xfer_descs(remote, mem), peer, notify or b"")
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

    def notify(self, peer: object, message: bytes) -> None:
        try:
            self.agent.send_notif(peer, message)
        except Exception as err:  # nixl raises its own exception classes
            raise TransferError(f"nixl could not send a notification to the peer: {err}") from None

    def notifications(self) -> list[bytes]:
        self.progress()
        out, self._notes = self._notes, []
        return out

    def progress(self) -> None:
        # drives the UCX worker (no progress thread) and keeps what arrived for notifications()
        for messages in self.agent.get_new_notifs().values():
            self._notes.extend(messages)

    def close(self) -> None:
        for reg in self._registered:
            self.agent.deregister_memory(reg)
        self._registered = []
