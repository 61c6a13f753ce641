"""Metrics against hand-computed answers, and properties that hold for any run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics.records import STEP_COLUMNS, RequestRecord, RunResult
from sim.metrics.summary import (
    LATENCY_KEYS,
    SUMMARY_KEYS,
    SLOs,
    bottleneck,
    latency_stats,
    summarize,
    weighted_percentile,
)


def rec(id, arrival, sched, first, finish, prompt, out, outcome="completed", preempt=0, target=None):
    return RequestRecord(
        id=id,
        arrival=arrival,
        first_scheduled=sched,
        first_token=first,
        finish=finish,
        prompt_tokens=prompt,
        output_tokens=out,
        target_output_tokens=out if target is None else target,
        num_preemptions=preempt,
        outcome=outcome,
        reason="" if outcome == "completed" else "test",
        replica=0,
        session_id=-1,
    )


def steps(**cols) -> dict[str, np.ndarray]:
    n = len(cols["start"])
    return {k: np.asarray(cols.get(k, np.zeros(n)), dtype=t) for k, t in STEP_COLUMNS.items()}


def known_run(name: str = "paged") -> RunResult:
    """Three completed requests, one rejected, one failed; four steps. All times are multiples of 1/4."""
    requests = [
        rec(0, 0.5, 0.75, 1.25, 3.25, 100, 5),  # TTFT 0.75, E2EL 2.75, TPOT 0.5, queue 0.25
        rec(1, 1.0, 1.5, 2.0, 2.0, 200, 1),  # TTFT 1.0, E2EL 1.0, no TPOT, queue 0.5
        rec(2, 2.0, 2.25, 3.5, 6.5, 300, 4, preempt=2),  # TTFT 1.5, E2EL 4.5, TPOT 1.0, queue 0.25
        rec(3, 2.5, -1.0, -1.0, 2.5, 400, 0, outcome="rejected", target=7),
        rec(4, 3.0, 3.5, 4.0, 4.5, 500, 2, outcome="failed", preempt=1, target=9),
    ]
    s = steps(
        start=[0.75, 1.5, 2.25, 4.0],
        duration=[0.5, 0.5, 1.0, 2.0],
        batch_size=[1, 2, 2, 1],
        prefill_tokens=[100, 200, 300, 0],
        decode_tokens=[0, 1, 2, 1],
        padding_tokens=[0, 0, 4, 2],
        kv_blocks_used=[10, 20, 50, 40],
        kv_blocks_reserved=[0, 0, 10, 10],
        kv_tokens=[150, 300, 720, 600],
        kv_capacity_blocks=[100, 100, 100, 100],
        num_running=[1, 2, 2, 1],
        num_waiting=[3, 2, 1, 0],
        num_preempted=[0, 1, 0, 2],
        num_rejected=[0, 0, 1, 0],
        flops=[1e12, 2e12, 3e12, 4e12],
    )
    return RunResult(
        name=name,
        requests=requests,
        steps=s,
        itl_gaps=np.array([1.0, 0.5, 0.25]),
        itl_counts=np.array([3, 4, 1]),
        duration=8.0,
        peak_flops=1e13,
        kv_capacity_blocks=100,
        block_size=16,
    )


def test_latencies_of_three_requests():
    m = summarize(known_run())
    assert m["ttft"]["mean"] == pytest.approx((0.75 + 1.0 + 1.5) / 3, rel=1e-15)
    assert m["ttft"]["p50"] == 1.0
    assert m["ttft"]["p90"] == pytest.approx(1.0 + 0.8 * 0.5, rel=1e-15)
    assert m["e2el"]["mean"] == pytest.approx(2.75, rel=1e-15)
    assert m["e2el"]["p50"] == 2.75
    assert m["tpot"]["mean"] == 0.75  # requests 0 and 2 only: a single-token request has no TPOT
    assert m["tpot"]["p50"] == 0.75
    assert m["tpot"]["p99"] == pytest.approx(0.5 + 0.99 * 0.5, rel=1e-15)
    assert m["queue"]["p50"] == 0.25
    assert m["queue"]["mean"] == pytest.approx(1.0 / 3, rel=1e-15)
    # ITL pooled with multiplicity: [0.25, 0.5 x4, 1.0 x3]
    assert m["itl"]["mean"] == 5.25 / 8
    assert m["itl"]["p50"] == 0.5
    assert m["itl"]["p90"] == 1.0
    expanded = np.repeat([1.0, 0.5, 0.25], [3, 4, 1])
    for q in (50, 90, 95, 99):
        assert m["itl"][f"p{q}"] == np.percentile(expanded, q)


def test_counts_and_throughput():
    m = summarize(known_run())
    assert (m["num_requests"], m["num_completed"], m["num_rejected"], m["num_failed"]) == (5, 3, 1, 1)
    assert m["num_preemptions"] == 3
    assert m["num_steps"] == 4
    assert m["duration"] == 8.0
    assert m["request_throughput"] == 3 / 8
    assert m["output_throughput"] == 10 / 8
    assert m["total_token_throughput"] == (600 + 10) / 8
    assert m["total_input_tokens"] == 600 and m["total_output_tokens"] == 10


def test_step_metrics():
    m = summarize(known_run())
    assert m["busy_fraction"] == 0.5
    assert m["mfu"] == pytest.approx(1e13 / (8 * 1e13), rel=1e-15)
    assert m["kv_usage"]["max"] == 0.5
    assert m["kv_usage"]["mean"] == pytest.approx((0.1 * 0.5 + 0.2 * 0.5 + 0.5 * 1 + 0.4 * 2) / 4, rel=1e-15)
    # tokens / (used * block_size), reserved being the empty part of used: 150/160, 300/320, 720/800, 600/640
    assert m["kv_token_utilization"] == pytest.approx((0.9375 * 1.0 + 0.9 * 1.0 + 0.9375 * 2.0) / 4, rel=1e-15)
    assert m["mean_batch_size"] == pytest.approx(5.5 / 4, rel=1e-15)
    assert m["padding_fraction"] == pytest.approx(6 / 610, rel=1e-15)


def test_no_peak_flops_gives_nan_mfu():
    r = known_run()
    r.peak_flops = 0.0
    assert math.isnan(summarize(r)["mfu"])


@pytest.mark.parametrize(
    "slos, good",
    [
        (SLOs(ttft=1.0), 2),  # requests 0 (0.75) and 1 (exactly 1.0: bounds are inclusive, as in vLLM)
        (SLOs(tpot=0.9), 2),  # request 2 has TPOT 1.0; the single-token request counts as TPOT 0
        (SLOs(ttft=1.6, e2el=2.0), 1),  # every SLO must hold: only request 1 has E2EL <= 2
        (SLOs(ttft=10.0, tpot=10.0, e2el=10.0), 3),  # never the rejected or failed requests
        (SLOs(ttft=0.5), 0),
    ],
)
def test_goodput_counts_only_requests_meeting_every_slo(slos, good):
    m = summarize(known_run(), slos)
    assert m["goodput"] == good / 8
    assert m["slo_attainment"] == good / 5
    assert m["slos"] == slos.as_dict()


def test_goodput_is_undefined_without_slos():
    for slos in (None, SLOs()):
        m = summarize(known_run(), slos)
        assert math.isnan(m["goodput"]) and math.isnan(m["slo_attainment"]) and m["slos"] is None


def test_slos_reject_nonpositive_bounds():
    with pytest.raises(ValueError):
        SLOs(ttft=0.0)


def test_empty_run_is_nan_not_an_error():
    r = RunResult(
        name="empty",
        requests=[rec(0, 0.25, -1.0, -1.0, 0.25, 10, 0, outcome="rejected", target=3)],
        steps=steps(start=[]),
        itl_gaps=np.zeros(0),
        itl_counts=np.zeros(0, dtype=np.int64),
        duration=0.25,
        peak_flops=1e12,
        kv_capacity_blocks=64,
        block_size=16,
    )
    m = summarize(r)
    assert tuple(m) == SUMMARY_KEYS
    for key in ("ttft", "tpot", "itl", "e2el", "queue"):
        assert set(m[key]) == set(LATENCY_KEYS)
        assert all(math.isnan(v) for v in m[key].values())
    assert math.isnan(m["kv_usage"]["mean"]) and math.isnan(m["mean_batch_size"])
    assert m["request_throughput"] == 0.0 and m["busy_fraction"] == 0.0
    assert bottleneck(m) == "the only request was rejected: test (1)."  # its reason (issue 35)
    assert bottleneck({**m, "num_rejected": 0}) == "no steps ran: nothing to diagnose."


def test_summary_keys_are_fixed():
    m = summarize(known_run())
    assert tuple(m) == SUMMARY_KEYS
    for key in ("ttft", "tpot", "itl", "e2el", "queue"):
        assert tuple(m[key]) == ("mean", "p50", "p90", "p95", "p99")
    assert tuple(m["kv_usage"]) == ("mean", "max")


@settings(derandomize=True, max_examples=300, database=None)
@given(
    data=st.lists(
        st.tuples(st.floats(-1e9, 1e9, allow_nan=False), st.integers(0, 30)),
        min_size=1,
        max_size=40,
    ),
    q=st.one_of(st.sampled_from([0.0, 50.0, 90.0, 95.0, 99.0, 100.0]), st.floats(0.0, 100.0)),
)
def test_weighted_percentile_equals_percentile_of_expansion(data, q):
    values = np.array([v for v, _ in data])
    counts = np.array([c for _, c in data])
    expanded = np.repeat(values, counts)
    got = weighted_percentile(values, counts, q)
    if expanded.size == 0:
        assert math.isnan(got)
    else:
        assert got == np.percentile(expanded, q)  # bit for bit, not approximately


@settings(derandomize=True, max_examples=100, database=None)
@given(
    data=st.lists(st.tuples(st.floats(1e-6, 10.0), st.integers(1, 50)), min_size=1, max_size=30),
)
def test_weighted_stats_equal_unweighted_on_expansion(data):
    values = np.array([v for v, _ in data])
    counts = np.array([c for _, c in data])
    w = latency_stats(values, counts)
    u = latency_stats(np.repeat(values, counts))
    assert w["mean"] == pytest.approx(u["mean"], rel=1e-12)
    for q in ("p50", "p90", "p95", "p99"):
        assert w[q] == u[q]


@st.composite
def random_runs(draw) -> RunResult:
    """Steps that never overlap and stay inside the run, each using at most the device's peak FLOP rate."""
    n = draw(st.integers(1, 30))
    gaps = np.array(draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n)))
    durs = np.array(draw(st.lists(st.floats(1e-4, 3.0), min_size=n, max_size=n)))
    use = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    cap = draw(st.integers(1, 5000))
    used = np.array(draw(st.lists(st.integers(0, cap), min_size=n, max_size=n)))
    peak = draw(st.floats(1e9, 1e16))
    starts = np.cumsum(gaps) + np.concatenate(([0.0], np.cumsum(durs)[:-1]))
    end = float(starts[-1] + durs[-1])
    duration = end + draw(st.floats(0.0, 5.0))
    s = steps(
        start=starts,
        duration=durs,
        batch_size=np.ones(n),
        decode_tokens=np.ones(n),
        kv_blocks_used=used,
        kv_tokens=used * 16,
        kv_capacity_blocks=np.full(n, cap),
        flops=use * durs * peak,
    )
    reqs = [rec(0, 0.0, float(starts[0]), end, end, 7, 3)]
    return RunResult("r", reqs, s, np.array([0.01]), np.array([2]), duration, peak, cap, 16)


