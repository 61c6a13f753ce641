"""validate --against and the run folder's exports (issue 14): round trip, formats, OpenMetrics, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from sim.config.scenario import load_scenario
from sim.loop.run import run_scenario, write_scenario_run
from sim.output.benchfiles import BenchFileError
from sim.output.benchfiles.genai_perf import read_genai_perf
from sim.output.benchfiles.guidellm import read_guidellm
from sim.output.benchfiles.validate import rebuild_workload, validate_against, write_bench_validation
from sim.output.benchfiles.vllm_bench import read_vllm_bench
from tests.conftest import Ran, servesim

DATA = Path(__file__).parent / "data" / "bench"
SCENARIO = DATA / "scenario.yaml"
ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sc, raw = load_scenario(SCENARIO)
    out = tmp_path_factory.mktemp("run")
    write_scenario_run(run_scenario(sc, raw), out, raw)
    return out


def test_run_folder_holds_vllm_bench_json_in_vllms_units(run_folder: Path) -> None:
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    assert data["num_prompts"] == 40 and data["completed"] == 40 and data["request_rate"] == 4.0
    assert data["burstiness"] == 1.0
    # aggregates in ms, per-request lists in s: the mean of the ttfts list is mean_ttft_ms / 1000
    assert sum(data["ttfts"]) / 40 * 1000 == pytest.approx(data["mean_ttft_ms"], rel=1e-12)
    assert data["total_output_tokens"] == sum(data["output_lens"])
    run = read_vllm_bench(run_folder / "cb.vllm-bench.json")
    assert run.skipped == [] and len(run.arrival_times_s or []) == 40


def test_openmetrics_export_parses_under_vllms_names(run_folder: Path) -> None:
    text = (run_folder / "cb.metrics.prom").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc"):
        assert fams[name].type == "gauge" and len(fams[name].samples) > 10
    assert fams["vllm:num_preemptions"].type == "counter"
    for name in ("vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds",
                 "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:inter_token_latency_seconds"):
        assert fams[name].type == "histogram"
    count = [s for s in fams["vllm:e2e_request_latency_seconds"].samples if s.name.endswith("_count")]
    assert count[0].value == 40
    # vLLM's deprecated time_per_output_token_seconds observes every token gap (ITL), as its own test counts it
    # (requests x (max_tokens - 1)); the per-request TPOT goes under request_time_per_output_token_seconds
    def ends(name: str) -> dict[str, float]:
        return {s.name.rsplit("_", 1)[1]: s.value for s in fams[name].samples if s.name.endswith(("_count", "_sum"))}
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    gaps = sum(n - 1 for n in data["output_lens"])
    assert ends("vllm:time_per_output_token_seconds") == ends("vllm:inter_token_latency_seconds")
    assert ends("vllm:inter_token_latency_seconds")["count"] == gaps
    assert ends("vllm:inter_token_latency_seconds")["sum"] == pytest.approx(data["mean_itl_ms"] / 1000 * gaps)
    assert ends("vllm:request_time_per_output_token_seconds")["count"] == sum(n > 1 for n in data["output_lens"])
    usage = [s.value for s in fams["vllm:kv_cache_usage_perc"].samples]
    assert all(0.0 <= u <= 1.0 for u in usage)


def test_round_trip_own_vllm_json_gives_zero_error_on_every_metric(run_folder: Path, tmp_path: Path) -> None:
    val = validate_against(SCENARIO, [run_folder / "cb.vllm-bench.json"])
    (f,) = val.files
    assert f.skipped == [] and len(f.metrics) == 19  # 4 latencies x (mean, median, std, p99) + 3 throughputs
    for key, m in f.metrics.items():
        assert m["error"] is not None and abs(m["error"]) < 1e-9, key
    write_bench_validation(tmp_path, val)
    saved = json.loads((tmp_path / "validation.json").read_text())
    assert saved["files"][0]["metrics"]["p99_ttft"]["error"] == pytest.approx(0.0, abs=1e-9)
    assert "<table>" in (tmp_path / "validation.html").read_text()


def test_validate_against_gives_80_percent_intervals(run_folder: Path, tmp_path: Path) -> None:
    from sim.metrics.intervals import ERROR_QUANTILES

    lo_d, hi_d = ERROR_QUANTILES["decode speed"]
    lo_t, hi_t = ERROR_QUANTILES["throughput"]
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    data["output_throughput"] *= 2  # a file whose throughput the simulator under-predicts by half
    (tmp_path / "b.json").write_text(json.dumps(data))
    (f,) = validate_against(SCENARIO, [tmp_path / "b.json"]).files
    tpot, thr = f.metrics["mean_tpot"], f.metrics["output_throughput"]
    # a time measured as simulated x (1 + error), a rate as simulated / (1 + error)
    assert tpot["interval_80"] == pytest.approx([tpot["simulated"] * (1 + lo_d), tpot["simulated"] * (1 + hi_d)])
    assert tpot["inside_80"] is True  # measured == simulated
    assert thr["interval_80"] == pytest.approx([thr["simulated"] / (1 + hi_t), thr["simulated"] / (1 + lo_t)])
    assert thr["inside_80"] is False and thr["measured"] > thr["interval_80"][1]
    # means, medians and rates have one; tails and spreads not (the development rows are means and rates)
    assert {k for k, m in f.metrics.items() if "interval_80" in m} == {
        f"{s}_{m}" for s in ("mean", "median") for m in ("ttft", "tpot", "itl", "e2el")} | {
        "output_throughput", "total_token_throughput", "request_throughput"}
    table = validate_against(SCENARIO, [tmp_path / "b.json"]).table()
    lo, hi = thr["interval_80"]
    assert f"80% interval {lo:.2f}-{hi:.2f} tok/s: measured outside" in table
    assert "p99_ttft" in table and table.count("80% interval") == 11


def test_genai_perf_reader_maps_its_itl_to_tpot_and_names_the_bad_field() -> None:
    path = DATA / "genai_perf.json"
    run = read_genai_perf(path)
    assert run.format == "genai-perf" and run.max_concurrency == 4 and run.num_requests == 30
    assert run.aggregates["mean_tpot"] == pytest.approx(0.012) and run.aggregates["median_e2el"] == pytest.approx(1.1)
    assert run.aggregates["p99_ttft"] == pytest.approx(0.12) and run.aggregates["output_throughput"] == 250.0
    assert "p99_tpot" not in run.aggregates
    assert run.skipped == [f"{path}: inter_token_latency.p99: not a non-negative number"]
    wl, notes = rebuild_workload(run)
    assert len(wl) == 30 and wl.closed_loop is not None and wl.closed_loop.num_users == 4
    assert {r.prompt_len for r in wl.requests} == {500} and {r.output_len for r in wl.requests} == {100}
    assert "drawn from the file's length statistics" in notes[0]


def test_guidellm_reader_one_run_per_benchmark_with_loads() -> None:
    path = DATA / "guidellm.json"
    a, b = read_guidellm(path)
    assert a.max_concurrency == 2 and a.input_lens == [300, 500, 200, 800]
    assert a.aggregates["mean_gl_itl"] == pytest.approx(0.012) and a.aggregates["median_ttft"] == pytest.approx(0.045)
    assert f"{path}: benchmarks[0].metrics.requests_per_second: a rate distribution over time; not compared" \
        in a.skipped
    assert b.request_rate == 3.0 and b.burstiness == 1.0
    assert f"{path}: benchmarks[1].metrics.time_to_first_token_ms.successful: missing or not an object" in b.skipped


def test_guidellm_sweep_validates_every_benchmark_and_draws_curves(tmp_path: Path) -> None:
    val = validate_against(SCENARIO, [DATA / "guidellm.json"])
    assert [f.load for f in val.files] == [2.0, 3.0]
    assert set(val.files[0].metrics) >= {"mean_ttft", "p99_e2el", "mean_gl_itl", "p99_gl_tpot"}
    # GuideLLM's token-weighted ITL mean is the pooled gap mean: equal to vLLM's mean ITL of the same run
    from sim.output.benchfiles.stats import guidellm_stats, run_stats

    res = val.files[0].result
    assert res is not None
    assert guidellm_stats(res)["mean_gl_itl"] == pytest.approx(run_stats(res)["mean_itl"], rel=1e-9)
    write_bench_validation(tmp_path, val)
    assert "fig-sweep" in (tmp_path / "validation.html").read_text()


def test_malformed_files_raise_one_message_naming_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "g.json"
    bad.write_text('{"benchmarks": [{"metrics": 3}]}')
    with pytest.raises(BenchFileError, match=r"g\.json: benchmarks\[0\]\.metrics: missing or not an object"):
        validate_against(SCENARIO, [bad])



def test_a_vllm_file_whose_every_figure_is_unreadable_names_them(tmp_path: Path) -> None:
    """A file whose only aggregate is a string (a hand-edited or re-serialised result: "mean_ttft_ms": "71.2") ended
    with "no metrics: neither *_ms aggregates nor detailed per-request lists readable", naming neither the field nor
    why; the reasons were in the skipped list that never printed."""
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps({"backend": "vllm", "completed": 5, "mean_ttft_ms": "71.2", "duration": -1,
                               "request_goodput": 2.0}))
    with pytest.raises(BenchFileError) as e:
        validate_against(SCENARIO, [bad])
    assert str(e.value) == (f"{bad}: no metrics: neither *_ms aggregates nor detailed per-request lists readable "
                            "(duration: not a positive number; mean_ttft_ms: not a non-negative number; input_lens: "
                            "absent (saved without --save-detailed), and completed, total_input_tokens and "
                            "total_output_tokens not all there: the lengths are unknown)")

def test_the_table_gives_latencies_in_ms_as_the_file_does(run_folder: Path) -> None:
    # Before: `mean_ttft measured 0.0711552  simulated 0.0711552` beside a file that says mean_ttft_ms 71.16, no unit
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    val = validate_against(SCENARIO, [run_folder / "cb.vllm-bench.json"])
    m = val.files[0].metrics
    lines = {line.split()[0]: line for line in val.table().splitlines()[1:]}
    ttft = m["mean_ttft"]["measured"]
    assert ttft * 1e3 == pytest.approx(data["mean_ttft_ms"])
    lo, hi = m["mean_ttft"]["interval_80"]
    assert f"measured {ttft * 1e3:.2f} ms  simulated {m['mean_ttft']['simulated'] * 1e3:.2f} ms  " in lines["mean_ttft"]
    assert f"80% interval {lo * 1e3:.2f}-{hi * 1e3:.2f} ms: measured" in lines["mean_ttft"]
    out = m["output_throughput"]["measured"]
    assert out == pytest.approx(data["output_throughput"]) and f"measured {out:.2f} tok/s  " in lines["output_throughput"]
    # Before: both rates read "/s" (`request_throughput measured 1.95101/s`, `output_throughput measured
    # 245.241/s`); vLLM prints req/s and tok/s
    req = m["request_throughput"]["measured"]
    assert f"measured {req:.2f} req/s  simulated" in lines["request_throughput"]


def test_the_tables_figures_have_two_decimals_as_vllm_prints_them() -> None:
    """The table read "measured 16.33 ms  simulated 5.33325 ms  80% interval 12.8745-48.9059 ms": the file's two
    decimals beside six significant figures. Now two decimals each; under 0.1 two significant figures (0.0066)."""
    import re

    table = validate_against(SCENARIO, [DATA / "vllm_detailed.json"]).table()
    figures = re.findall(r"(?:measured|simulated|interval) (\d[\d.e+]*)(?:-(\d[\d.e+]*))?", table)
    assert len(figures) > 30
    assert all(re.fullmatch(r"\d+\.\d\d|0\.0\d+", x) for pair in figures for x in pair if x), figures
    assert "std_ttft                     measured 16.33 ms  simulated 5.33 ms  error -67.3%" in table



def test_the_page_gives_latencies_in_ms_as_the_table_and_the_file_do(run_folder: Path, tmp_path: Path) -> None:
    """validation.html kept seconds after the terminal's table moved to ms: a vLLM user's file says
    mean_ttft_ms 43.45, the terminal 43.4491 ms, the page 0.0434491 (its sweep panels too, with no unit)."""
    import re

    from sim.output.benchfiles.validate import _sweep_figure, build_page

    val = validate_against(SCENARIO, [run_folder / "cb.vllm-bench.json", DATA / "vllm_detailed.json"])
    page = build_page(val)
    m = val.files[0].metrics
    ttft, req = m["mean_ttft"], m["request_throughput"]
    cells = [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", page)]
    row = cells[cells.index("mean_ttft (ms)"):][:3]
    assert row == ["mean_ttft (ms)", f"{ttft['measured'] * 1e3:.2f}", f"{ttft['simulated'] * 1e3:.2f}"]
    assert cells[cells.index("request_throughput (req/s)") + 1] == f"{req['measured']:.2f}"
    assert "Latencies in seconds" not in page
    fig = _sweep_figure(val)
    assert fig is not None and fig.layout.annotations[0].text == "mean_ttft (ms)"
    measured = next(t for t in fig.data if t.name == "measured")
    assert measured.y[0] == pytest.approx(ttft["measured"] * 1e3)

def test_a_file_saved_without_save_detailed_is_rebuilt_from_its_mean_lengths(run_folder: Path,
                                                                                 tmp_path: Path) -> None:
    # Before: `vllm bench serve --save-result` without --save-detailed (the reader's docstring says it reads both)
    # was refused by validate --against: "no per-request lengths and no length statistics: cannot rebuild the
    # workload", though the file holds completed, total_input_tokens and total_output_tokens
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    for key in ("input_lens", "output_lens", "ttfts", "latencies", "start_times", "errors", "energies_j"):
        del data[key]  # what vLLM deletes without --save-detailed
    f = tmp_path / "agg.json"
    f.write_text(json.dumps(data))
    wl, notes = rebuild_workload(read_vllm_bench(f), seed=1)
    n, tin, tout = data["completed"], data["total_input_tokens"], data["total_output_tokens"]
    assert len(wl.requests) == n
    assert {r.prompt_len for r in wl.requests} == {round(tin / n)}
    assert {r.output_len for r in wl.requests} == {round(tout / n)}
    assert (f"{f}: no per-request lengths (saved without --save-detailed); {n} requests of the mean lengths, "
            f"{tin / n:.0f} prompt and {tout / n:.0f} output tokens") in notes
    (v,) = validate_against(SCENARIO, [f]).files
    assert len(v.metrics) == 19 and v.skipped == []
    del data["total_output_tokens"]
    f.write_text(json.dumps(data))
    with pytest.raises(BenchFileError, match="total_output_tokens not all there: the lengths are unknown"):
        validate_against(SCENARIO, [f])


def test_vllm_metrics_with_no_simulated_counterpart_are_named(run_folder: Path, tmp_path: Path) -> None:
    # Before: request_goodput (with --goodput), max_output_tokens_per_s and max_concurrent_requests, which current
    # vllm bench serve writes, were dropped without a word, while the docs say every metric the file holds is compared
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    data |= {"request_goodput": 3.5, "max_output_tokens_per_s": 410.0, "max_concurrent_requests": 9}
    f = tmp_path / "new.json"
    f.write_text(json.dumps(data))
    (v,) = validate_against(SCENARIO, [f]).files
    assert v.skipped == [f"{f}: request_goodput: not compared: the file does not record the --goodput SLOs it "
                         "counts against",
                         f"{f}: max_output_tokens_per_s: not compared: the peak output tokens in one second has no "
                         "simulated counterpart",
                         f"{f}: max_concurrent_requests: not compared: the peak of requests in flight has no "
                         "simulated counterpart"]
    data["request_goodput"] = None  # vLLM without --goodput: nothing to name
    f.write_text(json.dumps(data))
    assert len(validate_against(SCENARIO, [f]).files[0].skipped) == 2
    # benchmarks/benchmark_serving.py wrote the key as "request_goodput:" (colon included) for many releases
    data["request_goodput:"] = 3.5
    f.write_text(json.dumps(data))
    assert (f"{f}: request_goodput:: not compared: the file does not record the --goodput SLOs it counts against"
            in validate_against(SCENARIO, [f]).files[0].skipped)


def _cli(*args: str) -> Ran:
    return servesim(*args, cwd=ROOT)


def test_cli_validate_against_bad_file_exits_2_without_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    r = _cli("validate", str(SCENARIO), "--against", str(missing), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "nope.json: file not found" in r.stderr and "Traceback" not in r.stderr
    r = _cli("validate", str(SCENARIO), "--against", str(DATA / "genai_perf.json"), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "inter_token_latency.p99: not a non-negative number" in r.stdout
    assert (tmp_path / "o" / "validation.json").exists()


def test_a_file_of_another_preset_is_refused_and_an_unknown_id_noted(run_folder: Path, tmp_path: Path) -> None:
    # Before: a 70B benchmark was compared with the scenario's 8B simulation under a note (TTFT error -66%, exit 0).
    # An id that is no preset cannot be judged: it keeps the note.
    from sim.config.schema import ScenarioError

    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    f = tmp_path / "m.json"
    f.write_text(json.dumps({**data, "model_id": "meta-llama/Llama-3.1-70B"}))
    with pytest.raises(ScenarioError, match=r"m.json: the benchmark served meta-llama/Llama-3.1-70B \(the preset "
                       r"llama-3.1-70b\), but variant cb simulates llama-3.1-8b; to simulate that model give --set "
                       r"deployment.model=llama-3.1-70b$"):
        validate_against(SCENARIO, [f])
    for model_id, noted in (("my-org/chat-ft-7", True), ("meta-llama/Llama-3.1-8B-Instruct", False)):
        f.write_text(json.dumps({**data, "model_id": model_id}))
        val = validate_against(SCENARIO, [f])
        note = (f"{f}: the benchmark served {model_id}, the variant simulates llama-3.1-8b; check that they are the "
                "same model")
        assert (note in val.files[0].notes) is noted and (f"  note: {note}" in val.table()) is noted


def test_requests_the_variant_rejects_are_named_not_compared_silently(run_folder: Path, tmp_path: Path) -> None:
    # Before: a scenario whose max_model_len is below some of the benchmark's requests rejected them in the simulation
    # and validate compared the rest with the whole measured run, saying nothing (throughput -56% on a run that
    # fits); with every request rejected it printed "simulated 0, error -100%" for every latency, exit 0.
    from sim.config.schema import ScenarioError

    bench = run_folder / "cb.vllm-bench.json"
    data = json.loads(bench.read_text())
    long = sorted(i + o for i, o in zip(data["input_lens"], data["output_lens"], strict=True) if i + o > 512)
    assert 0 < len(long) < 40
    (f,) = validate_against(SCENARIO, [bench], overrides={"deployment.max_model_len": 512}).files
    assert [n for n in f.notes if "rejected" in n] == [
        f"{bench}: the simulated variant cb rejected {len(long)} of the benchmark's 40 requests, which the benchmark "
        f"served (prompt+output {long[0]}-{long[-1]} tokens exceeds max_model_len 512 ({len(long)})): its metrics are "
        f"over the {40 - len(long)} it completed"]
    with pytest.raises(ScenarioError, match=r"cb\.vllm-bench\.json: the simulated variant cb completed none of the "
                       r"benchmark's 40 requests \(prompt\+output \d+-\d+ tokens exceeds max_model_len 8 \(40\)\): "
                       "nothing to compare"):
        validate_against(SCENARIO, [bench], overrides={"deployment.max_model_len": 8})
    r = _cli("validate", str(SCENARIO), "--against", str(bench), "--set", "deployment.max_model_len=8",
             "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "completed none of the benchmark's 40 requests" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_a_file_whose_every_request_failed_says_so(run_folder: Path, tmp_path: Path) -> None:
    # Before: a benchmark against a server that failed every request (vLLM writes each one's error) was refused with
    # "no per-request lengths and no length statistics", though its 40 lengths are there.
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    data["errors"] = ["Server disconnected"] * 40
    (tmp_path / "f.json").write_text(json.dumps(data))
    with pytest.raises(BenchFileError) as e:
        validate_against(SCENARIO, [tmp_path / "f.json"])
    assert str(e.value) == (f"{tmp_path / 'f.json'}: every one of its 40 requests failed (a non-empty errors entry "
                            "or no output): no request to rebuild")


def test_validate_against_uses_the_profile_and_refuses_engine_options(run_folder: Path, tmp_path: Path) -> None:
    # Before: --profile (docs/real-engine.md: "or a measured engine profile with --profile") was ignored with
    # --against, even a file that does not exist, and so were the engine's --num-gpu-blocks, --model, --device,
    # --time-scale and --threads: the scenario's own cost model ran, and the table said nothing.
    bench = run_folder / "cb.vllm-bench.json"
    profile = ROOT / "calibration" / "profiles" / "tiny-cpu.json"
    fitted = {"type": "fitted", "profile": str(profile)}
    tiny = {"deployment.model": "tiny", "deployment.max_model_len": 2048}  # the model the profile was measured on
    served = tmp_path / "tiny.json"  # as tiny served it (the 8B's file is refused: another model)
    served.write_text(json.dumps({**json.loads(bench.read_text()), "model_id": "tiny"}))
    (with_profile,) = validate_against(SCENARIO, [served], profile=profile, overrides=tiny).files
    (as_set,) = validate_against(SCENARIO, [served], overrides={**tiny, "deployment.cost_model": fitted}).files
    (plain,) = validate_against(SCENARIO, [served], overrides=tiny).files
    assert with_profile.metrics == as_set.metrics and with_profile.metrics != plain.metrics
    assert f"step times from the profile {profile} (deployment.cost_model of variant cb replaced)" in with_profile.notes
    # the published GPU errors say nothing of a profile's steps: no interval (it gave them, "measured inside")
    assert any("interval_80" in m for m in plain.metrics.values())
    assert not any("interval_80" in m for m in with_profile.metrics.values())
    assert f"no 80% intervals: its steps come from the engine profile {profile}" in " ".join(with_profile.notes)
    r = _cli("validate", str(SCENARIO), "--against", str(bench), "--profile", str(tmp_path / "none.json"),
             "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "none.json" in r.stderr and "Traceback" not in r.stderr
    for flag, value in (("--num-gpu-blocks", "3"), ("--model", "tiny"), ("--device", "cuda"), ("--time-scale", "2"),
                        ("--threads", "2"), ("--num-requests", "5")):
        r = _cli("validate", str(SCENARIO), "--against", str(bench), flag, value, "--out", str(tmp_path / "o"))
        assert r.returncode == 2 and r.stderr.strip() == (
            f"error: {flag} applies to the engine replay (validate --profile), not to --against"), (flag, r.stderr)
    assert not (tmp_path / "o").exists()


def test_several_files_after_one_against_as_the_docs_write_them(run_folder: Path, tmp_path: Path) -> None:
    # Before: docs/calibration-and-validation.md's `validate my.yaml --against r1.json r4.json r8.json` and
    # `calibrate --from-bench results/*.json` ended in click's "Got unexpected extra argument(s)": only a repeated
    # flag took a second file, which a shell glob does not write.
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    files = []
    for rate in (4.0, 8.0):
        files.append(str(tmp_path / f"r{rate:g}.json"))
        Path(files[-1]).write_text(json.dumps({**data, "request_rate": rate}))
    r = _cli("validate", str(SCENARIO), "--against", *files, "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    saved = json.loads((tmp_path / "o" / "validation.json").read_text())
    assert [f["file"] for f in saved["files"]] == files
    r = _cli("calibrate", "--from-bench", *files, "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--holdout-every",
             "0", "-o", str(tmp_path / "k.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "k.json").read_text())["fit"]["train"] == files
    r = _cli("validate", str(SCENARIO), files[0], "--out", str(tmp_path / "o2"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: unexpected argument {files[0]}: benchmark files follow --against")
    r = _cli("calibrate", files[0], "-o", str(tmp_path / "k2.json"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: unexpected argument {files[0]}: benchmark files follow --from-bench")
    assert not (tmp_path / "o2").exists() and not (tmp_path / "k2.json").exists()


@pytest.mark.parametrize("strategy, why", [
    ({"type_": "concurrent", "streams": 0}, "config.strategy: concurrent needs streams, a positive integer (got 0)"),
    ({"type_": "poisson", "rate": -1}, "config.strategy: poisson needs rate, a positive number (got -1)"),
    ({"type_": "constant"}, "config.strategy: constant needs rate, a positive number (got None)"),
    ({"type_": "sweep"}, "config.strategy: missing or unknown type 'sweep'"),
])
def test_a_guidellm_strategy_with_a_bad_parameter_names_the_parameter(strategy: dict, why: str) -> None:
    # Before: "missing or unknown type 'concurrent'" for a concurrent strategy of 0 streams (a known type; its
    # parameter was wrong), likewise a poisson or constant one without a positive rate.
    data = json.loads((DATA / "guidellm.json").read_text())
    data["benchmarks"][0]["config"]["strategy"] = strategy
    (run, _) = read_guidellm(DATA / "guidellm.json", data)
    assert f"{DATA / 'guidellm.json'}: benchmarks[0].{why}; simulated as all at once" in run.skipped
    assert run.request_rate is None and run.max_concurrency is None


def test_a_scenarios_sweep_is_said_to_be_ignored(run_folder: Path) -> None:
    # Before: validate --against on a scenario with a sweep simulated the variant as written, no point of the sweep,
    # and said nothing (plan notes the same).
    bench = run_folder / "cb.vllm-bench.json"
    (f,) = validate_against(SCENARIO, [bench], overrides={"sweep": {"policy.max_num_seqs": [1, 256]}}).files
    assert ("the scenario's sweep is ignored: the variant is simulated as written (servesim sweep runs the points)"
            in f.notes)
    (plain,) = validate_against(SCENARIO, [bench]).files
    assert f.metrics == plain.metrics and not any("sweep" in n for n in plain.notes)


def test_a_concurrency_cap_beside_a_rate_is_said_not_to_be_modelled() -> None:
    # Before: a vllm bench file of `--request-rate 8 --max-concurrency 4` without start_times was rebuilt as open-loop
    # arrivals at 8 req/s with no cap, the cap dropped without a word (vLLM holds the 5th request at the client
    # until one of the 4 in flight ends, and starts its TTFT only then).
    from sim.output.benchfiles.common import BenchRun

    run = BenchRun(source="r.json", request_rate=8.0, max_concurrency=4, input_lens=[10] * 6, output_lens=[5] * 6)
    wl, notes = rebuild_workload(run)
    assert wl.closed_loop is None and len(wl.requests) == 6
    assert ("r.json: max_concurrency 4 beside the request rate: vLLM's client held the requests past 4 in flight, "
            "the simulation sends each at its drawn time (the cap is not modelled)") in notes
    _, plain = rebuild_workload(BenchRun(source="r.json", request_rate=8.0, input_lens=[10] * 6, output_lens=[5] * 6))
    assert not any("max_concurrency" in n for n in plain)


def test_a_genai_perf_request_count_past_what_a_run_holds_is_refused(tmp_path: Path) -> None:
    # Before: request_count 1e9 drew a billion requests from the length statistics and simulated them: still at it
    # after 120 s (and its memory growing), no message.
    data = json.loads((DATA / "genai_perf.json").read_text())
    data["request_count"]["avg"] = 10**9
    (tmp_path / "g.json").write_text(json.dumps(data))
    with pytest.raises(BenchFileError) as e:
        read_genai_perf(tmp_path / "g.json")
    assert str(e.value) == (f"{tmp_path / 'g.json'}: request_count: 1000000000 requests would need about 200 GB "
                            "of memory for their records; a run holds at most 10000000 (split the load over several "
                            "runs, or sample it)")


def test_arrivals_past_what_a_run_keeps_exact_are_refused(run_folder: Path, tmp_path: Path) -> None:
    # Before: request_rate 1e-300 (no start_times) drew arrivals near 1e302 s, where every step is rounded away:
    # "simulated 0, error -100%" for every latency, exit 0; a start_times entry of 1e12 likewise. `servesim run`
    # refuses arrivals past 1e9 s (sim/config/limits.py).
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    slow = {k: v for k, v in data.items() if k != "start_times"} | {"request_rate": 1e-300}
    late = {**data, "start_times": [*data["start_times"][:-1], 1e12]}
    for name, d, what in (("slow", slow, "request_rate 1e-300"), ("late", late, "start_times")):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
        with pytest.raises(BenchFileError, match=rf"{name}\.json: {what}: the last of 40 requests arrives at "
                           r"[\d.e+]+ s, past the 1e\+09 s a run may span"):
            validate_against(SCENARIO, [tmp_path / f"{name}.json"])


def test_over_an_engine_validation_its_run_folders_go_too(run_folder: Path, tmp_path: Path) -> None:
    # Before: validate --against into a folder of validate --profile left that run's engine/ and sim/ beside the
    # new validation.json and page, another run's replays passing for this one's
    val = validate_against(SCENARIO, [run_folder / "cb.vllm-bench.json"])
    out = tmp_path / "v"
    for name in ("engine", "sim"):
        (out / name).mkdir(parents=True)
        (out / name / "summary.json").write_text("{}")
    (out / "validation.json").write_text(json.dumps({"scenario": "s", "profile": "p.json", "variants": {}}))
    write_bench_validation(out, val)
    assert sorted(p.name for p in out.iterdir()) == ["validation.html", "validation.json"]
    # folders of that name in a folder of no engine validation are the user's: they stay
    (out / "engine").mkdir()
    (out / "engine" / "summary.json").write_text("{}")
    write_bench_validation(out, val)
    assert (out / "engine" / "summary.json").is_file()


def test_openmetrics_end_of_run_samples_are_stamped_at_the_runs_end() -> None:
    # every request rejected (prompt + output over max_model_len): no step ran, and the histograms, "the state at
    # the end of the run", were stamped at 0.0 s, before the first request had even arrived
    from sim.config.scenario import parse_scenario
    from sim.output.benchfiles.export_metrics import openmetrics_text

    raw = {"name": "none-served", "seed": 0,
           "workload": {"arrival": {"type": "poisson", "rate": 2.0}, "num_requests": 3,
                        "prompt_len": {"type": "fixed", "value": 5000}, "output_len": {"type": "fixed", "value": 10}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096}}
    (res,) = run_scenario(parse_scenario(raw), raw).results
    last = max(r.finish for r in res.requests)
    assert last > 0
    fams = {f.name: f for f in text_string_to_metric_families(openmetrics_text(res))}
    stamps = {float(s.timestamp.sec + s.timestamp.nsec / 1e9) for f in fams.values() if f.type == "histogram"
              for s in f.samples}
    assert len(stamps) == 1 and stamps.pop() == pytest.approx(last, abs=1e-6)


def test_a_ramp_up_run_is_rebuilt_on_its_ramp_not_all_at_once(run_folder: Path, tmp_path: Path) -> None:
    # Before: `vllm bench serve --ramp-up-strategy linear --ramp-up-start-rps 1 --ramp-up-end-rps 20` writes
    # request_rate "inf" beside the ramp; without start_times servesim ignored the ramp_up_* keys and sent every
    # request at t=0 ("request rate inf: every request at t=0")
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    del data["start_times"]
    data |= {"request_rate": "inf", "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 20,
             "burstiness": 1e6}  # gaps of all but fixed length: 1 / the request's rate
    f = tmp_path / "ramp.json"
    f.write_text(json.dumps(data))
    wl, notes = rebuild_workload(read_vllm_bench(f), seed=2)
    times = np.array([r.arrival for r in wl.requests])
    rates = 1 + 19 * np.arange(len(times)) / (len(times) - 1)  # vLLM's _get_current_request_rate, linear
    assert times == pytest.approx(np.cumsum(1 / rates), rel=0.01)
    assert f"{f}: no arrival times; drawn on vLLM's linear ramp-up from 1 to 20 req/s, burstiness 1e+06 (seed 2)" in notes
    data |= {"ramp_up_strategy": "exponential", "ramp_up_start_rps": 0}  # vLLM refuses it; named, not used
    f.write_text(json.dumps(data))
    assert read_vllm_bench(f).skipped == [
        f"{f}: ramp_up_strategy: 'exponential' from ramp_up_start_rps 0 to ramp_up_end_rps 20: not a linear or "
        "exponential ramp between positive rates; not used"]


def test_a_file_without_request_rate_is_not_said_to_give_inf(run_folder: Path, tmp_path: Path) -> None:
    # Before: a hand-written or trimmed file without the key (vllm bench serve always writes it, "inf" when unpaced)
    # was simulated all at once under the note "request rate inf: every request at t=0", as if the file said so
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    del data["start_times"], data["request_rate"]
    f = tmp_path / "norate.json"
    f.write_text(json.dumps(data))
    _, notes = rebuild_workload(read_vllm_bench(f), seed=0)
    assert f"{f}: request_rate absent, taken as inf: every request at t=0" in notes
    f.write_text(json.dumps(data | {"request_rate": None}))  # null gave "request rate inf", as if the file said so
    assert f"{f}: request_rate absent, taken as inf: every request at t=0" in rebuild_workload(read_vllm_bench(f))[1]
    f.write_text(json.dumps(data | {"request_rate": "inf"}))
    assert f"{f}: request rate inf: every request at t=0" in rebuild_workload(read_vllm_bench(f), seed=0)[1]


def test_the_table_says_what_the_load_is(run_folder: Path, tmp_path: Path) -> None:
    # Before: "mc4.json (vllm-bench, load 4.0):" for a closed loop of 4 concurrent requests, as for 4 req/s
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text())
    del data["start_times"]
    data |= {"request_rate": "inf", "max_concurrency": 4}
    (tmp_path / "mc4.json").write_text(json.dumps(data))
    table = validate_against(SCENARIO, [tmp_path / "mc4.json"]).table()
    assert table.splitlines()[0] == f"{tmp_path / 'mc4.json'} (vllm-bench, max_concurrency 4 (a closed loop)):"
    table = validate_against(SCENARIO, [run_folder / "cb.vllm-bench.json"]).table()
    assert table.splitlines()[0] == f"{run_folder / 'cb.vllm-bench.json'} (vllm-bench, request rate 4 req/s):"

    # a file without a request rate read "request rate inf" whether its start_times spread the requests over the
    # run or it sent them all at once
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text()) | {"request_rate": "inf"}
    (tmp_path / "timed.json").write_text(json.dumps(data))
    del data["start_times"]
    (tmp_path / "burst.json").write_text(json.dumps(data))
    val = validate_against(SCENARIO, [tmp_path / "timed.json", tmp_path / "burst.json"])
    heads = [line for line in val.table().splitlines() if not line.startswith(" ")]
    times = sorted(r.arrival for r in val.files[0].result.requests)  # type: ignore[union-attr]
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert heads == [f"{tmp_path / 'timed.json'} (vllm-bench, {rate:.3g} req/s as its start times show, "
                     f"{len(times)} requests over {times[-1] - times[0]:.3g} s):",
                     f"{tmp_path / 'burst.json'} (vllm-bench, request rate inf: all requests at once):"]
    assert [f.to_dict()["arrivals"] for f in val.files] == [h.split(", ", 1)[1][:-2] for h in heads]


def test_a_measured_figure_of_almost_zero_gives_no_absurd_relative_error() -> None:
    """A std rounded to 1e-16 s read ``error +100000000000000000.0%``: below the floor the table says why the
    relative error means nothing and gives the absolute difference; an ordinary row keeps its percentage."""
    from sim.output.benchfiles.validate import BenchValidation, FileValidation, error_text, relative_error

    assert relative_error(1e-16, 0.01) is None and relative_error(1e-16, 1e-17) == 0.0
    assert relative_error(0.1, 0.11) == pytest.approx(0.1)
    metrics = {k: {"measured": m, "simulated": s, "error": relative_error(m, s)}
               for k, m, s in (("std_ttft", 1e-16, 0.01), ("mean_ttft", 0.1, 0.11))}
    text = BenchValidation("s", "v", [FileValidation("f.json", None, "vllm", 1.0, "request_rate", metrics)]).table()
    assert "e+1" not in text and "n/a (measured ~0, |x| < 1e-09: difference +10 ms)" in text
    assert "error +10.0%" in text
    # the engine replay's comparison (servesim validate --profile) uses the same floor
    from calibration.validate import compare
    assert compare({"ttft": {"p50": 1e-16}}, {"ttft": {"p50": 0.01}})["ttft_p50"]["rel_error"] is None
    assert error_text(1e-16, 0.01, None, 1e3, " ms").startswith("n/a (measured ~0")


def test_every_null_error_says_why_and_the_engine_tables_error_column_stays_aligned(run_folder: Path,
                                                                                    tmp_path: Path) -> None:
    """validation.json held ``"error": null`` with no word of why (a measured ~0, a figure one side lacks), and the
    engine replay's table right-aligned its error cells to 9 characters, so the row with the long 'n/a (measured
    ~0, ...)' cell ran past the others."""
    from calibration.validate import Validation, VariantValidation, compare

    m = compare({"ttft": {"p50": 1e-16, "p90": 0.1}, "output_throughput": 100.0},
                {"ttft": {"p50": 0.01, "p90": 0.11}, "output_throughput": 90.0})
    assert m["ttft_p50"]["rel_error_reason"] == ("measured ~0 (|x| < 1e-09) against simulated 0.01: no meaningful "
                                                 "relative error; compare the two figures")
    assert m["ttft_p99"]["rel_error_reason"] == "no measured figure and no simulated one"
    assert compare({"ttft": {"p50": 0.1}}, {})["ttft_p50"]["rel_error_reason"] == "no simulated figure"
    assert all(("rel_error_reason" in e) == (e["rel_error"] is None) for e in m.values())
    assert set(m["ttft_p90"]) == {"real", "sim", "rel_error"}
    v = VariantValidation("a", 10, None, None, {"num_requests": 3}, {}, m)  # type: ignore[arg-type]
    lines = Validation("s", "p", "cpu", "tiny", 1.0, [v]).table().splitlines()
    block = lines[next(i for i, line in enumerate(lines) if line.split()[0] == "metric"):]  # the table, header on
    assert any("n/a (measured ~0" in line for line in block)
    assert len({len(line) for line in block}) == 1, block  # every row ends where the header's "error" does
    # validate --against: a file whose std is 0 (one request) gets the reason beside its null
    data = json.loads((run_folder / "cb.vllm-bench.json").read_text()) | {"std_ttft_ms": 0.0}
    (tmp_path / "zero.json").write_text(json.dumps(data))
    f = validate_against(SCENARIO, [tmp_path / "zero.json"]).files[0]
    assert f.metrics["std_ttft"]["error"] is None
    assert f.metrics["std_ttft"]["error_reason"].startswith("measured ~0 (|x| < 1e-09) against simulated ")
    assert all(("error_reason" in e) == (e["error"] is None) for e in f.metrics.values())


