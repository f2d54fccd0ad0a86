"""Layer by layer: a request's caches move one layer at a time, each as soon as prefill has
written it, and the decode side verifies each layer as it lands.

Per layer ``k`` the receiver needs two things: the sender's checksums of layer ``k``'s source
rows (a ``LayerMessage`` on the caller's control channel) and the layer's completion (every
byte landed). The completion comes through the engine where it can carry one: with NIXL the
push's last batch carries ``layer_note(request, k)`` to the receiver's
``Endpoint.notifications``; with Mooncake, whose batch status only the posting side sees, the
sender sends the ``LayerMessage`` after its push returned, marked ``landed``; in a pull the
receiver's own batch status is the completion (``LayerReceiver.landed``). The two may arrive
in either order; the layer is verified when both are there.

The receiver marks the request valid only when every layer verified (``LayerReceiver.valid``).
Anything else fails the whole request, every page of it invalid, never some layers valid and
some not: a layer whose rows differ (an IntegrityError naming the layer, then the cache, the
token rows and the region), a layer delivered twice (its pages may have been written again after
they were verified), a layer the plan does not have, a sender's report that a push failed
(``LayerFailed``), or a wait that times out. ``LayerReceiver.failed`` says why; the caller
frees or rewrites ``invalid_pages()``.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Mapping

import attrs
import torch

from kvformats.errors import InputError, InputTypeError, IntegrityError, TransferError, describe
from kvformats.layout import Layout
from kvformats.transfer.endpoint import seconds
from kvformats.transfer.layers import layer_plans
from kvformats.transfer.plan import TransferPlan
from kvformats.transfer.verify import expected_checksums, verify

NOTE = b"kvformats.layer "  # the prefix of a layer's completion note
POLL_S = 0.0005  # the first sleep of an idle wait; it doubles while nothing arrives, up to MAX_POLL_S
MAX_POLL_S = 0.005  # a waiting side must not take a core from the prefill it waits for


def layer_note(request: str, layer: int) -> bytes:
    """The engine notification that layer ``layer`` of ``request`` has landed."""
    return NOTE + json.dumps({"request": request, "layer": layer}).encode()


def read_note(note: bytes) -> tuple[str, int] | None:
    """(request, layer) of a ``layer_note``; None for any other message (an engine's
    notifications may carry others)."""
    if not isinstance(note, bytes) or not note.startswith(NOTE):
        return None
    try:
        msg = json.loads(note[len(NOTE):])
    except ValueError:
        return None
    if not isinstance(msg, dict) or not isinstance(msg.get("request"), str) or type(msg.get("layer")) is not int:
        return None
    return msg["request"], msg["layer"]


@attrs.frozen(eq=False)
class LayerMessage:
    """Sender -> receiver on the control channel: layer ``layer`` of ``request`` is written,
    with its checksums (cache name -> the sender's ``expected_checksums``); ``landed``: its
    bytes have landed too (a push by an engine without notifications)."""

    request: str
    layer: int
    sums: dict
    landed: bool = False


@attrs.frozen
class LayerFailed:
    """Sender -> receiver: the push of layer ``layer`` of ``request`` failed (``reason``)."""

    request: str
    layer: int
    reason: str


def _caches_arg(caches) -> dict:
    if not isinstance(caches, Mapping):
        raise InputTypeError(f"caches must be a mapping name -> (layout, cache), got {describe(caches)}")
    return dict(caches)


class LayerSender:
    """The prefill side of one request. ``plan``: the whole request's plan (this side the
    source); ``send``: the control channel (called with a ``LayerMessage`` or ``LayerFailed``;
    tensors on the caches' device: a channel that pickles them copies them to the host);
    ``layers``: the grouping (``layers.layer_groups``)."""

    def __init__(self, endpoint, peer, plan: TransferPlan, caches: Mapping[str, tuple[Layout, torch.Tensor]], *,
                 send: Callable[[object], None], request: str = "0", layers: Mapping | None = None,
                 backend: str = "auto"):
        if not isinstance(request, str):
            raise InputTypeError(f"request must be a str, got {describe(request)}")
        if not callable(send):
            raise InputTypeError(f"send must be callable (the control channel), got {describe(send)}")
        self.endpoint, self.peer, self.caches = endpoint, peer, _caches_arg(caches)
        self.plans = layer_plans(plan, layers)
        self.send, self.request, self.backend = send, request, backend
        self.sent: set[int] = set()

    @property
    def layers(self) -> list[int]:
        return list(self.plans)

    def _plan(self, layer: int) -> TransferPlan:
        if layer not in self.plans:
            raise InputError(f"the plan has no layer {layer!r}; its layers: {sorted(self.plans)}")
        if layer in self.sent:
            raise InputError(f"layer {layer} of request {self.request!r} was sent already")
        self.sent.add(layer)
        return self.plans[layer]

    def sums(self, layer: int) -> dict:
        """Layer ``layer``'s checksums of the source rows, computed where the pages live (no
        host read): call right after prefill wrote the layer."""
        return expected_checksums(self.plans[layer], self.caches, backend=self.backend)

    def push(self, layer: int, *, timeout: float = 30.0) -> None:
        """Move layer ``layer`` to the peer and tell the receiver (module doc). A failed push
        sends ``LayerFailed`` and raises the TransferError."""
        plan = self._plan(layer)
        sums = self.sums(layer)
        notifies = self.endpoint.engine.notifies
        try:
            if notifies:  # the checksums first; the completion travels with the bytes
                self.send(LayerMessage(self.request, layer, sums))
                self.endpoint.push(self.peer, plan, timeout=timeout, notify=layer_note(self.request, layer))
            else:
                self.endpoint.push(self.peer, plan, timeout=timeout)
        except TransferError as err:
            self.send(LayerFailed(self.request, layer, f"{type(err).__name__}: {err}"))
            raise
        if not notifies:
            self.send(LayerMessage(self.request, layer, sums, landed=True))

    def ready(self, layer: int) -> None:
        """For a pull: tell the receiver that layer ``layer`` is written, with its checksums."""
        plan = self._plan(layer)
        self.send(LayerMessage(self.request, layer, expected_checksums(plan, self.caches, backend=self.backend)))


class LayerReceiver:
    """The decode side of one request: per layer, the checksums and the completion, then the
    verification (module doc). ``plan``: the whole request's plan (this side the destination);
    ``caches``: this side's; ``layers``: the grouping."""

    def __init__(self, plan: TransferPlan, caches: Mapping[str, tuple[Layout, torch.Tensor]], *, request: str = "0",
                 layers: Mapping | None = None, backend: str = "auto"):
        if not isinstance(request, str):
            raise InputTypeError(f"request must be a str, got {describe(request)}")
        self.plan, self.caches, self.request, self.backend = plan, _caches_arg(caches), request, backend
        self.plans = layer_plans(plan, layers)
        self._sums: dict[int, dict] = {}
        self._landed: set[int] = set()
        self.verified: list[int] = []  # in the order they verified
        self.failed: str | None = None  # why the request's pages are not valid, once they are not

    @property
    def valid(self) -> bool:
        """Every layer verified and nothing failed: only then may decode read the pages."""
        return self.failed is None and len(self.verified) == len(self.plans)

    @property
    def pending(self) -> list[int]:
        """Layers not verified yet."""
        return [k for k in self.plans if k not in self.verified]

    def invalid_pages(self) -> dict[str, torch.Tensor]:
        """Cache name -> this side's pages of the request (every page, once anything failed)."""
        return {c: p.dst_pages for p in self.plan.caches.values() for c in p.caches}

    def fail(self, reason: str) -> None:
        """Mark the request failed: every page invalid, the verified layers too."""
        if self.failed is None:
            self.failed = reason
        self.verified = []

    def _refuse(self, message: str) -> None:
        self.fail(message)
        raise IntegrityError(f"{message}; the request's pages are not valid")

    def _layer(self, layer, what: str) -> int:
        if type(layer) is not int or layer not in self.plans:  # noqa: E721 - not a bool
            self._refuse(f"request {self.request!r}: {what} of layer {layer!r}, which the plan does not have "
                         f"(its layers: {sorted(self.plans)})")
        return layer

    def expect(self, layer: int, sums: Mapping) -> list[int]:
        """The sender's checksums of ``layer``; returns the layers verified by this call."""
        if self.failed is not None:
            return []
        layer = self._layer(layer, "checksums")
        if layer in self._sums:
            self._refuse(f"request {self.request!r}: layer {layer}'s checksums arrived twice")
        self._sums[layer] = dict(sums) if isinstance(sums, Mapping) else sums
        return self._try(layer)

    def landed(self, layer: int) -> list[int]:
        """Layer ``layer``'s bytes have landed (a note, a ``landed`` message, or this side's own
        pull done); returns the layers verified by this call."""
        if self.failed is not None:
            return []
        layer = self._layer(layer, "a delivery")
        if layer in self._landed:
            self._refuse(f"request {self.request!r}: layer {layer} delivered twice (its pages may have been "
                         f"written again after they were verified)")
        self._landed.add(layer)
        return self._try(layer)

    def take(self, message) -> list[int]:
        """A control-channel message of this request (``LayerMessage`` or ``LayerFailed``; others
        are not this receiver's: InputTypeError); returns the layers verified by this call."""
        if isinstance(message, LayerFailed):
            if message.request == self.request:
                self.fail(f"the sender's push of layer {message.layer} failed: {message.reason}")
            return []
        if not isinstance(message, LayerMessage):
            raise InputTypeError(f"a layer message must be a LayerMessage or LayerFailed, got {describe(message)}")
        if message.request != self.request:
            return []
        done = self.expect(message.layer, message.sums)
        return done + self.landed(message.layer) if message.landed else done

    def take_notes(self, notes) -> list[int]:
        """The engine's notifications (``Endpoint.notifications``): this request's layer notes
        mark their layers landed; other messages are left alone. Returns the layers verified."""
        done = []
        for note in notes:
            read = read_note(note)
            if read is not None and read[0] == self.request:
                done += self.landed(read[1])
        return done

    def _try(self, layer: int) -> list[int]:
        if layer not in self._sums or layer not in self._landed:
            return []
        try:
            verify(self.plans[layer], self.caches, self._sums[layer], backend=self.backend)
        except IntegrityError as err:  # its message ends "the pages are not valid"
            message = f"layer {layer} of request {self.request!r}: {err}"
            self.fail(message)
            raise IntegrityError(message) from None
        self.verified.append(layer)
        return [layer]

    def wait(self, endpoint, ready: Callable[[], bool], recv: Callable[[], object], *, timeout: float = 30.0,
             until: Callable[["LayerReceiver"], bool] | None = None) -> None:
        """``wait_layers`` of this receiver alone."""
        wait_layers({self.request: self}, endpoint, ready, recv, timeout=timeout,
                    until=None if until is None else (lambda receivers: until(self)))