@settings(derandomize=True, max_examples=200, database=None)
@given(run=random_runs())
def test_utilisations_stay_in_unit_interval(run):
    m = summarize(run)
    assert 0.0 < m["busy_fraction"] <= 1.0 + 1e-12
    assert 0.0 <= m["mfu"] <= 1.0 + 1e-12
    assert 0.0 <= m["kv_usage"]["mean"] <= m["kv_usage"]["max"] + 1e-12 <= 1.0 + 2e-12
    assert math.isnan(m["kv_token_utilization"]) or 0.0 <= m["kv_token_utilization"] <= 1.0 + 1e-12


def _summary(kv_mean, kv_max, busy, mfu, preempt=0, rejected=0):
    m = summarize(known_run())
    m.update(busy_fraction=busy, mfu=mfu, num_preemptions=preempt, num_rejected=rejected, num_failed=0)
    m["kv_usage"] = {"mean": kv_mean, "max": kv_max}
    # no arrival window and no MFU-while-busy: the verdict reads KV, busy fraction and MFU alone
    m["limits"] = {**m["limits"], "offered_rate": float("nan"), "scheduled_rate": float("nan"), "queue_share": 0.0,
                   "busy_mfu": float("nan")}
    return m


@pytest.mark.parametrize(
    "args, verdict",
    [
        ((0.93, 0.99, 0.40, 0.12, 0, 120), "memory-bound"),
        ((0.60, 0.97, 0.40, 0.12, 5, 0), "memory-bound"),  # full at the peak and preempting
        ((0.60, 0.97, 0.40, 0.12, 0, 0), "compute-bound"),  # a full peak without pressure is fine; MFU 30% busy
        ((0.50, 0.70, 0.95, 0.45), "compute-bound"),
        ((0.50, 0.70, 0.95, 0.08), "bandwidth-bound"),
        ((0.50, 0.70, 0.95, float("nan")), "GPU-bound"),
        ((0.20, 0.30, 0.35, 0.05), "bandwidth-bound"),  # MFU 14% while computing, the GPU idle 65%
    ],
)
def test_bottleneck_verdicts(args, verdict):
    text = bottleneck(_summary(*args))
    assert text.startswith(verdict + ":")
    assert text.endswith(".")
    assert ("more load would fit" in text) == (args[2] < 0.5)


