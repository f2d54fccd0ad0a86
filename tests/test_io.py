"""Cache files: round trips of every format (strided pages too), and clear refusals."""

import json
import struct

import pytest
import torch

import kvformats as kvf
from kvformats.caches.files import CacheFileError, load_cache, load_caches, read_metadata, save_cache, save_caches


def small(name):
    """The format's declared small layout (``Layout.examples.small_params``)."""
    return kvf.get_format(name, **type(kvf.get_format(name)).examples.small_params)


def filled(layout, pages=3, page_stride=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = layout.allocate(pages, page_stride=page_stride)
    n = min(5, pages * layout.page_size)
    slots = torch.randperm(pages * layout.page_size, generator=g)[:n]
    if layout.name == "compressor_state":
        w = layout.width
        layout.encode((torch.randn(n, w, generator=g), torch.randn(n, w, generator=g)), cache, slots,
                      positions=torch.arange(n), ape=torch.randn(layout.ratio, w, generator=g))
    elif layout.name == "compressor_state_v41":
        w = layout.width
        layout.encode((torch.randn(n, w, generator=g), torch.randn(n, w, generator=g)), cache, slots)
    else:
        layout.encode(torch.randn(n, layout.head_dim, generator=g), cache, slots)
    return cache


@pytest.mark.parametrize("name", kvf.list_formats())
@pytest.mark.parametrize("padded", [False, True])
def test_round_trip_keeps_bytes_and_page_stride(tmp_path, name, padded):
    layout = small(name)
    page = layout.cache_shape(1)[1:]
    elems = page[0] if len(page) == 1 else page[0] * page[1]
    stride = elems + 24 if padded else None
    cache = filled(layout, page_stride=stride)
    save_cache(tmp_path / "c.safetensors", layout, cache)
    entry = load_cache(tmp_path / "c.safetensors")
    assert entry.layout == layout
    assert entry.cache.stride() == cache.stride()
    assert torch.equal(entry.cache.view(torch.uint8) if entry.cache.dtype != torch.uint8 else entry.cache,
                       cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache)


def test_many_layers_in_one_file(tmp_path):
    a, b = kvf.Fp8DsMla(page_size=2), kvf.Mxfp4Indexer(page_size=4)
    ca, cb = filled(a), filled(b, seed=1)
    save_caches(tmp_path / "m.safetensors", {"layer0.swa": (a, ca), "layer0.indexer": (b, cb)})
    got = load_caches(tmp_path / "m.safetensors")
    assert sorted(got) == ["layer0.indexer", "layer0.swa"]
    assert torch.equal(got["layer0.swa"].cache, ca) and torch.equal(got["layer0.indexer"].cache, cb)
    meta = read_metadata(tmp_path / "m.safetensors")
    assert meta["tensors"]["layer0.swa"]["format"] == "fp8_ds_mla"
    with pytest.raises(CacheFileError, match="holds 2 caches"):
        load_cache(tmp_path / "m.safetensors")
    with pytest.raises(CacheFileError, match="expected mxfp4_indexer"):
        load_caches(tmp_path / "m.safetensors", expect=b)


def _with_fingerprint(path, out, value: str) -> None:
    """A copy of the cache file ``path`` at ``out`` whose tensor 'cache' carries ``value``."""
    data = path.read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_len])
    meta = json.loads(header["__metadata__"]["kvformats"])
    meta["tensors"]["cache"]["fingerprint"] = value
    header["__metadata__"]["kvformats"] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + header_len:])


def test_a_file_written_before_a_region_rename_still_loads(tmp_path):
    """mxfp4_indexer's scale region was called 'scales' (same bytes); a file written then
    carries the fingerprint of that spec text, which still loads, with its bytes."""
    layout = kvf.Mxfp4Indexer()  # the default parameters: those of the spec file
    cache = filled(layout)
    path = tmp_path / "m.safetensors"
    save_cache(path, layout, cache)
    # sha256 of spec/formats/mxfp4_indexer.json at commit d049d6e, before the rename
    before = "60d5dacdd1da2cf27bfb65492330b4a0666ed676faa40cf1761909cc628c557c"
    _with_fingerprint(path, tmp_path / "old.safetensors", before)
    entry = load_caches(tmp_path / "old.safetensors")["cache"]
    assert entry.layout == layout and torch.equal(entry.cache, cache)
    _with_fingerprint(path, tmp_path / "bad.safetensors", before[::-1])
    with pytest.raises(CacheFileError, match="different definition"):
        load_caches(tmp_path / "bad.safetensors")


