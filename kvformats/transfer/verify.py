"""Integrity on arrival: the sender's checksums of the pages it moved against the receiver's.

The sender calls ``expected_checksums`` on its source caches (right after they were written:
no host read), sends them with its "done" message, and the receiver calls ``verify`` on its
destination caches before it marks the pages valid. A mismatch is an IntegrityError naming the
cache, the page on both sides and the region; ``save_request_pages`` writes one side's pages
of the plan to a cache file so that ``kvformats diff`` shows the differing bytes.

The caches given must be the ones the plan was made for (the layout its description names, the
same page count, page width, stride and place in the arena): checked on the host from metadata
before anything is read (InputError). The plan's page ids are host tensors, so their range
checks in ``page_checksums`` read nothing from a GPU.

A plan across page geometries (``CachePlan.row_map``) is checked by chunks of token rows, not by
pages: the sender's checksums are keyed by (cache, token-row range, region) in the plan's chunk
order, the receiver computes the same over its own pages (``checksum.row_checksums``), and a
mismatch names the cache, the token rows, the region and the page and rows on both sides.
"""

from __future__ import annotations

import json
from typing import Mapping

import torch

from kvformats.errors import InputError, InputTypeError, IntegrityError, describe
from kvformats.layout import Layout
from kvformats.transfer.checksum import page_checksums, row_checksums, row_regions
from kvformats.transfer.describe import CacheDesc
from kvformats.transfer.plan import TransferPlan


def _side(plan: TransferPlan, side: str):
    if not isinstance(plan, TransferPlan):
        raise InputTypeError(f"plan must be a TransferPlan (plan_transfer), got {describe(plan)}")
    if side not in ("src", "dst"):
        raise InputError(f"side must be 'src' or 'dst', got {side!r}")
    return side


def _check_is_plans(name: str, desc: CacheDesc, item, side: str) -> None:
    """``item`` is (layout, cache) and is the cache ``desc`` describes (metadata only)."""
    where = f"cache {name!r} given for the plan's {'source' if side == 'src' else 'destination'}"
    if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Layout)
            and isinstance(item[1], torch.Tensor)):
        raise InputTypeError(f"{where} must be a (layout, cache) tuple, got {describe(item)}")
    layout, cache = item
    if cache.device.type == "meta":
        raise InputError(f"{where} is on the meta device: it has no bytes to checksum")
    params = json.loads(json.dumps(layout.params))  # as the description holds them
    if layout.name != desc.format or params != desc.params:
        raise InputError(f"{where} has layout {layout.name} {params}, the plan's has {desc.format} {desc.params}")
    u8, stride = layout.byte_pages(cache)
    width = 1
    for d in u8.shape[1:]:
        width *= d
    got = {"num_pages": cache.shape[0], "page_bytes": width}
    if cache.shape[0] > 1:
        got["page_stride"] = stride
    for field, value in got.items():
        if value != getattr(desc, field):
            raise InputError(f"{where} has {field} = {value}, the plan's cache has {getattr(desc, field)}: "
                             f"pass the caches the plan was made for")


def _entries(plan: TransferPlan, caches: Mapping[str, tuple[Layout, torch.Tensor]], side: str):
    """(cache name, its plan entry) for every cache the plan moves, each checked to be the plan's."""
    if not isinstance(caches, Mapping):
        raise InputTypeError(f"caches must be a mapping name -> (layout, cache), got {describe(caches)}")
    descs = plan.src if side == "src" else plan.dst
    out = []
    for p in plan.caches.values():
        for name in p.caches:
            if name not in caches:
                raise InputError(f"the plan moves cache {name!r}, not among the caches given: {sorted(caches)}")
            _check_is_plans(name, descs[name], caches[name], side)
            out.append((name, p))
    return out


def expected_checksums(plan: TransferPlan, caches: Mapping[str, tuple[Layout, torch.Tensor]], *, side: str = "src",
                       backend: str = "auto") -> dict[str, torch.Tensor]:
    """Cache name -> int64 ``[P, regions, 2]`` checksums of the plan's pages on ``side``."""
    side = _side(plan, side)
    out = {}
    for name, p in _entries(plan, caches, side):
        layout, cache = caches[name]
        if p.row_map is not None:  # across geometries: by chunks of token rows
            out[name] = row_checksums(layout, cache, *p.row_map.page_rows(side), backend=backend)
            continue
        pages = p.src_pages if side == "src" else p.dst_pages
        out[name] = page_checksums(layout, cache, pages, p.rows_of(name), include_pad=p.include_pad,
                                   backend=backend)
    return out


