"""The small interface every transfer engine implements; kvformats moves no byte itself.

An engine registers memory, gives the metadata a peer needs to reach it, connects to a peer
and posts batches of (local address, remote address, length) segments as one write (push) or
read (pull), then reports each batch as busy, done or failed. Batching to the engine's limit,
deadlines and error reporting live in ``kvformats.transfer.endpoint``, once for all engines.

An engine that ``notifies`` (NIXL) also delivers a short message to the peer once a batch's
bytes have landed there: the completion of a layer in a layer-by-layer transfer reaches the
receiver through it. One that does not (Mooncake: a batch's status is known to the side that
posted it only) leaves that message to the caller's control channel.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

import torch

from kvformats.errors import InputError

BUSY, DONE, FAILED = "busy", "done", "failed"

# Held while an engine's start reads settings that its library takes only from the environment
# (scoped_environ), so that two engines starting on two threads never see each other's values.
ENV_LOCK = threading.RLock()


@contextlib.contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block only, under ENV_LOCK, and restore what was
    there after (a variable that was unset is unset again). For engine settings that the engine's
    C library reads only from the environment, while it starts: kvformats writes no process-wide
    variable that outlives the call. Other threads that read the environment meanwhile (not under
    the lock) do see these values for that long."""
    with ENV_LOCK:
        saved = {name: os.environ.get(name) for name in values}
        try:
            os.environ.update(values)
            yield
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old


def batch_size(value) -> int:
    """A positive int of segments per batch (0 would divide by zero, a negative one post
    nothing and report success); InputError otherwise."""
    if type(value) is not int or value < 1:  # noqa: E721 - a bool is refused too
        raise InputError(f"max_batch must be a positive int (segments per batch), got {value!r}")
    return value


class Engine:
    """Base of the engine adapters (nixl.py, mooncake.py)."""

    name = ""
    max_batch = 1024  # segments per posted batch (the engine's queue limit, or a bounded list)
    # what a batch that outlives its deadline most likely means (the timeout message's last words)
    stall_hint = "the peer stalled or is unreachable"

    def register(self, addr: int, nbytes: int, device: torch.device | None = None) -> None:
        """Make ``nbytes`` at ``addr`` (a cache's storage, on ``device``) reachable by peers."""
        raise NotImplementedError

    def metadata(self) -> bytes:
        """What a peer passes to ``connect`` to reach this engine."""
        raise NotImplementedError

    def connect(self, peer_metadata: bytes) -> object:
        """A handle of the peer, for ``post``."""
        raise NotImplementedError

    notifies = False  # whether post(..., notify=) and notify() reach the peer (module doc)

    def post(self, op: str, peer: object, segments: torch.Tensor, notify: bytes | None = None) -> object:
        """Start ``op`` ("write": local -> peer, "read": peer -> local) of int64 ``[N, 3]`` rows
        (local address, remote address, length); returns a handle for ``poll``. Raises
        TransferError when the engine refuses the batch. ``notify`` (engines that ``notifies``
        only; never passed otherwise): delivered to the peer's ``notifications`` after the
        batch's bytes landed."""
        raise NotImplementedError

    def notify(self, peer: object, message: bytes) -> None:
        """Send ``message`` to the peer's ``notifications`` at once (engines that ``notifies``)."""
        raise NotImplementedError

    def notifications(self) -> list[bytes]:
        """The messages peers' ``notify`` sent this side since the last call (none by default)."""
        return []

    def poll(self, handle: object) -> str:
        """BUSY, DONE or FAILED for a posted batch (a finished handle is released)."""
        raise NotImplementedError

    def abandon(self, handle: object) -> None:
        """Release a batch that timed out (best effort)."""

    def progress(self) -> None:
        """Let the engine make progress for transfers others post to this side (if it needs to)."""

    def close(self) -> None:
        """Deregister memory and stop the engine."""
