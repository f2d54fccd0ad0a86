"""Across record layouts: convert on receive (issue 45).

Where the two sides hold one logical record in two layouts (V4.1 page-planar ``fp8_ds_mla_v41``
and token-interleaved ``fp8_ds_mla_v41_interleaved``, the fp4 pair), or records between which
``kvformats.codec.convert`` declares a conversion, no page can move directly (the handshake
refuses them, naming both identities). The receiver then:

1. ``staging_for(source description, n_pages)``: allocates a staging cache of the *source's*
   layout, the request's pages ``0 .. n_pages-1`` in request order (request row ``t`` at staging
   slot ``t``), and describes it; the sender plans into it (``plan_transfer``: the same record
   on both sides) and sends ``expected_checksums`` as usual;
2. ``receive_converted``: verifies the staging bytes (``verify``; a mismatch is an IntegrityError
   naming the cache, the request rows and the region, and nothing is written to the destination),
   then converts every cache's rows into its own pages with ``convert_rows`` (all caches first,
   then the writes: a refused conversion writes nothing either).

``conversion_route`` decides from the two descriptions: ``"same"`` (one record identity: plan
directly), ``"convert-exact"`` (two layouts of one record: the row bytes are the same, copied),
``"convert-lossy"`` (a declared conversion that may lose values: with ``exact=True``, the default,
``receive_converted`` raises ConversionError unless the rows at hand convert bit for bit; only
``exact=False`` accepts the target's declared bound), or a HandshakeError naming both identities.
"""

from __future__ import annotations

from typing import Mapping

import torch

from kvformats.codec.convert import convert_rows, region_pairs, row_record
from kvformats.codec.rows import read_rows, write_rows
from kvformats.errors import ConversionError, HandshakeError, InputError, InputTypeError, IntegrityError, describe
from kvformats.layout import Layout
from kvformats.transfer.bounds import checked_layout
from kvformats.transfer.checksum import row_regions
from kvformats.transfer.describe import CacheDesc, describe_cache, handshake
from kvformats.transfer.plan import TransferPlan
from kvformats.transfer.verify import expected_checksums, verify
from kvformats.validation import check_cache, check_slots

ROUTES = ("same", "convert-exact", "convert-lossy")


def conversion_route(src: CacheDesc, dst: CacheDesc) -> str:
    """How a cache described ``src`` at the sender reaches one described ``dst`` here: ``"same"``
    (one record identity, any geometry: ``handshake(geometry=True)`` passes), ``"convert-exact"``
    (two layouts of one record, same profile: rows copied exactly), ``"convert-lossy"`` (a
    conversion ``kvformats.codec.convert`` declares, exact only where the values fit the target's
    grid). HandshakeError naming both identities where no conversion is declared."""
    if not isinstance(src, CacheDesc) or not isinstance(dst, CacheDesc):
        raise InputTypeError(f"conversion_route needs two CacheDesc, got {describe(src)} and {describe(dst)}")
    try:
        handshake({src.name: src}, {src.name: dst}, geometry=True)
        return "same"
    except HandshakeError as err:
        refused = err
    a, b = checked_layout(src, "source "), checked_layout(dst, "destination ")
    try:
        region_pairs(a, b)
    except ConversionError as err:
        raise HandshakeError(f"{refused}; and kvformats.codec.convert declares no conversion between them "
                             f"({err})") from None
    return "convert-exact" if row_record(a) == row_record(b) else "convert-lossy"


def staging_for(src: CacheDesc | Layout, n_pages: int, *, name: str | None = None,
                device=None) -> tuple[Layout, torch.Tensor, CacheDesc]:
    """(layout, cache, description) of a staging cache of the source's layout (a peer's
    ``CacheDesc``, checked, or a ``Layout``) with ``n_pages`` zeroed pages: the request's pages
    in request order (request row ``t`` at slot ``t``). ``name``: the cache's name in the plan
    (by default the description's)."""
    if isinstance(src, CacheDesc):
        layout = checked_layout(src, "source ")
        name = src.name if name is None else name
    elif isinstance(src, Layout):
        layout = src
    else:
        raise InputTypeError(f"src must be a CacheDesc or a Layout, got {describe(src)}")
    if type(n_pages) is not int or n_pages < 1:  # noqa: E721 - a bool is refused too
        raise InputTypeError(f"n_pages must be a positive int, got {describe(n_pages)}")
    if name is None:
        raise InputError("a staging cache from a Layout needs a name (the cache's name in the plan)")
    cache = layout.allocate(n_pages, device=device)
    return layout, cache, describe_cache(name, layout, cache)


