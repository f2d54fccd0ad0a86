"""The diff view of a report: ``kvformats diff``'s counts per region, its first differing bytes and
the pages that differ, each linked to the page and row it names."""

from __future__ import annotations

from kvformats.report.compare import Comparison
from kvformats.report.markup import count, esc, table, tag
from kvformats.report.pageview import page_id, row_link


def _at(place: dict | None, prefix: str, shown: set[int]) -> str:
    if not place:
        return "-"
    text = f"page {place['page']}" + ("" if place["row"] is None else f" row {place['row']}") + \
        f" element {place['element']}"
    if place["page"] in shown and place["row"] is not None:
        return row_link(place["page"], place["row"], text, prefix)
    return esc(text)


def diff_section(comparison: Comparison, pages: int, prefix: str, shown: set[int]) -> str:
    head = tag("h3", esc(f"Differences from {comparison.other_name}"))
    note = tag("p", esc(comparison.note), class_="kvf-note") if comparison.note else ""
    report = comparison.report
    if report is None:
        return tag("section", head + note, class_="kvf-diff", data_equal="unknown")
    if report["equal"]:
        body = tag("p", esc(f"equal: {count(report['pages'], 'page')} of {report['format']} are byte-identical"),
                   class_="kvf-ok")
        return tag("section", head + note + body, class_="kvf-diff", data_equal="true")
    rows = [[esc(name), esc(r["bytes_differ"]), esc(r["rows_differ"]), esc(r["max_abs_diff"]),
             _at(r["max_at"], prefix, shown)]
            for name, r in report["regions"].items() if r["bytes_differ"]]
    counts = table(["region", "bytes differ", "rows differ", "max |decoded diff|", "at"], rows,
                   class_="kvf-table kvf-diffcounts")
    items = []
    for d in report["first"]:
        where = f"page {d['page']}" + ("" if d["row"] is None else f" row {d['row']}")
        text = (f"{d['region']}: {where} byte {d['byte']} (element {d['element']}"
                + ("" if d["block"] is None else f" block {d['block']}") + f"): {d['a']} -> {d['b']} "
                f"({d['a_value']} -> {d['b_value']})")
        linked = d["page"] in shown and d["row"] is not None
        item = row_link(d["page"], d["row"], text, prefix) if linked else esc(text)
        items.append(tag("li", item, class_="kvf-firstdiff", data_region=d["region"], data_page=d["page"],
                         data_row=None if d["row"] is None else d["row"]))
    first = tag("h4", "first differences") + tag("ol", "".join(items), class_="kvf-firstdiffs")
    differing = comparison.pages_differ(pages).nonzero().flatten().tolist()
    links = [tag("a", esc(f"page {p}"), href=f"#{page_id(prefix, p)}") if p in shown else esc(f"page {p}")
             for p in differing[:50]]
    pages_line = tag("p", esc(f"{count(len(differing), 'page')} differ: ") + ", ".join(links) +
                     (", ..." if len(differing) > 50 else ""), class_="kvf-diffpages")
    return tag("section", head + note + counts + first + pages_line, class_="kvf-diff", data_equal="false")
