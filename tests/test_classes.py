"""Request classes: the workload's ``classes`` (shares, lengths, priority, tenant, SLOs), trace class columns, and
that a workload without classes draws exactly what it drew before they existed."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from sim.workload.generator import Workload
from sim.workload.traces import load_trace

BASE: dict[str, Any] = {
    "arrival": {"type": "poisson", "rate": 5.0},
    "num_requests": 10_000,
    "prompt_len": {"type": "lognormal", "mean": 300, "std": 200, "max": 2000},
    "output_len": {"type": "exponential", "mean": 100, "max": 1000},
}
TWO = [
    {"name": "interactive", "share": 0.2, "priority": 0, "tenant": "web", "slo": {"ttft": 1.0, "tpot": 0.05},
     "output_len": {"type": "fixed", "value": 7}},
    {"name": "batch", "share": 0.8, "priority": 1, "tenant": "etl", "prompt_len": {"type": "uniform", "min": 3000,
                                                                                    "max": 3010}},
]


def _gen(workload: dict[str, Any], seed: int = 0):
    return Workload.model_validate(workload).generate(np.random.default_rng(seed)).requests


def test_class_shares_within_two_points_on_10000_requests() -> None:
    """Seeded: each class's share of 10,000 arrivals lies within 0.02 of its target (binomial std is 0.004)."""
    for seed in (0, 1, 2):
        reqs = _gen({**BASE, "classes": TWO}, seed)
        counts = Counter(r.slo_class for r in reqs)
        assert set(counts) == {"interactive", "batch"}
        for c in TWO:
            assert abs(counts[c["name"]] / len(reqs) - c["share"]) < 0.02


def test_each_class_carries_its_fields_and_its_own_lengths() -> None:
    reqs = _gen({**BASE, "classes": TWO})
    inter = [r for r in reqs if r.slo_class == "interactive"]
    batch = [r for r in reqs if r.slo_class == "batch"]
    assert {(r.priority, r.tenant, r.ttft_slo, r.tpot_slo) for r in inter} == {(0, "web", 1.0, 0.05)}
    assert {(r.priority, r.tenant, r.ttft_slo, r.tpot_slo) for r in batch} == {(1, "etl", None, None)}
    assert {r.output_len for r in inter} == {7}  # the class's own output length
    assert all(3000 <= r.prompt_len <= 3010 for r in batch)  # the class's own prompt length
    # where a class keeps the workload's distribution, its requests keep the very draws of the classless workload
    plain = _gen(BASE)
    assert [r.prompt_len for r in inter] == [plain[r.id].prompt_len for r in inter]
    assert [r.output_len for r in batch] == [plain[r.id].output_len for r in batch]


def test_classes_leave_arrivals_and_lengths_of_the_workload_unchanged() -> None:
    """The class stream is spawned after every other: adding classes changes no arrival nor any length that no
    class overrides, so a classless scenario's requests are those it always drew."""
    classes = [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.5, "priority": 3}]
    with_classes = _gen({**BASE, "num_requests": 500, "classes": classes})
    plain = _gen({**BASE, "num_requests": 500})
    key = [(r.arrival, r.prompt_len, r.output_len) for r in plain]
    assert [(r.arrival, r.prompt_len, r.output_len) for r in with_classes] == key
    assert {(r.priority, r.tenant, r.slo_class, r.ttft_slo) for r in plain} == {(0, "", "", None)}
    assert Workload.model_validate(BASE).model_dump().keys() == {
        "arrival", "num_requests", "prompt_len", "output_len", "shared_prefix", "failures"}  # as before classes


