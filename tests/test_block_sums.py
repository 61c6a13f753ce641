"""Issue 40, item 3: sums over a long run's steps taken a block at a time (sim/metrics/block_sums.py,
sim/metrics/step_figures.py) are those of the whole columns to the bit, whatever the blocks."""

from __future__ import annotations

import numpy as np
import pytest

import sim.metrics.block_sums as block_sums
import sim.metrics.records as records
import sim.metrics.step_figures as step_figures
from sim.config.scenario import parse_scenario
from sim.loop.run import prepare_scenario, run_scenario
from sim.metrics.block_sums import BlockDot, PairwiseSum
from sim.metrics.step_columns import StepColumns
from sim.metrics.sums import dot
from tests.test_long_runs import SCENARIO


@pytest.mark.parametrize("leaf", [128, 1000, 1 << 16])
def test_pairwise_sum_and_dot_in_pieces_equal_numpys_of_the_whole(leaf: int) -> None:
    """Seeded values over twelve orders of magnitude (so that the order of the additions shows in the last
    digits), lengths around numpy's own splits and sums.dot's blocks, fed in pieces of 1 to 65,536 values."""
    rng = np.random.default_rng(11)
    for n in (0, 1, 7, 8, 127, 128, 129, 300, 9999, 10_000, 10_001, 65_537, 200_003, 3_000_001):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
        w = rng.random(n)
        for piece in (1, 7, 4096, 1 << 16):
            if n > 300_000 and piece < 4096:
                continue
            total, prod = PairwiseSum(n, leaf), BlockDot()
            for lo in range(0, n, piece):
                total.add(x[lo : lo + piece])
                prod.add(x[lo : lo + piece], w[lo : lo + piece])
            assert total.value() == float(np.add.reduce(x)), (n, piece)
            assert prod.value() == dot(x, w), (n, piece)


def test_a_pairwise_sum_fed_a_wrong_count_says_so() -> None:
    total = PairwiseSum(10)
    total.add(np.ones(9))
    with pytest.raises(ValueError, match="PairwiseSum of 10 values"):
        total.value()


def _whole_columns(res: records.RunResult) -> dict[str, float]:
    """The figures as the summary and the verdict computed them from whole columns before (2026-12-06)."""
    from sim.metrics.summary import kv_usage_per_step

    s = res.steps
    dur = np.asarray(s["duration"], dtype=np.float64)
    usage, usage_dur, used = kv_usage_per_step(res, dur)
    slots = used * res.block_size
    stored = np.minimum(np.asarray(s["kv_tokens"], dtype=np.float64), slots)
    alloc = slots > 0
    waiting = np.asarray(s["num_waiting"], dtype=np.float64)

    def mean(x: np.ndarray, w: np.ndarray) -> float:
        total = float(w.sum()) if w.size else 0.0
        return dot(x, w) / total if total > 0 else float("nan")

    return {
        "num_steps": int(dur.size), "busy": float(dur.sum()),
        "flops": float(np.asarray(s["flops"], dtype=np.float64).sum()),
        "computed": float(np.sum(s["prefill_tokens"], dtype=np.float64) + np.sum(s["decode_tokens"], dtype=np.float64)
                          + np.sum(s["padding_tokens"], dtype=np.float64)),
        "prefill": float(np.sum(s["prefill_tokens"], dtype=np.float64)),
        "padding": float(np.sum(s["padding_tokens"], dtype=np.float64)),
        "batch": dot(np.asarray(s["batch_size"], dtype=np.float64), dur), "waiting": float(dur[waiting > 0].sum()),
        "usage_mean": mean(usage, usage_dur), "usage_max": float(usage.max()) if usage.size else np.nan,
        "token_share": mean(stored[alloc] / slots[alloc], dur[alloc]),
    }


def _in_blocks(res: records.RunResult) -> dict[str, float]:
    f = step_figures.step_figures(res.steps, res.kv_capacity_blocks, res.block_size)
    return {"num_steps": f.num_steps, "busy": f.busy, "flops": f.flops, "computed": f.computed_tokens,
            "prefill": f.prefill_tokens, "padding": f.padding_tokens, "batch": f.batch_dot,
            "waiting": f.waiting_busy, "usage_mean": f.kv_usage_mean, "usage_max": f.kv_usage_max,
            "token_share": f.kv_token_share}