def wait_layers(receivers: Mapping[str, LayerReceiver], endpoint, ready: Callable[[], bool],
                recv: Callable[[], object], *, timeout: float = 30.0,
                until: Callable[[Mapping[str, LayerReceiver]], bool] | None = None) -> None:
    """Take control-channel messages (``recv()`` once ``ready()``: a pipe's ``poll`` and
    ``recv``) and the endpoint's notifications (``Endpoint.notifications``, which progresses its
    engine), each routed to the receiver of its request (``receivers``: request -> receiver),
    until every request is valid (or ``until(receivers)`` holds). IntegrityError as ``take``
    raises it; TransferError once a request failed otherwise (a sender's ``LayerFailed``), for a
    message of no request here, or after ``timeout`` seconds (the requests not valid then are
    failed)."""
    deadline = time.monotonic() + seconds(timeout)
    pause = POLL_S
    while not (all(r.valid for r in receivers.values()) or (until is not None and until(receivers))):
        for r in receivers.values():
            if r.failed is not None:
                raise TransferError(f"request {r.request!r} failed: {r.failed}; its pages are not valid")
        notes = endpoint.notifications()
        for r in receivers.values():
            r.take_notes(notes)
        if notes:
            pause = POLL_S
        if ready():
            message = recv()
            request = getattr(message, "request", None)
            if not isinstance(request, str) or request not in receivers:
                raise TransferError(f"a layer message of no request waited for here: {describe(message)[:200]}")
            receivers[request].take(message)
            pause = POLL_S
            continue
        if time.monotonic() > deadline:
            late = {r.request: r.pending for r in receivers.values() if not r.valid}
            for request in late:
                receivers[request].fail(f"layers {late[request]} did not verify within {timeout} s")
            raise TransferError(f"layers did not verify within {timeout} s (request: layers {late}); their pages "
                                f"are not valid")
        time.sleep(pause)
        pause = min(2 * pause, MAX_POLL_S)
