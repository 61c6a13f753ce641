"""The run folder's vllm-bench exports describe the run each was made from (its arrival rate, burstiness and
concurrency), not the scenario file's defaults."""

import json
from pathlib import Path

from sim.config.scenario import load_scenario, parse_scenario
from sim.loop.run import run_scenario, write_scenario_run

SCENARIO = Path(__file__).parent / "data" / "bench" / "scenario.yaml"


def test_each_export_names_its_own_runs_arrival_rate(tmp_path: Path) -> None:
    # A variant with a workload of its own and a sweep over the rate: each file named the scenario's default
    # rate (4.0, burstiness 1.0) whatever its run replayed, so a plot of throughput against request_rate was wrong.
    _, raw = load_scenario(SCENARIO)
    raw = {**raw, "workload": {**raw["workload"], "num_requests": 10},
           "variants": [{"name": "cb"}, {"name": "bursty", "workload": {"arrival": {"type": "gamma", "rate": 6.0,
                                                                                   "cv": 2.0}}}],
           "sweep": {"workload.arrival.rate": [2.0, 8.0]}}
    sc = parse_scenario(raw)
    write_scenario_run(run_scenario(sc, raw), tmp_path, raw)
    got = {}
    for f in sorted(tmp_path.glob("*.vllm-bench.json")):
        data = json.loads(f.read_text())
        got[data["label"]] = (data["request_rate"], data["burstiness"])
    # the sweep sets the rate in every section that has one; a gamma arrival of cv 2 is vLLM's burstiness 1/4
    assert got == {"cb[rate=2.0]": (2.0, 1.0), "cb[rate=8.0]": (8.0, 1.0),
                   "bursty[rate=2.0]": (2.0, 0.25), "bursty[rate=8.0]": (8.0, 0.25)}


def test_request_goodput_is_the_runs_goodput_when_it_has_slos(tmp_path: Path) -> None:
    # Before: request_goodput was null in every file, though the scenario's SLOs are what `vllm bench serve
    # --goodput ttft:2000 tpot:100` sets, and summary.json had the run's goodput (the registry maps one to the other).
    _, raw = load_scenario(SCENARIO)
    raw = {**raw, "workload": {**raw["workload"], "num_requests": 20}, "slos": {"ttft": 0.05, "tpot": 0.02}}
    sc = parse_scenario(raw)
    run = run_scenario(sc, raw)
    write_scenario_run(run, tmp_path, raw)
    data = json.loads((tmp_path / "cb.vllm-bench.json").read_text())
    # by hand, vLLM's rule: completed requests whose TTFT and TPOT (0 for one output token) are within the SLOs,
    # over the duration
    lens, ttfts, lats = data["output_lens"], data["ttfts"], data["latencies"]
    good = sum(1 for n, t, e in zip(lens, ttfts, lats, strict=True)
               if n > 0 and t <= 0.05 and (0.0 if n == 1 else (e - t) / (n - 1)) <= 0.02)
    assert 0 < good < 20
    assert data["request_goodput"] == good / data["duration"] == run.summaries["cb"]["goodput"]
    del raw["slos"]
    write_scenario_run(run_scenario(parse_scenario(raw), raw), tmp_path / "none", raw)
    assert json.loads((tmp_path / "none" / "cb.vllm-bench.json").read_text())["request_goodput"] is None


def test_dcgm_series_name_the_gpu_not_the_llm(tmp_path: Path) -> None:
    # DCGM's exporter labels a GPU's series with modelName, the GPU's product name: a dashboard that groups GPUs by
    # it showed "llama-3.1-8b" as the GPU of every simulated run.
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    _, raw = load_scenario(SCENARIO)
    raw = {**raw, "workload": {**raw["workload"], "num_requests": 10},
           "variants": [{"name": "cb"}, {"name": "h100", "deployment": {"gpu": "h100-sxm"}}]}
    write_scenario_run(run_scenario(parse_scenario(raw), raw), tmp_path, raw)
    for name, gpu in (("cb", "a100-80gb"), ("h100", "h100-sxm")):
        fams = {f.name: f for f in text_string_to_metric_families((tmp_path / f"{name}.metrics.prom").read_text())}
        for family in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
            assert {s.labels["modelName"] for s in fams[family].samples} == {gpu}, (name, family)
        assert {s.labels["model_name"] for s in fams["vllm:num_requests_running"].samples} == {"llama-3.1-8b"}


def test_a_rerun_into_the_same_folder_leaves_no_export_of_the_earlier_runs_variants(tmp_path: Path) -> None:
    # servesim run --out DIR twice, the second time with other variants: the first run's NAME.vllm-bench.json and
    # NAME.metrics.prom stayed beside the second run's summary.json, passing for its results (the stale tables were
    # already removed, the exports not). Files servesim did not write are left alone.
    _, raw = load_scenario(SCENARIO)
    raw = {**raw, "workload": {**raw["workload"], "num_requests": 5}}
    first = {**raw, "variants": [{"name": "cb"}, {"name": "a b"}, {"name": "a/b"}]}
    write_scenario_run(run_scenario(parse_scenario(first), first), tmp_path, first)
    assert {"cb.vllm-bench.json", "a_b.metrics.prom", "a_b-2.vllm-bench.json"} <= {p.name for p in tmp_path.iterdir()}
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "measured.vllm-bench.json").write_text("{}")
    second = {**raw, "variants": [{"name": "a b"}, {"name": "other"}]}
    write_scenario_run(run_scenario(parse_scenario(second), second), tmp_path, second)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a_b.metrics.prom", "a_b.vllm-bench.json", "measured.vllm-bench.json", "notes.txt", "other.metrics.prom",
        "other.vllm-bench.json", "report.html", "requests.csv", "steps.csv", "summary.json"]


def test_a_rerun_without_trace_removes_the_earlier_runs_decisions(tmp_path: Path) -> None:
    # servesim run --trace decisions, then the same --out without --trace: the first run's decisions.jsonl stayed
    # beside a summary.json with no decisions block, passing for the second run's decisions.
    from typer.testing import CliRunner

    from sim.cli.main import app

    args = ["run", str(SCENARIO), "--out", str(tmp_path / "o"), "-q", "-n", "5"]
    assert CliRunner().invoke(app, [*args, "--trace", "decisions"]).exit_code == 0
    assert (tmp_path / "o" / "decisions.jsonl").exists()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    assert CliRunner().invoke(app, args).exit_code == 0
    assert not (tmp_path / "o" / "decisions.jsonl").exists() and (tmp_path / "o" / "notes.txt").exists()
    assert CliRunner().invoke(app, [*args, "--trace", "decisions"]).exit_code == 0  # and a traced rerun keeps its own
    assert (tmp_path / "o" / "decisions.jsonl").stat().st_size > 0