@pytest.mark.parametrize("rows", [7, 1000])
def test_step_figures_in_small_blocks_equal_the_whole_columns(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """A run whose step log is cut into hundreds of chunks, read 7 or 1,000 steps at a time with numpy's
    summation tree cut at 128 values: every figure equals the whole columns' (the single replica's lazy columns
    and the cluster's), and so does a whole summary against the default blocks."""
    from sim.metrics.summary import summarize
    from sim.output.run_folder import summary_json

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario(SCENARIO)))
    assert isinstance(run.results[0].steps, StepColumns) and len(run.results[0].steps._chunks) > 100
    want = [_whole_columns(r) for r in run.results]
    default = summary_json({r.name: summarize(r) for r in run.results})
    monkeypatch.setattr(step_figures, "ROWS", rows)
    monkeypatch.setattr(block_sums, "LEAF", 128)
    got = [_in_blocks(r) for r in run.results]
    assert all(r.steps and len(r.steps["duration"]) > 10 * rows for r in run.results)
    assert repr(got) == repr(want)  # repr: NaN equals NaN
    assert summary_json({r.name: summarize(r) for r in run.results}) == default


def test_a_gap_pool_holds_its_distinct_gaps_and_pools_as_everything_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pairs added a few at a time, pooled past POOL_MIN: the pool ends as pooled_gaps of every pair at once, and
    holds at most twice its distinct gaps plus POOL_MIN pairs on the way; below POOL_MIN, the pairs in order."""
    import sim.metrics.gap_pool as gap_pool

    rng = np.random.default_rng(5)
    gaps = np.round(rng.exponential(0.02, 50_000), 5)  # repeats, as a decode stretch's steps make
    counts = rng.integers(1, 300, gaps.size)
    pool = gap_pool.GapPool()
    for lo in range(0, 1000, 10):
        pool.add(gaps[lo : lo + 10], counts[lo : lo + 10])
    assert [a.tolist() for a in pool.arrays()] == [gaps[:1000].tolist(), counts[:1000].tolist()]
    monkeypatch.setattr(gap_pool, "POOL_MIN", 64)
    pool, most = gap_pool.GapPool(), 0
    for lo in range(0, gaps.size, 10):
        pool.add(gaps[lo : lo + 10], counts[lo : lo + 10])
        most = max(most, len(pool.arrays()[0]))
    want = gap_pool.pooled_gaps(gaps, counts)
    assert [a.tolist() for a in gap_pool.pooled_gaps(*pool.arrays())] == [a.tolist() for a in want]
    assert most <= 2 * len(want[0]) + 64 < gaps.size


def test_outputs_do_not_depend_on_pooling_the_gaps_as_they_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output of the long-run scenario (summary, requests, steps, OpenMetrics) is the same when its gaps
    are pooled every 16 pairs, its step log cut into hundreds of chunks."""
    import sim.metrics.gap_pool as gap_pool
    from tests.test_long_runs import _outputs

    monkeypatch.setattr(records, "_CHUNK", 7)
    whole = _outputs()
    monkeypatch.setattr(gap_pool, "POOL_MIN", 16)
    assert _outputs() == whole


@pytest.mark.parametrize("keep", [0, 1 << 20])
def test_run_energy_read_in_blocks_equals_the_whole_arrays(monkeypatch: pytest.MonkeyPatch, keep: int) -> None:
    """A run's energy (in all, peak step power, per request) computed 1,000 steps at a time from a log of hundreds
    of chunks is, to the bit, what the whole per-step arrays give (the formulas as they were, and the same run's
    steps as a plain dict of columns), whether the energy blocks are kept through the attribution's passes or their
    energy is written to a file and read back by each (``KEEP_ENERGY_ROWS``)."""
    from dataclasses import replace

    import sim.costs.energy as energy
    from sim.metrics.step_columns import step_blocks

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    pm = res.power
    assert pm is not None and isinstance(res.steps, StepColumns)
    dur = np.asarray(res.steps["duration"], dtype=np.float64)
    power = pm.power(*energy.busy_shares(pm, res.steps))
    up = energy.up_seconds(res)
    total = float((power * dur).sum()) + max(up - float(dur.sum()), 0.0) * pm.idle_w * pm.gpus
    plain = replace(res, steps={k: np.array(v) for k, v in res.steps.items()})
    want = energy.attribute(plain, power * dur, total)
    monkeypatch.setattr(energy, "ATTRIBUTE_ROWS", 1000)
    monkeypatch.setattr(energy, "step_blocks", lambda s, k, rows=1000: step_blocks(s, k, 1000))
    monkeypatch.setattr(energy, "KEEP_ENERGY_ROWS", keep)
    for r in (res, plain):
        e = energy.run_energy(r)
        assert e is not None and len(dur) > 10_000
        assert (e.energy_j, e.peak_step_power_w) == (total, float(power.max()))
        assert e.request_energy_j.tobytes() == want.tobytes()
        assert e.step_energy_j.tobytes() == (power * dur).tobytes()


