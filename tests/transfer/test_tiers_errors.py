"""Bad input to the tiers: a restore into a pool of another record (same bytes per token
included), a file whose identity or checksums do not match, destination pages out of range,
overlapping or past the request's capacity. Each is a typed error raised before any byte of the
destination changes: every test compares the destination's bytes before and after."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from kvformats import get_format
from kvformats.errors import CacheFileError, HandshakeError, InputError, InputTypeError, IntegrityError, \
    RecordMismatchError
from kvformats.formats import Fp8DsMla, Fp8Indexer, Mxfp4Indexer
from kvformats.layout import storage_bytes
from kvformats.transfer import RequestPages, load_tier, offload, restore, save_tier
from kvformats.transfer.tiers_file import TIER_KEY

pytest.importorskip("safetensors")


def filled(layout, pages: int, seed: int = 0) -> torch.Tensor:
    """A cache of random bytes (every byte of every page, so a stray write shows)."""
    cache = layout.allocate(pages)
    raw = storage_bytes(cache)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8))
    return cache


def source(rows=(3, 70)):
    """Two caches of one request (fp8_ds_mla with pages of 16 rows, the MXFP4 indexer) and the
    rows to offload."""
    kv, idx = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16), Mxfp4Indexer(head_dim=128, page_size=16)
    caches = {"kv": RequestPages(kv, filled(kv, 8, 1), torch.tensor([5, 2, 7, 0, 3])),
              "index": RequestPages(idx, filled(idx, 8, 2), torch.tensor([1, 6, 4, 0, 2]))}
    return caches, {"kv": rows, "index": (0, 20)}


def destination(kv=None, idx=None, kv_pages=(9, 1, 4, 6, 2, 0, 8, 3, 5), idx_pages=(3, 1, 0)):
    """The same caches at pages of 8 rows: 10 pages each, the request's given."""
    kv = kv or Fp8DsMla(head_dim=128, rope_dim=64, page_size=8)
    idx = idx or Mxfp4Indexer(head_dim=128, page_size=8)
    return {"kv": RequestPages(kv, filled(kv, 10, 3), torch.tensor(kv_pages)),
            "index": RequestPages(idx, filled(idx, 10, 4), torch.tensor(idx_pages))}


def snapshot(caches) -> dict:
    return {name: storage_bytes(w.cache).clone() for name, w in caches.items()}


def unchanged(caches, before) -> bool:
    return all(torch.equal(storage_bytes(w.cache), before[name]) for name, w in caches.items())


