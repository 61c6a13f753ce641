"""Workload models: statistics of every arrival process and length distribution, trace replay, determinism.

Statistical checks use one seed and 100,000 draws of the model's own sampler (building 100,000 RequestSpecs per
check would make the file slow); each tolerance is about four standard errors or more. End-to-end checks of
``Workload.generate`` use fewer requests.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from sim.workload.arrivals import UniformThinkTime
from sim.workload.generator import PREFIX_HASH_BLOCK_SIZE, GeneratedWorkload, Workload
from sim.workload.lengths import LengthDistribution
from sim.workload.traces import load_trace

N = 100_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def workload(arrival: dict[str, Any], n: int | None = N, prompt: Any = None, output: Any = None, **kw: Any) -> Workload:
    spec: dict[str, Any] = {"arrival": arrival, **kw}
    if n is not None:
        spec["num_requests"] = n
    if prompt is not None:
        spec["prompt_len"] = prompt
    if output is not None:
        spec["output_len"] = output
    if arrival["type"] != "trace":
        spec.setdefault("prompt_len", {"type": "fixed", "value": 10})
        spec.setdefault("output_len", {"type": "fixed", "value": 5})
    return Workload.model_validate(spec)


def arrivals(w: GeneratedWorkload) -> np.ndarray:
    return np.array([r.arrival for r in w.requests])


def lengths(dist: dict[str, Any], n: int = N, seed: int = 0) -> np.ndarray:
    x = TypeAdapter(LengthDistribution).validate_python(dist).sample(rng(seed), n)
    assert x.dtype == np.int64 and x.shape == (n,) and x.min() >= 1
    return x


def times(arrival: dict[str, Any], n: int = N) -> np.ndarray:
    return workload(arrival, n).arrival.times(rng(), n)


def test_generate_uses_the_arrival_sampler() -> None:
    for arrival in ({"type": "poisson", "rate": 3.0}, {"type": "gamma", "rate": 3.0, "cv": 4.0}):
        w = workload(arrival, n=2000).generate(rng())
        t = workload(arrival, n=2000).arrival.times(rng().spawn(1)[0], 2000)  # the first child stream
        np.testing.assert_array_equal(arrivals(w), t)


# ---------------------------------------------------------------------------------------------------------------
# Arrival processes.


def test_poisson_rate_and_cv() -> None:
    t = times({"type": "poisson", "rate": 10.0})
    gaps = np.diff(t, prepend=0.0)
    assert N / t[-1] == pytest.approx(10.0, rel=0.015)  # standard error 0.3 %
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_rate_and_cv(cv: float) -> None:
    t = times({"type": "gamma", "rate": 5.0, "cv": cv})
    gaps = np.diff(t, prepend=0.0)
    assert N / t[-1] == pytest.approx(5.0, rel=0.04)  # standard error cv/sqrt(N) <= 1 %
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


@pytest.mark.parametrize("cv", [1e155, 1e-155, 1e300, 1e-200])
def test_gamma_cv_past_a_float_shape_is_refused(cv: float) -> None:
    # Before: cv 1e155 overflowed cv**2 (OverflowError traceback), 1e-200 divided by zero (ZeroDivisionError) and
    # 1e-155 made the shape inf, so every gap was nan and all requests arrived at time 0 with exit 0.
    with pytest.raises(ValidationError, match="cv"):
        workload({"type": "gamma", "rate": 1.0, "cv": cv}, n=10)


@pytest.mark.parametrize("cv", [1e-6, 1e6])
def test_gamma_cv_at_its_bounds_runs(cv: float) -> None:
    t = times({"type": "gamma", "rate": 2.0, "cv": cv}, n=10)
    assert np.isfinite(t).all()
    if cv < 1:  # shape 1e12: a clock of 0.5 s gaps
        np.testing.assert_allclose(np.diff(t, prepend=0.0), 0.5, rtol=1e-4)


def test_constant_and_all_at_once_are_exact() -> None:
    t = arrivals(workload({"type": "constant", "rate": 4.0}, n=1000).generate(rng()))
    np.testing.assert_array_equal(t, np.arange(1, 1001) / 4.0)
    t = arrivals(workload({"type": "all_at_once"}, n=1000).generate(rng()))
    assert np.all(t == 0.0)


def test_closed_loop_users_and_think_times() -> None:
    n = 20_000
    w = workload(
        {"type": "closed_loop", "num_users": 7, "think_time": {"type": "exponential", "mean": 2.0}}, n=n
    ).generate(rng())
    assert w.closed_loop is not None and w.closed_loop.num_users == 7
    assert [r.session_id for r in w.requests] == [i % 7 for i in range(n)]
    assert all(r.arrival == 0.0 for r in w.requests)
    assert w.closed_loop.think_times.shape == (n,)
    assert w.closed_loop.think_times.mean() == pytest.approx(2.0, rel=0.03)  # standard error 0.7 %
    fixed = workload({"type": "closed_loop", "num_users": 2}, n=10).generate(rng())
    assert fixed.closed_loop is not None and np.all(fixed.closed_loop.think_times == 0.0)
    assert workload({"type": "poisson", "rate": 1.0}, n=10).generate(rng()).closed_loop is None


def test_a_think_time_in_seconds_is_a_fixed_pause() -> None:
    """``think_time: 1.5`` (the field is described as a pause in seconds, and the run prints "think time 0 s") was
    refused with "expected a mapping of keys to values (got 1.5)"; a bare number is now {type: fixed, value: N}."""
    from sim.config.scenario import parse_scenario
    from sim.config.schema import ScenarioError

    def arrival(think: Any) -> dict:
        return {"type": "closed_loop", "num_users": 2, "think_time": think}

    bare = workload(arrival(1.5), n=10)
    assert bare == workload(arrival({"type": "fixed", "value": 1.5}), n=10)
    assert np.all(bare.generate(rng()).closed_loop.think_times == 1.5)
    assert "think time 1.5 s" in bare.describe()
    raw = {"workload": {"arrival": arrival(1.5), "num_requests": 4, "prompt_len": {"type": "fixed", "value": 8},
                        "output_len": {"type": "fixed", "value": 4}}, "deployment": {"model": "tiny", "gpu": "l4"}}
    assert parse_scenario(raw).workload.arrival == bare.arrival
    # neither a number nor a mapping: the message names both forms (it said "expected a mapping" alone)
    either = "expected a number of seconds (>= 0) or a distribution {type: fixed | exponential | uniform | lognormal"
    for bad, needle in ((-1, "workload.arrival.think_time.value: must be greater than or equal to 0"),
                        (True, f"workload.arrival.think_time: {either}"), ("1.5", f"think_time: {either}"),
                        ([1.5], f"think_time: {either}")):
        raw["workload"]["arrival"] = arrival(bad)
        with pytest.raises(ScenarioError, match=re.escape(needle)):
            parse_scenario(raw)


@pytest.mark.parametrize(
    ("arrival", "named"),
    [
        ({"type": "poisson", "rate": 1e-300}, "poisson 1e-300 req/s: the last of 10 requests arrives at"),
        ({"type": "constant", "rate": 1e-9}, "constant 1e-09 req/s: the last of 10 requests arrives at 1e+10 s"),
        ({"type": "closed_loop", "num_users": 2, "think_time": {"type": "fixed", "value": 1e300}},
         "think times add up to 5e+300 s"),
        # Before: a zero gamma draw times an infinite scale made every gap nan, and all 10 requests ran at time 0.
        ({"type": "gamma", "rate": 1e-300, "cv": 1e6}, "cv 1e+06: the last of 10 requests arrives at no finite time"),
    ],
)
def test_arrivals_past_the_clock_s_resolution_are_refused(arrival: dict[str, Any], named: str) -> None:
    # Before: arrivals near 1e300 s swallowed every step time, and each request ran with TTFT 0.0 (exit 0).
    with pytest.raises(ValueError, match="past the 1e\\+09 s a run may span") as e:
        workload(arrival, n=10).generate(rng())
    assert named in str(e.value)
    assert workload({"type": "constant", "rate": 1e-8}, n=10).generate(rng()).requests[-1].arrival == 1e9


def test_requests_sorted_with_dense_ids() -> None:
    for arrival in ({"type": "poisson", "rate": 3.0}, {"type": "gamma", "rate": 3.0, "cv": 4.0}):
        w = workload(arrival, n=5000).generate(rng())
        assert [r.id for r in w.requests] == list(range(5000))
        assert np.all(np.diff(arrivals(w)) >= 0)


# ---------------------------------------------------------------------------------------------------------------
# Length distributions.


def test_fixed_and_uniform() -> None:
    assert set(lengths({"type": "fixed", "value": 77}, n=100).tolist()) == {77}
    x = lengths({"type": "uniform", "min": 3, "max": 9})
    assert set(x.tolist()) == set(range(3, 10))  # both ends included, every value drawn
    assert x.mean() == pytest.approx(6.0, abs=0.03)


def test_every_distribution_names_its_bounds_min_and_max() -> None:
    """uniform takes min/max like normal, lognormal and exponential; its older low/high still read the same."""
    bounded = {"type": "uniform", "min": 3, "max": 9}
    assert np.array_equal(lengths(bounded), lengths({"type": "uniform", "low": 3, "high": 9}))
    for spec in ({"type": "normal", "mean": 6, "std": 9}, {"type": "lognormal", "mean": 6, "std": 9},
                 {"type": "exponential", "mean": 6}, {"type": "uniform"}):
        x = lengths({**spec, "min": 3, "max": 9})
        assert x.min() >= 3 and x.max() <= 9, spec
    with pytest.raises(ValueError, match="give min or low"):
        lengths({"type": "uniform", "low": 3, "min": 4, "max": 9})
    think = TypeAdapter(UniformThinkTime)
    assert think.validate_python({"type": "uniform", "low": 0.5, "high": 2}) == think.validate_python(
        {"type": "uniform", "min": 0.5, "max": 2})


def test_normal_is_clipped() -> None:
    x = lengths({"type": "normal", "mean": 500, "std": 200, "min": 300, "max": 600})
    assert x.min() == 300 and x.max() == 600
    x = lengths({"type": "normal", "mean": 500, "std": 50})
    assert x.mean() == pytest.approx(500, abs=1.0)
    assert x.std() == pytest.approx(50, rel=0.02)
    assert lengths({"type": "normal", "mean": 5, "std": 50}).min() == 1  # min defaults to 1


def test_lognormal_mean_std_and_clipping() -> None:
    x = lengths({"type": "lognormal", "mean": 1000, "std": 500})
    assert x.mean() == pytest.approx(1000, rel=0.01)
    assert x.std() == pytest.approx(500, rel=0.05)
    x = lengths({"type": "lognormal", "mean": 1000, "std": 500, "min": 400, "max": 2000})
    assert x.min() == 400 and x.max() == 2000


def test_exponential_cap() -> None:
    x = lengths({"type": "exponential", "mean": 200, "max": 300})
    assert x.max() == 300 and x.min() >= 1
    assert (x == 300).mean() == pytest.approx(np.exp(-300.5 / 200), abs=0.01)  # the tail piles on the cap
    x = lengths({"type": "exponential", "mean": 200})
    assert x.mean() == pytest.approx(200, rel=0.02)
    assert lengths({"type": "exponential", "mean": 200, "min": 50}).min() == 50


def test_empirical_draws_only_trace_values() -> None:
    trace = load_trace("azure-code")
    for column, values in (("prompt", trace.prompt_len), ("output", trace.output_len)):
        x = lengths({"type": "empirical", "trace": "azure-code", "column": column}, n=20_000)
        assert set(x.tolist()) <= set(values.tolist())
        assert x.mean() == pytest.approx(values.mean(), rel=0.05)


# ---------------------------------------------------------------------------------------------------------------
# Trace replay.


def test_trace_replays_pairs_and_arrivals() -> None:
    full = load_trace("azure-conv")
    w = workload({"type": "trace", "trace": "azure-conv"}, n=None).generate(rng())
    assert len(w) == len(full) == 19366
    np.testing.assert_array_equal(arrivals(w), full.arrival)
    np.testing.assert_array_equal([r.prompt_len for r in w.requests], full.prompt_len)
    np.testing.assert_array_equal([r.output_len for r in w.requests], full.output_len)
    assert all(r.hash_ids == () for r in w.requests[:100])


def test_trace_num_requests_repeat_and_overrides() -> None:
    arrival = {"type": "trace", "trace": "azure-conv", "end": 60.0, "rate_scale": 3.0, "repeat_to": 2000}
    w = workload(arrival, n=1500).generate(rng())
    t = load_trace("azure-conv", end=60.0, rate_scale=3.0, repeat_to=2000)
    assert len(w) == 1500
    np.testing.assert_array_equal(arrivals(w), t.arrival[:1500])
    with pytest.raises(ValueError, match="fewer than num_requests"):
        workload({"type": "trace", "trace": "azure-conv", "end": 60.0}, n=5000).generate(rng())
    # a window of one request said "holds 1 requests"
    with pytest.raises(ValueError, match=r"holds 1 request, fewer than num_requests=5 "):
        workload({"type": "trace", "trace": "azure-conv", "end": 1.0}, n=5).generate(rng())
    # Overriding one length keeps the arrivals and the other length.
    o = workload(arrival, n=1500, output={"type": "fixed", "value": 3}).generate(rng())
    np.testing.assert_array_equal(arrivals(o), arrivals(w))
    assert [r.prompt_len for r in o.requests] == [r.prompt_len for r in w.requests]
    assert {r.output_len for r in o.requests} == {3}


def test_mooncake_fills_hash_ids() -> None:
    w = workload({"type": "trace", "trace": "mooncake"}, n=500).generate(rng())
    t = load_trace("mooncake", max_requests=500)
    assert t.hash_ids is not None
    assert [r.hash_ids for r in w.requests] == t.hash_ids
    assert {r.hash_block_size for r in w.requests} == {512}
    # Replacing the prompts drops the ids (they describe the trace's prompts).
    p = workload({"type": "trace", "trace": "mooncake"}, n=500, prompt={"type": "fixed", "value": 100}).generate(rng())
    assert all(r.hash_ids == () for r in p.requests)
    with pytest.raises(ValueError, match="shared_prefix"):
        workload({"type": "trace", "trace": "mooncake"}, n=10, shared_prefix=100).generate(rng())


def test_shared_prefix() -> None:
    w = workload({"type": "poisson", "rate": 1.0}, n=100, prompt={"type": "uniform", "low": 1, "high": 50},
                 shared_prefix=100).generate(rng())
    base = workload({"type": "poisson", "rate": 1.0}, n=100, prompt={"type": "uniform", "low": 1, "high": 50}
                    ).generate(rng())
    assert [r.prompt_len for r in w.requests] == [r.prompt_len + 100 for r in base.requests]
    assert {r.hash_ids for r in w.requests} == {tuple(range(100 // PREFIX_HASH_BLOCK_SIZE))}
    assert {r.hash_block_size for r in w.requests} == {PREFIX_HASH_BLOCK_SIZE}


# ---------------------------------------------------------------------------------------------------------------
# Determinism and stream independence.


def test_same_seed_same_workload_and_independent_streams() -> None:
    w = workload({"type": "gamma", "rate": 2.0, "cv": 2.0}, n=1000,
                 prompt={"type": "lognormal", "mean": 100, "std": 50},
                 output={"type": "exponential", "mean": 30})
    assert w.generate(rng(7)).requests == w.generate(rng(7)).requests
    assert w.generate(rng(7)).requests != w.generate(rng(8)).requests
    a = w.generate(rng(7)).requests
    other_prompt = w.model_copy(update={"prompt_len": Workload.model_validate(
        {"arrival": {"type": "all_at_once"}, "num_requests": 1,
         "prompt_len": {"type": "uniform", "low": 1, "high": 9}, "output_len": {"type": "fixed", "value": 1}}
    ).prompt_len})
    b = other_prompt.generate(rng(7)).requests
    assert [r.arrival for r in a] == [r.arrival for r in b]
    assert [r.output_len for r in a] == [r.output_len for r in b]
    assert [r.prompt_len for r in a] != [r.prompt_len for r in b]
    other_rate = w.model_copy(update={"arrival": Workload.model_validate(
        {"arrival": {"type": "poisson", "rate": 9.0}, "num_requests": 1,
         "prompt_len": {"type": "fixed", "value": 1}, "output_len": {"type": "fixed", "value": 1}}
    ).arrival})
    c = other_rate.generate(rng(7)).requests
    assert [(r.prompt_len, r.output_len) for r in a] == [(r.prompt_len, r.output_len) for r in c]


# ---------------------------------------------------------------------------------------------------------------
# Validation, schema and description.


@pytest.mark.parametrize(
    "spec",
    [
        {"arrival": {"type": "poisson", "rate": 0}},
        {"arrival": {"type": "poisson", "rate": float("inf")}},
        {"arrival": {"type": "gamma", "rate": 1, "cv": 0}},
        {"arrival": {"type": "poisson", "rate": 1, "burst": 2}},  # extra field
        {"arrival": {"type": "weibull", "rate": 1}},
        {"arrival": {"type": "closed_loop", "num_users": 0}},
        {"arrival": {"type": "closed_loop", "num_users": 1, "think_time": {"type": "fixed", "value": -1}}},
        {"arrival": {"type": "trace", "trace": "azure-conv", "start": 10, "end": 5}},
        {"arrival": {"type": "trace", "trace": "azure-conv", "time_scale": 0}},
        {"prompt_len": {"type": "uniform", "low": 9, "high": 3}},
        {"prompt_len": {"type": "normal", "mean": 10, "std": 1, "min": 20, "max": 10}},
        {"prompt_len": {"type": "lognormal", "mean": 10, "std": 0}},
        {"prompt_len": {"type": "exponential", "mean": 10, "max": 0}},
        {"prompt_len": {"type": "fixed", "value": 0}},
        {"prompt_len": {"type": "empirical", "trace": "azure-conv", "column": "both"}},
        {"num_requests": 0},
        {"shared_prefix": -1},
        {"seed": 3},  # the run owns the seed
    ],
)
def test_invalid_specs_are_rejected(spec: dict[str, Any]) -> None:
    full: dict[str, Any] = {
        "arrival": {"type": "poisson", "rate": 1},
        "num_requests": 10,
        "prompt_len": {"type": "fixed", "value": 1},
        "output_len": {"type": "fixed", "value": 1},
        **spec,
    }
    with pytest.raises(ValidationError):
        Workload.model_validate(full)


def test_synthetic_arrivals_need_lengths_and_count() -> None:
    with pytest.raises(ValidationError, match="needs num_requests, prompt_len"):
        Workload.model_validate({"arrival": {"type": "poisson", "rate": 1}, "output_len": {"type": "fixed",
                                                                                          "value": 1}})


def test_schema_fields_are_described() -> None:
    schema = Workload.model_json_schema()
    for name, model in [("Workload", schema), *schema["$defs"].items()]:
        for field, prop in model.get("properties", {}).items():
            if field != "type":
                assert prop.get("description"), f"{name}.{field} has no description"


def test_describe() -> None:
    w = workload({"type": "gamma", "rate": 2.5, "cv": 3}, n=100,
                 prompt={"type": "lognormal", "mean": 1000, "std": 500, "max": 4096}, shared_prefix=32)
    text = w.describe()
    assert "gamma 2.5 req/s, cv 3" in text and "100 requests" in text and "lognormal(mean=1000" in text
    assert "shared prefix 32 tokens" in text
    t = workload({"type": "trace", "trace": "azure-conv", "rate_scale": 2, "repeat_to": 100000}, n=None)
    assert t.describe() == "trace azure-conv, rate x2, tiled to 100000 requests; prompt from trace tokens; " \
                           "output from trace tokens"
