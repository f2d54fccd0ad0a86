"""What a side believes of its peer and of its caller (issue 44 items 3, 5, 6, 7): a peer's
description is re-derived from its format and bounded, a malformed hello or argument is a typed
error (never a RecursionError, TypeError or a silent default), and arenas are found by address,
named the same whatever the insertion order."""

from __future__ import annotations

import base64
import json

import attrs
import numpy as np
import pytest
import torch

from kvformats.errors import HandshakeError, InputError, InputTypeError
from kvformats.formats import Fp8DsMla, Mxfp4Indexer
from kvformats.transfer import describe_caches, from_json, handshake, plan_transfer, to_json
from kvformats.transfer.endpoint import Endpoint
from kvformats.transfer.engines.base import DONE, Engine

KV = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
IDX = Mxfp4Indexer(head_dim=128, page_size=16)


class Quiet(Engine):
    """An engine that moves nothing and reports every batch done."""

    name = "quiet"

    def __init__(self, max_batch=8):
        self.max_batch, self.posted = max_batch, 0

    def register(self, addr, nbytes, device=None):
        pass

    def metadata(self):
        return b"quiet"

    def connect(self, peer_metadata):
        return "peer"

    def post(self, op, peer, segments):
        self.posted += 1
        return 0

    def poll(self, handle):
        return DONE


def one_cache(pages=4):
    return {"kv": (KV, KV.allocate(pages))}


@pytest.mark.parametrize("field, value, match", [
    ("page_size", 64, r"the peer's cache 'kv': page_size = 64, but fp8_ds_mla with these params has 16"),
    ("num_pages", 2**62, r"num_pages = 4611686018427387904, not a non-negative int below 2\*\*62"),
    ("offset", 2**63 - 100, r"offset = 9223372036854775708, not a non-negative int below 2\*\*62"),
    ("storage_bytes", 2**64, r"storage_bytes = 18446744073709551616, not a non-negative int"),
    ("num_pages", 5, r"its 5 pages end at byte 16320 of the arena, beyond its storage_bytes = 13056"),
    ("page_stride", 100, r"page_stride = 100 is less than the page width 3264"),
    ("page_bytes", 3000, r"page_bytes = 3000, but fp8_ds_mla pages are at least 3104 bytes wide"),
    ("fingerprint", "0" * 64, r"fingerprint = '0000"),
    ("params", {"head_dim": 128, "rope_dim": 64, "page_size": 16, "profile": "nope"}, r"is not a layout"),
], ids=["page_size", "num_pages-2**62", "offset-near-2**63", "storage_bytes-2**64", "pages-past-storage",
        "stride-below-width", "narrow-page", "fingerprint", "params"])
def test_a_peer_description_is_checked_against_its_layout_and_bounded(field, value, match):
    text = json.loads(to_json(describe_caches(one_cache())))
    text[0][field] = value
    with pytest.raises(HandshakeError, match=match):
        from_json(json.dumps(text))


def test_a_plan_takes_rows_per_page_from_the_layout_not_the_description():
    """A description claiming 64 rows per page for a 16-row layout: the plan is refused, where
    before a puller's ``rows=`` plan then ran past the named pages."""
    lying = {"kv": attrs.evolve(describe_caches(one_cache(8))["kv"], page_size=64)}
    with pytest.raises(HandshakeError, match="page_size = 64, but fp8_ds_mla with these params has 16"):
        plan_transfer(lying, lying, {"kv": [0]}, {"kv": [5]}, rows={"kv": (0, 64)})


def hello_of(**edit) -> bytes:
    """A real hello of one cache, with ``edit``'s fields replaced."""
    msg = json.loads(Endpoint(Quiet(), one_cache()).hello())
    msg.update(edit)
    return json.dumps(msg).encode()


