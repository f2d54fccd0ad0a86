"""The numbers a report draws, as tensors: per row, whether it was written and which ``check``
rules it breaks; per page, its decoded values, NaN / Inf / saturated maps, scale exponents and
code histograms.

Everything is computed from ``layout.regions`` with the readers of ``kvformats.caches`` (region
bytes, decoded values) and the rules of ``kvformats.caches.check``, so every format, and a format
declared tomorrow, gets the same tables.
"""

from __future__ import annotations

import functools

import torch

from kvformats.caches.check import CHUNK_BYTES, _violations, scale_exponent_range
from kvformats.caches.regions import element_values, region_bytes, scaled_values, ue8m0_reading
from kvformats.layout import Layout, Region
from kvformats.numerics.elements import ELEMENTS

# Row status codes of ``row_status``: a failing row breaks a check rule, written or not.
ZERO, WRITTEN, FAILING = 0, 1, 2
STATUS_NAMES = ("zero", "written", "failing")
MAP_WIDTH = 64  # elements per map cell in a region without quantization blocks


def page_chunk(layout: Layout) -> int:
    """Pages per chunk when streaming a whole cache (the chunk ``check`` uses: memory stays bounded)."""
    return max(1, CHUNK_BYTES // max(layout.page_bytes, 1))


def row_regions(layout: Layout) -> tuple[Region, ...]:
    return tuple(r for r in layout.regions if not r.per_page)


def data_regions(layout: Layout) -> tuple[Region, ...]:
    return tuple(r for r in layout.regions if r.role == "data")


def scale_regions(layout: Layout) -> tuple[Region, ...]:
    return tuple(r for r in layout.regions if r.role == "scale")


def cell_width(region: Region) -> int:
    """Elements per cell of a region's maps: one quantization block, else MAP_WIDTH."""
    return region.block or min(region.count, MAP_WIDTH)


def written_rows(layout: Layout, cache: torch.Tensor, pages: slice) -> torch.Tensor:
    """bool ``[pages, rows]``: rows holding a nonzero byte (a row of zeros was never written)."""
    regions = row_regions(layout)
    first = region_bytes(layout, cache, regions[0], pages)
    written = torch.zeros(first.shape[:2], dtype=torch.bool, device=cache.device)
    for region in regions:
        written |= region_bytes(layout, cache, region, pages).amax(-1) != 0
    return written


def findings(layout: Layout, cache: torch.Tensor, pages: slice) -> tuple[dict[str, torch.Tensor], dict]:
    """(row rules, page rules) for the pages ``pages``: ``"region:rule"`` -> bool ``[pages, rows]``
    of the rows breaking it, and -> bool ``[pages]`` for the rules of per-page regions (the page
    pad). The rules are ``check``'s own (``kvformats.caches.check._violations``): each row is
    handed to it as a page of one row, so its per-page answer is a per-row one."""
    return _scan(layout, cache, pages)[1:]


def _scan(layout: Layout, cache: torch.Tensor, pages: slice) -> tuple[torch.Tensor, dict, dict]:
    """(written rows, row rules, page rules): ``findings`` and the rows it exempts, in one read."""
    erange = scale_exponent_range(layout)
    written = written_rows(layout, cache, pages)
    count, rows = written.shape
    by_row: dict[str, torch.Tensor] = {}
    by_page: dict[str, torch.Tensor] = {}
    for region in layout.regions:
        raw = region_bytes(layout, cache, region, pages)
        if region.per_page:
            found = _violations(layout, region, raw, written.any(-1, keepdim=True), erange)
            by_page.update({f"{region.name}:{rule}": bad for rule, bad in found.items()})
            continue
        single = raw.reshape(count * rows, 1, raw.shape[-1])
        found = _violations(layout, region, single, written.reshape(count * rows, 1), erange)
        by_row.update({f"{region.name}:{rule}": bad.reshape(count, rows) for rule, bad in found.items()})
    return written, by_row, by_page


def row_status(layout: Layout, cache: torch.Tensor, pages: slice) -> tuple[torch.Tensor, dict]:
    """(int8 ``[pages, rows]`` of ZERO / WRITTEN / FAILING, page rules as ``findings`` gives them)."""
    written, by_row, by_page = _scan(layout, cache, pages)
    status = written.to(torch.int8)
    for bad in by_row.values():
        status[bad] = FAILING
    return status, by_page


def values(layout: Layout, cache: torch.Tensor, page: int) -> dict[str, torch.Tensor]:
    """Data region -> float32 ``[rows, count]``: the page's decoded values (elements times their
    block scale, as ``decode`` reads them)."""
    one = slice(page, page + 1)
    return {r.name: scaled_values(layout, cache, r, one)[0] for r in data_regions(layout)}


def saturated(layout: Layout, cache: torch.Tensor, page: int) -> dict[str, torch.Tensor]:
    """Data region -> bool ``[rows, count]``: elements holding the largest code of their grid
    (e4m3 +-448, e2m1 +-6), where the quantizer clipped; all False for unquantized types."""
    out = {}
    for region in data_regions(layout):
        raw = region_bytes(layout, cache, region, slice(page, page + 1))[0]
        grid = region.element.grid
        unscaled = element_values(region, raw)
        out[region.name] = unscaled.abs() == grid.max if grid is not None else torch.zeros_like(unscaled,
                                                                                             dtype=torch.bool)
    return out


def scale_exponents(layout: Layout, cache: torch.Tensor, page: int) -> dict[str, torch.Tensor]:
    """Scale region -> float32 ``[rows, blocks]``: floor(log2 |scale|) of each block's scale, in
    block order (``Layout.scale_order``), as the layout's profile reads the bytes; -inf for a zero
    scale (a row never written), NaN and inf where the scale is."""
    out = {}
    for region in scale_regions(layout):
        raw = region_bytes(layout, cache, region, slice(page, page + 1))[0]
        scales = element_values(region, raw, ue8m0_reading(layout))
        order = layout.scale_order(region.name)
        if order is not None:
            scales = scales[..., list(order)]
        out[region.name] = torch.floor(torch.log2(scales.abs()))
    return out


def code_histogram(layout: Layout, cache: torch.Tensor, page: int, rows: torch.Tensor | None = None
                   ) -> dict[str, torch.Tensor]:
    """Data region -> int64 ``[bins]``: how many elements of the page's rows ``rows`` (bool
    ``[rows]``; default all) hold each code. Types of at most 8 bits count every code; wider ones
    (bf16, float32) count the top byte of the code (sign and high exponent bits)."""
    out = {}
    for region in data_regions(layout):
        raw = region_bytes(layout, cache, region, slice(page, page + 1))[0]
        if rows is not None:
            raw = raw[rows]
        elem = region.element
        codes = elem.codes(raw).flatten()
        shift = max(elem.bits - 8, 0)
        out[region.name] = torch.bincount(codes >> shift, minlength=1 << min(elem.bits, 8))
    return out


@functools.lru_cache(maxsize=None)
def code_values(dtype: str) -> tuple[float, ...]:
    """The unscaled value of every code of an element type of at most 8 bits, by code (empty for
    wider types, whose histogram counts top bytes)."""
    elem = ELEMENTS[dtype]
    if elem.bits > 8:
        return ()
    units = torch.zeros((1 << elem.bits, elem.unit_bytes), dtype=torch.uint8)
    units[:, 0] = torch.arange(1 << elem.bits, dtype=torch.uint8)  # the code as the unit's first element
    return tuple(elem.decode(units, "nan")[:, 0].tolist())


def cell_counts(mask: torch.Tensor, width: int) -> torch.Tensor:
    """int64 ``[rows, cells]``: how many True elements each cell of ``width`` elements holds."""
    rows, count = mask.shape
    cells = -(-count // width)
    padded = torch.zeros((rows, cells * width), dtype=torch.int64, device=mask.device)
    padded[:, :count] = mask.to(torch.int64)
    return padded.reshape(rows, cells, width).sum(-1)
