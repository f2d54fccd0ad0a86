"""The lists of formats that other pages carry, generated from the declarations: the table of
docs/index.md, the format navigation of mkdocs.yml and the format list of spec/README.md. Each
file keeps its own text; only the lines between its two marker lines are generated, so adding a
format edits none of them by hand (``kvformats docs --write`` rewrites them, ``--check`` reports
drift, as for the generated pages)."""

from __future__ import annotations

from pathlib import Path

from kvformats.codec.registry import get_format, list_formats

NOTE = "generated from the format declarations by `kvformats docs --write`; do not edit"
HTML_MARKERS = (f"<!-- formats: {NOTE} -->", "<!-- end of the generated formats -->")
YAML_MARKERS = (f"# formats: {NOTE}", "# end of the generated formats")


def element_summary(layout) -> str:
    """Each non-pad region's element type and name in row order, a scale region with the block
    its data shares one scale over: e.g. ``e4m3 nope, bf16 rope, ue8m0 scale per 64``."""
    blocks = {r.scale: r.block for r in layout.regions if r.scale}
    parts = []
    for r in layout.regions:
        if r.role == "pad":
            continue
        per = f" per {blocks[r.name]}" if r.name in blocks else ""
        parts.append(f"{r.element.short} {r.name}{per}")
    return ", ".join(parts)


def index_table(names: list[str]) -> str:
    """docs/index.md's table: each format's row and page bytes at its defaults and its regions."""
    lines = ["| format | row | page (default rows) | element types |", "|---|---|---|---|"]
    for name in names:
        lay = get_format(name)
        lines.append(f"| [{name}](reference/formats/{name}.md) | {lay.row_bytes} B | {lay.page_bytes} B "
                     f"({lay.page_size}) | {element_summary(lay)} |")
    return "\n".join(lines)


def nav_lines(names: list[str], indent: int) -> str:
    """mkdocs.yml's format entries, at the indentation of the marker lines."""
    return "\n".join(f"{' ' * indent}- {name}: reference/formats/{name}.md" for name in names)


def spec_list(names: list[str]) -> str:
    """spec/README.md's list: each format with its prose file and its row bytes at its defaults."""
    return "\n".join(f"* `{name}`: [formats/{name}.md](formats/{name}.md), {get_format(name).row_bytes} B rows "
                     f"at its default parameters" for name in names)


# repository-relative path -> (markers, generator of the lines between them given the indentation);
# in Markdown a blank line parts the generated block from the comment lines around it
MARKED = {
    "docs/index.md": (HTML_MARKERS, lambda names, indent: f"\n{index_table(names)}\n"),
    "mkdocs.yml": (YAML_MARKERS, nav_lines),
    "spec/README.md": (HTML_MARKERS, lambda names, indent: f"\n{spec_list(names)}\n"),
}


def regenerate(text: str, markers: tuple[str, str], body) -> str | None:
    """``text`` with the lines between its marker lines replaced by ``body(indent)``; None when
    the markers are not there (once each, in order)."""
    lines = text.split("\n")
    stripped = [ln.strip() for ln in lines]
    if stripped.count(markers[0]) != 1 or stripped.count(markers[1]) != 1:
        return None
    start, end = stripped.index(markers[0]), stripped.index(markers[1])
    if end < start:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    return "\n".join(lines[:start + 1] + [body(indent)] + lines[end:])


def expected_lists(repo: Path) -> dict[str, str | None]:
    """Repository-relative path -> the file's text with its format list regenerated from the
    registered formats (None when the file cannot be read or lacks the markers)."""
    names = list_formats()
    out: dict[str, str | None] = {}
    for rel, (markers, gen) in MARKED.items():
        try:
            text = (repo / rel).read_text()
        except OSError:
            out[rel] = None
            continue
        out[rel] = regenerate(text, markers, lambda indent, g=gen: g(names, indent))
    return out
