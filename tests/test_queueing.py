"""The simulator against queueing theory where the theory is exact: M/D/1.

Every request has output_len 1 (its single step computes the prompt and samples its only token), every step takes
the same D seconds whatever its shape, and at most one request is in a step (max_num_seqs=1). A request that
arrives while a step runs waits for it to end; steps start only when the server is free and take the oldest
waiting request first. With Poisson arrivals this is exactly an M/D/1 FCFS queue, whose mean waiting time is
Pollaczek-Khinchine's Wq = rho * D / (2 * (1 - rho)), and whose server is busy a fraction rho of the time.

Statistics: 20 seeds x 4,000 requests per load, the first 500 of each seed discarded (the queue starts empty).
Measured spread of the per-seed mean wait: standard error of the 20-seed mean 1.6% of Wq at rho = 0.5 and 2.9% at
rho = 0.8 (long busy periods correlate neighbouring waits). The tolerances, 5% and 8%, are about three standard
errors; each test also checks that the spread it measures is still small enough for its tolerance to mean that.
The sample path itself is checked exactly: start times follow Lindley's recursion to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

from sim.policies import ContinuousPolicy, Limits
from sim.serving.block_manager import PagedBlockManager
from sim.serving.request import RequestSpec
from tests.conftest import ConstCost, simulate

D = 0.05  # seconds per step
SEEDS = range(20)
N = 4000
WARMUP = 500
LOADS = {0.5: 0.05, 0.8: 0.08}  # rho -> relative tolerance on the mean wait


@dataclass(frozen=True)
class Seed:
    arrival: np.ndarray  # as the simulator recorded them, in id order
    start: np.ndarray  # first_scheduled
    first_token: np.ndarray
    finish: np.ndarray
    step_start: np.ndarray
    step_duration: np.ndarray
    batch_size: np.ndarray


@cache
def md1(rho: float) -> tuple[Seed, ...]:
    out = []
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(D / rho, N))  # Poisson at rate rho / D
        specs = [RequestSpec(i, float(a), 8, 1) for i, a in enumerate(arrivals)]
        policy = ContinuousPolicy(limits=Limits(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64))
        run = simulate(specs, policy, PagedBlockManager(64, 16), cost=ConstCost(D), keep_token_times=False,
                       record_plans=False)
        reqs = sorted(run.sim.requests, key=lambda r: r.id)
        assert all(r.outcome.value == "completed" for r in reqs)
        s = run.result.steps
        out.append(
            Seed(
                arrival=np.array([r.arrival for r in reqs]),
                start=np.array([r.first_scheduled for r in reqs]),
                first_token=np.array([r.first_token for r in reqs]),
                finish=np.array([r.finish for r in reqs]),
                step_start=s["start"],
                step_duration=s["duration"],
                batch_size=s["batch_size"],
            )
        )
    return tuple(out)


def per_seed(rho: float, f) -> np.ndarray:
    return np.array([f(s) for s in md1(rho)])


@pytest.mark.slow
@pytest.mark.parametrize("rho", list(LOADS))
def test_md1_sample_path_is_lindley(rho: float) -> None:
    """One request per step, each step D long, started at max(arrival, end of the previous step): exactly."""
    for s in md1(rho):
        assert len(s.step_start) == N and np.all(s.batch_size == 1)
        assert np.all(np.abs(s.step_duration - D) < 1e-12)
        assert np.all(np.diff(s.arrival) > 0)
        expected = np.empty(N)
        free_at = 0.0
        for i, a in enumerate(s.arrival.tolist()):  # the recursion, with the simulator's own float operations
            expected[i] = a if a > free_at else free_at
            free_at = expected[i] + D
        np.testing.assert_array_equal(s.start, expected)
        np.testing.assert_array_equal(s.step_start, expected)  # FCFS: steps serve requests in arrival order
        np.testing.assert_array_equal(s.first_token, expected + D)
        np.testing.assert_array_equal(s.finish, s.first_token)


@pytest.mark.slow
@pytest.mark.parametrize("rho, tol", list(LOADS.items()))
def test_md1_mean_wait_is_pollaczek_khinchine(rho: float, tol: float) -> None:
    wq = rho * D / (2 * (1 - rho))
    means = per_seed(rho, lambda s: np.mean((s.start - s.arrival)[WARMUP:]))
    se = means.std(ddof=1) / np.sqrt(len(means))
    assert se < tol * wq / 2.5  # the tolerance is at least 2.5 standard errors of what is measured
    assert abs(means.mean() - wq) <= tol * wq, (means.mean(), wq, se)


@pytest.mark.slow
@pytest.mark.parametrize("rho, tol", list(LOADS.items()))
def test_md1_ttft_is_wait_plus_service(rho: float, tol: float) -> None:
    wq = rho * D / (2 * (1 - rho))
    ttft = per_seed(rho, lambda s: np.mean((s.first_token - s.arrival)[WARMUP:]))
    assert abs(ttft.mean() - (wq + D)) <= tol * wq
    for s in md1(rho):  # per request: TTFT = wait + D (up to the rounding of the subtractions)
        np.testing.assert_allclose(s.first_token - s.arrival, s.start - s.arrival + D, rtol=0, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("rho", list(LOADS))
def test_md1_server_busy_fraction_is_rho(rho: float) -> None:
    busy = per_seed(rho, lambda s: s.step_duration.sum() / (s.finish[-1] - s.arrival[0]))
    assert np.all((busy > 0) & (busy <= 1))
    se = busy.std(ddof=1) / np.sqrt(len(busy))
    assert se < 0.008 * rho  # measured: about 0.4% of rho; the tolerance is 2.5 of these or more
    assert abs(busy.mean() - rho) <= 0.02 * rho, (busy.mean(), se)
