"""Token rows across page geometries: where each row of a request lies on each side, and the
byte segments that move it.

Two sides may hold one request in pages of other sizes, strides, pads and arena layouts (a
prefill engine with 64-row blocks, a decode engine with 32). A record's bytes do not depend on
the page; only where they lie does. Row ``t`` of a layout segment (a run of ``page_size``
records back to back: fp8_ds_mla's token records, then its page-tail scale records; an
indexer's values, then its scales) lies at ``segment offset + (t % P) * record bytes`` of page
``pages[t // P]``, with each side's own ``P`` and segment offsets. So the segment's records of
row ``t`` go from ``(src_pages[t // Ps], t % Ps)`` to ``(dst_pages[t // Pd], t % Pd)``: a scale
row lands in the destination page's own tail, not at the offset it had at the source.

Row rules (``rows=`` of ``plan_transfer``, one per cache):

* ``n`` or ``(start, stop)``: the request's rows ``[0, n)`` or ``[start, stop)``, row ``t`` on
  the request's page ``t // P`` of each side. One rule for every cache that grows by rows: the
  SWA cache of the layer-step reference (one row per position), the CSA and HCA rows and the
  indexer (one row per compressed position: the caller passes ``tokens // ratio``) and the
  compressor states, whose rows are per-request state slots (the reference: one slot per
  position): slot ``i`` is copied whole to slot ``i`` of the destination, whatever the pages.
* ``Ring(tokens, window)``: a ring buffer of the request's pages in ring order (an SWA window
  ring, a compressor-state ring: ``LayerConfig.state_ring_pages``). Position ``p`` lives at ring
  row ``p mod R``, ``R`` = the request's pages times ``P`` on that side, so each side keeps its
  own ring length; the positions ``[tokens - window, tokens)`` move, and ``window`` must fit
  both rings.

Rows are cut into chunks at every page boundary of either side, so that each chunk lies in one
page on both sides: one segment per chunk and layout segment, and a checksum per chunk that
both sides compute alike over their own pages (``kvformats.transfer.checksum.row_checksums``).
Everything here is torch on host tensors, no loop over rows.
"""

from __future__ import annotations

import attrs
import torch

from kvformats.errors import InputError, InputTypeError, describe
from kvformats.layout import Layout


def _count(value, what: str) -> int:
    if type(value) is not int or value < 0:  # noqa: E721 - a bool is refused too
        raise InputTypeError(f"{what} must be a non-negative int, got {describe(value)}")
    return value


@attrs.frozen
class Ring:
    """The rows of a ring cache: positions ``[tokens - window, tokens)`` (from 0 when fewer),
    position ``p`` at ring row ``p mod R`` on each side (module doc)."""

    tokens: int = attrs.field()
    window: int = attrs.field()

    @tokens.validator
    def _tokens(self, attribute, value):
        _count(value, "Ring.tokens")

    @window.validator
    def _window(self, attribute, value):
        if _count(value, "Ring.window") == 0:
            raise InputError("Ring.window must be at least 1 row")

    @property
    def start(self) -> int:
        return max(0, self.tokens - self.window)


