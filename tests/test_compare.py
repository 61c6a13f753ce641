"""``servesim compare RUN_A RUN_B``: the summary side by side with the ratio B / A per metric, paired by variant,
and with --out an offline HTML page with that table and both runs' latency CDFs overlaid; a folder that is not a
run folder is one clear error, exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app
from sim.output.compare import Comparison, RunSide, pairs, read_run
from sim.output.table import FORMATTERS, TABLE_ROWS, ratio_text, table_cells

SCENARIO = {
    "name": "cmp",
    "seed": 5,
    "workload": {
        "arrival": {"type": "all_at_once"},
        "num_requests": 10,
        "prompt_len": {"type": "uniform", "min": 16, "max": 64},
        "output_len": {"type": "fixed", "value": 6},
    },
    "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
    "policy": {"type": "continuous", "max_num_seqs": 8},
    "variants": [{"name": "wide"}, {"name": "narrow", "policy": {"type": "continuous", "max_num_seqs": 1}}],
}


def _run(tmp_path: Path, name: str, *args: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    out = tmp_path / name
    r = CliRunner().invoke(app, ["run", str(path), "-q", "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("compare")
    return _run(tmp, "a"), _run(tmp, "b", "--set", "policy.max_num_seqs=2")


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())["variants"]


def test_table_side_by_side_with_ratios(runs, tmp_path):
    a, b = runs
    r = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["metric", "a:", "wide", "b:", "wide", "×", "a:", "narrow", "b:", "narrow", "×"]
    sa, sb = _summary(a), _summary(b)
    fmt = next(f for label, key, f in TABLE_ROWS if key == "output_throughput")
    row = next(line for line in lines if line.startswith("output tok/s")).split()
    want = []
    for v in ("wide", "narrow"):
        x, y = sa[v]["output_throughput"], sb[v]["output_throughput"]
        want += [fmt(x), fmt(y), ratio_text(y / x)]
    assert row[2:] == want
    # wide: 8 sequences in A against 2 (the --set) in B
    assert sb["wide"]["mean_batch_size"] <= 2 < sa["wide"]["mean_batch_size"]
    assert float(row[4]) < 1
    assert lines[-1] == "× is B / A (A = a, B = b)"
    assert not (tmp_path / "compare.html").exists()


def test_rows_are_the_run_tables_energy_included(runs):
    """compare's rows were the metrics and the cluster rows only: J / output token and mean power, which a run's
    table shows for every GPU with power figures (this L4 among them), were missing, though the page says it puts
    every metric of the table side by side."""
    a, b = runs
    r = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    labels = [line.split("  ")[0] for line in r.output.splitlines()[2:-1]]
    run_labels = [row[0] for row in table_cells(_summary(a))[1]]
    assert labels == run_labels and "J / output token" in labels and "mean power (W)" in labels
    sa, sb = _summary(a), _summary(b)
    fmt = FORMATTERS["sig"]
    row = next(line for line in r.output.splitlines() if line.startswith("J / output token")).split()
    x, y = (s["wide"]["energy"]["j_per_output_token"] for s in (sa, sb))
    assert row[4:7] == [fmt(x), fmt(y), ratio_text(y / x)]


def test_html_page_has_the_table_and_overlaid_log_cdfs(runs, tmp_path):
    a, b = runs
    out = tmp_path / "cmp"
    r = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote {out / 'compare.html'}" in r.output
    page = (out / "compare.html").read_text()
    assert "<th>a: wide</th>" in page and "<th>b: narrow</th>" in page and "<th>×</th>" in page
    assert not re.search(r'<script[^>]+src="http', page)  # offline: plotly.js embedded
    assert "plotly" in page.lower()
    cmp = Comparison(read_run(a), read_run(b))
    f = cmp.figure()
    names = {t.name for t in f.data}
    assert names == {"a: wide", "b: wide", "a: narrow", "b: narrow"}
    # each curve appears once per panel (TTFT, TPOT, E2EL), A solid and B dashed in the same colour
    assert len(f.data) == 12
    dashes = {(t.name, t.line.dash) for t in f.data}
    assert ("a: wide", "solid") in dashes and ("b: wide", "dash") in dashes
    colors = {t.name: t.line.color for t in f.data}
    assert colors["a: wide"] == colors["b: wide"] != colors["a: narrow"]
    assert all(f.layout[f"xaxis{'' if i == 1 else i}"].type == "log" for i in (1, 2, 3))
    # and each says so, as report.html's do: rendered, TPOT's ticks 15, 20, 25 ... 40 drew closer together with no
    # word of a log scale, which reads as a linear axis gone wrong
    titles = [f.layout[f"xaxis{'' if i == 1 else i}"].title.text for i in (1, 2, 3)]
    assert titles == ["TTFT (ms), log scale", "TPOT (ms), log scale", "E2EL (s), log scale"], titles
    # the CDF holds every completed request of its run: 10 TTFT values
    ttft_a_wide = next(t for t in f.data if t.name == "a: wide" and t.xaxis == "x")
    assert len(ttft_a_wide.x) == 10


def test_same_folder_name_labels_a_and_b(tmp_path):
    one = _run(tmp_path / "x", "run")
    two = _run(tmp_path / "y", "run", "-n", "4")
    r = CliRunner().invoke(app, ["compare", str(one), str(two)])
    assert r.exit_code == 0, r.output
    assert "A: wide" in r.output and "B: wide" in r.output
    row = next(line for line in r.output.splitlines() if line.startswith("requests")).split()
    assert row[1:] == ["10", "4", "0.400", "10", "4", "0.400"]  # ratios to three significant digits


def _side(label: str, *names: str) -> RunSide:
    return RunSide(label, {n: {"num_requests": 1} for n in names})


def test_pairing():
    assert pairs(_side("a", "x", "y"), _side("b", "y", "z")) == [("y", "y"), ("x", None), (None, "z")]
    # no name in common and as many variants: in order
    assert pairs(_side("a", "naive"), _side("b", "engine")) == [("naive", "engine")]
    assert pairs(_side("a", "p", "q"), _side("b", "r", "s")) == [("p", "r"), ("q", "s")]
    assert pairs(_side("a", "p"), _side("b", "r", "s")) == [("p", None), (None, "r"), (None, "s")]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda t: t / "missing", "run folder not found"),
        (lambda t: t, "no summary.json here"),
        (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", "not a folder"),
        (lambda t: (t / "summary.json").write_text("{") and t, "summary.json: cannot read it"),
        (lambda t: (t / "summary.json").write_text('{"variants": []}') and t, "no 'variants' mapping"),
        # a summary.json of 200,000 nested lists ended in json's RecursionError traceback
        (lambda t: (t / "summary.json").write_text("[" * 200_000 + "]" * 200_000) and t,
         "summary.json: cannot read it: JSON nested too deeply"),
    ],
)
def test_bad_folders_exit_2_with_one_message(runs, tmp_path, make, message):
    bad = make(tmp_path)
    for args in ([str(bad), str(runs[0])], [str(runs[0]), str(bad)]):
        r = CliRunner().invoke(app, ["compare", *args])
        assert r.exit_code == 2
        assert message in r.output
        assert "Traceback" not in r.output
        assert r.output.count("error:") == 1


def test_engine_run_folder_compares_with_a_simulated_one(runs, tmp_path):
    pytest.importorskip("torch")
    scenario = tmp_path / "s.yaml"
    one = {**SCENARIO, "variants": [{"name": "wide"}], "workload": {**SCENARIO["workload"], "num_requests": 3}}
    scenario.write_text(yaml.safe_dump(one, sort_keys=False))
    eng = tmp_path / "eng"
    r = CliRunner().invoke(app, ["engine", "run", str(scenario), "--model", "tiny", "--time-scale", "0",
                                 "--weights", "random", "--out", str(eng)])
    assert r.exit_code == 0, r.output
    # the closing lines name every file in the folder (memory.csv and the exports included)
    lines = r.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("wrote "))
    listed = lines[i].partition("/: ")[2].split(", ") + lines[i + 1].partition("): ")[2].split(", ")
    assert "memory.csv" in listed and sorted(listed) == sorted(p.name for p in eng.iterdir())
    c = CliRunner().invoke(app, ["compare", str(runs[0]), str(eng), "--out", str(tmp_path / "c")])
    assert c.exit_code == 0, c.output
    row = next(line for line in c.output.splitlines() if line.startswith("requests")).split()
    assert row[1:4] == ["10", "3", "0.300"]
    assert (tmp_path / "c" / "compare.html").is_file()


def test_page_draws_in_a_headless_browser(runs, tmp_path):
    """The page as a user sees it: Chromium draws the CDF figure with no script error (skipped, with the reason,
    where selenium or Debian's chromium and chromium-driver are missing; .ci/run installs them)."""
    import shutil
    import time

    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver (.ci/run does)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    page = Comparison(read_run(runs[0]), read_run(runs[1])).write(tmp_path)
    opts = Options()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        driver.get(page.resolve().as_uri())
        script = ("const d = document.querySelector('.plotly-graph-div');"
                  "return d !== null && d.querySelector('svg.main-svg') !== null && d._fullData !== undefined"
                  " ? d._fullData.length : -1;")
        deadline = time.monotonic() + 120  # polled: a loaded machine gets time, a fast one does not wait
        traces = driver.execute_script(script)
        while traces < 0 and time.monotonic() < deadline:
            time.sleep(0.25)
            traces = driver.execute_script(script)
        driver.save_screenshot(str(tmp_path / "compare.png"))
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        driver.quit()
    assert traces == 12, "the CDF figure was not drawn"
    assert not errors, errors


def test_runs_with_no_variant_in_common_say_so():
    # One variant against two of other names: the table showed three columns side by side and ended "× is B / A"
    # though no column held a ratio, as if the runs had been compared.
    cmp = Comparison(_side("one", "c"), _side("two", "naive", "continuous"))
    assert "×" not in cmp.cells()[0]
    assert cmp.table().splitlines()[-1] == (
        "no ratios: no variant of A pairs with one of B (A = one: c; B = two: naive, continuous); variants pair by "
        "name, or in order when no name is shared and both runs have as many")
    assert cmp.table().count("×") == 0
    paired = Comparison(_side("one", "c"), _side("two", "d"))
    assert paired.table().splitlines()[-1] == "× is B / A (A = one, B = two)"


def test_a_run_into_a_folder_whose_summary_json_is_nested_too_deeply_writes_its_run(runs, tmp_path):
    # Before: the earlier run's files were looked up in that summary.json, and json's RecursionError ended the run
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("[" * 200_000 + "]" * 200_000)
    path = Path(__file__).parent.parent / "scenarios" / "naive-vs-continuous.yaml"
    r = CliRunner().invoke(app, ["run", str(path), "-n", "5", "-q", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert set(json.loads((out / "summary.json").read_text())["variants"]) == {"naive", "continuous"}


def test_compare_names_each_sides_slos_behind_goodput(tmp_path: Path) -> None:
    # the same run under a stricter TTFT bound read as goodput falling, the table silent on the bounds it compared
    a = _run(tmp_path / "a", "loose", "--set", "slos.ttft=2.0", "--set", "slos.tpot=0.1")
    b = _run(tmp_path / "b", "strict", "--set", "slos.ttft=0.001", "--set", "slos.tpot=0.1")
    text = Comparison(read_run(a), read_run(b)).table()
    assert ("goodput, SLO attainment: requests completed within TTFT <= 2 s and TPOT <= 100 ms (loose: wide, "
            "loose: narrow); TTFT <= 1 ms and TPOT <= 100 ms (strict: wide, strict: narrow).") in text, text
    same = Comparison(read_run(a), read_run(a)).table()
    assert "goodput, SLO attainment: requests completed within TTFT <= 2 s and TPOT <= 100 ms." in same, same
    assert "goodput, SLO attainment" in Comparison(read_run(a), read_run(b)).html()


def test_runs_of_different_request_counts_are_flagged(runs, tmp_path: Path) -> None:
    # Before: 5 requests against 10 compared without a word, their percentiles and rates set side by side as if
    # one workload had been served two ways
    a, _ = runs
    small = _run(tmp_path, "small", "-n", "5")
    r = CliRunner().invoke(app, ["compare", str(a), str(small), "--out", str(tmp_path / "page")])
    assert r.exit_code == 0, r.output
    want = ("warning: the runs served different numbers of requests (a: wide 10 requests, small: wide 5 requests; "
            "a: narrow 10 requests, small: narrow 5 requests): their percentiles and rates are of different "
            "workloads, not of one workload served two ways.")
    assert want in r.output.splitlines(), r.output
    assert "served different numbers of requests" in (tmp_path / "page" / "compare.html").read_text()
    same = CliRunner().invoke(app, ["compare", str(a), str(a)])
    assert "warning" not in same.output
