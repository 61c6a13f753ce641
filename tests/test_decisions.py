"""Decision traces (sim/metrics/decisions.py): what each decision row says, and counterfactual routing regret by
re-simulation: zero for a router no single change improves, positive for round robin on a skewed load."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from sim.loop.simulator import Simulation
from sim.metrics.decisions import (
    DecisionTrace,
    ReplayRouter,
    best_response_routes,
    e2e_by_request,
    resimulated_regret,
    summary,
    trace_core,
    trace_simulation,
)
from sim.policies import ContinuousPolicy, Limits
from sim.policies.base import Admission
from sim.policies.routers import Router, least_outstanding, round_robin
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import ServingCore
from sim.serving.request import RequestSpec
from tests.conftest import LinearCost
from tests.test_cli import assert_clean_error, invoke

# Skewed: every other request has a 30x longer prompt, so round robin sends every long one to replica 0
SKEWED = [RequestSpec(i, 0.015 * i, 1500 if i % 2 == 0 else 50, 20) for i in range(24)]


def simulate(specs, router: Router, trace: DecisionTrace | None = None, *, blocks: int = 2000,
             admission: Admission | None = None, name: str = "round_robin"):
    pairs = [(ServingCore(ContinuousPolicy(limits=Limits(8, 2048, 2048), admission=admission or Admission()),
                          PagedBlockManager(blocks, 16), fast_path=False), LinearCost()) for _ in range(2)]
    sim = Simulation(specs, pairs, router=router, fast_forward=False)
    if trace is not None:
        trace_simulation(sim, trace, name)
    sim.run()
    return sim.requests


def rerun(router: Router):
    return simulate(SKEWED, router)


def test_round_robin_has_regret_on_a_skewed_load() -> None:
    trace = DecisionTrace()
    reqs = simulate(SKEWED, round_robin(), trace)
    assert [d.chosen for d in trace.routes] == [i % 2 for i in range(24)]
    rows = resimulated_regret(rerun, trace.routes, k=2)
    # the replay of the decisions as taken is the run itself, to the last bit
    assert rows[0]["total_e2e"] == sum(e2e_by_request(reqs).values())
    regrets = [r["regret"] for r in rows]
    assert min(regrets) >= 0.0
    assert sum(regrets) > 0.05 and sum(r > 0 for r in regrets) >= 5
    s = summary(trace, rows)["routing_regret"]
    assert s["method"] == "re-simulation" and s["decisions"] == 24 and s["positive"] == sum(r > 0 for r in regrets)
    assert s["worst"][0]["regret"] == max(regrets)


def test_a_router_no_single_change_improves_has_zero_regret() -> None:
    first = DecisionTrace()
    simulate(SKEWED, round_robin(), first)
    best = best_response_routes(rerun, [d.chosen for d in first.routes], num_replicas=2)
    trace = DecisionTrace()
    simulate(SKEWED, ReplayRouter(best), trace, name="best")
    rows = resimulated_regret(rerun, trace.routes, k=2)
    assert [r["regret"] for r in rows] == [0.0] * 24
    # and it beats round robin on the objective
    rr = sum(e2e_by_request(rerun(round_robin())).values())
    assert rows[0]["total_e2e"] < rr


def test_tracing_changes_no_result() -> None:
    plain = simulate(SKEWED, least_outstanding())
    traced = simulate(SKEWED, least_outstanding(), DecisionTrace(), name="least_outstanding")
    assert [(r.id, r.replica, r.finish) for r in plain] == [(r.id, r.replica, r.finish) for r in traced]


def test_rows_name_admissions_preemptions_and_what_was_left_waiting() -> None:
    # 16 requests at once on 2 replicas of 120 blocks (1,920 tokens): prompts of 1500 cannot all be held
    specs = [RequestSpec(i, 0.0, 1500 if i < 8 else 300, 200) for i in range(16)]
    trace = DecisionTrace()
    simulate(specs, round_robin(), trace, blocks=120, admission=Admission(max_queue_len=5))
    kinds = trace.counts
    assert kinds["route"] == 16
    assert kinds["admission"] == 16 and kinds["preemption"] >= 1
    refused = [r for r in trace.rows if r["kind"] == "admission" and not r["admitted"]]
    assert refused and all(r["reason"] == "queue already holds max_queue_len 5 requests" for r in refused)
    held = [r for r in trace.rows if r["kind"] == "schedule" and r["num_not_admitted"] > 0]
    assert held and {r["reason"] for r in held} <= {"token budget spent (max_num_batched_tokens)",
                                                    "max_num_seqs reached", "free KV blocks short",
                                                    "the policy's order"}
    assert all(set(r["not_admitted"]).isdisjoint(r["admitted"]) for r in held)
    route = next(r for r in trace.rows if r["kind"] == "route")
    assert route["reason"] == "round_robin: in turn" and len(route["candidates"]) == 2


def test_the_row_cap_bounds_rows_not_counts() -> None:
    trace = DecisionTrace(max_rows=10)
    simulate(SKEWED, round_robin(), trace)
    assert len(trace.rows) == 10 and trace.rows_written == 10
    assert trace.counts["route"] == 24 and summary(trace, None)["counts"]["route"] == 24


CLUSTER = {
    "name": "traced", "seed": 3,
    "workload": {"arrival": {"type": "poisson", "rate": 20.0}, "num_requests": 30,
                 "prompt_len": {"type": "lognormal", "mean": 400, "std": 300, "min": 16, "max": 2000},
                 "output_len": {"type": "lognormal", "mean": 60, "std": 40, "min": 4, "max": 200}},
    "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 4096, "num_gpu_blocks": 400},
    "policy": {"type": "continuous", "enable_chunked_prefill": True, "max_num_batched_tokens": 1024},
    "cluster": {"replicas": 2, "router": "round_robin"},
}


def test_run_trace_decisions_writes_the_trace_and_its_summary(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "traced").mkdir()
    plain, out_plain = invoke(tmp_path / "plain", CLUSTER)
    traced, out = invoke(tmp_path / "traced", CLUSTER, args=("--trace", "decisions"))
    assert plain.exit_code == 0 and traced.exit_code == 0, traced.output
    assert "decisions.jsonl" in traced.output and not (out_plain / "decisions.jsonl").exists()
    # the same requests, to the byte; only the traced summary has a decisions block
    assert (out / "requests.csv").read_bytes() == (out_plain / "requests.csv").read_bytes()
    assert "decisions" not in json.loads((out_plain / "summary.json").read_text())["variants"]["traced"]
    block = json.loads((out / "summary.json").read_text())["variants"]["traced"]["decisions"]
    rows = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    kinds = Counter(r["kind"] for r in rows)
    assert kinds["route"] == kinds["admission"] == kinds["regret"] == 30
    assert block["counts"] == {k: n for k, n in sorted(kinds.items()) if k != "regret"}
    reg = block["routing_regret"]
    assert reg["method"] == "re-simulation" and reg["decisions"] == 30
    assert reg["total"] == sum(r["regret"] for r in rows if r["kind"] == "regret")
    assert not list(out.glob(".decisions*"))  # the partial file was moved into place
    report, plain_report = (out / "report.html").read_text(), (out_plain / "report.html").read_text()
    assert "Routing regret (re-simulation, k=2) over 30 decisions" in report
    assert "Routing regret" not in plain_report


def test_run_trace_bad_values_exit_2(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, CLUSTER, args=("--trace", "steps"))
    assert_clean_error(result, out, "--trace must be decisions")
    result, out = invoke(tmp_path, CLUSTER, args=("--trace", "decisions", "--trace-max-rows", "0"))
    assert_clean_error(result, out, "--trace-max-rows must be >= 1")
    # without --trace it capped nothing and the run exited 0, no trace written: the option was dropped unsaid
    result, out = invoke(tmp_path, CLUSTER, args=("--trace-max-rows", "5"))
    assert_clean_error(result, out, "--trace-max-rows caps the rows of --trace decisions, which is not given")


def test_a_traced_core_never_takes_the_policys_quick_plan(monkeypatch) -> None:
    # The core reads the policy's quick plan (schedule_arrival) when it is built; a trace wraps the policy later,
    # so a plan taken there would bypass the trace. A traced core must ask schedule, which the trace sees.
    quick_plans = [0]
    quick = ContinuousPolicy.schedule_arrival

    def counted(self, view):
        quick_plans[0] += 1
        return quick(self, view)

    monkeypatch.setattr(ContinuousPolicy, "schedule_arrival", counted)

    def run(trace: DecisionTrace | None) -> int:
        quick_plans[0] = 0
        core = ServingCore(ContinuousPolicy(limits=Limits(8, 2048, 2048)), PagedBlockManager(2000, 16))
        sim = Simulation(SKEWED, [(core, LinearCost())], fast_forward=False)
        if trace is not None:
            trace_core(core, trace)
        sim.run()
        return quick_plans[0]

    assert run(None) > 0  # (untraced, the same core takes quick plans: the test would otherwise prove nothing)
    assert run(DecisionTrace()) == 0


def test_each_run_says_how_many_rows_it_wrote_under_the_files_cap() -> None:
    # The cap is decisions.jsonl's, shared by the variants; each variant's summary gave the file's running total
    # as its own rows_written: naive-vs-continuous -n 20 --trace-max-rows 5 read 5 for both variants, where the
    # file held 5 rows, all naive's
    one = DecisionTrace()
    simulate(SKEWED, round_robin(), one)
    trace = DecisionTrace(max_rows=one.rows_written + 10)
    got = []
    for name in ("a", "b", "c"):
        trace.begin(name)
        simulate(SKEWED, round_robin(), trace, name=name)
        got.append(summary(trace, None)["rows_written"])
    assert got == [one.rows_written, 10, 0]
    assert Counter(r["variant"] for r in trace.rows) == {"a": one.rows_written, "b": 10}
