"""Record identity (kvformats.codec.records): every record ABI declared once; a size gives every
candidate and never a guess; the declared facts agree with the registered layouts; cache files
and the transfer handshake carry the identity and refuse another record of the same size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import attrs
import pytest
import torch

import kvformats as kvf
from kvformats.codec import records as rec
from kvformats.errors import (AmbiguousRecordError, CacheFileError, HandshakeError, InputError, InputTypeError,
                              LayoutError, RecordMismatchError)
from kvformats.formats import FORMATS

ROOT = Path(__file__).resolve().parents[1]

CANDIDATES = {
    528: {"dsv41-fp8-528-planar", "dsv41-fp8-528-interleaved", "dsv32-fp8-528-norope"},
    288: {"dsv41-fp4-288-planar", "dsv41-fp4-288-interleaved"},
    584: {"dsv4-fp8-584"},
    656: {"dsv32-fp8-656"},
    68: {"dsv4-mxfp4-indexer-68"},
    132: {"dsv4-fp8-indexer-132"},
    352: {"dsv32-nvfp4-352"},
}


def names(found) -> set[str]:
    return {r.name for r in found}


@pytest.mark.parametrize("size", sorted(CANDIDATES))
def test_identify_returns_every_candidate_of_a_size(size):
    found = kvf.identify(size)
    assert isinstance(found, tuple) and all(isinstance(r, kvf.Record) for r in found)
    assert names(found) == CANDIDATES[size]
    assert all(r.bytes_per_token == size for r in found)


def test_identify_one_refuses_an_ambiguous_size_naming_every_candidate():
    for size in (528, 288):
        with pytest.raises(AmbiguousRecordError) as err:
            kvf.identify_one(size)
        assert isinstance(err.value, LayoutError) and isinstance(err.value, ValueError)
        for name in CANDIDATES[size]:
            assert name in str(err.value)
        assert "does not guess" in str(err.value) and "hint" in str(err.value)
    assert kvf.identify_one(584).name == "dsv4-fp8-584"
    assert kvf.identify_one(528, head_dim=512, hint="page-planar").format == "fp8_ds_mla_v41"
    with pytest.raises(LayoutError, match="no record known to kvformats has 529 bytes per token") as err:
        kvf.identify_one(529)
    assert not isinstance(err.value, AmbiguousRecordError)


@pytest.mark.parametrize("hint, expected", [
    ("planar", {"dsv41-fp8-528-planar"}),
    ("page-planar", {"dsv41-fp8-528-planar"}),
    ("token-interleaved", {"dsv41-fp8-528-interleaved"}),
    ("Interleaved", {"dsv41-fp8-528-interleaved"}),
    ("vllm", {"dsv41-fp8-528-interleaved"}),  # vLLM 0.33.0 writes interleaved
    ("tokenspeed", {"dsv41-fp8-528-planar"}),  # tokenspeed-kernel 0.1.4 writes planar
    ("flashmla", {"dsv41-fp8-528-interleaved"}),  # upstream deepseek-ai/FlashMLA
    ("flashmla-vllm", {"dsv41-fp8-528-planar"}),  # the vllm-project fork's tests/quant.py
    ("vllm-project/FlashMLA", {"dsv41-fp8-528-planar"}),
    ("sgl-project/FlashMLA", {"dsv41-fp8-528-planar", "dsv32-fp8-528-norope"}),
    ("fp8_ds_mla_v41_interleaved", {"dsv41-fp8-528-interleaved"}),
    ("dsv32-fp8-528-norope", {"dsv32-fp8-528-norope"}),
    ("V4.1", {"dsv41-fp8-528-planar", "dsv41-fp8-528-interleaved"}),
    (("V4.1", "planar"), {"dsv41-fp8-528-planar"}),
    ("V3.2", {"dsv32-fp8-528-norope"}),
    ("fp8_ds_mla", set()),  # a known word that names no 528 B record
])
def test_a_hint_narrows(hint, expected):
    assert names(kvf.identify(528, hint=hint)) == expected


def test_head_dim_narrows_and_bad_arguments_are_typed_errors():
    assert names(kvf.identify(528, head_dim=512)) == CANDIDATES[528]
    assert kvf.identify(528, head_dim=576) == ()
    assert names(kvf.identify(352, head_dim=576)) == {"dsv32-nvfp4-352"}
    assert kvf.identify(1) == ()
    with pytest.raises(InputError, match="'bogus' names no record"):
        kvf.identify(528, hint="bogus")
    for bad in (528.0, True, "528"):
        with pytest.raises(InputTypeError, match="bytes_per_token must be an int"):
            kvf.identify(bad)
    with pytest.raises(InputError, match="bytes_per_token must be positive"):
        kvf.identify(0)
    with pytest.raises(InputTypeError, match="head_dim"):
        kvf.identify(528, head_dim=512.0)
    for bad in (3, (), ("planar", 2), [""]):
        with pytest.raises(InputTypeError, match="hint"):
            kvf.identify(528, hint=bad)


def test_every_record_is_declared_once_with_its_sources():
    all_records = kvf.list_records()
    assert len({r.name for r in all_records}) == len(all_records)
    assert [(r.bytes_per_token, r.name) for r in all_records] == sorted((r.bytes_per_token, r.name)
                                                                       for r in all_records)
    for r in all_records:
        assert r.sources, r.name
        assert not r.derived
        for s in r.sources:
            assert s.url.startswith(("https://github.com/", "https://pypi.org/project/")), s
            # a source names a commit or release, a pull request, or says it recorded none
            assert s.version or s.pull is not None or s.repository.startswith(("vllm-project/vllm",
                                                                               "sgl-project/sglang")), s
        if not r.format:
            assert r.status == "known" and any(s.role == "proposes" or s.pull is not None
                                               or s.repository == "sgl-project/FlashMLA" for s in r.sources)
    known = {r.bytes_per_token for r in all_records if r.status == "known"}
    assert {368, 384, 432, 528} <= known
    facts = {(s.repository, s.version) for r in all_records for s in r.sources}
    for fact in (("pypi:tokenspeed-kernel", "0.1.4"), ("pypi:vllm", "0.33.0"), ("deepseek-ai/FlashMLA", "2e5429f"),
                 ("deepseek-ai/FlashMLA", "9a7d253"), ("vllm-project/FlashMLA", "02137a4"),
                 ("sgl-project/FlashMLA", "259ea0c"), ("vllm-project/FlashMLA", "6bc49418"),
                 ("deepseek-ai/FlashMLA", "9241ae3"), ("lightseekorg/tokenspeed", "f3e4d1e2")):
        assert fact in facts, fact


IMPLEMENTED = [r for r in rec.RECORDS if r.format]


@pytest.mark.parametrize("record", IMPLEMENTED, ids=lambda r: r.name)
def test_an_implemented_record_agrees_with_its_registered_layout(record):
    """The declared bytes per token, head size and layout kind are the registered layout's (its
    row_bytes and its segments); the profiles its sources name are the format's."""
    if not record.implemented:
        pytest.skip(f"format {record.format} is not registered here: the record is listed as declared")
    layout = record.layout_object()
    assert record.bytes_per_token == layout.row_bytes
    assert record.head_dim == layout.head_dim
    assert record.layout == rec.layout_kind(layout)
    assert rec.record_of(layout) is record and layout.record is record
    table = record.profile_names()
    assert all(s.profile in table for s in record.sources if s.profile), (record.name, table)


