"""The run folder (summary.json, CSVs, report.html), the terminal table and the report's figures."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import replace

import numpy as np
import pytest

import sim.output.run_folder as output
from sim.metrics.columns import LATENCY_COLUMNS, REQUEST_COLUMNS, STEP_CSV_COLUMNS
from sim.metrics.records import REQUEST_FIELDS, STEP_COLUMNS, RequestRecord, RunResult
from sim.metrics.summary import SUMMARY_KEYS, SLOs, summarize
from sim.output.report import (
    MAX_POINTS,
    amount_per_window,
    build_report,
    ecdf_points,
    fig_kv_memory,
    fig_latency_cdfs,
    fig_throughput,
    fig_timeline,
    state_per_window,
    trace_points,
    write_report,
)
from sim.output.run_folder import (
    format_table,
    read_requests,
    read_steps,
    read_summary,
    write_run,
)
from sim.output.table import FORMATTERS, ratio_text

RUN_FILES = {"summary.json", "requests.csv", "steps.csv", "report.html"}


def _exports(results) -> set[str]:
    """Per variant, the vllm-bench JSON and the OpenMetrics text a run folder also holds (sim/output/benchfiles)."""
    return {r.name + suffix for r in results for suffix in (".vllm-bench.json", ".metrics.prom")}


def rec(id, arrival, first, finish, out, outcome="completed", replica=0) -> RequestRecord:
    return RequestRecord(
        id=id,
        arrival=arrival,
        first_scheduled=arrival + 0.125 if outcome != "rejected" else -1.0,
        first_token=first,
        finish=finish,
        prompt_tokens=37 * (id + 1),
        output_tokens=out,
        target_output_tokens=max(out, 3),
        num_preemptions=id % 2,
        outcome=outcome,
        reason="" if outcome == "completed" else "no room, \"quoted\", with comma",
        replica=replica,
        session_id=-1 if id % 2 else 11,
    )


def small_run(name: str, slow: float = 1.0) -> RunResult:
    requests = [
        rec(2, 0.3, 0.3 + 0.41 * slow, 0.3 + 2.17 * slow, 9),
        rec(0, 0.1, 0.1 + 0.37 * slow, 0.1 + 1.93 * slow, 7),
        rec(1, 0.2, 0.2 + 0.29 * slow, 0.2 + 0.29 * slow, 1),
        rec(3, 0.7, -1.0, 0.7, 0, outcome="rejected"),
    ]
    n = 9
    rng = np.random.default_rng(7)
    dur = rng.uniform(0.05, 0.2, n) * slow
    start = 0.15 + np.cumsum(dur) - dur + np.arange(n) * 0.013
    steps = {
        "replica": np.zeros(n, dtype=np.int64),
        "start": start,
        "duration": dur,
        "batch_size": rng.integers(1, 4, n),
        "padded_rows": np.zeros(n, dtype=np.int64),
        "prefill_tokens": rng.integers(0, 300, n),
        "decode_tokens": rng.integers(1, 4, n),
        "padding_tokens": rng.integers(0, 3, n),
        "kv_blocks_used": rng.integers(5, 60, n),
        "kv_blocks_reserved": rng.integers(0, 9, n),
        "kv_tokens": rng.integers(50, 700, n),
        "kv_capacity_blocks": np.full(n, 64),
        "num_running": rng.integers(1, 4, n),
        "num_waiting": rng.integers(0, 5, n),
        "num_swapped": np.zeros(n, dtype=np.int64),
        "num_preempted": rng.integers(0, 2, n),
        "num_rejected": np.zeros(n, dtype=np.int64),
        "swap_blocks": np.zeros(n, dtype=np.int64),
        "flops": rng.uniform(1e11, 9e11, n),
    }
    steps = {k: np.asarray(v, dtype=STEP_COLUMNS[k]) for k, v in steps.items()}
    return RunResult(
        name=name,
        requests=requests,
        steps=steps,
        itl_gaps=rng.uniform(0.01, 0.09, 20),
        itl_counts=rng.integers(1, 6, 20),
        duration=float(0.2 + 2.17 * slow),
        peak_flops=3.12e14,
        kv_capacity_blocks=64,
        block_size=16,
        kv_bytes_per_block=2.0**21,
    )


@pytest.fixture
def two_runs() -> tuple[list[RunResult], dict]:
    results = [small_run("continuous"), small_run("static", slow=1.7)]
    slos = SLOs(ttft=0.5, e2el=3.0)
    return results, {r.name: summarize(r, slos) for r in results}


def test_summary_json_layout(tmp_path, two_runs):
    results, summaries = two_runs
    scenario = {"seed": 3, "policy": {"kind": "continuous"}, "path": tmp_path / "x.yaml"}
    write_run(tmp_path, results, summaries, scenario=scenario)
    text = (tmp_path / "summary.json").read_text()
    doc = json.loads(text)  # strict JSON: no NaN or Infinity tokens
    assert "NaN" not in text and "Infinity" not in text
    assert set(doc) == {"variants", "scenario", "servesim_version", "units"}
    assert set(SUMMARY_KEYS) <= set(doc["units"])  # every figure's unit is stated beside it
    assert doc["units"]["ttft"] == doc["units"]["duration"] == "s" and doc["units"]["output_throughput"] == "tokens/s"
    assert doc["scenario"] == {"seed": 3, "policy": {"kind": "continuous"}, "path": str(tmp_path / "x.yaml")}
    assert list(doc["variants"]) == ["continuous", "static"]
    for metrics in doc["variants"].values():
        assert tuple(metrics) == SUMMARY_KEYS
        for key in ("ttft", "tpot", "itl", "e2el"):
            assert list(metrics[key]) == ["mean", "p50", "p90", "p95", "p99"]
        assert list(metrics["kv_usage"]) == ["mean", "max"]
        for key in ("output_throughput", "request_throughput", "goodput", "busy_fraction", "mfu"):
            assert isinstance(metrics[key], float)
        for key in ("num_preemptions", "num_rejected", "num_completed"):
            assert isinstance(metrics[key], int)
    assert read_summary(tmp_path) == doc == read_summary(tmp_path / "summary.json")


def test_nan_becomes_null(tmp_path):
    r = small_run("x")
    r.peak_flops = 0.0  # MFU undefined
    write_run(tmp_path, [r], {"x": summarize(r)})  # no SLOs: goodput undefined
    m = read_summary(tmp_path)["variants"]["x"]
    assert m["mfu"] is None and m["goodput"] is None and m["slo_attainment"] is None and m["slos"] is None


def test_csv_round_trip(tmp_path, two_runs):
    results, summaries = two_runs
    write_run(tmp_path, results, summaries)
    with open(tmp_path / "requests.csv") as f:
        assert f.readline().rstrip("\n").split(",") == ["variant", *REQUEST_COLUMNS]
    with open(tmp_path / "steps.csv") as f:
        assert f.readline().rstrip("\n").split(",") == ["variant", *STEP_CSV_COLUMNS]
    reqs = read_requests(tmp_path)
    steps = read_steps(tmp_path)
    for res in results:
        assert reqs[res.name] == sorted(res.requests, key=lambda r: r.id)
        for k, t in STEP_COLUMNS.items():
            assert steps[res.name][k].dtype == t
            np.testing.assert_array_equal(steps[res.name][k], res.steps[k])  # exact: floats written with repr


def test_requests_csv_latency_columns_and_empty_cells(tmp_path, two_runs):
    """Each request's latencies in seconds, with summarize's definitions (their means are summary.json's means);
    what never happened is an empty cell, not a -1 that would pass for a value."""
    results, summaries = two_runs
    write_run(tmp_path, results, summaries)
    with open(tmp_path / "requests.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["variant"] == results[0].name]
    by_id = {int(r["id"]): r for r in rows}
    assert float(by_id[0]["ttft_s"]) == pytest.approx(0.37)
    assert float(by_id[0]["e2el_s"]) == pytest.approx(1.93)
    assert float(by_id[0]["tpot_s"]) == pytest.approx((1.93 - 0.37) / 6)
    assert float(by_id[0]["queue_s"]) == pytest.approx(0.125)
    assert by_id[1]["tpot_s"] == ""  # one output token: no time per output token
    rejected = by_id[3]
    assert [rejected[c] for c in ("first_scheduled_s", "first_token_s", "queue_s", "ttft_s", "tpot_s", "e2el_s")] \
        == [""] * 6
    assert by_id[1]["session_id"] == "" and by_id[0]["session_id"] == "11"
    m = summaries[results[0].name]
    assert np.mean([float(r["ttft_s"]) for r in rows if r["ttft_s"]]) == pytest.approx(m["ttft"]["mean"])
    assert np.mean([float(r["e2el_s"]) for r in rows if r["e2el_s"]]) == pytest.approx(m["e2el"]["mean"])


def test_older_run_folders_still_read(tmp_path, two_runs):
    """Run folders written before the unit suffixes (time columns without _s, -1 for what never happened) read
    into the same records and columns."""
    results, summaries = two_runs
    write_run(tmp_path, results, summaries)
    new_reqs, new_steps = read_requests(tmp_path), read_steps(tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    with open(old / "requests.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        older = [k for k in REQUEST_FIELDS if k not in ("preempted_at", "resumed_at")]  # not written back then
        w.writerow(["variant", *older])
        for res in results:
            for r in sorted(res.requests, key=lambda r: r.id):
                w.writerow([res.name] + [getattr(r, k) for k in older])
    lines = (tmp_path / "steps.csv").read_text().splitlines()
    lines[0] = ",".join(["variant", *STEP_COLUMNS])
    (old / "steps.csv").write_text("\n".join(lines) + "\n")
    assert read_requests(old) == new_reqs
    old_steps = read_steps(old)
    for name, cols in new_steps.items():
        for k in STEP_COLUMNS:
            np.testing.assert_array_equal(old_steps[name][k], cols[k])


def test_same_inputs_give_identical_bytes(tmp_path, two_runs):
    results, summaries = two_runs
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, results, summaries, scenario={"seed": 1})
    first = {n: (a / n).read_bytes() for n in RUN_FILES}
    write_run(a, results, summaries, scenario={"seed": 1})  # overwrite in place
    write_run(b, results, summaries, scenario={"seed": 1})
    for n in RUN_FILES:
        assert (a / n).read_bytes() == first[n] == (b / n).read_bytes(), n


def test_write_leaves_no_temporary_files_and_keeps_other_files(tmp_path, two_runs):
    results, summaries = two_runs
    (tmp_path / "notes.txt").write_text("mine")
    write_run(tmp_path, results, summaries)
    write_run(tmp_path, results, summaries)
    assert set(os.listdir(tmp_path)) == RUN_FILES | _exports(results) | {"notes.txt"}
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_failed_write_changes_nothing(tmp_path, two_runs, monkeypatch):
    results, summaries = two_runs
    write_run(tmp_path, results[:1], {results[0].name: summaries[results[0].name]})
    before = {n: (tmp_path / n).read_bytes() for n in RUN_FILES}

    def broken(f, results):  # steps.csv is streamed: fail after part of it is in the temporary file
        f.write("variant,start_s\n")
        raise RuntimeError("disk full")

    monkeypatch.setattr(output, "write_steps_csv", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_run(tmp_path, results, summaries)
    assert set(os.listdir(tmp_path)) == RUN_FILES | _exports(results[:1])  # no temporary file left behind
    assert {n: (tmp_path / n).read_bytes() for n in RUN_FILES} == before


def test_failed_replace_leaves_no_temporary_files(tmp_path, two_runs, monkeypatch):
    results, summaries = two_runs
    real_replace = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("interrupted")
        real_replace(src, dst)

    monkeypatch.setattr(output.os, "replace", flaky)
    with pytest.raises(OSError, match="interrupted"):
        write_run(tmp_path, results, summaries)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_duplicate_variant_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        write_run(tmp_path, [small_run("a"), small_run("a")])


def test_variant_names_that_read_alike_as_files_keep_their_own_exports(tmp_path):
    """'a b' and 'a/b' are both a_b as a file name: one pair of export files held the later variant, the earlier's
    were lost without a word. And a name beginning with a dot made a hidden file ('.' gave '..metrics.prom')."""
    names = ["a b", "a/b", "A_b", ".", "../x"]
    write_run(tmp_path, [small_run(n) for n in names])
    stems = ["a_b", "a_b-2", "A_b-3", "variant", "x"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["summary.json", "requests.csv", "steps.csv", "report.html"]
        + [s + suffix for s in stems for suffix in (".vllm-bench.json", ".metrics.prom")])
    for name, stem in zip(names, stems, strict=True):  # each file holds its own variant
        assert json.loads((tmp_path / f"{stem}.vllm-bench.json").read_text())["label"] == name


def test_format_table(two_runs):
    results, summaries = two_runs
    text = format_table(summaries)
    lines = [line for line in text.splitlines() if not line.endswith(".")]  # the notes under the table end so
    header = lines[0].split()
    assert header == ["metric", "continuous", "static", "static", "/", "continuous"]
    rows = {line[: len("TTFT p50 (ms)")]: line for line in lines[2:]}
    assert "TTFT p50 (ms)" in rows and "output tok/s" in text and "KV usage max" in text and "MFU" in text
    completed = next(line for line in lines if line.startswith("completed")).split()
    assert completed == ["completed", "3", "3", "1.00"]
    ttft = next(line for line in lines if line.startswith("TTFT p50 (ms)")).split()
    c, s = summaries["continuous"]["ttft"]["p50"], summaries["static"]["ttft"]["p50"]
    assert ttft[-3:] == [f"{1e3 * c:.1f}", f"{1e3 * s:.1f}", ratio_text(s / c)]
    # numbers are right-aligned in fixed-width columns
    ends = {len(line) for line in lines[2:] if not line.endswith("-")}
    assert len(ends) == 1


_SLOS = {"ttft": 2.0, "tpot": 0.1, "e2el": None}
_NAIVE = {"ttft": {"mean": 366.1746, "p50": 366.8414, "p99": 719.1786}, "request_throughput": 1.30,
          "output_throughput": 333.2, "goodput": 0.0083, "slo_attainment": 0.004, "padding_fraction": 0.664,
          "num_requests": 1200, "num_completed": 1200, "num_preemptions": 0, "slos": _SLOS}
_CONT = {"ttft": {"mean": 0.0772, "p50": 0.0569, "p99": 0.3462}, "request_throughput": 5.90,
         "output_throughput": 1517.4, "goodput": 5.89, "slo_attainment": 0.999, "padding_fraction": 0.0,
         "num_requests": 1200, "num_completed": 1200, "num_preemptions": 0, "slos": _SLOS}


def test_table_text_labels_its_ratio_column_slos_and_rates():
    # issue 35: an unlabelled "×" column mixing 1/N and decimals, "0" for padding 66.4% -> 0.0%, 366841.4 ms
    # without separators, goodput without its SLOs, and a req/s beside other rates with no word on which
    assert format_table({"naive": _NAIVE, "continuous": _CONT}) == """\
metric                 naive  continuous  continuous / naive
-----------------  ---------  ----------  ------------------
TTFT mean (ms)     366,174.6        77.2            0.000211
TTFT p50 (ms)      366,841.4        56.9            0.000155
TTFT p99 (ms)      719,178.6       346.2            0.000481
TPOT mean (ms)             -           -                   -
TPOT p50 (ms)              -           -                   -
TPOT p99 (ms)              -           -                   -
ITL p50 (ms)               -           -                   -
ITL p99 (ms)               -           -                   -
E2EL p50 (s)               -           -                   -
E2EL p99 (s)               -           -                   -
queue p99 (s)              -           -                   -
output tok/s             333       1,517                4.55
total tok/s                -           -                   -
req/s (completed)       1.30        5.90                4.54
goodput (req/s)         0.01        5.89                 710
SLO attainment          0.4%       99.9%                 250
KV usage mean              -           -                   -
KV usage max               -           -                   -
KV token util              -           -                   -
GPU busy                   -           -                   -
MFU                        -           -                   -
mean batch                 -           -                   -
padding                66.4%        0.0%                   -
preemptions                0           0                   -
rejected                   -           -                   -
completed              1,200       1,200                1.00
requests               1,200       1,200                1.00
goodput, SLO attainment: requests completed within TTFT <= 2 s and TPOT <= 100 ms.
tok/s, req/s and goodput: per second from a run's first arrival to its last finish.
"""


def test_table_notes_give_each_variant_and_class_its_slos():
    from sim.output.table import table_notes

    naive = {**_NAIVE, "classes": {"interactive": {"slos": {"ttft": 1.0, "tpot": None, "e2el": None}},
                                   "batch": {"slos": _SLOS}}}
    cont = {**_CONT, "slos": {"ttft": 1.0, "tpot": None, "e2el": 30.0}}
    assert table_notes({"naive": naive, "continuous": cont}) == [
        "goodput, SLO attainment: requests completed within TTFT <= 2 s and TPOT <= 100 ms, a class's own where it "
        "has them (naive); TTFT <= 1 s and E2EL <= 30 s (continuous).",
        "interactive: goodput, SLO attainment within TTFT <= 1 s (naive).",
        "tok/s, req/s and goodput: per second from a run's first arrival to its last finish.",
    ]
    one = table_notes({"v": naive})
    assert one[:2] == ["goodput, SLO attainment: requests completed within TTFT <= 2 s and TPOT <= 100 ms, a "
                       "class's own where it has them.", "interactive: goodput, SLO attainment within TTFT <= 1 s."]
    assert table_notes({"v": {}}) == ["tok/s, req/s and goodput: per second from a run's first arrival to its "
                                      "last finish."]
    # classes with SLOs of their own and no run SLOs (docs/write-a-policy.md's builtins.yaml): the run's note read
    # "within no SLOs, a class's own where it has them", and each class's line came once per variant
    classes = {"classes": {"interactive": {"slos": {"ttft": 1.0}}, "batch": {"slos": {"ttft": 30.0}}}}
    assert table_notes({"fcfs": classes, "edf": classes})[:3] == [
        "goodput, SLO attainment: requests completed within their class's own SLOs (none for a class without).",
        "interactive: goodput, SLO attainment within TTFT <= 1 s.", "batch: goodput, SLO attainment within TTFT <= 30 s."]


@pytest.mark.parametrize(
    "ratio, text",
    [(1 / 2000, "0.000500"), (1 / 1124.4, "0.000889"), (1 / 6447, "0.000155"), (0.03, "0.0300"), (0.1, "0.100"),
     (0.57, "0.570"), (1.0, "1.00"), (4.184, "4.18"), (60.0, "60.0"), (99.94, "99.9"), (99.96, "100"),
     (250.95, "251"), (1124.4, "1,124"), (2000.0, "2,000"),
     (0.0, "-"), (float("nan"), "-"), (float("inf"), "-")],
)
def test_ratio_column_reads_across_decades(ratio, text):
    """A 2000x fall in TTFT once printed as 0.00, indistinguishable from a zero; then as 1/2,000 beside decimals
    in the same column, and a fall to zero (padding 65.8% -> 0.0%) as "0" (issue 35). One format now: three
    significant digits, whole numbers from 100 up, "-" where the ratio means nothing."""
    assert ratio_text(ratio) == text


def test_joules_per_token_keep_three_significant_digits():
    """J / output token was written with :.3g, so mooncake-long-context's 1.996 J read "2" beside the other
    variant's "2.02", as if it were exact; trailing zeros are kept now, as in the ratio column."""
    fmt = FORMATTERS["sig"]
    assert [fmt(x) for x in (1.996, 2.02, 0.5, 0.2635, 0.0, 1234.5)] == ["2.00", "2.02", "0.500", "0.264", "0",
                                                                         "1,234"]
    j = next(row for row in format_table({"a": {"energy": {"j_per_output_token": 1.996}},
                                          "b": {"energy": {"j_per_output_token": 2.02}}}).splitlines()
             if row.startswith("J / output token"))
    assert j.split()[4:6] == ["2.00", "2.02"]


def test_format_table_without_ratio_and_with_missing_values():
    r = small_run("only")
    r.peak_flops = 0.0
    text = format_table({"only": summarize(r)})
    assert "×" not in text.splitlines()[0]
    mfu = next(line for line in text.splitlines() if line.startswith("MFU"))
    assert mfu.split() == ["MFU", "-"]


def test_report_is_self_contained(tmp_path, two_runs):
    results, summaries = two_runs
    html = build_report(results, summaries, "a <b> title")
    assert html.count("plotly.js v") == 1  # the bundle, inlined once
    # slots, CDFs, throughput; timeline, memory stack and KV by request for each variant
    assert html.count("Plotly.newPlot(") == 3 + 3 * len(results)
    assert '<table class="summary">' in html and "TTFT p99 (ms)" in html
    assert "a &lt;b&gt; title" in html
    assert "<script src=" not in html and '<link rel="stylesheet" href' not in html  # nothing to fetch
    for name in ("continuous", "static"):
        assert f"<li><b>{name}</b>: " in html
    p = write_report(tmp_path / "r" / "report.html", results, summaries, "t")
    assert p.read_text().count("plotly.js v") == 1
    assert os.listdir(p.parent) == ["report.html"]


def test_figures_have_a_curve_per_variant(two_runs):
    results, _ = two_runs
    cdf = fig_latency_cdfs(results)
    names = {t.name for t in cdf.data if t.mode == "lines"}
    assert names == {"continuous", "static"}
    assert len([t for t in cdf.data if t.mode == "lines"]) == 3 * len(results)
    tl = fig_timeline(results[0])
    assert {"busy", "MFU", "KV used", "waiting", "running", "rejections", "preemptions"} <= {t.name for t in tl.data}
    kv = fig_kv_memory(results[0])
    assert [t.name for t in kv.data] == ["holding tokens", "reserved, empty", "capacity"]
    assert kv.data[2].y[0] == pytest.approx(64 * 2.0**21 / 2**30)
    assert len(fig_throughput(results).data) == 3 * len(results)


def test_amount_per_window_is_exact_for_overlapping_steps():
    starts = np.array([0.5, 1.0, 1.0, 2.75])
    durs = np.array([1.0, 2.0, 0.0, 0.5])  # overlapping, and one step of zero length
    amounts = np.array([4.0, 8.0, 3.0, 2.0])
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    got = amount_per_window(starts, durs, amounts, edges)
    np.testing.assert_allclose(got, [2.0, 2.0 + 3.0 + 4.0, 4.0 + 1.0, 1.0], rtol=1e-12)
    assert got.sum() == pytest.approx(amounts.sum())


def _amount_per_window_before(starts, durations, amounts, edges):
    """amount_per_window as it was before issue 40 dropped its temporaries early: new arrays everywhere."""
    cum = np.zeros(len(edges))
    point = durations <= 0
    if point.any():  # unchanged: each zero-length step's amount at its start
        o = np.argsort(starts[point], kind="stable")
        at = starts[point][o]
        idx = np.r_[np.searchsorted(at, edges[:-1], side="left"), np.searchsorted(at, edges[-1:], side="right")]
        cum += np.concatenate(([0.0], np.cumsum(amounts[point][o])))[idx]
    if (~point).any():
        s, d, a = starts[~point], durations[~point], amounts[~point]
        rate = a / d
        times = np.concatenate((s, s + d))
        order = np.argsort(times, kind="stable")
        times = times[order]
        rate_after = np.cumsum(np.concatenate((rate, -rate))[order])
        at_times = np.concatenate(([0.0], np.cumsum(np.diff(times) * rate_after[:-1])))
        cum += np.interp(edges, times, at_times)
    return np.diff(cum)


@pytest.mark.parametrize("zero_share", [0.0, 0.1, 1.0])
def test_amount_per_window_keeps_its_bits(zero_share):
    """Seeded steps, overlapping (several replicas) and some of zero length: the same floats as before."""
    rng = np.random.default_rng(5)
    n = 5000
    starts = np.sort(rng.uniform(0, 100, n))
    durs = np.where(rng.uniform(size=n) < zero_share, 0.0, rng.exponential(0.05, n))
    amounts = rng.integers(0, 300, n).astype(np.float64)
    edges = np.linspace(0, 101, 251)
    assert amount_per_window(starts, durs, amounts, edges).tolist() == \
        _amount_per_window_before(starts, durs, amounts, edges).tolist()


def test_state_per_window_aggregates_and_holds():
    t = np.array([0.1, 0.2, 0.3, 2.5])
    v = np.array([3.0, 7.0, 5.0, 1.0])
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(state_per_window(t, v, edges, "max"), [7.0, 7.0, 1.0])
    np.testing.assert_array_equal(state_per_window(t, v, edges, "mean"), [5.0, 5.0, 1.0])


def _state_per_window_before(t, values, edges, how):
    """state_per_window as it was before it searched the edges in sorted t: each t's window, then np.unique."""
    nb = len(edges) - 1
    out = np.full(nb, np.nan)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nb - 1)
    uniq, first = np.unique(b, return_index=True)
    if how == "max":
        out[uniq] = np.maximum.reduceat(values, first)
    else:
        out[uniq] = np.add.reduceat(values, first) / np.diff(np.append(first, len(values)))
    idx = np.where(np.isnan(out), 0, np.arange(nb))
    np.maximum.accumulate(idx, out=idx)
    return out[idx]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_state_per_window_equals_the_search_of_each_time(seed: int):
    """Sorted times take the edges searched in them; every window's value is bit for bit what searching each time
    in the edges gave: times on an edge, before the first and past the last, empty windows, repeats; unsorted times
    (several replicas' steps) keep that search."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(0, 10, 41)
    t = np.sort(np.concatenate((rng.uniform(-1, 11, 3000), edges[::3], edges[::5], [edges[-1]] * 3,
                                rng.uniform(4, 4.7, 50))))
    t = t[(t < 2) | (t > 3)]  # windows without any time: they hold the value before
    v = rng.uniform(0, 100, len(t))
    for how in ("max", "mean"):
        assert state_per_window(t, v, edges, how).tobytes() == _state_per_window_before(t, v, edges, how).tobytes()
        assert state_per_window(t[:1], v[:1], edges, how).tobytes() == \
            _state_per_window_before(t[:1], v[:1], edges, how).tobytes()
        shuffled = rng.permutation(len(t))
        assert state_per_window(t[shuffled], v[shuffled], edges, how).tobytes() == \
            _state_per_window_before(t[shuffled], v[shuffled], edges, how).tobytes()


def test_ecdf_points():
    small = ecdf_points(np.array([3.0, 1.0, 2.0]))
    np.testing.assert_array_equal(small["x"], [1.0, 2.0, 3.0])
    assert small["y0"] == small["dy"] == pytest.approx(1 / 3)
    big = ecdf_points(np.random.default_rng(1).exponential(size=50_000), max_points=500)
    assert len(big["x"]) == 500 and np.all(np.diff(big["x"]) >= 0)


def big_run(n_steps: int = 600_000, n_requests: int = 30_000) -> RunResult:
    """A long run: 600k steps over about 3 hours, 30k requests."""
    rng = np.random.default_rng(42)
    dur = rng.uniform(0.01, 0.025, n_steps)
    start = np.cumsum(dur + rng.exponential(0.002, n_steps)) - dur
    used = rng.integers(100, 5000, n_steps)
    steps = {
        "start": start,
        "duration": dur,
        "batch_size": rng.integers(1, 64, n_steps),
        "padded_rows": np.zeros(n_steps),
        "prefill_tokens": rng.integers(0, 2048, n_steps),
        "decode_tokens": rng.integers(1, 64, n_steps),
        "padding_tokens": np.zeros(n_steps),
        "kv_blocks_used": used,
        "kv_blocks_reserved": rng.integers(0, 100, n_steps),
        "kv_tokens": used * 15,
        "kv_capacity_blocks": np.full(n_steps, 5120),
        "num_running": rng.integers(1, 64, n_steps),
        "num_waiting": rng.integers(0, 200, n_steps),
        "num_swapped": np.zeros(n_steps),
        "num_preempted": rng.binomial(1, 0.01, n_steps),
        "num_rejected": np.zeros(n_steps),
        "swap_blocks": np.zeros(n_steps),
        "flops": rng.uniform(0.05, 0.6, n_steps) * dur * 9.89e14,
    }
    steps = {k: np.asarray(v, dtype=STEP_COLUMNS[k]) for k, v in steps.items()}
    end = float(start[-1] + dur[-1])
    arrival = np.sort(rng.uniform(0, end * 0.95, n_requests))
    ttft = rng.exponential(0.3, n_requests)
    e2el = ttft + rng.uniform(1.0, 20.0, n_requests)
    rejected = rng.random(n_requests) < 0.05
    reqs = [
        replace(
            rec(i, float(arrival[i]), float(arrival[i] + ttft[i]), float(min(arrival[i] + e2el[i], end)), 200),
            prompt_tokens=512,
        )
        if not rejected[i]
        else rec(i, float(arrival[i]), -1.0, float(arrival[i]), 0, outcome="rejected")
        for i in range(n_requests)
    ]
    return RunResult(
        name="long",
        requests=reqs,
        steps=steps,
        itl_gaps=dur,
        itl_counts=steps["decode_tokens"],
        duration=end,
        peak_flops=9.89e14,
        kv_capacity_blocks=5120,
        block_size=16,
        kv_bytes_per_block=2.0**20,
    )


def test_long_run_is_downsampled_and_small():
    run = big_run()
    summaries = {run.name: summarize(run)}
    for fig in (fig_latency_cdfs([run]), fig_timeline(run), fig_kv_memory(run), fig_throughput([run])):
        assert 0 < trace_points(fig) <= MAX_POINTS
    html = build_report([run], summaries, "long run")
    assert len(html.encode()) < 5_000_000


def test_requests_csv_latencies_cover_what_summary_json_covers(tmp_path) -> None:
    """Issue 35: ttft_s and queue_s were written for failed and cancelled requests too, so their means differed
    from summary.json's (over completed requests). A cancelled request keeps its first_token_s, not a ttft_s."""
    from sim.config.scenario import parse_scenario
    from sim.loop.run import run_scenario

    doc = {"name": "f", "seed": 3,
           "workload": {"arrival": {"type": "poisson", "rate": 40.0}, "num_requests": 120,
                        "prompt_len": {"type": "uniform", "min": 100, "max": 900},
                        "output_len": {"type": "uniform", "min": 20, "max": 200},
                        "failures": {"fraction": 0.3, "after": {"type": "uniform", "min": 0.05, "max": 1.5}}},
           "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 2048}}
    run = run_scenario(parse_scenario(doc))
    write_run(tmp_path, run.results, run.summaries)
    with open(tmp_path / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    failed = [r for r in rows if r["outcome"] == "failed"]
    assert any(r["first_token_s"] for r in failed)  # the case: a first token, then the client left
    assert all(r[c] == "" for r in failed for c in LATENCY_COLUMNS)
    summary = run.summaries["f"]
    for col, key in (("queue_s", "queue"), ("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2el_s", "e2el")):
        assert np.mean([float(r[col]) for r in rows if r[col]]) == pytest.approx(summary[key]["mean"], rel=1e-12)
    assert sum(bool(r["ttft_s"]) for r in rows) == summary["num_completed"]


def test_every_requests_csv_column_is_explained_in_the_docs() -> None:
    from pathlib import Path

    from sim.metrics.columns import CLASS_COLUMNS, REQUEST_COLUMN_HELP, REQUEST_COLUMNS

    assert list(REQUEST_COLUMN_HELP) == ["variant", *REQUEST_COLUMNS, *CLASS_COLUMNS]
    page = (Path(__file__).parents[1] / "docs" / "outputs.md").read_text()
    for col, text in REQUEST_COLUMN_HELP.items():
        assert f"| `{col}` | {text} |" in page, col



def test_every_steps_binned_column_is_explained_in_the_docs() -> None:
    # busy_s sums whole steps by their start bin, so it can exceed width_s: a reader must be told, not guess
    from pathlib import Path

    from sim.metrics.steps_binned import BINNED_COLUMN_HELP, BINNED_COLUMNS

    assert list(BINNED_COLUMN_HELP) == ["variant", *BINNED_COLUMNS]
    page = (Path(__file__).parents[1] / "docs" / "outputs.md").read_text()
    for col, text in BINNED_COLUMN_HELP.items():
        assert f"| `{col}` | {text} |" in page, col


def _back_to_back(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and durations of n steps in order: back to back (an end equal to the next start) or after a gap."""
    d = rng.choice([0.5, 1.0, 0.25, 2.0], n) * rng.integers(1, 3)
    return np.cumsum(np.r_[0, (d + rng.choice([0.0, 0.0, 0.5, 1.0], n))[:-1]]), d


@pytest.mark.parametrize("long_run", [False, True])
def test_step_events_merged_are_the_stable_argsort(long_run: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """amount_per_window's starts and ends, placed by merging the two sorted halves (one replica's log), are the
    stable argsort's order to the byte: back-to-back steps (an end equal to the next start), idle gaps, zero
    durations' neighbours, overlapping steps whose ends are in order, and unsorted steps (the argsort itself).
    Places kept as indices (short runs) or, past KEEP_EVENTS_MAX steps, as boolean masks."""
    import sim.output.report.common as common
    from sim.output.report.common import _step_events

    if long_run:
        monkeypatch.setattr(common, "KEEP_EVENTS_MAX", 0)

    def by_argsort(s: np.ndarray, d: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rate = a / d
        times = np.concatenate((s, s + d))
        order = np.argsort(times, kind="stable")
        return times[order], np.concatenate((rate, -rate))[order]

    rng = np.random.default_rng(1)
    merged = 0
    for trial in range(300):
        n = int(rng.integers(1, 400))
        s, d = _back_to_back(rng, n)
        if trial % 3 == 0:  # overlapping steps, sorted starts
            s = np.sort(rng.choice(np.arange(0, 20, 0.5), n))
        if trial % 7 == 0:
            s = rng.permutation(s)
        a = rng.random(n)
        merged += bool(np.all(s[1:] >= s[:-1]) and np.all(np.diff(s + d) >= 0))
        got, want = _step_events(s, d, a), by_argsort(s, d, a)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes(), trial
    assert 100 < merged < 300


def test_step_events_kept_order_the_steps_once_per_run() -> None:
    """Inside step_events_kept (the report), windowing a second amount over the same starts and durations reuses
    the first call's order of the starts and ends, sorted or not; other arrays are ordered afresh. The values are
    those of ordering each time, to the byte."""
    from sim.output.report.common import _step_events, step_events_kept

    rng = np.random.default_rng(2)
    d = rng.choice([0.5, 1.0, 2.0], 300)
    sorted_s = np.cumsum(np.r_[0, d[:-1]])
    for s in (sorted_s, rng.permutation(sorted_s)):
        a1, a2 = rng.random(300), rng.random(300)
        want1, want2 = _step_events(s, d, a1), _step_events(s, d, a2)
        with step_events_kept():
            got1, got2 = _step_events(s, d, a1), _step_events(s, d, a2)
            assert got2[0] is got1[0]  # ordered once
            other = _step_events(s.copy(), d, a1)
            assert other[0] is not got1[0] and other[0].tobytes() == want1[0].tobytes()
        for got, want in ((got1, want1), (got2, want2)):
            assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
        assert _step_events(s, d, a1)[0] is not _step_events(s, d, a1)[0]  # outside the block: nothing kept


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_amount_per_window_in_chunks_keeps_its_bits(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Steps in order (one replica's log: back to back, an end equal to the next start, idle gaps, long steps
    that span several chunks, edges on event times and outside them) ordered a few steps at a time: the same
    floats as the whole arrays gave before issue 40."""
    import sim.output.report.common as common

    monkeypatch.setattr(common, "EVENT_ROWS", rows)
    monkeypatch.setattr(common, "KEEP_EVENTS_MAX", 0)  # chunked past it
    rng = np.random.default_rng(3)
    chunked = 0
    for trial in range(200):
        n = int(rng.integers(1, 300))
        s, d = _back_to_back(rng, n)
        if trial % 4 == 0:  # overlapping steps whose starts and ends are both in order
            s = np.sort(rng.choice(np.arange(0, 20, 0.5), n))
            d = np.full(n, 3.0)
        a = rng.integers(0, 300, n).astype(np.float64)
        end = float((s + d).max())
        edges = np.linspace(0, end * rng.choice([0.5, 1.0, 1.2]), int(rng.integers(2, 60)))
        if trial % 5 == 0:  # edges on event times
            edges = np.unique(np.r_[0.0, rng.choice(np.r_[s, s + d], 5), end])
        chunked += common._in_order(s, d)
        assert amount_per_window(s, d, a, edges).tobytes() == \
            _amount_per_window_before(s, d, a, edges).tobytes(), trial
    assert chunked == 200


def test_an_earlier_observed_runs_files_do_not_stay_beside_a_new_run(tmp_path) -> None:
    # Before: servesim run into a folder servesim observe wrote kept its observe.json (what it saw of a server),
    # metrics.csv (the server's /metrics) and live.html beside the new run's files, passing for the new run's
    out = tmp_path / "run"
    write_run(out, [small_run("a")])
    for name in ("observe.json", "metrics.csv", "live.html", "mine.txt"):
        (out / name).write_text("x")
    write_run(out, [small_run("a")])
    assert not any((out / n).exists() for n in ("observe.json", "metrics.csv", "live.html"))
    assert (out / "mine.txt").read_text() == "x"  # a file of the user's own stays
