"""Routers on the public router API (sim.policies.routers_public, issue 37 item 1): power of two choices (seeded),
llm-d's weighted cache/load scorers, and an SLO-aware router; each from a scenario."""

from __future__ import annotations

import numpy as np
import pytest

from sim.policies.api import RequestView
from sim.policies.gates import ReplicaView
from sim.policies.routers_public import CacheLoadScorer, PowerOfTwoChoices, SLOAwareRouter
from sim.request import Request, RequestSpec


def _req(prompt: int = 1000, ttft_slo: float | None = None) -> RequestView:
    return RequestView(Request(RequestSpec(0, 0.0, prompt, 10, ttft_slo=ttft_slo), 0.0))


def _rep(i: int, waiting: int = 0, running: int = 0, free: int = 100, cached: int = 0) -> ReplicaView:
    return ReplicaView(i, waiting, running, 0, free, 100, cached)


def test_power_of_two_takes_the_less_loaded_of_two_seeded_draws() -> None:
    reps = [_rep(i, waiting=w) for i, w in enumerate([5, 0, 9, 3, 7, 1])]
    a, b = PowerOfTwoChoices(seed=3), PowerOfTwoChoices(seed=3)
    picks = [a.route(_req(), reps) for _ in range(200)]
    assert picks == [b.route(_req(), reps) for _ in range(200)]  # seeded: the very same choices
    assert picks != [PowerOfTwoChoices(seed=4).route(_req(), reps) for _ in range(200)]
    rng = np.random.default_rng(3)  # the draws it makes: the less loaded of each pair
    for p in picks:
        i, j = rng.choice(6, size=2, replace=False)
        assert p == min((reps[i], reps[j]), key=lambda r: r.num_waiting).index
    assert 2 not in picks  # the most loaded replica is never the less loaded of a pair
    assert PowerOfTwoChoices().route(_req(), [_rep(0)]) == 0


def test_cache_load_scorer_weighs_cache_against_load() -> None:
    reps = [_rep(0, waiting=8, free=20, cached=900), _rep(1, waiting=0, free=90, cached=0),
            _rep(2, waiting=4, free=50, cached=500)]
    req = _req(1000)
    s = CacheLoadScorer(prefix_weight=2, queue_weight=1, kv_weight=1).scores(req, reps)
    assert s == pytest.approx([2 * 0.9 + 0 + 0.2, 0 + 1 + 0.9, 2 * 0.5 + 0.5 + 0.5])
    assert CacheLoadScorer(prefix_weight=2).route(req, reps) == 0  # 2.0 beats 1.9 and 2.0 (tie: lower index)
    assert CacheLoadScorer(prefix_weight=0).route(req, reps) == 1  # load only: the empty replica
    assert CacheLoadScorer(prefix_weight=5, queue_weight=0, kv_weight=0).route(req, reps) == 0
    with pytest.raises(ValueError, match="all 0"):
        CacheLoadScorer(0, 0, 0)
    with pytest.raises(ValueError, match="queue_weight"):
        CacheLoadScorer(queue_weight=-1)


def test_slo_aware_router_prefers_a_replica_that_meets_the_slo() -> None:
    r = SLOAwareRouter(prefill_tokens_per_s=1000)
    # predicted TTFT: (waiting x 1,000 (mean prompt: the request's own until it has routed one) + uncached) / 1000
    reps = [_rep(0, waiting=3, cached=1000), _rep(1, waiting=1), _rep(2, waiting=0, cached=200)]
    req = _req(1000, ttft_slo=2.5)
    assert [r.predicted_ttft(req, x) for x in reps] == [3.0, 2.0, 0.8]
    assert r.route(req, reps) == 2  # meets 2.5 s on replicas 1 and 2; 2 holds more of the prompt
    tight = _req(1000, ttft_slo=0.1)  # nobody meets it: the fastest
    assert r.route(tight, reps) == 2
    loose = _req(1000, ttft_slo=10.0)  # all meet it: the one holding the prompt
    assert r.route(loose, reps) == 0
    assert r.route(_req(1000), reps) == 2  # no SLO: the fastest
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        SLOAwareRouter(prefill_tokens_per_s=0)


@pytest.mark.parametrize("router", [{"type": "power_of_two", "seed": 1}, {"type": "cache_load_score"},
                                    {"type": "slo_aware", "prefill_tokens_per_s": 20000}])
def test_each_router_runs_from_a_scenario(router: dict) -> None:
    from collections import Counter

    from sim.run import generate_workload, simulate_variant
    from sim.scenario import parse_scenario, variant_configs

    raw = {"seed": 1,
           "workload": {"arrival": {"type": "poisson", "rate": 40.0}, "num_requests": 150,
                        "prompt_len": {"type": "uniform", "min": 20, "max": 400},
                        "output_len": {"type": "uniform", "min": 2, "max": 80}},
           "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
           "cluster": {"replicas": 3, "router": router}}
    sc = parse_scenario(raw)
    (cfg,) = variant_configs(sc)
    res, reqs, _ = simulate_variant(cfg, generate_workload(sc))
    assert res.cluster["router"] == router["type"]
    assert all(r.outcome == "completed" for r in reqs)
    per = Counter(r.replica for r in reqs)
    assert len(per) == 3 and min(per.values()) > 10, per  # each router spreads the load
