"""Cache files that lie, paths that are not files, outputs that cannot be written (issue #25):
every one is refused with a typed error, or one line and exit status 2 from the CLI."""

from __future__ import annotations

import json
import os
import stat
import struct
import sys

import pytest
import torch

import kvformats as kvf
from kvformats.caches.files import load_cache, load_caches, read_metadata, save_cache, save_caches
from kvformats.cli import main
from kvformats.errors import (BackendUnavailableError, CacheFileError, CacheWriteError, InputError, InputTypeError,
                              KVFormatError, OutputError)


def rewrite_metadata(src, dst, edit):
    """Copy the cache file ``src`` to ``dst`` with its kvformats metadata changed by ``edit``
    (called with the parsed metadata; a str it returns replaces the metadata text)."""
    data = open(src, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = json.loads(header["__metadata__"]["kvformats"])
    text = edit(meta)
    header["__metadata__"]["kvformats"] = text if isinstance(text, str) else json.dumps(meta)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    return dst


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_line_usage_error(code, out, err):
    return code == 2 and out == "" and err.startswith("kvformats: error: ") and err.count("\n") == 1


@pytest.fixture
def good(tmp_path):
    """A 2-page fp8_ds_mla page_size=2 cache file (1728-byte pages) with a few rows written."""
    layout = kvf.Fp8DsMla(page_size=2)
    cache = layout.allocate(2)
    layout.encode(torch.randn(3, 512, generator=torch.Generator().manual_seed(0)), cache, torch.arange(3))
    path = tmp_path / "good.safetensors"
    save_cache(path, layout, cache)
    return path


def set_entry(key, value):
    def edit(meta):
        if value is KeyError:
            del meta["tensors"]["cache"][key]
        else:
            meta["tensors"]["cache"][key] = value
    return edit


# ----- item 1: metadata is validated, not trusted ----------------------------------------------
@pytest.mark.parametrize("stride", [1000, 1, 0, -1728, 1.5, 1728.0, True, "1728", None, [1728], 2**28, 2**70])
def test_bad_page_strides_are_refused(good, tmp_path, capsys, stride):
    bad = rewrite_metadata(good, tmp_path / "bad.safetensors", set_entry("page_stride", stride))
    with pytest.raises(CacheFileError, match="page_stride"):
        load_caches(bad)
    for argv in (["check", bad], ["dump", bad, "--page", "1"], ["diff", bad, bad]):
        assert one_line_usage_error(*run(capsys, *argv)), argv


def test_a_huge_page_stride_allocates_nothing_and_max_arena_bytes_lets_it_through(good, tmp_path):
    # 2**20 elements of stride for 3456 stored bytes: refused by default, loaded when allowed
    bad = rewrite_metadata(good, tmp_path / "wide.safetensors", set_entry("page_stride", 2**20))
    with pytest.raises(CacheFileError, match="max_arena_bytes"):
        load_caches(bad)
    entry = load_cache(bad, max_arena_bytes=2**21)
    assert entry.cache.stride(0) == 2**20
    assert torch.equal(entry.cache, load_cache(good).cache)
    # a padded stride within the default limit keeps loading as before
    ok = rewrite_metadata(good, tmp_path / "padded.safetensors", set_entry("page_stride", 3000))
    assert load_cache(ok).cache.stride(0) == 3000
    # pages back to back need no arena, whatever the limit; the limit itself is checked
    assert load_cache(good, max_arena_bytes=0).cache.shape == (2, 1728)
    with pytest.raises(CacheFileError, match="limit 0"):
        load_cache(ok, max_arena_bytes=0)
    for bad_limit in (-1, 1.5, True, "1"):
        with pytest.raises(InputError, match="max_arena_bytes"):
            load_caches(good, max_arena_bytes=bad_limit)


@pytest.mark.parametrize("key,value,match", [
    ("page_stride", KeyError, "lacks the field 'page_stride'"),
    ("shape", KeyError, "lacks the field 'shape'"),
    ("format", KeyError, "lacks the field 'format'"),
    ("params", KeyError, "lacks the field 'params'"),
    ("fingerprint", KeyError, "lacks the field 'fingerprint'"),
    ("shape", [2, 1729], "records shape"),
    ("shape", [2, 1728.0], "'shape'"),
    ("shape", [True, 1728], "'shape'"),
    ("shape", "2x1728", "'shape'"),
    ("format", 7, "'format'"),
    ("format", "no_such_format", "does not know"),
    ("params", [1, 2], "'params'"),
    ("params", {"head_dim": 512, "rope_dim": 64, "page_size": 2.0, "profile": "tokenspeed"}, "page_size"),
    ("params", {"head_dim": 512, "rope_dim": 64, "page_size": True, "profile": "tokenspeed"}, "page_size"),
    ("params", {"head_dim": 512, "rope_dim": 64, "page_size": 2, "profile": 3}, "profile"),
    ("params", {"head_dim": 512, "rope_dim": 64, "page_size": "2", "profile": "tokenspeed"}, "page_size"),
    ("params", {"head_dim": 512, "rope_dim": 64, "page_size": 2, "profile": "tokenspeed", "x": 1}, "cannot build"),
    ("fingerprint", None, "'fingerprint'"),
])
def test_every_entry_field_is_checked(good, tmp_path, capsys, key, value, match):
    bad = rewrite_metadata(good, tmp_path / "bad.safetensors", set_entry(key, value))
    with pytest.raises(CacheFileError, match=match):
        load_caches(bad)
    assert one_line_usage_error(*run(capsys, "check", bad))


@pytest.mark.parametrize("edit", [
    lambda m: m.pop("tensors"),
    lambda m: m.update(tensors=[]),
    lambda m: m.update(tensors={"cache": 5}),
    lambda m: m.pop("spec_version"),
    lambda m: m.update(library_version=1),
    lambda m: "[1, 2]",
    lambda m: "not json",
])
def test_file_level_metadata_is_checked(good, tmp_path, edit):
    bad = rewrite_metadata(good, tmp_path / "bad.safetensors", edit)
    with pytest.raises(CacheFileError, match="metadata"):
        read_metadata(bad)


def test_a_stored_tensor_of_another_dtype_is_refused(tmp_path):
    from safetensors.torch import save_file

    layout = kvf.Fp8Indexer(page_size=4)
    good = tmp_path / "good.safetensors"
    save_cache(good, layout, layout.allocate(2))
    meta = read_metadata(good)
    save_file({"cache": torch.zeros(2, 528, dtype=torch.int8)}, str(tmp_path / "i8.safetensors"),
              metadata={"kvformats": json.dumps(meta)})
    with pytest.raises(CacheFileError, match="stored as I8"):
        load_caches(tmp_path / "i8.safetensors")


# ----- item 14: deeply nested metadata ----------------------------------------------------------
def test_deeply_nested_metadata_is_a_cache_file_error(good, tmp_path, capsys):
    deep = rewrite_metadata(good, tmp_path / "deep.safetensors", lambda m: "[" * 100_000 + "]" * 100_000)
    with pytest.raises(CacheFileError, match="nested too deeply"):
        load_caches(deep)
    for argv in (["check", deep], ["dump", deep], ["diff", deep, good]):
        assert one_line_usage_error(*run(capsys, *argv)), argv


# ----- item 3: reserved and bad names at save time ---------------------------------------------
def test_reserved_and_bad_names_are_refused_before_writing(tmp_path):
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(1)
    for name, error in (("__metadata__", InputError), ("", InputError), (3, InputError)):
        with pytest.raises(error, match="reserved" if name == "__metadata__" else "non-empty strings"):
            save_caches(tmp_path / "x.safetensors", {name: (layout, cache)})
        assert not (tmp_path / "x.safetensors").exists()
    with pytest.raises(InputTypeError):
        save_caches(tmp_path / "x.safetensors", {"a": (cache, layout)})
    with pytest.raises(InputTypeError):
        save_caches(tmp_path / "x.safetensors", [("a", (layout, cache))])


def test_one_cache_under_two_names_saves_and_loads(tmp_path):
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(2)
    save_caches(tmp_path / "two.safetensors", {"a": (layout, cache), "b": (layout, cache)})
    assert sorted(load_caches(tmp_path / "two.safetensors")) == ["a", "b"]


# ----- item 13 (API): unwritable cache files ---------------------------------------------------
def test_unwritable_cache_files_raise_a_typed_error(tmp_path, monkeypatch):
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(1)
    (tmp_path / "file").write_text("x")
    for target, match in ((tmp_path, "is a directory"), (tmp_path / "missing" / "c.safetensors", "does not exist"),
                          (tmp_path / "file" / "c.safetensors", "is not a directory")):
        with pytest.raises(CacheWriteError, match=match) as info:
            save_cache(target, layout, cache)
        assert isinstance(info.value, CacheFileError) and isinstance(info.value, OutputError)
        assert isinstance(info.value, OSError)
    # whatever safetensors itself raises while writing becomes the same typed error
    import safetensors.torch

    def failing(*args, **kwargs):
        raise safetensors.SafetensorError("Error while serializing: I/O error: disk full")

    monkeypatch.setattr(safetensors.torch, "save", failing)
    with pytest.raises(CacheWriteError, match="disk full"):
        save_cache(tmp_path / "full.safetensors", layout, cache)


# ----- issue 35 item 1: cache files are written to their path, never put in its place -----------
def test_a_symlinked_destination_is_written_through(tmp_path):
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(1)
    target, link = tmp_path / "target.safetensors", tmp_path / "link.safetensors"
    target.write_text("old")
    os.symlink(target.name, link)
    save_cache(link, layout, cache)
    assert os.path.islink(link) and os.readlink(link) == target.name
    assert torch.equal(load_cache(target).cache, cache)


@pytest.mark.parametrize("kind", ["FIFO", "broken link"])
def test_destinations_that_are_not_regular_files_are_refused(tmp_path, capsys, kind):
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(1)
    path = tmp_path / "dest"
    if kind == "FIFO":
        os.mkfifo(path)
        said = "is a FIFO"
    else:
        os.symlink(tmp_path / "gone", path)
        said = "symbolic link to a missing file"
    for call in (lambda: save_cache(path, layout, cache), lambda: save_caches(path, {"c": (layout, cache)})):
        with pytest.raises(CacheWriteError, match=said):
            call()
    code, out, err = run(capsys, "demo", "--rows", "1", "--save", path)
    assert one_line_usage_error(code, out, err) and said in err
    assert (stat.S_ISFIFO(os.lstat(path).st_mode) if kind == "FIFO" else os.path.islink(path))
    assert not (tmp_path / "gone").exists()


def test_new_cache_files_honour_the_umask_and_old_ones_keep_their_mode(tmp_path):
    layout = kvf.Fp8Indexer(page_size=4)
    cache = layout.allocate(1)
    before = os.umask(0o022)
    try:
        save_cache(tmp_path / "a.safetensors", layout, cache)
        os.umask(0o077)
        save_cache(tmp_path / "b.safetensors", layout, cache)
        (tmp_path / "c.safetensors").write_text("old")
        os.chmod(tmp_path / "c.safetensors", 0o640)
        save_cache(tmp_path / "c.safetensors", layout, cache)
    finally:
        os.umask(before)
    modes = [os.stat(tmp_path / f"{n}.safetensors").st_mode & 0o777 for n in "abc"]
    assert modes == [0o644, 0o600, 0o640]
    assert torch.equal(load_cache(tmp_path / "c.safetensors").cache, cache)


# ----- issue 35 item 2: device= is a device, and one that is here ------------------------------
@pytest.mark.parametrize("device", [True, 3.5, 0.0, torch.float64, [0]])
def test_a_device_that_is_not_a_device_is_refused(good, device):
    # Tensor.to reads True / 3.5 / 0.0 as a dtype: the cache came back as bool or float64
    for load in (load_caches, load_cache):
        with pytest.raises(InputTypeError, match="device must be a torch.device"):
            load(good, device=device)


def test_an_unavailable_device_is_named_as_such(good, monkeypatch):
    with pytest.raises(InputError, match="'gpu' is not a device"):
        load_caches(good, device="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only torch
    with pytest.raises(BackendUnavailableError, match="'cuda' is not available: no CUDA device"):
        load_cache(good, device="cuda")
    entry = load_cache(good, device=torch.device("cpu"))
    assert entry.cache.dtype == torch.uint8 and entry.cache.device.type == "cpu"


# ----- item 16: what a path is, missing fields, expect= ----------------------------------------
@pytest.mark.parametrize("kind", ["directory", "character device", "FIFO", "broken link"])
def test_paths_that_are_not_files_say_what_they_are(tmp_path, capsys, kind):
    if kind == "directory":
        path, said = tmp_path, "is a directory"
    elif kind == "character device":
        path, said = "/dev/zero", "is a character device"
    elif kind == "FIFO":
        path, said = tmp_path / "fifo", "is a FIFO"
        os.mkfifo(path)
    else:
        path, said = tmp_path / "link", "symbolic link to a missing file"
        os.symlink(tmp_path / "gone", path)
    with pytest.raises(CacheFileError, match=said):
        load_caches(path)
    code, out, err = run(capsys, "check", path)
    assert one_line_usage_error(code, out, err) and said in err


def test_expect_takes_a_layout_or_a_format_name(good):
    assert list(load_caches(good, expect="fp8_ds_mla")) == ["cache"]
    assert list(load_caches(good, expect=kvf.Fp8DsMla(page_size=2))) == ["cache"]
    with pytest.raises(CacheFileError, match="expected fp8_indexer"):
        load_caches(good, expect="fp8_indexer")
    with pytest.raises(InputError, match="not a registered format"):
        load_caches(good, expect="fp9")
    with pytest.raises(InputTypeError, match="expect must be"):
        load_caches(good, expect=3)


def test_the_io_extra_is_named_when_it_is_missing(good, monkeypatch):
    for module in ("safetensors", "numpy"):
        with monkeypatch.context() as m:
            m.setitem(sys.modules, module, None)
            with pytest.raises(CacheFileError, match=r"pip install 'kvformats\[io\]'") as info:
                load_caches(good)
            assert module in str(info.value)


def test_library_errors_are_importable_from_errors_and_their_old_homes():
    import kvformats.codec.convert
    import kvformats.caches.files

    assert kvformats.caches.files.CacheFileError is CacheFileError
    assert kvformats.codec.convert.ConversionError.__module__ == "kvformats.errors"
    assert issubclass(CacheFileError, KVFormatError) and issubclass(CacheFileError, ValueError)


# ----- item 4: narrow pages and gaps between pages ---------------------------------------------
def narrow_cache(width, stride=None, gap_byte=0xAB, seed=0):
    """fp8_ds_mla page_size=2 (min page 1168 B, allocate gives 1728 B) with pages ``width``
    bytes wide, ``stride`` apart in an arena whose gap bytes are ``gap_byte``."""
    layout = kvf.Fp8DsMla(page_size=2)
    stride = stride or width
    arena = torch.full((2 * stride + width,), gap_byte, dtype=torch.uint8)
    cache = arena.as_strided((3, width), (stride, 1))
    cache.zero_()
    layout.encode(torch.randn(4, 512, generator=torch.Generator().manual_seed(seed)), cache, torch.arange(4))
    return layout, cache


@pytest.mark.parametrize("width,stride,pad", [(1168, None, 0), (1168, 1728, 0), (1400, None, 232),
                                              (1400, 2000, 232), (1728, 2500, 560)])
def test_views_cover_only_the_pad_inside_the_page(width, stride, pad):
    from kvformats.caches.check import check
    from kvformats.caches.diff import diff_caches
    from kvformats.caches.hexdump import page_lines

    layout, cache = narrow_cache(width, stride)
    views = layout.views(cache)
    assert views["page_pad"].shape == (3, pad)
    assert views["nope"].shape == (3, 2, 448) and views["scale"].shape == (3, 2, 7)
    assert (views["page_pad"] == 0).all()  # the gap's 0xAB bytes are never part of a view
    report = check(layout, cache)
    assert report["ok"], report
    other = narrow_cache(width, stride, gap_byte=0x11)[1]  # same pages, other gap bytes
    assert diff_caches(layout, cache, other)["equal"]
    lines = page_lines(layout, cache, 2)
    covered = sorted(o for ln in lines for o in range(ln["offset"], ln["offset"] + len(ln["hex"].split())))
    assert covered == list(range(min(width, layout.page_bytes)))


def test_narrow_page_files_work_in_every_command(tmp_path, capsys):
    layout, cache = narrow_cache(1168)
    save_cache(tmp_path / "n.safetensors", layout, cache)
    entry = load_cache(tmp_path / "n.safetensors")
    assert entry.cache.shape == (3, 1168)
    code, out, err = run(capsys, "check", tmp_path / "n.safetensors")
    assert code == 0 and err == "" and ": ok" in out
    code, out, err = run(capsys, "dump", tmp_path / "n.safetensors", "--page", 1)
    assert code == 0 and err == "" and "1168 B per page" in out and "page_pad" not in out
    code, out, err = run(capsys, "diff", tmp_path / "n.safetensors", tmp_path / "n.safetensors")
    assert code == 0 and out.startswith("equal")


def test_a_dirty_pad_inside_a_narrow_page_is_still_found():
    from kvformats.caches.check import check

    layout, cache = narrow_cache(1400, 2000)
    cache[1, 1399] = 1  # the last pad byte inside the page
    report = check(layout, cache)
    assert report["rules"]["pad_zero"]["first_pages"] == [1]


def test_diff_of_caches_with_different_page_widths_is_refused(tmp_path, capsys):
    from kvformats.caches.diff import diff_caches

    layout, narrow = narrow_cache(1168)
    wide = layout.allocate(3)
    wide[:, :1168] = narrow
    with pytest.raises(InputError, match="page width"):
        diff_caches(layout, narrow, wide)
    save_cache(tmp_path / "n.safetensors", layout, narrow)
    save_cache(tmp_path / "w.safetensors", layout, wide)
    assert one_line_usage_error(*run(capsys, "diff", tmp_path / "n.safetensors", tmp_path / "w.safetensors"))


# ----- items 17 and 21: the docs name every format and the io extra ---------------------------
def test_docs_index_links_every_format_and_the_tutorial_installs_the_io_extra(published_only):
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    index = (docs / "index.md").read_text()
    for name in kvf.list_formats():
        assert f"](reference/formats/{name}.md)" in index, name
    tutorial = (docs / "tutorial.md").read_text()
    install = next(line for line in tutorial.splitlines() if "pip install" in line and "-e" in line)
    assert "'.[io]'" in install  # the tutorial saves cache files, which need the io extra
    assert "Every command takes `--json`" not in tutorial  # spec, demo, docs and diagram do not
