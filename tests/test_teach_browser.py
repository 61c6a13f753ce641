"""The teaching page as a student sees it: served on a free port from a thread, driven by headless Chromium.

Needs dash (the test extra has it), selenium and Debian's ``chromium`` and ``chromium-driver`` (``.ci/run``
installs them); where any is missing the test is skipped with the reason. ``SERVESIM_SCREENSHOT_DIR`` names a
folder for the screenshots (docs/teach.png is one of them); without it they go to the test's tmp folder.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("dash", reason="dash is not installed (the test extra has it)")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

from sim.studies.teach.app import create_app  # noqa: E402
from tests.browser_text_boxes import TEXT_BOXES_JS  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no headless browser: install Debian's chromium and chromium-driver (.ci/run does)",
)

# A redraw simulates two small runs and draws four figures: well under a second on a quiet machine. A loaded CI
# box is given a generous bound, polled, so a fast machine does not wait for it.
WAIT_S = 90.0



@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with socket.socket() as s:  # a free port: bind to 0, read it back, release it for the server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    httpd = make_server("127.0.0.1", port, create_app().server, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        httpd.shutdown()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,1800"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture()
def shots(tmp_path) -> Path:
    out = os.environ.get("SERVESIM_SCREENSHOT_DIR")
    d = Path(out) if out else tmp_path
    d.mkdir(parents=True, exist_ok=True)
    return d


def _wait(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {WAIT_S:.0f} s waiting for {what}")


def _text(driver, element_id: str) -> str:
    return driver.execute_script(f"const e = document.getElementById('{element_id}'); return e ? e.innerText : ''")


def _tok_s(text: str) -> float:
    m = re.search(r"output throughput ([0-9,]+) tok/s", text)
    assert m, text
    return float(m.group(1).replace(",", ""))


def _slot_rows(driver) -> str:
    """The batch-slot chart's panel titles as drawn ("... N rows at the busiest instant; batch_size=16")."""
    return driver.execute_script(
        "const g = document.querySelector('#fig-slots .js-plotly-plot');"
        "return g && g.layout ? g.layout.annotations.map(a => a.text).join(' | ') : '';"
    )


def _set_number(driver, element_id: str, value: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)
    box.send_keys(value)
    box.send_keys(Keys.ENTER)  # the value is sent on Enter (or after a pause)


def _drawn(driver) -> int:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".filter(d => d._fullData && d._fullData.length > 0 && d.querySelector('svg.main-svg')).length;"
    )


def test_page_draws_and_reacts_to_its_knobs(server, browser, shots):
    browser.get(server)
    _wait(lambda: _drawn(browser) == 4, "the four figures to be drawn")
    first = _wait(lambda: _text(browser, "throughput"), "the throughput line")
    assert first.startswith("now: naive: static batches: output throughput")
    assert "bottleneck" in _text(browser, "verdict")
    assert "Padding" in _text(browser, "explanation")  # the naive preset pads its finished rows
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe
    # every script and stylesheet comes from this server: the page works offline
    urls = browser.execute_script(
        "return Array.from(document.querySelectorAll('script[src], link[href]')).map(e => e.src || e.href);"
    )
    assert urls and all(u.startswith(server) for u in urls), urls

    # the arrival-rate slider to its lowest rate: the naive server is no longer saturated, serves fewer tokens/s
    handle = browser.find_element(By.CSS_SELECTOR, "#rate [role='slider']")
    handle.send_keys(Keys.HOME)
    _wait(lambda: handle.get_attribute("aria-valuenow") == "0.05", "the slider at its lowest rate")
    slow = _wait(lambda: (t := _text(browser, "throughput")) != first and t, "the throughput to change")
    assert _tok_s(slow) < _tok_s(first) / 10

    # pin the naive run, switch to continuous batching: a second slot panel, refilled rows instead of batches
    browser.get(server)  # a fresh page: the preset again
    _wait(lambda: _text(browser, "throughput") == first, "the first throughput again")
    naive_slots = _slot_rows(browser)
    assert "batch_size=16" in naive_slots
    browser.find_element(By.ID, "pin").click()
    _wait(lambda: _text(browser, "pinned-throughput"), "the pinned run's line")
    browser.find_element(By.CSS_SELECTOR, "#policy input[value='chunked']").click()
    slots = _wait(lambda: "max_num_seqs" in (s := _slot_rows(browser)) and s, "the continuous slot chart")
    assert slots != naive_slots and "batch_size=16" in slots  # the pinned naive panel stays beside it
    now = _text(browser, "throughput")
    assert now.startswith("now: continuous + chunked prefill")
    assert _tok_s(now) > 3 * _tok_s(first)
    assert "x the output tokens per second of the pinned one" in _text(browser, "explanation")
    _wait(lambda: _drawn(browser) == 4, "the figures redrawn")
    browser.save_screenshot(str(shots / "teach.png"))

    # a second student (another tab: its own page state) starts from the preset, and moves nothing here
    first_tab = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(server)
    assert _wait(lambda: _text(browser, "throughput"), "the second tab's throughput") == first
    assert _text(browser, "pinned-throughput") == ""
    browser.find_element(By.CSS_SELECTOR, "#rate [role='slider']").send_keys(Keys.END)
    _wait(lambda: _text(browser, "throughput") not in ("", first), "the second tab's own run")
    browser.close()
    browser.switch_to.window(first_tab)
    assert _text(browser, "throughput") == now and _text(browser, "pinned-throughput")

    # an out-of-range value: the CLI's message, and the charts keep the last good run
    _set_number(browser, "gpu_memory_utilization", "1.5")
    err = _wait(lambda: _text(browser, "error"), "the error message")
    assert err == "teach: deployment.gpu_memory_utilization: must be less than or equal to 1 (got 1.5)"
    assert _text(browser, "throughput") == now
    browser.save_screenshot(str(shots / "teach-error.png"))
    _set_number(browser, "gpu_memory_utilization", "0.9")
    _wait(lambda: not _text(browser, "error"), "the error to clear")

    # a value typed, replaced by a preset, typed again: the second time it must still reach the run
    _set_number(browser, "max_num_seqs", "4")
    few = _wait(lambda: (t := _text(browser, "throughput")) != now and t, "the run with max_num_seqs=4")
    browser.find_element(By.ID, "preset").click()
    # wait for the wanted option itself, not for any option: under load the list is drawn in parts (the
    # whole-suite run at load 12 found the list without it, an IndexError)
    option = _wait(lambda: browser.execute_script(
        "return Array.from(document.querySelectorAll(\"[role='option']\"))"
        ".find(o => o.innerText.trim() === 'lesson-continuous-batching/continuous') || null;"),
        "the preset list's lesson-continuous-batching/continuous")
    option.click()
    _wait(lambda: browser.find_element(By.ID, "max_num_seqs").get_attribute("value") == "256", "the preset's 256")
    preset_run = _wait(lambda: (t := _text(browser, "throughput")) not in (few, "") and t, "the preset's run")
    _set_number(browser, "max_num_seqs", "4")
    _wait(lambda: _text(browser, "throughput") != preset_run, "max_num_seqs=4 typed again to take effect")
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe


