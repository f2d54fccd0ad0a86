"""Transfer plans: which (offset, length) byte segments move from one side's caches to the other's.

A request's pages have other page ids on each side, so a plan pairs the i-th source page with
the i-th destination page of each cache, or, where the two sides' pages hold other numbers of
rows, maps the request's token rows from one side's pages to the other's
(``kvformats.transfer.geometry``: row ``t`` from ``(src_pages[t // Ps], t % Ps)`` to
``(dst_pages[t // Pd], t % Pd)``, each layout segment to its own place in the page). Offsets
count bytes from the start of the cache's storage (what an engine registers): an engine adds
each side's base address. Three modes:

* per cache (default): each page's bytes of that cache (its page width, or with ``rows`` only
  the records of the request's rows in that range, one segment per layout segment and page:
  the rows of a segment are back to back);
* ``whole_pages=True``: the physical pages of each arena once, from its first field's first
  byte to its last field's last byte; every field of an arena must then name the same pages;
* rows across geometries: a cache whose rows per page differ between the sides, or whose
  ``rows`` are a ``Ring``, moves the rows ``rows`` (or ``tokens``) names, chunk by chunk
  (``CachePlan.row_map``; the page stride, page pad and arena may differ in every mode but
  ``whole_pages``).

Segments are coalesced where both sides are contiguous, so adjacent pages move as one. Every
check runs here, on the host, before an engine sees the plan: a plan that exists is safe to run.
Both sides' descriptions are checked against the layouts their formats give
(``bounds.checked_layout``) and rows per page come from that layout, never from a peer's
number; every count is below 2**62, so no offset computed here wraps.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.layout import Layout
from kvformats.transfer.bounds import checked_layout
from kvformats.transfer.describe import CacheDesc, handshake
from kvformats.transfer.geometry import Ring, RowMap, row_map, row_segments


@attrs.frozen(eq=False)
class CachePlan:
    """The moves of one cache (or, with whole pages, one arena: ``caches`` names its fields).

    ``src_pages``/``dst_pages``: int64 ``[P]`` page ids, paired; ``rows``: int64 ``[P, 2]``, the
    rows [start, stop) of each page that move (the checksum covers those rows of every region,
    and the page pad when whole pages move); ``field_rows``: the same per cache of ``caches``
    (fields of one arena may have different rows per page: ``rows_of``); ``src``/``dst``: int64
    ``[N, 2]`` coalesced (offset, length) segments; ``segments_before``: their count before
    coalescing. ``row_map``: for a plan across geometries (or of a ring), the chunks of token
    rows that move (``geometry.RowMap``), which the checksums follow; ``src_pages``/``dst_pages``
    are then each side's pages of the request and ``rows`` is empty."""

    name: str
    caches: tuple[str, ...]
    src_pages: torch.Tensor
    dst_pages: torch.Tensor
    rows: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    segments_before: int
    include_pad: bool = True  # whole pages move (the page pad too); False when only rows move
    field_rows: dict = attrs.field(factory=dict)  # cache name -> its rows [P, 2], where not ``rows``
    row_map: RowMap | None = None  # chunks of token rows, for a plan across geometries

    @property
    def nbytes(self) -> int:
        return int(self.src[:, 1].sum())

    def rows_of(self, name: str) -> torch.Tensor:
        """The rows of each page of cache ``name`` (one of ``caches``) that move."""
        return self.field_rows.get(name, self.rows)


