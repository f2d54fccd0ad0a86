"""`kvformats report` opened in a real browser: Debian's chromium, driven headless by selenium
through /usr/bin/chromedriver (no driver or browser download, no network). The tests assert on
the DOM, click rows, read the console and save screenshots (into $KVFORMATS_ARTIFACTS, else the
test's tmp_path). .ci/run installs chromium and sets KVFORMATS_REQUIRE_BROWSER=1, so there a
missing browser fails them; elsewhere (the README's test command on a fresh machine) they skip,
naming the packages to install. KVFORMATS_NO_BROWSER=1 skips them even where a browser is.

The how-to's screenshots come from here:
    KVFORMATS_ARTIFACTS=docs/howto/img python3 -m pytest -q -n 0 tests/report/test_report_browser.py -k howto
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvformats.caches.hexdump import slot_record
from kvformats.cli import main
from tests.report.report_cases import (DIFF_AT, NAN_AT, PAGES, ZERO_PAGE, demo_report, hostile, hostile_pages,
                                       planted)

CHROMEDRIVER, CHROMIUM = Path("/usr/bin/chromedriver"), Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")

if os.environ.get("KVFORMATS_NO_BROWSER") == "1":
    pytest.skip("KVFORMATS_NO_BROWSER=1: the browser tests are skipped", allow_module_level=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [str(p) for p in (CHROMEDRIVER, CHROMIUM) if not p.exists()]
    if missing:
        why = (f"{', '.join(missing)} missing: apt-get install chromium chromium-driver (as .ci/run does) "
               f"to run the browser tests")
        if os.environ.get("KVFORMATS_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: pip install -e '.[test]'")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never goes to the network
    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_argument("--window-size=1000,800")
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture
def artifacts(tmp_path):
    folder = Path(os.environ.get("KVFORMATS_ARTIFACTS") or tmp_path / "artifacts").resolve()  # before any chdir
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def report(tmp_path, *argv) -> Path:
    out = tmp_path / "report.html"
    assert main([*map(str, argv), "-o", str(out)]) == 0
    return out


def open_report(driver, path: Path):
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(path.resolve().as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    # get() returns at the load event, but seldom a moment earlier under load: wait for it
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def click(driver, element):
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def shot(driver, folder: Path, name: str, selector: str | None = None) -> Path:
    """A screenshot of the window, or of one element (the how-to's images: small)."""
    path = folder / f"{name}.png"
    if selector is None:
        driver.save_screenshot(str(path))
    else:
        element = css(driver, selector)[0]
        size = driver.get_window_size()
        if element.size["height"] + 150 > size["height"]:  # an element screenshot stops at the window's edge
            driver.set_window_size(size["width"], element.size["height"] + 200)
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", element)
        element.screenshot(str(path))
        driver.set_window_size(size["width"], size["height"])
    assert path.stat().st_size > 1000
    return path


def test_identity_pages_and_the_planted_nan_are_in_the_dom(browser, tmp_path, artifacts):
    a, _, layout, _ = planted(tmp_path)
    open_report(browser, report(tmp_path, "report", a))
    field = {e.get_attribute("data-field"): e.text for e in css(browser, "#kvf-c0 .kvf-card dd")}
    assert field["format"] == "fp8_ds_mla" and field["profile"] == "tokenspeed"
    assert field["record"].startswith("dsv4-fp8-584 version V4") and field["bytes-per-token"] == "584"
    assert f"{PAGES} pages of {layout.page_size} rows" in field["geometry"] and field["check"] == "VIOLATIONS"
    assert len(css(browser, "#kvf-c0 .kvf-overview rect")) == PAGES
    assert "the other 40 pages are summarised" in css(browser, "#kvf-c0 .kvf-leftout")[0].text
    assert css(browser, f"#kvf-c0 .kvf-overview rect[data-page='{ZERO_PAGE}']")[0].get_attribute("class") \
        == "kvf-pg-zero"
    page, row, element = NAN_AT
    nan = css(browser, f"#kvf-c0-p{page} rect.kvf-nan[data-row='{row}'][data-block='{element // 64}']")
    assert len(nan) == 1 and nan[0].is_displayed()
    assert f"nope:e4m3_not_nan: row {row}" in css(browser, f"#kvf-c0-p{page} .kvf-findings")[0].text
    assert "0 rows written (0 failing check), 16 zero" in css(browser, f"#kvf-c0-p{ZERO_PAGE} .kvf-pagehead")[0].text
    assert console_errors(browser) == []
    shot(browser, artifacts, "test-report-top")


def test_clicking_a_row_shows_its_decoded_values(browser, tmp_path, artifacts):
    a, _, layout, cache = planted(tmp_path)
    open_report(browser, report(tmp_path, "report", a))
    page, row, element = NAN_AT
    click(browser, css(browser, f"#kvf-c0-p{page} .kvf-strip rect[data-row='{row}']")[0])
    view = css(browser, f"#kvf-c0-p{page} .kvf-rowview")[0]
    assert view.get_attribute("data-shown-row") == str(row)
    assert f"page {page} row {row} (slot {page * layout.page_size + row}): failing" in view.text
    assert "nope:e4m3_not_nan" in view.text
    shown = browser.execute_script(  # one round trip, not one per cell
        "return Array.from(arguments[0].querySelectorAll('td:not(.kvf-idx)'), c => c.textContent)",
        css(browser, f"#kvf-c0-p{page} .kvf-rowview table.kvf-values")[0])
    want = slot_record(layout, cache, page * layout.page_size + row)["regions"][0]["values"]
    assert len(shown) == len(want) == 448 and shown[element] == "nan"
    for got, expected in zip(shown, want):
        if expected != "nan":
            assert float(got) == pytest.approx(expected, rel=1e-5, abs=1e-12)
    assert len(css(browser, f"#kvf-c0-p{page} .kvf-rowview svg.kvf-chart")) == 2  # nope and rope
    assert "row 3 nope[64] block 1" in css(browser, f"#kvf-c0-p{page} .kvf-rowview pre.kvf-bytes")[0].text
    # a cell of a map opens its row too
    click(browser, css(browser, f"#kvf-c0-p{page} rect.kvf-nan")[0])
    assert view.get_attribute("data-shown-row") == str(row)
    assert console_errors(browser) == []
    shot(browser, artifacts, "test-report-row", f"#kvf-c0-p{page} .kvf-rowview")


def test_howto_find_why_two_engines_pages_differ(browser, tmp_path, artifacts, monkeypatch):
    """The how-to's walk-through (docs/howto/find-why-pages-differ.md), its screenshots included."""
    planted(tmp_path)
    monkeypatch.chdir(tmp_path)  # the files named as the how-to names them
    open_report(browser, report(tmp_path, "report", "engine_a.safetensors", "engine_b.safetensors"))
    page, row, byte = DIFF_AT
    diff = css(browser, "#kvf-c0 .kvf-diff")[0]
    assert diff.get_attribute("data-equal") == "false"
    counts = [r.text.split() for r in css(browser, "#kvf-c0 .kvf-diffcounts tbody tr")]
    assert counts == [["scale", "1", "1", "0.0625", "page", str(page), "row", str(row), "element", str(byte)]]
    first = css(browser, "#kvf-c0 .kvf-firstdiff")
    assert len(first) == 1 and first[0].get_attribute("data-region") == "scale"
    assert (first[0].get_attribute("data-page"), first[0].get_attribute("data-row")) == (str(page), str(row))
    differs = css(browser, "#kvf-c0 .kvf-overview rect.kvf-differs")
    assert [d.get_attribute("data-page") for d in differs] == [str(page)]
    shot(browser, artifacts, "howto-overview", "#kvf-c0 .kvf-pages")
    shot(browser, artifacts, "howto-diff", "#kvf-c0 .kvf-diff")
    click(browser, first[0].find_element("css selector", "a"))
    view = css(browser, f"#kvf-c0-p{page} .kvf-rowview")[0]
    assert view.get_attribute("data-shown-row") == str(row)
    assert f"page {page} row {row}" in view.text and "differs from" in view.text
    marks = view.find_elements("css selector", "pre.kvf-bytes mark")
    assert [m.text for m in marks][:1] and all(len(m.text) == 2 for m in marks)
    assert len(marks) == 2  # the one byte, marked in both files' dumps
    assert css(browser, f"#kvf-c0-p{page} .kvf-pagediff li")[0].get_attribute("data-regions") == "scale"
    assert console_errors(browser) == []
    shot(browser, artifacts, "howto-values", f"#kvf-c0-p{page} .kvf-rowview svg.kvf-chart")
    shot(browser, artifacts, "howto-nan-page", f"#kvf-c0-p{NAN_AT[0]}")
    shot(browser, artifacts, "howto-bytes", f"#kvf-c0-p{page} .kvf-rowview pre.kvf-bytes")


def test_hostile_metadata_is_shown_as_text_and_runs_nothing(browser, tmp_path, artifacts):
    path = hostile(tmp_path)
    open_report(browser, report(tmp_path, "report", path))
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    field = {e.get_attribute("data-field"): e.text for e in css(browser, ".kvf-file dd")}
    assert field["library-version"] == "<script>window.__pwned=1</script>"
    assert field["spec-version"] == '<img src=x onerror="window.__pwned=1">'
    assert css(browser, "img") == []  # no element was made from the strings
    assert len(css(browser, "script")) == 2  # the cache's JSON and the report's own script
    click(browser, css(browser, "#kvf-c0-p0 .kvf-strip rect[data-row='0']")[0])
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert console_errors(browser) == []
    shot(browser, artifacts, "test-report-hostile")


def test_hostile_pages_of_every_format_render_with_their_findings(browser, tmp_path, artifacts):
    open_report(browser, report(tmp_path, "report", hostile_pages(tmp_path)))
    sections = css(browser, ".kvf-cache")
    assert len(sections) == 11
    for index in range(len(sections)):
        assert css(browser, f"#kvf-c{index}-p2")  # the random page is shown (findings or not)
        click(browser, css(browser, f"#kvf-c{index}-p1 .kvf-strip rect[data-row='0']")[0])
        assert css(browser, f"#kvf-c{index}-p1 .kvf-rowview")[0].get_attribute("data-shown-row") == "0"
    assert css(browser, ".kvf-finding")
    assert console_errors(browser) == []
    shot(browser, artifacts, "test-report-hostile-pages")


def test_the_demo_file_shows_every_format(browser, tmp_path_factory):
    """The issue's newcomer: kvformats demo --save x.safetensors && kvformats report x.safetensors -o r.html"""
    import kvformats as kvf

    open_report(browser, demo_report(tmp_path_factory)[1])
    names = [s.get_attribute("data-name") for s in css(browser, ".kvf-cache")]
    assert names == kvf.list_formats()
    for index in range(len(names)):
        click(browser, css(browser, f"#kvf-c{index}-p0 .kvf-strip rect.kvf-st-written")[0])
        assert css(browser, f"#kvf-c{index}-p0 .kvf-rowview table.kvf-values")
    assert console_errors(browser) == []
