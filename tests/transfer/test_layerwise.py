"""Layer by layer (issue 45): a request's layers move one at a time, the decode side verifies
each as it lands and marks the request valid only once every layer verified. On one process,
through an engine stand-in that copies bytes with memmove and can hold a layer's transfer until
released: layer 0 verifies while layer 1 is still in flight; a corrupted layer k is named as k;
a layer delivered twice is refused; a push failing mid-way leaves every page invalid."""

from __future__ import annotations

import ctypes
import queue
import threading

import pytest
import torch

from kvformats.errors import InputError, InputTypeError, IntegrityError, TransferError
from kvformats.formats import CompressorState, Fp8DsMla, Mxfp4Indexer
from kvformats.layout import storage_bytes
from kvformats.transfer import describe_caches, plan_transfer
from kvformats.transfer.endpoint import Endpoint
from kvformats.transfer.engines.base import BUSY, DONE, FAILED, Engine
from kvformats.transfer.layers import layer_groups, layer_plans
from kvformats.transfer.layerwise import LayerFailed, LayerMessage, LayerReceiver, LayerSender, layer_note, read_note

LAYERS = 3
TOKENS = 100


class Loopback(Engine):
    """Two endpoints of one process: a batch is memmove'd when it completes. Batches are counted
    from 0 (one per layer here): ``hold`` maps a batch to an event it waits for (busy until
    released); ``flip``: batches that land with one byte changed (a flip in flight); ``fail``:
    batches that fail. ``notifies=False`` behaves as Mooncake (the completion then goes over the
    control channel)."""

    name = "loopback"

    def __init__(self, notifies: bool = True):
        self.notifies = notifies
        self.inbox: list[bytes] = []
        self.hold: dict[int, threading.Event] = {}
        self.flip: set[int] = set()
        self.fail: set[int] = set()
        self.posted = 0
        self.peer: Loopback | None = None

    def register(self, addr, nbytes, device=None):
        pass

    def metadata(self):
        return b"loopback"

    def connect(self, peer_metadata):
        return self.peer

    def post(self, op, peer, segments, notify=None):
        self.posted += 1
        return {"op": op, "peer": peer, "rows": segments.clone(), "note": notify, "batch": self.posted - 1}

    def poll(self, handle):
        batch = handle["batch"]
        if batch in self.hold and not self.hold[batch].is_set():
            return BUSY
        if batch in self.fail:
            return FAILED
        for local, remote, n in handle["rows"].tolist():
            src, dst = (local, remote) if handle["op"] == "write" else (remote, local)
            ctypes.memmove(dst, src, n)
        if batch in self.flip:
            local, remote, n = handle["rows"][0].tolist()
            where = ctypes.c_uint8.from_address((remote if handle["op"] == "write" else local) + n // 2)
            where.value ^= 0x20
        if handle["note"] is not None:
            handle["peer"].inbox.append(handle["note"])
        return DONE

    def notify(self, peer, message):
        peer.inbox.append(message)

    def notifications(self):
        out, self.inbox = self.inbox, []
        return out


def stack(pages: int, page: int, seed: int | None):
    """Three layers of kv, index and compressor-state caches named L<k>.<cache>."""
    kv, idx = Fp8DsMla(head_dim=128, rope_dim=64, page_size=page), Mxfp4Indexer(head_dim=128, page_size=page)
    state = CompressorState(head_dim=8, ratio=4, page_size=page)
    out = {}
    g = torch.Generator().manual_seed(seed or 0)
    for k in range(LAYERS):
        for name, layout in (("kv", kv), ("index", idx), ("state", state)):
            cache = layout.allocate(pages)
            if seed is not None:
                u8 = storage_bytes(cache)
                u8.copy_(torch.randint(0, 256, u8.shape, generator=g, dtype=torch.uint8))
            out[f"L{k}.{name}"] = (layout, cache)
    return out


def pair(notifies: bool = True, dst_page: int = 32):
    """Prefill pages of 64 rows, decode pages of ``dst_page``; the request's plan, both ends."""
    src, dst = stack(4, 64, seed=1), stack(8, dst_page, seed=None)
    ea, eb = Loopback(notifies), Loopback(notifies)
    ea.peer, eb.peer = eb, ea
    a, b = Endpoint(ea, src), Endpoint(eb, dst)
    peer = a.connect(b.hello(), geometry=True)
    n_dst = -(-TOKENS // dst_page)
    plan = plan_transfer(a.descs, peer.descs, {name: [3, 1] for name in src},
                         {name: list(range(7, 7 - n_dst, -1)) for name in src}, tokens=TOKENS)
    return a, b, peer, plan, src, dst


def test_layers_come_from_the_names_or_a_mapping():
    names = ["L0.kv", "L1.kv", "L0.index", "L10_state"]
    assert layer_groups(names) == {0: ("L0.kv", "L0.index"), 1: ("L1.kv",), 10: ("L10_state",)}
    assert layer_groups(["a", "b"], {1: ["b"], 0: ("a",)}) == {0: ("a",), 1: ("b",)}
    with pytest.raises(InputError, match=r"caches \['kv'\] have no layer in their names"):
        layer_groups(["L0.x", "kv"])
    with pytest.raises(InputError, match="cache 'a' is in layer 0 and layer 1"):
        layer_groups(["a"], {0: ["a"], 1: ["a"]})
    with pytest.raises(InputError, match=r"in no layer \['b'\], not in the plan \['c'\]"):
        layer_groups(["a", "b"], {0: ["a", "c"]})
    with pytest.raises(InputTypeError, match="non-negative ints"):
        layer_groups(["a"], {True: ["a"]})
    assert read_note(layer_note("r7", 2)) == ("r7", 2) and read_note(b"other") is None


def test_a_layers_plan_is_the_whole_plans_part():
    a, b, peer, plan, src, dst = pair()
    parts = layer_plans(plan)
    assert sorted(parts) == [0, 1, 2] and sum(p.nbytes for p in parts.values()) == plan.nbytes
    assert list(parts[1].caches) == ["L1.kv", "L1.index", "L1.state"]
    assert parts[1].src == plan.src  # whole descriptions: the endpoint takes the part as its own


def test_layer_0_verifies_while_later_layers_are_in_flight():
    a, b, peer, plan, src, dst = pair()
    channel: queue.Queue = queue.Queue()
    sender = LayerSender(a, peer, plan, src, send=channel.put, request="r1")
    receiver = LayerReceiver(plan, dst, request="r1")
    held = a.engine.hold[1] = threading.Event()  # layer 1's batch

    def prefill():  # layer by layer, each as soon as it is "written"
        for k in range(LAYERS):
            sender.push(k, timeout=30)

    thread = threading.Thread(target=prefill)
    thread.start()
    try:
        receiver.wait(b, lambda: not channel.empty(), channel.get, timeout=30, until=lambda r: r.verified == [0])
        assert receiver.verified == [0] and receiver.pending == [1, 2] and not receiver.valid
        assert not storage_bytes(dst["L1.kv"][1]).any()  # layer 1 is still in flight
    finally:
        held.set()
        thread.join(30)
    receiver.wait(b, lambda: not channel.empty(), channel.get, timeout=30)
    assert receiver.verified == [0, 1, 2] and receiver.valid and receiver.failed is None


@pytest.mark.parametrize("notifies", [True, False], ids=["notification", "control-channel"])
def test_a_corrupted_layer_is_named(notifies):
    a, b, peer, plan, src, dst = pair(notifies)
    channel: list = []
    sender = LayerSender(a, peer, plan, src, send=channel.append, request="r2")
    receiver = LayerReceiver(plan, dst, request="r2")
    a.engine.flip.add(2)  # layer 2's batch
    for k in range(LAYERS):
        sender.push(k)
    with pytest.raises(IntegrityError) as err:
        for message in channel:
            receiver.take(message)
            receiver.take_notes(b.notifications())
    assert str(err.value).startswith("layer 2 of request 'r2': cache 'L2.kv': token rows [64, 96) (page 5 rows [0, 32) "
                                     "here, sender's page 1 rows [0, 32)) differ in region 'nope' after the transfer")
    assert str(err.value).endswith("; the pages are not valid")
    assert not receiver.valid and receiver.verified == [] and "layer 2" in receiver.failed


def test_a_layer_delivered_twice_is_refused_and_named():
    a, b, peer, plan, src, dst = pair()
    channel: list = []
    sender = LayerSender(a, peer, plan, src, send=channel.append, request="r3")
    receiver = LayerReceiver(plan, dst, request="r3")
    for k in range(2):
        sender.push(k)
    for message in channel:
        receiver.take(message)
    assert receiver.take_notes(b.notifications()) == [0, 1]
    # a sender that delivers layer 1 again (its pages written after they were verified)
    with pytest.raises(InputError, match="layer 1 of request 'r3' was sent already"):
        sender.push(1)
    a.push(peer, layer_plans(plan)[1], notify=layer_note("r3", 1))
    with pytest.raises(IntegrityError, match=r"request 'r3': layer 1 delivered twice \(its pages may have been "
                                             r"written again after they were verified\); the request's pages are "
                                             r"not valid"):
        receiver.take_notes(b.notifications())
    assert not receiver.valid and receiver.verified == []
    assert receiver.take(LayerMessage("r3", 2, {}, landed=True)) == []  # a failed request takes nothing more
    with pytest.raises(IntegrityError, match="checksums of layer 7, which the plan does not have"):
        LayerReceiver(plan, dst, request="r3").expect(7, {})


def test_a_push_failing_mid_way_leaves_every_page_invalid():
    a, b, peer, plan, src, dst = pair(notifies=False)
    channel: list = []
    sender = LayerSender(a, peer, plan, src, send=channel.append, request="r4")
    receiver = LayerReceiver(plan, dst, request="r4")
    a.engine.fail.add(1)  # layer 1's batch
    sender.push(0)
    with pytest.raises(TransferError, match="failed in batch 1 of 1"):
        sender.push(1)
    assert isinstance(channel[-1], LayerFailed) and channel[-1].layer == 1
    for message in channel:
        receiver.take(message)
    assert receiver.verified == [] and not receiver.valid
    assert receiver.failed.startswith("the sender's push of layer 1 failed: TransferError: loopback write failed")
    assert set(receiver.invalid_pages()) == set(dst) and receiver.invalid_pages()["L0.kv"].tolist() == [7, 6, 5, 4]
    with pytest.raises(TransferError, match="request 'r4' failed: the sender's push of layer 1 failed"):
        receiver.wait(b, lambda: False, lambda: None, timeout=1)


def test_a_wait_that_times_out_fails_the_request():
    a, b, peer, plan, src, dst = pair()
    receiver = LayerReceiver(plan, dst, request="r5")
    with pytest.raises(TransferError, match=r"did not verify within 0.05 s \(request: layers \{'r5': \[0, 1, 2\]\}\)"):
        receiver.wait(b, lambda: False, lambda: None, timeout=0.05)
    assert receiver.failed and not receiver.valid


def test_a_pull_verifies_each_layer_on_its_own_completion():
    a, b, peer_of_a, plan, src, dst = pair(dst_page=128)
    peer_of_b = b.connect(a.hello(), geometry=True)
    pull_plan = plan_transfer(peer_of_b.descs, b.descs, {n: p.src_pages.tolist() for n, p in plan.caches.items()},
                              {n: p.dst_pages.tolist() for n, p in plan.caches.items()}, tokens=TOKENS)
    channel: list = []
    sender = LayerSender(a, peer_of_a, plan, src, send=channel.append, request="r6")
    receiver = LayerReceiver(pull_plan, dst, request="r6")
    for k in range(LAYERS):
        sender.ready(k)  # prefill wrote layer k: its checksums go with "ready"
        receiver.take(channel[-1])
        b.pull_layer(peer_of_b, pull_plan, k)
        assert receiver.landed(k) == [k]
    assert receiver.valid


def test_bad_layer_arguments_are_typed_errors():
    a, b, peer, plan, src, dst = pair(notifies=False)
    with pytest.raises(InputError, match="delivers no notification"):
        a.push(peer, plan, notify=b"x")
    with pytest.raises(InputTypeError, match="notify must be non-empty bytes"):
        a.push(peer, plan, notify="x")
    with pytest.raises(InputError, match=r"the plan has no layer 5; its layers: \[0, 1, 2\]"):
        a.push_layer(peer, plan, 5)
    with pytest.raises(InputTypeError, match="a layer message must be"):
        LayerReceiver(plan, dst).take(("done", 0))
    with pytest.raises(InputTypeError, match="send must be callable"):
        LayerSender(a, peer, plan, src, send=None)


def test_an_arena_shared_by_two_layers_cannot_be_split_by_layer():
    """With whole physical pages, one plan entry moves every field of an arena: two layers'
    fields in one arena cannot move one layer at a time."""
    kv = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
    stride = 2 * kv.page_bytes
    buf = torch.zeros(4 * stride, dtype=torch.uint8)
    caches = {f"L{k}.kv": (kv, buf.as_strided((4, kv.page_bytes), (stride, 1), k * kv.page_bytes)) for k in (0, 1)}
    descs = describe_caches(caches)
    plan = plan_transfer(descs, descs, {n: [0] for n in caches}, {n: [1] for n in caches}, whole_pages=True)
    with pytest.raises(InputError, match=r"moves the arena fields \['L0.kv', 'L1.kv'\] together"):
        layer_plans(plan)
    assert list(plan.only(["L0.kv", "L1.kv"]).caches) == ["L0.kv"]  # the arena's entry, named by its first field
