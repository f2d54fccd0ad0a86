"""The cache-inspection commands of the ``kvformats`` CLI: dump, diff, check, diagram.

    kvformats dump FILE [--tensor NAME] [--page N | --slot S] [--rows A:B] [--full] [--json]
    kvformats diff A B [--tensor NAME] [--page N] [--max-items K] [--json]   exit 0 equal, 1 differ
    kvformats check FILE [--tensor NAME] [--json]                            exit 0 ok, 1 violations
    kvformats diagram FORMAT [--param k=v ...] [-o FILE.svg]

``--json`` output is documented in docs/reference/json.md. Every usage problem (missing file,
a path that is not a cache file, unknown tensor, page or slot out of range, files of different
formats, an output that cannot be written) is one line on stderr and exit status 2; nothing is
written.
"""

from __future__ import annotations

import json

from kvformats.cli.args import PARAM_HELP, check_output, layout_arg, write_output
from kvformats.errors import KVFormatError, UsageError


def _entry(path: str, tensor: str | None):
    from kvformats.caches.files import load_cache, load_caches

    try:
        if tensor is None:  # the library's "name one" means its parameter; here the option
            caches = load_caches(path)
            if len(caches) > 1:
                raise UsageError(f"{path} holds {len(caches)} caches ({', '.join(caches)}); "
                                 f"pick one with --tensor NAME")
        return load_cache(path, tensor)
    except KVFormatError as err:
        raise UsageError(str(err).splitlines()[0]) from None


def _layout_text(layout) -> str:
    """``fp8_ds_mla(head_dim=512, ..., profile=tokenspeed)``, as ``kvformats show`` writes it."""
    return f"{layout.name}({', '.join(f'{k}={v}' for k, v in layout.params.items())})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _index(kind: str, value: int, count: int) -> int:
    if not 0 <= value < count:
        raise UsageError(f"--{kind} {value} is out of range: the cache has {count} {kind}s (0..{count - 1})")
    return value


def _rows(spec: str | None, page_size: int) -> range | None:
    if spec is None:
        return None
    lo, _, hi = spec.partition(":")
    try:
        r = range(int(lo or 0), int(hi) if hi else page_size)
    except ValueError:
        raise UsageError(f"--rows takes A:B (row numbers), got {spec!r}") from None
    if r.start >= r.stop:
        raise UsageError(f"--rows {spec} is empty: A:B takes rows A to B - 1, so A must be less than B")
    if r.start < 0 or r.stop > page_size:
        raise UsageError(f"--rows {spec} is outside 0:{page_size} (the page's rows)")
    return r


def _print_json(out, obj) -> None:
    out(json.dumps(obj, indent=2, sort_keys=True))


def cmd_dump(args, out) -> int:
    from kvformats.caches.hexdump import dump_slot, hexdump_page, page_lines, page_summary, slot_record

    entry = _entry(args.file, args.tensor)
    layout, cache = entry.layout, entry.cache
    if args.slot is not None:
        slot = _index("slot", args.slot, cache.shape[0] * layout.page_size)
        if args.json:
            _print_json(out, {"tensor": entry.name, **slot_record(layout, cache, slot)})
        else:
            out(dump_slot(layout, cache, slot))
        return 0
    page = _index("page", args.page or 0, cache.shape[0])
    rows = _rows(args.rows, layout.page_size)
    if args.json:
        _print_json(out, {"tensor": entry.name, "format": layout.name, "params": layout.params, "page": page,
                          "page_stride": layout.byte_pages(cache)[1], "lines": page_lines(layout, cache, page, rows)})
    elif args.rows is None and not args.full:
        out(page_summary(layout, cache, page))
    else:
        out(hexdump_page(layout, cache, page, rows))
    return 0


def cmd_diff(args, out) -> int:
    from kvformats.caches.diff import diff_caches

    if args.max_items < 0:  # before reading either file
        raise UsageError(f"--max-items must be 0 or more, got {args.max_items}")
    a, b = _entry(args.a, args.tensor), _entry(args.b, args.tensor)
    if a.layout != b.layout:
        raise UsageError(f"{args.a} holds {_layout_text(a.layout)} but {args.b} holds "
                         f"{_layout_text(b.layout)}: only caches of one layout compare")
    ca, cb, page = a.cache, b.cache, 0
    if args.page is not None:
        page = _index("page", args.page, min(ca.shape[0], cb.shape[0]))
        ca, cb = ca[page:page + 1], cb[page:page + 1]
    try:
        report = diff_caches(a.layout, ca, cb, max_items=args.max_items, first_page=page)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.json:
        _print_json(out, report)
    else:
        _print_diff(report, out)
    return 0 if report["equal"] else 1


