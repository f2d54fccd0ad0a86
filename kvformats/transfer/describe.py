"""What each side of a transfer says about its caches, and the handshake that compares them.

A ``CacheDesc`` is everything about one cache that decides where its bytes lie: the record
identity (``kvformats.codec.records``: record name, version, layout kind, bytes per token, head
size), the format, its parameters (the numerics profile among them), the spec fingerprint, the
rows per page, the page width and stride, and where the pages start in their arena (the memory
an engine registers). Two sides may move pages only between caches whose descriptions agree on
all of these except the page count and placement; ``handshake`` compares them before any byte
moves. Two records of the same bytes per token (the V4.1 528 B record page-planar and
token-interleaved) are refused first, naming both identities: a size that agrees says nothing
about where the bytes lie. A description travels as JSON, so an engine can pass it on whatever
side channel it already has (its metadata exchange); one from a peer that carries no record
identity (an older kvformats) gets the one its format gives. A peer's description is checked
against the layout its format gives before anything uses it (``kvformats.transfer.bounds``).

Identity and geometry. A cache's *record identity* is its format, its parameters other than
``page_size``, its profile and its record ABI (``record``): what one token's bytes mean. Its
*geometry* is the rows per page, the page width (page pad included), the page stride and the
arena it shares (``GEOMETRY``): where those bytes lie. ``handshake(..., geometry=True)`` (what
``plan_transfer`` runs: its plans map token rows between geometries) accepts another geometry
of the same identity and refuses another identity with both named; by default every field must
agree (whole pages can move only between equal pages).

An arena is every cache whose storage memory overlaps another's (a strided arena's fields, or
one buffer seen through two storages: DLPack, ``torch.from_numpy``), found by comparing address
ranges, not storage objects; it is named after its first member in name order, so the order in
which the caches were inserted changes nothing.
"""

from __future__ import annotations

import json
from typing import Mapping

import attrs
import torch

from kvformats.codec.records import identity_problem, record_identity, record_of, same_record
from kvformats.errors import HandshakeError, InputError, InputTypeError, describe
from kvformats.layout import Layout
from kvformats.transfer.bounds import LIMIT, checked_layout, label, loads, short
from kvformats.validation import check_cache

# Fields two sides must agree on, in the order a mismatch is reported.
COMPARED = ("format", "params", "profile", "fingerprint", "page_size", "page_bytes", "page_stride", "arena", "record")
# Where a cache's bytes lie, not what they mean: a plan maps token rows across these. The spec
# fingerprint is among them because it covers the page size; the record identity stays compared.
GEOMETRY = ("fingerprint", "page_size", "page_bytes", "page_stride", "arena")


@attrs.frozen
class CacheDesc:
    """One cache as a transfer sees it. Byte counts: ``page_bytes`` is the width of one page
    of this cache, ``page_stride`` the distance between pages, ``offset`` where page 0 starts
    in its arena (non-zero for a field of an arena) and ``storage_bytes`` the arena's size (the
    bytes an engine registers). ``arena`` names the arena (its first member by name);
    ``record`` is the record identity (``Record.identity()``)."""

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
    arena: str = ""  # the first cache (by name) of this memory: fields of one arena agree here
    record: dict = attrs.field(factory=dict)

    def to_json(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, d) -> "CacheDesc":
        """A peer's description, checked (``bounds.checked_layout``); HandshakeError otherwise."""
        keys = {f.name for f in attrs.fields(cls)}
        if isinstance(d, Mapping) and set(d) == keys - {"record"}:  # an older peer: no record identity
            d = {**d, "record": None}
        if not isinstance(d, Mapping) or set(d) != keys:
            raise HandshakeError(f"a peer's cache description must have the keys "
                                 f"{sorted(f.name for f in attrs.fields(cls))}, got {short(d)}")
        for f in attrs.fields(cls):
            if f.name == "record":
                continue
            kind: type = dict if f.name == "params" else int if f.type in ("int", int) else str
            v = d[f.name]
            if not isinstance(v, kind) or isinstance(v, bool) or (isinstance(v, int) and not 0 <= v < LIMIT):
                what = "non-negative int below 2**62" if kind is int else kind.__name__
                raise HandshakeError(f"a peer's cache description has {f.name} = {short(v)}, not a {what}")
        if not d["name"] or not d["arena"]:
            raise HandshakeError(f"a peer's cache description has an empty name or arena: {short(d)}")
        record = d["record"]
        if record is None:
            record = record_identity(d["format"], dict(d["params"])) or {}
        elif (problem := identity_problem(record)) is not None:
            raise HandshakeError(f"a peer's cache description of {d['name']!r} has a bad record identity: {problem}")
        desc = cls(**{**d, "record": dict(record)})
        # the handshake compares the record and names both identities; a plan checks it again
        checked_layout(desc, "the peer's ", record=False)
        return desc


