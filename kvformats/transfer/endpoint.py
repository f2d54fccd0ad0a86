"""One side of a transfer: its caches registered with an engine, its hello, push and pull.

The call pattern (both sides hold an ``Endpoint``; the hellos and the "done" message go over
whatever control channel the serving engine already has):

    here = Endpoint(engine, caches)                 # registers each cache storage once
    peer = here.connect(hello_from_peer)            # handshake, then the engine connects
    plan = plan_transfer(here.descs, peer.descs, src_pages, dst_pages)
    here.push(peer, plan, timeout=30)               # or, on the destination, here.pull(...)
    sums = expected_checksums(plan, caches)         # sender -> receiver with "done"
    verify(plan, caches_at_receiver, sums)          # receiver, before it marks pages valid

Every batch has a deadline; a refused, failed or late batch raises TransferError and the plan's
destination pages must be treated as not valid (the receiver never saw a "done").
"""

from __future__ import annotations

import base64
import json
import time
from typing import Mapping

import attrs
import torch

from kvformats.errors import HandshakeError, InputError, TransferError
from kvformats.layout import Layout
from kvformats.transfer.describe import CacheDesc, describe_caches, from_json, handshake, to_json
from kvformats.transfer.engines.base import BUSY, DONE, Engine
from kvformats.transfer.plan import TransferPlan

POLL_S = 0.0005  # sleep between polls of a busy batch


@attrs.frozen(eq=False)
class Peer:
    """What a side knows of its peer after ``connect``."""

    descs: dict[str, CacheDesc]
    bases: dict[str, int]  # cache name -> address of its storage at the peer
    handle: object  # the engine's handle of the peer


class Endpoint:
    """``caches``: name -> (layout, cache tensor), all on one device."""

    def __init__(self, engine: Engine, caches: Mapping[str, tuple[Layout, torch.Tensor]]):
        self.engine = engine
        self.caches = dict(caches)
        self.descs = describe_caches(self.caches)
        self.bases = {n: c.untyped_storage().data_ptr() for n, (_, c) in self.caches.items()}
        for name, d in self.descs.items():
            if d.arena == name:  # one registration per storage
                engine.register(self.bases[name], d.storage_bytes, self.caches[name][1].device)

    def hello(self) -> bytes:
        """What the peer's ``connect`` needs: descriptions (each with its record identity),
        storage addresses, engine metadata."""
        return json.dumps({"engine": self.engine.name, "caches": to_json(self.descs), "bases": self.bases,
                           "metadata": base64.b64encode(self.engine.metadata()).decode()}).encode()

    def connect(self, hello: bytes) -> Peer:
        """Handshake against the peer's hello (HandshakeError on any difference, a cache of
        another record ABI of the same bytes per token among them: the message names both record
        identities), then connect."""
        try:
            msg = json.loads(hello)
            engine, caches, bases, meta = msg["engine"], msg["caches"], msg["bases"], msg["metadata"]
        except (TypeError, ValueError, KeyError) as err:
            raise HandshakeError(f"the peer's hello is not a kvformats hello: {err!r}") from None
        if engine != self.engine.name:
            raise HandshakeError(f"the peer uses engine {engine!r}, this side {self.engine.name!r}")
        descs = from_json(caches)
        handshake(self.descs, descs)
        if not isinstance(bases, dict) or set(bases) != set(descs) or not all(type(v) is int for v in bases.values()):
            raise HandshakeError("the peer's hello has no storage address for each cache")
        return Peer(descs=descs, bases=bases, handle=self.engine.connect(base64.b64decode(meta)))

    def _rows(self, plan: TransferPlan, peer: Peer, local_side: str) -> torch.Tensor:
        """int64 ``[N, 3]`` (local address, remote address, length) of every segment of the plan."""
        local_descs, remote_descs = (plan.src, plan.dst) if local_side == "src" else (plan.dst, plan.src)
        if local_descs != self.descs or remote_descs != peer.descs:
            raise InputError(f"the plan was made for other caches: make it from this endpoint's and the peer's "
                             f"descriptions ({'source' if local_side == 'src' else 'destination'} here)")
        parts = []
        for p in plan.caches.values():
            first = p.caches[0]
            mine, theirs = (p.src, p.dst) if local_side == "src" else (p.dst, p.src)
            parts.append(torch.stack([mine[:, 0] + self.bases[first], theirs[:, 0] + peer.bases[first], mine[:, 1]], 1))
        return torch.cat(parts) if parts else torch.zeros(0, 3, dtype=torch.int64)

    def push(self, peer: Peer, plan: TransferPlan, *, timeout: float = 30.0) -> None:
        """Write the plan's source pages (here) to its destination pages (at the peer)."""
        self._run("write", self._rows(plan, peer, "src"), peer, timeout)

    def pull(self, peer: Peer, plan: TransferPlan, *, timeout: float = 30.0) -> None:
        """Read the plan's source pages (at the peer) into its destination pages (here)."""
        self._run("read", self._rows(plan, peer, "dst"), peer, timeout)

    def _run(self, op: str, rows: torch.Tensor, peer: Peer, timeout: float) -> None:
        if not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
            raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
        deadline = time.monotonic() + timeout
        size = self.engine.max_batch
        batches = (rows.shape[0] + size - 1) // size
        for i in range(batches):
            chunk = rows[i * size:(i + 1) * size]
            handle = self.engine.post(op, peer.handle, chunk)
            while (state := self.engine.poll(handle)) == BUSY:
                if time.monotonic() > deadline:
                    self.engine.abandon(handle)
                    raise TransferError(f"{self.engine.name} {op} timed out after {timeout} s in batch {i + 1} of "
                                        f"{batches}; the destination pages are not valid")
                time.sleep(POLL_S)
            if state != DONE:
                raise TransferError(f"{self.engine.name} {op} failed in batch {i + 1} of {batches} "
                                    f"({chunk.shape[0]} segments, {int(chunk[:, 2].sum())} bytes); the destination "
                                    f"pages are not valid")

    def close(self) -> None:
        self.engine.close()
