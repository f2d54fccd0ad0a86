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
"""

from __future__ import annotations

import json
from typing import Mapping

import torch

from kvformats.errors import InputError, InputTypeError, IntegrityError, describe
from kvformats.layout import Layout
from kvformats.transfer.checksum import page_checksums
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
            region = layout.regions[g].name
            n = int(bad.any(-1).sum())
            raise IntegrityError(f"cache {name!r}: page {int(p.dst_pages[i])} (sender's page {int(p.src_pages[i])}, "
                                 f"request page {i}) differs in region {region!r} after the transfer "
                                 f"({n} of {bad.shape[0]} pages differ); the pages are not valid")


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
        pages = (p.src_pages if side == "src" else p.dst_pages).to(cache.device)
        out[name] = (layout, cache.index_select(0, pages).contiguous())
    save_caches(path, out)
