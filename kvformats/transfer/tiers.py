"""Offload a request's rows of every V4 cache to host memory, and restore them exactly into
other pages (another page size included).

``offload(caches, rows)`` gathers, per cache, the request's rows ``[start, stop)`` (the row
rules of ``tiers_rows``: the SWA window, every compressed row, the compressor state of the open
groups) as whole records in request order, checksums them per 64 rows and region
(``tiers_checksum``; ``checksums=False`` skips them: on a GPU they cost little, on a CPU more
than the copy) and copies both to host memory: pinned memory with ``non_blocking`` copies
for CUDA caches, so ``offload`` returns as soon as the copies are queued; plain memory for CPU
caches. ``HostTier.wait()`` waits for the copies: call it before reading the host rows on the
host (``save_tier`` calls it). Writing the source pages again is safe without it on the same
stream: the copies were queued first.

``restore(tier, caches)`` writes the records byte for byte (no re-quantization) into the
destination pages of each cache, each record at its own place in the destination page. Every
check runs before any byte of the destination changes: the record (HandshakeError naming both
identities, another record of the same bytes per token included: a layout that differs in
anything but its page size), the destination pages (InputError: a page id outside the cache,
rows past the request's pages, two rows on one slot), and with ``verify`` the checksums
(IntegrityError naming the cache, the rows and the region: one host read, the comparison).
The copies to the device are ``non_blocking`` and the writes are queued on the current stream:
kernels queued after ``restore`` on that stream see the rows.

Lossy storage is never implicit: ``offload(cold=...)`` names a declared codec
(``kvformats.codec.cold``) for the caches it converts, and ``restore`` converts those rows back
into the destination's format with it. See docs/tiers.md.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import torch

from kvformats.codec.cold import ColdCodec
from kvformats.codec.records import identity_label, record_of
from kvformats.codec.rows import read_rows
from kvformats.errors import HandshakeError, InputError, InputTypeError, IntegrityError, describe
from kvformats.layout import Layout
from kvformats.transfer.tiers_checksum import CHUNK_ROWS, checksum_rows, first_mismatch, row_spans
from kvformats.transfer.tiers_rows import RequestPages, check_request_pages, check_rows_range, place_rows, \
    request_slots


@attrs.frozen(eq=False)  # holds tensors: compared by identity
class TierRows:
    """One cache's rows in a tier: ``rows`` (uint8 ``[stop - start, width]``, host memory) are
    the request's rows ``[start, stop)`` of ``layout``'s record, or of ``cold``'s cold record;
    ``checksums`` (int64 ``[chunks, regions, 2]``) are theirs (``tiers_checksum``), None when
    the offload skipped them."""

    layout: Layout
    start: int
    stop: int
    rows: torch.Tensor
    checksums: torch.Tensor | None
    cold: ColdCodec | None = None

    @property
    def spans(self) -> tuple[tuple[str, int, int], ...]:
        """The regions of one stored row (the cold record's when converted)."""
        return self.cold.spans(self.layout) if self.cold is not None else row_spans(self.layout)

    @property
    def nbytes(self) -> int:
        """Bytes of rows held."""
        return self.rows.numel()


@attrs.define(eq=False)
class HostTier:
    """A request's offloaded rows, cache name -> ``TierRows``; ``events``: the CUDA events
    recorded after the device-to-host copies (none for CPU caches)."""

    caches: dict[str, TierRows]
    events: list = attrs.field(factory=list)

    def wait(self) -> None:
        """Block until the device-to-host copies are done (nothing to wait for on the CPU)."""
        for event in self.events:
            event.synchronize()
        self.events = []

    @property
    def nbytes(self) -> int:
        """Bytes of rows held (checksums not counted)."""
        return sum(t.nbytes for t in self.caches.values())


def _cold_for(name: str, layout: Layout, cold) -> ColdCodec | None:
    """The codec that converts cache ``name``: ``cold`` is None, one codec (every cache of its
    source format) or a mapping name -> codec (only those caches)."""
    if cold is None:
        return None
    if isinstance(cold, ColdCodec):
        return cold if layout.name == cold.source else None
    if isinstance(cold, Mapping):
        codec = cold.get(name)
        if codec is not None and not isinstance(codec, ColdCodec):
            raise InputTypeError(f"cold[{name!r}] must be a ColdCodec (kvformats.codec.cold), got {describe(codec)}")
        if codec is not None and layout.name != codec.source:
            raise InputError(f"cold[{name!r}]: the codec {codec.name} converts {codec.source} rows; cache "
                             f"{name!r} holds {layout.name}")
        return codec
    raise InputTypeError(f"cold must be None, a ColdCodec or a mapping name -> ColdCodec, got {describe(cold)}")


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory: itself on the CPU (a fresh gather already), else a pinned copy
    queued without waiting."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def offload(caches: Mapping[str, RequestPages], rows: Mapping[str, tuple[int, int]], *,
            cold: ColdCodec | Mapping[str, ColdCodec] | None = None, checksums: bool = True) -> HostTier:
    """Copy the request's rows ``rows[name] = (start, stop)`` of every cache named in ``rows``
    (found through ``caches[name]``) to host memory (module doc). ``cold``: a declared lossy
    codec for the caches of its source format (or a mapping name -> codec); None keeps every
    record as it is. ``checksums``: take the rows' checksums (what ``restore(verify=True)``
    compares; ``save_tier`` takes them where they were skipped). Every argument is checked
    before anything is read."""
    if not isinstance(caches, Mapping) or not isinstance(rows, Mapping):
        raise InputTypeError(f"caches and rows must be mappings by cache name, got {describe(caches)} and "
                             f"{describe(rows)}")
    plan = []
    for name, span in rows.items():
        if name not in caches:
            raise InputError(f"rows name cache {name!r}, not among the caches given: {sorted(caches)}")
        where = check_request_pages(name, caches[name])
        start, stop = check_rows_range(name, span)
        plan.append((name, where, start, request_slots(name, where, start, stop), _cold_for(name, where.layout, cold)))
    out, devices = {}, set()
    for name, where, start, slots, codec in plan:
        device = where.cache.device
        got = read_rows(where.layout, where.cache, slots.to(device, non_blocking=True))
        if codec is not None:
            got = codec.encode(where.layout, got)
        spans = codec.spans(where.layout) if codec is not None else row_spans(where.layout)
        sums = _to_host(checksum_rows(got, spans)) if checksums else None
        out[name] = TierRows(where.layout, start, start + slots.shape[0], _to_host(got), sums, codec)
        if device.type == "cuda":
            devices.add(device)
    events = []
    for device in sorted(devices, key=str):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return HostTier(out, events)


