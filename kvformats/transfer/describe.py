"""What each side of a transfer says about its caches, and the handshake that compares them.

A ``CacheDesc`` is everything about one cache that decides where its bytes lie: the format,
its parameters (the numerics profile among them), the spec fingerprint, the page stride and
where the pages start in their storage. Two sides may move pages only between caches whose
descriptions agree on all of these except the page count and storage placement;
``handshake`` compares them before any byte moves. A description travels as JSON, so an
engine can pass it on whatever side channel it already has (its metadata exchange).
"""

from __future__ import annotations

import json
from typing import Mapping

import attrs
import torch

from kvformats.errors import HandshakeError, InputError, InputTypeError, describe
from kvformats.layout import Layout
from kvformats.validation import check_cache

# Fields two sides must agree on, in the order a mismatch is reported.
COMPARED = ("format", "params", "profile", "fingerprint", "page_bytes", "page_stride", "arena")


@attrs.frozen
class CacheDesc:
    """One cache as a transfer sees it. Byte counts: ``page_bytes`` is the width of one page
    of this cache, ``page_stride`` the distance between pages, ``offset`` where page 0 starts
    in the cache's storage (non-zero for a field of an arena) and ``storage_bytes`` the
    storage's size (the bytes an engine registers)."""

    name: str
    format: str
    params: dict
    profile: str
    fingerprint: str
    page_size: int
    page_bytes: int
    page_stride: int
    num_pages: int
    offset: int
    storage_bytes: int
    arena: str = ""  # the first cache (by name) sharing this storage: fields of one arena agree here

    def to_json(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, d) -> "CacheDesc":
        if not isinstance(d, Mapping) or set(d) != {f.name for f in attrs.fields(cls)}:
            raise HandshakeError(f"a peer's cache description must have the keys "
                                 f"{sorted(f.name for f in attrs.fields(cls))}, got {describe(d)}")
        for f in attrs.fields(cls):
            kind: type = dict if f.name == "params" else int if f.type in ("int", int) else str
            v = d[f.name]
            if not isinstance(v, kind) or isinstance(v, bool) or (isinstance(v, int) and v < 0):
                raise HandshakeError(f"a peer's cache description has {f.name} = {v!r}, not a "
                                     f"{'non-negative int' if kind is int else kind.__name__}")
        return cls(**d)


def describe_cache(name: str, layout: Layout, cache: torch.Tensor, arena: str = "") -> CacheDesc:
    """The description of one cache (checked against its layout first)."""
    from kvformats.spec.formats import fingerprint

    if not isinstance(name, str) or not name:
        raise InputError(f"cache names must be non-empty strings, got {name!r}")
    if not isinstance(layout, Layout):
        raise InputTypeError(f"caches[{name!r}] needs a Layout, got {describe(layout)}")
    check_cache(layout, cache)
    u8, stride = layout.byte_pages(cache)
    width = 1
    for d in u8.shape[1:]:
        width *= d
    params = json.loads(json.dumps(layout.params))  # as the peer will read it (tuples become lists)
    return CacheDesc(name=name, format=layout.name, params=params, profile=str(params.get("profile", "")),
                     fingerprint=fingerprint(layout), page_size=layout.page_size, page_bytes=width,
                     page_stride=stride if cache.shape[0] > 1 else max(stride, width),
                     num_pages=cache.shape[0], offset=int(u8.storage_offset()),
                     storage_bytes=cache.untyped_storage().nbytes(), arena=arena or name)


def describe_caches(caches: Mapping[str, tuple[Layout, torch.Tensor]]) -> dict[str, CacheDesc]:
    """``{name: (layout, cache)}`` -> ``{name: CacheDesc}``."""
    if not isinstance(caches, Mapping) or not caches:
        raise InputTypeError(f"caches must be a non-empty mapping {{name: (layout, cache)}}, got {describe(caches)}")
    out: dict[str, CacheDesc] = {}
    arenas: dict[tuple[torch.device, int], str] = {}
    for name, item in caches.items():
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
            raise InputTypeError(f"caches[{name!r}] must be a (layout, cache) tuple, got {describe(item)}")
        key = (item[1].device, item[1].untyped_storage().data_ptr())
        out[name] = describe_cache(name, *item, arena=arenas.setdefault(key, name))
    return out


def to_json(descs: Mapping[str, CacheDesc]) -> str:
    """Descriptions as one JSON text (what a side sends its peer)."""
    return json.dumps([d.to_json() for d in descs.values()], sort_keys=True)


def from_json(text: str | bytes) -> dict[str, CacheDesc]:
    """A peer's descriptions from ``to_json``; HandshakeError for anything else."""
    try:
        items = json.loads(text)
    except (TypeError, ValueError) as err:
        raise HandshakeError(f"a peer's cache descriptions are not JSON: {err}") from None
    if not isinstance(items, list):
        raise HandshakeError(f"a peer's cache descriptions must be a JSON list, got {type(items).__name__}")
    descs = [CacheDesc.from_json(d) for d in items]
    return {d.name: d for d in descs}


def handshake(local: Mapping[str, CacheDesc], peer: Mapping[str, CacheDesc]) -> None:
    """Both sides have the same caches, described alike (``COMPARED``); otherwise a
    HandshakeError naming the first cache and field that differ. Page counts and where the
    pages lie in storage may differ: they are each side's own."""
    if set(local) != set(peer):
        only_here, only_there = sorted(set(local) - set(peer)), sorted(set(peer) - set(local))
        raise HandshakeError(f"the peer has other caches: only here {only_here}, only at the peer {only_there}")
    for name in local:
        a, b = local[name], peer[name]
        for field in COMPARED:
            if getattr(a, field) != getattr(b, field):
                raise HandshakeError(f"cache {name!r}: {field} differs: here {getattr(a, field)!r}, "
                                     f"at the peer {getattr(b, field)!r}")