def test_a_cpu_runs_verdict_without_mfu_names_the_cpu():
    # an engine run on a CPU (summary device: cpu) has no MFU: its verdict read "GPU-bound: MFU unknown, CPU busy
    # 99% of the time" in the report
    summary = {**_summary(0.50, 0.70, 0.95, float("nan")), "device": "cpu"}
    assert bottleneck(summary).startswith("CPU-bound: MFU unknown, CPU busy 95% of the time")


def test_bottleneck_sentence_has_the_numbers():
    text = bottleneck(_summary(0.93, 0.97, 0.40, 0.12, 0, 120))
    assert text == (
        "memory-bound: KV usage 93% on average (peak 97%), 120 rejected; then compute-bound: MFU 30% while "
        "computing, GPU busy 40% of the time (more load would fit), prefill 98% of tokens."
    )


def test_requests_in_flight_at_the_last_arrival_are_no_queue():
    # Five requests arrive in [0.5, 3.0] and only two finish by 3.0, but none waits long: the old verdict took
    # "offered 1.60 req/s, served 0.40 req/s" for an overload. The waiting spans (arrival to first step) are
    # r0 [0.5, 0.75), r1 [1.0, 1.5), r2 [2.0, 2.25), r3 none (rejected on arrival), r4 from 3.0: the first quarter
    # [0.5, 1.125) holds 0.25 + 0.125 request-seconds, the last [2.375, 3.0) none.
    lim = summarize(known_run())["limits"]
    assert lim["offered_rate"] == 4 / 2.5
    assert lim["scheduled_rate"] == 3 / 2.5  # first steps at 0.75, 1.5 and 2.25
    assert lim["queue_start"] == 0.375 / 0.625
    assert lim["queue_end"] == 0.0
    assert lim["queue_growth"] == pytest.approx(-0.6 / 1.875, rel=1e-15)


