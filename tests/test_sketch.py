"""The quantile sketch (sim/metrics/sketch.py): every percentile within its stated relative bound of numpy's, and a merge
that equals one sketch fed every value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics.sketch import MIN_VALUE, QuantileSketch
from sim.metrics.summary import PERCENTILES

# latencies as runs make them: exact zeros (a queue delay) and seconds from microseconds to hours
values = st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e4, allow_nan=False))
ROUNDING = 1e-12  # relative: float rounding in the lerp and the bucket value


def within_bound(sketch: QuantileSketch, expanded: np.ndarray) -> None:
    a = sketch.relative_accuracy
    for q in (0, 1, *PERCENTILES, 99.9, 100):
        exact = float(np.percentile(expanded, q))
        est = sketch.quantile(q)
        assert abs(est - exact) <= a * exact * (1 + ROUNDING), (q, est, exact)


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=300), st.sampled_from([0.001, 0.005, 0.02, 0.1]))
def test_quantiles_within_relative_bound(xs: list[float], accuracy: float) -> None:
    s = QuantileSketch(accuracy)
    s.add(xs)
    within_bound(s, np.array(xs))
    assert s.count == len(xs)
    assert s.mean == pytest.approx(float(np.mean(xs)), rel=1e-12, abs=1e-300)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(values, st.integers(min_value=0, max_value=50)), min_size=1, max_size=200))
def test_weighted_values_equal_expanded(pairs: list[tuple[float, int]]) -> None:
    """(gap, count) pairs, as the inter-token gaps are pooled: the same sketch as the expanded values."""
    v = np.array([p[0] for p in pairs])
    c = np.array([p[1] for p in pairs], dtype=np.int64)
    weighted, expanded = QuantileSketch(), QuantileSketch()
    weighted.add(v, c)
    expanded.add(np.repeat(v, c))
    assert weighted.count == expanded.count == int(c.sum())
    for k in ("count", "zero_count", "min", "max"):
        assert getattr(weighted, k) == getattr(expanded, k)
    assert [a.tolist() for a in weighted.buckets()] == [a.tolist() for a in expanded.buckets()]
    if c.sum():
        within_bound(weighted, np.repeat(v, c))


def test_seeded_lognormal_million() -> None:
    """A heavy-tailed sample of a million latencies, as a long run's TTFTs: each percentile within 0.5%."""
    rng = np.random.default_rng(0)
    x = rng.lognormal(mean=-2.0, sigma=1.5, size=1_000_000)
    s = QuantileSketch(0.005)
    for part in np.array_split(x, 7):
        s.add(part)
    within_bound(s, x)
    # the bound is not slack: some percentile is off by more than a tenth of it
    assert max(abs(s.quantile(q) / np.percentile(x, q) - 1) for q in PERCENTILES) > 0.0005


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(values, max_size=60), min_size=1, max_size=6))
def test_merge_equals_one_sketch(parts: list[list[float]]) -> None:
    """Merging sketches of the parts gives the buckets, counts, extremes and quantiles of one sketch of all."""
    whole = QuantileSketch()
    merged = QuantileSketch()
    for p in parts:
        whole.add(p)
        one = QuantileSketch()
        one.add(p)
        merged.merge(one)
    for k in ("count", "zero_count", "min", "max"):
        assert getattr(merged, k) == getattr(whole, k)
    assert [a.tolist() for a in merged.buckets()] == [a.tolist() for a in whole.buckets()]
    for q in (0, *PERCENTILES, 100):
        assert merged.quantile(q) == whole.quantile(q) or (np.isnan(merged.quantile(q)) and whole.count == 0)
    assert merged.mean == whole.mean or whole.count == 0


def test_zero_bucket_and_empty() -> None:
    s = QuantileSketch()
    assert np.isnan(s.quantile(50)) and np.isnan(s.mean)
    s.add([0.0, MIN_VALUE / 2, 0.0])
    assert s.zero_count == 3 and s.quantile(100) == 0.0


@pytest.mark.parametrize("bad", [[-1.0], [float("nan")], [float("inf")]])
def test_rejects_what_is_not_a_latency(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="finite values >= 0"):
        QuantileSketch().add(bad)


def test_merge_refuses_other_accuracy() -> None:
    with pytest.raises(ValueError, match="cannot merge"):
        QuantileSketch(0.01).merge(QuantileSketch(0.02))


def test_summary_reads_the_sketch_past_exact_max(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with more latency values than EXACT_MAX: every percentile of the summary within the sketch's bound
    of the exact one, the mean within float rounding, and the summary names the sketched figures. Up to EXACT_MAX
    the figures are the exact ones (tests/test_pinned_outputs.py holds their bytes)."""
    import sim.metrics.summary as metrics
    from sim.config.scenario import parse_scenario
    from sim.loop.run import prepare_scenario, run_scenario
    from sim.metrics.summary import LATENCY_METRICS, summarize

    scenario = {"name": "sketched", "seed": 1,
                "workload": {"arrival": {"type": "poisson", "rate": 20.0}, "num_requests": 400,
                             "prompt_len": {"type": "lognormal", "mean": 600, "std": 400, "max": 4000},
                             "output_len": {"type": "exponential", "mean": 120, "max": 1000}},
                "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192},
                "policy": {"type": "continuous", "max_num_seqs": 32}}
    (result,) = run_scenario(prepare_scenario(parse_scenario(scenario))).results
    exact = summarize(result)
    assert "latency_sketch" not in exact
    monkeypatch.setattr(metrics, "EXACT_MAX", 100)
    sketched = summarize(result)
    per_request = [m for m in LATENCY_METRICS if m != "itl"]  # the pooled ITL pairs stay exact
    assert sketched.pop("latency_sketch") == {"metrics": per_request, "relative_accuracy": 0.005, "exact_max": 100}
    assert sketched["itl"] == exact["itl"]
    assert int(result.itl_counts.sum()) > 100
    for m in per_request:
        assert sketched[m]["mean"] == pytest.approx(exact[m]["mean"], rel=1e-12)
        for q in PERCENTILES:
            assert abs(sketched[m][f"p{q}"] - exact[m][f"p{q}"]) <= 0.005 * exact[m][f"p{q}"] * (1 + ROUNDING)
        assert any(sketched[m][f"p{q}"] != exact[m][f"p{q}"] for q in PERCENTILES)  # the sketch was read
    assert {k: v for k, v in sketched.items() if k not in per_request} == \
        {k: v for k, v in exact.items() if k not in per_request}