def _print_diff(report: dict, out) -> None:
    if report["equal"]:
        out(f"equal: {report['pages']} pages of {report['format']} are byte-identical")
        return
    out(f"{report['format']}: caches differ")
    out(f"{'region':<12} {'bytes':>9} {'rows':>7} {'max |decoded diff|':>20}  at")
    for name, r in report["regions"].items():
        if r["bytes_differ"]:
            at = r["max_at"] and (f"page {r['max_at']['page']}" + ("" if r["max_at"]["row"] is None else
                                  f" row {r['max_at']['row']}") + f" element {r['max_at']['element']}")
            out(f"{name:<12} {r['bytes_differ']:>9} {r['rows_differ']:>7} {r['max_abs_diff']:>20}  {at}")
    out("first differences:")
    for d in report["first"]:
        where = f"page {d['page']}" + ("" if d["row"] is None else f" row {d['row']}")
        block = "" if d["block"] is None else f" block {d['block']}"
        out(f"  {d['region']}: {where} byte {d['byte']} (element {d['element']}{block}): "
            f"{d['a']} -> {d['b']}  ({d['a_value']} -> {d['b_value']})")


def cmd_check(args, out) -> int:
    from kvformats.caches.check import check
    from kvformats.caches.files import load_caches

    if args.tensor is not None:
        entries = [_entry(args.file, args.tensor)]
    else:
        try:
            entries = list(load_caches(args.file).values())
        except KVFormatError as err:
            raise UsageError(str(err).splitlines()[0]) from None
    reports = [{"tensor": e.name, **check(e.layout, e.cache)} for e in entries]
    result = {"file": args.file, "ok": all(r["ok"] for r in reports), "tensors": reports}
    if args.json:
        _print_json(out, result)
    elif not reports:
        out(f"{args.file}: the file holds no caches; nothing to check")
    else:
        for report in reports:
            _print_check(report, out)
    return 0 if result["ok"] else 1


def _print_check(report: dict, out) -> None:
    verdict = "ok" if report["ok"] else "VIOLATIONS"
    params = ", ".join(f"{k}={v}" for k, v in report["params"].items())
    out(f"{report['tensor']}: {report['format']}({params}), {_count(report['pages'], 'page')}: {verdict}")
    for rule, r in sorted(report["rules"].items()):
        pages = f" (first: {', '.join(map(str, r['first_pages']))})" if r["bad_pages"] else ""
        out(f"  {rule:<24} {_count(r['bad_pages'], 'bad page'):>14}{pages}")
    for p in report["bad_pages"]:
        out(f"  page {p['page']}: {', '.join(p['violations'])}")


def cmd_diagram(args, out) -> int:
    from kvformats.spec.diagram import layout_svg

    layout = layout_arg(args.format, args.param)
    if args.output:
        check_output(args.output, "SVG file")  # before drawing, so that a bad path costs nothing
    svg = layout_svg(layout)
    if args.output:
        write_output(args.output, svg, "SVG file")
        out(f"wrote {args.output}")
    else:
        out(svg.rstrip("\n"))
    return 0


def add_parsers(sub) -> None:
    """Register dump, diff, check and diagram on the CLI's subparsers."""
    dump = sub.add_parser("dump", help="annotated hexdump of a page, or one slot with decoded values")
    dump.add_argument("file")
    dump.add_argument("--tensor", help="which cache of a file holding several")
    where = dump.add_mutually_exclusive_group()
    where.add_argument("--page", type=int, help="page to dump (default 0)")
    where.add_argument("--slot", type=int, help="slot to show with its decoded values and scales")
    dump.add_argument("--rows", metavar="A:B", help="only these rows of the page")
    dump.add_argument("--full", action="store_true",
                      help="every hexdump line of the page (default: one summary line per region)")
    dump.add_argument("--json", action="store_true", help="machine-readable output (docs/reference/json.md)")
    dump.set_defaults(fn=cmd_dump)
    diff = sub.add_parser("diff", help="field-wise difference of two cache files (exit 1 when they differ)")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--tensor", help="which cache of files holding several")
    diff.add_argument("--page", type=int, help="compare only this page")
    diff.add_argument("--max-items", type=int, default=10, help="differences to list (default 10)")
    diff.add_argument("--json", action="store_true", help="machine-readable output (docs/reference/json.md)")
    diff.set_defaults(fn=cmd_diff)
    check = sub.add_parser("check", help="validate every page of a cache file (exit 1 on violations)")
    check.add_argument("file")
    check.add_argument("--tensor", help="check only this cache (default: every cache in the file)")
    check.add_argument("--json", action="store_true", help="machine-readable output (docs/reference/json.md)")
    check.set_defaults(fn=cmd_check)
    diagram = sub.add_parser("diagram", help="SVG byte map of a format's page and row")
    diagram.add_argument("format")
    diagram.add_argument("--param", action="append", metavar="KEY=VALUE", help=PARAM_HELP)
    diagram.add_argument("-o", "--output", help="write the SVG here (default: standard output)")
    diagram.set_defaults(fn=cmd_diagram)
