"""The write phase reads a long run's requests a block at a time (issue 40, item 3): what each reader holds must
not grow with the run, and what it writes must be what the whole columns give, to the bit."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import sim.metrics.request_table as table_module
from sim.metrics.request_table import RequestTable, compact, latency_blocks
from sim.output.benchfiles import export_metrics
from sim.output.benchfiles.export_metrics import E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, _histogram


def table_of(n: int, seed: int = 0) -> RequestTable:
    """n requests as a run's table keeps them: a tenth rejected (no first token), some with one output token."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.2, n))
    first_sched = arrival + rng.exponential(0.05, n)
    first_token = first_sched + rng.exponential(0.1, n)
    out_tok = rng.integers(1, 400, n)
    finish = first_token + out_tok * rng.uniform(0.01, 0.05, n)
    outcome = (rng.random(n) < 0.1).astype(np.int32)  # 0 completed, 1 rejected
    first_sched[outcome == 1] = first_token[outcome == 1] = -1.0
    numeric = {"id": np.arange(n), "arrival": arrival, "first_scheduled": first_sched, "first_token": first_token,
               "finish": finish, "prompt_tokens": rng.integers(1, 3000, n), "output_tokens": out_tok,
               "target_output_tokens": out_tok, "num_preemptions": np.zeros(n, dtype=np.int64),
               "replica": np.zeros(n, dtype=np.int64), "session_id": np.full(n, -1), "priority": np.zeros(n),
               "ttft_slo": np.full(n, -1.0), "tpot_slo": np.full(n, -1.0)}
    numeric = {k: compact(np.asarray(v, dtype=table_module._NUMERIC[k])) for k, v in numeric.items()}
    codes = {"outcome": outcome, "reason": np.zeros(n, dtype=np.int32), "tenant": np.zeros(n, dtype=np.int32),
             "slo_class": np.zeros(n, dtype=np.int32)}
    names = {"outcome": ["completed", "rejected"], "reason": [""], "tenant": [""], "slo_class": [""]}
    return RequestTable(numeric, codes, names, {"preempted_at": {}, "resumed_at": {}}, {})


def whole_histograms(table: RequestTable) -> list[str]:
    """The three request histograms as openmetrics_text wrote them from whole columns before."""
    done = table.outcome_is("completed")
    arrival = table.column("arrival")[done]
    ttft = table.column("first_token")[done] - arrival
    e2el = table.column("finish")[done] - arrival
    out_tok = table.column("output_tokens")[done]
    multi = out_tok > 1
    tpot = (e2el[multi] - ttft[multi]) / (out_tok[multi] - 1)
    lines: list[str] = []
    for name, v, b in (("t", ttft, TTFT_BUCKETS), ("p", tpot, TPOT_BUCKETS), ("e", e2el, E2E_BUCKETS)):
        _histogram(lines, name, "h", "l", v, b, " 1")
    return lines


def block_histograms(table: RequestTable) -> list[str]:
    lines: list[str] = []
    for name, h in zip("tpe", export_metrics._request_histograms(table), strict=True):
        h.write(lines, name, "h", "l", " 1")
    return lines