def test_the_engine_tables_header_says_how_many_requests_were_rejected() -> None:
    """docs/write-a-policy.md's scenario under --model tiny: 7 of 20 requests are longer than tiny's context and
    rejected on both sides, and validate's header said only "20 requests" (engine run says it; validate did not)."""
    from calibration.validate import Validation, VariantValidation

    same = VariantValidation("mine", 10, None, None, {"num_requests": 20, "num_rejected": 7},  # type: ignore[arg-type]
                             {"num_rejected": 7}, {})
    other = VariantValidation("b", 10, None, None, {"num_requests": 20, "num_rejected": 7},  # type: ignore[arg-type]
                              {"num_rejected": 6}, {})
    none = VariantValidation("c", 10, None, None, {"num_requests": 20}, {}, {})  # type: ignore[arg-type]
    heads = [line for line in Validation("s", "p", "cpu", "tiny", 1.0, [same, other, none]).table().splitlines()
             if not line.startswith(" ")]
    assert heads == ["mine (10 KV blocks, 20 requests, 7 rejected (engine/requests.csv says why))",
                     "b (10 KV blocks, 20 requests, 7 rejected on the engine, 6 in the simulator (engine/requests.csv "
                     "says why))",
                     "c (10 KV blocks, 20 requests)"]


@pytest.mark.parametrize("kind,title", [("request_rate", "request rate (req/s)"),
                                        ("max_concurrency", "max_concurrency (requests, a closed loop)")])