@attrs.frozen(eq=False)
class TransferPlan:
    """Per-cache plans, the descriptions they were built from and the mode."""

    caches: dict[str, CachePlan]
    src: dict[str, CacheDesc]
    dst: dict[str, CacheDesc]
    whole_pages: bool

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.caches.values())

    @property
    def segments(self) -> int:
        return sum(p.src.shape[0] for p in self.caches.values())

    @property
    def segments_before(self) -> int:
        return sum(p.segments_before for p in self.caches.values())

    def table(self) -> list[dict]:
        """One row per plan entry: bytes, segments before and after coalescing (docs, benchmarks)."""
        return [{"cache": p.name, "pages": int(p.src_pages.numel()), "bytes": p.nbytes,
                 "segments_before": p.segments_before, "segments": int(p.src.shape[0])}
                for p in self.caches.values()]

    def only(self, names) -> "TransferPlan":
        """The part of this plan that moves the caches ``names`` (an iterable of cache names; with
        whole pages, an arena's fields all or none): one layer's plan, for a layer-by-layer
        transfer. The descriptions stay whole, so an endpoint accepts the part as its own."""
        wanted = set(names)
        unknown = sorted(wanted - {c for p in self.caches.values() for c in p.caches})
        if unknown:
            raise InputError(f"the plan moves no cache {unknown}")
        parts = {}
        for key, p in self.caches.items():
            inside = [c in wanted for c in p.caches]
            if any(inside) and not all(inside):
                raise InputError(f"plan entry {key!r} moves the arena fields {list(p.caches)} together: take all "
                                 f"of them or none")
            if all(inside):
                parts[key] = p
        return TransferPlan(caches=parts, src=self.src, dst=self.dst, whole_pages=self.whole_pages)


def _page_ids(what: str, pages, desc: CacheDesc) -> torch.Tensor:
    if isinstance(pages, (list, tuple)):
        if not all(type(p) is int for p in pages):  # noqa: E721 - not a bool
            raise InputTypeError(f"{what} must be ints, got {pages!r}")
        bad = [p for p in pages if not 0 <= p < desc.num_pages]  # before torch, which refuses ints past int64
        if bad:
            raise InputError(f"{what} names page {bad[0]}, beyond the cache's {desc.num_pages} pages")
        pages = torch.tensor(pages, dtype=torch.int64)
    if not isinstance(pages, torch.Tensor) or pages.dtype not in (torch.int32, torch.int64) or pages.dim() != 1:
        raise InputTypeError(f"{what} must be a 1-D int32/int64 tensor or a list of ints, got {describe(pages)}")
    if pages.device.type == "meta":
        raise InputError(f"{what} is on the meta device: it holds no page ids ({describe(pages)})")
    pages = pages.to("cpu", torch.int64)
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= desc.num_pages):
        bad = pages[(pages < 0) | (pages >= desc.num_pages)][0]
        raise InputError(f"{what} names page {int(bad)}, beyond the cache's {desc.num_pages} pages")
    if pages.unique().numel() != pages.numel():
        raise InputError(f"{what} names a page twice")
    return pages


def _row_ranges(name: str, rows, n_pages: int, page_size: int) -> torch.Tensor:
    """int64 ``[P, 2]``: the rows [start, stop) of each of the request's pages that move."""
    total = n_pages * page_size
    if rows is None:
        start, stop = 0, total
    else:
        if not (isinstance(rows, tuple) and len(rows) == 2 and all(type(r) is int for r in rows)):  # noqa: E721
            raise InputTypeError(f"rows[{name!r}] must be a (start, stop) tuple of ints, got {rows!r}")
        start, stop = rows
        if not 0 <= start < stop <= total:
            raise InputError(f"rows[{name!r}] = {rows} lies beyond the request: its {n_pages} pages hold rows "
                             f"[0, {total})")
    first = torch.arange(n_pages, dtype=torch.int64) * page_size
    return torch.stack([(start - first).clamp(0, page_size), (stop - first).clamp(0, page_size)], 1)