@pytest.mark.parametrize("classes, message", [
    ([], "at least one class"),
    ([{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}], "names must be unique; 'a'"),
    ([{"name": "a", "share": 0.5}, {"name": "b", "share": 0.4}], "shares must sum to 1, got 0.9"),
    ([{"name": "a", "share": 0.5}, {"name": "b"}], "give every class a share, or none"),
    ([{"name": "a"}], "give each class a share"),
    ([{"name": "a", "share": 1.0, "slo": {"ttft": 0}}], "greater than 0"),
    ([{"name": "a", "share": 1.0, "weight": 2}], "Extra inputs are not permitted"),
])
def test_bad_classes_are_refused(classes: list, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Workload.model_validate({**BASE, "classes": classes})


def test_shares_written_as_decimals_sum_to_one() -> None:
    three = [{"name": "a", "share": 0.7}, {"name": "b", "share": 0.2}, {"name": "c", "share": 0.1}]
    assert 0.7 + 0.2 + 0.1 != 1.0
    assert len(_gen({**BASE, "num_requests": 10, "classes": three})) == 10


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def test_trace_class_columns_are_read_in_every_layout(tmp_path: Path) -> None:
    own = _write(tmp_path, "own.csv", "arrival_s,prompt_tokens,output_tokens,priority,tenant,slo_class\n"
                 "1.0,10,2,1,acme,batch\n0.5,12,3,0,web,chat\n2.0,9,1,,,\n")
    t = load_trace(own)
    assert t.classes is not None and t.classes.priority is not None  # sorted by arrival with the rows
    assert t.classes.priority.tolist() == [0, 1, 0]
    assert t.classes.tenant == ("web", "acme", "")
    assert t.classes.slo_class == ("chat", "batch", "")
    azure = _write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,tenant\n"
                   "2023-11-16 18:15:46.6805900,374,44,a\n2023-11-16 18:15:50.9951690,396,109,b\n")
    t = load_trace(azure)
    assert t.classes is not None and t.classes.tenant == ("a", "b") and t.classes.priority is None
    moon = _write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": []}\n'
                  '{"timestamp": 10, "input_length": 6, "output_length": 3, "hash_ids": [], "priority": -2}\n')
    t = load_trace(moon, repeat_to=4)
    assert t.classes is not None and t.classes.priority is not None
    assert t.classes.priority.tolist() == [0, -2, 0, -2]  # tiled with the window
    assert load_trace(_write(tmp_path, "plain.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n")).classes is None
    with pytest.raises(ValueError, match=r"bad.csv:2: priority must be an integer, got 'high'"):
        load_trace(_write(tmp_path, "bad.csv", "arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,high\n"))


def test_trace_columns_reach_the_requests_and_name_their_classes(tmp_path: Path) -> None:
    path = _write(tmp_path, "own.csv", "arrival_s,prompt_tokens,output_tokens,tenant,slo_class\n"
                  "0,10,2,acme,batch\n1,12,3,web,chat\n2,9,1,web,batch\n")
    arrival = {"type": "trace", "trace": str(path)}
    reqs = _gen({"arrival": arrival})
    assert [(r.priority, r.tenant, r.slo_class, r.ttft_slo) for r in reqs] == [
        (0, "acme", "batch", None), (0, "web", "chat", None), (0, "web", "batch", None)]
    # with classes but no shares, the trace's slo_class names each request's class; its tenant column wins
    classes = [{"name": "chat", "priority": 0, "tenant": "x", "slo": {"ttft": 0.5}},
               {"name": "batch", "priority": 2, "output_len": {"type": "fixed", "value": 40}}]
    reqs = _gen({"arrival": arrival, "classes": classes})
    assert [(r.priority, r.tenant, r.slo_class, r.ttft_slo, r.output_len) for r in reqs] == [
        (2, "acme", "batch", None, 40), (0, "web", "chat", 0.5, 3), (2, "web", "batch", None, 40)]
    with pytest.raises(ValueError, match=r"slo_class column names 'chat', which workload.classes does not define"):
        _gen({"arrival": arrival, "classes": [{"name": "batch"}]})


# ---- per-class and per-tenant metrics --------------------------------------------------------------------------

SCENARIO: dict[str, Any] = {
    "name": "classes",
    "seed": 3,
    "workload": {
        "arrival": {"type": "poisson", "rate": 12.0},
        "num_requests": 240,
        "prompt_len": {"type": "uniform", "min": 50, "max": 600},
        "output_len": {"type": "uniform", "min": 1, "max": 300},
        "classes": [
            {"name": "interactive", "share": 0.3, "tenant": "web", "slo": {"ttft": 0.5, "tpot": 0.03}},
            {"name": "batch", "share": 0.7, "priority": 1, "tenant": "etl"},
        ],
    },
    "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096},
    "slos": {"e2el": 8.0},
    "policy": {"type": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 2048,
               "enable_chunked_prefill": True},
    "kv_cache": {"type": "paged"},
}


