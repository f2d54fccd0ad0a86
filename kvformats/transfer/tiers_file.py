"""A tier in a cache file: ``save_tier`` / ``load_tier``.

The file is a kvformats cache file (``kvformats.caches.files``: safetensors, each cache's format,
parameters, fingerprint and record identity in the metadata, checked by ``load_caches``). Each
cache's rows, in request order, are packed into pages of its own layout (row i at page
``i // page_size``, row ``i % page_size``, scale records in that page's tail; fewer rows than
a page in one page of that many rows), so ``kvformats
check``, ``dump`` and ``diff`` read the file as any other. Rows kept in a cold record
(``kvformats.codec.cold``) are not a registered format: they are stored as plain uint8 tensors
``[rows, bytes]`` beside the caches. One more metadata key, ``kvformats.tiers`` (the manifest),
says per cache which rows the file holds, in which record (the cold codec's identity for cold
rows) and their checksums (``tiers_checksum``).

``load_tier`` trusts nothing: ``load_caches`` checks every cache against its format and record;
the manifest is checked for its types and against the caches it names (CacheFileError, or
RecordMismatchError where a record identity differs); the rows' checksums are compared
(IntegrityError naming the cache, rows and region). All before it returns, so a restore from a
file that does not match never starts.

Writing costs one more pass over the bytes than ``save_caches``: the file is written by
``save_caches``, then rewritten with the manifest and the cold rows added (the safetensors
header, which holds the metadata, precedes the data).
"""

from __future__ import annotations

import json
import os

import attrs
import torch

from kvformats.codec.cold import CODECS
from kvformats.codec.records import identity_label, record_of
from kvformats.codec.registry import get_format, list_formats
from kvformats.errors import CacheFileError, CacheWriteError, InputError, KVFormatError, RecordMismatchError
from kvformats.layout import Layout
from kvformats.transfer.tiers import HostTier, TierRows, check_tier, same_record, verify_rows
from kvformats.transfer.tiers_checksum import CHUNK_ROWS, checksum_rows
from kvformats.transfer.tiers_rows import place_rows

TIER_KEY = "kvformats.tiers"
TIER_VERSION = 1
COLD_SUFFIX = ".cold"  # the tensor name of a cache's cold rows


