"""The repository stands on its own: every section that code, docs or vectors cite in
spec/upstream.md or spec/engines.md exists, every worked example of §12 names the vector that
holds its bytes, and no page under docs/ or spec/ links to a file outside the repository."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A citation is the file name, a section number, then optionally more numbers joined by
# ", ", " and ", "/" or "-" ("spec/upstream.md §2.2, §3.2 and §4.3"). The trailing "." of a
# sentence is not part of the number.
CITATION = re.compile(r"spec/(upstream|engines)\.md((?:(?:,\s*| and | or |/|-)?\s*§[0-9][0-9.]*)*)")
NUMBER = re.compile(r"§([0-9]+(?:\.[0-9]+)*)")


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in names:
        path = REPO / name
        if path.suffix in {".py", ".md", ".json", ".txt", ".toml", ".yml", ".yaml"} and path.is_file():
            yield name, path.read_text(encoding="utf-8", errors="replace")


def sections(text: str) -> set[str]:
    """Section numbers of a notes page: headings "## 5." / "### 5.3", plus the numbered list items
    of a section ("3." under "## 13." is §13.3), which is how the open points are cited."""
    found: set[str] = set()
    current = None
    for line in text.splitlines():
        heading = re.match(r"#{2,4} ([0-9]+(?:\.[0-9]+)*)\.? ", line)
        if heading:
            current = heading.group(1)
            found.add(current)
            continue
        item = re.match(r"([0-9]+)\. ", line)
        if item and current is not None:
            found.add(f"{current}.{item.group(1)}")
    return found


PAGES = {name: sections((REPO / "spec" / f"{name}.md").read_text()) for name in ("upstream", "engines")}


def test_section_parser_sees_the_numbering():
    # Guards the other tests against a parser that finds nothing and so accepts nothing.
    assert {"0", "1.3", "2.2", "5.3", "6.3", "12", "13.3"} <= PAGES["upstream"]
    assert {"2", "3", "5"} <= PAGES["engines"]
    assert "2.9" not in PAGES["upstream"]


def test_every_cited_section_exists():
    missing = []
    cited = 0
    for name, text in tracked_text_files():
        for m in CITATION.finditer(text):
            for number in NUMBER.findall(m.group(2)):
                cited += 1
                if number not in PAGES[m.group(1)]:
                    missing.append(f"{name}: spec/{m.group(1)}.md §{number}")
    assert cited > 50, "the citation pattern stopped matching"
    assert missing == []


def test_section_12_names_the_vector_of_every_worked_example():
    # The vectors whose source cites §12 hold its worked examples; §12 must point at each.
    text = (REPO / "spec" / "upstream.md").read_text()
    section = text[text.index("## 12."):text.index("## 13.")]
    examples = []
    for path in sorted((REPO / "spec" / "vectors").glob("*.json")):
        if "§12" in json.loads(path.read_text()).get("source", ""):
            examples.append(path.name)
            assert f"(vectors/{path.name})" in section, path.name
    assert {"A.json", "C.json", "D.json", "E.json", "F.json"} <= set(examples)


LINK = re.compile(r"\]\(([^)\s]+)\)|(?:href|src)=\"([^\"]+)\"")


@pytest.mark.parametrize("top", ["docs", "spec"])
def test_pages_link_only_inside_the_repository(top):
    outside = []
    checked = 0
    for page in sorted((REPO / top).rglob("*.md")):
        for m in LINK.finditer(page.read_text()):
            target = (m.group(1) or m.group(2)).split("#")[0]
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # in-page anchor or a URL
            checked += 1
            resolved = Path(os.path.normpath(page.parent / target))
            if target.startswith("/") or REPO not in resolved.parents or not resolved.exists():
                outside.append(f"{page.relative_to(REPO)} -> {target}")
    assert checked > 0
    assert outside == []


# The private notes the facts were first collected in: their two file names without the "spec/"
# directory in front (also the old "reference/" form), or a path into the shared folder next to
# the repository. This file spells the names in pieces so that it does not match itself.
NOTES = re.compile(r"(?:^|[^/\w.-])(?:formats|peers)\.md|reference/(?:formats|peers)\.md|\.\./shared")


def test_no_tracked_file_cites_the_private_notes():
    # Every tracked file, none excepted: a reader of the repository cannot open those notes.
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
            for name, text in tracked_text_files() for m in NOTES.finditer(text)]
    old = "see " + "formats" + ".md §2.2"
    assert NOTES.search(old) and not NOTES.search("see spec/upstream.md §2.2")
    assert hits == []
