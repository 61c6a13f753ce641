"""The core's quick plan for a lone waiting request (``Policy.schedule_arrival``, ``ContinuousPolicy``'s) must give
the runs that asking ``schedule`` gives: every request record, step column and inter-token gap the same, with it and
without it, for every built-in policy's options on every KV cache, and for every shipped scenario."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.config.scenario import load_scenario, parse_scenario, variant_configs
from sim.loop.run import generate_workload, prepare_scenario, run_scenario, simulate_variant
from sim.policies.continuous import ContinuousPolicy
from tests.test_fast_path import CHAT, KV_CACHES, POLICIES

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the lone-arrival plans ``ContinuousPolicy.schedule_arrival`` made (None: it left it to ``schedule``)."""
    made = [0]
    quick = ContinuousPolicy.schedule_arrival

    def counted(self, view):
        plan = quick(self, view)
        made[0] += plan is not None
        return plan

    monkeypatch.setattr(ContinuousPolicy, "schedule_arrival", counted)
    return made


def _fingerprint(results) -> list:
    """What a run recorded: per result, its request records, each step column's bytes and the ITL pairs."""
    return [(list(r.requests), {k: np.asarray(v).tobytes() for k, v in r.steps.items()},
             np.asarray(r.itl_gaps).tobytes(), np.asarray(r.itl_counts).tobytes()) for r in results]


def _without_quick_plans(monkeypatch: pytest.MonkeyPatch, run):
    with monkeypatch.context() as m:
        m.setattr(ContinuousPolicy, "schedule_arrival", None)  # the core then asks schedule every time
        return run()


# continuous batching's options on every KV cache; the other built-in policies (no quick plan of their own, so the
# core asks their schedule every time) on the first
CASES = [(p, kv) for p in POLICIES for kv in (KV_CACHES if p["type"] == "continuous" else KV_CACHES[:1])]


@pytest.mark.parametrize(("policy", "kv"), CASES,
                         ids=["-".join(str(v) for v in [*p.values(), *k.values()]) for p, k in CASES])
def test_same_runs_with_and_without_the_quick_plan(policy, kv, planned, monkeypatch):
    scenario = parse_scenario({
        "workload": CHAT,
        "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096, "num_gpu_blocks": 400},
        "policy": policy,
        "kv_cache": kv,
    })
    workload = generate_workload(scenario)
    (cfg,) = variant_configs(scenario)

    def run():
        return _fingerprint([simulate_variant(cfg, workload, keep_token_times=True)[0]])

    quick = run()
    assert quick == _without_quick_plans(monkeypatch, run)
    if policy["type"] == "continuous" and policy.get("capacity_scheduler_policy") != "guaranteed_no_evict":
        assert planned[0] > 0  # (the scarce KV keeps a queue most of the time: a few arrivals find none)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenarios_same_with_and_without_the_quick_plan(path, planned, monkeypatch):
    scenario, raw = load_scenario(path, {"workload.num_requests": 60})

    def run():
        return _fingerprint(run_scenario(prepare_scenario(scenario, raw)).results)

    quick = run()
    assert quick == _without_quick_plans(monkeypatch, run)


def test_the_shipped_scenarios_use_the_quick_plan(planned):
    for path in SCENARIOS[:4]:
        scenario, raw = load_scenario(path, {"workload.num_requests": 60})
        run_scenario(prepare_scenario(scenario, raw))
    assert planned[0] > 60


def test_prefill_first_plans_its_step_after_a_prompt_without_schedule(monkeypatch):
    """Prefill-first runs a prompt alone, so the request's first decode is planned outside the decode group, often
    with others queued (Vidur's configuration: 2.2 asks a request, 1.4 of them with requests outside the group or
    several waiting). The quick plan makes those plans too, nothing swapped; the comparisons above hold them to
    schedule's."""
    asked: list[tuple[int, int, bool]] = []
    quick = ContinuousPolicy.schedule_arrival

    def counted(self, view):
        plan = quick(self, view)
        asked.append((len(view.waiting), len(view.outside), plan is not None))
        return plan

    monkeypatch.setattr(ContinuousPolicy, "schedule_arrival", counted)
    scenario, raw = load_scenario(ROOT / "scenarios" / "vidur-arxiv-llama2-70b.yaml", {"workload.num_requests": 300})
    run_scenario(prepare_scenario(scenario, raw))
    beside = [made for waiting, outside, made in asked if outside or waiting != 1]
    assert len(beside) > 300 and sum(beside) > 0.95 * len(beside)
