"""Which pages a report shows in full: a report summarises every page, but row-level detail (the
page views, each row's values and bytes) is embedded only for the pages shown, so that a file of
several GB gives a report of a few MB."""

from __future__ import annotations

from kvformats.errors import InputError
from kvformats.report.markup import count

DEFAULT_MAX_PAGES = 8  # first pages shown in full (and at most as many more with findings)


def shown_pages(total: int, with_findings: list[int], named: list[int], max_pages: int) -> list[int]:
    """The first ``max_pages`` pages, the first ``max_pages`` pages with findings beyond them, and
    every page ``named``, in page order."""
    if type(max_pages) is not int or max_pages < 0:  # noqa: E721 - not a bool
        raise InputError(f"max_pages must be a non-negative int, got {max_pages!r}")
    first = set(range(min(max_pages, total)))
    extra = [p for p in with_findings if p not in first][:max_pages]
    return sorted(first | set(extra) | {p for p in named if 0 <= p < total})


def ranges(pages: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    parts: list[str] = []
    start = prev = None
    for p in sorted(pages):
        if prev is not None and p == prev + 1:
            prev = p
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = p
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def left_out(total: int, shown: list[int], with_findings: list[int]) -> str:
    """What the report leaves out, in words (empty when every page is shown)."""
    missing = total - len(shown)
    if missing <= 0:
        return ""
    hidden = [p for p in with_findings if p not in set(shown)]
    text = (f"Row-level detail is embedded for {count(len(shown), 'page')} of {total} "
            f"({ranges(shown) or 'none'}); the other {count(missing, 'page')} are summarised in the overview only")
    if hidden:
        listed = ranges(hidden[:20]) + (", ..." if len(hidden) > 20 else "")
        text += f", {count(len(hidden), 'page')} of them with findings ({listed})"
    return text + ". Name pages to show with --pages (kvformats report) or pages= (Inspection.html)."