def _packed(layout: Layout, rows: torch.Tensor) -> tuple[Layout, torch.Tensor]:
    """``rows`` in pages of ``layout``, row i at slot i; fewer rows than a page go in one page
    of just that many (a compressor state's few rows in a page of 64 would be mostly zeros)."""
    if rows.shape[0] < layout.page_size:
        layout = attrs.evolve(layout, page_size=rows.shape[0])
    cache = layout.allocate(-(-rows.shape[0] // layout.page_size))
    place_rows(layout, cache, torch.arange(rows.shape[0]), rows)
    return layout, cache


def _sums_of(held: TierRows) -> torch.Tensor:
    """The rows' checksums: the tier's, or taken now where the offload skipped them."""
    return held.checksums if held.checksums is not None else checksum_rows(held.rows, held.spans)


def _manifest(tier: HostTier) -> dict:
    caches = {}
    for name, held in tier.caches.items():
        caches[name] = {"format": held.layout.name, "params": held.layout.params,
                        "record": record_of(held.layout).identity(), "start": held.start, "stop": held.stop,
                        "cold": held.cold.identity(held.layout) if held.cold is not None else None,
                        "chunk_rows": CHUNK_ROWS, "checksums": _sums_of(held).tolist()}
    return {"version": TIER_VERSION, "caches": caches}


def save_tier(path: str | os.PathLike, tier: HostTier) -> None:
    """Write ``tier`` to a cache file at ``path`` (module doc); waits for its host copies first.
    CacheWriteError when the file cannot be written."""
    import safetensors
    import safetensors.torch

    from kvformats.caches.files import META_KEY, save_caches

    tier = check_tier(tier)
    clash = sorted(n for n in tier.caches if n.endswith(COLD_SUFFIX) and n[:-len(COLD_SUFFIX)] in tier.caches)
    if clash:
        raise InputError(f"cache names {clash} end in {COLD_SUFFIX!r}, the file's name of another cache's cold rows; "
                         f"rename them")
    tier.wait()
    warm = {name: _packed(held.layout, held.rows) for name, held in tier.caches.items()
            if held.cold is None and held.stop > held.start}
    save_caches(path, warm)  # checks the path, the io extra and every cache; writes the kvformats metadata
    path = os.fspath(path)
    with safetensors.safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for name, held in tier.caches.items():
        if held.cold is not None and held.stop > held.start:
            tensors[name + COLD_SUFFIX] = held.rows.contiguous()
    data = safetensors.torch.save(tensors, metadata={META_KEY: meta[META_KEY], TIER_KEY: json.dumps(_manifest(tier))})
    try:
        with open(path, "wb") as out:
            out.write(data)
    except OSError as err:
        raise CacheWriteError(f"cannot write the cache file {path}: {err.strerror or err}") from None


# ----- reading ---------------------------------------------------------------------------------
def _bad(path: str, what: str) -> str:
    """The message of a corrupt manifest (raised as CacheFileError)."""
    return f"{path}: corrupt tier manifest: {what}"


def _int(path: str, where: str, entry: dict, key: str) -> int:
    v = entry.get(key)
    if type(v) is not int or v < 0:  # noqa: E721 - not a bool, not a float
        raise CacheFileError(_bad(path, f"{where} field {key!r} must be a non-negative integer, got {v!r}"))
    return v


def _manifest_of(path: str) -> dict:
    import safetensors  # load_caches found it

    with safetensors.safe_open(path, framework="pt") as f:
        text = (f.metadata() or {}).get(TIER_KEY)
    if text is None:
        raise CacheFileError(f"{path} is a cache file but holds no tier (no {TIER_KEY!r} metadata); "
                             f"write it with kvformats.transfer.save_tier")
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise CacheFileError(_bad(path, f"not JSON ({type(err).__name__})")) from None
    if not isinstance(manifest, dict) or manifest.get("version") != TIER_VERSION \
            or not isinstance(manifest.get("caches"), dict):
        raise CacheFileError(_bad(path, f"expected {{'version': {TIER_VERSION}, 'caches': {{...}}}}"))
    return manifest


def _layout_of(path: str, name: str, entry: dict) -> Layout:
    fmt, params = entry.get("format"), entry.get("params")
    if not isinstance(fmt, str) or fmt not in list_formats() or not isinstance(params, dict):
        raise CacheFileError(_bad(path, f"cache {name!r} names no known format: {fmt!r} {params!r}"))
    try:
        layout = get_format(fmt, **params)
    except (KVFormatError, TypeError, ValueError) as err:
        why = str(err).splitlines()[0]
        raise CacheFileError(_bad(path, f"cache {name!r}: {fmt} {params} cannot be built ({why})")) from None
    if entry.get("record") != record_of(layout).identity():
        raise RecordMismatchError(f"{path}: the tier's cache {name!r} claims {fmt}, whose record is "
                                  f"{identity_label(record_of(layout).identity())}, but records "
                                  f"{entry.get('record')!r}: nothing was loaded")
    return layout


def _cold_rows(path: str, name: str, entry: dict, layout: Layout, f, n: int):
    """(codec, rows) of a cache stored in a cold record, every field checked."""
    ident = entry["cold"]
    codec = CODECS.get(str(ident.get("codec"))) if isinstance(ident, dict) else None
    if codec is None or layout.name != codec.source or ident != codec.identity(layout):
        raise RecordMismatchError(f"{path}: cache {name!r} is stored in a cold record this kvformats does not "
                                  f"read as recorded ({ident!r}); known: {sorted(CODECS)}: nothing was loaded")
    if n == 0:
        return codec, torch.zeros((0, codec.row_bytes(layout)), dtype=torch.uint8)
    if name + COLD_SUFFIX not in f.keys():
        raise CacheFileError(_bad(path, f"cache {name!r}: its cold rows (tensor {name + COLD_SUFFIX!r}) are missing"))
    rows = f.get_tensor(name + COLD_SUFFIX)
    if rows.dtype != torch.uint8 or tuple(rows.shape) != (n, codec.row_bytes(layout)):
        raise CacheFileError(_bad(path, f"cache {name!r}: cold rows must be uint8 [{n}, {codec.row_bytes(layout)}], "
                         f"got {rows.dtype} {list(rows.shape)}"))
    return codec, rows


def _warm_rows(path: str, name: str, layout: Layout, entries: dict, n: int) -> torch.Tensor:
    from kvformats.codec.rows import read_rows

    if n == 0:
        return torch.zeros((0, layout.row_bytes), dtype=torch.uint8)
    entry = entries.get(name)
    if entry is None:
        raise CacheFileError(_bad(path, f"cache {name!r} is not among the file's caches {sorted(entries)}"))
    if not same_record(entry.layout, layout):
        raise RecordMismatchError(f"{path}: the tier's cache {name!r} is {layout.name} {layout.params} in the "
                                  f"manifest but {entry.layout.name} {entry.layout.params} in the file: "
                                  f"nothing was loaded")
    if entry.cache.shape[0] * entry.layout.page_size < n:
        raise CacheFileError(_bad(path, f"cache {name!r}: {n} rows do not fit its {entry.cache.shape[0]} pages"))
    return read_rows(entry.layout, entry.cache, torch.arange(n))  # the file's page size


def load_tier(path: str | os.PathLike) -> HostTier:
    """The tier in the cache file ``path``, in host memory, every check of the module doc
    passed (CacheFileError, RecordMismatchError, IntegrityError otherwise)."""
    from kvformats.caches.files import load_caches

    entries = load_caches(path)  # the file, its caches, formats and record identities
    import safetensors  # only now: load_caches names the io extra where it is missing

    path = os.fspath(path)
    manifest = _manifest_of(path)
    out = {}
    with safetensors.safe_open(path, framework="pt") as f:
        for name, entry in sorted(manifest["caches"].items()):
            if not isinstance(entry, dict):
                raise CacheFileError(_bad(path, f"cache {name!r} is not a JSON object"))
            where = f"cache {name!r}"
            start, stop = _int(path, where, entry, "start"), _int(path, where, entry, "stop")
            if stop < start or _int(path, where, entry, "chunk_rows") != CHUNK_ROWS:
                raise CacheFileError(_bad(path, f"{where}: rows [{start}, {stop}) in chunks of {entry['chunk_rows']} "
                                 f"(this kvformats checks chunks of {CHUNK_ROWS})"))
            layout = _layout_of(path, name, entry)
            codec = None
            if entry.get("cold") is not None:
                codec, rows = _cold_rows(path, name, entry, layout, f, stop - start)
            else:
                rows = _warm_rows(path, name, layout, entries, stop - start)
            held = TierRows(layout, start, stop, rows, torch.zeros(0, dtype=torch.int64), codec)
            try:
                sums = torch.tensor(entry.get("checksums"), dtype=torch.int64)
            except (TypeError, ValueError, RuntimeError, OverflowError):
                raise CacheFileError(_bad(path, f"{where}: checksums are not a list of integers")) from None
            want_shape = (-(-(stop - start) // CHUNK_ROWS), len(held.spans), 2)
            if stop > start and tuple(sums.shape) != want_shape:
                raise CacheFileError(_bad(path, f"{where}: checksums must be {list(want_shape)}, "
                                                f"got {list(sums.shape)}"))
            held = TierRows(layout, start, stop, rows, sums.reshape(want_shape), codec)
            verify_rows(name, held, rows)
            out[name] = held
    return HostTier(out)
