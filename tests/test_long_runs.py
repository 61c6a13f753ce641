"""Issue 15, long runs in bounded memory: the step log's columns are read lazily from its compact chunks
(sim/metrics/step_columns.py), and what a run writes must not depend on how many chunks the log was cut into."""

from __future__ import annotations

import numpy as np
import pytest

import sim.metrics.records as records
from sim.config.scenario import parse_scenario
from sim.loop.run import prepare_scenario, run_scenario
from sim.metrics.step_columns import StepColumns
from sim.metrics.steps_binned import write_binned_steps_csv
from sim.metrics.summary import summarize
from sim.output.benchfiles.export_metrics import openmetrics_text
from sim.output.run_folder import requests_csv, steps_csv, summary_json

SCENARIO = {
    "name": "long-run-chunks",
    "seed": 3,
    "workload": {"arrival": {"type": "trace", "trace": "azure-conv", "repeat_to": 400}},
    "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 16384},
    "slos": {"ttft": 1.0, "tpot": 0.05},
    "variants": [
        {"name": "chunked", "policy": {"type": "continuous", "enable_chunked_prefill": True,
                                       "max_num_batched_tokens": 2048}},
        {"name": "two", "cluster": {"replicas": 2, "router": "least_kv"},
         "policy": {"type": "continuous", "enable_chunked_prefill": True, "max_num_batched_tokens": 2048}},
    ],
}


def _outputs() -> dict[str, str]:
    import io

    run = run_scenario(prepare_scenario(parse_scenario(SCENARIO)))
    binned = io.StringIO()
    write_binned_steps_csv(binned, run.results)
    return {
        "summary": summary_json(run.summaries),
        "requests": requests_csv(run.results),
        "steps": steps_csv(run.results),
        "binned": binned.getvalue(),
        **{f"metrics {r.name}": openmetrics_text(r) for r in run.results},
        "num_chunks": str(sum(1 for r in run.results if isinstance(r.steps, StepColumns)
                              and len(r.steps._chunks) > 1)),
    }


def test_outputs_do_not_depend_on_the_step_log_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _outputs()
    monkeypatch.setattr(records, "_CHUNK", 7)  # a chunk every few runs: hundreds of chunks
    cut = _outputs()
    assert whole.pop("num_chunks") == "0"
    assert int(cut.pop("num_chunks")) >= 1  # the single replica's log really was cut
    assert cut == whole


