"""The report as a user sees it: rendered by a real headless Chromium, every figure drawn, no script error.

The checks that read the HTML as text (tests/test_report.py) cannot tell whether plotly.js actually draws the
figures: a bad trace, a NaN in a layout or a script that throws leaves an empty div that only a browser shows.
This test needs Debian's ``chromium`` and ``chromium-driver`` packages (``.ci/run`` installs them) and selenium;
where either is missing it is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from sim.config.scenario import load_scenario
from sim.loop.run import run_scenario
from sim.output.report import write_report
from sim.studies.teaching import find_scenario
from tests.browser_text_boxes import TEXT_BOXES_JS

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no headless browser: install Debian's chromium and chromium-driver (.ci/run does)",
)

# Drawing a 5 MB page with a dozen figures takes a second or two on a quiet machine; a loaded CI box is given a
# generous bound, polled, so a fast machine does not wait for it.
RENDER_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # an explicit driver path, so Selenium Manager never tries to download one (there is no network for it)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(RENDER_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _drawn_figures(driver) -> tuple[int, int]:
    """(figure divs on the page, figures plotly has drawn: a div holding its main SVG with at least one trace)."""
    return driver.execute_script(
        """
        const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
        const drawn = divs.filter(d => d.querySelector('svg.main-svg') !== null
                                    && d._fullData !== undefined && d._fullData.length > 0);
        return [divs.length, drawn.length];
        """
    )


def _render(driver, page: Path, shot: Path) -> tuple[int, int, list[dict]]:
    driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    total, drawn = _drawn_figures(driver)
    while (total == 0 or drawn < total) and time.monotonic() < deadline:
        time.sleep(0.25)
        total, drawn = _drawn_figures(driver)
    driver.save_screenshot(str(shot))
    return total, drawn, driver.get_log("browser")


def _texts_meeting(driver, box: str, texts: str) -> list[str]:
    """Per figure, the texts (CSS selector ``texts``) whose boxes meet the box of its element ``box``, measured from
    the page's layout."""
    return driver.execute_script(
        """
        const [box, texts] = arguments;
        const out = [];
        for (const d of document.querySelectorAll('.plotly-graph-div')) {
            const el = d.querySelector(box);
            if (el === null) continue;
            const b = el.getBoundingClientRect();
            for (const t of d.querySelectorAll(texts)) {
                const r = t.getBoundingClientRect();
                if (r.width > 0 && r.height > 0 && r.left < b.right && b.left < r.right && r.top < b.bottom
                    && b.top < r.bottom) out.push(d.id + ': ' + t.textContent);
            }
        }
        return out;
        """, box, texts)


def _texts_under_the_mode_bar(driver) -> list[str]:
    """The texts that meet a figure's mode bar (the icons are laid out while hidden and show on hover, over
    whatever lies beneath)."""
    return _texts_meeting(driver, ".modebar", "svg text")


def test_naive_vs_continuous_report_draws_every_figure(browser, tmp_path):
    scenario, raw = load_scenario(find_scenario("naive-vs-continuous"), {"workload.num_requests": 300})
    run = run_scenario(scenario, raw)
    page = tmp_path / "report.html"
    write_report(page, run.results, run.summaries, title="naive vs continuous, 300 requests")

    shot = Path(os.environ.get("SERVESIM_SCREENSHOT_DIR", tmp_path)) / "report.png"
    total, drawn, logs = _render(browser, page, shot)

    severe = [entry["message"] for entry in logs if entry.get("level") == "SEVERE"]
    assert severe == [], f"script errors in the report: {severe}"
    # the report has the summary, slots, memory, utilisation, latency and throughput figures
    assert total >= 6, f"only {total} figures on the page"
    assert drawn == total, f"{total - drawn} of {total} figures were not drawn within {RENDER_TIMEOUT_S:.0f} s"
    assert shot.stat().st_size > 10_000  # a blank page's screenshot is a few kB
    # issue 35: titles such as "KV cache by request: naive (...)" ran under the icons
    assert _texts_under_the_mode_bar(browser) == []


def test_power_chart_legend_clears_its_time_axis_title(browser, tmp_path):
    """The energy section's legend sat 0.2 of the plot height below it, on the x axis title: rendered, autoscale-
    memory-bound's three variants wrote their legend over "time (s)"."""
    from sim.output.report.energy import fig_energy

    scenario, raw = load_scenario(find_scenario("autoscale-memory-bound"), {"workload.num_requests": 20})
    fig = fig_energy(run_scenario(scenario, raw).results)
    assert fig is not None
    page = tmp_path / "energy.html"
    fig.write_html(page, include_plotlyjs=True)
    total, drawn, _ = _render(browser, page, tmp_path / "energy.png")
    assert total == drawn == 1
    clash = browser.execute_script(
        """
        const legend = document.querySelector('.legend').getBoundingClientRect();
        return Array.from(document.querySelectorAll('.g-xtitle text, .g-x2title text'))
            .map(t => [t.textContent, t.getBoundingClientRect()])
            .filter(([_, r]) => r.left < legend.right && legend.left < r.right && r.top < legend.bottom
                                && legend.top < r.bottom)
            .map(([text, _]) => text);
        """
    )
    assert clash == []