def test_the_sweep_panels_name_their_load_axis(kind: str, title: str) -> None:
    """validation.html's load sweep drew every metric against the load with no x axis title (the load's kind only
    in the figure's title): the lowest panel of each column names it, with its unit."""
    from sim.output.benchfiles.validate import BenchValidation, FileValidation, _sweep_figure

    keys = ["mean_ttft", "median_ttft", "p99_ttft", "mean_tpot", "p99_tpot", "output_throughput", "request_throughput"]
    files = [FileValidation(f"f{load}.json", None, "vllm", load, kind,
                            {k: {"measured": load * (i + 1), "simulated": load * (i + 1.1), "error": 0.1}
                             for i, k in enumerate(keys)}) for load in (1.0, 2.0, 4.0)]
    fig = _sweep_figure(BenchValidation("s", "v", files))
    assert fig is not None
    # 7 panels in 3 columns: the last row's one and the second row's last two are their columns' lowest
    titled = {name: fig.layout[name].title.text for name in ("xaxis", "xaxis2", "xaxis3", "xaxis4", "xaxis5",
                                                              "xaxis6", "xaxis7")}
    assert titled == {"xaxis": None, "xaxis2": None, "xaxis3": None, "xaxis4": None, "xaxis5": title,
                      "xaxis6": title, "xaxis7": title}