def describe_cache(name: str, layout: Layout, cache: torch.Tensor, arena: str = "", *,
                   span: tuple[int, int] | None = None) -> CacheDesc:
    """The description of one cache (checked against its layout first). ``span``: (address,
    bytes) of its arena; by default the cache's own storage."""
    from kvformats.spec.formats import fingerprint

    if not isinstance(name, str) or not name:
        raise InputError(f"cache names must be non-empty strings, got {name!r}")
    if not isinstance(layout, Layout):
        raise InputTypeError(f"caches[{name!r}] needs a Layout, got {describe(layout)}")
    check_cache(layout, cache)
    if cache.device.type == "meta":
        raise InputError(f"caches[{name!r}] is on the meta device: it has no memory to move ({describe(cache)})")
    u8, stride = layout.byte_pages(cache)
    width = 1
    for d in u8.shape[1:]:
        width *= d
    base, extent = span if span is not None else storage_span(cache)
    params = json.loads(json.dumps(layout.params))  # as the peer will read it (tuples become lists)
    desc = CacheDesc(name=name, format=layout.name, params=params, profile=str(params.get("profile", "")),
                     fingerprint=fingerprint(layout), page_size=layout.page_size, page_bytes=width,
                     page_stride=stride if cache.shape[0] > 1 else max(stride, width),
                     num_pages=cache.shape[0], offset=u8.data_ptr() - base, storage_bytes=extent,
                     arena=arena or name, record=record_of(layout).identity())
    checked_layout(desc)  # what the peer will check: a cache that fails it is refused here first
    return desc


def storage_span(cache: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the cache's storage."""
    storage = cache.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def arena_spans(caches: Mapping[str, tuple[Layout, torch.Tensor]]) -> dict[str, tuple[str, int, int]]:
    """Cache name -> (arena name, arena address, arena bytes). An arena is a maximal set of
    caches on one device whose storage address ranges overlap, directly or through others:
    comparing addresses, not storage objects, also joins two storages over one buffer (DLPack,
    ``torch.from_numpy`` of overlapping arrays). It is named after its first member by name."""
    items = sorted((str(c.device), *storage_span(c), name) for name, (_, c) in caches.items())
    groups: list[list] = []  # [device, start, end, names], by start address
    for device, start, nbytes, name in items:
        last = groups[-1] if groups else None
        if last is not None and last[0] == device and start < last[2] and nbytes:  # overlaps the group
            last[2], last[3] = max(last[2], start + nbytes), last[3] + [name]
        else:
            groups.append([device, start, start + nbytes, [name]])
    return {name: (min(names), start, end - start) for _, start, end, names in groups for name in names}


def describe_caches(caches: Mapping[str, tuple[Layout, torch.Tensor]]) -> dict[str, CacheDesc]:
    """``{name: (layout, cache)}`` -> ``{name: CacheDesc}``; caches sharing memory form one arena
    (``arena_spans``), whatever the order of the mapping."""
    if not isinstance(caches, Mapping) or not caches:
        raise InputTypeError(f"caches must be a non-empty mapping {{name: (layout, cache)}}, got {describe(caches)}")
    for name, item in caches.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"cache names must be non-empty strings, got {name!r}")
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
            raise InputTypeError(f"caches[{name!r}] must be a (layout, cache) tuple, got {describe(item)}")
    spans = arena_spans(caches)
    return {name: describe_cache(name, *item, arena=spans[name][0], span=spans[name][1:])
            for name, item in caches.items()}


def to_json(descs: Mapping[str, CacheDesc]) -> str:
    """Descriptions as one JSON text (what a side sends its peer)."""
    return json.dumps([d.to_json() for d in descs.values()], sort_keys=True)