def same_record(src: Layout, dst: Layout) -> bool:
    """Rows of ``src`` may be written into ``dst`` pages as they are: the same layout in all but
    its page size, hence the same record identity."""
    return type(src) is type(dst) and attrs.evolve(src, page_size=dst.page_size) == dst \
        and record_of(src).identity() == record_of(dst).identity()


def _check_record(name: str, held: TierRows, dst: Layout) -> None:
    if same_record(held.layout, dst):
        return
    src = held.layout
    params = {k: v for k, v in src.params.items() if k != "page_size"}
    want = {k: v for k, v in dst.params.items() if k != "page_size"}
    size = " (the same bytes per token, another record)" if src.row_bytes == dst.row_bytes else ""
    raise HandshakeError(f"cache {name!r}: the tier holds {src.name} {params} rows, record "
                         f"{identity_label(record_of(src).identity())}; the destination pool is {dst.name} {want}, "
                         f"record {identity_label(record_of(dst).identity())}{size}: nothing was restored")


def check_tier(tier) -> HostTier:
    """``tier`` if it is a HostTier; InputTypeError otherwise."""
    if not isinstance(tier, HostTier):
        raise InputTypeError(f"tier must be a HostTier (offload, load_tier), got {describe(tier)}")
    return tier


def _checked_sums(name: str, held: TierRows) -> torch.Tensor:
    """The tier's checksums of cache ``name``; InputError where the offload skipped them."""
    if held.checksums is None:
        raise InputError(f"cache {name!r}: the tier was offloaded with checksums=False: nothing to verify; "
                         f"pass verify=False to restore it unverified")
    return held.checksums


def verify_rows(name: str, held: TierRows, rows: torch.Tensor) -> None:
    """IntegrityError naming the cache, rows and region when ``rows`` (the tier's rows on some
    device) do not match the tier's checksums (one host read)."""
    got = checksum_rows(rows, held.spans)
    found = first_mismatch(got, _checked_sums(name, held).to(rows.device))
    if found is not None:
        chunk, region, n = found
        first = held.start + chunk * CHUNK_ROWS
        last = min(first + CHUNK_ROWS, held.stop) - 1
        raise IntegrityError(f"cache {name!r}: rows {first}..{last} differ in region {held.spans[region][0]!r} from "
                             f"what was offloaded ({n} of {got.shape[0]} chunks of {CHUNK_ROWS} rows differ); "
                             f"nothing was restored")


def restore(tier: HostTier, caches: Mapping[str, RequestPages], *, verify: bool = True) -> None:
    """Write every cache of ``tier`` into the request's pages ``caches[name]`` (module doc);
    the destination may have other page ids and another page size, not another record.
    ``verify``: compare the rows' checksums first (``load_tier`` already did for a file)."""
    tier = check_tier(tier)
    if not isinstance(caches, Mapping):
        raise InputTypeError(f"caches must be a mapping name -> RequestPages, got {describe(caches)}")
    missing = sorted(set(tier.caches) - set(caches))
    if missing:
        raise InputError(f"the tier holds caches {missing} that the destination does not name: {sorted(caches)}")
    plan = []
    for name, held in tier.caches.items():
        where = check_request_pages(name, caches[name])
        _check_record(name, held, where.layout)
        if verify:
            _checked_sums(name, held)
        plan.append((name, held, where, request_slots(name, where, held.start, held.stop)))
    moved = [(name, held, where, slots, held.rows.to(where.cache.device, non_blocking=True))
             for name, held, where, slots in plan]
    if verify:
        _verify_all(moved)
    for _, held, where, slots, rows in moved:  # only now, every check passed: the writes
        if held.cold is not None:
            rows = held.cold.decode(where.layout, rows)
        place_rows(where.layout, where.cache, slots.to(where.cache.device, non_blocking=True), rows)


def _verify_all(moved) -> None:
    """Every cache's checksums compared on its device, then one host read for all of them; the
    cache that differs is found only when one does."""
    differ = [(checksum_rows(rows, held.spans) != _checked_sums(name, held).to(rows.device)).any()
              for name, held, _, _, rows in moved]
    if differ and bool(torch.stack([d.to(differ[0].device) for d in differ]).any()):
        for name, held, _, _, rows in moved:
            verify_rows(name, held, rows)
