"""Kernel geometry of a block-scaled row, derived once from a layout's regions and their roles.

Every scaled row format declares one data region whose elements carry a block scale
(``Region.scale`` names the scale region, ``Region.block`` the elements per scale), that scale
region, and may declare an unscaled data region after it (the *tail*: fp8_ds_mla's bf16 RoPE
dims) and a pad beside the scales, which writers zero. ``row_geometry`` reads where each lies
off the declaration, so no kernel module looks a region up by its name; the ``*_constants``
views below give those numbers the constexpr names each kernel family's bodies use.
"""

from __future__ import annotations

import functools

import attrs

from kvformats.errors import LayoutError
from kvformats_kernels._common import next_pow2, per_layout

E2M1 = "float4_e2m1fn_x2"  # the element type stored as two nibbles a byte


@attrs.frozen
class Span:
    """Where one region's row lies in a page: row r at ``offset + r * stride``, ``nbytes`` bytes
    holding ``count`` elements of ``dtype``."""

    offset: int
    stride: int
    nbytes: int
    count: int
    dtype: str

    @classmethod
    def of(cls, region) -> Span:
        return cls(region.offset, region.row_stride, region.nbytes, region.count, region.dtype)


NO_SPAN = Span(0, 0, 0, 0, "uint8")  # a region the layout does not have: kernels skip it


@attrs.frozen
class RowGeometry:
    """A block-scaled row: ``data`` (scaled in blocks of ``block`` elements), ``scale`` (one per
    block), ``tail`` (unscaled data after them, or NO_SPAN) and ``pad`` (bytes of the scale
    record writers zero, or NO_SPAN); ``page_size`` rows a page."""

    data: Span
    scale: Span
    tail: Span
    pad: Span
    block: int
    page_size: int

    @property
    def blocks(self) -> int:
        return self.data.count // self.block

    @property
    def fp4(self) -> bool:
        """Whether the data are e2m1 nibbles."""
        return self.data.dtype == E2M1

    @property
    def has_tail(self) -> bool:
        return self.tail is not NO_SPAN


def _one(layout, what: str, regions: list):
    if len(regions) > 1:
        raise LayoutError(f"{layout.name} has {len(regions)} {what} regions "
                          f"({', '.join(r.name for r in regions)}); the kernels take at most one")
    return regions[0] if regions else None


@functools.lru_cache(maxsize=256)
def row_geometry(layout) -> RowGeometry:
    """The block-scaled row of ``layout`` (a LayoutError for a layout that has none), worked out
    once per layout: launchers ask on every call."""
    rows = [r for r in layout.regions if not r.per_page]
    data = _one(layout, "block-scaled data", [r for r in rows if r.role == "data" and r.scale])
    if data is None:
        raise LayoutError(f"{layout.name} has no block-scaled data region (a data region naming its scale)")
    scale = layout.region(data.scale)
    tail = _one(layout, "unscaled data", [r for r in rows if r.role == "data" and not r.scale])
    if tail is not None and tail.row_offset < data.row_offset:
        raise LayoutError(f"{layout.name}: the unscaled data region {tail.name!r} comes before the scaled one "
                          f"{data.name!r}; the kernels read the scaled dims first")
    pad = _one(layout, "scale pad", [r for r in rows if r.role == "pad" and r.segment == scale.segment])
    return RowGeometry(data=Span.of(data), scale=Span.of(scale), tail=NO_SPAN if tail is None else Span.of(tail),
                       pad=NO_SPAN if pad is None else Span.of(pad), block=data.block, page_size=layout.page_size)


@per_layout
def block_constants(layout) -> dict:
    """The indexer and V4.1 kernels' names: values (VAL_), scales, blocks (NB, padded NB_P2) of
    QB elements."""
    g = row_geometry(layout)
    return dict(VAL_OFF=g.data.offset, VAL_STRIDE=g.data.stride, SCALE_OFF=g.scale.offset,
                SCALE_STRIDE=g.scale.stride, NB=g.blocks, NB_P2=next_pow2(g.blocks), QB=g.block)


@per_layout
def nope_rope_constants(layout) -> dict:
    """The fp8_ds_mla kernels' names (codec and SWA insert): NoPE values, the RoPE tail, scales,
    the scale record's pad (none: zeros), the NoPE blocking."""
    g = row_geometry(layout)
    return dict(NOPE_OFF=g.data.offset, NOPE_STRIDE=g.data.stride, ROPE_OFF=g.tail.offset, ROPE_STRIDE=g.tail.stride,
                SCALE_OFF=g.scale.offset, SCALE_STRIDE=g.scale.stride, PAD_OFF=g.pad.offset, PAD_STRIDE=g.pad.stride,
                PAD_BYTES=g.pad.nbytes, PAD_P2=next_pow2(g.pad.nbytes), NB=g.blocks, NB_P2=next_pow2(g.blocks),
                QB=g.block)


@per_layout
def target_constants(layout) -> dict:
    """The compress-insert kernel's names: values (OFF0), the tail (OFF1; none: zeros), scales,
    the scale record's pad (none: zeros, and a padded width of 1), the blocking and the page size."""
    g = row_geometry(layout)
    return dict(PAGE_SIZE=g.page_size, NB=g.blocks, QB=g.block, OFF0=g.data.offset, STRIDE0=g.data.stride,
                OFF1=g.tail.offset, STRIDE1=g.tail.stride, SCALE_OFF=g.scale.offset, SCALE_STRIDE=g.scale.stride,
                PAD_OFF=g.pad.offset, PAD_STRIDE=g.pad.stride, PAD_BYTES=g.pad.nbytes,
                PAD_P2=next_pow2(g.pad.nbytes) if g.pad.nbytes else 1)
