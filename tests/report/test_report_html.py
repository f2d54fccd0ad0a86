"""`kvformats report` and `kvformats.inspect` without a browser: what the HTML and its embedded
JSON say about planted faults, the tables as tensors, escaping, and bad input refused with one
line and exit status 2 before any work."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import kvformats as kvf
from kvformats.caches.check import check
from kvformats.caches.hexdump import slot_record
from kvformats.errors import InputError, InputTypeError, LayoutError
from kvformats.report.markup import json_for_script
from kvformats.report.rowdata import packed_floats
from tests.report.report_cases import (DIFF_AT, HOSTILE, NAN_AT, PAGES, ZERO_PAGE, demo_report, embedded, hostile,
                                       hostile_pages, planted, section, written_cache)
from tests.test_hardening_files import rewrite_metadata, set_entry
from tests.test_hardening_files import one_line_usage_error, run  # the CLI's one-line refusals



ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "main", "script", "section", "h1", "h2", "h3", "h4",
                "p", "span", "b", "a", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tr", "th", "td",
                "details", "summary", "pre", "div", "figure", "figcaption", "svg", "rect", "text", "line", "title",
                "image", "g"}


def start_tags(html: str) -> list[tuple[str, list]]:
    """(tag, attributes) of every element the HTML parser sees."""
    from html.parser import HTMLParser

    found = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, attrs))

    Tags().feed(html)
    return found


def unpack(b64: str) -> list[float]:
    import base64
    import struct

    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


@pytest.fixture
def files(tmp_path):
    return planted(tmp_path)


def test_the_planted_nan_and_zeroed_page_are_named(files, tmp_path, capsys):
    a, _, layout, cache = files
    out = tmp_path / "r.html"
    code, text, err = run(capsys, "report", a, "-o", out)
    assert code == 0 and err == "" and text.startswith(f"wrote {out}")
    html = out.read_text()
    page, row, element = NAN_AT
    nan_page = section(html, f"kvf-c0-p{page}")
    assert f'class="kvf-nan kvf-marker" data-row="{row}" data-block="{element // 64}" data-count="1"' in nan_page
    finding = nan_page[nan_page.index('data-rule="nope:e4m3_not_nan"'):]
    assert finding.startswith(f'data-rule="nope:e4m3_not_nan">nope:e4m3_not_nan: <a href="#kvf-c0-p{page}" '
                              f'class="kvf-go" data-page="{page}" data-row="{row}">row {row}</a></li>')
    zero = section(html, f"kvf-c0-p{ZERO_PAGE}")
    assert "0 rows written (0 failing check), 16 zero" in zero
    assert f'class="kvf-pg-zero" data-page="{ZERO_PAGE}"' in html
    assert f'data-field="pages" data-pages="{PAGES}"' in html
    (data,) = embedded(html)
    rows = data["pages"][str(page)]["rows"]
    assert rows[row]["status"] == "failing" and rows[row]["findings"] == ["nope:e4m3_not_nan"]
    assert math.isnan(unpack(rows[row]["regions"][0]["values"])[element])
    assert all(r["status"] == "zero" and "regions" not in r for r in data["pages"][str(ZERO_PAGE)]["rows"])
    want = slot_record(layout, cache, page * layout.page_size + row + 1)
    got = rows[row + 1]
    assert [r["name"] for r in got["regions"]] == [r["name"] for r in want["regions"]]
    assert unpack(got["regions"][1]["values"]) == pytest.approx([float(v) for v in want["regions"][1]["values"]])
    assert sorted(data["pages"]) == sorted(map(str, range(8)))  # the first 8; the finding's page is among them


def test_a_one_byte_difference_is_named_with_diffs_counts(files, tmp_path, capsys):
    a, b, _, _ = files
    out = tmp_path / "r.html"
    code, text, _ = run(capsys, "report", a, b, "-o", out)
    assert code == 0 and "1 cache differing" in text
    html = out.read_text()
    page, row, byte = DIFF_AT
    assert 'class="kvf-diff" data-equal="false"' in html
    counts = html[html.index("kvf-diffcounts"):]
    assert "<td>scale</td><td>1</td><td>1</td><td>0.0625</td>" in counts
    assert f'class="kvf-firstdiff" data-region="scale" data-page="{page}" data-row="{row}"' in html
    assert f"scale: page {page} row {row} byte {byte} (element {byte}): 7b -&gt; 7c (0.0625 -&gt; 0.125)" in html
    differs = section(html, f"kvf-c0-p{page}")  # beyond the first 8 pages: shown because it differs
    assert f'class="kvf-rowdiff" data-row="{row}" data-regions="scale"' in differs
    (data,) = embedded(html)
    other = data["pages"][str(page)]["rows"][row]["other"]
    ours = data["pages"][str(page)]["rows"][row]
    changed = [i for i, (x, y) in enumerate(zip(ours["lines"], other["lines"])) if x != y]
    assert len(changed) == 1 and ours["lines"][changed[0]][2] == f"row {row} scale[0]"
    assert "other" not in data["pages"][str(page)]["rows"][row + 1]


def test_equal_files_say_so(files, tmp_path, capsys):
    a, _, _, _ = files
    code, _, _ = run(capsys, "report", a, a, "-o", tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert code == 0 and 'data-equal="true"' in html and "are byte-identical" in html


def test_pages_and_max_pages_choose_what_is_embedded(files, tmp_path, capsys):
    a, _, _, _ = files
    out = tmp_path / "r.html"
    assert run(capsys, "report", a, "-o", out, "--max-pages", "1", "--pages", "40,44-45")[0] == 0
    html = out.read_text()
    (data,) = embedded(html)
    assert sorted(map(int, data["pages"])) == [0, NAN_AT[0], 40, 44, 45]  # the page with findings comes too
    assert "Row-level detail is embedded for 5 pages of 48 (0-1, 40, 44-45)" in html
    assert run(capsys, "report", a, "-o", out, "--max-pages", "0", "--pages", "40")[0] == 0
    assert list(embedded(out.read_text())[0]["pages"]) == ["40"]  # 0: only the pages named


def test_row_findings_agree_with_check(tmp_path):
    from kvformats.caches.files import load_caches

    for name, entry in load_caches(hostile_pages(tmp_path)).items():
        view = kvf.inspect(entry.cache, entry.layout, name)
        report = check(entry.layout, entry.cache)
        assert view.pages_with_findings() == sorted(p["page"] for p in report["bad_pages"]), name
        for p in report["bad_pages"]:
            rules = {k for k, bad in view.findings(p["page"]).items() if bad.any()} | set(view.page_findings(p["page"]))
            assert rules == set(p["violations"]), (name, p)


@pytest.mark.parametrize("name", kvf.list_formats())
def test_every_format_renders(name, tmp_path):
    from kvformats.caches.files import save_cache
    from kvformats.report.build import build_report

    layout = kvf.get_format(name, **type(kvf.get_format(name)).examples.small_params)
    cache = written_cache(layout, 3)
    cache.view(torch.uint8).view(3, -1)[2] = 0xFF
    path = tmp_path / "c.safetensors"
    save_cache(path, layout, cache)
    html = build_report(path).html
    assert f'<dd data-field="format">{name}</dd>' in html
    (data,) = embedded(html)
    assert sorted(data["pages"]) == ["0", "1", "2"] and data["format"] == name
    assert len(data["pages"]["0"]["rows"]) == layout.page_size


def test_the_demo_file_renders(tmp_path_factory):
    _, out = demo_report(tmp_path_factory)
    html = out.read_text()
    assert [d["format"] for d in embedded(html)] == kvf.list_formats()
    assert all(d["pages"]["0"]["rows"] for d in embedded(html))


# ----- escaping ---------------------------------------------------------------------------------
def test_strings_from_the_file_are_escaped(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert run(capsys, "report", hostile(tmp_path), "-o", out)[0] == 0
    html = out.read_text()
    for text in HOSTILE:
        assert text not in html
    tags = start_tags(html)
    assert [a for _, attrs in tags for a, _ in attrs if a.startswith("on")] == []  # no event handler anywhere
    assert {t for t, _ in tags} <= ALLOWED_TAGS
    assert [t for t, _ in tags].count("script") == 2  # the cache's JSON and the report's own script
    (data,) = embedded(html)
    assert data["name"] == '<img src=x onerror="window.__pwned=1">'


def test_embedded_json_cannot_end_its_script_element():
    text = json_for_script({"a": "</script><script>alert(1)</script>", "b": "<!-- & \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"a": "</script><script>alert(1)</script>", "b": "<!-- & \u2028"}


def test_the_document_allows_only_its_own_script_and_no_network(files, tmp_path):
    from kvformats.report.build import build_report
    from kvformats.report.page_assets import script_hash
    from kvformats.report.script import JS
    from kvformats.report.style import CSS

    html = build_report(files[0]).html
    policy = next(dict(attrs)["content"] for t, attrs in start_tags(html) if t == "meta"
                  and dict(attrs).get("http-equiv") == "Content-Security-Policy")
    assert policy.startswith(f"default-src 'none'; style-src 'unsafe-inline'; script-src '{script_hash()}'")
    links = [v for _, attrs in start_tags(html) for a, v in attrs if a in ("href", "src", "action")]
    assert links and all(v.startswith(("#", "data:image/png;base64,")) for v in links)  # nothing to fetch
    for text in (JS, CSS):
        assert not any(word in text for word in ("fetch(", "XMLHttpRequest", "url(", "import(", "WebSocket"))


# ----- bad input --------------------------------------------------------------------------------
def test_bad_input_is_one_line_and_exit_2(files, tmp_path, capsys):
    a, _, _, _ = files
    out = tmp_path / "r.html"
    not_cache = tmp_path / "notes.txt"
    not_cache.write_text("hello")
    plain = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(plain))
    cases = [
        (["report", tmp_path / "missing.safetensors", "-o", out], "no such cache file"),
        (["report", not_cache, "-o", out], "not a readable safetensors file"),
        (["report", plain, "-o", out], "not a kvformats cache file"),
        (["report", a, tmp_path / "missing.safetensors", "-o", out], "no such cache file"),
        (["report", a, "-o", tmp_path / "no" / "dir" / "r.html"], "-o: cannot write the HTML report"),
        (["report", a, "-o", tmp_path], "it is a directory"),
        (["report", a, "-o", out, "--pages", "48"], "page 48 is out of range"),
        (["report", a, "-o", out, "--pages", "3-1"], "--pages 3-1"),
        (["report", a, "-o", out, "--pages", "x"], "--pages takes page numbers"),
        (["report", a, "-o", out, "--max-pages", "-1"], "--max-pages must be 0 or more"),
        (["report", a, "-o", out, "--tensor", "nope"], "has no cache 'nope'"),
        (["report", a], "the following arguments are required: -o/--output"),
        (["report", a, "-o", a], "the report would overwrite it"),
    ]
    for argv, message in cases:
        before = sorted(os.listdir(tmp_path))
        code, text, err = run(capsys, *argv)
        assert one_line_usage_error(code, text, err) and message in err, (argv, err)
        assert sorted(os.listdir(tmp_path)) == before, argv  # nothing written, not even a partial report


def test_an_unwritable_output_fails_before_the_input_is_read(files, tmp_path, capsys, monkeypatch):
    from kvformats.caches import files as cache_files

    def refuse(*args, **kwargs):
        raise AssertionError("the input was read before the output was checked")

    monkeypatch.setattr(cache_files, "load_caches", refuse)
    code, text, err = run(capsys, "report", files[0], "-o", tmp_path / "no" / "r.html")
    assert one_line_usage_error(code, text, err)


def _corpus():
    """The edits of tests/test_hardening_files.py that make a cache file lie about itself, read from
    its tests' parameters (so a case added there is refused here too): (name, edit of the metadata)."""
    from tests import test_hardening_files as hard

    def params(test):
        return next(m.args[1] for m in test.pytestmark if m.name == "parametrize")

    for stride in params(hard.test_bad_page_strides_are_refused):
        yield f"page_stride={stride!r}", set_entry("page_stride", stride)
    for key, value, _ in params(hard.test_every_entry_field_is_checked):
        yield f"{key}={value!r}", set_entry(key, value)
    for i, edit in enumerate(params(hard.test_file_level_metadata_is_checked)):
        yield f"file-level edit {i}", edit
    yield "deeply nested", lambda meta: "[" * 100_000 + "]" * 100_000