@pytest.mark.parametrize("rows", [7, 1000])
def test_power_series_read_in_blocks_equal_the_whole_arrays(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """The report's power over time and the OpenMetrics text (its sampled steps, thinned or not, with their gauges
    and preemptions, and the power and energy series), read 7 or 1,000 steps at a time from a log of hundreds of
    chunks, are those of the same steps as whole arrays (a dict of columns)."""
    from dataclasses import replace

    import sim.costs.energy as energy
    import sim.costs.energy_time as energy_time
    import sim.output.benchfiles.export_metrics as export_metrics
    from sim.metrics.step_columns import step_blocks
    from sim.output.benchfiles.export_metrics import openmetrics_text

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    plain = replace(res, steps={k: np.array(v) for k, v in res.steps.items()})
    curve, text = energy_time.power_over_time(plain), openmetrics_text(plain)
    thinned = openmetrics_text(plain, max_points=50)
    assert curve is not None and "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    monkeypatch.setattr(energy, "step_blocks", lambda s, k, r=rows: step_blocks(s, k, rows))
    monkeypatch.setattr(export_metrics, "step_blocks", lambda s, k: step_blocks(s, k, rows))
    got = energy_time.power_over_time(res)
    assert got is not None and [a.tobytes() for a in got] == [a.tobytes() for a in curve]
    assert export_metrics._sampled_in_blocks(res.steps, 50) is not None
    assert openmetrics_text(res) == text
    assert openmetrics_text(res, max_points=50) == thinned != text


@pytest.mark.parametrize(("rows", "max_bins"), [(7, 2000), (1000, 5), (1 << 16, 5), (7, 100_000)])
def test_binned_steps_read_in_blocks_equal_the_whole_columns(monkeypatch: pytest.MonkeyPatch, rows: int,
                                                              max_bins: int) -> None:
    """steps_binned.csv of one replica's log read 7 or 1,000 steps at a time (bins of a few steps, or five bins
    of thousands, each summed across many blocks with numpy's tree cut at 128 values) is the text the whole
    columns give."""
    import io

    import sim.metrics.steps_binned as binned

    monkeypatch.setattr(records, "_CHUNK", 7)
    width = binned.bin_width
    monkeypatch.setattr(binned, "bin_width", lambda span: width(span, max_bins))
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    assert isinstance(res.steps, StepColumns)
    whole = binned._binned({k: np.array(v) for k, v in res.steps.items()})
    monkeypatch.setattr(binned, "ROWS", rows)
    monkeypatch.setattr(block_sums, "LEAF", 128)
    got = binned._binned_in_blocks(res.steps)
    assert whole is not None and got is not None and repr(got) == repr(whole)
    if (rows, max_bins) == (1000, 5):
        assert max(whole[3]) > 3 * rows  # bins span several blocks
    if max_bins == 100_000:  # bins shorter than a step: steps run through bins that no step starts in
        assert 0 in whole[3]
    text = io.StringIO()
    binned.write_binned_steps_csv(text, [res])
    assert text.getvalue().count("\n") == len(whole[0]) + 1


@pytest.mark.parametrize("rows", [7, 1000])
def test_memory_stack_read_in_blocks_equals_the_whole_layers(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """The report's GPU memory stack of one replica's log (its five layers' per-window means and the capacity
    line), read 7 or 1,000 steps at a time with numpy's tree cut at 128 values, is the figure the whole layers
    give (the same steps as a dict of columns), to the byte of its JSON."""
    from dataclasses import replace

    import sim.output.report.memory as memory
    from sim.metrics.step_columns import step_blocks

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    plain = replace(res, steps={k: np.array(v) for k, v in res.steps.items()})
    want = memory.fig_memory_stack(plain).to_json()
    monkeypatch.setattr(memory, "step_blocks", lambda s, k: step_blocks(s, k, rows))
    monkeypatch.setattr(block_sums, "LEAF", 128)
    assert isinstance(res.steps, StepColumns) and res.steps.num_steps > memory.MEMORY_POINTS
    assert memory._windowed_in_blocks(res, res.steps, np.linspace(0, 10, 5), 1.0) is not None
    assert memory.fig_memory_stack(res).to_json() == want


@pytest.mark.parametrize("rows", [7, 1000])
def test_timeline_read_in_blocks_equals_the_whole_columns(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """The report's utilisation timeline (busy, MFU, KV and queue peaks per window, preemptions) and throughput
    chart of one replica's log taken as a long run's, read 7 or 1,000 steps at a time, are the figures the whole
    columns give (the same steps as a dict of columns), to the byte of their JSON."""
    from dataclasses import replace

    import sim.output.report.figures as figures
    import sim.output.report.timeline_blocks as timeline_blocks
    from sim.metrics.step_columns import step_blocks

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    plain = replace(res, steps={k: np.array(v) for k, v in res.steps.items()})
    want = figures.fig_timeline(plain, max_points=200).to_json()
    want_throughput = figures.fig_throughput([plain], max_points=200).to_json()
    monkeypatch.setattr(figures, "KEEP_EVENTS_MAX", 0)
    monkeypatch.setattr(timeline_blocks, "step_blocks", lambda s, k: step_blocks(s, k, rows))
    assert isinstance(res.steps, StepColumns) and res.steps.num_steps > 10 * rows
    series = timeline_blocks.timeline_series(res, res.steps, np.linspace(0, res.duration, 201))
    assert series is not None and series.mfu is not None
    assert figures.fig_timeline(res, max_points=200).to_json() == want
    assert timeline_blocks.amount_in_blocks(res.steps, "decode_tokens", np.linspace(0, 10, 5)) is not None
    assert figures.fig_throughput([res], max_points=200).to_json() == want_throughput


def test_step_blocks_read_a_key_asked_twice_once() -> None:
    """A key asked for twice (a window of a column over itself) gives that column's values once, not twice."""
    from sim.metrics.step_columns import step_blocks

    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    steps = run.results[0].steps
    ((_, block),) = list(step_blocks(steps, ("duration", "start", "duration")))
    assert block["duration"].tobytes() == np.asarray(steps["duration"]).tobytes()


def test_a_run_without_steps_exports_its_openmetrics_text() -> None:
    """A run whose every request is rejected (a prompt past max_model_len) has an empty step log: its OpenMetrics
    text is the whole columns' (the families' headers, no samples), not a traceback from the block-wise reader."""
    from dataclasses import replace

    from sim.output.benchfiles.export_metrics import openmetrics_text

    raw = {**SCENARIO, "workload": {"arrival": {"type": "poisson", "rate": 1.0}, "num_requests": 2,
                                    "prompt_len": {"type": "fixed", "value": 20_000},
                                    "output_len": {"type": "fixed", "value": 1}},
           "variants": SCENARIO["variants"][:1]}
    (res,) = run_scenario(prepare_scenario(parse_scenario(raw))).results
    assert isinstance(res.steps, StepColumns) and res.steps.num_steps == 0
    plain = replace(res, steps={k: np.array(v) for k, v in res.steps.items()})
    assert openmetrics_text(res) == openmetrics_text(plain)
    assert "# TYPE vllm:num_requests_running gauge" in openmetrics_text(res)


@pytest.mark.parametrize("rows", [1, 7, 1000])
def test_running_sums_at_request_times_by_blocks_are_the_whole_columns(rows: int) -> None:
    """Energy attribution's lookups (its running sums before np.searchsorted(start, x, side="left")) read the steps
    a block at a time: times before, between, on (repeated starts, a block's first or last) and after the starts
    read what the whole columns' running sums hold there, to the bit, also when written as the difference from
    an array given; starts out of order give None."""
    import sim.costs.energy as energy

    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    start = np.asarray(run.results[0].steps["start"], dtype=np.float64)
    n = len(start)
    rng = np.random.default_rng(9)
    x = np.concatenate((rng.choice(start, 500), rng.uniform(-1.0, float(start[-1]) + 1.0, 500), start[::97],
                        [start[0], start[-1], -5.0, 1e9]))
    pf, dec = rng.integers(0, 50, n).astype(np.float64), rng.integers(0, 3, n).astype(np.float64)
    e = rng.uniform(0, 2, n)

    def blocks(st: np.ndarray = start):  # (first row, start, prefill, decode tokens, J), as energy reads them
        for lo in range(0, n, rows):
            yield lo, st[lo : lo + rows], pf[lo : lo + rows], dec[lo : lo + rows], e[lo : lo + rows]

    tok = pf + dec
    pt = np.divide(e, tok, out=np.zeros_like(e), where=tok > 0)
    whole = [energy._cumsum0(v) for v in (pt, pt * pf, pf)]  # attribute's c_dec, c_pre_e, c_pre_n
    at = np.searchsorted(start, x, side="left")
    base = rng.uniform(size=len(x))
    got = energy._sums_at(x, blocks(), [(energy._PRE_N, None), (energy._DEC, base.copy()), (energy._PRE_E, None)])
    assert got is not None and n > 1000 and at.min() == 0 and at.max() == n
    assert got[0].tobytes() == whole[2][at].tobytes() and got[2].tobytes() == whole[1][at].tobytes()
    assert got[1].tobytes() == (whole[0][at] - base).tobytes()
    assert energy._sums_at(x, blocks(rng.permutation(start)), [(energy._DEC, None)]) is None


@pytest.mark.parametrize("how", ["sum", "max"])
def test_run_sums_fed_in_pieces_equal_reduceat_of_the_whole(how: str) -> None:
    """RunSums fed in pieces of 7 to 65,536 values, runs of 1 to 70,000 values (whole runs inside a piece are
    reduced by one reduceat of the piece, the others across pieces), equals np.add.reduceat / np.maximum.reduceat
    of the whole array to the bit, NaNs included."""
    rng = np.random.default_rng(5)
    counts = [int(c) for c in rng.choice([1, 2, 3, 8, 9, 127, 128, 129, 1000, 5000], 300)] + [70_000, 1, 1]
    n = sum(counts)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
    x[rng.integers(0, n, 3)] = np.nan
    first = np.cumsum([0, *counts[:-1]])
    whole = (np.maximum if how == "max" else np.add).reduceat(x, first)
    for piece in (7, 1000, 1 << 16):
        sums = block_sums.RunSums(counts, how)
        for lo in range(0, n, piece):
            sums.add(x[lo : lo + piece])
        assert np.array(sums.sums).tobytes() == whole.tobytes(), piece


def test_the_report_reads_a_long_runs_log_once_for_its_windowed_amounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside step_events_kept (build_report), a long run's timeline and throughput figures window its busy time,
    FLOPs, decode and prefill tokens in one pass over the log, and check its order and find its end once: they
    read the log 13 times before (each amount and each check a pass of its own), and give the same figures."""
    from collections import Counter

    import sim.output.report.common as common
    import sim.output.report.figures as figures
    import sim.output.report.timeline_blocks as timeline_blocks
    from sim.metrics.step_columns import step_blocks
    from sim.output.report import step_events_kept

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    want = (figures.fig_timeline(res, max_points=200).to_json(), figures.fig_throughput([res], max_points=200).to_json())
    passes: Counter[tuple[str, ...]] = Counter()

    def counted(s, keys, rows=1000):
        passes[tuple(keys)] += 1
        return step_blocks(s, keys, rows)

    monkeypatch.setattr(figures, "KEEP_EVENTS_MAX", 0)
    for module in (common, timeline_blocks):
        monkeypatch.setattr(module, "step_blocks", counted)
    with step_events_kept():
        got = (figures.fig_timeline(res, max_points=200).to_json(),
               figures.fig_throughput([res], max_points=200).to_json())
    assert got == want
    assert passes[("start", "duration", *timeline_blocks.WINDOWED)] == 1
    assert sum(passes.values()) == 6, passes  # end, order of starts, of steps, amounts, windows, peaks


def test_write_phase_reads_the_power_the_summary_spilled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run's step power, written to a file while its energy is computed (``SpilledPower``), is what the
    report's power chart and the metrics export read back inside ``energy_kept`` instead of making it again from
    the busy columns: the same bytes either way. Pickled, the file becomes None (a sweep's worker's results)."""
    import pickle

    import sim.costs.energy as energy
    import sim.costs.energy_time as energy_time
    from sim.output.benchfiles.export_metrics import openmetrics_text

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    curve, text = energy_time.power_over_time(res), openmetrics_text(res)  # outside energy_kept: made again
    assert curve is not None
    monkeypatch.setattr(energy, "KEEP_ENERGY_ROWS", 0)  # the energy to a file, as a long run's
    with energy.energy_kept():
        e = energy.run_energy(res)
        assert e is not None and e.power_spill is not None and e.power_spill.num_steps == res.steps.num_steps
        monkeypatch.setattr(energy, "_made_power_blocks", lambda *a, **k: pytest.fail("power made again"))
        got = energy_time.power_over_time(res)
        assert got is not None and [a.tobytes() for a in got] == [a.tobytes() for a in curve]
        assert openmetrics_text(res) == text
    assert pickle.loads(pickle.dumps(e)).power_spill is None