def test_outputs_do_not_depend_on_the_step_log_spilling_to_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past spill.SPILL_MIN steps the log's chunks move to a temporary file and are read back a field at a time:
    every output is byte for byte that of the log kept in memory, and a result still pickles (sweeps), its
    chunks read back into memory."""
    import pickle

    import sim.metrics.spill as spill

    whole = _outputs()
    monkeypatch.setattr(records, "_CHUNK", 7)
    monkeypatch.setattr(spill, "SPILL_MIN", 20)  # a few chunks in memory, then every chunk to the file
    spilled = _outputs()
    assert int(spilled.pop("num_chunks")) >= 1
    whole.pop("num_chunks")
    assert spilled == whole
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    assert isinstance(res.steps, StepColumns)
    assert all(isinstance(part, spill.SpilledFields) for chunk in res.steps._chunks for part in chunk)
    back = pickle.loads(pickle.dumps(res.steps))
    assert all(isinstance(part, np.ndarray) for chunk in back._chunks for part in chunk)
    for k in records.STEP_COLUMNS:
        assert back[k].tobytes() == res.steps[k].tobytes() and back[k].dtype == res.steps[k].dtype, k


def test_step_count_reads_no_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """step_count (the run folder's choice of steps.csv or steps_binned.csv, energy) counts a log's steps without
    expanding a column (the start column, 8 bytes a step, was the write phase's largest array); a dict of columns
    is counted by its start column."""
    from sim.metrics.step_columns import step_count

    monkeypatch.setattr(records, "_CHUNK", 7)
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    steps = run.results[0].steps
    assert isinstance(steps, StepColumns) and len(steps._chunks) > 1
    n = len(steps["start"])
    monkeypatch.setattr(StepColumns, "__getitem__", lambda self, key: pytest.fail(f"column {key} expanded"))
    assert step_count(steps) == n > 1000
    assert step_count({"start": np.zeros(5), "end": np.zeros(5)}) == 5


def test_columns_are_the_expanded_runs_and_read_only() -> None:
    log = records.StepLog()
    log.append(0.0, 1.0, 2, 0, 10, 1, 0, 3, 1, 30, 100, 2, 5, 0, 0, 0, 0, 7.0)
    # a decode run of three steps as the fast path appends it (StepLog.stretches): 3 blocks in use and filled
    # before it, 30 tokens held, 2 members: the second step fills a new block, which it takes (paged KV)
    log.ends.extend((1.5, 2.5, 3.0))
    log.flops.extend((1.0, 1.0, 1.0))
    log.need.extend((0, 1, 1))
    log.stretches.extend((3, 3, 3, 30, 2, 1))
    log.end_decode_run(3, 1.0, 2, 100, 2, 4, 0)
    cols = log.columns()
    assert isinstance(cols, StepColumns) and len(cols["start"]) == 4
    assert cols["start"].tolist() == [0.0, 1.0, 1.5, 2.5]
    assert cols["duration"].tolist() == [1.0, 0.5, 1.0, 0.5]
    assert cols["num_waiting"].tolist() == [5, 4, 4, 4] and cols["num_waiting"].dtype == np.int64
    assert cols["decode_tokens"].tolist() == [1, 2, 2, 2]
    assert cols["kv_blocks_used"].tolist() == [3, 3, 4, 4] and cols["kv_blocks_reserved"].tolist() == [1, 0, 0, 0]
    assert cols["kv_tokens"].tolist() == [30, 32, 34, 36] and cols["flops"].tolist() == [7.0, 1.0, 1.0, 1.0]
    gaps, counts = log.group_gaps()
    assert gaps.tolist() == [0.5, 1.0, 0.5] and counts.tolist() == [2, 2, 2]
    with pytest.raises(ValueError):
        cols["start"][0] = 9.0  # shared by readers: nobody writes into it
    with pytest.raises(KeyError):
        cols["nope"]
    assert set(cols) == set(records.STEP_COLUMNS)


def test_start_and_duration_are_kept_besides_the_recent_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nearly every reader reads the steps' start and duration, the costliest columns to expand: a short run's are
    expanded once and kept while other columns come and go; a long run's are expanded at each read, as before."""
    import sim.metrics.step_columns as step_columns

    def six_steps() -> StepColumns:
        log = records.StepLog()
        for i in range(6):
            log.append(float(i), i + 0.5, 1, 0, 0, 1, 0, 1, 0, 1, 10, 1, 0, 0, 0, 0, 0, 1.0)
        return log.columns()

    cols = six_steps()
    start, duration = cols["start"], cols["duration"]
    for k in ("kv_tokens", "num_running", "flops", "batch_size"):  # more than the recent ones kept
        cols[k]
    assert cols["start"] is start and cols["duration"] is duration
    assert start.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and duration.tolist() == [0.5] * 6
    monkeypatch.setattr(step_columns, "_RECENT_MAX_ROWS", 5)
    long = six_steps()
    assert long["start"] is not long["start"] and long["start"].tolist() == start.tolist()


def test_summary_of_lazy_columns_equals_that_of_a_dict() -> None:
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    assert isinstance(res.steps, StepColumns)
    eager = {k: np.array(v) for k, v in res.steps.items()}
    lazy = summarize(res)
    res.steps = eager
    assert summary_json({"x": summarize(res)}) == summary_json({"x": lazy})


def test_itl_statistics_from_pairs_match_the_expanded_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ITL_EXPAND_MAX tokens the vllm-bench statistics and the OpenMetrics histogram come from the (gap,
    count) pairs: percentiles and bucket counts exactly those of the expanded gaps, mean, std and sum to rounding."""
    import sim.output.benchfiles.stats as stats

    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    expanded, text = stats.run_stats(res, (50.0, 90.0, 99.0)), openmetrics_text(res)
    monkeypatch.setattr(stats, "ITL_EXPAND_MAX", 0)
    paired, paired_text = stats.run_stats(res, (50.0, 90.0, 99.0)), openmetrics_text(res)
    assert int(np.sum(res.itl_counts)) > 10_000
    for k, v in expanded.items():
        if k.startswith(("mean_itl", "std_itl")):
            assert paired[k] == pytest.approx(v, rel=1e-12)
        else:
            assert paired[k] == v, k
    lines = [(a, b) for a, b in zip(text.splitlines(), paired_text.splitlines(), strict=True) if a != b]
    assert [a.split(" ")[0] for a, _ in lines] in ([], ['vllm:inter_token_latency_seconds_sum{model_name="llama-3.1-8b",'
                                                        'engine="0"}'])
    for a, b in lines:
        assert float(b.split(" ")[1]) == pytest.approx(float(a.split(" ")[1]), rel=1e-12)


@pytest.mark.parametrize("leaf", [128, 1000, 1 << 20])
def test_pooled_itl_statistics_equal_numpys_on_the_expanded_gaps_to_the_bit(monkeypatch: pytest.MonkeyPatch,
                                                                              leaf: int) -> None:
    """describe_pooled and expanded_sum give np.mean, np.median, np.std, np.percentile and np.sum of
    np.repeat(gaps, counts) bit for bit, expanding at most ``leaf`` values at a time (numpy's pairwise summation
    tree is followed down to there); seeded gaps in the order a run stores them and shuffled, odd and even
    totals, and 3 M values, past numpy's own blocks."""
    import sim.output.benchfiles.stats as stats

    monkeypatch.setattr(stats, "_LEAF", leaf)
    rng = np.random.default_rng(7)
    for distinct, mean_count in ((1, 5), (7, 1), (1000, 3), (20_000, 150)):
        gaps = np.sort(rng.lognormal(-3.5, 0.8, distinct))
        if distinct % 2:
            gaps = rng.permutation(gaps)
        counts = rng.integers(1, 2 * mean_count, distinct)
        for total in (counts, np.where(np.arange(distinct) == 0, counts + 1, counts)):  # odd and even sums
            x = np.repeat(gaps, total)
            assert stats.expanded_sum(gaps, total) == float(np.sum(x))
            assert stats.describe_pooled("itl", gaps, total, (50.0, 99.0, 99.9)) == \
                stats._describe("itl", x, (50.0, 99.0, 99.9))
    assert x.size > 3_000_000


@pytest.mark.parametrize("rows", [1, 7, 4096, 1 << 16])
def test_step_blocks_are_the_columns_cut_and_energy_does_not_depend_on_them(monkeypatch: pytest.MonkeyPatch,
                                                                            rows: int) -> None:
    """step_blocks gives the whole columns' values block by block, from a step log cut into hundreds of chunks
    and from a plain dict; the energy figures computed a block at a time are those of one block."""
    import sim.costs.energy as energy
    from sim.metrics.step_columns import step_blocks

    monkeypatch.setattr(records, "_CHUNK", 7)  # hundreds of chunks, of uneven sizes
    run = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]})))
    (res,) = run.results
    assert isinstance(res.steps, StepColumns) and len(res.steps._chunks) > 100
    keys = ("start", "duration", "batch_size", "kv_tokens", "flops")
    for steps in (res.steps, {k: np.asarray(res.steps[k]) for k in keys}):
        got = list(step_blocks(steps, keys, rows))
        assert [lo for lo, _ in got] == list(range(0, len(steps["start"]), rows))
        for k in keys:
            assert np.concatenate([b[k] for _, b in got]).tolist() == np.asarray(res.steps[k]).tolist()
    assert res.power is not None
    whole = energy.busy_shares(res.power, res.steps)  # blocks of 2^16: one block
    monkeypatch.setattr(energy, "step_blocks", lambda s, k: step_blocks(s, k, rows))
    cut = energy.busy_shares(res.power, res.steps)
    assert [a.tolist() for a in cut] == [a.tolist() for a in whole]