def test_the_hostile_file_corpus_is_refused_as_check_refuses_it(tmp_path, capsys):
    from kvformats.caches.files import save_cache

    layout = kvf.Fp8DsMla(page_size=2)
    good = tmp_path / "good.safetensors"
    save_cache(good, layout, written_cache(layout, 2))
    out = tmp_path / "r.html"
    cases = list(_corpus())
    assert len(cases) > 30
    for name, edit in cases:
        bad = rewrite_metadata(good, tmp_path / "bad.safetensors", edit)
        check_code, _, check_err = run(capsys, "check", bad)
        code, text, err = run(capsys, "report", bad, "-o", out)
        assert one_line_usage_error(code, text, err) and err == check_err and check_code == 2, name
        assert not out.exists(), name


# ----- kvformats.inspect and Layout._repr_html_ -------------------------------------------------
def test_inspect_returns_the_tables_as_tensors(files):
    _, _, layout, cache = files
    view = kvf.inspect(cache, layout)
    status = view.row_status()
    assert status.shape == (PAGES, layout.page_size) and status.dtype == torch.int8
    page, row, element = NAN_AT
    assert int(status[page, row]) == 2 and int(status[ZERO_PAGE].abs().sum()) == 0
    overview = view.page_overview()
    assert int(overview["zero"][ZERO_PAGE]) == layout.page_size and int(overview["failing"][page]) == 1
    assert view.pages_with_findings() == [page]
    nan = view.nan_map(page)["nope"]
    assert nan.shape == (layout.page_size, 448) and nan.nonzero().tolist() == [[row, element]]
    exps = view.scale_exponents(0)["scale"]
    raw = layout.views(cache)["scale"][0].view(torch.uint8).float() - 127
    assert torch.equal(exps, raw)
    assert view.findings(page)["nope:e4m3_not_nan"].nonzero().flatten().tolist() == [row]
    hist = view.code_histogram(0)
    assert hist["nope"].shape == (256,) and int(hist["nope"].sum()) == layout.page_size * 448
    assert int(hist["rope"].sum()) == layout.page_size * 64
    assert view.saturated_map(0)["rope"].any().item() is False
    assert torch.equal(view.values(0)["nope"][2], layout.decode(cache, torch.tensor([2]))[0, :448].float())
    assert view.check() == check(layout, cache)


