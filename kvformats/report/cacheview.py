"""One cache as a section of a report: identity card, byte map, page overview, diff view, what
was left out, and the views of the shown pages, with the rows' detail embedded as JSON for the
script's row views."""

from __future__ import annotations

from kvformats.report import selection
from kvformats.report.compare import Comparison
from kvformats.report.diffview import diff_section
from kvformats.report.identity import identity_card
from kvformats.report.cachetables import CacheTables
from kvformats.report.markup import esc, json_for_script, tag
from kvformats.report.overview import overview
from kvformats.report.pageview import page_section
from kvformats.report.rowdata import page_rows


def flagged_pages(ins: CacheTables, comparison: Comparison | None) -> list[int]:
    """Pages with ``check`` findings or differences from the other file."""
    flagged = set(ins.pages_with_findings())
    if comparison is not None:
        flagged |= set(comparison.pages_differ(ins.pages).nonzero().flatten().tolist())
    return sorted(flagged)


def choose_pages(ins: CacheTables, named: list[int], max_pages: int, comparison: Comparison | None) -> list[int]:
    """The pages shown in full: the first ``max_pages``, those with findings or differences, ``named``."""
    return selection.shown_pages(ins.pages, flagged_pages(ins, comparison), named, max_pages)


def cache_section(ins: CacheTables, index: int, prefix: str, shown: list[int], entry: dict | None = None,
                  comparison: Comparison | None = None, other_cache=None) -> str:
    """The section of one cache (``index``: its place in the report; ``prefix``: its element ids)."""
    from kvformats.spec.diagram import layout_svg

    compared = comparison if comparison is not None and comparison.report is not None else None
    differs = compared.pages_differ(ins.pages) if compared else None
    data: dict = {"name": ins.name, "format": ins.layout.name, "page_size": ins.layout.page_size,
                  "other": compared.other_name if compared else None, "pages": {}}
    sections = []
    for page in shown:
        differ = compared.any_row(page, ins.layout.page_size) if compared else None
        rules = ins.findings(page)
        data["pages"][str(page)] = {"rows": page_rows(ins.layout, ins.cache, page, ins.page_status(page), rules,
                                                      other_cache if compared else None, differ)}
        sections.append(page_section(ins, page, prefix, comparison))
    note = selection.left_out(ins.pages, shown, flagged_pages(ins, comparison))
    parts = [tag("h2", esc(f"{ins.name}: {ins.layout.name}")),
             identity_card(ins, entry),
             tag("details", tag("summary", "byte map of the format") + tag("div", layout_svg(ins.layout),
                                                                            class_="kvf-bytemap"), open="open"),
             tag("h3", "pages"),
             overview(ins, shown, prefix, differs)]
    if comparison is not None:
        parts.append(diff_section(comparison, ins.pages, prefix, set(shown)))
    if note:
        parts.append(tag("p", esc(note), class_="kvf-leftout"))
    parts.append(tag("p", "", class_="kvf-status", aria_live="polite"))
    parts += sections
    parts.append(tag("script", json_for_script(data), type="application/json", class_="kvf-data"))
    return tag("section", "".join(parts), id=prefix, class_="kvf-cache", data_cache=index, data_name=ins.name)