def receive_converted(plan: TransferPlan, staging: Mapping[str, tuple[Layout, torch.Tensor]],
                      expected: Mapping[str, torch.Tensor], dst: Mapping[str, tuple[Layout, torch.Tensor]],
                      dst_slots: Mapping[str, torch.Tensor], *, exact: bool = True, backend: str = "auto") -> None:
    """Verify the staging caches against the sender's checksums of ``plan`` (the plan into the
    staging caches), then convert every cache of the plan into ``dst``: request row ``t`` (staging
    slot ``t``) to ``dst_slots[name][t]`` (negative: skipped). ``exact`` (default True): a
    conversion that does not give back every value bit for bit raises ConversionError; pass
    ``exact=False`` to accept the target's declared bound (``kvformats.codec.convert``). Raises
    IntegrityError (staging bytes differ: cache, request rows, region), ConversionError,
    InputError; in every case no byte of ``dst`` changes."""
    if not isinstance(exact, bool):
        raise InputTypeError(f"exact must be a bool, got {describe(exact)}")
    for what, m in (("staging", staging), ("dst", dst), ("dst_slots", dst_slots)):
        if not isinstance(m, Mapping):
            raise InputTypeError(f"{what} must be a mapping by cache name, got {describe(m)}")
    names = [n for p in plan.caches.values() for n in p.caches] if isinstance(plan, TransferPlan) else []
    missing = sorted(n for n in names if n not in dst or n not in dst_slots)
    if missing:
        raise InputError(f"the plan moves {missing}, with no destination cache or slots given for them")
    try:
        verify(plan, staging, expected, backend=backend)
    except IntegrityError as err:
        raise IntegrityError(f"{err} ({_staging_rows(plan, staging, expected, backend)}); nothing was written to "
                             f"the destination caches") from None
    converted = []
    for name in names:  # every check and conversion before the first write
        s_layout, s_cache = staging[name]
        d_layout, d_cache = dst[name]
        slots = dst_slots[name]
        check_cache(d_layout, d_cache)
        check_slots(d_layout, slots, None, d_cache, check_range="strict", unique=True)
        rows = torch.arange(slots.shape[0], dtype=torch.int64, device=s_cache.device)
        src_slots = torch.where(slots.to(rows.device) >= 0, rows, torch.full_like(rows, -1))
        check_slots(s_layout, src_slots, None, s_cache, check_range="strict", unique=False)
        converted.append((d_layout, d_cache, slots, convert_rows(s_layout, read_rows(s_layout, s_cache, src_slots),
                                                                d_layout, exact=exact)))
    for d_layout, d_cache, slots, out in converted:
        write_rows(d_layout, d_cache, slots, out.to(d_cache.device))


def _staging_rows(plan: TransferPlan, staging, expected, backend: str) -> str:
    """The first staging cache, request rows and region that differ, in words."""
    got = expected_checksums(plan, staging, side="dst", backend=backend)
    for p in plan.caches.values():
        for name in p.caches:
            bad = (got[name] != expected[name].to(got[name].device)).any(-1)
            if not bool(bad.any()):
                continue
            i, g = (int(v) for v in bad.nonzero()[0])
            layout = staging[name][0]
            if p.row_map is not None:
                first = int(p.row_map.start[i])
                stop, region = first + int(p.row_map.count[i]), row_regions(layout)[g]
            else:  # staging page j holds request rows [j * P, (j + 1) * P)
                r0, r1 = (int(v) for v in p.rows_of(name)[i])
                base = int(p.dst_pages[i]) * layout.page_size
                first, stop, region = base + r0, base + r1, layout.regions[g].name
            return f"staging cache {name!r}: request rows [{first}, {stop}), region {region!r}"
    return "staging caches"