def test_pooled_gaps_equal_numpys_unique_and_bincount() -> None:
    """pooled_gaps sorts once and sums runs of equal gaps: the values and counts np.unique and bincount gave."""
    from sim.loop.results import pooled_gaps

    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 1000, 200_000):
        gaps = np.round(rng.exponential(0.02, n), 4)  # many repeats, as a decode stretch's steps make
        counts = rng.integers(1, 300, n)
        uniq, inverse = np.unique(gaps, return_inverse=True)
        want = np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64)
        got = pooled_gaps(gaps, counts)
        assert got[0].tolist() == uniq.tolist() and got[1].tolist() == want.tolist()
        assert (got[0].dtype, got[1].dtype) == (np.float64, np.int64)


def test_step_log_packs_counts_as_int32_only_where_they_fit() -> None:
    """The log's chunks hold counts as int32 (28 bytes a step, 64 a run); a count past int32 stays float64, so
    every value reads back as logged."""
    log = records.StepLog()
    for i in range(5):
        log.append(float(i), i + 0.5, 3, 0, 0, 3, 0, 10 + i, 0, 2**40 + i, 7, 3, 0, 0, 0, 0, 0, 1.5e12)
    # a decode run of one step (StepLog.stretches): 12 blocks in use, 11 filled, 2 tokens held
    log.ends.append(5.5)
    log.flops.append(1.5e12)
    log.need.append(0)
    log.stretches.extend((1, 12, 11, 2, 0, 1))
    log.end_decode_run(1, 5.0, 3, 7, 3, 0, 0)
    cols = log.columns()
    steps, runs = log._chunks[0]
    assert steps.dtype["kv_blocks_used"] == np.int32 and steps.dtype["kv_tokens"] == np.float64
    assert runs.dtype["batch_size"] == np.int32 and steps.dtype["end"] == np.float64
    assert steps.dtype.itemsize == 8 + 4 + 4 + 8 + 8 and runs.dtype.itemsize == 8 + 14 * 4
    assert cols["kv_tokens"].tolist() == [2**40 + i for i in range(5)] + [2]
    assert cols["kv_blocks_used"].tolist() == [10, 11, 12, 13, 14, 12]
    assert cols["kv_blocks_reserved"].tolist() == [0, 0, 0, 0, 0, 1]
    assert cols["duration"].tolist() == [0.5] * 6 and cols["flops"].tolist() == [1.5e12] * 6