@pytest.mark.parametrize("cls", FORMATS, ids=lambda c: c.name)
def test_every_package_format_has_a_declared_record(cls):
    layout = cls()
    assert not layout.record.derived, f"{cls.name} has no declared record in kvformats.codec.records"
    assert layout.record.format == cls.name
    assert layout.record.identity() == {"name": layout.record.name, "version": layout.record.version,
                                        "layout": layout.record.layout, "bytes_per_token": layout.row_bytes,
                                        "head_dim": layout.head_dim}


def test_a_layout_without_a_declared_record_gets_a_derived_identity():
    small = kvf.Fp8DsMlaV41(head_dim=64)
    assert small.record.derived and small.record.name == "fp8_ds_mla_v41(head_dim=64)"
    assert (small.record.version, small.record.layout, small.record.bytes_per_token) == ("V4.1", "page-planar", 66)
    assert kvf.Fp8DsMlaV41(head_dim=64, page_size=4, profile="flashmla").record == small.record

    @attrs.frozen(kw_only=True)
    class UserRows(kvf.Mxfp4Indexer):
        name = "user_rows"  # a format a user declares (and may register)

    user = UserRows(page_size=8)
    assert user.record.derived and user.record.name == "user_rows(head_dim=128)"
    assert (user.record.version, user.record.layout, user.record.bytes_per_token) == ("", "page-planar", 68)
    with pytest.raises(InputTypeError):
        rec.record_of("fp8_ds_mla")


# ----- cache files -------------------------------------------------------------------------------
def _filled(layout, pages=3):
    cache = layout.allocate(pages)
    cache.copy_(torch.randint(0, 256, cache.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0)))
    return cache


