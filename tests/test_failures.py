"""Requests that fail mid-flight in the simulator (``workload.failures``), and the leak that forgets to free them.

- the fast path records exactly what stepping one by one records, failures included (leaky or not);
- a failure is taken at the first step boundary at or after its time (at once on an idle replica), the request
  ends ``failed`` with that reason, and (correct server) every block is free at the end;
- a leaky server keeps exactly the failed requests' blocks, so usage creeps up and admission finally stalls.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.loop.run import generate_workload, simulate_variant
from sim.serving.failures import FailurePlan
from sim.serving.kv_manager import cdiv

WORKLOAD = {
    "arrival": {"type": "poisson", "rate": 6.0},
    "num_requests": 160,
    "prompt_len": {"type": "lognormal", "mean": 300, "std": 200, "min": 8, "max": 1500},
    "output_len": {"type": "exponential", "mean": 150, "max": 600},
    "failures": {"fraction": 0.25, "after": {"type": "uniform", "min": 0.0, "max": 1.0}},
}


def scenario(policy: dict, *, leak: bool = False, blocks: int = 2000, admission: dict | None = None,
             workload: dict = WORKLOAD) -> dict:
    raw = {"seed": 4, "workload": workload, "policy": policy,
           "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "num_gpu_blocks": blocks, "max_model_len": 4096,
                          "leak_kv_on_failure": leak}}
    if admission:
        raw["admission"] = admission
    return raw


POLICIES = [
    {"type": "continuous", "enable_chunked_prefill": True, "max_num_batched_tokens": 512},
    {"type": "continuous", "preemption_mode": "swap"},
    {"type": "static", "batch_size": 8, "max_wait": 0.2},
]


def run(raw: dict, fast: bool = True):
    sc = parse_scenario(raw)
    wl = generate_workload(sc)
    return wl, simulate_variant(variant_configs(sc)[0], wl, keep_token_times=True, fast_path=fast)


@pytest.mark.parametrize("leak", [False, True], ids=["correct", "leaky"])
@pytest.mark.parametrize("policy", POLICIES, ids=["chunked", "swap", "static"])
def test_fast_path_matches_step_by_step_with_failures(policy: dict, leak: bool) -> None:
    _, (rf, qf, _) = run(scenario(policy, leak=leak, blocks=1500))
    _, (rs, qs, _) = run(scenario(policy, leak=leak, blocks=1500), fast=False)
    assert rf.requests == rs.requests
    for col in rs.steps:
        assert np.array_equal(rf.steps[col], rs.steps[col]), col
    assert {r.id: r.token_times for r in qf} == {r.id: r.token_times for r in qs}
    failed = [r for r in rs.requests if r.outcome == "failed"]
    assert 20 <= len(failed) <= 40  # 40 drawn; some finish before their time comes


@pytest.mark.parametrize("policy", POLICIES, ids=["chunked", "swap", "static"])
def test_failures_are_taken_at_step_boundaries_and_free_everything(policy: dict) -> None:
    wl, (result, requests, core) = run(scenario(policy))
    plan = wl.failures
    assert isinstance(plan, FailurePlan) and len(plan.cancel_after) == 40
    steps = result.steps
    ends = steps["start"] + steps["duration"]
    boundaries = np.concatenate([steps["start"], ends])
    n_failed = 0
    for r in requests:
        delay = plan.cancel_after.get(r.id)
        if delay is None:
            assert r.outcome.value == "completed"
            continue
        due = r.arrival + delay
        if r.outcome.value == "completed":
            assert r.finish <= due + 1e-9  # finished before its failure came
            continue
        n_failed += 1
        assert r.outcome.value == "failed" and r.reason == "cancelled by the client"
        assert r.finish >= due - 1e-12 and r.num_output_tokens < r.output_len
        # taken at the first step boundary at or after its time, or at that very time on an idle replica
        later = boundaries[boundaries >= due - 1e-12]
        first = later.min() if len(later) else np.inf
        assert r.finish == pytest.approx(due, abs=1e-9) or r.finish == pytest.approx(first, abs=1e-9)
    assert n_failed == core.stats.num_failed >= 20
    assert core.kv.num_free_blocks == core.kv.num_blocks and core.kv_tokens == 0


def test_a_leaky_server_keeps_exactly_the_failed_requests_blocks() -> None:
    policy = {"type": "continuous", "enable_chunked_prefill": True, "max_num_batched_tokens": 512}
    _, (result, requests, core) = run(scenario(policy, leak=True, blocks=6000))
    failed = [r for r in requests if r.outcome.value == "failed"]
    assert failed and all(r.outcome.value in ("completed", "failed") for r in requests)
    held = sum(cdiv(r.num_computed_tokens, core.kv.block_size) for r in failed)
    assert core.kv.num_blocks - core.kv.num_free_blocks == held > 0
    used = result.steps["kv_blocks_used"]
    # usage creeps up: the late steps use more blocks than the early ones although the load is steady
    quarter = len(used) // 4
    assert used[-quarter:].min() >= held * 0.5 and used[:quarter].mean() < used[-quarter:].mean()


def test_the_leak_stalls_admission_and_more_memory_only_delays_it() -> None:
    """Doubling the KV memory of a leaky server moves the stall later; a correct server never stalls."""
    policy = {"type": "continuous", "enable_chunked_prefill": True, "max_num_batched_tokens": 512}
    admission = {"max_queue_delay": 5.0}
    # ~115 of 600 requests fail before they finish, each leaking ~25 blocks: ~2900 blocks, more than either holds
    workload = dict(WORKLOAD, num_requests=600, failures={"fraction": 0.3, "after": {"type": "uniform", "min": 0.0,
                                                                                        "max": 1.0}})
    first_reject = {}
    for label, leak, blocks in (("correct", False, 1200), ("leaky", True, 1200), ("leaky-2x", True, 2400)):
        _, (_, requests, _) = run(scenario(policy, leak=leak, blocks=blocks, admission=admission,
                                                workload=workload))
        rejected = [r for r in requests if r.outcome.value == "rejected"]
        first_reject[label] = min((r.finish for r in rejected), default=np.inf)
    assert first_reject["correct"] == np.inf
    assert first_reject["leaky"] < first_reject["leaky-2x"] < np.inf


def test_failures_section_is_checked_and_described() -> None:
    raw = scenario(POLICIES[0])
    assert "25% cancelled after uniform [0, 1] s" in parse_scenario(raw).workload.describe()
    bad = dict(raw, workload=dict(WORKLOAD, failures={"fraction": 1.5, "after": {"type": "fixed", "value": 1}}))
    with pytest.raises(Exception, match="fraction"):
        parse_scenario(bad)
    # no failures section: the workload draws exactly what it drew before the section existed
    plain = dict(raw, workload={k: v for k, v in WORKLOAD.items() if k != "failures"})
    a = generate_workload(parse_scenario(plain))
    b = generate_workload(parse_scenario(raw))
    assert a.requests == b.requests and a.failures is None and b.failures is not None
