"""The serving loop's executor seam (sim/loop/executor.py) and what the loop does for every executor (torch-free).

- a cost model and the ``CostExecutor`` wrapping it give the very same run, fast path included;
- per-request errors (``FailurePlan.error_after``) fail each request in the step that would give it its next
  token, whatever the workload (a hypothesis property), and leave every block free (cores without the decode
  group only: the group advances its members in aggregate);
- a caller's limit halts the run at a step boundary: requests in flight fail, unsent ones are dropped;
- an executor's failed step (out of memory) fails every request of that step through the core;
- a scripted arrival source replaces the open loop.
The real engine's executor on the same loop: tests/test_realengine_engine.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costs.costmodel import CostModel
from sim.loop.executor import CostExecutor, Executor, as_executor
from sim.loop.results import result_of
from sim.loop.simulator import Simulation
from sim.policies import ContinuousPolicy, Limits
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import Batch, ServingCore
from sim.serving.failures import FailurePlan
from sim.serving.request import RequestSpec
from tests.conftest import ConstCost, LinearCost


def _core(num_blocks: int = 256, block_size: int = 4, record_plans: bool = True,
          fast_path: bool = True) -> ServingCore:
    return ServingCore(ContinuousPolicy(limits=Limits(8, 256, 64)), PagedBlockManager(num_blocks, block_size),
                       fast_path=fast_path, record_plans=record_plans, keep_token_times=True)


def _specs(n: int = 40, seed: int = 1) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.02, size=n))
    return [RequestSpec(id=i, arrival=float(arrivals[i]), prompt_len=int(rng.integers(4, 30)),
                        output_len=int(rng.integers(1, 30))) for i in range(n)]


def test_a_cost_model_is_wrapped_and_an_executor_is_kept() -> None:
    cost = LinearCost()
    ex = as_executor(cost)
    assert isinstance(ex, CostExecutor) and ex.cost is cost and ex.peak_flops == cost.peak_flops
    assert not isinstance(cost, Executor) and isinstance(ex, Executor)
    assert as_executor(ex) is ex


def test_cost_executor_gives_the_cost_models_run_fast_path_included() -> None:
    runs = []
    for wrap in (False, True):
        core = _core()
        cost: CostModel | CostExecutor = CostExecutor(LinearCost()) if wrap else LinearCost()
        sim = Simulation(_specs(), [(core, cost)])
        sim.run()
        runs.append((result_of("x", sim.requests, core, cost), core))
    (a, ca), (b, cb) = runs
    assert a.requests == b.requests and ca.plans == cb.plans
    for col in a.steps:
        assert np.array_equal(a.steps[col], b.steps[col]), col
    assert ca.group is not None  # the decode group (the fast path's state) was in use


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.dictionaries(st.integers(0, 19), st.integers(0, 35), max_size=8))
def test_errors_fail_each_request_at_its_token(seed: int, error_after: dict[int, int]) -> None:
    specs = _specs(20, seed)
    core = _core(num_blocks=48, fast_path=False)  # small enough to preempt now and then
    sim = Simulation(specs, [(core, LinearCost())], failures=FailurePlan(error_after=error_after))
    sim.run()
    for r in sim.requests:
        n = error_after.get(r.id)
        if n is not None and n < r.output_len:
            assert r.outcome is not None and r.outcome.value == "failed", r.id
            assert r.num_output_tokens == n and r.reason == f"injected error after {n} output tokens"
        else:
            assert r.outcome is not None and r.outcome.value == "completed", r.id
            assert r.num_output_tokens == r.output_len
    assert core.kv.num_free_blocks == core.kv.num_blocks and not core.has_work
    assert core.stats.num_failed == sum(1 for i, n in error_after.items() if n < specs[i].output_len)


def test_errors_need_the_per_request_core() -> None:
    with pytest.raises(ValueError, match="fast_path=False"):
        Simulation(_specs(), [(_core(), LinearCost())], failures=FailurePlan(error_after={0: 1}))


def test_limit_halts_at_a_step_boundary() -> None:
    # steps of 0.7 s back to back from 0.25 s; a request every second, each 10 tokens long: none finishes by 3 s
    specs = [RequestSpec(id=i, arrival=i + 0.25, prompt_len=4, output_len=10) for i in range(10)]
    core = _core()
    sim: Simulation

    def limit() -> str | None:
        return "out of time" if sim.env.now >= 3.0 else None

    sim = Simulation(specs, [(core, ConstCost(0.7))], fast_forward=False, limit=limit)
    sim.run()
    end = 0.25 + 0.7 + 0.7 + 0.7 + 0.7  # the fourth step's end: the first boundary at or after 3 s
    assert sim.halted == "out of time" and sim.env.now == end
    assert [r.id for r in sim.requests] == [0, 1, 2]  # the ones of 3.25 s and later were never sent
    assert all(r.outcome is not None and r.outcome.value == "failed" and r.reason == "out of time"
               for r in sim.requests)
    assert all(r.finish == end for r in sim.requests)
    assert core.kv.num_free_blocks == core.kv.num_blocks and not core.has_work


class OneFailedStep:
    """A priced executor whose step ``k`` runs out of memory (as the engine reports it)."""

    cost = None  # a measured-style executor: no fast path
    peak_flops = 0.0

    def __init__(self, k: int) -> None:
        self.k = k
        self.steps = 0
        self.failure: str | None = None
        self.resumed = 0

    def resume(self) -> None:
        self.resumed += 1

    def execute(self, batch: Batch) -> float:
        self.failure = "no room" if self.steps == self.k else None
        self.steps += 1
        return 0.01

    def step_flops(self, batch: Batch) -> float:
        return 0.0


def test_a_failed_step_fails_every_request_in_it() -> None:
    specs = [RequestSpec(id=i, arrival=0.0, prompt_len=4, output_len=5) for i in range(3)]
    specs.append(RequestSpec(id=3, arrival=1.0, prompt_len=4, output_len=5))  # after the failure: unaffected
    ex = OneFailedStep(2)
    core = _core()
    sim = Simulation(specs, [(core, ex)])
    sim.run()
    by_id = {r.id: r for r in sim.requests}
    for i in range(3):  # in the batch of step 2 (their third token): failed there, two tokens each
        r = by_id[i]
        assert r.outcome is not None and r.outcome.value == "failed"
        assert r.reason == "out of memory: no room" and r.num_output_tokens == 2 and r.finish == 0.03
    assert by_id[3].outcome is not None and by_id[3].outcome.value == "completed"
    assert core.kv.num_free_blocks == core.kv.num_blocks
    assert ex.resumed >= ex.steps  # the loop resumes the step clock before every step


def test_scripted_arrival_source() -> None:
    specs = [RequestSpec(id=i, arrival=0.0, prompt_len=4, output_len=3) for i in range(3)]

    def source(sim: Simulation):
        for spec, t in zip(specs, (0.25, 0.5, 3.0), strict=True):
            yield sim.env.timeout(t - sim.env.now)
            sim.send(spec)
        sim.close_arrivals()

    core = _core()
    sim = Simulation(specs, [(core, ConstCost(0.1))], arrivals=source)
    sim.run()
    assert [r.arrival for r in sim.requests] == [0.25, 0.5, 3.0]
    assert all(r.outcome is not None and r.outcome.value == "completed" for r in sim.requests)