@attrs.frozen(eq=False)
class RowMap:
    """One cache's rows of a request in chunks, each inside one page on both sides. int64
    ``[C]`` each: ``start`` the chunk's first request row (a position for a ring), ``count`` its
    rows, ``src_page``/``dst_page`` the page ids and ``src_row``/``dst_row`` the first row in
    those pages."""

    start: torch.Tensor
    count: torch.Tensor
    src_page: torch.Tensor
    src_row: torch.Tensor
    dst_page: torch.Tensor
    dst_row: torch.Tensor

    @property
    def rows(self) -> torch.Tensor:
        """int64 ``[C, 2]``: each chunk's request rows [start, stop)."""
        return torch.stack([self.start, self.start + self.count], 1)

    def page_rows(self, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(pages ``[C]``, in-page rows ``[C, 2]``) of ``side`` ("src" or "dst"): what the
        checksum of each chunk reads there."""
        page, row = (self.src_page, self.src_row) if side == "src" else (self.dst_page, self.dst_row)
        return page, torch.stack([row, row + self.count], 1)


def row_range(name: str, spec) -> tuple[int, int, bool]:
    """(start, stop, ring) of a ``rows=`` entry: ``n``, ``(start, stop)`` or a ``Ring``."""
    if isinstance(spec, Ring):
        return spec.start, spec.tokens, True
    if type(spec) is int:  # noqa: E721 - not a bool
        spec = (0, spec)
    if not (isinstance(spec, tuple) and len(spec) == 2 and all(type(r) is int for r in spec)):  # noqa: E721
        raise InputTypeError(f"rows[{name!r}] must be a row count, a (start, stop) tuple of ints or a Ring, "
                             f"got {spec!r}")
    start, stop = spec
    if not 0 <= start < stop:
        raise InputError(f"rows[{name!r}] = {spec} is no row range: need 0 <= start < stop")
    return start, stop, False


def _cuts(start: int, stop: int, sizes: tuple[int, int]) -> torch.Tensor:
    """int64: ``start``, every multiple of either page size inside (start, stop), ``stop``."""
    parts = [torch.tensor([start, stop], dtype=torch.int64)]
    for size in sizes:
        first = -(-start // size) * size
        if first < stop:
            parts.append(torch.arange(first, stop, size, dtype=torch.int64))
    return torch.unique(torch.cat(parts))  # sorted


def _place(t: torch.Tensor, pages: torch.Tensor, size: int, ring: bool):
    """(page ids, in-page rows) of request rows ``t`` on one side."""
    index = t // size
    if ring:
        index = index % pages.numel()
    return pages[index], t % size


def row_map(name: str, spec, src_pages: torch.Tensor, dst_pages: torch.Tensor, src_size: int,
            dst_size: int) -> RowMap:
    """The chunks of ``spec``'s rows (``row_range``) between the request's pages on each side
    (int64 ``[n]`` page ids, in request or ring order) of ``src_size`` and ``dst_size`` rows.
    InputError when the rows run past either side's pages, or a window past either ring."""
    start, stop, ring = row_range(name, spec)
    for side, pages, size in (("source", src_pages, src_size), ("destination", dst_pages, dst_size)):
        capacity = pages.numel() * size
        if ring and stop - start > capacity:
            raise InputError(f"cache {name!r}: a window of {stop - start} rows does not fit the {side}'s ring of "
                             f"{pages.numel()} pages of {size} rows ({capacity} rows): rows would overwrite "
                             f"each other")
        if not ring and stop > capacity:
            raise InputError(f"cache {name!r}: rows [{start}, {stop}) run past the {side}'s capacity: the request "
                             f"has {pages.numel()} pages of {size} rows there ({capacity} rows)")
    cuts = _cuts(start, stop, (src_size, dst_size))
    first, count = cuts[:-1], cuts[1:] - cuts[:-1]
    sp, sr = _place(first, src_pages, src_size, ring)
    dp, dr = _place(first, dst_pages, dst_size, ring)
    return RowMap(start=first, count=count, src_page=sp, src_row=sr, dst_page=dp, dst_row=dr)


def segment_places(layout: Layout) -> list[tuple[int, int]]:
    """(in-page offset, record bytes) of each layout segment, page order."""
    return [(layout.segment_offsets[s.name], s.record_bytes) for s in layout.segments]


def row_segments(rows: RowMap, src_layout: Layout, dst_layout: Layout, src_at: tuple[int, int],
                 dst_at: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Paired int64 ``[C * k, 2]`` (offset, length) segments of every chunk and layout segment:
    the source's from ``src_at`` = (offset of page 0 in its arena, page stride), the
    destination's likewise, each at its own layout's segment offsets."""
    src, dst = [], []
    for (s_off, record), (d_off, d_record) in zip(segment_places(src_layout), segment_places(dst_layout)):
        if record != d_record:  # one record on both sides (the handshake): never reached
            raise InputError(f"record bytes differ between the two sides' layouts ({record} and {d_record})")
        length = rows.count * record
        src.append(torch.stack([src_at[0] + rows.src_page * src_at[1] + s_off + rows.src_row * record, length], 1))
        dst.append(torch.stack([dst_at[0] + rows.dst_page * dst_at[1] + d_off + rows.dst_row * record, length], 1))
    return torch.stack(src, 1).flatten(0, 1), torch.stack(dst, 1).flatten(0, 1)