def test_bottleneck_reads_a_summary_from_json():
    m = summarize(known_run())
    again = json.loads(json.dumps({**m, "mfu": None}, default=float).replace("NaN", "null"))
    assert bottleneck(again) == bottleneck(m) == (
        "bandwidth-bound: MFU 25% while computing, GPU busy 50% of the time, prefill 98% of tokens; 1 failed."
    )


def test_time_weighted_means_do_not_depend_on_blas_threads() -> None:
    """OpenBLAS splits a dot product of more than 10,000 elements among its threads, which moves the sum's last
    digits: a long run's kv_usage.mean and mean_batch_size came out different in Ray's workers (one thread) and in
    the caller (one per core), so a tournament's rows on Ray differed from serial's. The same on 1 and 2 threads;
    up to 10,000 elements, np.dot's very value."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import numpy as np; from sim.metrics.summary import _time_weighted_mean, jain_index; "
            "rng = np.random.default_rng(5); x, w = rng.random(60_000) * 64, rng.random(60_000) * 0.03; "
            "print(float(_time_weighted_mean(x, w)).hex(), float(jain_index(x)).hex())")
    root = str(Path(__file__).resolve().parent.parent)
    outs = [subprocess.run([sys.executable, "-c", code], env={**os.environ, "OPENBLAS_NUM_THREADS": n,
                                                                "OMP_NUM_THREADS": n, "PYTHONPATH": root},
                           capture_output=True, text=True, check=True, timeout=120).stdout for n in ("1", "2")]
    assert outs[0] == outs[1]
    from sim.metrics.sums import dot

    rng = np.random.default_rng(6)
    x, w = rng.random(10_000), rng.random(10_000)
    assert dot(x, w) == float(np.dot(x, w))  # short columns (every small run) keep their figures
    x, w = rng.random(25_000), rng.random(25_000)
    assert dot(x, w) == pytest.approx(float(np.dot(x, w)), rel=1e-14)
