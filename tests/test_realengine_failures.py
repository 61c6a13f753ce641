"""Requests that fail mid-flight on the real engine leave nothing behind.

Cancellations (client disconnects, some while waiting, some mid-decode, some while swapped out), per-request
errors (in the prefill and mid-decode) and out-of-memory steps are injected into runs whose small cache forces
preemption by recompute and by swapping. Afterwards every block is free on the device and in the swap space, the
runner holds nothing for any request, and the cache tensors are the very ones it started with.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from realengine.engine import run_engine
from sim.config.scenario import parse_scenario, variant_configs
from sim.serving.failures import FailurePlan
from sim.serving.request import RequestSpec

NUM_BLOCKS = 24


def config(preemption_mode: str):
    raw = {
        "name": "engine-faults",
        "seed": 5,
        "workload": {"arrival": {"type": "poisson", "rate": 50.0}, "num_requests": 4,
                     "prompt_len": {"type": "fixed", "value": 8}, "output_len": {"type": "fixed", "value": 4}},
        "deployment": {"model": "tiny", "max_model_len": 64, "block_size": 4, "swap_space": 1.0},
        "policy": {"type": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 64,
                   "preemption_mode": preemption_mode},
    }
    return variant_configs(parse_scenario(raw))[0]


def workload(n: int = 16) -> list[RequestSpec]:
    """All requests at once: the cache (24 blocks of 4 tokens) then overflows whatever the steps cost, so every run
    preempts. With staggered arrivals the schedule depended on the machine's speed: on fast steps the early requests
    finished before the later ones came and nothing was preempted (checked in the simulator: staggered, constant
    steps of 0.1 ms gave 0 preemptions; all at once, steps priced from 0.05 ms to 50 ms gave 4 to 6 preemptions and
    77 to 83 steps, in both preemption modes)."""
    rng = np.random.default_rng(11)
    return [RequestSpec(id=i, arrival=0.0, prompt_len=int(rng.integers(6, 30)),
                        output_len=int(rng.integers(6, 24))) for i in range(n)]


def cache_state(runner) -> list[tuple]:
    kv = runner.kv
    return [(t.data_ptr(), tuple(t.shape), t.dtype) for t in kv.k + kv.v + kv.cpu_k + kv.cpu_v]


def run_with(plan: FailurePlan, preemption_mode: str):
    runners = []
    result, requests, core = run_engine(config(preemption_mode), workload(), num_gpu_blocks=NUM_BLOCKS,
                                        time_scale=1.0, failures=plan, record_plans=True,
                                        on_runner=runners.append)
    return result, {r.id: r for r in requests}, core, runners[0]


PLAN = FailurePlan(
    cancel_after={0: 0.0, 3: 0.01, 7: 0.03, 12: 0.0},  # at arrival (still waiting) and later (mid-flight)
    error_after={1: 0, 5: 3, 9: 5},  # in the prefill step; mid-decode
    oom_steps=frozenset({30}),
)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_injected_failures_release_every_block_and_tensor(mode: str) -> None:
    runners: list = []
    before: list = []

    def grab(r):
        runners.append(r)
        before.extend(cache_state(r))

    result, requests, core = run_engine(config(mode), workload(), num_gpu_blocks=NUM_BLOCKS, failures=PLAN,
                                        record_plans=True, on_runner=grab)[:3]
    runner = runners[0]
    by_id = {r.id: r for r in requests}
    assert len(by_id) == 16 and all(r.outcome is not None for r in requests)
    failed = {i for i, r in by_id.items() if r.outcome.value == "failed"}
    # the cancellation at arrival always lands before the request's first token; the error in the prefill too
    assert {0, 1, 12} <= failed
    assert all(by_id[i].num_output_tokens == 0 for i in (0, 1, 12))
    for i, n in ((5, 3), (9, 5)):  # mid-decode errors: the request got exactly n tokens (unless an OOM came first)
        r = by_id[i]
        assert r.outcome.value == "failed" and r.num_output_tokens <= n
        assert r.num_output_tokens == n or "out of memory" in r.reason
    oom = [r for r in requests if "out of memory" in r.reason]
    assert oom, "an injected out-of-memory step failed nobody"
    completed = [r for r in requests if r.outcome.value == "completed"]
    assert completed and all(r.num_output_tokens == r.output_len for r in completed)
    assert core.stats.num_failed == len(failed) and core.stats.num_preemptions > 0
    if mode == "swap":
        assert runner.num_blocks_swapped_out > 0
    # nothing leaks: device blocks, swap blocks, the runner's per-request state, the cache tensors
    kv = core.kv
    assert kv.num_free_blocks == kv.num_blocks == NUM_BLOCKS
    assert kv.num_free_cpu_blocks == kv.num_cpu_blocks and not kv.tables and not kv.cpu_tables
    assert runner.live_requests == set()
    assert runner.kv.num_free_cpu_blocks == kv.num_cpu_blocks
    assert cache_state(runner) == before
    assert not core.has_work and core.kv_tokens == 0 and core.filled_blocks == 0
    assert result.requests[0].outcome == "failed"


def test_survivors_generate_what_they_would_without_faults() -> None:
    """The faults change nobody else's tokens: greedy outputs of the requests that completed in both runs are
    the same (the model is deterministic; only the batching differs)."""
    tokens: dict[str, dict[int, list[int]]] = {"clean": {}, "faults": {}}
    # no out-of-memory step here: which requests it hits depends on the wall clock, and it could hit most of them
    no_oom = dataclasses.replace(PLAN, oom_steps=frozenset())
    for label, plan in (("clean", FailurePlan()), ("faults", no_oom)):
        runners: list = []

        def keep(runner, label=label, runners=runners):
            runners.append(runner)
            release = runner.release

            def recording_release(req_id: int) -> None:
                if req_id in runner._tokens:
                    tokens[label][req_id] = list(runner._tokens[req_id])
                release(req_id)

            runner.release = recording_release

        _, requests, _ = run_engine(config("recompute"), workload(), num_gpu_blocks=NUM_BLOCKS, failures=plan,
                                    on_runner=keep)
        tokens[label] = {i: t for i, t in tokens[label].items()
                         if next(r for r in requests if r.id == i).outcome.value == "completed"}
    both = set(tokens["clean"]) & set(tokens["faults"])
    assert len(both) >= 6  # 16 requests, 4 cancelled (some may finish first), 3 errors
    for i in both:
        assert tokens["clean"][i] == tokens["faults"][i], i


def test_failure_plan_draw_is_seeded_and_checked() -> None:
    specs = workload(40)
    a = FailurePlan.draw(specs, np.random.default_rng(1), cancel_fraction=0.25, cancel_after=(0.1, 0.5),
                         error_fraction=0.1, oom_steps=[4])
    b = FailurePlan.draw(specs, np.random.default_rng(1), cancel_fraction=0.25, cancel_after=(0.1, 0.5),
                         error_fraction=0.1, oom_steps=[4])
    assert a == b and len(a.cancel_after) == 10 and len(a.error_after) == 4 and a.oom_steps == {4}
    assert not set(a.cancel_after) & set(a.error_after)
    assert all(0.1 <= t <= 0.5 for t in a.cancel_after.values())
    outs = {s.id: s.output_len for s in specs}
    assert all(0 <= n < outs[i] for i, n in a.error_after.items())
    with pytest.raises(ValueError, match="cancel_fraction"):
        FailurePlan.draw(specs, np.random.default_rng(1), cancel_fraction=1.5)
    with pytest.raises(ValueError, match="cancel_after"):
        FailurePlan(cancel_after={1: -0.1})