def test_a_full_disk_under_the_spilled_step_log_is_one_message(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A long run spills its step log to a temporary file: a disk that fills meanwhile ends the run with exit 2 and
    one message naming what was written where (not a traceback), and no run folder."""
    import errno
    import os

    import yaml
    from typer.testing import CliRunner

    import sim.metrics.spill as spill
    from sim.cli.main import app

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(records, "_CHUNK", 7)
    monkeypatch.setattr(spill, "SPILL_MIN", 20)
    monkeypatch.setattr(spill.os, "pwrite", full)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "variants": SCENARIO["variants"][:1]}))
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 2, res.output
    assert "error: simulating long-run-chunks: No space left on device while spilling the step log" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()


def test_a_run_of_ten_million_requests_is_admitted_and_one_more_refused() -> None:
    # the bound is what benchmarks/bench_million.py ran (docs/benchmarks.md: 10,000,000 requests within 2 GB)
    from sim.config.errors import ScenarioError
    from sim.config.limits import MAX_REQUESTS

    assert MAX_REQUESTS == 10_000_000
    for key in ("repeat_to", "num_requests"):
        def scenario(n: int, key: str = key) -> dict:
            workload = {"arrival": {**SCENARIO["workload"]["arrival"], "repeat_to": n}} if key == "repeat_to" else \
                {"arrival": {"type": "poisson", "rate": 1.0}, "num_requests": n,
                 "prompt_len": {"type": "fixed", "value": 8}, "output_len": {"type": "fixed", "value": 8}}
            return {**SCENARIO, "workload": workload}

        assert parse_scenario(scenario(MAX_REQUESTS)).workload is not None
        with pytest.raises(ScenarioError, match=f"{key}: 10000001 requests would need about .* at most 10000000"):
            parse_scenario(scenario(MAX_REQUESTS + 1))



def test_binned_steps_start_at_whole_multiples_of_their_width() -> None:
    # a bin's start was its index times the width in floating point: 29 x 0.05 read 1.4500000000000002
    import csv
    import io
    from dataclasses import replace

    res = run_scenario(prepare_scenario(parse_scenario({**SCENARIO, "variants": SCENARIO["variants"][:1]}))).results[0]
    for log in (res.steps, {k: np.asarray(v) for k, v in res.steps.items()}):  # read in blocks, and whole
        out = io.StringIO()
        write_binned_steps_csv(out, [replace(res, steps=log)])
        starts = [r["start_s"] for r in csv.DictReader(io.StringIO(out.getvalue()))]
        assert len(starts) > 10
        assert all(x == repr(round(float(x), 9)) for x in starts), [x for x in starts if x != repr(round(float(x), 9))]


def test_binned_busy_seconds_are_split_over_the_bins_a_step_runs_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: busy_s summed the durations of the steps starting in a bin, so a bin read up to 3.14x its width
    # (lesson-continuous-batching --steps binned) and the bins after read too little; a bin that a long step ran
    # through, no step starting in it, had no row. Now each bin has the seconds a step ran in it.
    import sim.metrics.steps_binned as sb

    n = 4
    steps = {"start": np.array([0.0, 1.5, 5.0, 6.0]), "duration": np.array([1.5, 3.5, 1.0, 0.5]),
             "replica": np.zeros(n, dtype=np.int64), "batch_size": np.array([1, 4, 2, 3])}
    for c in ("prefill_tokens", "decode_tokens", "padding_tokens", "padded_rows", "num_preempted", "num_rejected",
              "swap_blocks", "flops", "kv_blocks_used", "kv_tokens", "kv_capacity_blocks", "num_running",
              "num_waiting", "num_swapped"):
        steps[c] = np.arange(1, n + 1)
    monkeypatch.setattr(sb, "bin_width", lambda span: 2.0)
    cols = sb._binned(steps)
    assert cols is not None
    rows = [dict(zip(sb.BINNED_COLUMNS, r, strict=True)) for r in zip(*cols, strict=True)]
    # bins of 2 s: [0, 2) holds step 0 and half a second of step 1, [2, 4) only step 1 running, [4, 6) its last
    # second and step 2, [6, 8) step 3
    assert [r["start_s"] for r in rows] == [0.0, 2.0, 4.0, 6.0]
    assert [r["num_steps"] for r in rows] == [2, 0, 1, 1]
    assert [r["busy_s"] for r in rows] == [2.0, 2.0, 2.0, 0.5]
    assert rows[1]["mean_batch_size"] == 4 and rows[1]["max_batch_size"] == 4 and rows[1]["decode_tokens"] == 0
    assert rows[0]["decode_tokens"] == 1 + 2  # the tokens count in the bin where their step starts

