"""What a report embeds for one row, for its row view: the decoded values of each region (as
``kvformats dump --slot`` reads them, ``hexdump.slot_record``) and the row's bytes annotated line
by line (as ``kvformats dump --rows`` prints them, ``hexdump.page_lines``).

Values travel as base64 of little-endian float32, a third of their decimal size; NaN and inf
survive the trip (JSON has no words for them).
"""

from __future__ import annotations

import base64
import struct

import torch

from kvformats.caches.hexdump import page_lines, slot_record
from kvformats.layout import Layout
from kvformats.report.tables import STATUS_NAMES, ZERO


def packed_floats(values) -> str:
    """base64 of float32 little-endian ``values`` (numbers, or dump's 'nan' / 'inf' strings)."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *(float(v) for v in values))).decode("ascii")


def row_bytes(layout: Layout, cache: torch.Tensor, page: int, row: int) -> dict:
    """The decoded values and annotated byte lines of one row."""
    record = slot_record(layout, cache, page * layout.page_size + row)
    regions = [{"name": r["name"], "dtype": r["dtype"], "role": r["role"], "offset": r["offset"],
                "values": packed_floats(r["values"])} for r in record["regions"]]
    lines = [[line["offset"], line["hex"], line["label"]]
             for line in page_lines(layout, cache, page, range(row, row + 1)) if line["row"] is not None]
    return {"regions": regions, "lines": lines}


def page_rows(layout: Layout, cache: torch.Tensor, page: int, status: torch.Tensor,
              rules: dict[str, torch.Tensor], other: torch.Tensor | None = None,
              differ: torch.Tensor | None = None) -> list[dict]:
    """One dict per row of ``page``: its status, the rules it breaks, and (unless every byte is
    zero) its values and bytes; where ``differ`` (bool ``[rows]``) marks it, the same row of the
    ``other`` cache too, for the diff."""
    out = []
    for row in range(layout.page_size):
        item: dict = {"status": STATUS_NAMES[int(status[row])],
                      "findings": [name for name, bad in rules.items() if bool(bad[row])]}
        if int(status[row]) != ZERO:
            item.update(row_bytes(layout, cache, page, row))
        if other is not None and differ is not None and bool(differ[row]):
            item["other"] = row_bytes(layout, other, page, row)
            if "regions" not in item:  # a zero row here, written there: both sides are shown
                item.update(row_bytes(layout, cache, page, row))
        out.append(item)
    return out
