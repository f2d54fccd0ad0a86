"""Generated documentation: one reference page per format (from its spec JSON, with its SVG
byte map and the normative prose of spec/formats/<name>.md), the diagrams, the CLI page (from
the argparse parser), the record ABI page (from ``kvformats.codec.records``), and the format
lists of docs/index.md, mkdocs.yml and spec/README.md (``kvformats.spec.format_lists``).
``write_docs`` regenerates them; ``check_docs`` reports drift."""

from __future__ import annotations

from pathlib import Path

from kvformats.codec import records as rec
from kvformats.codec.registry import get_format, list_formats
from kvformats.errors import OutputError
from kvformats.spec.diagram import layout_svg
from kvformats.spec.format_lists import expected_lists
from kvformats.spec.formats import format_spec


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def format_page(name: str, repo: Path) -> str:
    """Markdown reference page of format ``name`` (default parameters)."""
    layout = get_format(name)
    spec = format_spec(layout)
    num = spec["numerics"]
    regions = [[f"`{r['name']}`", r["dtype"], "per page" if r["per_page"] else f"[{r['shape'][0]}]", r["offset"],
                r["row_stride"], r["nbytes"], r["role"], f"{r['scale']} / {r['block']}" if r["scale"] else "",
                r["doc"]] for r in spec["regions"]]
    parts = [
        f"# {name}\n",
        "*Generated from the layout declaration (`kvformats spec`); do not edit by hand.*\n",
        f"`kvformats.get_format({name!r}, " + ", ".join(f"{k}={v}" for k, v in spec["params"].items()) + ")`: "
        f"row {spec['row_bytes']} B, page {spec['page_bytes']} B (minimum {spec['min_page_bytes']} B), "
        f"cache dtype {spec['container_dtype']}.\n",
        f"![{name} byte map](../../diagrams/{name}.svg)\n",
        "## Regions\n",
        _table(["region", "dtype", "shape", "offset", "row stride", "bytes/row", "role", "scale / block", "meaning"],
               regions) + "\n",
        f"Addressing: {spec['addressing']}.\n",
        "## Numerics\n",
        _table(["rule", "value"], [[k, f"`{v}`" if isinstance(v, dict) else v] for k, v in sorted(num.items())]) + "\n",
    ]
    prose = repo / "spec" / "formats" / f"{name}.md"
    if prose.is_file():
        text = prose.read_text()
        body = text.split("\n", 1)[1] if text.startswith("#") else text
        parts += ["## Normative text (spec/formats)\n", body.replace("\n#", "\n##")]
    return "\n".join(parts).rstrip() + "\n"


