"""``kvformats diff``: field-wise difference of two caches of one layout.

Counts differing bytes and rows per region, lists the first differing bytes with their region,
page, row and block and both decoded values, and finds the largest decoded difference per
region. Streams pages in chunks; works for every format from its regions alone.
"""

from __future__ import annotations

import torch

from kvformats.caches.check import CHUNK_BYTES
from kvformats.caches.hexdump import json_number
from kvformats.caches.regions import elements_per_byte, page_width, region_bytes, scaled_values
from kvformats.errors import InputError
from kvformats.layout import Layout


def _first_items(layout, region, a, b, start, mismatch, room, first_page):
    """Up to ``room`` dicts describing the first differing bytes of one region chunk."""
    items = []
    if room <= 0:
        return items
    idx = mismatch.nonzero()[:room]
    if not idx.numel():
        return items
    va = scaled_values(layout, a, region, slice(start, start + mismatch.shape[0]))
    vb = scaled_values(layout, b, region, slice(start, start + mismatch.shape[0]))
    ra, rb = region_bytes(layout, a, region, slice(start, None)), region_bytes(layout, b, region, slice(start, None))
    for p, r, byte in idx.tolist():
        elem = int(byte * elements_per_byte(region))
        items.append({"region": region.name, "page": first_page + start + p, "row": None if region.per_page else r,
                      "byte": byte, "element": elem, "block": elem // region.block if region.block else None,
                      "a": f"{int(ra[p, r, byte]):02x}", "b": f"{int(rb[p, r, byte]):02x}",
                      "a_value": json_number(va[p, r, elem]), "b_value": json_number(vb[p, r, elem])})
    return items


def diff_caches(layout: Layout, a: torch.Tensor, b: torch.Tensor, *, max_items: int = 10,
                first_page: int = 0) -> dict:
    """Compare two caches of ``layout`` with the same page count -> report dict (``equal``,
    per-region counts and largest decoded difference, ``first`` differing bytes).

    ``first_page``: the number of the first page of ``a`` and ``b`` in the caches they were cut
    from (``a = cache[p:q]`` -> ``first_page=p``); every page the report names counts from it."""
    if a.shape[0] != b.shape[0]:
        raise InputError(f"caches differ in page count: {a.shape[0]} vs {b.shape[0]}")
    if page_width(layout, a) != page_width(layout, b):
        raise InputError(f"caches differ in page width: {page_width(layout, a)} vs {page_width(layout, b)} bytes")
    if not (type(max_items) is int and max_items >= 0):  # noqa: E721 - not a bool
        raise InputError(f"max_items must be a non-negative int, got {max_items!r}")
    if not (type(first_page) is int and first_page >= 0):  # noqa: E721
        raise InputError(f"first_page must be a non-negative int, got {first_page!r}")
    report: dict[str, dict] = {r.name: {"bytes_differ": 0, "rows_differ": 0, "max_abs_diff": 0.0, "max_at": None}
              for r in layout.regions}
    first: list[dict] = []
    chunk = max(1, CHUNK_BYTES // max(layout.page_bytes, 1))
    for start in range(0, a.shape[0], chunk):
        sl = slice(start, min(start + chunk, a.shape[0]))
        for region in layout.regions:
            mismatch = region_bytes(layout, a, region, sl) != region_bytes(layout, b, region, sl)
            count = int(mismatch.sum())
            if not count:
                continue
            entry = report[region.name]
            entry["bytes_differ"] += count
            entry["rows_differ"] += int(mismatch.any(-1).sum())
            first += _first_items(layout, region, a, b, start, mismatch, max_items - len(first), first_page)
            delta = (scaled_values(layout, a, region, sl) - scaled_values(layout, b, region, sl)).abs()
            delta = torch.nan_to_num(delta, nan=float("inf"))
            top = int(delta.argmax())
            if float(delta.flatten()[top]) > entry["max_abs_diff"]:
                p, rest = divmod(top, delta.shape[1] * delta.shape[2])
                r, e = divmod(rest, delta.shape[2])
                entry["max_abs_diff"] = float(delta.flatten()[top])
                entry["max_at"] = {"page": first_page + start + p, "row": None if region.per_page else r,
                                   "element": e}
    for entry in report.values():
        entry["max_abs_diff"] = json_number(entry["max_abs_diff"])
    equal = all(e["bytes_differ"] == 0 for e in report.values())
    return {"format": layout.name, "params": layout.params, "pages": a.shape[0], "equal": equal,
            "regions": report, "first": first}
