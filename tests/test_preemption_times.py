"""Request records keep when each preemption happened and when the request resumed (issue 17 point 3), and the
per-request charts use them: a preempted request's band stops at its preemption and starts again at its resume,
so the stacked bands stay under the KV pool. Without the times, a preempted request was drawn as if it kept its
KV, and the bands rose above the capacity line."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.loop.run import generate_workload, simulate_variant
from sim.output.run_folder import read_requests, write_run


def _tiny_kv_run(max_num_seqs: int = 256):
    sc = parse_scenario({
        "seed": 0,
        "workload": {"arrival": {"type": "poisson", "rate": 8.0}, "num_requests": 80,
                     "prompt_len": {"type": "uniform", "low": 200, "high": 1400},
                     "output_len": {"type": "uniform", "low": 50, "high": 400}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 2048, "num_gpu_blocks": 160},
        "policy": {"type": "continuous", "max_num_seqs": max_num_seqs},
    })
    (cfg,) = variant_configs(sc)
    result, _, _ = simulate_variant(cfg, generate_workload(sc))
    return result


@pytest.fixture(scope="module")
def tiny_kv():
    return _tiny_kv_run()


def test_records_keep_preemption_and_resume_times(tiny_kv):
    preempted = [r for r in tiny_kv.requests if r.num_preemptions]
    assert len(preempted) >= 5
    for r in tiny_kv.requests:
        assert len(r.preempted_at) == r.num_preemptions
        assert len(r.resumed_at) in (len(r.preempted_at), len(r.preempted_at) - 1)
        if r.completed:
            assert len(r.resumed_at) == len(r.preempted_at)  # it ran to the end, so every preemption resumed
        # first scheduled < preempted < resumed < preempted ... < finish, strictly interleaved
        times = [r.first_scheduled] + [t for pair in zip(r.preempted_at, r.resumed_at, strict=False) for t in pair]
        if len(r.resumed_at) < len(r.preempted_at):
            times.append(r.preempted_at[-1])
        assert times == sorted(times) and (not r.completed or times[-1] <= r.finish)
        spans = r.kv_intervals(r.finish)
        assert len(spans) == len(r.resumed_at) + 1 or len(r.resumed_at) < len(r.preempted_at)


def test_requests_csv_round_trips_the_times(tiny_kv, tmp_path):
    write_run(tmp_path, [tiny_kv], {})
    header = (tmp_path / "requests.csv").read_text().splitlines()[0].split(",")
    assert "preempted_at_s" in header and "resumed_at_s" in header
    back = read_requests(tmp_path)[tiny_kv.name]
    assert back == sorted(tiny_kv.requests, key=lambda r: r.id)
    assert any(len(r.preempted_at) > 1 for r in back)  # several times in one cell, ';'-joined


def test_kv_by_request_stack_stays_under_capacity(tiny_kv):
    from sim.output.report import fig_memory_by_request

    fig = fig_memory_by_request(tiny_kv)
    bands = [np.asarray(tr.y, dtype=float) for tr in fig.data if tr.name.startswith("request ")]
    (cap_trace,) = [tr for tr in fig.data if tr.name == "KV pool capacity"]  # full pool: in range, drawn
    cap = float(cap_trace.y[0])
    stacked = np.sum(bands, axis=0)
    assert stacked.max() > 0.5 * cap  # the pile does reach the ceiling
    assert np.all(stacked <= cap * (1 + 1e-6)), f"{stacked.max():.3f} GiB stacked over a {cap:.3f} GiB pool"
    assert fig.layout.yaxis.range[1] == pytest.approx(1.05 * cap)


def test_batch_slot_rows_stay_within_max_num_seqs_under_preemption():
    from sim.output.report import fig_batch_slots, slot_layout

    run = _tiny_kv_run(max_num_seqs=6)
    assert sum(r.num_preemptions for r in run.requests) > 0
    lay = slot_layout(run)
    # each resume starts a new bar: more bars than requests (one bar per request before the records had times)
    resumes = sum(len(r.resumed_at) for r in run.requests)
    assert resumes > 0 and len(lay.ids) == len({int(i) for i in lay.ids}) + resumes
    assert lay.num_rows <= 6  # a preempted request gives its row back until it resumes
    # at every span boundary, the spans alive number at most max_num_seqs
    for t in np.concatenate([lay.start, lay.finish]):
        assert int(np.sum((lay.start <= t) & (t < lay.finish))) <= 6
    fig = fig_batch_slots([run])
    assert max(fig.data[0].y) <= 5


def test_batch_slot_title_counts_requests_and_their_stretches(tiny_kv):
    # each resume is a bar of its own: the title said "N of N scheduled requests drawn" with N the bars, more
    # than the run's requests (priority of classes-priority -n 200: "228 of 228" for 200 requests)
    from sim.output.report import fig_batch_slots, slot_layout

    lay = slot_layout(tiny_kv)
    requests = len({int(i) for i in lay.ids})
    assert lay.requests == requests < lay.spans
    (title,) = [a.text for a in fig_batch_slots([tiny_kv], max_requests=1000).layout.annotations]
    assert title.startswith(f"{tiny_kv.name}: {lay.spans} of {lay.spans} bars drawn, {requests} scheduled requests "
                            "(a preempted request has one bar per stretch it ran);"), title


def test_batch_slot_title_says_one_row_in_the_singular():
    # a run of one request read "1 of 1 scheduled requests drawn; 1 rows at the busiest instant"
    from sim.output.report import fig_batch_slots

    sc = parse_scenario({
        "seed": 0,
        "workload": {"arrival": {"type": "poisson", "rate": 1.0}, "num_requests": 1,
                     "prompt_len": {"type": "fixed", "value": 100}, "output_len": {"type": "fixed", "value": 10}},
        "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
        "policy": {"type": "continuous", "max_num_seqs": 8},
    })
    (cfg,) = variant_configs(sc)
    result, _, _ = simulate_variant(cfg, generate_workload(sc))
    (title,) = [a.text for a in fig_batch_slots([result]).layout.annotations]
    assert title.endswith(": 1 of 1 scheduled request drawn; 1 row at the busiest instant; max_num_seqs=8"), title