def cli_page(parser) -> str:
    """Markdown page of every CLI command's help text, from the CLI's argparse ``parser`` (the
    CLI hands it over: this module, which the CLI's ``docs`` command runs, does not import it)."""
    parts = ["# Command line\n", "*Generated from the argparse parser; do not edit by hand.*\n",
             "```text\n" + parser.format_help().rstrip() + "\n```\n"]
    for action in parser._subparsers._group_actions:  # argparse keeps subcommands here
        for name, sub in action.choices.items():
            parts.append(f"## kvformats {name}\n\n```text\n" + sub.format_help().rstrip() + "\n```\n")
    return "\n".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def records_page() -> str:
    """Markdown page of every record ABI kvformats knows (``kvformats.codec.records.RECORDS``):
    the table, the sizes several records share, the layout kinds, and each record's writers
    and readers with their repository, path and commit or release."""
    records = rec.list_records()
    table = [[f"[`{r.name}`](#{r.name})", r.version, r.bytes_per_token, r.head_dim, r.layout,
              f"[`{r.format}`](formats/{r.format}.md)" if r.implemented else (f"`{r.format}` (not registered)"
                                                                              if r.format else "—"),
              r.status, ", ".join(r.profile_names()) or "—"] for r in records]
    sizes: dict[int, list[str]] = {}
    for r in records:
        sizes.setdefault(r.bytes_per_token, []).append(r.name)
    shared = [[f"{n} B", ", ".join(f"`{name}`" for name in names)] for n, names in sorted(sizes.items())
              if len(names) > 1]
    parts = [
        "# Record ABIs\n",
        "*Generated from `kvformats.codec.records` (`kvformats docs --write`); do not edit by hand.*\n",
        "Engines tell a KV-cache record by its bytes per token (FlashMLA's "
        "`detect_kv_cache_format_for_headdim_512`, vLLM's `cache_dtype_str`), and a size does not name a "
        "record: the same bytes per token can lie in a page in other places. Every record ABI kvformats knows is "
        "declared once, with the kvformats format that implements it and the code that writes and reads it. "
        "`kvformats.identify(bytes_per_token, head_dim=None, hint=None)` returns every candidate; "
        "`kvformats.identify_one` refuses an ambiguous size (`AmbiguousRecordError`, naming every candidate) "
        "and never guesses; `layout.record` is a layout's record. Cache files and the transfer handshake "
        "carry the record identity (name, version, layout kind, bytes per token, head size) and refuse another "
        "record of the same size. On the command line: `kvformats records [BYTES] [--hint H]`.\n",
        "Status: *implemented* (a registered kvformats format), *declared* (a format is named but not "
        "registered here), *known* (from a pull request or a note only; no kvformats format).\n",
        "## Records\n",
        _table(["record", "version", "B/token", "head_dim", "layout", "kvformats format", "status", "profiles"],
               table) + "\n",
        "## Sizes that name more than one record\n",
        "A consumer that detects these sizes must be told which record it holds (`hint=`):\n",
        _table(["bytes per token", "records"], shared) + "\n",
        "## Layout kinds\n",
        _table(["layout", "where a token's bytes lie"], [[f"`{k}`", v] for k, v in rec.LAYOUT_KINDS.items()]) + "\n",
        "## Who writes and reads each record\n",
    ]
    for r in records:
        body = [f"### {r.name}\n", f"{r.summary}." + (f" {r.note}" if r.note else "") + "\n"]
        if r.params:
            body.append("Format parameters: " + ", ".join(f"`{k}={v}`" for k, v in r.params) + ".\n")
        rows = [[s.project, s.role, f"[{_cell(s.where)}]({s.url})", f"`{_cell(s.symbol)}`" if s.symbol else "—",
                 f"`{s.profile}`" if s.profile else "—"] for s in r.sources]
        body.append(_table(["project", "role", "where", "symbol", "kvformats profile"], rows) + "\n")
        parts += body
    return "\n".join(parts).rstrip() + "\n"


def expected_docs(repo: Path, parser) -> dict[str, str]:
    """Relative path under docs/ -> generated text (``parser``: the CLI's, for its page)."""
    from kvformats.spec.conformance import conformance_page

    out = {"reference/cli.md": cli_page(parser), "conformance.md": conformance_page(repo),
           "reference/records.md": records_page()}
    for name in list_formats():
        out[f"reference/formats/{name}.md"] = format_page(name, repo)
        out[f"diagrams/{name}.svg"] = layout_svg(get_format(name))
    return out


def _expected_files(repo: Path, parser) -> dict[Path, str | None]:
    """Every generated file: the pages under docs/ and the files holding a format list (None
    for one whose markers are missing)."""
    out: dict[Path, str | None] = {repo / "docs" / rel: text for rel, text in expected_docs(repo, parser).items()}
    out.update({repo / rel: text for rel, text in expected_lists(repo).items()})
    return out


def write_docs(repo: Path, parser) -> list[Path]:
    """Regenerate every generated page under ``repo/docs`` and the format lists; OutputError
    (naming the path) if one cannot be written or a format list lacks its markers."""
    written = []
    for path, text in _expected_files(repo, parser).items():
        if text is None:
            raise OutputError(f"{path} cannot be read or lacks the marker lines of its generated "
                              f"format list (kvformats.spec.format_lists.MARKED)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as err:
            raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
        written.append(path)
    return written


def check_docs(repo: Path, parser) -> list[str]:
    problems = []
    for path, text in _expected_files(repo, parser).items():
        rel = path.relative_to(repo)
        if text is None:
            problems.append(f"{rel} is missing or lacks the marker lines of its generated "
                            f"format list (kvformats.spec.format_lists.MARKED)")
        elif not path.is_file():
            problems.append(f"{rel} is missing (run: kvformats docs --write)")
        elif path.read_text() != text:
            problems.append(f"{rel} is stale (run: kvformats docs --write)")
    return problems