@pytest.mark.parametrize("hello, match", [
    (b'{"engine": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not JSON"),  # RecursionError before
    (b'{"engine": ' + b"[" * 500 + b"]" * 500 + b"}", "nested more than 8 levels"),
    (hello_of(metadata=5), "engine metadata must be base64 text, got 5"),  # TypeError before
    (hello_of(metadata="***"), "engine metadata is not base64"),
    (hello_of(bases={"kv": -1}), "arena address -1"),
    (hello_of(bases={"kv": 2**80}), "arena address 1208925819614629174706176"),
    (hello_of(bases={"kv": True}), "arena address True"),
    (hello_of(caches=json.dumps(json.loads(to_json(describe_caches(one_cache()))) * 2)),
     r"name \['kv'\] more than once"),  # collapsed into one before
    (b"\xff\xfe", "not JSON"),
    (hello_of(extra=1), "not a kvformats hello"),
], ids=["deep-100000", "deep-500", "metadata-5", "metadata-not-base64", "base-negative", "base-2**80", "base-bool",
        "cache-twice", "not-utf8", "extra-key"])
def test_a_malformed_hello_is_a_handshake_error(hello, match):
    with pytest.raises(HandshakeError, match=match):
        Endpoint(Quiet(), one_cache()).connect(hello)


def test_engine_metadata_that_is_not_text_is_a_handshake_error():
    from kvformats.transfer.engines.mooncake import MooncakeEngine

    bare = object.__new__(MooncakeEngine)  # connect reads no engine state: no engine is started
    with pytest.raises(HandshakeError, match="not UTF-8"):
        bare.connect(b"\xff\xfe:1234")  # UnicodeDecodeError before
    with pytest.raises(HandshakeError, match="must be 'host:port'"):
        bare.connect(b"127.0.0.1")


@pytest.mark.parametrize("pages, error, match", [
    ([2**63], InputError, r"names page 9223372036854775808, beyond the cache's 4 pages"),  # ValueError before
    (torch.tensor([0], device="meta"), InputError, "meta device"),
], ids=["2**63", "meta"])
def test_bad_page_ids_are_typed_errors(pages, error, match):
    descs = describe_caches(one_cache())
    with pytest.raises(error, match=match):
        plan_transfer(descs, descs, {"kv": pages}, {"kv": [1]})


def test_bad_modes_timeouts_and_batch_sizes_are_typed_errors():
    a, b = Endpoint(Quiet(), one_cache()), Endpoint(Quiet(), one_cache())
    peer = a.connect(b.hello())
    with pytest.raises(InputTypeError, match="whole_pages must be a bool, got str 'no'"):
        plan_transfer(a.descs, peer.descs, {"kv": [0]}, {"kv": [1]}, whole_pages="no")
    plan = plan_transfer(a.descs, peer.descs, {"kv": [0]}, {"kv": [1]})
    with pytest.raises(InputTypeError, match="timeout must be a number of seconds, got bool True"):
        a.push(peer, plan, timeout=True)
    for size in (0, -1, 2.0):  # ZeroDivisionError, and a "success" that moved nothing, before
        a.engine.max_batch = size
        with pytest.raises(InputError, match=f"max_batch must be a positive int .*got {size}"):
            a.push(peer, plan)
    assert a.engine.posted == 0


@pytest.mark.parametrize("engine", ["nixl", "mooncake"])
def test_engines_refuse_a_bad_batch_size_before_they_start(engine):
    from kvformats.transfer.engines import make_engine

    for size in (0, -1):
        with pytest.raises(InputError, match="max_batch must be a positive int"):
            make_engine(engine, max_batch=size)


def test_arena_names_do_not_depend_on_insertion_order():
    stride = KV.page_bytes + IDX.page_bytes
    buf = torch.zeros(4 * stride, dtype=torch.uint8)
    fields = {"kv": (KV, buf.as_strided((4, KV.page_bytes), (stride, 1), 0)),
              "index": (IDX, buf.as_strided((4, IDX.page_bytes), (stride, 1), KV.page_bytes))}
    forward, backward = describe_caches(fields), describe_caches(dict(reversed(list(fields.items()))))
    assert forward == backward and forward["kv"].arena == forward["index"].arena == "index"
    handshake(forward, backward)  # failed before: 'kv' here, 'index' at the peer
    a, b = Endpoint(Quiet(), fields), Endpoint(Quiet(), dict(reversed(list(fields.items()))))
    a.connect(b.hello())


def test_caches_over_one_buffer_through_two_storages_form_one_arena():
    """torch.from_numpy of two overlapping slices (and DLPack) give two storages over one
    buffer: compared by address they are one arena, and a plan putting two pages on the same
    bytes is refused (before, each storage was its own arena and nothing was seen)."""
    def two_views():
        mem = np.zeros(4 * KV.page_bytes, dtype=np.uint8)
        a = torch.from_numpy(mem[:3 * KV.page_bytes]).view(3, KV.page_bytes)
        b = torch.from_dlpack(torch.from_numpy(mem[100:100 + 3 * KV.page_bytes])).view(3, KV.page_bytes)
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
        return {"a": (KV, a), "b": (KV, b)}, mem

    (src, _), (dst, _) = two_views(), two_views()
    d = describe_caches(dst)
    assert d["a"].arena == d["b"].arena == "a" and (d["a"].offset, d["b"].offset) == (0, 100)
    assert d["a"].storage_bytes == 100 + 3 * KV.page_bytes
    with pytest.raises(InputError, match="destination segments overlap"):
        plan_transfer(describe_caches(src), d, {"a": [0], "b": [0]}, {"a": [1], "b": [0]})
    ep = Endpoint(Quiet(), dst)
    assert ep.bases["a"] == ep.bases["b"] == dst["a"][1].data_ptr()  # one registration, one base


def test_a_hello_with_good_parts_connects():
    """The checks above refuse nothing that a real peer sends."""
    caches = one_cache()
    peer = Endpoint(Quiet(), caches).connect(hello_of())
    assert peer.descs == describe_caches(caches) and base64.b64decode(json.loads(hello_of())["metadata"])