def from_json(text: str | bytes) -> dict[str, CacheDesc]:
    """A peer's descriptions from ``to_json``; HandshakeError for anything else, a cache named
    twice among them included."""
    items = loads(text, "a peer's cache description list")
    if not isinstance(items, list):
        raise HandshakeError(f"a peer's cache descriptions must be a JSON list, got {type(items).__name__}")
    descs = [CacheDesc.from_json(d) for d in items]
    names = [d.name for d in descs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise HandshakeError(f"a peer's cache descriptions name {twice} more than once")
    return {d.name: d for d in descs}


def same_geometry(a: CacheDesc, b: CacheDesc) -> bool:
    """Whether two descriptions of one record lay a page out alike: the same rows per page and
    page width (the page stride and the arena do not change where a row lies in its page)."""
    return a.page_size == b.page_size and a.page_bytes == b.page_bytes


def identity_label(desc: CacheDesc) -> str:
    """A cache's record identity in words: format, parameters other than page_size, record."""
    shaping = ", ".join(f"{k}={v}" for k, v in sorted(desc.params.items()) if k != "page_size")
    return f"{desc.format}({shaping}) record {label(desc.record)}"


def _records_agree(a: CacheDesc, b: CacheDesc, params_equal: bool) -> bool:
    return a.record == b.record or (a.format == b.format and params_equal
                                    and same_record(a.record, b.record, a.format, a.params))


def handshake(local: Mapping[str, CacheDesc], peer: Mapping[str, CacheDesc], *, geometry: bool = False) -> None:
    """Both sides have the same caches, described alike (``COMPARED``); otherwise a
    HandshakeError naming the first cache and field that differ, and both record identities when
    the records differ. Two records of the same bytes per token are refused as such, whatever
    else differs: the message names both identities. Page counts and where the pages lie in
    storage may differ: they are each side's own. ``geometry=True``: the geometry (``GEOMETRY``:
    rows per page, page width, stride, arena, and with them the fingerprint) may differ too,
    provided the record identity (format, parameters but page_size, profile, record) is the
    same; a different one is refused with both identities named."""
    if not isinstance(geometry, bool):
        raise InputTypeError(f"geometry must be a bool, got {describe(geometry)}")
    if set(local) != set(peer):
        only_here, only_there = sorted(set(local) - set(peer)), sorted(set(peer) - set(local))
        raise HandshakeError(f"the peer has other caches: only here {only_here}, only at the peer {only_there}")
    for name in local:
        a, b = local[name], peer[name]
        if geometry:
            _same_identity(name, a, b)
            continue
        agree = _records_agree(a, b, a.params == b.params)
        records = "" if agree else f" (record here {label(a.record)}, at the peer {label(b.record)})"
        _refuse_same_size(name, a, b, records)
        for field in COMPARED:
            if field == "record":
                if records:
                    raise HandshakeError(f"cache {name!r}: record differs: here {label(a.record)}, "
                                         f"at the peer {label(b.record)}")
                continue
            if getattr(a, field) != getattr(b, field):
                raise HandshakeError(f"cache {name!r}: {field} differs: here {getattr(a, field)!r}, "
                                     f"at the peer {getattr(b, field)!r}{records}")


def _refuse_same_size(name: str, a: CacheDesc, b: CacheDesc, records: str) -> None:
    """Two records of one size: refused first, whatever else differs (the size says nothing)."""
    if records and a.record and b.record and a.record["bytes_per_token"] == b.record["bytes_per_token"]:
        raise HandshakeError(f"cache {name!r}: record differs at the same {a.record['bytes_per_token']} bytes "
                             f"per token: here {label(a.record)}, at the peer {label(b.record)}; the bytes "
                             f"of a token lie elsewhere in the other record, so no page can move between them")


def _same_identity(name: str, a: CacheDesc, b: CacheDesc) -> None:
    """The record identity of ``a`` and ``b`` is the same (the geometry may differ)."""
    shaping = {k: v for k, v in a.params.items() if k != "page_size"}
    params_equal = shaping == {k: v for k, v in b.params.items() if k != "page_size"}
    agree = _records_agree(a, b, params_equal)
    records = "" if agree else f" (record here {label(a.record)}, at the peer {label(b.record)})"
    _refuse_same_size(name, a, b, records)
    field = next((f for f, same in (("format", a.format == b.format), ("params", params_equal),
                                    ("profile", a.profile == b.profile), ("record", agree)) if not same), None)
    if field is None and a.page_size == b.page_size and a.fingerprint != b.fingerprint:
        field = "fingerprint"  # at one page size the fingerprint is the byte definition itself
    if field is not None:
        raise HandshakeError(f"cache {name!r}: record identity differs ({field}): here {identity_label(a)}, at "
                             f"the peer {identity_label(b)}; only the page geometry (rows per page, page "
                             f"width, stride, arena) may differ between the two sides")