def coalesce(src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Paired int64 ``[N, 2]`` (offset, length) segments, sorted by source offset, with each run
    that is contiguous on both sides merged into one segment."""
    if src.shape[0] == 0:
        return src, dst
    order = torch.argsort(src[:, 0], stable=True)
    src, dst = src[order], dst[order]
    joins = torch.zeros(src.shape[0], dtype=torch.bool)
    joins[1:] = (src[1:, 0] == src[:-1].sum(1)) & (dst[1:, 0] == dst[:-1].sum(1))
    group = torch.cumsum(~joins, 0) - 1
    starts = ~joins
    lengths = torch.zeros(int(group[-1]) + 1, dtype=torch.int64).index_add_(0, group, src[:, 1])
    return (torch.stack([src[starts, 0], lengths], 1), torch.stack([dst[starts, 0], lengths], 1))


def _segments(desc: CacheDesc, layout_segments, pages: torch.Tensor, rows: torch.Tensor, whole: int | None):
    """int64 ``[P * k, 2]`` segments of ``pages``: ``whole`` bytes from each page's start (or, for
    None, the records of the moved rows of each layout segment)."""
    base = desc.offset + pages * desc.page_stride
    if whole is not None:
        return torch.stack([base, torch.full_like(base, whole)], 1)
    parts = []
    for seg_offset, record in layout_segments:
        parts.append(torch.stack([base + seg_offset + rows[:, 0] * record, (rows[:, 1] - rows[:, 0]) * record], 1))
    return torch.stack(parts, 1).flatten(0, 1)


def _layout_segments(layout: Layout) -> list[tuple[int, int]]:
    """(in-page offset, record bytes) of each segment of the layout."""
    return [(layout.segment_offsets[s.name], s.record_bytes) for s in layout.segments]


def _check_no_overlap(plans: list[CachePlan], dst: Mapping[str, CacheDesc]) -> None:
    """No two destination segments of one storage share a byte (every arena checked as a whole)."""
    by_storage: dict[str, list[tuple[torch.Tensor, str]]] = {}
    for p in plans:
        by_storage.setdefault(dst[p.caches[0]].arena, []).append((p.dst, p.name))
    for arena, items in by_storage.items():
        segs = torch.cat([s for s, _ in items])
        owner = torch.cat([torch.full((s.shape[0],), i) for i, (s, _) in enumerate(items)])
        order = torch.argsort(segs[:, 0], stable=True)
        segs, owner = segs[order], owner[order]
        clash = (segs[1:, 0] < segs[:-1].sum(1)).nonzero()
        if clash.numel():
            i = int(clash[0, 0])
            a, b = items[int(owner[i])][1], items[int(owner[i + 1])][1]
            raise InputError(f"destination segments overlap in storage of {arena!r}: {a!r} bytes "
                             f"[{int(segs[i, 0])}, {int(segs[i].sum())}) and {b!r} from {int(segs[i + 1, 0])}")
        top = segs.sum(1).max() if segs.numel() else torch.tensor(0)
        limit = min(dst[c].storage_bytes for p in plans for c in p.caches if dst[c].arena == arena)
        if int(top) > limit:
            raise InputError(f"destination segments of {arena!r} end at byte {int(top)}, beyond its storage "
                             f"of {limit} bytes")


def plan_transfer(src: Mapping[str, CacheDesc], dst: Mapping[str, CacheDesc], src_pages: Mapping, dst_pages: Mapping,
                  *, rows: Mapping | None = None, whole_pages: bool = False, tokens: int | None = None) -> TransferPlan:
    """The segments that move one request's pages of every cache in ``src_pages`` from the
    source caches ``src`` to the destination caches ``dst`` (descriptions of both sides; the
    handshake runs first). ``src_pages``/``dst_pages``: cache name -> the request's page ids on
    that side, in request order (the i-th pages pair up). ``rows``: cache name -> (start, stop)
    rows of the request to move (rows of the i-th page are [i * page_size, (i + 1) * page_size));
    caches not named move whole pages. A ``rows`` entry may also be a row count ``n`` (rows
    [0, n)) or a ``geometry.Ring`` (a ring cache: position p at ring row p mod the ring's
    rows). ``tokens``: rows [0, tokens) of every cache ``rows`` does not name (caches of one
    row per token). ``whole_pages``: move each arena's physical pages once (then no ``rows``
    or ``tokens``; both sides' geometry must be the same).

    The two sides may lay out pages differently (rows per page, page stride, page pad, arena)
    for one record identity (``describe.handshake(geometry=True)``). A cache of other rows per
    page on each side, or with a ``Ring``, moves by token rows (``geometry``): it needs its rows
    (``rows`` or ``tokens``), and its page lists may have other lengths. Raises HandshakeError
    (the handshake's, or a description that its format's layout contradicts:
    ``bounds.checked_layout``), InputError (rows past either side's pages, destination bytes
    that overlap or run past the arena, ...), InputTypeError; moves nothing."""
    if not isinstance(whole_pages, bool):
        raise InputTypeError(f"whole_pages must be a bool, got {describe(whole_pages)}")
    if tokens is not None and (type(tokens) is not int or tokens < 1):  # noqa: E721 - a bool is refused too
        raise InputTypeError(f"tokens must be a positive int or None, got {describe(tokens)}")
    # each description against its own layout first: a peer's page_size that its params contradict
    # is named as such, not as a geometry difference
    layouts = {name: checked_layout(src[name], "source ") for name in src}
    dst_layouts = {name: checked_layout(dst[name], "destination ") for name in dst}
    handshake(src, dst, geometry=not whole_pages)  # whole physical pages need one geometry
    for what, pages in (("src_pages", src_pages), ("dst_pages", dst_pages)):
        if not isinstance(pages, Mapping):
            raise InputTypeError(f"{what} must be a mapping cache name -> page ids, got {describe(pages)}")
    rows = {} if rows is None else rows
    if not isinstance(rows, Mapping):
        raise InputTypeError(f"rows must be a mapping cache name -> (start, stop), got {describe(rows)}")
    if set(src_pages) != set(dst_pages) or not src_pages:
        raise InputError(f"src_pages and dst_pages must name the same caches, got {sorted(src_pages)} and "
                         f"{sorted(dst_pages)}")
    unknown = sorted(set(src_pages) - set(src)) + sorted(set(rows) - set(src_pages))
    if unknown:
        raise InputError(f"no such cache in the plan: {unknown}; caches: {sorted(src)}")
    if whole_pages and (rows or tokens is not None):
        raise InputError("whole_pages moves every row of each page: pass no rows and no tokens")
    checked, plans = {}, []
    for name in src_pages:
        sp = _page_ids(f"src_pages[{name!r}]", src_pages[name], src[name])
        dp = _page_ids(f"dst_pages[{name!r}]", dst_pages[name], dst[name])
        spec = rows.get(name, tokens)
        if isinstance(spec, Ring) or layouts[name].page_size != dst_layouts[name].page_size:
            plans.append(_row_plan(name, spec, layouts[name], dst_layouts[name], src[name], dst[name], sp, dp))
            continue
        if sp.numel() != dp.numel():
            raise InputError(f"cache {name!r}: {sp.numel()} source pages but {dp.numel()} destination pages")
        whole = spec is None and src[name].page_bytes == dst[name].page_bytes  # else rows: no page pad
        spec = (0, spec) if type(spec) is int else spec  # noqa: E721 - a row count: rows [0, n)
        r = _row_ranges(name, spec, sp.numel(), layouts[name].page_size)
        keep = r[:, 1] > r[:, 0]  # pages the row range does not reach move nothing
        checked[name] = (sp[keep], dp[keep], r[keep], whole)
    plans += _whole_page_plans(src, dst, checked) if whole_pages else [
        _cache_plan(name, layouts[name], src[name], dst[name], *checked[name]) for name in checked]
    _check_no_overlap(plans, dst)
    return TransferPlan(caches={p.name: p for p in sorted(plans, key=lambda p: list(src_pages).index(p.caches[0]))},
                        src=dict(src), dst=dict(dst), whole_pages=whole_pages)


def _row_plan(name, spec, s_layout: Layout, d_layout: Layout, s: CacheDesc, d: CacheDesc, sp, dp) -> CachePlan:
    """The plan of one cache by token rows (module doc; ``geometry``)."""
    if spec is None:
        raise InputError(f"cache {name!r}: the two sides' pages hold {s_layout.page_size} and {d_layout.page_size} "
                         f"rows: whole pages cannot move between them; give the request's rows (rows={{{name!r}: "
                         f"n}} or tokens=n)")
    rows = row_map(name, spec, sp, dp, s_layout.page_size, d_layout.page_size)
    a, b = row_segments(rows, s_layout, d_layout, (s.offset, s.page_stride), (d.offset, d.page_stride))
    live = a[:, 1] > 0
    a, b = a[live], b[live]
    before = a.shape[0]
    a, b = coalesce(a, b)
    empty = torch.zeros(0, 2, dtype=torch.int64)
    return CachePlan(name=name, caches=(name,), src_pages=sp, dst_pages=dp, rows=empty, src=a, dst=b,
                     segments_before=before, include_pad=False, row_map=rows)


def _cache_plan(name, layout: Layout, s: CacheDesc, d: CacheDesc, sp, dp, r, whole: bool) -> CachePlan:
    layout_segments = _layout_segments(layout)
    width = s.page_bytes if whole else None
    a, b = _segments(s, layout_segments, sp, r, width), _segments(d, layout_segments, dp, r, width)
    live = a[:, 1] > 0
    a, b = a[live], b[live]
    before = a.shape[0]
    a, b = coalesce(a, b)
    return CachePlan(name=name, caches=(name,), src_pages=sp, dst_pages=dp, rows=r, src=a, dst=b,
                     segments_before=before, include_pad=whole)


def _whole_page_plans(src, dst, checked) -> list[CachePlan]:
    """One plan per arena: its physical pages, spanning every field, once."""
    arenas: dict[str, list[str]] = {}
    for name in checked:
        arenas.setdefault(src[name].arena, []).append(name)
    plans = []
    for arena, names in arenas.items():
        members = [src[n] for n in src if src[n].arena == arena]
        if sorted(names) != sorted(m.name for m in members):
            raise InputError(f"whole_pages moves every field of arena {arena!r}: name all of "
                             f"{sorted(m.name for m in members)}, got {sorted(names)}")
        sp, dp, r, _ = checked[names[0]]
        for n in names[1:]:
            if not (torch.equal(checked[n][0], sp) and torch.equal(checked[n][1], dp)):
                raise InputError(f"whole_pages: the fields of arena {arena!r} must name the same pages, "
                                 f"{names[0]!r} and {n!r} differ")
        if len({m.page_stride for m in members}) != 1:
            raise InputError(f"whole_pages: the fields of arena {arena!r} have different page strides")
        s_base, d_base = min(m.offset for m in members), min(dst[m.name].offset for m in members)
        for m in members:
            if m.offset - s_base != dst[m.name].offset - d_base:
                raise InputError(f"whole_pages: field {m.name!r} lies at another place in its arena page on each "
                                 f"side ({m.offset - s_base} and {dst[m.name].offset - d_base} bytes in)")
        span = max(m.offset + m.page_bytes for m in members) - s_base
        seg_s = torch.stack([s_base + sp * members[0].page_stride, torch.full_like(sp, span)], 1)
        seg_d = torch.stack([d_base + dp * dst[members[0].name].page_stride, torch.full_like(dp, span)], 1)
        before = seg_s.shape[0]
        seg_s, seg_d = coalesce(seg_s, seg_d)
        # every field's own rows: fields of one arena may hold different rows per page
        plans.append(CachePlan(name=arena, caches=tuple(names), src_pages=sp, dst_pages=dp, rows=r, src=seg_s,
                               dst=seg_d, segments_before=before, field_rows={n: checked[n][2] for n in names}))
    return plans