def test_rewording_the_spec_keeps_files_loadable(tmp_path, monkeypatch):
    """Issue 35 item 3: the fingerprint covers what defines the bytes, not the spec's prose."""
    from kvformats.spec import formats

    layout = kvf.Fp8DsMla(page_size=4)
    cache = filled(layout)
    save_cache(tmp_path / "c.safetensors", layout, cache)
    before = formats.spec_text(layout)
    monkeypatch.setattr(formats, "ADDRESSING", formats.ADDRESSING + " (reworded)")
    assert formats.spec_text(layout) != before
    assert torch.equal(load_cache(tmp_path / "c.safetensors").cache, cache)
    spec = formats.format_spec(layout)
    spec["regions"][0]["doc"] = "another doc"
    spec["numerics"]["profile"]["source"] = "another citation"
    assert formats.byte_definition(spec) == formats.byte_definition(formats.format_spec(layout))
    spec["regions"][0]["row_stride"] += 1  # a byte moves: another definition
    assert formats.byte_definition(spec) != formats.byte_definition(formats.format_spec(layout))


def test_files_written_before_fingerprints_left_the_prose_out_still_load(tmp_path):
    """Files written until now carry the sha256 of the spec text: today's text for any
    parameters, and the committed texts from before the citation changes (same bytes)."""
    import hashlib

    from kvformats.spec.formats import spec_text

    layout = kvf.Fp8Indexer(page_size=4)  # not the default: its text was never committed
    cache = filled(layout)
    path = tmp_path / "c.safetensors"
    save_cache(path, layout, cache)
    _with_fingerprint(path, tmp_path / "text.safetensors", hashlib.sha256(spec_text(layout).encode()).hexdigest())
    assert torch.equal(load_caches(tmp_path / "text.safetensors")["cache"].cache, cache)
    # sha256 of spec/formats/<name>.json at aa57739 (before the citation change 36abca0) and cb170ec
    former = {"fp8_indexer": ["e46a57e88493f6c13806d5c0027cb3785d34452b5a834ce16d86d40c3e239eac",
                              "9be31a4186072ff31155750da959a70a0d10fa6fb33b82e6f6b26eef272a8030"],
              "fp8_ds_mla_v32": ["c2e6ab7d10b1a12763897030bd8ad7b14555cda34ff919064de0f1689a66dac4"]}
    for name, digests in former.items():
        layout = kvf.get_format(name)
        cache = filled(layout, pages=1)
        save_cache(path, layout, cache)
        for digest in digests:
            _with_fingerprint(path, tmp_path / "old.safetensors", digest)
            entry = load_caches(tmp_path / "old.safetensors")["cache"]
            assert entry.layout == layout and torch.equal(entry.cache, cache)
    # fp8_ds_mla at aa57739: its tokenspeed profile read a 0xFF scale as NaN then, +Inf now
    layout = kvf.Fp8DsMla()
    save_cache(path, layout, filled(layout, pages=1))
    _with_fingerprint(path, tmp_path / "old.safetensors",
                      "a292785536b6a51266c8302b77c8a5b92679092e9b022c780f8a6b17cbf5865e")
    with pytest.raises(CacheFileError, match="different definition"):
        load_caches(tmp_path / "old.safetensors")


def test_missing_truncated_foreign_and_tampered_files(tmp_path):
    layout = kvf.Fp8Indexer(page_size=4)
    path = tmp_path / "c.safetensors"
    save_cache(path, layout, filled(layout))
    with pytest.raises(CacheFileError, match="no such cache file"):
        load_caches(tmp_path / "nope.safetensors")
    data = path.read_bytes()
    for cut in (4, 20, len(data) // 2, len(data) - 1):
        (tmp_path / "t.safetensors").write_bytes(data[:cut])
        with pytest.raises(CacheFileError):
            load_caches(tmp_path / "t.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CacheFileError):
        load_caches(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(3)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(CacheFileError, match="not a kvformats cache file"):
        load_caches(tmp_path / "foreign.safetensors")
    # a fingerprint that does not match this library's definition is refused
    _with_fingerprint(path, tmp_path / "fp.safetensors", "0" * 64)
    with pytest.raises(CacheFileError, match="different definition"):
        load_caches(tmp_path / "fp.safetensors")
