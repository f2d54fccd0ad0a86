"""Cache files: save and load caches (one or many layers, any format) as safetensors.

The file's metadata records, per tensor, the format name, its parameters, the page stride, a
fingerprint of the format's byte definition (its spec JSON without the prose) and the record
identity (``kvformats.codec.records``: record name, version, layout kind, bytes per token, head
size); loading rebuilds the layout and refuses a file whose fingerprint is not one this library
accepts for that format (``kvformats.spec.formats.accepted_fingerprints``) or whose record
identity is not the format's (``RecordMismatchError``: a 528 B page-planar record is not the
528 B token-interleaved one). Files written before identities were recorded load with the
identity their format gives. A file written here is plain safetensors: other tools read the raw
pages.

Nothing in a file is trusted: every metadata field is checked for its type (exact ints, never
bools or floats), its range and its agreement with the tensor and the format, and a file can
make the loader allocate at most ``MAX_ARENA_FACTOR`` times the bytes of its tensor data (a
wider page stride needs ``max_arena_bytes=``). Every problem is a ``CacheFileError``.
Needs the ``io`` extra: ``pip install 'kvformats[io]'`` (safetensors and numpy).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Mapping

import attrs
import torch

from kvformats.errors import (CacheFileError, CacheWriteError, InputError, InputTypeError, KVFormatError, OutputError,
                              RecordMismatchError, describe)
from kvformats.codec.records import accepted_identities, identity_label, identity_problem, record_of
from kvformats.codec.registry import get_format, list_formats
from kvformats.layout import Layout
from kvformats.numerics.profiles import SUCCESSORS

__all__ = ["CacheEntry", "CacheFileError", "CacheWriteError", "MAX_ARENA_FACTOR", "RESERVED_NAMES",
           "RecordMismatchError", "cache_file_destination", "io_available", "load_cache", "load_caches",
           "read_metadata", "save_cache", "save_caches", "writable_file", "write_text"]

META_KEY = "kvformats"
IO_HINT = "pip install 'kvformats[io]'"
# safetensors keeps the file's metadata under this key of its header: a tensor of that name
# would collide with it, and the file could never be read back.
RESERVED_NAMES = ("__metadata__",)
# A strided cache is restored into a zeroed arena of (pages - 1) * page_stride + page elements;
# by default that arena may be at most this many times the tensor bytes stored in the file.
MAX_ARENA_FACTOR = 2
_SAFETENSORS_DTYPES = {torch.uint8: "U8", torch.float32: "F32"}  # container dtype -> safetensors' name


@attrs.frozen
class CacheEntry:
    """One cache read from a file: its layout and the cache tensor (page stride restored)."""

    name: str
    layout: Layout
    cache: torch.Tensor


def _safetensors():
    try:
        import numpy  # noqa: F401 - safetensors.torch converts through numpy
        import safetensors
        import safetensors.torch  # noqa: F401
    except ImportError as err:
        missing = getattr(err, "name", None) or "safetensors"
        raise CacheFileError(f"cache files need the io extra ({missing} is not installed): {IO_HINT}") from None
    return safetensors


def io_available() -> bool:
    """Whether cache files can be read and written here (the ``io`` extra is installed)."""
    try:
        _safetensors()
    except CacheFileError:
        return False
    return True


# ----- writing ---------------------------------------------------------------------------------
def writable_file(path: str | os.PathLike, what: str = "file") -> str:
    """``path`` as a str if a file can be written there; OutputError naming the reason otherwise:
    a directory in its place, a missing parent directory, a parent that is not a directory, or
    no write permission. Nothing is created (so callers check before doing the work)."""
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise OutputError(f"cannot write the {what}: empty or non-text path {path!r}")
    if os.path.isdir(path):
        raise OutputError(f"cannot write the {what} {path}: it is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise OutputError(f"cannot write the {what} {path}: directory {parent} does not exist")
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write the {what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise OutputError(f"cannot write the {what} {path}: permission denied")
    return path


def write_text(path: str | os.PathLike, text: str, what: str = "file") -> str:
    """Write ``text`` to ``path`` (UTF-8); OutputError (naming the path and the reason) if it
    cannot be written. Returns the path as a str."""
    path = writable_file(path, what)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise OutputError(f"cannot write the {what} {path}: {err.strerror or err}") from None
    return path


def _page_elems(cache: torch.Tensor) -> int:
    n = 1
    for d in cache.shape[1:]:
        n *= d
    return n


# what a path that is not a regular file is, for the messages of the writer and the loader
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def cache_file_destination(path: str | os.PathLike) -> str:
    """``path`` as a str if a cache file can be written to it: a regular file (or a symbolic
    link to one, written through) or a new file in an existing directory. CacheWriteError
    otherwise (a FIFO, a device node, a socket, a link to nothing, ...), as the loader refuses
    them; nothing is created."""
    try:
        path = writable_file(path, "cache file")
    except OutputError as err:
        raise CacheWriteError(str(err)) from None
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise CacheWriteError(f"cannot write the cache file {path}: it is a symbolic link to a missing "
                                  f"file") from None
        return path
    except OSError as err:
        raise CacheWriteError(f"cannot write the cache file {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        kind = next((text for test, text in _KINDS if test(mode)), "not a regular file")
        raise CacheWriteError(f"cannot write the cache file {path}: it is {kind}, not a regular file")
    return path


def _write_through(path: str, data: bytes) -> None:
    """Write ``data`` into the file at ``path`` (following a symbolic link, keeping the file's
    mode and links; a new file gets 0666 less the umask). Non-blocking open and a check of what
    was opened: a FIFO or device put there since ``cache_file_destination`` is refused, not
    written."""
    flags = os.O_WRONLY | os.O_CREAT
    for name in ("O_NONBLOCK", "O_NOCTTY", "O_CLOEXEC"):  # POSIX flags (absent on Windows)
        flags |= getattr(os, name, 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        raise CacheWriteError(f"cannot write the cache file {path}: {err.strerror or err}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheWriteError(f"cannot write the cache file {path}: it is not a regular file")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as err:
        raise CacheWriteError(f"cannot write the cache file {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)


def save_caches(path: str | os.PathLike, caches: Mapping[str, tuple[Layout, torch.Tensor]]) -> None:
    """Write ``{name: (layout, cache)}`` to ``path`` (safetensors). Pages are stored contiguously;
    the page stride, format, parameters, fingerprint and record identity go into the metadata.

    Raises InputError / InputTypeError / LayoutError for bad arguments (a reserved or non-text
    name, a cache that does not fit its layout) and CacheWriteError (a CacheFileError and an
    OSError) when the file cannot be written; nothing is written then."""
    from kvformats.version import SPEC_VERSION, __version__
    from kvformats.spec.formats import fingerprint
    from kvformats.validation import check_cache

    if not isinstance(caches, Mapping):
        raise InputTypeError(f"caches must be a mapping {{name: (layout, cache)}}, got {describe(caches)}")
    tensors, entries, seen = {}, {}, set()
    for name, item in caches.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"cache names must be non-empty strings, got {name!r}")
        if name in RESERVED_NAMES:
            raise InputError(f"{name!r} is reserved by safetensors for the file's metadata; "
                             f"name the cache otherwise")
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Layout)):
            raise InputTypeError(f"caches[{name!r}] must be a (layout, cache) tuple, got {describe(item)}")
        layout, cache = item
        check_cache(layout, cache)
        tensor = cache.detach().to("cpu").contiguous()
        if tensor.numel() and tensor.untyped_storage().data_ptr() in seen:
            tensor = tensor.clone()  # safetensors refuses tensors that share memory
        if tensor.numel():
            seen.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
        # The stride of a cache of one page (or none) means nothing: record the page width.
        stride = cache.stride(0) if cache.shape[0] > 1 else _page_elems(cache)
        entries[name] = {"format": layout.name, "params": layout.params, "fingerprint": fingerprint(layout),
                         "page_stride": stride, "shape": list(cache.shape), "record": record_of(layout).identity()}
    meta = {"library_version": __version__, "spec_version": SPEC_VERSION, "tensors": entries}
    st = _safetensors()
    path = cache_file_destination(path)
    try:
        # serialized in memory, then written through the caller's path: safetensors' save_file
        # renames a private 0600 file over the path, replacing links and device nodes
        data = st.torch.save(tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    except Exception as err:  # safetensors' SafetensorError
        raise CacheWriteError(f"cannot write the cache file {path}: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}") from None
    _write_through(path, data)


def save_cache(path: str | os.PathLike, layout: Layout, cache: torch.Tensor, name: str = "cache") -> None:
    """Write one cache (see ``save_caches``)."""
    save_caches(path, {name: (layout, cache)})


# ----- reading ---------------------------------------------------------------------------------
def _check_regular_file(path: str) -> None:
    """CacheFileError unless ``path`` is a regular file (never opens it: a FIFO would block)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise CacheFileError(f"{path} is a symbolic link to a missing file, not a cache file") from None
        raise CacheFileError(f"no such cache file: {path}") from None
    except OSError as err:
        raise CacheFileError(f"cannot read the cache file {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        kind = next((text for test, text in _KINDS if test(mode)), "not a regular file")
        raise CacheFileError(f"{path} is {kind}, not a cache file")


def _exact_int(value) -> bool:
    return type(value) is int  # noqa: E721 - bools and floats are refused on purpose


def _field(path: str, where: str, entry: dict, key: str, kind: str):
    """``entry[key]`` checked for ``kind``: "str", "dict", "int>=0", "int>=1" or "shape"."""
    if key not in entry:
        raise CacheFileError(f"{path}: corrupt kvformats metadata: {where} lacks the field {key!r}")
    value = entry[key]
    ok = {"str": lambda v: isinstance(v, str),
          "dict": lambda v: isinstance(v, dict),
          "int>=0": lambda v: _exact_int(v) and v >= 0,
          "int>=1": lambda v: _exact_int(v) and v >= 1,
          "shape": lambda v: isinstance(v, list) and len(v) >= 2 and all(_exact_int(d) and d >= 0 for d in v),
          }[kind](value)
    if not ok:
        want = {"str": "a string", "dict": "a JSON object", "int>=0": "a non-negative integer",
                "int>=1": "a positive integer", "shape": "a list of at least two non-negative integers"}[kind]
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise CacheFileError(f"{path}: corrupt kvformats metadata: {where} field {key!r} must be {want}, "
                             f"got {shown}")
    return value


def _check_metadata(path: str, meta) -> dict:
    """The parsed metadata with every field's type checked (values are checked against the
    tensors and the formats by ``load_caches``)."""
    if not isinstance(meta, dict):
        raise CacheFileError(f"{path}: corrupt kvformats metadata: not a JSON object")
    for key in ("library_version", "spec_version"):
        _field(path, "the file", meta, key, "str")
    for name, entry in _field(path, "the file", meta, "tensors", "dict").items():
        where = f"tensor {name!r}"
        if not isinstance(entry, dict):
            raise CacheFileError(f"{path}: corrupt kvformats metadata: {where} is not a JSON object")
        _field(path, where, entry, "format", "str")
        _field(path, where, entry, "fingerprint", "str")
        params = _field(path, where, entry, "params", "dict")
        for key, value in params.items():
            if not (isinstance(value, str) or _exact_int(value)):
                raise CacheFileError(f"{path}: corrupt kvformats metadata: {where} parameter {key!r} must be an "
                                     f"integer or a string, got {value!r}")
        _field(path, where, entry, "page_stride", "int>=1")
        _field(path, where, entry, "shape", "shape")
        if "record" in entry:  # files written before record identities have none
            problem = identity_problem(entry["record"])
            if problem is not None:
                raise CacheFileError(f"{path}: corrupt kvformats metadata: {where}: {problem}")
    return meta


def read_metadata(path: str | os.PathLike) -> dict:
    """The kvformats metadata of a cache file, every field's type checked; CacheFileError if it
    is not one (missing, not a regular file, not safetensors, no or corrupt kvformats metadata)."""
    st = _safetensors()
    path = os.fspath(path)
    _check_regular_file(path)
    try:
        with st.safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # safetensors raises its own error types for truncated/corrupt headers
        raise CacheFileError(f"{path} is not a readable safetensors file ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if META_KEY not in meta:
        raise CacheFileError(f"{path} is a safetensors file but not a kvformats cache file "
                             f"(no {META_KEY!r} metadata); write it with kvformats.caches.files.save_caches")
    try:
        parsed = json.loads(meta[META_KEY])
    except RecursionError:
        raise CacheFileError(f"{path}: corrupt kvformats metadata (JSON nested too deeply)") from None
    except ValueError as err:
        raise CacheFileError(f"{path}: corrupt kvformats metadata ({err})") from None
    return _check_metadata(path, parsed)


def _layout_of(path: str, name: str, entry: dict) -> Layout:
    from kvformats.spec.formats import accepted_fingerprints, fingerprint

    fmt, params = entry["format"], entry["params"]
    if fmt not in list_formats():
        raise CacheFileError(f"{path}: tensor {name!r} declares the format {fmt!r}, which this kvformats does not "
                             f"know (it knows: {', '.join(list_formats())})")
    declared = {a.name: a.type for a in attrs.fields(type(get_format(fmt)))}
    for key, value in params.items():
        want = declared.get(key)
        if want in (int, "int") and not _exact_int(value) or want in (str, "str") and not isinstance(value, str):
            raise CacheFileError(f"{path}: tensor {name!r}: parameter {key!r} of {fmt} must be "
                                 f"{'an integer' if want in (int, 'int') else 'a string'}, got {value!r}")
    successor = SUCCESSORS.get(fmt, {}).get(params.get("profile"))
    if successor is not None:  # written with a retired profile: read with its successor's
        params = {**params, "profile": successor}
    try:
        layout = get_format(fmt, **params)
    except (KVFormatError, TypeError, ValueError) as err:
        raise CacheFileError(f"{path}: tensor {name!r} declares a format this kvformats cannot build "
                             f"({str(err).splitlines()[0]})") from None
    if entry["fingerprint"] not in accepted_fingerprints(layout):
        raise CacheFileError(f"{path}: tensor {name!r} was written with a different definition of {layout.name} "
                             f"(fingerprint {entry['fingerprint'][:64]!r}, this kvformats has "
                             f"{fingerprint(layout)!r}); "
                             f"read it with the kvformats version that wrote it")
    expected = record_of(layout).identity()
    if "record" in entry and entry["record"] not in accepted_identities(layout):
        same = entry["record"].get("bytes_per_token") == expected["bytes_per_token"]
        raise RecordMismatchError(f"{path}: tensor {name!r} claims the format {layout.name}, whose record is "
                                  f"{identity_label(expected)}, but its metadata records the record "
                                  f"{identity_label(entry['record'])}"
                                  f"{' (the same bytes per token, another record)' if same else ''}; "
                                  f"the file was not written by kvformats from this format, or was edited: "
                                  f"nothing was loaded")
    return layout


def _check_geometry(path: str, name: str, entry: dict, shape: list[int], itemsize: int,
                    max_arena_bytes: int | None) -> None:
    """The recorded shape and page stride agree with the stored tensor, and restoring the
    stride needs no more memory than allowed."""
    if list(entry["shape"]) != list(shape):
        raise CacheFileError(f"{path}: tensor {name!r}: the metadata records shape {entry['shape']} but the "
                             f"stored tensor has shape {list(shape)}")
    pages, page = shape[0], 1
    for d in shape[1:]:
        page *= d
    stride = entry["page_stride"]
    if stride < page:
        raise CacheFileError(f"{path}: tensor {name!r}: page_stride {stride} is smaller than a page "
                             f"({page} elements): pages would overlap")
    if pages <= 1 or stride == page:
        return  # no arena: a single page, or pages back to back, are restored as stored
    arena = ((pages - 1) * stride + page) * itemsize
    limit = MAX_ARENA_FACTOR * pages * page * itemsize if max_arena_bytes is None else max_arena_bytes
    if arena > limit:
        raise CacheFileError(f"{path}: tensor {name!r}: page_stride {stride} would restore {pages * page * itemsize} "
                             f"stored bytes into an arena of {arena} bytes (limit {limit}); pass "
                             f"max_arena_bytes= to load_caches to allow it")


def _restride(cache: torch.Tensor, page_stride: int, device) -> torch.Tensor:
    """A copy of ``cache`` whose page stride is ``page_stride`` (as it was when saved)."""
    page = cache[0].numel() if cache.shape[0] else 0
    if cache.shape[0] <= 1 or page_stride == page:
        return cache.to(device)
    arena = torch.zeros((cache.shape[0] - 1) * page_stride + page, dtype=cache.dtype, device=device)
    view = arena.as_strided(cache.shape, (page_stride, *cache[0].stride()))
    view.copy_(cache)
    return view


def _expected(expect):
    """``expect`` as a predicate on layouts (None: accept all) and its description."""
    if expect is None or isinstance(expect, Layout):
        return (lambda layout: expect is None or layout == expect), expect and f"{expect.name}{expect.params}"
    if isinstance(expect, str):
        if expect not in list_formats():
            raise InputError(f"expect={expect!r} is not a registered format; formats: {', '.join(list_formats())}")
        return (lambda layout: layout.name == expect), expect
    raise InputTypeError(f"expect must be a Layout, a format name or None, got {describe(expect)}")


def load_caches(path: str | os.PathLike, *, device=None, expect: Layout | str | None = None,
                max_arena_bytes: int | None = None) -> dict[str, CacheEntry]:
    """Read every cache in ``path`` -> ``{name: CacheEntry}``.

    ``device``: where to put the caches (None: the CPU); InputTypeError if it is not a device,
    BackendUnavailableError if it is not available here. ``expect``: a layout (refuse any
    tensor whose layout differs) or a format name (refuse any tensor of another format).
    ``max_arena_bytes``: the largest arena a cache with a padded page stride may be restored
    into (default ``MAX_ARENA_FACTOR`` times its stored bytes). Raises CacheFileError on any
    problem with the file."""
    from kvformats.runtime.deferred import available_device
    from kvformats.validation import check_cache

    accept, wanted = _expected(expect)
    if device is not None:  # Tensor.to would read True or 3.5 as a dtype and convert the cache
        device = available_device(device)
    if max_arena_bytes is not None and not (_exact_int(max_arena_bytes) and max_arena_bytes >= 0):
        raise InputError(f"max_arena_bytes must be a non-negative int or None, got {max_arena_bytes!r}")
    path = os.fspath(path)
    meta = read_metadata(path)
    st = _safetensors()
    out = {}
    try:
        with st.safe_open(path, framework="pt") as f:
            keys = set(f.keys())
            for name, entry in sorted(meta["tensors"].items()):
                layout = _layout_of(path, name, entry)
                if not accept(layout):
                    raise CacheFileError(f"{path}: tensor {name!r} holds {layout.name}{layout.params}, "
                                         f"expected {wanted}")
                if name not in keys:
                    raise CacheFileError(f"{path}: metadata names tensor {name!r} but the file has no such tensor")
                stored = f.get_slice(name)
                if stored.get_dtype() != _SAFETENSORS_DTYPES.get(layout.container_dtype):
                    raise CacheFileError(f"{path}: tensor {name!r} is stored as {stored.get_dtype()}, but a "
                                         f"{layout.name} cache is {layout.container_dtype}")
                itemsize = torch.empty((), dtype=layout.container_dtype).element_size()
                _check_geometry(path, name, entry, stored.get_shape(), itemsize, max_arena_bytes)
                cache = f.get_tensor(name)
                try:
                    check_cache(layout, cache)
                except KVFormatError as err:
                    raise CacheFileError(f"{path}: tensor {name!r} does not fit {layout.name}: "
                                         f"{str(err).splitlines()[0]}") from None
                out[name] = CacheEntry(name, layout, _restride(cache, entry["page_stride"], device))
    except CacheFileError:
        raise
    except Exception as err:  # truncated data sections surface here
        raise CacheFileError(f"{path}: cannot read tensor data ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''})") from None
    return out


def load_cache(path: str | os.PathLike, name: str | None = None, **kwargs) -> CacheEntry:
    """Read one cache; ``name`` may be omitted when the file holds exactly one."""
    caches = load_caches(path, **kwargs)
    if name is None:
        if len(caches) != 1:
            held = f"{len(caches)} caches ({', '.join(caches)}); name one" if caches else "no caches"
            raise CacheFileError(f"{path} holds {held}")
        return next(iter(caches.values()))
    if name not in caches:
        raise CacheFileError(f"{path} has no cache {name!r}; it holds: {', '.join(caches) or 'none'}")
    return caches[name]
