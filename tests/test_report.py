"""The report's teaching figures: batch slots, the GPU memory stack and the sweep panel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import load_scenario
from sim.loop.run import run_scenario
from sim.output.report import (
    MEMORY_LAYERS,
    assign_slots,
    build_report,
    fig_batch_slots,
    fig_memory_stack,
    fig_sweep,
    memory_layers,
    slot_layout,
    sweep_params,
)
from sim.studies.teaching import find_scenario, static_batching_estimate

MB = 1_000_000


def most_at_once(start: np.ndarray, end: np.ndarray) -> int:
    """Most half-open intervals [start, end) alive at one instant, an interval with end <= start counting at its
    start (by brute force over the starts, where the maximum is always reached)."""
    end = np.maximum(end, start)
    best = 0
    for s in start:
        alive = (start <= s) & ((end > s) | ((start == s) & (end == s)))
        best = max(best, int(alive.sum()))
    return best


def check_rows(start: np.ndarray, end: np.ndarray, rows: np.ndarray) -> None:
    end = np.maximum(end, start)
    for r in np.unique(rows):
        on = np.flatnonzero(rows == r)
        order = on[np.argsort(start[on], kind="stable")]
        # consecutive intervals of one row do not overlap (a zero-length one still needs its instant)
        s, e = start[order], end[order]
        assert np.all(s[1:] >= e[:-1]), f"row {r} holds overlapping intervals"
        zero = e[:-1] == s[:-1]
        assert not np.any(zero & (s[1:] == s[:-1])), f"row {r} holds two requests at one instant"
    assert set(np.unique(rows).tolist()) == set(range(len(np.unique(rows))))  # rows 0..n-1, no gaps


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 15)),  # (start, length) on a coarse grid: many ties
        min_size=0,
        max_size=60,
    )
)
def test_assign_slots_never_overlaps_and_uses_fewest_rows(intervals):
    start = np.array([s for s, _ in intervals], dtype=np.float64) / 4
    end = start + np.array([d for _, d in intervals], dtype=np.float64) / 4
    rows = assign_slots(start, end)
    assert len(rows) == len(start)
    if not len(start):
        return
    check_rows(start, end, rows)
    assert rows.max() + 1 == most_at_once(start, end)


def test_assign_slots_reuses_the_lowest_free_row():
    start = np.array([0.0, 0.0, 1.0, 2.0, 2.0])
    end = np.array([1.0, 3.0, 2.0, 4.0, 3.0])
    # at 1.0 row 0 is free again; at 2.0 row 0 frees and a third row opens
    np.testing.assert_array_equal(assign_slots(start, end), [0, 1, 0, 0, 2])


@pytest.fixture(scope="module")
def nvc():
    """naive-vs-continuous on 300 requests: static batches of 16 with contiguous KV against continuous batching
    with paged KV."""
    scenario, raw = load_scenario(find_scenario("naive-vs-continuous"), {"workload.num_requests": 300})
    return run_scenario(scenario, raw)


def test_static_slots_match_the_steps_log(nvc):
    naive = nvc.results[0]
    lay = slot_layout(naive)
    assert lay.batch_held
    assert lay.num_rows == naive.config["policy"]["batch_size"] == 16
    check_rows(lay.start, lay.held_until, lay.row)
    s = naive.steps
    # padding rows inferred from the records equal the padding rows the core recorded, step by step
    np.testing.assert_array_equal(lay.padded_rows_at(s["start"]), s["padded_rows"])
    assert np.all(lay.held_until >= lay.finish)


def test_slots_read_padded_rows_a_block_at_a_time(nvc, monkeypatch):
    """Whether rows were held to a batch's end is read from the steps log a block of steps at a time: the whole
    padded_rows column (8 bytes a step) is never expanded, and the answer is the same."""
    from sim.metrics.step_columns import StepColumns

    assert all(isinstance(r.steps, StepColumns) for r in nvc.results)
    whole = StepColumns.__getitem__

    def no_padded_rows(self, key):
        assert key != "padded_rows", "the whole padded_rows column was read"
        return whole(self, key)

    monkeypatch.setattr(StepColumns, "__getitem__", no_padded_rows)
    assert [slot_layout(r).batch_held for r in nvc.results] == [True, False]


def test_slots_section_lays_each_run_out_once(nvc, monkeypatch):
    """The report's slot section makes each run's layout once and draws the figure from it (the figure is the one
    fig_batch_slots makes on its own): two layouts of a long run, several arrays a request each, were held at
    once."""
    import sim.output.report as report
    import sim.output.report.slots as slots

    alone = fig_batch_slots(nvc.results).to_json()
    made = []

    def counted(result, first=None):
        made.append(result.name)
        return slot_layout(result, first)

    monkeypatch.setattr(report, "slot_layout", counted)
    monkeypatch.setattr(slots, "slot_layout", counted)
    (section,) = report._slots_section(nvc.results, nvc.summaries)
    assert made == [r.name for r in nvc.results]
    assert section.figure.to_json() == alone


def test_continuous_slots(nvc):
    cont = nvc.results[1]
    lay = slot_layout(cont)
    assert not lay.batch_held
    np.testing.assert_array_equal(lay.held_until, lay.finish)
    check_rows(lay.start, lay.finish, lay.row)
    s = cont.steps
    # every request computing in a step holds a row at the step's start
    assert lay.num_rows >= int(s["batch_size"].max())
    assert lay.num_rows == most_at_once(lay.start, lay.finish)
    assert lay.num_rows <= cont.config["policy"]["max_num_seqs"]


def test_slot_chart_caps_and_shares_the_time_axis(nvc):
    fig = fig_batch_slots(nvc.results, max_requests=50)
    bars = [t for t in fig.data if t.name == "request"]
    assert len(bars) == 2
    assert max(len(t.y) for t in bars) == 50  # the busiest variant hits the cap, no more
    padding = [t for t in fig.data if t.name.startswith("padding")]
    assert len(padding) == 1 and len(padding[0].y) > 0  # only static batching holds finished rows
    t_end = fig.layout.xaxis2.range[1]
    for t in fig.data:
        assert np.all(np.asarray(t.base) + np.asarray(t.x) <= np.float32(t_end) * (1 + 1e-6))
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"  # one time axis
    assert "at most 50 requests" in fig.layout.title.text


@pytest.mark.parametrize("which", [0, 1])
def test_memory_stack_stays_under_capacity(nvc, which):
    res = nvc.results[which]
    layers, scale, unit = memory_layers(res)
    assert unit == "GiB"
    for key, _, _ in MEMORY_LAYERS:
        assert np.all(layers[key] >= 0), key
    total = sum(layers[k] for k, _, _ in MEMORY_LAYERS)
    capacity = (res.weight_bytes + res.kv_capacity_blocks * res.kv_bytes_per_block) / 2**30
    np.testing.assert_allclose(total, capacity, rtol=1e-12)  # the layers split the capacity exactly
    assert layers["weights"][0] == pytest.approx(res.weight_bytes / 2**30)
    fig = fig_memory_stack(res)
    stacked = [t for t in fig.data if t.stackgroup == "memory"]
    assert [t.name for t in stacked] == [label for _, label, _ in MEMORY_LAYERS]
    top = np.sum([np.asarray(t.y, dtype=np.float64) for t in stacked], axis=0)
    drawn = ~np.isnan(top)  # windows before the first step have no value
    assert drawn.mean() > 0.9
    line = next(t for t in fig.data if t.name.startswith("capacity"))
    assert line.y[0] == pytest.approx(capacity)
    assert np.all(top[drawn] <= line.y[0] * (1 + 1e-6))  # float32 rounding only
    used = top - np.asarray(stacked[-1].y, dtype=np.float64)  # everything but the free blocks
    assert np.all(used[drawn] <= line.y[0] * (1 + 1e-6))
    assert np.all(used[drawn] >= layers["weights"][0] * (1 - 1e-6))


def test_contiguous_reservation_shows_as_reserved_memory(nvc):
    naive, cont = (memory_layers(r)[0] for r in nvc.results)
    # each request reserves max_model_len (4096) tokens for a few hundred: most of its KV holds nothing
    assert naive["kv_reserved"].mean() > 2 * naive["kv_stored"].mean()
    assert cont["kv_reserved"].max() == 0  # paged KV allocates a block when a token needs it


def test_kv_lines_do_not_count_reserved_blocks_twice(nvc):
    # kv_blocks_used already holds the reserved-but-empty blocks: adding kv_blocks_reserved again drew the naive
    # server's KV at 31.6% where the table's KV usage peaks at 16.5% (issue 35)
    from sim.output.report import fig_kv_memory, fig_timeline
    from sim.output.report.common import _sorted_steps, _state_trace, run_end, window_edges

    naive = nvc.results[0]
    peak = nvc.summaries["naive"]["kv_usage"]["max"]
    kv = {t.name: np.asarray(t.y, dtype=np.float64) for t in fig_timeline(naive).data if t.name.startswith("KV")}
    assert list(kv) == ["KV used", "KV used, reserved-empty blocks left out"]
    assert np.nanmax(kv["KV used"]) == pytest.approx(peak, rel=1e-6)
    assert np.nanmax(kv["KV used, reserved-empty blocks left out"]) < 0.5 * peak  # mostly reservations

    fig = fig_kv_memory(naive)
    assert [t.name for t in fig.data] == ["holding tokens", "reserved, empty", "capacity"]
    s = _sorted_steps(naive)
    edges = window_edges(run_end(naive), len(s["start"]), 1000)
    scale = naive.kv_bytes_per_block / 2**30
    used = _state_trace(s["start"], s["kv_blocks_used"] * scale, edges, "mean", 1000)["y"]
    top = np.asarray(fig.data[0].y, dtype=np.float64) + np.asarray(fig.data[1].y, dtype=np.float64)
    np.testing.assert_allclose(top, used, rtol=1e-5)  # the stack's top is the blocks used, not used + reserved


def test_memory_note_says_whether_memory_is_the_ceiling(nvc):
    # the note said "The ceiling is memory" over KV peaks of 16.5% and 9.4% (issue 35)
    from sim.output.report import memory_ceiling_text

    text = memory_ceiling_text(nvc.results, nvc.summaries)
    assert text == "Memory is not the ceiling here: KV usage peaks at 16.5% (naive) and 9.4% (continuous) of the pool."
    assert text in build_report(nvc.results, nvc.summaries, "t")
    full = {**nvc.summaries["naive"], "kv_usage": {"mean": 0.6, "max": 0.99}, "num_preemptions": 5}
    text = memory_ceiling_text(nvc.results, {**nvc.summaries, "naive": full})
    assert text == (
        "The ceiling is memory for naive: KV usage peaks at 99.0% (naive) of the pool (naive: 5 preemptions, "
        "0 rejected). Memory is not the ceiling for continuous: KV usage peaks at 9.4% (continuous) of the pool."
    )


def test_titles_sit_below_the_mode_bar(nvc):
    # plotly draws its mode bar's icons over the top MODEBAR_PX of a figure and sets a title's baseline in the
    # middle of the top margin: with a 50 px margin, "KV cache by request: ..." ran under the icons (issue 35).
    # Every figure of a report on a single server and on clusters (replicas, disaggregation) keeps its title's
    # glyphs (the font's size above the baseline) below the band, and its subplot titles on the plot area's edge.
    from sim.output.report import SECTIONS
    from sim.output.report.common import MODEBAR_PX

    scenario, raw = load_scenario(find_scenario("lesson-disaggregation"), {"workload.num_requests": 30})
    disagg = run_scenario(scenario, raw)
    figures = [sec.figure for run in (nvc, disagg) for build in SECTIONS
               for sec in build(run.results, run.summaries) if sec.figure is not None]
    assert len(figures) >= 15
    for fig in figures:
        lay, tmpl = fig.layout, fig.layout.template.layout
        top = lay.margin.t if lay.margin.t is not None else tmpl.margin.t
        size = (lay.title.font.size or tmpl.title.font.size or 1.4 * (lay.font.size or tmpl.font.size))
        name = lay.title.text or "untitled"
        assert lay.title.y is None and top / 2 - size >= MODEBAR_PX, name
        assert all(a.y is None or a.yref != "paper" or a.y <= 1.0 for a in lay.annotations), name


def test_report_has_the_new_figures_and_stays_small(nvc):
    page = build_report(nvc.results, nvc.summaries, "naive vs continuous, 300 requests")
    for heading in ("<h2>Batch slots</h2>", "<h2>GPU memory: naive</h2>", "<h2>GPU memory: continuous</h2>"):
        assert heading in page
    assert "padding: finished, row still held" in page and "capacity: weights + KV pool" in page
    assert "<h2>Sweep</h2>" not in page  # not a sweep
    assert page.count("plotly.js v") == 1
    assert len(page.encode()) < 6 * MB


@pytest.mark.slow
def test_full_naive_vs_continuous_report_is_under_6_mb():
    scenario, raw = load_scenario(find_scenario("naive-vs-continuous"))
    run = run_scenario(scenario, raw)
    assert len(build_report(run.results, run.summaries, "full").encode()) < 6 * MB


def test_sweep_panel():
    scenario, raw = load_scenario(
        find_scenario("naive-vs-continuous"),
        {"workload.num_requests": 60, "sweep": {"policy.max_num_seqs": [4, 16]}},
    )
    run = run_scenario(scenario, raw)
    assert [sweep_params(r) for r in run.results][:2] == [
        ("naive", {"max_num_seqs": 4}),
        ("continuous", {"max_num_seqs": 4}),
    ]
    fig = fig_sweep(run.results, run.summaries)
    thr = [t for t in fig.data if t.xaxis == "x"]
    assert {t.name for t in thr} == {"naive", "continuous"}
    cont = next(t for t in thr if t.name == "continuous")
    assert list(cont.x) == [4, 16]
    want = [run.summaries[f"continuous[max_num_seqs={m}]"]["output_throughput"] for m in (4, 16)]
    np.testing.assert_allclose(cont.y, want)
    page = build_report(run.results, run.summaries, "sweep")
    assert "<h2>Sweep</h2>" in page
    assert fig_sweep(run.results[:0]) is None
    assert fig.layout.xaxis.type != "log" and fig.layout.xaxis.title.text == "max_num_seqs"  # 4 to 16: linear


def test_a_log_sweep_axis_says_it_is_log_scale():
    """lesson-pipeline-bubbles sweeps num_users over 1, 2, 4, 16: the panels' x axes are log, titled only "num_users"
    (rendered, lesson-speculative-decoding's 1, 16, 64, 256, 512 drew closer together with no word of a log
    scale), where every other log axis of the report says so."""
    scenario, raw = load_scenario(find_scenario("lesson-pipeline-bubbles"), {"workload.num_requests": 8})
    fig = fig_sweep(run_scenario(scenario, raw).results)
    assert fig is not None
    axes = [fig.layout[f"xaxis{'' if i == 1 else i}"] for i in range(1, 5)]
    assert [(a.type, a.title.text) for a in axes] == [("log", "num_users, log scale")] * 4


def test_sweep_params_from_names_alone(nvc):
    from dataclasses import replace

    res = replace(nvc.results[1], name="continuous[max_num_seqs=8,rate=2.5]", config=None)
    assert sweep_params(res) == ("continuous", {"max_num_seqs": 8, "rate": 2.5})
    assert sweep_params(replace(res, name="continuous")) is None
    assert sweep_params(nvc.results[1]) is None  # a run outside a sweep has empty params


def test_static_batching_estimate():
    assert static_batching_estimate([5, 5, 5, 5], 2) == 1.0
    # batches (1, 3) and (2,): 2 rows x 3 + 1 row x 2 over 6 useful row-steps
    assert static_batching_estimate([1, 3, 2], 2) == pytest.approx(8 / 6)


def test_replicas_get_rows_of_their_own():
    from sim.metrics.records import STEP_COLUMNS, RequestRecord, RunResult

    def rec(i, start, finish, replica):
        return RequestRecord(i, start, start, start + 0.1, finish, 10, 5, 5, 0, "completed", "", replica, -1)

    reqs = [rec(0, 0.0, 2.0, 0), rec(1, 0.5, 1.0, 1), rec(2, 1.0, 3.0, 0), rec(3, 0.5, 3.0, 1), rec(4, 1.5, 2.5, 1)]
    steps = {k: np.zeros(0, dtype=t) for k, t in STEP_COLUMNS.items()}
    res = RunResult("two replicas", reqs, steps, np.zeros(0), np.zeros(0, dtype=np.int64), 3.0, 1.0, 8, 16)
    lay = slot_layout(res)
    rep = np.array([r.replica for r in reqs])
    assert lay.num_rows == 2 + 2  # replica 0 needs two rows at 1.0, replica 1 two at 0.5 and at 1.5
    assert set(lay.row[rep == 0]) == {0, 1} and set(lay.row[rep == 1]) == {2, 3}
    for r in (0, 1):
        check_rows(lay.start[rep == r], lay.held_until[rep == r], lay.row[rep == r] - 2 * r)
    fig = fig_batch_slots([res])
    assert len(fig.data[0].y) == 5


def test_memory_by_request_bands_follow_each_request() -> None:
    """Each drawn request's band is its prompt from its first step, grows to prompt + output by its finish,
    and is zero outside its life; the y axis spans the KV in use, not the GPU."""
    from sim.config.scenario import parse_scenario, variant_configs
    from sim.loop.run import generate_workload, simulate_variant
    from sim.output.report import fig_memory_by_request, request_kv_tokens

    sc = parse_scenario({
        "workload": {"arrival": {"type": "poisson", "rate": 6.0}, "num_requests": 60,
                     "prompt_len": {"type": "uniform", "low": 50, "high": 900},
                     "output_len": {"type": "uniform", "low": 2, "high": 300}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096},
        "policy": {"type": "continuous", "enable_chunked_prefill": True},
    })
    (cfg,) = variant_configs(sc)
    result, _, _ = simulate_variant(cfg, generate_workload(sc))
    t = np.linspace(0.0, max(r.finish for r in result.requests), 400)
    bands = request_kv_tokens(result, t, max_requests=60)
    assert len(bands) == 60
    for r in result.requests:
        y = bands[r.id]
        assert np.all(y[t < r.first_scheduled] == 0) and np.all(y[t >= r.finish] == 0)
        alive = (t >= r.first_scheduled) & (t < r.finish)
        assert np.all(y[alive] >= r.prompt_tokens) and np.all(y[alive] <= r.prompt_tokens + r.output_tokens)
    fig = fig_memory_by_request(result, max_requests=60)
    bands_y = [np.asarray(tr.y, dtype=float) for tr in fig.data if tr.name and tr.name.startswith("request ")]
    assert len(bands_y) == 60
    peak = float(np.sum(bands_y, axis=0).max())
    # a light run: about 1 GiB of KV against a pool of tens of GiB, which is named in the title instead of drawn
    lo, hi = fig.layout.yaxis.range
    assert lo == 0 and hi == pytest.approx(1.05 * peak, rel=1e-6)
    assert "off the scale" in fig.layout.title.text
    assert not [tr for tr in fig.data if tr.name and "capacity" in tr.name]


def test_memory_capacity_line_of_a_run_without_steps():
    # Every request rejected (prompt+output over max_model_len), so no step ran: the capacity line was drawn at
    # 0 GiB, under the GPU's memory line, as if the server had no weights and no KV pool.
    scenario, raw = load_scenario(find_scenario("naive-vs-continuous"),
                                  {"workload.num_requests": 5, "deployment.max_model_len": 10})
    res = run_scenario(scenario, raw).results[1]
    assert res.steps["start"].size == 0
    capacity = (res.weight_bytes + res.kv_capacity_blocks * res.kv_bytes_per_block) / 2**30
    assert capacity > 50  # 15.0 GiB of weights and a 55.3 GiB KV pool on the A100
    fig = fig_memory_stack(res)
    line = next(t for t in fig.data if t.name.startswith("capacity"))
    assert line.y[0] == pytest.approx(capacity, rel=1e-12)
    # ...and the chart held that line alone: the weights, loaded all along, and the pool, free all along, are bands
    bands = {t.name: list(t.y) for t in fig.data if t.stackgroup == "memory"}
    weights = res.weight_bytes / 2**30
    assert bands == {"model weights": [pytest.approx(weights, rel=1e-12)] * 2,
                     "KV: free blocks": [pytest.approx(capacity - weights, rel=1e-12)] * 2}


def test_slots_section_leaves_out_a_run_that_scheduled_nothing(nvc):
    """Every request rejected, so no step ran: its batch-slot panel was an empty frame titled '0 of 0 scheduled
    requests drawn; 0 rows at the busiest instant'. It is named in a note instead, and a page of such runs alone
    has the note and no figure."""
    import sim.output.report as report

    scenario, raw = load_scenario(find_scenario("naive-vs-continuous"),
                                  {"workload.num_requests": 5, "deployment.max_model_len": 10})
    rejected = run_scenario(scenario, raw).results
    assert all(r.steps["start"].size == 0 for r in rejected)
    (alone,) = report._slots_section(rejected, {})
    assert alone.figure is None
    assert "naive, continuous: no request was scheduled, so there is no batch to draw." in alone.html
    both = rejected[1:] + nvc.results[1:]
    (mixed,) = report._slots_section(both, {})
    assert [a.text.split(":")[0] for a in mixed.figure.layout.annotations] == [nvc.results[1].name]
    assert "continuous: no request was scheduled" in mixed.html


def test_memory_by_request_axis_reaches_a_pile_above_one_replicas_pool():
    """autoscale-memory-bound's scale-on-busy (80 requests, up to 8 L4s): its requests, stacked over the replicas,
    pile above one replica's 3.8 GiB pool, and the y axis, set to the capacity line alone, cut the pile off at
    4 GiB. The axis reaches the pile; the line is the pool of the replicas serving at each time (it was one
    replica's, beside the bands of all of them), and grows as the fleet does."""
    from sim.output.report import fig_memory_by_request

    scenario, raw = load_scenario(find_scenario("autoscale-memory-bound"), {"workload.num_requests": 80})
    res = run_scenario(scenario, raw).results[1]
    assert res.name == "scale-on-busy" and res.cluster is not None and res.cluster["replicas_max"] > 1
    fig = fig_memory_by_request(res)
    bands = [np.asarray(tr.y, dtype=float) for tr in fig.data if tr.name and tr.name.startswith("request ")]
    peak = float(np.sum(bands, axis=0).max())
    (line,) = [tr for tr in fig.data if tr.name and "capacity" in tr.name]
    one = res.kv_capacity_blocks * res.kv_bytes_per_block / 2**30
    assert line.name == "KV pool capacity (the replicas serving)" and line.line.shape == "hv"
    assert line.y[0] == pytest.approx(one) and max(line.y) > peak > one  # one replica at first, then more
    ready = [life["ready"] for life in res.cluster["per_replica"]]
    for x, y in zip(line.x[:-1], line.y[:-1], strict=True):
        assert y == pytest.approx(one * sum(r <= x for r in ready))
    assert fig.layout.yaxis.range[1] >= peak


def test_memory_stack_of_a_fleet_says_it_is_one_replicas():
    """A several-replica run's memory stack averages its replicas' steps against one replica's pool and GPU; its
    title read 'GPU memory: colocated' over lesson-disaggregation's four replicas as if it were the fleet's."""
    from sim.output.report import fig_memory_stack

    scenario, raw = load_scenario(find_scenario("lesson-disaggregation"), {"workload.num_requests": 20})
    results = {r.name: r for r in run_scenario(scenario, raw).results}
    assert fig_memory_stack(results["colocated"]).layout.title.text == (
        "GPU memory: colocated (one replica, the mean over the steps of its 4 replicas)")
    assert fig_memory_stack(results["2P2D"]).layout.title.text == (
        "GPU memory: 2P2D (one replica, the mean over the steps of its 4 replicas, prefill and decode pools "
        "together)")
    scenario, raw = load_scenario(find_scenario("naive-vs-continuous"), {"workload.num_requests": 5})
    assert fig_memory_stack(run_scenario(scenario, raw).results[1]).layout.title.text == "GPU memory: continuous"


def test_a_disaggregated_runs_replicas_are_named_with_their_pool():
    """lesson-disaggregation's 2P2D: the utilisation legends read 'busy: replica 0' to 'replica 3' and the cluster
    table 0 to 3, without saying which replicas prefill and which decode."""
    import sim.output.report as report
    from sim.output.report import fig_timeline

    scenario, raw = load_scenario(find_scenario("lesson-disaggregation"), {"workload.num_requests": 20})
    run = run_scenario(scenario, raw)
    disagg = next(r for r in run.results if r.name == "2P2D")
    names = [tr.name for tr in fig_timeline(disagg).data if tr.name and tr.name.startswith("busy")]
    assert names == ["busy: replica 0 (prefill)", "busy: replica 1 (prefill)", "busy: replica 2 (decode)",
                     "busy: replica 3 (decode)"]
    (section,) = report._cluster_section(run.results, run.summaries)
    assert "<td>2P2D</td><td>0 (prefill)</td>" in section.html and "<td>2P2D</td><td>3 (decode)</td>" in section.html
    assert "<td>colocated</td><td>0</td>" in section.html


def test_slot_titles_of_a_fleet_say_the_rows_are_stacked_replicas():
    """autoscale-memory-bound's scale-on-busy read '66 rows at the busiest instant; max_num_seqs=256' over 8
    replicas' rows stacked one above the other (each replica's own busiest instant, summed), beside a per-replica
    limit; lesson-disaggregation's 4 colocated replicas likewise."""
    scenario, raw = load_scenario(find_scenario("lesson-disaggregation"), {"workload.num_requests": 40})
    results = [r for r in run_scenario(scenario, raw).results if r.name in ("colocated",)]
    fig = fig_batch_slots(results)
    (title,) = [a.text for a in fig.layout.annotations]
    lay = slot_layout(results[0])
    assert title.endswith(f"{lay.num_rows} rows: 4 replicas stacked, each as many as it held at its busiest "
                          "instant; max_num_seqs=256 per replica"), title


def test_memory_by_request_capacity_of_a_fixed_fleet_is_every_replicas_pool():
    """lesson-disaggregation: 4 colocated replicas and 2P2D's two pools. The title named one replica's 54.6 GiB
    pool beside the bands of all four replicas' requests."""
    from sim.output.report import fig_memory_by_request

    scenario, raw = load_scenario(find_scenario("lesson-disaggregation"), {"workload.num_requests": 40})
    results = {r.name: r for r in run_scenario(scenario, raw).results}
    colocated, disagg = results["colocated"], results["2P2D"]
    one = colocated.kv_capacity_blocks * colocated.kv_bytes_per_block / 2**30
    assert f"KV pool {4 * one:.1f} GiB (all 4 replicas), off the scale" in fig_memory_by_request(colocated).layout.title.text
    pools = disagg.disaggregation["pools"]
    blocks = sum(p["replicas"] * p["kv_capacity_blocks"] for p in pools.values())
    assert f"KV pool {blocks * disagg.kv_bytes_per_block / 2**30:.1f} GiB (all 4 replicas)" in \
        fig_memory_by_request(disagg).layout.title.text


def test_the_reports_tables_write_a_figure_as_the_summary_table_does():
    """The same figure read differently from table to table: 0.883 J per output token and 2,121 W in the summary,
    0.8827 and 2121 in the power table; 112.18 GiB, 8.2 ms and 496.5 ms in the summary, 112.2, 8.15 and 497 in the
    disaggregation table (lesson-disaggregation, 300 requests). Each table writes a figure the summary shows in
    the summary's format."""
    import re
    from html import unescape as html_unescape

    from sim.output.report.disagg import disagg_table_html
    from sim.output.report.energy import energy_sections
    from sim.output.table import table_cells

    scenario, raw = load_scenario(find_scenario("lesson-disaggregation"), {"workload.num_requests": 60})
    run = run_scenario(scenario, raw)
    header, rows = table_cells(run.summaries)
    summary = {row[0]: dict(zip(header[1:], row[1:], strict=False)) for row in rows}

    def cells(fragment: str) -> dict[str, dict[str, str]]:
        head = re.findall(r"<th>([^<]*)</th>", fragment)
        out = {}
        for tr in re.findall(r"<tr>(<td>.*?)</tr>", fragment):
            values = [html_unescape(c) for c in re.findall(r"<td>([^<]*)</td>", tr)]
            out[values[0]] = dict(zip(head, values, strict=True))
        return out

    power = cells(energy_sections(run.results, run.summaries)[0].html)["colocated"]
    assert power["J / output token"] == summary["J / output token"]["colocated"]
    assert power["mean power (W)"] == summary["mean power (W)"]["colocated"] and "," in power["mean power (W)"]
    split = cells(disagg_table_html(run.results, run.summaries))["3P1D"]
    for column, row in (("KV moved (GiB)", "KV moved (GiB)"), ("transfer p50 (ms)", "KV transfer p50 (ms)"),
                        ("transfer p99 (ms)", "KV transfer p99 (ms)"), ("TTFT p99 (ms)", "TTFT p99 (ms)"),
                        ("prefill TTFT p99 (ms)", "prefill TTFT p99 (ms)")):
        assert split[column] == summary[row]["3P1D"], column


def test_timeline_states_stop_at_the_runs_own_end(nvc):
    # on the report's shared axis (to the naive run's end) the continuous run's queues and KV, taken per window,
    # held its last step's values for the rest of the axis: 1 request running some 290 s after the last finished
    from sim.output.report import fig_timeline
    from sim.output.report.common import run_end

    naive, cont = nvc.results
    end, axis_end = run_end(cont), run_end(naive)
    assert axis_end > 2 * end
    fig = fig_timeline(cont, max_points=100, x_end=axis_end)
    states = [t for t in fig.data if t.name in ("running", "waiting", "KV used")]
    assert len(states) == 3
    for t in states:
        y = np.asarray(t.y, dtype=np.float64)
        starts = t.x0 + t.dx * np.arange(len(y))
        assert np.isfinite(y[starts < end]).all() and np.isnan(y[starts >= end]).all(), t.name
        assert np.nanmax(y) > 0
    busy = next(t for t in fig.data if t.name == "busy")  # an amount per window: 0 after the end, as it was
    assert np.asarray(busy.y)[-1] == 0


def test_power_table_writes_a_dash_where_a_run_has_no_steps():
    # every request rejected (prompts longer than max_model_len): no step ran, and the table read "nan" for the
    # peak step power where the summary table writes "-"
    from sim.config.scenario import parse_scenario
    from sim.output.report.energy import energy_sections

    raw = {"name": "none-served", "seed": 0,
           "workload": {"arrival": {"type": "poisson", "rate": 2.0}, "num_requests": 3,
                        "prompt_len": {"type": "fixed", "value": 5000}, "output_len": {"type": "fixed", "value": 10}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096}}
    run = run_scenario(parse_scenario(raw), raw)
    (s,) = run.summaries.values()
    assert s["num_rejected"] == 3 and s["num_steps"] == 0
    page = energy_sections(run.results, run.summaries)[0].html
    assert "nan" not in page.lower()
    assert "<td>-</td>" in page


def test_memory_stack_is_idle_after_the_runs_own_end(nvc):
    # on the axis shared with the naive run, the continuous run's windows past its end held its last step's KV
    # (the last request's tokens) for some 180 s; after the last finish the pool is free and the weights stay
    from sim.output.report import fig_memory_stack
    from sim.output.report.common import run_end

    naive, cont = nvc.results
    end = run_end(cont)
    fig = fig_memory_stack(cont, max_points=100, x_end=run_end(naive))
    layers = {t.name: t for t in fig.data if t.stackgroup == "memory"}
    stored = layers["KV: tokens stored"]
    starts = stored.x0 + stored.dx * np.arange(len(stored.y))
    late = starts >= end
    assert late.sum() > 50 and np.asarray(stored.y)[~late].max() > 0
    weights = float(layers["model weights"].y[0])
    cap = next(t for t in fig.data if t.name == "capacity: weights + KV pool").y[0]
    for name, t in layers.items():
        y = np.asarray(t.y, dtype=np.float64)[late]
        want = weights if name == "model weights" else cap - weights if name == "KV: free blocks" else 0.0
        np.testing.assert_allclose(y, want, rtol=1e-6, err_msg=name)


def test_plotly_text_shows_a_variant_name_with_markup_characters_as_written():
    # plotly.js reads <b>, <i>, <br> in titles and legend names as markup: a variant named "tp<b>2</b>" lost its
    # tags from every chart title and legend entry ("tp2", bold); written as entities they show as typed
    from sim.config.scenario import parse_scenario
    from sim.output.report import build_report

    name = "tp<b>2</b> & co"
    raw = {"name": "markup", "seed": 0,
           "workload": {"arrival": {"type": "poisson", "rate": 4.0}, "num_requests": 4,
                        "prompt_len": {"type": "fixed", "value": 64}, "output_len": {"type": "fixed", "value": 4}},
           "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
           "variants": [{"name": name}]}
    run = run_scenario(parse_scenario(raw), raw)
    page = build_report(run.results, run.summaries, "servesim: markup")
    import re

    shown = re.findall(r'"(?:name|text)":"([^"]*tp[^"]*)"', page)  # legend entries, chart and panel titles
    assert len(shown) >= 5
    assert all("tp&lt;b&gt;2&lt;\\u002fb&gt; &amp; co" in t and "tp\\u003cb" not in t for t in shown), shown
    import servesim  # the notebooks' figures and compare's, likewise

    res = servesim.run(raw)
    names = [tr.name for fig in res.figures().values() for tr in fig.data if tr.name and "tp" in tr.name]
    names += [tr.name for tr in res.compare(res).figure().data]
    assert names and all("tp&lt;b&gt;2&lt;/b&gt; &amp; co" in n for n in names), names


def test_memory_stack_shows_the_weights_before_the_first_step(nvc):
    # "the weights sit at the bottom for the whole run", but the stack began at the first step: blank from 0 to
    # the first arrival (0.55 s here), and in a one-request run arriving at 1.6 s, blank for most of the chart
    from sim.output.report import fig_memory_stack

    naive = nvc.results[0]
    first = float(np.min(naive.steps["start"]))
    assert first > 0.5
    for points in (100_000, 100):  # every step's value, and per window (the first windows hold no step)
        fig = fig_memory_stack(naive, max_points=points)
        layers = {t.name: t for t in fig.data if t.stackgroup == "memory"}
        weights, free, stored = layers["model weights"], layers["KV: free blocks"], layers["KV: tokens stored"]
        if points > 1000:
            assert weights.x[0] == 0.0 and free.x[0] == 0.0 and stored.y[0] == 0
            assert weights.y[0] == weights.y[1] and free.y[0] > free.y[1]
        else:
            assert np.isfinite(np.asarray(weights.y, dtype=np.float64)).all()
            assert np.isfinite(np.asarray(free.y, dtype=np.float64)).all()


def test_summary_units_cover_the_optional_sections():
    # classes, tenants, fairness, anomalies and spec_decode held seconds, fractions and counts with no unit in
    # summary.json's units block (classes-priority: anomalies.starvation.longest_wait 6.35 -- seconds?)
    from sim.output.run_folder import SUMMARY_UNITS

    for key in ("classes", "tenants", "fairness.jain_index", "anomalies.inversions.tolerance",
                "anomalies.head_of_line.per_replica", "anomalies.starvation", "anomalies.service_over_time.t",
                "anomalies.service_over_time.output_tokens", "spec_decode", "spec_decode.draft_seconds"):
        assert key in SUMMARY_UNITS, key
    assert SUMMARY_UNITS["anomalies.starvation"].startswith("s ")
    assert SUMMARY_UNITS["anomalies.service_over_time.t"] == SUMMARY_UNITS["spec_decode.draft_seconds"] == "s"


def test_every_variant_of_a_fifteen_run_sweep_has_its_own_colour():
    """lesson-speculative-decoding runs 3 variants at 5 loads: with plotly's 10 colours cycling, the 11th to 15th
    runs' CDF curves took the 1st to 5th runs' colours (draft-k4-off-under-load at 256 users read as no-spec at 1)."""
    from sim.output.report import fig_latency_cdfs

    scenario, raw = load_scenario(find_scenario("lesson-speculative-decoding"), {"workload.num_requests": 6})
    results = run_scenario(scenario, raw).results
    fig = fig_latency_cdfs(results)
    curves = {t.name: t.line.color for t in fig.data if t.mode == "lines" and t.xaxis == "x"}
    assert len(curves) == len(results) == 15
    assert len(set(curves.values())) == 15, curves
