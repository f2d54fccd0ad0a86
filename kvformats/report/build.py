"""``kvformats report FILE [OTHER] -o report.html``: the whole report of one cache file, or of
two compared, as one self-contained HTML document.

The caches are read with ``load_caches`` (safetensors memory-maps the file: pages are read when a
table needs them, so a file of several GB is not loaded at once), and everything ``load_caches``
refuses is refused here the same way (``CacheFileError``).
"""

from __future__ import annotations

import os

import attrs

from kvformats.caches.files import CacheEntry, load_caches, read_metadata
from kvformats.errors import CacheFileError, InputError
from kvformats.report import page_assets
from kvformats.report.cacheview import cache_section, choose_pages
from kvformats.report.compare import Comparison, compare
from kvformats.report.identity import file_card
from kvformats.report.cachetables import CacheTables
from kvformats.report.selection import DEFAULT_MAX_PAGES
from kvformats.report.markup import count, esc, tag
from kvformats.version import __version__


@attrs.frozen
class Report:
    """The document and what it holds, for the command's one-line summary."""

    html: str
    caches: int
    pages: int
    shown: int
    with_findings: int
    differing_caches: int


def _caches(path: str, tensor: str | None) -> tuple[dict[str, CacheEntry], dict]:
    entries = load_caches(path)
    if tensor is not None:
        if tensor not in entries:
            raise CacheFileError(f"{path} has no cache {tensor!r}; it holds: {', '.join(entries) or 'none'}")
        entries = {tensor: entries[tensor]}
    return entries, read_metadata(path)


def _counterpart(name: str, ours: dict, theirs: dict) -> CacheEntry | None:
    """The other file's cache to compare with ``name``: the one of the same name, or the only one
    when each file holds one (two engines' dumps seldom name their caches alike)."""
    if name in theirs:
        return theirs[name]
    if len(ours) == 1 and len(theirs) == 1:
        return next(iter(theirs.values()))
    return None


def build_report(path: str | os.PathLike, other: str | os.PathLike | None = None, *, tensor: str | None = None,
                 pages: list[int] | tuple[int, ...] = (), max_pages: int = DEFAULT_MAX_PAGES) -> Report:
    """The report of the caches in ``path`` (compared with those in ``other``): every page
    summarised, the first ``max_pages`` pages, the pages with findings or differences (up to
    ``max_pages`` more) and ``pages`` shown in full."""
    path = os.fspath(path)
    other_path = os.fspath(other) if other is not None else None
    entries, meta = _caches(path, tensor)
    theirs, their_meta = _caches(other_path, None) if other_path is not None else ({}, None)
    largest = max((e.cache.shape[0] for e in entries.values()), default=0)
    beyond = [p for p in pages if not 0 <= p < largest]
    if beyond:  # before any page is read
        raise InputError(f"page {beyond[0]} is out of range: the largest cache of {path} has {largest} pages")
    sections, totals = [], {"pages": 0, "shown": 0, "findings": 0, "differ": 0}
    for index, (name, entry) in enumerate(entries.items()):
        ins = CacheTables(entry.cache, entry.layout, name)
        match = _counterpart(name, entries, theirs) if other_path is not None else None
        comparison: Comparison | None = None
        if match is not None:
            comparison = compare(entry.layout, entry.cache, match.layout, match.cache, f"{other_path}:{match.name}")
        elif other_path is not None:
            comparison = Comparison(other_path, None, {}, f"not compared: {other_path} holds no cache named {name!r}")
        shown = choose_pages(ins, list(pages), max_pages, comparison)
        sections.append(cache_section(ins, index, f"kvf-c{index}", shown, meta["tensors"].get(name), comparison,
                                      match.cache if match is not None else None))
        totals["pages"] += ins.pages
        totals["shown"] += len(shown)
        totals["findings"] += len(ins.pages_with_findings())
        totals["differ"] += int(comparison is not None and comparison.report is not None
                                and not comparison.report["equal"])
    cards = [file_card("file", path, meta, list(entries))]
    if other_path is not None:
        cards.append(file_card("compared with", other_path, their_meta, list(theirs)))
    head = tag("h1", esc(f"kvformats report: {os.path.basename(path)}")) + tag(
        "p", esc(f"written by kvformats {__version__}: {count(len(entries), 'cache')}, {totals['pages']} pages, "
                 f"{totals['shown']} shown in full"), class_="kvf-note")
    body = head + "".join(cards) + ("".join(sections) if sections else tag("p", "the file holds no caches",
                                                                            class_="kvf-none"))
    html = page_assets.document(f"kvformats report: {os.path.basename(path)}", body)
    return Report(html, len(entries), totals["pages"], totals["shown"], totals["findings"], totals["differ"])
