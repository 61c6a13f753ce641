"""The simulator fed a real engine's measured step durations: the parity check between the two.

The real engine (``realengine.engine``) runs the simulator's own loop, serving core and policy, with an executor
that runs the model; a step lasts what it measurably took. Fed those durations in order, with each request
arriving when the engine admitted it, the simulator must make the engine's every plan, step and per-request time:
a scheduling decision depends only on what arrived before the step's start, and the clock is start + duration,
step by step. ``replay`` runs the simulator so; ``compare`` lists where it parts from the engine (nothing, when
the policy is deterministic). Torch-free: the engine's records are all it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from sim.costs.costmodel import CostModel, StepShape
from sim.loop.build import build
from sim.loop.results import seeded_global_rngs
from sim.loop.simulator import Simulation
from sim.metrics.records import RunResult
from sim.serving.core import ServingCore
from sim.serving.failures import FailurePlan
from sim.serving.request import Request
from sim.words import counted

# the per-step columns that must be equal exactly (start and duration: to TIME_TOLERANCE)
STEP_COLUMNS = ("batch_size", "prefill_tokens", "decode_tokens", "kv_blocks_used", "kv_tokens", "num_running",
                "num_waiting", "num_swapped", "num_preempted", "swap_blocks")
TIME_TOLERANCE = 1e-9  # seconds: the same sums of the same floats, in the same order


class MeasuredDurations(CostModel):
    """A cost model that returns an engine's measured step durations, in order."""

    def __init__(self, durations: Sequence[float] | np.ndarray) -> None:
        self.durations = [float(d) for d in durations]
        self.used = 0

    @property
    def peak_flops(self) -> float:
        return 0.0

    def step_time(self, shape: StepShape) -> float:
        # past the engine's last step (a replay that parted from it): zero-length steps, so that the replay still
        # ends and ``compare`` can say how many more steps it took
        d = self.durations[self.used] if self.used < len(self.durations) else 0.0
        self.used += 1
        return d

    def step_flops(self, shape: StepShape) -> float:
        return 0.0


def replay(engine_cfg: Any, result: RunResult, requests: Sequence[Request], failures: FailurePlan | None = None
           ) -> tuple[Simulation, ServingCore, MeasuredDurations]:
    """The simulator with the policy and KV manager built from the config the engine ran (``realengine.engine.
    engine_config``: its model, block count and swap space), fed ``result``'s step durations (as steps.csv has
    them, so its clock lands on the engine's step ends) and the requests at the times the engine admitted them;
    ``failures``: the timed failures the engine took (a scenario's ``workload.failures``, on the engine's clock)."""
    # the draws the engine's run made (run_engine), its policy's constructor's included
    with seeded_global_rngs(getattr(engine_cfg, "seed", 0)):
        policy, kv, _, _ = build(engine_cfg)
        core = ServingCore(policy, kv, fast_path=False, record_plans=True)
        cost = MeasuredDurations(result.steps["duration"])
        specs = [replace(r.spec, arrival=r.arrival) for r in requests]
        sim = Simulation(specs, [(core, cost)], fast_forward=False, failures=failures,
                         leak=engine_cfg.deployment.leak_kv_on_failure)
        sim.run()
    return sim, core, cost


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= TIME_TOLERANCE


def compare(engine_core: ServingCore, requests: Sequence[Request], sim: Simulation, sim_core: ServingCore,
            cost: MeasuredDurations) -> list[str]:
    """Where the replay parts from the engine, one line each; empty when it reproduces the engine's schedule:
    every duration used, the same plans (recorded by both cores), counters, step columns, clock, and per request
    the same preemptions, output tokens, outcome, first-token and finish times."""
    out: list[str] = []
    if cost.used != len(cost.durations):
        out.append(f"the replay took {cost.used} steps, the engine {len(cost.durations)}")
    a, b = sim_core.plans or [], engine_core.plans or []
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is not None or len(a) != len(b):
        i = first if first is not None else min(len(a), len(b))
        out.append(f"plans part at step {i}: simulator {a[i] if i < len(a) else None}, engine "
                   f"{b[i] if i < len(b) else None}")
    if sim_core.stats != engine_core.stats:
        out.append(f"counters differ: simulator {sim_core.stats}, engine {engine_core.stats}")
    sa, sb = sim_core.steps.columns(), engine_core.steps.columns()
    for col in STEP_COLUMNS:
        if not np.array_equal(sa[col], sb[col]):
            out.append(f"step column {col} differs")
    for col in ("start", "duration"):
        if len(sa[col]) != len(sb[col]) or not np.allclose(sa[col], sb[col], rtol=0, atol=TIME_TOLERANCE):
            out.append(f"step column {col} differs by more than {TIME_TOLERANCE} s")
    eng = {r.id: r for r in requests}
    for r in sim.requests:
        e = eng.get(r.id)
        if e is None:
            out.append(f"request {r.id} ran in the replay only")
        elif (r.num_preemptions, r.num_output_tokens, r.outcome) != (e.num_preemptions, e.num_output_tokens,
                                                                    e.outcome):
            out.append(f"request {r.id}: simulator {counted(r.num_preemptions, 'preemption')}, "
                       f"{counted(r.num_output_tokens, 'token')}, {r.outcome}; engine {e.num_preemptions}, "
                       f"{e.num_output_tokens}, {e.outcome}")
        elif not (_close(r.first_token, e.first_token) and _close(r.finish, e.finish)):
            out.append(f"request {r.id}: first token {r.first_token} / finish {r.finish} in the simulator, "
                       f"{e.first_token} / {e.finish} on the engine")
    if len(sim.requests) != len(requests):
        out.append(f"{len(sim.requests)} requests in the replay, {len(requests)} on the engine")
    return out