def _run_folder(tmp_path: Path, scenario: dict[str, Any]) -> Path:
    from sim.config.scenario import parse_scenario
    from sim.loop.run import run_scenario, write_scenario_run

    sc = parse_scenario(scenario)
    out = tmp_path / "run"
    write_scenario_run(run_scenario(sc), out)
    return out


def test_jain_index_is_exact_on_hand_made_inputs() -> None:
    from sim.metrics.summary import jain_index

    assert jain_index([3.0, 3.0, 3.0, 3.0]) == 1.0  # equal service
    assert jain_index([5.0, 0.0, 0.0, 0.0]) == 0.25  # one tenant of four served: 1/n
    assert jain_index([1.0, 0.0]) == 0.5
    assert jain_index([1.0, 3.0]) == 16 / 20  # (1 + 3)^2 / (2 * (1 + 9))
    assert jain_index([2.0, 6.0]) == jain_index([1.0, 3.0])  # scale-free
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0.0, 0.0]))
    with pytest.raises(ValueError, match=">= 0"):
        jain_index([1.0, -1.0])


def _rows_by_class(path: Path) -> dict[str, list[dict[str, str]]]:
    import csv

    out: dict[str, list[dict[str, str]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["slo_class"], []).append(row)
    return out


def test_per_class_summary_equals_figures_from_requests_csv_rows(tmp_path: Path) -> None:
    """Every class's figures in summary.json, recomputed from its requests.csv rows with numpy alone."""
    import json

    out = _run_folder(tmp_path, SCENARIO)
    summary = json.loads((out / "summary.json").read_text())["variants"]["classes"]
    rows = _rows_by_class(out / "requests.csv")
    assert set(summary["classes"]) == set(rows) == {"interactive", "batch"}
    duration = summary["duration"]
    for name, block in summary["classes"].items():
        mine = rows[name]
        done = [r for r in mine if r["outcome"] == "completed"]
        assert block["num_requests"] == len(mine) and block["num_completed"] == len(done) > 20
        ttft = np.array([float(r["ttft_s"]) for r in done])
        e2el = np.array([float(r["e2el_s"]) for r in done])
        tpot = np.array([float(r["tpot_s"]) for r in done if r["tpot_s"]])
        for key, values in (("ttft", ttft), ("e2el", e2el), ("tpot", tpot)):
            assert block[key]["mean"] == pytest.approx(float(np.mean(values)), rel=1e-12)
            for q in (50, 90, 99):
                assert block[key][f"p{q}"] == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
        out_tok = sum(int(r["output_tokens"]) for r in done)
        assert block["total_output_tokens"] == out_tok
        assert block["output_throughput"] == pytest.approx(out_tok / duration, rel=1e-12)
        assert block["request_throughput"] == pytest.approx(len(done) / duration, rel=1e-12)
        itl_mean = sum(float(r["finish_s"]) - float(r["first_token_s"]) for r in done) / sum(
            int(r["output_tokens"]) - 1 for r in done)
        assert block["itl"]["mean"] == pytest.approx(itl_mean, rel=1e-9) and block["itl"]["p99"] is None
        # goodput against the class's own SLOs (from its rows), and the scenario's e2el for every class
        own_ttft = {r["ttft_slo_s"] for r in mine}
        own_tpot = {r["tpot_slo_s"] for r in mine}
        assert len(own_ttft) == len(own_tpot) == 1
        t_lim = float(own_ttft.pop() or "inf")
        p_lim = float(own_tpot.pop() or "inf")
        good = sum(1 for r in done if float(r["ttft_s"]) <= t_lim and float(r["tpot_s"] or 0) <= p_lim
                   and float(r["e2el_s"]) <= 8.0)
        assert block["goodput"] == pytest.approx(good / duration, rel=1e-12)
        assert block["slo_attainment"] == pytest.approx(good / len(mine), rel=1e-12)
        assert block["slos"]["e2el"] == 8.0
    # the run's goodput counts each request against its own class's SLOs: the sum of the classes'
    assert summary["goodput"] == pytest.approx(sum(c["goodput"] for c in summary["classes"].values()), rel=1e-12)
    assert summary["slo_attainment"] * summary["num_requests"] == pytest.approx(
        sum(c["slo_attainment"] * c["num_requests"] for c in summary["classes"].values()), rel=1e-12)
    inter = summary["classes"]["interactive"]
    assert (inter["priority"], inter["tenant"], inter["slos"]) == (0, "web", {"ttft": 0.5, "tpot": 0.03,
                                                                             "e2el": 8.0})
    assert 0 < inter["slo_attainment"] < 1  # the TTFT SLO bites at this load: the check is not vacuous
    # the tenants: service is output tokens served over those asked for; everything completed, so both are 1.0
    assert summary["tenants"]["web"]["output_tokens_served"] == inter["total_output_tokens"]
    assert summary["fairness"]["served_share_jain_index"] == 1.0 and summary["fairness"]["num_tenants"] == 2


def test_rejections_lower_a_tenants_service_and_the_fairness_index() -> None:
    from sim.metrics.records import RequestRecord
    from sim.metrics.summary import tenant_fairness

    def rec(i: int, tenant: str, outcome: str, out: int, target: int) -> RequestRecord:
        done = outcome == "completed"
        return RequestRecord(i, 0.0, 0.0 if done else -1, 0.5 if done else -1, 1.0, 10, out, target, 0, outcome,
                             "", 0, -1, tenant=tenant)

    reqs = [rec(0, "a", "completed", 10, 10), rec(1, "a", "completed", 30, 30),
            rec(2, "b", "completed", 10, 10), rec(3, "b", "rejected", 0, 30)]
    tenants, fairness = tenant_fairness(reqs)
    assert tenants["a"]["service"] == 1.0 and tenants["b"]["service"] == 0.25  # 10 of 40 tokens asked for
    assert fairness["served_share_jain_index"] == (1.25**2) / (2 * (1 + 0.0625))


def test_class_columns_table_export_and_report(tmp_path: Path) -> None:
    import json

    from sim.output.run_folder import CLASS_COLUMNS, REQUEST_COLUMNS, format_table, read_requests

    out = _run_folder(tmp_path, SCENARIO)
    header = (out / "requests.csv").read_text().splitlines()[0].split(",")
    assert header == ["variant", *REQUEST_COLUMNS, *CLASS_COLUMNS]
    back = read_requests(out)["classes"]
    assert {(r.slo_class, r.priority, r.tenant, r.ttft_slo, r.tpot_slo) for r in back} == {
        ("interactive", 0, "web", 0.5, 0.03), ("batch", 1, "etl", -1.0, -1.0)}
    summary = json.loads((out / "summary.json").read_text())["variants"]
    table = format_table(summary)
    assert "interactive: TTFT p99 (ms)" in table and "batch: SLO attainment" in table
    assert "Jain fairness (tenants)" in table
    bench = json.loads((out / "classes.vllm-bench.json").read_text())
    assert set(bench["per_class"]) == {"interactive", "batch"}
    inter = summary["classes"]["classes"]["interactive"]
    assert bench["per_class"]["interactive"]["p99_ttft_ms"] == pytest.approx(inter["ttft"]["p99"] * 1000, rel=1e-12)
    assert bench["per_class"]["interactive"]["completed"] == inter["num_completed"]
    assert bench["per_class"]["batch"]["request_goodput"] is None  # batch has no SLO of its own
    assert "Latency per class: classes" in (out / "report.html").read_text()


def test_a_run_without_classes_writes_no_class_figures_or_columns(tmp_path: Path) -> None:
    """The files of a classless run are what they were before classes existed: same requests.csv header, no
    class keys in summary.json or the vllm-bench export, no per-class figure."""
    import json

    from sim.output.run_folder import REQUEST_COLUMNS

    plain = {**SCENARIO, "workload": {k: v for k, v in SCENARIO["workload"].items() if k != "classes"}}
    out = _run_folder(tmp_path, plain)
    assert (out / "requests.csv").read_text().splitlines()[0].split(",") == ["variant", *REQUEST_COLUMNS]
    summary = json.loads((out / "summary.json").read_text())
    assert "classes" not in summary["scenario"]["workload"]
    assert not {"classes", "tenants", "fairness"} & set(summary["variants"]["classes"])
    assert "per_class" not in json.loads((out / "classes.vllm-bench.json").read_text())
    assert "Latency per class" not in (out / "report.html").read_text()


def test_parquet_and_the_python_api_carry_the_class_columns(tmp_path: Path) -> None:
    """requests.parquet and ``Results.requests`` hold requests.csv's class columns, and read back to the same
    records."""
    pytest.importorskip("pyarrow")
    from sim.config.scenario import parse_scenario
    from sim.loop.run import run_scenario
    from sim.output.run_folder import CLASS_COLUMNS, read_requests, write_run

    run = run_scenario(parse_scenario(SCENARIO))
    write_run(tmp_path / "csv", run.results, run.summaries)
    write_run(tmp_path / "pq", run.results, run.summaries, table_format="parquet")
    assert read_requests(tmp_path / "pq") == read_requests(tmp_path / "csv")
    assert {r.slo_class for r in read_requests(tmp_path / "pq")["classes"]} == {"interactive", "batch"}

    import servesim

    cols = servesim.run(SCENARIO).requests
    assert set(CLASS_COLUMNS) <= set(cols)
    assert {(c, t) for c, t in zip(cols["slo_class"], cols["ttft_slo_s"], strict=True)} == {
        ("interactive", 0.5), ("batch", None)}


def test_a_share_of_poisson_arrivals_is_a_poisson_process_of_its_own() -> None:
    """Thinning: with Poisson arrivals at rate 10 and shares 0.3/0.7, each class's gaps are exponential with mean
    1/(share x rate). 10,000 requests, about 3,000 in the smaller class: the mean gap's standard error is 1.8%,
    the tolerance 6%; an exponential's coefficient of variation is 1 (tolerance 0.06)."""
    classes = [{"name": "a", "share": 0.3}, {"name": "b", "share": 0.7}]
    reqs = _gen({**BASE, "arrival": {"type": "poisson", "rate": 10.0}, "classes": classes}, seed=5)
    for name, share in (("a", 0.3), ("b", 0.7)):
        gaps = np.diff([r.arrival for r in reqs if r.slo_class == name])
        assert abs(gaps.mean() * share * 10.0 - 1) < 0.06
        assert abs(gaps.std() / gaps.mean() - 1) < 0.06


def test_class_itl_percentiles_from_kept_token_times_match_the_cores_pool() -> None:
    """With token times kept, each class's ITL comes from its requests' gaps; pooled over the classes they are the
    core's own pool (recorded independently, partly by the decode fast path), so every statistic agrees."""
    from sim.config.scenario import parse_scenario
    from sim.loop.run import run_scenario
    from sim.metrics.summary import latency_stats

    run = run_scenario(parse_scenario({**SCENARIO, "keep_token_times": True}))
    (result,) = run.results
    (summary,) = run.summaries.values()
    assert summary["num_completed"] == summary["num_requests"]
    assert result.class_itl is not None and set(result.class_itl) == {"interactive", "batch"}
    gaps = np.concatenate([g for g, _ in result.class_itl.values()])
    counts = np.concatenate([c for _, c in result.class_itl.values()])
    both = latency_stats(gaps, counts)
    for k, v in summary["itl"].items():
        assert both[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    for name, block in summary["classes"].items():
        assert block["itl"] == latency_stats(*result.class_itl[name])
        assert block["itl"]["p99"] >= block["itl"]["p50"] > 0
    # without token times the percentiles are not known, and the mean is the same figure
    plain = run_scenario(parse_scenario(SCENARIO)).summaries["classes"]["classes"]
    for name, block in plain.items():
        assert block["itl"]["p50"] is None or math.isnan(block["itl"]["p50"])
        assert block["itl"]["mean"] == pytest.approx(summary["classes"][name]["itl"]["mean"], rel=1e-9)