def _layout_problems(driver) -> tuple[dict, list[str]]:
    got = driver.execute_script(TEXT_BOXES_JS)
    problems = got["overlaps"] + got["clipped"]
    if got["scrollWidth"] > got["width"]:
        problems.append(f"the page is {got['scrollWidth']} px wide in a {got['width']} px window")
    return got, problems


@pytest.mark.parametrize("width, height", [(1400, 1000), (390, 844)], ids=["desktop", "phone"])
def test_no_text_overlaps_or_is_clipped(server, browser, shots, width, height):
    """At a desktop and a phone width, alone and with a pinned run beside it: no two text boxes of the page overlap
    (tick labels, axis and chart titles, legend entries, percentile labels, the slider's label, marks and value),
    no text runs into a legend or the mode bar, and none is cut by its plot area, its figure or the page.

    Measured before the fix at 1400 px: the slider's value over its label, "time (s)" over the tick "80", p95 over
    p99 in the CDFs and both cut at the plot's right edge; at 390 px the page was 463 px wide and 173 boxes
    overlapped."""
    browser.set_window_size(width, height)
    try:
        browser.get(server)
        _wait(lambda: _drawn(browser) == 4, "the four figures to be drawn")
        narrow = width < 1200
        rows = 3 if narrow else 1  # the CDF panels: stacked on a phone, side by side on a desktop
        tops = browser.execute_script(
            "const l = document.querySelector('#fig-cdfs .js-plotly-plot')._fullLayout;"
            "return ['yaxis', 'yaxis2', 'yaxis3'].map(a => l[a].domain[1]);")
        assert len(set(tops)) == rows, tops
        got, problems = _layout_problems(browser)
        assert problems == [], problems
        # the texts the issue named are there, so the check saw them: the slider's label and value, axis titles
        assert {"arrival rate (requests/s)", "time (s)", "p99", "p95"} <= set(got["texts"]), got["texts"]
        assert browser.find_element(By.CSS_SELECTOR, "#rate input[type='number']").get_attribute("value") == "8"
        _shot(browser, shots / f"teach-{width}.png")

        browser.find_element(By.ID, "pin").click()
        _wait(lambda: _text(browser, "pinned-throughput"), "the pinned run's line")
        browser.find_element(By.CSS_SELECTOR, "#policy input[value='chunked']").click()
        _wait(lambda: "max_num_seqs" in _slot_rows(browser), "the continuous slot chart beside the pinned one")
        _wait(lambda: _drawn(browser) == 4, "the figures redrawn")
        got, problems = _layout_problems(browser)
        assert problems == [], problems
        _shot(browser, shots / f"teach-{width}-pinned.png")
    finally:
        browser.set_window_size(1500, 1800)


def _shot(driver, path: Path) -> None:
    """A screenshot of the whole page: the window made as tall as the page, then back (the figures keep their
    layout: the page chose it for the width, which does not change)."""
    w, h = driver.get_window_size()["width"], driver.get_window_size()["height"]
    page, chrome = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight];")
    driver.set_window_size(w, page + chrome)
    time.sleep(0.5)  # plotly redraws at the new size
    driver.save_screenshot(str(path))
    driver.set_window_size(w, h)