def verify(plan: TransferPlan, caches: Mapping[str, tuple[Layout, torch.Tensor]], expected: Mapping[str, torch.Tensor],
           *, backend: str = "auto") -> None:
    """The destination pages hold what the sender checksummed; IntegrityError otherwise (the
    first differing cache, page and region). One host read per cache (the comparison)."""
    got = expected_checksums(plan, caches, side="dst", backend=backend)
    for name, p in _entries(plan, caches, "dst"):
        want = expected.get(name) if isinstance(expected, Mapping) else None
        if not isinstance(want, torch.Tensor) or tuple(want.shape) != tuple(got[name].shape) \
                or want.dtype != torch.int64:
            raise IntegrityError(f"cache {name!r}: the sender's checksums are missing or of another shape or dtype "
                                 f"({describe(want)}, expected int64 {tuple(got[name].shape)})")
        bad = (got[name] != want.to(got[name].device)).any(-1)
        if bool(bad.any()):
            i, g = (int(v) for v in bad.nonzero()[0])
            layout = caches[name][0]
            n = int(bad.any(-1).sum())
            if p.row_map is not None:
                raise IntegrityError(_row_mismatch(name, p, i, row_regions(layout)[g], n, bad.shape[0]))
            region = layout.regions[g].name
            raise IntegrityError(f"cache {name!r}: page {int(p.dst_pages[i])} (sender's page {int(p.src_pages[i])}, "
                                 f"request page {i}) differs in region {region!r} after the transfer "
                                 f"({n} of {bad.shape[0]} pages differ); the pages are not valid")


def _row_mismatch(name: str, p, i: int, region: str, n: int, chunks: int) -> str:
    """The message of a chunk of token rows that differs (a plan across geometries)."""
    m = p.row_map
    start, count = int(m.start[i]), int(m.count[i])
    here, there = int(m.dst_row[i]), int(m.src_row[i])
    return (f"cache {name!r}: token rows [{start}, {start + count}) (page {int(m.dst_page[i])} rows "
            f"[{here}, {here + count}) here, sender's page {int(m.src_page[i])} rows [{there}, {there + count})) "
            f"differ in region {region!r} after the transfer ({n} of {chunks} row ranges differ); the pages are "
            f"not valid")


def save_request_pages(path, plan: TransferPlan, caches: Mapping[str, tuple[Layout, torch.Tensor]], *,
                       side: str) -> None:
    """Write ``side``'s pages of the plan, in request order, to a cache file (one tensor per
    cache): run it on both sides and ``kvformats diff a b --tensor NAME`` shows the bytes that
    differ (page i of the file is request page i)."""
    from kvformats.caches.files import save_caches

    side = _side(plan, side)
    out = {}
    for name, p in _entries(plan, caches, side):
        layout, cache = caches[name]
        if p.row_map is not None:  # across geometries: the rows, laid out in the source's pages
            out[name] = _rows_in_source_pages(plan, name, p.row_map, layout, cache, side)
            continue
        pages = (p.src_pages if side == "src" else p.dst_pages).to(cache.device)
        out[name] = (layout, cache.index_select(0, pages).contiguous())
    save_caches(path, out)


def _rows_in_source_pages(plan: TransferPlan, name: str, rows, layout: Layout, cache: torch.Tensor, side: str):
    """(source layout, cache) holding the plan's rows of ``name`` from ``side``'s pages, row k of
    the plan (from its first row) at row k of the file's pages: both sides' files then have one
    geometry, and ``kvformats diff`` compares them row for row."""
    from kvformats.transfer.bounds import checked_layout

    src_layout = checked_layout(plan.src[name], "source ")
    total = int(rows.count.sum())
    chunk = torch.repeat_interleave(torch.arange(rows.count.numel()), rows.count)
    within = torch.arange(total) - torch.repeat_interleave(rows.count.cumsum(0) - rows.count, rows.count)
    pages, first = rows.page_rows(side)
    page, row = pages[chunk].to(cache.device), (first[:, 0][chunk] + within).to(cache.device)
    n_pages = -(-total // src_layout.page_size)
    out = src_layout.allocate(n_pages, device=cache.device)
    dest = torch.arange(total, device=cache.device)
    for seg in layout.segments:  # the same segments on both sides: one record (the handshake)
        taken = layout.segment_view(cache, seg.name)[page, row]
        src_layout.segment_view(out, seg.name)[dest // src_layout.page_size, dest % src_layout.page_size] = taken
    return src_layout, out
