"""Chart axes a user can read (issue 17 point 4): latency CDFs on a log x axis when they span decades, one time
range across the variants' per-variant charts, the batch-slot legend clear of the modebar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import servesim
from sim.config.scenario import parse_scenario
from sim.loop.run import run_scenario
from sim.output.report import (
    _latency_section,
    _memory_sections,
    _request_memory_sections,
    _timeline_sections,
    fig_batch_slots,
    fig_latency_cdfs,
)

CHAT = {"prompt_len": {"type": "lognormal", "mean": 600, "std": 500, "min": 16, "max": 3072},
        "output_len": {"type": "exponential", "mean": 250, "min": 1, "max": 1024}}


@pytest.fixture(scope="module")
def naive_vs_continuous():
    raw = {
        "name": "axes", "seed": 0,
        "workload": {"arrival": {"type": "poisson", "rate": 6.0}, "num_requests": 150, **CHAT},
        "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096},
        "variants": [
            {"name": "naive", "policy": {"type": "static", "batch_size": 16, "max_wait": 0.5},
             "kv_cache": {"type": "contiguous", "reserve": "max_model_len"}},
            {"name": "continuous", "policy": {"type": "continuous", "max_num_seqs": 256}},
        ],
    }
    run = run_scenario(parse_scenario(raw), raw)
    return run.results, run.summaries


def test_cdfs_use_a_log_axis_when_values_span_decades(naive_vs_continuous):
    results, _ = naive_vs_continuous
    fig = fig_latency_cdfs(results)
    # TTFT: a queueing naive server (tens of seconds) next to continuous batching (tens of ms)
    assert fig.layout.xaxis.type == "log"
    ttft = [np.asarray(tr.x, dtype=float) for tr in fig.data
            if tr.xaxis in (None, "x") and "percentiles" not in tr.name]
    assert max(v.max() for v in ttft) > 100 * min(v[v > 0].min() for v in ttft)
    # one variant alone with TPOT in a narrow band stays linear
    one = fig_latency_cdfs(results[1:])
    assert one.layout.xaxis2.type in (None, "linear", "-")


def _x_ranges(sections) -> list[tuple[float, float]]:
    return [tuple(sec.figure.layout.xaxis.range) for sec in sections]


@pytest.mark.parametrize("sections", [_timeline_sections, _memory_sections, _request_memory_sections])
def test_per_variant_time_charts_share_one_range(naive_vs_continuous, sections):
    results, summaries = naive_vs_continuous
    ranges = _x_ranges(sections(results, summaries))
    assert len(ranges) == 2 and ranges[0] == ranges[1] and ranges[0][0] == 0 and ranges[0][1] > 0


def test_batch_slot_legend_sits_below_the_plot_away_from_the_modebar(naive_vs_continuous):
    results, _ = naive_vs_continuous
    legend = fig_batch_slots(results).layout.legend
    # the modebar is drawn at the top right of the figure; a legend at the bottom cannot be under it
    assert legend.yref == "container" and legend.y < 0.1 and legend.yanchor == "bottom"


def test_notebook_02_bars_get_a_panel_each():
    """Notebook 02's throughput and rejection bars: on twin y axes of one panel, barmode "group" does not offset
    bars across axes, so the rejection bars were drawn over the throughput bars; bf16's was hidden."""
    from sim.studies.teaching import fig_metric_panels

    summaries = {"bf16": {"output_throughput": 900.0, "num_rejected": 40},
                 "fp8 KV": {"output_throughput": 1400.0, "num_rejected": 0}}
    fig = fig_metric_panels(summaries, [("output_throughput", "output tokens / s"),
                                        ("num_rejected", "requests rejected")])
    bars = [tr for tr in fig.data if tr.type == "bar"]
    assert [(tr.xaxis, tr.yaxis) for tr in bars] == [("x", "y"), ("x2", "y2")]  # own panel, own axes
    for name in ("yaxis", "yaxis2"):
        assert fig.layout[name].overlaying is None
    # the bf16 throughput bar is drawn and nothing shares its axes
    assert list(bars[0].x) == ["bf16", "fp8 KV"] and bars[0].y[0] == 900.0
    assert fig.layout.xaxis.domain[1] < fig.layout.xaxis2.domain[0]


def test_per_class_cdfs_of_every_variant_share_each_axis_scale():
    """classes-priority (80 requests): fcfs's per-class TTFT panel was linear beside priority's log one, each
    variant's scale chosen from its own latencies: two scales for one comparison. The scale of each axis is now
    chosen over every variant's latencies, as the all-variant CDF's is."""
    res = servesim.run(Path(__file__).resolve().parent.parent / "scenarios" / "classes-priority.yaml",
                       num_requests=80)
    sections = _latency_section(res.results, res.summary)
    assert [s.title for s in sections] == ["Latency", "Latency per class: fcfs", "Latency per class: priority"]
    types = [[s.figure.layout[f"xaxis{'' if c == 1 else c}"].type for c in (1, 2, 3)] for s in sections]
    assert types[1] == types[2] == types[0], types
    assert types[0][0] == "log"
