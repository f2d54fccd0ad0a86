"""Who a cache is: its identity card (format, parameters, profile, record ABI, fingerprint, page
geometry, bytes per token, ``check``'s verdict), and the card of the file that holds it (its
metadata, shown as text whatever it holds)."""

from __future__ import annotations

import json

from kvformats.caches.regions import page_width
from kvformats.report.cachetables import CacheTables
from kvformats.report.markup import count, esc, table, tag


def _fields(items: list[tuple[str, str, str]]) -> str:
    """A definition list of (field key for tests and scripts, label, markup value)."""
    return tag("dl", "".join(tag("dt", esc(label)) + tag("dd", value, data_field=key) for key, label, value in items),
               class_="kvf-card")


def identity_card(ins: CacheTables, entry: dict | None = None) -> str:
    """``entry``: the cache's entry in its file's kvformats metadata (None for a cache in memory)."""
    from kvformats.codec.records import record_of
    from kvformats.spec.formats import fingerprint

    layout, cache = ins.layout, ins.cache
    record = record_of(layout).identity()
    ours = fingerprint(layout)
    recorded = entry.get("fingerprint") if entry else None
    if recorded is None:
        prints = esc(ours)
    elif recorded == ours:
        prints = esc(recorded) + tag("span", " (this kvformats's)", class_="kvf-note")
    else:
        prints = esc(recorded) + tag("span", esc(f" (accepted; this kvformats's is {ours})"), class_="kvf-note")
    stride = layout.byte_pages(cache)[1] if cache.shape[0] > 1 else page_width(layout, cache)
    report = ins.check()
    verdict = "ok" if report["ok"] else "VIOLATIONS"
    items = [
        ("name", "cache", esc(ins.name)),
        ("format", "format", esc(layout.name)),
        ("params", "parameters", esc(", ".join(f"{k}={v}" for k, v in layout.params.items()))),
        ("profile", "profile", esc(layout.params.get("profile", "-"))),
        ("record", "record ABI", esc(f"{record['name']} version {record['version']} ({record['layout']}, "
                                     f"head_dim {record['head_dim']})")),
        ("bytes-per-token", "bytes per token", esc(record["bytes_per_token"])),
        ("fingerprint", "fingerprint", prints),
        ("geometry", "page geometry", esc(f"{count(ins.pages, 'page')} of {layout.page_size} rows; "
                                          f"{page_width(layout, cache)} B per page (allocate: {layout.page_bytes} B, "
                                          f"minimum {layout.min_page_bytes} B), page stride {stride} B; "
                                          f"row {layout.row_bytes} B")),
        ("check", "check", tag("span", esc(verdict), class_="kvf-ok" if report["ok"] else "kvf-bad")),
    ]
    rules = [[esc(rule), esc(r["bad_pages"]), esc(", ".join(map(str, r["first_pages"])) or "-")]
             for rule, r in sorted(report["rules"].items())]
    return _fields(items) + table(["check rule", "bad pages", "first bad pages"], rules, class_="kvf-table kvf-rules")


def file_card(label: str, path: str, metadata: dict | None, names: list[str]) -> str:
    """The card of one input file: its path, versions, caches and its kvformats metadata as text."""
    meta = metadata or {}
    items = [("path", "file", esc(path)),
             ("library-version", "written by kvformats", esc(meta.get("library_version", "-"))),
             ("spec-version", "spec version", esc(meta.get("spec_version", "-"))),
             ("caches", "caches", esc(", ".join(names) or "none"))]
    raw = json.dumps(meta, indent=1, sort_keys=True, default=str)
    details = tag("details", tag("summary", "kvformats metadata (as stored)") + tag("pre", esc(raw), class_="kvf-meta"))
    return tag("section", tag("h2", esc(f"{label}: {path}")) + _fields(items) + details, class_="kvf-file")
