"""``kvformats report``: one self-contained HTML file showing a cache file's pages.

    kvformats report FILE [OTHER] -o report.html [--tensor NAME] [--pages 0,5,10-12] [--max-pages N]

Usage problems (a missing file, a path that is not a cache file, a corrupt one, an output that
cannot be written, a page out of range) are one line on stderr and exit status 2, as for
``check`` and ``diff``; the output path is checked before any file is read, and nothing but the
output file is written.
"""

from __future__ import annotations

import os

from kvformats.cli.args import check_output, write_output
from kvformats.errors import KVFormatError, UsageError

WHAT = "HTML report"


def parse_pages(text: str | None) -> list[int]:
    """``"0,5,10-12"`` -> ``[0, 5, 10, 11, 12]``; UsageError for anything else."""
    if text is None:
        return []
    pages: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise UsageError(f"--pages takes page numbers and ranges (0,5,10-12), got {text!r}") from None
        if first < 0 or last < first:
            raise UsageError(f"--pages {text}: {part.strip()!r} is not a page or an ascending range of pages")
        if last - first > 100_000:
            raise UsageError(f"--pages {text}: {part.strip()!r} names more than 100000 pages; each shown page "
                             f"embeds its rows, so name the pages to look at")
        pages.extend(range(first, last + 1))
    return pages


def cmd_report(args, out) -> int:
    from kvformats.report.build import build_report
    from kvformats.report.markup import count

    if args.max_pages < 0:
        raise UsageError(f"--max-pages must be 0 or more, got {args.max_pages}")
    pages = parse_pages(args.pages)
    check_output(args.output, WHAT, "-o")  # before reading the files: a bad path costs nothing
    for given in (args.file, args.other):
        if given is not None and os.path.exists(given) and os.path.realpath(given) == os.path.realpath(args.output):
            raise UsageError(f"-o {args.output} is the cache file {given}: the report would overwrite it")
    try:
        report = build_report(args.file, args.other, tensor=args.tensor, pages=pages, max_pages=args.max_pages)
    except KVFormatError as err:
        raise UsageError(str(err).splitlines()[0]) from None
    write_output(args.output, report.html, WHAT)
    kb = len(report.html.encode("utf-8")) / 1024
    summary = (f"wrote {args.output} ({kb:,.0f} KiB): {count(report.caches, 'cache')}, {count(report.pages, 'page')}, "
               f"{report.shown} shown in full, {report.with_findings} with findings")
    if args.other is not None:
        summary += f", {count(report.differing_caches, 'cache')} differing"
    out(summary)
    return 0


def add_parser(sub) -> None:
    """Register ``report`` on the CLI's subparsers."""
    rep = sub.add_parser("report", help="one self-contained HTML file of a cache file's pages (or of two, compared)",
                         description="Write one HTML file (inline CSS, SVG and script; no network, no server) "
                                     "showing every cache in FILE: identity, byte map, an overview of every "
                                     "page, and in full the first --max-pages pages, the pages with check "
                                     "findings or differences and the pages named by --pages. With OTHER, "
                                     "the differences between the two files too.")
    rep.add_argument("file", metavar="FILE", help="cache file (kvformats.caches.files.save_caches)")
    rep.add_argument("other", metavar="OTHER", nargs="?", default=None, help="a second cache file to compare with")
    rep.add_argument("-o", "--output", required=True, help="the HTML file to write")
    rep.add_argument("--tensor", metavar="NAME", help="report only this cache of FILE (default: every cache)")
    rep.add_argument("--pages", metavar="LIST", help="pages to show in full besides the first ones: 0,5,10-12")
    rep.add_argument("--max-pages", type=int, default=8, metavar="N",
                     help="first pages shown in full, and at most as many more with findings or differences "
                          "(default 8; 0: only the --pages)")
    rep.set_defaults(fn=cmd_report)