def test_inspect_refuses_what_is_not_a_cache_of_the_layout(files):
    _, _, layout, cache = files
    with pytest.raises(InputTypeError):
        kvf.inspect(cache, "fp8_ds_mla")
    with pytest.raises((InputTypeError, LayoutError)):
        kvf.inspect(cache.float(), layout)
    view = kvf.inspect(cache, layout)
    for page in (-1, PAGES):
        with pytest.raises(InputError):
            view.nan_map(page)
    with pytest.raises(InputTypeError):
        view.values(True)


def test_notebook_displays(files):
    _, _, layout, cache = files
    html = kvf.inspect(cache[:3], layout, name="<b>x</b>")._repr_html_()
    assert html.startswith('<div class="kvf" id="kvf-') and "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert html.count('class="kvf-page"') == 3 and "<script>" in html
    other = kvf.inspect(cache[:1], layout)._repr_html_()
    assert other[:30] != html[:30]  # two outputs on one page never share element ids
    shown = layout._repr_html_()
    assert "<svg" in shown and all(f"<td>{r.name}</td>" in shown for r in layout.regions)


def test_packed_floats_keep_nan_and_inf():
    assert [str(v) for v in unpack(packed_floats([1.5, "nan", "inf", "-inf"]))] == ["1.5", "nan", "inf", "-inf"]