def _legends_on_axis_titles(driver) -> list[str]:
    """The x axis titles (plotly's g-xtitle, g-x2title...) that meet a figure's legend."""
    return _texts_meeting(driver, ".legend", 'g[class^="g-x"][class$="title"] text')


@pytest.mark.parametrize("name", ["lesson-disaggregation", "classes-priority", "lesson-speculative-decoding"])
def test_no_legend_is_drawn_over_an_axis_title(browser, tmp_path, name):
    """Rendered, lesson-disaggregation's cluster chart wrote its legend ("colocated: replicas", ...) over its
    "time (s)", as the power chart did before 07854d8; so did other horizontal legends 0.2-0.25 of the plot
    height under their axes."""
    scenario, raw = load_scenario(find_scenario(name), {"workload.num_requests": 40})
    run = run_scenario(scenario, raw)
    page = tmp_path / "report.html"
    write_report(page, run.results, run.summaries, title=name)
    total, drawn, _ = _render(browser, page, tmp_path / "report.png")
    assert total == drawn > 0
    assert _legends_on_axis_titles(browser) == []


@pytest.mark.parametrize("name, n", [("lesson-continuous-batching", 120), ("lesson-pipeline-bubbles", 16)])
def test_percentile_labels_are_neither_cut_nor_stacked(browser, tmp_path, name, n):
    """Rendered, lesson-continuous-batching's latency CDFs cut the naive server's "p95" and "p99" at the plot's right
    edge (its TTFT and E2EL are the axis's largest) and wrote each variant's p95 over its p99 (0.04 apart on the y
    axis); lesson-pipeline-bubbles' four sweep points wrote their p50s over each other. The teaching page had been
    fixed for itself (its test measures every text box); the report's figure is the one it starts from."""
    from sim.output.report import fig_latency_cdfs

    scenario, raw = load_scenario(find_scenario(name), {"workload.num_requests": n})
    fig = fig_latency_cdfs(run_scenario(scenario, raw).results)
    page = tmp_path / "cdfs.html"
    fig.write_html(page, include_plotlyjs=True)
    total, drawn, _ = _render(browser, page, tmp_path / "cdfs.png")
    assert total == drawn == 1
    got = browser.execute_script(TEXT_BOXES_JS)
    assert {"p50", "p95", "p99"} <= set(got["texts"]), got["texts"]  # the labels are there, so the check saw them
    assert got["overlaps"] + got["clipped"] == []


def _report_text_boxes(driver, tmp_path: Path, name: str, n: int) -> dict:
    """The shipped scenario ``name`` run on ``n`` requests, its report rendered: TEXT_BOXES_JS's measurement."""
    scenario, raw = load_scenario(find_scenario(name), {"workload.num_requests": n})
    run = run_scenario(scenario, raw)
    page = tmp_path / "report.html"
    write_report(page, run.results, run.summaries, title=name)
    total, drawn, _ = _render(driver, page, tmp_path / "report.png")
    assert total == drawn > 0
    return driver.execute_script(TEXT_BOXES_JS)

def test_a_sweep_points_kv_by_request_title_fits_its_figure(browser, tmp_path):
    """Rendered, lesson-pipeline-bubbles' "KV cache by request: lesson-pipeline-bubbles[num_users=16] (first ... s,
    at most 60 requests, one band each; weights ... GiB not stacked; KV pool ... GiB, off the scale)" ran 9-14 px
    past both edges of its figure at 1400 px: a sweep point's name made the one-line title too long."""
    got = _report_text_boxes(browser, tmp_path, "lesson-pipeline-bubbles", 16)
    titles = [t for t in got["texts"] if t.startswith("KV cache by request")]
    assert len(titles) == 8, got["texts"]  # a heading and a figure title per variant
    assert [c for c in got["clipped"] if "gtitle" in c] == []


def test_a_long_batch_slot_panel_title_fits_its_figure(browser, tmp_path):
    """Rendered, autoscale-memory-bound's batch-slot panel titles ("scale-on-busy: 254 of 484 bars drawn, 400
    scheduled requests (a preempted request has one bar per stretch it ran); 83 rows: 8 replicas stacked, each as
    many as it held at its busiest instant; max_num_seqs=256 per replica") ran 150-160 px past both edges of the
    figure at 1400 px."""
    got = _report_text_boxes(browser, tmp_path, "autoscale-memory-bound", 120)
    assert any(t.startswith("scale-on-busy: ") for t in got["texts"]), got["texts"]
    assert [c for c in got["clipped"] if "annotation-text" in c or "gtitle" in c] == []
