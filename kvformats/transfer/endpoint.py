"""One side of a transfer: its caches registered with an engine, its hello, push and pull.

The call pattern (both sides hold an ``Endpoint``; the hellos and the "done" message go over
whatever control channel the serving engine already has; examples/transfer_two_process.py is
it, complete):

    here = Endpoint(engine, caches)                 # registers each arena once
    peer = here.connect(hello_from_peer)            # handshake, then the engine connects
    plan = plan_transfer(here.descs, peer.descs, src_pages, dst_pages)
    here.push(peer, plan, timeout=30)               # or, on the destination, here.pull(...)
    sums = expected_checksums(plan, caches)         # sender -> receiver with "done"
    verify(plan, caches_at_receiver, sums)          # receiver, before it marks pages valid

A side that the peer writes to or reads from must let its engine progress while it waits: NIXL
does so on its own thread by default; with ``progress_thread=False`` wait with ``Endpoint.wait``.
The deadline covers the whole push or pull, every batch; a refused, failed or late batch raises
TransferError and the plan's destination pages must be treated as not valid (the receiver never
saw a "done").

Layer by layer: ``push_layer``/``pull_layer`` move one layer's caches of a request's plan
(``kvformats.transfer.layers``) as soon as prefill has written that layer; ``push(...,
notify=message)`` has an engine that ``notifies`` (NIXL) deliver ``message`` to the peer once
every byte of the push has landed, and ``notifications`` reads what peers sent this side.
``kvformats.transfer.layerwise`` is the protocol on top: checksums and a completion per layer,
verified on arrival.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from typing import Callable, Mapping

import attrs
import torch

from kvformats.errors import HandshakeError, InputError, InputTypeError, TransferError, describe
from kvformats.layout import Layout
from kvformats.transfer.bounds import loads, short
from kvformats.transfer.describe import CacheDesc, describe_caches, from_json, handshake, to_json
from kvformats.transfer.engines.base import BUSY, DONE, Engine, batch_size
from kvformats.transfer.layers import layer_plan
from kvformats.transfer.plan import TransferPlan

POLL_S = 0.0005  # sleep between polls of a busy batch
ADDRESS_LIMIT = 1 << 63  # an arena's last byte must have an int64 address (segment rows are int64)


def seconds(value, what: str = "timeout") -> float:
    """A positive, finite number of seconds; InputTypeError for a bool or a non-number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputTypeError(f"{what} must be a number of seconds, got {describe(value)}")
    if not 0 < value < math.inf:
        raise InputError(f"{what} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


@attrs.frozen(eq=False)
class Peer:
    """What a side knows of its peer after ``connect``."""

    descs: dict[str, CacheDesc]
    bases: dict[str, int]  # cache name -> address of its arena at the peer
    handle: object  # the engine's handle of the peer


class Endpoint:
    """``caches``: name -> (layout, cache tensor), all on one device."""

    def __init__(self, engine: Engine, caches: Mapping[str, tuple[Layout, torch.Tensor]]):
        self.engine = engine
        self.caches = dict(caches)
        self.descs = describe_caches(self.caches)
        # every cache's arena address: its page 0's address less its offset in the arena
        self.bases = {n: layout.byte_pages(c)[0].data_ptr() - self.descs[n].offset
                      for n, (layout, c) in self.caches.items()}
        for name, d in self.descs.items():
            if d.arena == name:  # one registration per arena
                engine.register(self.bases[name], d.storage_bytes, self.caches[name][1].device)

    def hello(self) -> bytes:
        """What the peer's ``connect`` needs: descriptions (each with its record identity),
        arena addresses, engine metadata."""
        return json.dumps({"engine": self.engine.name, "caches": to_json(self.descs), "bases": self.bases,
                           "metadata": base64.b64encode(self.engine.metadata()).decode()}).encode()

    def connect(self, hello: bytes, *, geometry: bool = False) -> Peer:
        """Handshake against the peer's hello (HandshakeError on any difference, a cache of
        another record ABI of the same bytes per token among them: the message names both record
        identities; and on anything malformed: every field is checked before use), then connect.
        ``geometry=True``: the peer's pages may have another geometry (rows per page, width,
        stride, arena) for the same record identity (``describe.handshake``): plans then map
        token rows between them."""
        msg = loads(hello, "the peer's hello")
        if not isinstance(msg, dict) or set(msg) != {"engine", "caches", "bases", "metadata"}:
            raise HandshakeError(f"the peer's hello is not a kvformats hello: {short(msg)}")
        engine, caches, bases, meta = msg["engine"], msg["caches"], msg["bases"], msg["metadata"]
        if engine != self.engine.name:
            raise HandshakeError(f"the peer uses engine {short(engine)}, this side {self.engine.name!r}")
        descs = from_json(caches)
        handshake(self.descs, descs, geometry=geometry)
        if not isinstance(bases, dict) or set(bases) != set(descs):
            raise HandshakeError("the peer's hello has no arena address for each cache")
        for name, base in bases.items():
            top = base + descs[name].storage_bytes if type(base) is int else 0  # noqa: E721 - not a bool
            if type(base) is not int or base <= 0 or top >= ADDRESS_LIMIT:  # noqa: E721
                raise HandshakeError(f"the peer's hello gives cache {name!r} the arena address {short(base)}: not a "
                                     f"positive int whose arena of {descs[name].storage_bytes} bytes ends below "
                                     f"2**63")
        if not isinstance(meta, str):
            raise HandshakeError(f"the peer's engine metadata must be base64 text, got {short(meta)}")
        try:
            raw = base64.b64decode(meta, validate=True)
        except (binascii.Error, ValueError) as err:
            raise HandshakeError(f"the peer's engine metadata is not base64: {err}") from None
        return Peer(descs=descs, bases=bases, handle=self.engine.connect(raw))

    def _rows(self, plan: TransferPlan, peer: Peer, local_side: str) -> torch.Tensor:
        """int64 ``[N, 3]`` (local address, remote address, length) of every segment of the plan."""
        if not isinstance(plan, TransferPlan):
            raise InputTypeError(f"plan must be a TransferPlan (plan_transfer), got {describe(plan)}")
        local_descs, remote_descs = (plan.src, plan.dst) if local_side == "src" else (plan.dst, plan.src)
        if local_descs != self.descs or remote_descs != peer.descs:  # a layer's part keeps them whole
            raise InputError(f"the plan was made for other caches: make it from this endpoint's and the peer's "
                             f"descriptions ({'source' if local_side == 'src' else 'destination'} here)")
        parts = []
        for p in plan.caches.values():
            first = p.caches[0]
            mine, theirs = (p.src, p.dst) if local_side == "src" else (p.dst, p.src)
            parts.append(torch.stack([mine[:, 0] + self.bases[first], theirs[:, 0] + peer.bases[first], mine[:, 1]], 1))
        return torch.cat(parts) if parts else torch.zeros(0, 3, dtype=torch.int64)

    def push(self, peer: Peer, plan: TransferPlan, *, timeout: float = 30.0, notify: bytes | None = None) -> None:
        """Write the plan's source pages (here) to its destination pages (at the peer); every
        batch within ``timeout`` seconds of the call. ``notify``: a message the engine delivers
        to the peer's ``notifications`` after the last byte (its last batch carries it, posted
        once every earlier batch is done); only for an engine that ``notifies`` (NIXL), an
        InputError otherwise (Mooncake: send it on the control channel after the push)."""
        self._check_notify(notify)
        self._run("write", self._rows(plan, peer, "src"), peer, timeout, notify)

    def pull(self, peer: Peer, plan: TransferPlan, *, timeout: float = 30.0) -> None:
        """Read the plan's source pages (at the peer) into its destination pages (here); every
        batch within ``timeout`` seconds of the call."""
        self._run("read", self._rows(plan, peer, "dst"), peer, timeout)

    def push_layer(self, peer: Peer, plan: TransferPlan, layer: int, *, layers: Mapping | None = None,
                   timeout: float = 30.0, notify: bytes | None = None) -> None:
        """``push`` of layer ``layer``'s caches of ``plan`` only (``layers.layer_plan``: by the
        ``L<k>.`` names, or ``layers``, a mapping layer -> cache names)."""
        self.push(peer, layer_plan(plan, layer, layers), timeout=timeout, notify=notify)

    def pull_layer(self, peer: Peer, plan: TransferPlan, layer: int, *, layers: Mapping | None = None,
                   timeout: float = 30.0) -> None:
        """``pull`` of layer ``layer``'s caches of ``plan`` only; its return is the layer's
        completion here (the engine's batch status)."""
        self.pull(peer, layer_plan(plan, layer, layers), timeout=timeout)

    def notifications(self) -> list[bytes]:
        """The messages peers' pushes delivered here since the last call (``push(notify=)``);
        always empty for an engine that does not notify."""
        return self.engine.notifications()

    def _check_notify(self, notify) -> None:
        if notify is None:
            return
        if not isinstance(notify, bytes) or not notify:
            raise InputTypeError(f"notify must be non-empty bytes or None, got {describe(notify)}")
        if not self.engine.notifies:
            raise InputError(f"the {self.engine.name} engine delivers no notification to the peer: send the "
                             f"completion on the control channel after the push")

    def wait(self, ready: Callable[[], bool], *, timeout: float = 30.0, what: str = "the peer's message") -> None:
        """Return once ``ready()`` is true (e.g. ``conn.poll`` of a pipe or socket wrapper),
        letting the engine progress meanwhile: a peer's write into this side's caches, or its read
        from them, may need this side's engine to progress (NIXL without its progress thread).
        TransferError after ``timeout`` seconds."""
        deadline = time.monotonic() + seconds(timeout)
        while not ready():
            self.engine.progress()
            if time.monotonic() > deadline:
                raise TransferError(f"no {what} within {timeout} s")
            time.sleep(POLL_S)

    def _run(self, op: str, rows: torch.Tensor, peer: Peer, timeout: float, notify: bytes | None = None) -> None:
        timeout = seconds(timeout)
        size = batch_size(self.engine.max_batch)  # an attribute: it may have been set after construction
        deadline = time.monotonic() + timeout
        batches = (rows.shape[0] + size - 1) // size
        if notify is not None and not batches:  # nothing to move: the completion alone
            self.engine.notify(peer.handle, notify)
        for i in range(batches):
            chunk = rows[i * size:(i + 1) * size]
            if time.monotonic() > deadline:  # the deadline is the whole call's, not each batch's
                raise TransferError(self._late(op, timeout, i, batches))
            if notify is not None and i == batches - 1:  # every earlier batch is done: the note follows all bytes
                handle = self.engine.post(op, peer.handle, chunk, notify)
            else:
                handle = self.engine.post(op, peer.handle, chunk)
            while (state := self.engine.poll(handle)) == BUSY:
                if time.monotonic() > deadline:
                    self.engine.abandon(handle)
                    raise TransferError(self._late(op, timeout, i, batches))
                time.sleep(POLL_S)
            if state != DONE:
                raise TransferError(f"{self.engine.name} {op} failed in batch {i + 1} of {batches} "
                                    f"({chunk.shape[0]} segments, {int(chunk[:, 2].sum())} bytes); the destination "
                                    f"pages are not valid")

    def _late(self, op: str, timeout: float, i: int, batches: int) -> str:
        return (f"{self.engine.name} {op} timed out after {timeout} s in batch {i + 1} of {batches}; the destination "
                f"pages are not valid. Likely cause: {self.engine.stall_hint}")

    def close(self) -> None:
        self.engine.close()
