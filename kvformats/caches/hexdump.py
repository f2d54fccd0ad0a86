"""Text and JSON renderings of cache pages and slots: annotated hexdumps where every line names
its region, row and block, and a slot's decoded values beside its bytes."""

from __future__ import annotations

import math

import torch

from kvformats.caches.regions import (element_values, elements_per_byte, label, page_width, region_bytes, scaled_values,
                                ue8m0_reading)
from kvformats.layout import Layout

LINE = 16


def json_number(v: float):
    """A float for JSON: non-finite values become the strings 'nan', 'inf', '-inf'."""
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def page_lines(layout: Layout, cache: torch.Tensor, page: int, rows: range | None = None) -> list[dict]:
    """One dict per dump line of ``page``, in byte order: offset (in the page), hex, region, row,
    element, block. Lines never straddle a region; ``rows`` limits which rows are shown."""
    rows = range(layout.page_size) if rows is None else rows
    out: list[dict] = []
    for region in layout.regions:
        raw = region_bytes(layout, cache, region, slice(page, page + 1))[0]
        for r in ([0] if region.per_page else rows):
            base = region.offset + (0 if region.per_page else r * region.row_stride)
            data = bytes(raw[r].tolist())
            for at in range(0, len(data), LINE):
                elem = int(at * elements_per_byte(region))
                out.append({"offset": base + at, "hex": data[at:at + LINE].hex(" "), "region": region.name,
                            "row": None if region.per_page else r, "element": elem,
                            "block": elem // region.block if region.block else None,
                            "label": label(layout, region, r, at)})
    out.sort(key=lambda line: line["offset"])
    return out


def hexdump_page(layout: Layout, cache: torch.Tensor, page: int, rows: range | None = None) -> str:
    """Annotated hexdump of one page (offsets relative to the page start)."""
    lines = [f"{layout.name} page {page} (page stride {layout.byte_pages(cache)[1]} B, "
             f"{page_width(layout, cache)} B per page)"]
    for line in page_lines(layout, cache, page, rows):
        lines.append(f"{line['offset']:08x}  {line['hex']:<47}  | {line['label']}")
    return "\n".join(lines)


def page_summary(layout: Layout, cache: torch.Tensor, page: int) -> str:
    """One line per region of ``page``: where it lies in the page, its size, how many of its rows
    hold a nonzero byte, and its first bytes; what ``kvformats dump --page`` prints unless asked
    for every line (a page is thousands of hexdump lines)."""
    lines = [f"{layout.name} page {page} (page stride {layout.byte_pages(cache)[1]} B, "
             f"{page_width(layout, cache)} B per page): summary",
             f"  {'region':<12} {'dtype':<17} {'offset':>8} {'bytes':>7} {'rows written':>13}  first bytes"]
    for region in layout.regions:
        raw = region_bytes(layout, cache, region, slice(page, page + 1))[0]
        if raw.numel() == 0:  # a page pad the cache's narrower pages do not hold
            continue
        written = int((raw != 0).any(dim=1).sum())
        rows = "—" if region.per_page else f"{written}/{raw.shape[0]}"
        first = bytes(raw[0, :8].tolist()).hex(" ")
        lines.append(f"  {region.name:<12} {region.dtype:<17} {region.offset:>8} {raw.numel():>7} {rows:>13}  {first}")
    lines.append("every line: --full; some rows: --rows A:B; one slot decoded: --slot S")
    return "\n".join(lines)


def slot_record(layout: Layout, cache: torch.Tensor, slot: int) -> dict:
    """A slot's regions: absolute byte offset, hex bytes, and decoded (scaled) values."""
    page, row = divmod(slot, layout.page_size)
    stride = layout.byte_pages(cache)[1]
    regions = []
    for region in layout.regions:
        if region.per_page:
            continue
        pages = slice(page, page + 1)
        raw = region_bytes(layout, cache, region, pages)[0, row]
        values = scaled_values(layout, cache, region, pages)[0, row] if region.role == "data" \
            else element_values(region, raw, ue8m0_reading(layout))
        regions.append({"name": region.name, "dtype": region.dtype, "role": region.role,
                        "offset": page * stride + region.offset + row * region.row_stride,
                        "hex": bytes(raw.tolist()).hex(), "scale": region.scale or None,
                        "block": region.block or None, "values": [json_number(v) for v in values.tolist()]})
    return {"format": layout.name, "params": layout.params, "slot": slot, "page": page, "row": row,
            "regions": regions}


def dump_slot(layout: Layout, cache: torch.Tensor, slot: int, per_line: int = 8) -> str:
    """A slot's bytes with decoded values beside them, region by region."""
    rec = slot_record(layout, cache, slot)
    out = [f"{layout.name} slot {slot} = page {rec['page']} row {rec['row']}"]
    for reg in rec["regions"]:
        raw = bytes.fromhex(reg["hex"])
        per_byte = len(reg["values"]) / max(len(raw), 1)
        scale = f"; blocks of {reg['block']} scaled by region {reg['scale']}" if reg["scale"] else ""
        out.append(f"  {reg['name']} ({reg['dtype']}, {reg['role']}{scale}) at byte {reg['offset']}:")
        step = min(LINE, max(1, int(round(per_line / per_byte)))) if per_byte else per_line
        for at in range(0, len(raw), step):
            vals = reg["values"][int(at * per_byte):int((at + step) * per_byte)]
            shown = " ".join(f"{v:.6g}" if isinstance(v, float) else v for v in vals)
            out.append(f"    +{at:<4} {raw[at:at + step].hex(' '):<{3 * min(step, len(raw))}} {shown}")
    return "\n".join(out)