def test_a_good_restore_moves_exactly_the_rows():
    """The baseline the errors are measured against: row i of the source at the request's row i
    of the destination, every other byte untouched."""
    src, rows = source()
    dst = destination()
    before = snapshot(dst)
    restore(offload(src, rows), dst)
    for name, (start, stop) in rows.items():
        s, d = src[name], dst[name]
        i = torch.arange(start, stop)
        s_slots = s.pages[i // s.layout.page_size] * s.layout.page_size + i % s.layout.page_size
        d_slots = d.pages[i // d.layout.page_size] * d.layout.page_size + i % d.layout.page_size
        assert torch.equal(s.layout.gather(s.cache, s_slots), d.layout.gather(d.cache, d_slots))
        others = torch.ones(d.cache.shape[0] * d.layout.page_size, dtype=torch.bool)
        others[d_slots] = False
        keep = others.nonzero().squeeze(1)
        assert torch.equal(d.layout.gather(d.cache, keep), d.layout.gather(destination()[name].cache, keep))
    assert not unchanged(dst, before)


@pytest.mark.parametrize("other", [
    pytest.param(dict(kv=Fp8DsMla(head_dim=128, rope_dim=64, page_size=8, profile="flashmla-ref")),
                 id="same-record-other-profile"),
    pytest.param(dict(idx=Fp8Indexer(head_dim=128, page_size=8)), id="other-indexer-record"),
    pytest.param(dict(kv=Fp8DsMla(head_dim=192, rope_dim=64, page_size=8)), id="other-head-size"),
])
def test_restore_into_a_pool_of_another_record_is_refused(other):
    src, rows = source()
    tier = offload(src, rows)
    dst = destination(**other)
    before = snapshot(dst)
    with pytest.raises(HandshakeError, match="nothing was restored") as err:
        restore(tier, dst)
    assert "record" in str(err.value)
    assert unchanged(dst, before)


def test_another_record_of_the_same_bytes_per_token_is_refused_naming_both():
    """The V4.1 528 B record page-planar and token-interleaved: same size, the bytes elsewhere."""
    planar, interleaved = get_format("fp8_ds_mla_v41", page_size=8), get_format("fp8_ds_mla_v41_interleaved",
                                                                                page_size=8)
    src = {"kv": RequestPages(planar, filled(planar, 4, 1), torch.tensor([2, 0]))}
    tier = offload(src, {"kv": (0, 12)})
    dst = {"kv": RequestPages(interleaved, filled(interleaved, 4, 2), torch.tensor([1, 3]))}
    before = snapshot(dst)
    with pytest.raises(HandshakeError, match="same bytes per token, another record") as err:
        restore(tier, dst)
    assert "dsv41-fp8-528-planar" in str(err.value) and "dsv41-fp8-528-interleaved" in str(err.value)
    assert unchanged(dst, before)


@pytest.mark.parametrize("pages,match", [
    (dict(kv_pages=(9, 1, 4, 6, 2, 0, 8, 3, 10)), "outside the cache's 10 pages"),
    (dict(kv_pages=(9, 1, 4, -1, 2, 0, 8, 3, 5)), "outside the cache's 10 pages"),
    (dict(kv_pages=(9, 1, 4, 6, 1, 0, 8, 3, 5)), "overlapping slots"),
    (dict(kv_pages=(9, 1, 4, 6, 2, 0, 8, 3)), "past the request's 8 pages"),
    (dict(idx_pages=(3, 1, 10)), "cache 'index': page id 10"),
], ids=["out-of-range", "negative", "overlapping", "past-capacity", "second-cache"])
def test_bad_destination_pages_are_refused_before_any_write(pages, match):
    """Nothing of either cache is written: the last case's bad pages are the second cache's,
    the first cache's pages are fine and still untouched."""
    src, rows = source()
    tier = offload(src, rows)
    dst = destination(**pages)
    before = snapshot(dst)
    with pytest.raises(InputError, match=match):
        restore(tier, dst)
    assert unchanged(dst, before)


def test_a_repeated_page_is_fine_where_its_rows_are_used_once():
    """A ring table repeats page ids; only rows falling on one slot twice are an overlap."""
    src, rows = source(rows=(60, 70))  # request pages 7 and 8 of 8 rows
    dst = destination(kv_pages=(9, 9, 9, 9, 9, 9, 1, 4, 6))
    restore(offload(src, rows), dst)


def test_corrupted_host_rows_are_caught_before_any_write():
    src, rows = source()
    tier = offload(src, rows)
    tier.caches["kv"].rows[40, 130] ^= 1  # a RoPE byte of request row 43
    dst = destination()
    before = snapshot(dst)
    with pytest.raises(IntegrityError, match=r"cache 'kv': rows 3\.\.66 differ in region 'rope'"):
        restore(tier, dst)
    assert unchanged(dst, before)


def test_bad_arguments_are_typed_errors():
    src, rows = source()
    tier = offload(src, rows)
    dst = destination()
    before = snapshot(dst)
    with pytest.raises(InputTypeError):
        restore({"kv": tier.caches["kv"]}, dst)
    with pytest.raises(InputTypeError):
        restore(tier, {"kv": (dst["kv"].layout, dst["kv"].cache), "index": dst["index"]})
    with pytest.raises(InputError, match="does not name"):
        restore(tier, {"kv": dst["kv"]})
    with pytest.raises(InputTypeError, match="pages must be"):
        restore(tier, {**dst, "kv": RequestPages(dst["kv"].layout, dst["kv"].cache, [9, 1, 4])})
    assert unchanged(dst, before)
    with pytest.raises(InputError, match="start <= stop"):
        offload(src, {"kv": (5, 2)})
    with pytest.raises(InputError, match="not among the caches"):
        offload(src, {"other": (0, 1)})


# ----- files -----------------------------------------------------------------------------------
def read_header(path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_header(path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def edit_metadata(path, key: str, edit) -> None:
    header, data = read_header(path)
    meta = json.loads(header["__metadata__"][key])
    edit(meta)
    header["__metadata__"][key] = json.dumps(meta)
    write_header(path, header, data)


@pytest.fixture
def tier_file(tmp_path):
    src, rows = source()
    path = tmp_path / "tier.kvc"
    save_tier(path, offload(src, rows))
    return path


def test_a_file_tier_round_trips(tier_file):
    src, rows = source()
    want = offload(src, rows)
    got = load_tier(tier_file)
    for name, held in want.caches.items():
        assert torch.equal(got.caches[name].rows, held.rows) and torch.equal(got.caches[name].checksums,
                                                                               held.checksums)
        assert (got.caches[name].start, got.caches[name].stop) == (held.start, held.stop)


def _record_name(meta):
    meta["tensors"]["kv"]["record"]["name"] = "dsv41-fp8-528-planar"


def _manifest_params(meta):
    meta["caches"]["index"]["params"]["profile"] = "vllm"


def _manifest_record(meta):
    meta["caches"]["kv"]["record"]["bytes_per_token"] = 528


@pytest.mark.parametrize("key,edit,error,match", [
    ("kvformats", _record_name, RecordMismatchError, "claims the format fp8_ds_mla"),
    (TIER_KEY, _manifest_params, RecordMismatchError, "in the manifest but"),
    (TIER_KEY, _manifest_record, RecordMismatchError, "the tier's cache 'kv' claims fp8_ds_mla"),
    (TIER_KEY, lambda m: m["caches"]["kv"].update(stop=200), CacheFileError, "do not fit"),
    (TIER_KEY, lambda m: m["caches"]["kv"].update(checksums=[[1, 2]]), CacheFileError, "checksums must be"),
    (TIER_KEY, lambda m: m.update(version=9), CacheFileError, "corrupt tier manifest"),
], ids=["file-record", "manifest-params", "manifest-record", "manifest-rows", "manifest-checksums", "version"])
def test_a_file_whose_identity_does_not_match_is_refused(tier_file, key, edit, error, match):
    edit_metadata(tier_file, key, edit)
    dst = destination()
    before = snapshot(dst)
    with pytest.raises(error, match=match):
        restore(load_tier(tier_file), dst)
    assert unchanged(dst, before)


def test_a_file_whose_bytes_do_not_match_its_checksums_is_refused(tier_file):
    header, data = read_header(tier_file)
    start = header["kv"]["data_offsets"][0]
    data = bytearray(data)
    data[start + 1000] ^= 0x40  # a NoPE byte of the first packed page (row 5)
    write_header(tier_file, header, bytes(data))
    dst = destination()
    before = snapshot(dst)
    with pytest.raises(IntegrityError, match=r"cache 'kv': rows 3\.\.66 differ in region 'nope'"):
        restore(load_tier(tier_file), dst)
    assert unchanged(dst, before)


def test_a_cache_file_without_a_tier_is_refused(tmp_path):
    from kvformats.caches.files import save_caches

    kv = Fp8DsMla(head_dim=128, rope_dim=64, page_size=16)
    save_caches(tmp_path / "plain.kvc", {"kv": (kv, filled(kv, 2))})
    with pytest.raises(CacheFileError, match="holds no tier"):
        load_tier(tmp_path / "plain.kvc")
