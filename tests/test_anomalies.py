"""The anomaly detectors (sim.metrics.anomalies, issue 37 item 2): exact on hand-made records and against a brute-force
count, silent under FCFS on equal requests, and each tripped by the bad policy built for it
(sim.policies.pathological)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from sim.costs.analytic import AnalyticCostModel
from sim.hardware.gpu import resolve_gpu
from sim.hardware.models import resolve_model
from sim.loop.simulator import Simulation
from sim.metrics.anomalies import head_of_line, inversions, service_over_time, starvation
from sim.metrics.records import RequestRecord
from sim.policies import Limits
from sim.policies.pathological import NewestFirst, ReversePriority
from sim.policies.priority import PriorityPolicy
from sim.policies.queue import FCFSPolicy
from sim.policies.user import UserPolicy
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import ServingCore
from sim.serving.request import RequestSpec


def _rec(i: int, arrival: float, start: float, priority: int = 0, replica: int = 0, first: float | None = None,
         finish: float | None = None, out: int = 10, tenant: str = "", cls: str = "") -> RequestRecord:
    first = start + 0.1 if first is None else first
    finish = first + 1 if finish is None else finish
    return RequestRecord(i, arrival, start, first, finish, 100, out, out, 0, "completed", "", replica, -1,
                         priority=priority, tenant=tenant, slo_class=cls)


def _brute(recs: list[RequestRecord], tol: float) -> tuple[int, int]:
    by_p = by_a = 0
    for a, b in itertools.permutations(recs, 2):
        dominates = a.priority <= b.priority and a.arrival <= b.arrival and \
            (a.priority < b.priority or a.arrival < b.arrival)
        if dominates and a.first_scheduled > b.first_scheduled + tol:
            if a.priority < b.priority:
                by_p += 1
            else:
                by_a += 1
    return by_p, by_a


def test_inversions_equal_a_brute_force_count() -> None:
    rng = np.random.default_rng(0)
    for trial in range(20):
        n = 60
        arr = np.round(rng.random(n) * 5, 1)  # rounded: equal arrival times occur
        start = arr + np.round(rng.random(n) * 3, 2)
        prio = rng.integers(0, 3, n)
        recs = [_rec(i, float(arr[i]), float(start[i]), int(prio[i])) for i in range(n)]
        for tol in (0.0, 0.01, 0.5):
            got = inversions(recs, tol)
            assert (got["by_priority"], got["by_arrival"]) == _brute(recs, tol), (trial, tol)
            assert got["count"] == got["by_priority"] + got["by_arrival"]


def test_a_planted_inversion_is_found_and_named() -> None:
    recs = [_rec(0, 0.0, 0.0), _rec(1, 1.0, 5.0), _rec(2, 2.0, 3.0), _rec(3, 3.0, 6.0)]
    got = inversions(recs)
    assert got == {"count": 1, "by_priority": 0, "by_arrival": 1, "tolerance": 0.01,
                   "worst": {"request": 1, "overtaken_by": 2, "late_by": 2.0}}
    # within the tolerance it is not counted
    assert inversions([_rec(0, 0.0, 1.005), _rec(1, 0.5, 1.0)])["count"] == 0
    # a higher priority (lower value) that arrived at the same time, scheduled after a lower one
    got = inversions([_rec(0, 0.0, 2.0, priority=0), _rec(1, 0.0, 1.0, priority=1)])
    assert (got["by_priority"], got["by_arrival"]) == (1, 0)
    # the same, the lower id first: in arrival-then-id order, yet the higher priority waited (the shortcut for
    # requests scheduled in arrival order once missed it), on one replica and among several
    recs = [_rec(0, 0.0, 1.0, priority=1), _rec(1, 0.0, 2.0, priority=0)]
    got = inversions(recs)
    assert (got["by_priority"], got["by_arrival"]) == (1, 0) == _brute(recs, 0.01)
    got = inversions([*recs, _rec(2, 0.5, 0.6, replica=1)])
    assert (got["by_priority"], got["by_arrival"]) == (1, 0)


def _cost() -> AnalyticCostModel:
    return AnalyticCostModel(resolve_model("llama-3.1-8b"), resolve_gpu("a100-80gb"))


def _records(policy: Any, specs: list[RequestSpec], slots: int) -> list[RequestRecord]:
    sim = Simulation(specs, [(ServingCore(UserPolicy(policy, Limits(slots, 8192, 8192)), PagedBlockManager(10**5, 16)),
                              _cost())])
    sim.run()
    return [RequestRecord.from_request(r) for r in sim.requests]


def _equal_requests(rate: float, n: int = 300, priority: Any = None) -> list[RequestSpec]:
    """Equal requests (200-token prompts, 100 output tokens), Poisson at ``rate``; 4 slots serve about 2.7/s."""
    rng = np.random.default_rng(2)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [RequestSpec(i, float(t[i]), 200, 100, priority=0 if priority is None else int(priority[i]))
            for i in range(n)]


def test_fcfs_on_equal_requests_has_no_inversion_and_newest_first_has_them() -> None:
    """At about 0.9 load (2.5 requests/s). Measured: FCFS 0 inversions and a longest wait of 1.9 s; newest-first
    276 inversions and 15.1 s."""
    specs = _equal_requests(2.5)
    fcfs = _records(FCFSPolicy(), specs, 4)
    assert inversions(fcfs)["count"] == 0
    newest = _records(NewestFirst(), specs, 4)
    inv = inversions(newest)
    assert inv["by_arrival"] > 100 and inv["by_priority"] == 0, inv
    # an old request of the queue starves under newest-first: its longest wait is several times FCFS's
    assert starvation(newest)["longest_wait"] > 3 * starvation(fcfs)["longest_wait"]


def test_newest_first_plants_exactly_the_expected_inversions() -> None:
    """One slot busy with request 0; requests 1, 2, 3 arrive while it runs and are served 3, 2, 1: the pairs
    (1, 2), (1, 3), (2, 3) are inverted, no more."""
    specs = [RequestSpec(0, 0.0, 50, 200)] + [RequestSpec(i, 0.1 * i, 50, 20) for i in (1, 2, 3)]
    recs = _records(NewestFirst(), specs, 1)
    assert sorted(recs, key=lambda r: r.first_scheduled)[1].id == 3
    got = inversions(recs)
    assert (got["count"], got["by_arrival"]) == (3, 3)
    assert (got["worst"]["request"], got["worst"]["overtaken_by"]) == (1, 3)


def test_reverse_priority_inverts_by_priority_where_vllms_priority_does_not() -> None:
    rng = np.random.default_rng(5)
    specs = _equal_requests(20.0, priority=rng.integers(0, 2, 300))  # overload: a queue of both priorities
    assert inversions(_records(PriorityPolicy(), specs, 4))["by_priority"] == 0
    bad = inversions(_records(ReversePriority(), specs, 4))
    assert bad["by_priority"] > 1000, bad


def test_head_of_line_blocking_flags_the_replica_every_request_piles_on() -> None:
    from sim.config.scenario import parse_scenario, variant_configs
    from sim.loop.run import generate_workload, simulate_variant

    raw = {"seed": 1,
           "workload": {"arrival": {"type": "poisson", "rate": 40.0}, "num_requests": 200,
                        "prompt_len": {"type": "uniform", "min": 20, "max": 400},
                        "output_len": {"type": "uniform", "min": 2, "max": 80}},
           "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
           "policy": {"type": "continuous", "max_num_seqs": 8},
           "variants": [{"name": "busiest", "cluster": {"replicas": 3, "router": {
               "type": "custom", "cls": "sim.policies.pathological:AlwaysBusiest"}}},
               {"name": "least", "cluster": {"replicas": 3, "router": "least_outstanding"}}]}
    sc = parse_scenario(raw)
    wl = generate_workload(sc)
    got = {}
    for cfg in variant_configs(sc):
        res, _, _ = simulate_variant(cfg, wl)
        got[cfg.name] = head_of_line(res.requests, res.duration, [0, 1, 2])
    assert got["busiest"]["blocked_replicas"] == [0]
    assert [p["requests"] for p in got["busiest"]["per_replica"]] == [200, 0, 0]  # the others never got one
    assert got["least"]["blocked_replicas"] == []
    assert head_of_line([_rec(0, 0.0, 1.0)], 10.0, [0]) is None  # one replica: nothing to compare with


def test_head_of_line_is_littles_law_per_replica() -> None:
    recs = [_rec(0, 0.0, 4.0, replica=0), _rec(1, 0.0, 6.0, replica=0), _rec(2, 1.0, 1.0, replica=1),
            _rec(3, 1.0, 1.5, replica=2)]
    got = head_of_line(recs, 10.0, [0, 1, 2])
    assert [p["mean_waiting"] for p in got["per_replica"]] == [1.0, 0.0, 0.05]
    assert [p["max_wait"] for p in got["per_replica"]] == [6.0, 0.0, 0.5]
    assert got["blocked_replicas"] == [0]  # 1.0 > 2 x the fleet's 0.35, and at least one request


def test_starvation_and_service_over_time_are_exact() -> None:
    recs = [_rec(0, 0.0, 1.0, cls="a", tenant="x", first=1.0, finish=3.0, out=20),
            _rec(1, 0.0, 4.0, cls="b", tenant="y", first=4.0, finish=4.0, out=5),
            _rec(2, 1.0, 1.5, cls="a", tenant="x", first=2.0, finish=6.0, out=8)]
    s = starvation(recs)
    assert s == {"longest_wait": 4.0, "request": 1, "class": "b",
                 "per_class": {"a": {"longest_wait": 1.0, "request": 0}, "b": {"longest_wait": 4.0, "request": 1}}}
    svc = service_over_time(recs, 6.0, points=4)  # t = 0, 2, 4, 6
    assert svc == {"t": [0.0, 2.0, 4.0, 6.0], "output_tokens": {"x": [0.0, 10.0, 24.0, 28.0],
                                                                "y": [0.0, 0.0, 5.0, 5.0]}}
    assert service_over_time([_rec(0, 0.0, 1.0)], 6.0) is None  # no tenants


@pytest.mark.parametrize("classes", [False, True])
def test_summary_has_the_section_only_when_it_has_something_to_say(classes: bool) -> None:
    from sim.config.scenario import parse_scenario
    from sim.loop.run import run_scenario

    wl: dict = {"arrival": {"type": "poisson", "rate": 20.0}, "num_requests": 100,
                "prompt_len": {"type": "fixed", "value": 200}, "output_len": {"type": "fixed", "value": 50}}
    if classes:
        wl["classes"] = [{"name": "a", "share": 0.5, "tenant": "a"}, {"name": "b", "share": 0.5, "tenant": "b"}]
    raw = {"seed": 0, "workload": wl, "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb",
                                                      "max_model_len": 4096}}
    (s,) = run_scenario(parse_scenario(raw)).summaries.values()
    if not classes:
        assert "anomalies" not in s  # a classless FCFS run: summary.json as before the detectors
        return
    a = s["anomalies"]
    assert a["inversions"]["count"] == 0
    assert set(a["service_over_time"]["output_tokens"]) == {"a", "b"}
    assert a["service_over_time"]["output_tokens"]["a"][-1] == s["tenants"]["a"]["output_tokens_served"]
    assert a["starvation"]["class"] in ("a", "b") and "fairness" in s


def test_the_report_charts_service_per_tenant_and_tabulates_the_detectors() -> None:
    from sim.config.scenario import parse_scenario
    from sim.loop.run import run_scenario
    from sim.output.report import build_report

    wl = {"arrival": {"type": "poisson", "rate": 20.0}, "num_requests": 100,
          "prompt_len": {"type": "fixed", "value": 200}, "output_len": {"type": "fixed", "value": 50},
          "classes": [{"name": "a", "share": 0.8, "tenant": "a"}, {"name": "b", "share": 0.2, "tenant": "b"}]}
    raw = {"seed": 0, "workload": wl, "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb",
                                                      "max_model_len": 4096},
           "variants": [{"name": "fcfs", "policy": {"type": "fcfs", "max_num_seqs": 4}},
                        {"name": "newest", "policy": {"type": "custom", "max_num_seqs": 4,
                                                      "cls": "sim.policies.pathological:NewestFirst"}}]}
    run = run_scenario(parse_scenario(raw))
    page = build_report(run.results, run.summaries, "t")
    assert "<h2>Fairness and anomalies</h2>" in page
    for trace in ("fcfs: a", "fcfs: b", "newest: a", "newest: b"):
        assert f'"name":"{trace}"' in page, trace
    inv = run.summaries["newest"]["anomalies"]["inversions"]["count"]
    assert inv > 0 and f"<td>newest</td><td>{inv}</td>" in page
    assert "<td>fcfs</td><td>0</td>" in page
