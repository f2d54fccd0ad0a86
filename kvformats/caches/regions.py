"""Look inside caches: the bytes and decoded values of any region, derived from the layout.

Every function here works from ``layout.regions`` alone (element types, scale links, block
sizes), so a new format is inspectable the day it is declared.
"""

from __future__ import annotations

import torch

from kvformats.layout import Layout, Region


def page_width(layout: Layout, cache: torch.Tensor) -> int:
    """Bytes of one page of ``cache``: at least ``layout.min_page_bytes``, and not always
    ``layout.page_bytes`` (a cache's pages may be narrower or wider than ``allocate`` makes them)."""
    u8, _ = layout.byte_pages(cache)
    width = 1
    for d in u8.shape[1:]:
        width *= d
    return width


def region_nbytes(layout: Layout, cache: torch.Tensor, region: Region) -> int:
    """Bytes per row (per page for the page pad) of ``region`` that exist in ``cache``: the page
    pad is cut at the cache's page width, so nothing between pages is ever read."""
    if not region.per_page:
        return region.nbytes
    return max(0, min(region.nbytes, page_width(layout, cache) - region.offset))


def region_bytes(layout: Layout, cache: torch.Tensor, region: Region, pages: slice = slice(None)) -> torch.Tensor:
    """uint8 ``[pages, rows, nbytes]`` (page pad: ``[pages, 1, pad bytes inside the page]``) raw
    view of one region."""
    u8, stride = layout.byte_pages(cache)
    rows, row_stride = (1, 0) if region.per_page else (layout.page_size, region.row_stride)
    view = u8.as_strided((cache.shape[0], rows, region_nbytes(layout, cache, region)), (stride, row_stride, 1),
                         u8.storage_offset() + region.offset)
    return view[pages]


def element_values(region: Region, raw: torch.Tensor, ue8m0_ff: str = "nan") -> torch.Tensor:
    """Decode raw region bytes ``[..., nbytes]`` to unscaled float32 elements ``[..., count]``;
    ue8m0 byte 0xFF reads as ``ue8m0_ff`` says (a profile's reading, numerics.ue8m0_decode)."""
    return region.element.decode(raw, ue8m0_ff)


def ue8m0_reading(layout: Layout) -> str:
    """How the layout's profile reads ue8m0 byte 0xFF ("nan" for layouts without a profile)."""
    profile = getattr(layout, "numerics", None)
    return profile.ue8m0_ff if profile is not None else "nan"


def scaled_values(layout: Layout, cache: torch.Tensor, region: Region, pages: slice = slice(None)) -> torch.Tensor:
    """float32 ``[pages, rows, count]``: a region's elements times their block scale (if any),
    scale byte 0xFF read as the layout's profile reads it (as decode does)."""
    values = element_values(region, region_bytes(layout, cache, region, pages))
    if not region.scale:
        return values
    scale = layout.region(region.scale)
    scales = element_values(scale, region_bytes(layout, cache, scale, pages), ue8m0_reading(layout))
    order = layout.scale_order(scale.name)
    if order is not None:  # stored out of block order (Layout.scale_order)
        scales = scales[..., list(order)]
    blocks = values.reshape(*values.shape[:-1], -1, region.block)
    return (blocks * scales[..., : blocks.shape[-2], None]).reshape(values.shape)


def elements_per_byte(region: Region) -> float:
    return region.element.elements_per_byte


def label(layout: Layout, region: Region, row: int, within: int) -> str:
    """Human label of a byte: region, row, element index and quantization block."""
    if region.per_page:
        return f"{region.name} (+{within})"
    elem = int(within * elements_per_byte(region))
    text = f"row {row} {region.name}[{elem}]"
    if region.block:
        text += f" block {elem // region.block}"
    return text
