"""The ``kvformats`` command line (also ``python -m kvformats``).

    kvformats list [--json]                     registered formats with row and page bytes and record
    kvformats records [BYTES] [--head-dim D] [--hint H] [--sources] [--json]
                                                the record ABIs kvformats knows; with BYTES the candidates
    kvformats show FORMAT [--param k=v ...]     the region table of one layout
    kvformats spec --write | --check [--dir D]  write or check spec/formats/*.json
    kvformats demo [--rows N] [--device D]      round-trip every format, check its error bound
    kvformats docs --write | --check [--root R] write or check the generated docs pages
    kvformats dump | diff | check | diagram     look inside cache files (kvformats.cli.caches)
    kvformats report FILE [OTHER] -o R.html     an HTML report of a cache file's pages (kvformats.cli.report)
    kvformats quality [--json] [--activations F]  DeepSeek V4 formats' accuracy (kvformats.cli.quality)

Exit status: 0 success, 1 spec/docs drift found (or a demo bound violated, or its file round
trip changed a cache), 2 usage error (unknown format, bad parameter, unreadable input,
unwritable output); a usage error prints one line on stderr and writes nothing. ``kvformats``
with no command prints the help and exits 2.
When standard output is closed early (``kvformats dump FILE | head``) the command stops quietly
with status 141 (128 + SIGPIPE, what a shell reports for a process killed by a broken pipe).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import kvformats as kvf
from kvformats.cli.args import PARAM_HELP, check_output, layout_arg
from kvformats.errors import KVFormatError, OutputError, UsageError  # noqa: F401 - UsageError re-exported

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def _print_json(out, obj) -> None:
    import json

    out(json.dumps(obj, indent=2, sort_keys=True))


def cmd_list(args, out) -> int:
    from kvformats.codec.records import record_of

    if args.json:
        formats = []
        for name in kvf.list_formats():
            layout = kvf.get_format(name)
            formats.append({"name": name, "row_bytes": layout.row_bytes, "page_bytes": layout.page_bytes,
                            "min_page_bytes": layout.min_page_bytes, "params": layout.params,
                            "record": record_of(layout).identity()})
        _print_json(out, {"formats": formats})
        return 0
    rows = []
    for name in kvf.list_formats():
        layout = kvf.get_format(name)
        params = ", ".join(f"{k}={v}" for k, v in layout.params.items())
        rows.append([name, layout.row_bytes, layout.page_bytes, record_of(layout).name, params])
    _columns(out, ["format", "row B", "page B", "record", "parameters"], rows, right={1, 2})
    return 0


def cmd_records(args, out) -> int:
    from kvformats.codec import records as rec

    query = args.bytes is not None
    if not query and (args.head_dim is not None or args.hint):
        raise UsageError("--head-dim and --hint narrow a size: give BYTES (kvformats records 528 --hint planar)")
    try:
        found = rec.identify(args.bytes, args.head_dim, tuple(args.hint) if args.hint else None) if query \
            else rec.list_records()
    except KVFormatError as err:
        raise UsageError(str(err).splitlines()[0]) from None
    if args.json:
        doc: dict = {"records": [r.as_dict() for r in found]}
        if query:
            doc["query"] = {"bytes_per_token": args.bytes, "head_dim": args.head_dim, "hint": args.hint or []}
            doc["ambiguous"] = len(found) > 1
        _print_json(out, doc)
        return 0 if found or not query else 1
    if query and not found:
        out(f"no record known to kvformats has {args.bytes} bytes per token"
            + (f" and head_dim {args.head_dim}" if args.head_dim is not None else "")
            + (f" and fits the hint {' '.join(args.hint)}" if args.hint else "") + "; run `kvformats records` for all")
        return 1
    rows = [[r.name, r.version, r.bytes_per_token, r.head_dim, r.layout, r.format or "-", r.status,
             ", ".join(r.profile_names()) or "-"] for r in found]
    _columns(out, ["record", "version", "B/token", "head_dim", "layout", "format", "status", "profiles"], rows,
             right={2, 3})
    if query and len(found) > 1:
        out("")
        out(f"ambiguous: {len(found)} records have {args.bytes} bytes per token; kvformats.identify_one refuses "
            f"this size without a hint (--hint LAYOUT|ENGINE|NAME narrows it)")
    if args.sources or query:
        for r in found:
            out("")
            out(f"{r.name}: {r.summary}" + (f" ({r.note})" if r.note else ""))
            for s in r.sources:
                profile = f"  [profile {s.profile}]" if s.profile else ""
                out(f"  {s.role:<13} {s.project}: {s.where}" + (f" {s.symbol}" if s.symbol else "") + profile)
    return 0


def _aligned(out, header: list[str], rows: list[list], numeric_from: int, text_last: bool = False) -> None:
    """A table whose columns are as wide as their widest cell (a large page_size widens the
    offsets); columns from ``numeric_from`` on are right-aligned, except a final text column."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    last = len(header) - 1 if text_last else len(header)
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        parts = [c.rjust(w) if numeric_from <= i < last else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        if text_last:
            parts[-1] = row[-1]  # the doc text, unpadded
        out("  ".join(parts).rstrip())


def _columns(out, header: list[str], rows: list[list], right: set[int]) -> None:
    """A table whose columns are as wide as their widest cell; the columns in ``right`` are
    right-aligned, the others left-aligned."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        out("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())


def cmd_show(args, out) -> int:
    layout = layout_arg(args.format, args.param)
    if args.json:
        from kvformats.spec.formats import spec_text

        out(spec_text(layout).rstrip("\n"))
        return 0
    out(layout.describe().splitlines()[0])
    per_row = [[r.name, r.dtype, "page" if r.per_page else f"[{r.shape[0]}]", r.offset,
                "-" if r.per_page else r.nbytes, r.page_nbytes] for r in layout.regions]
    _aligned(out, ["region", "dtype", "shape", "offset", "row B", "page B"], per_row, numeric_from=3)
    out("")
    roles = [[r.name, r.role, r.segment or "-", "-" if r.per_page else r.row_stride,
              "-" if r.per_page else r.row_offset, r.doc] for r in layout.regions]
    _aligned(out, ["region", "role", "segment", "row stride", "in-row offset", "doc"], roles, numeric_from=3,
             text_last=True)
    out("")
    out(f"slot s -> page s // {layout.page_size}, row s % {layout.page_size}; a region's row starts at "
        f"page * page_stride + offset + row * row_stride")
    return 0


def cmd_spec(args, out) -> int:
    from kvformats.spec import formats as spec
    from kvformats.spec.checkout import is_checkout, not_a_checkout

    if args.dir is None:  # the checkout's spec/formats: refused elsewhere, nothing written
        if not is_checkout("."):
            raise UsageError(not_a_checkout("--dir"))
        root = Path("spec/formats")
    else:
        root = Path(args.dir)
        if args.check and not root.is_dir():
            raise UsageError(f"--dir {root}: no such directory")
    if args.write:
        try:
            written = spec.write_specs(root)
        except KVFormatError as err:
            raise UsageError(str(err).splitlines()[0]) from None
        for path in written or ():
            out(f"wrote {path}")
        return 0
    problems = spec.check_specs(root)
    if problems:
        for p in problems:
            out(f"drift: {p}")
        out(f"{len(problems)} problem(s); regenerate with: kvformats spec --write --dir {root}")
        return 1
    out(f"{root}: every spec is up to date")
    return 0


def cmd_demo(args, out) -> int:
    import torch

    from kvformats.cli.args import check_memory, out_of_memory
    from kvformats.cli.demo import best_device, memory_needed, run_demo

    if args.rows <= 0:
        raise UsageError(f"--rows must be positive, got {args.rows}")
    device = args.device or best_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here")
    if args.save == "":  # else taken as "no --save": the caches would be written nowhere, silently
        raise UsageError("--save: the file name is empty; name the cache file to keep (--save demo.safetensors) "
                         "or leave --save out")
    check_memory(memory_needed(args.rows), device, f"demo --rows {args.rows}", "pass fewer --rows")
    if args.save:  # checked before the demo runs, not after
        from kvformats.caches.files import IO_HINT, cache_file_destination, io_available

        if not io_available():
            raise UsageError(f"--save needs the io extra (safetensors, numpy): {IO_HINT}")
        try:  # what the save itself refuses (a FIFO, a device, a broken link), in its words
            cache_file_destination(args.save)
        except KVFormatError as err:
            raise UsageError(f"--save: {str(err).splitlines()[0]}") from None
        check_output(args.save, "cache file", "--save", regular_only=True)  # a place that refuses files
    try:
        results = run_demo(rows=args.rows, device=device, out=out, save_to=args.save)
    except Exception as err:  # noqa: BLE001  (re-raised unless an allocator refused)
        if not out_of_memory(err):
            raise
        raise UsageError(f"demo --rows {args.rows} ran out of {device} memory; pass fewer --rows") from None
    return 0 if all(r["ratio"] <= 1 and r["file_ok"] is not False for r in results) else 1


def cmd_docs(args, out) -> int:
    from kvformats.spec import docgen
    from kvformats.spec.checkout import is_checkout, not_a_checkout

    root = Path(args.root or ".")
    if not is_checkout(root):  # its pages are made from the checkout's spec/: refused elsewhere
        raise UsageError(not_a_checkout("--root") if args.root is None else
                         f"--root {root}: not a kvformats checkout (no spec/ and pyproject.toml naming kvformats)")
    if args.write:
        try:
            written = docgen.write_docs(root, build_parser())
        except KVFormatError as err:
            raise UsageError(str(err).splitlines()[0]) from None
        for path in written:
            out(f"wrote {path}")
        return 0
    problems = docgen.check_docs(root, build_parser())
    for p in problems:
        out(f"drift: {p}")
    if problems:
        return 1
    out(f"{root / 'docs'}: every generated page is up to date")
    return 0


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=100)  # fixed width: generated docs embed the help


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2, like every other usage error
        raise UsageError(message)


def _write_or_check(sub, name: str, help_text: str, fn) -> argparse.ArgumentParser:
    """A subcommand that either regenerates derived files (--write) or reports drift (--check)."""
    cmd = sub.add_parser(name, help=help_text)
    mode = cmd.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    cmd.set_defaults(fn=fn)
    return cmd


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvformats", description="Byte-exact quantized KV-cache formats of DeepSeek V4 serving.",
                epilog="Exit status: 0 success; 1 differences, violations or drift found; 2 usage error (one "
                       "line on stderr); 141 standard output closed early (| head). With no command: this "
                       "help, exit status 2.")
    p.add_argument("--version", action="version", version=f"kvformats {kvf.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    lst = sub.add_parser("list", help="registered formats")
    lst.add_argument("--json", action="store_true", help="machine-readable output (docs/reference/json.md)")
    lst.set_defaults(fn=cmd_list)
    recs = sub.add_parser("records", help="the record ABIs kvformats knows, or the candidates of one size",
                          description="Every KV-cache record ABI kvformats knows (docs/reference/records.md): "
                                      "name, version, bytes per token, head size, layout kind, the format "
                                      "implementing it. With BYTES: every record of that size (kvformats.identify); "
                                      "exit status 1 when none fits.")
    recs.add_argument("bytes", nargs="?", type=int, default=None, metavar="BYTES",
                      help="bytes per token to identify (e.g. 528)")
    recs.add_argument("--head-dim", type=int, default=None, help="narrow to records of this head size")
    recs.add_argument("--hint", action="append", metavar="H",
                      help="narrow by a layout kind (page-planar, interleaved, ...), an engine (vllm, tokenspeed, "
                           "flashmla, ...), a version, a record or format name; repeatable (all must hold)")
    recs.add_argument("--sources", action="store_true",
                      help="list each record's writers and readers (repository, path, commit or release)")
    recs.add_argument("--json", action="store_true", help="machine-readable output (docs/reference/json.md)")
    recs.set_defaults(fn=cmd_records)
    show = sub.add_parser("show", help="region table of one format")
    show.add_argument("format")
    show.add_argument("--param", action="append", metavar="KEY=VALUE", help=PARAM_HELP)
    show.add_argument("--json", action="store_true", help="the layout's spec JSON (as in spec/formats)")
    show.set_defaults(fn=cmd_show)
    spec = _write_or_check(sub, "spec", "write or check the generated format specs", cmd_spec)
    spec.add_argument("--dir", default=None, help="spec directory (default spec/formats)")
    demo = sub.add_parser("demo", help="round-trip random rows through every format")
    demo.add_argument("--rows", type=int, default=4096, help="random rows per format (default 4096)")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None,
                      help="default: cuda if available, else cpu")
    demo.add_argument("--save", default=None, metavar="FILE",
                      help="keep the demo's caches in this cache file (default: the file round trip "
                           "runs in a temporary directory that is removed)")
    demo.set_defaults(fn=cmd_demo)
    docs = _write_or_check(sub, "docs", "write or check the generated pages under docs/", cmd_docs)
    docs.add_argument("--root", default=None, help="repository root (default .)")
    from kvformats.cli.caches import add_parsers
    from kvformats.cli.quality import add_parser as add_quality
    from kvformats.cli.report import add_parser as add_report

    add_parsers(sub)
    add_report(sub)
    add_quality(sub)
    return p


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the interpreter's last flush at
    exit cannot raise again (the pattern of the Python docs, 'Note on SIGPIPE')."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests, embedding)
        pass


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    stdout_failed = []

    def out(line: str = "") -> None:
        try:
            print(line, flush=True)
        except BrokenPipeError:
            raise
        except OSError as err:  # a full disk or device (kvformats list > /dev/full)
            stdout_failed.append(True)
            raise OutputError(f"cannot write to standard output: {err.strerror or err}") from None

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
        if not argv:
            out(parser.format_help().rstrip("\n"))
            return EXIT_USAGE
        try:
            args = parser.parse_args(argv)
            return args.fn(args, out)
        except (UsageError, OutputError) as err:  # an output that fails after all: one line too
            if stdout_failed:
                _silence_stdout()  # else the interpreter's last flush raises again at exit
            print(f"kvformats: error: {str(err).splitlines()[0] if str(err) else 'usage error'}", file=sys.stderr)
            return EXIT_USAGE
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