@pytest.mark.parametrize("block", [7, 1000, 1 << 16])
def test_request_histograms_in_blocks_are_the_whole_columns_to_the_bit(block: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    table = table_of(5000)
    whole = whole_histograms(table)
    monkeypatch.setattr(export_metrics, "latency_blocks", lambda t: latency_blocks(t, block))
    assert block_histograms(table) == whole
    assert any(line.startswith("p_sum") for line in whole)


def test_latency_blocks_join_to_the_whole_columns() -> None:
    table = table_of(3000)
    done = table.outcome_is("completed")
    ttft, e2el, out = (np.concatenate(parts) for parts in zip(*latency_blocks(table, 101), strict=True))
    assert np.array_equal(ttft, table.column("first_token")[done] - table.column("arrival")[done])
    assert np.array_equal(e2el, table.column("finish")[done] - table.column("arrival")[done])
    assert np.array_equal(out, table.column("output_tokens")[done])


def peak_bytes(fn, *args) -> int:
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_request_histograms_hold_a_block_not_the_run() -> None:
    # 400,000 requests: the whole columns' latencies were some 45 bytes a request at once (18 MB); a block of
    # 65,536 requests' is a few MB whatever the run
    table = table_of(400_000)
    assert peak_bytes(whole_histograms, table) > 15e6  # what the whole columns cost, for scale
    assert peak_bytes(block_histograms, table) < 8e6


def test_summary_attributes_energy_and_takes_the_verdict_inputs_before_it_makes_the_latencies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # each is several arrays a request; made one after the other, a long run's summary holds one set at a time
    from test_energy import _one, _scenario

    import sim.metrics.summary as summary_module

    r, whole = _one(_scenario(arrival={"type": "poisson", "rate": 8.0}, n=80))
    calls: list[str] = []

    def logged(name: str, fn):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            calls.append(name)
            return fn(*args)
        return call

    monkeypatch.setattr(summary_module, "energy_summary", logged("energy", summary_module.energy_summary))
    monkeypatch.setattr(summary_module, "limit_inputs", logged("limits", summary_module.limit_inputs))
    monkeypatch.setattr(summary_module._Latencies, "of_table", logged("latencies", summary_module._Latencies.of_table))
    assert summary_module.summarize(r) == whole
    assert calls == ["energy", "limits", "latencies"]


def test_rows_needed_is_what_assign_slots_opens() -> None:
    from sim.output.report.slots import assign_slots, rows_needed

    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 5, 40, 3000):
        # whole numbers: many ties, intervals ending where others start, zero-length ones, some reversed
        start = rng.integers(0, 30, n).astype(np.float64)
        end = start + rng.integers(-2, 6, n)
        want = int(assign_slots(start, end).max()) + 1 if n else 0
        assert rows_needed(start, end) == want, n


def _runs() -> list:
    import servesim

    common = {"seed": 1, "workload": {"arrival": {"type": "poisson", "rate": 40.0}, "num_requests": 1200,
                                      "prompt_len": {"type": "uniform", "low": 100, "high": 1400},
                                      "output_len": {"type": "uniform", "low": 20, "high": 300}},
              "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 2048,
                             "num_gpu_blocks": 400},
              "policy": {"type": "continuous", "max_num_seqs": 48}}
    one = servesim.run({**common, "name": "one"}).results[0]  # preemptions: a small KV pool
    fleet = servesim.run({**common, "name": "fleet", "variants": [
        {"name": "three", "cluster": {"replicas": 3, "router": "least_outstanding"}}]}).results[0]
    return [one, fleet]


def test_slot_chart_of_the_first_spans_is_that_of_every_span() -> None:
    import plotly.io as pio

    from sim.output.report.slots import SLOT_REQUESTS, fig_batch_slots, slot_layout

    runs = _runs()
    assert any(r.num_preemptions for r in runs[0].requests)
    for res in (runs, runs[:1], runs[1:]):
        full = [slot_layout(r) for r in res]
        first = [slot_layout(r, SLOT_REQUESTS) for r in res]
        assert all(len(f.start) < len(w.start) for f, w in zip(first, full, strict=True))  # fewer arrays kept
        assert [f.num_rows for f in first] == [w.num_rows for w in full]
        assert pio.to_json(fig_batch_slots(res, layouts=first)) == pio.to_json(fig_batch_slots(res, layouts=full))


@pytest.mark.parametrize("count", [0, 1, 1999, 2000, 2001, 12_345, 9_075_431])
def test_sampled_step_ends_are_thinned_without_an_index_per_step(count: int) -> None:
    # the indices as the export picked them before _thin_range, written out: _thin now calls _thin_range, so
    # comparing the two could not fail
    idx = np.arange(count)
    want = idx if count <= 2000 else idx[np.linspace(0, count - 1, 2000).round().astype(np.int64)]
    assert np.array_equal(export_metrics._thin_range(count, 2000), want)
    if count > 2000:  # 2,000 indices, not one per step
        assert peak_bytes(export_metrics._thin_range, count, 2000) < 100_000