def _rewrite(path: Path, out: Path, edit) -> None:
    """A copy of the cache file ``path`` at ``out`` whose kvformats metadata ``edit`` changed."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = json.loads(header["__metadata__"]["kvformats"])
    edit(meta)
    header["__metadata__"]["kvformats"] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])


@pytest.fixture
def io():
    pytest.importorskip("safetensors")
    from kvformats.caches import files

    return files


def test_a_file_round_trip_keeps_the_record_identity(io, tmp_path):
    planar, interleaved = kvf.Fp8DsMlaV41(page_size=4), kvf.Fp8DsMlaV41Interleaved(page_size=4)
    path = tmp_path / "v41.safetensors"
    io.save_caches(path, {"swa": (planar, _filled(planar)), "swa_i": (interleaved, _filled(interleaved))})
    meta = io.read_metadata(path)
    assert meta["tensors"]["swa"]["record"] == planar.record.identity()
    assert meta["tensors"]["swa"]["record"]["name"] == "dsv41-fp8-528-planar"
    assert meta["tensors"]["swa_i"]["record"]["name"] == "dsv41-fp8-528-interleaved"
    got = io.load_caches(path)
    assert got["swa"].layout.record is planar.record and got["swa_i"].layout.record is interleaved.record


def test_a_file_claiming_another_record_of_the_same_size_is_refused(io, tmp_path):
    planar = kvf.Fp8DsMlaV41(page_size=4)
    path = tmp_path / "v41.safetensors"
    io.save_cache(path, planar, _filled(planar))
    other = kvf.Fp8DsMlaV41Interleaved().record.identity()

    def claim_interleaved(meta):
        meta["tensors"]["cache"]["record"] = other

    _rewrite(path, tmp_path / "mixed.safetensors", claim_interleaved)
    with pytest.raises(RecordMismatchError) as err:
        io.load_caches(tmp_path / "mixed.safetensors")
    assert isinstance(err.value, CacheFileError)
    message = str(err.value)
    assert "dsv41-fp8-528-planar" in message and "dsv41-fp8-528-interleaved" in message
    assert "the same bytes per token" in message and "nothing was loaded" in message

    def drop(meta):  # a file written before identities: its format's identity
        del meta["tensors"]["cache"]["record"]

    _rewrite(path, tmp_path / "old.safetensors", drop)
    assert io.load_cache(tmp_path / "old.safetensors").layout.record is planar.record

    def derived(meta):  # written by a kvformats that declared no record for it: the derived identity
        meta["tensors"]["cache"]["record"] = rec.derived_record(planar).identity()

    _rewrite(path, tmp_path / "derived.safetensors", derived)
    assert io.load_cache(tmp_path / "derived.safetensors").layout.record is planar.record

    for bad in ("dsv41-fp8-528-planar", {**other, "bytes_per_token": True}, {**other, "layout": "diagonal"},
                {"name": "x"}):
        def corrupt(meta, bad=bad):
            meta["tensors"]["cache"]["record"] = bad

        _rewrite(path, tmp_path / "bad.safetensors", corrupt)
        with pytest.raises(CacheFileError, match="corrupt kvformats metadata") as err:
            io.load_caches(tmp_path / "bad.safetensors")
        assert not isinstance(err.value, RecordMismatchError)


# ----- the transfer handshake --------------------------------------------------------------------
def _descs(layout, pages=4):
    from kvformats.transfer import describe_caches

    return describe_caches({"swa": (layout, layout.allocate(pages))})


def test_the_handshake_refuses_another_record_of_the_same_size():
    from kvformats.transfer import from_json, handshake, to_json

    planar, interleaved = kvf.Fp8DsMlaV41(page_size=4), kvf.Fp8DsMlaV41Interleaved(page_size=4)
    here, there = _descs(planar), _descs(interleaved)
    assert here["swa"].record == planar.record.identity()
    assert from_json(to_json(here)) == here
    assert here["swa"].page_bytes == there["swa"].page_bytes  # nothing but the record tells them apart
    with pytest.raises(HandshakeError) as err:
        handshake(here, from_json(to_json(there)))
    message = str(err.value)
    assert "dsv41-fp8-528-planar" in message and "dsv41-fp8-528-interleaved" in message
    assert "same 528 bytes per token" in message
    # a peer claiming the same format but another record of its size is refused the same way
    forged = json.loads(to_json(here))
    forged[0]["record"] = interleaved.record.identity()
    with pytest.raises(HandshakeError, match="record differs at the same 528 bytes per token"):
        handshake(here, from_json(json.dumps(forged)))
    # different sizes: the first differing field, with both identities
    fp4 = kvf.Fp4DsMlaV41(page_size=4)
    with pytest.raises(HandshakeError, match=r"format differs.*dsv41-fp8-528-planar.*dsv41-fp4-288-planar"):
        handshake(here, _descs(fp4))


def test_a_peer_description_without_a_record_gets_its_formats_and_a_bad_one_is_refused():
    from kvformats.transfer import from_json, handshake, to_json

    planar = kvf.Fp8DsMlaV41(page_size=4)
    here = _descs(planar)
    old = json.loads(to_json(here))
    del old[0]["record"]
    handshake(here, from_json(json.dumps(old)))  # an older kvformats peer
    assert from_json(json.dumps(old))["swa"].record == planar.record.identity()
    derived = json.loads(to_json(here))  # a peer whose table declared no record for it
    derived[0]["record"] = rec.derived_record(planar).identity()
    assert derived[0]["record"]["name"] == "fp8_ds_mla_v41(head_dim=512)"
    handshake(here, from_json(json.dumps(derived)))
    for bad in ("dsv41-fp8-528-planar", {"name": "x"}, {**planar.record.identity(), "head_dim": -1}):
        wrong = json.loads(to_json(here))
        wrong[0]["record"] = bad
        with pytest.raises(HandshakeError, match="bad record identity"):
            from_json(json.dumps(wrong))


def test_a_plan_refuses_a_description_whose_record_is_not_its_formats():
    from kvformats.transfer import plan_transfer

    planar = kvf.Fp8DsMlaV41(page_size=4)
    here = _descs(planar)
    lying = {"swa": attrs.evolve(here["swa"], record=kvf.Fp8DsMlaV41Interleaved().record.identity())}
    with pytest.raises(HandshakeError, match="carries the record dsv41-fp8-528-interleaved"):
        plan_transfer(lying, lying, {"swa": [0]}, {"swa": [1]})
    assert plan_transfer(here, here, {"swa": [0]}, {"swa": [1]}).nbytes == planar.page_bytes


def test_endpoints_refuse_a_peer_of_another_record_of_the_same_size():
    from kvformats.transfer.endpoint import Endpoint
    from kvformats.transfer.engines.base import DONE, Engine

    class Quiet(Engine):
        name = "quiet"
        max_batch = 8

        def register(self, addr, nbytes, device=None):
            pass

        def metadata(self):
            return b"quiet"

        def connect(self, peer_metadata):
            return "peer"

        def post(self, op, peer, segments):
            return 0

        def poll(self, handle):
            return DONE

    planar, interleaved = kvf.Fp8DsMlaV41(page_size=4), kvf.Fp8DsMlaV41Interleaved(page_size=4)
    a = Endpoint(Quiet(), {"swa": (planar, planar.allocate(4))})
    b = Endpoint(Quiet(), {"swa": (interleaved, interleaved.allocate(4))})
    with pytest.raises(HandshakeError, match="dsv41-fp8-528-planar.*dsv41-fp8-528-interleaved"):
        a.connect(b.hello())
    same = Endpoint(Quiet(), {"swa": (planar, planar.allocate(2))})
    assert a.connect(same.hello()).descs["swa"].record == planar.record.identity()


# ----- the command line and the docs -------------------------------------------------------------
def test_cli_records_lists_the_candidates_and_the_identity(capsys):
    from kvformats.cli import main

    assert main(["records", "528"]) == 0
    out = capsys.readouterr().out
    for name in CANDIDATES[528]:
        assert name in out
    assert "ambiguous: 3 records have 528 bytes per token" in out and "pypi:tokenspeed-kernel" in out
    assert main(["records", "528", "--hint", "planar", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["records"]] == ["dsv41-fp8-528-planar"] and doc["ambiguous"] is False
    assert doc["query"] == {"bytes_per_token": 528, "head_dim": None, "hint": ["planar"]}
    assert main(["records", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["records"]] == \
        [r.name for r in kvf.list_records()]
    assert main(["records", "529"]) == 1
    assert "no record known to kvformats has 529 bytes per token" in capsys.readouterr().out
    assert main(["records", "528", "--hint", "bogus"]) == 2
    assert "names no record" in capsys.readouterr().err
    assert main(["records", "--hint", "planar"]) == 2
    assert main(["list", "--json"]) == 0
    for f in json.loads(capsys.readouterr().out)["formats"]:
        assert f["record"] == kvf.get_format(f["name"]).record.identity()
    assert main(["list"]) == 0
    assert "dsv41-fp8-528-interleaved" in capsys.readouterr().out


def test_the_records_page_is_generated_and_in_the_nav(published_only):
    from kvformats.spec.docgen import expected_docs, records_page

    from kvformats.cli import build_parser

    page = ROOT / "docs" / "reference" / "records.md"
    assert expected_docs(ROOT, build_parser())["reference/records.md"] == records_page()
    assert page.read_text() == records_page(), "docs/reference/records.md is stale: run kvformats docs --write"
    assert "reference/records.md" in (ROOT / "mkdocs.yml").read_text()
    for r in kvf.list_records():
        assert f"### {r.name}" in page.read_text()
