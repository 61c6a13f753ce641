"""The utilisation panels of a cluster run show each replica's fraction of its own GPU on a 0-1 axis (issue 17
point 2): summed over replicas, busy time and MFU left the 0-1.05 axis for most of the run."""

from __future__ import annotations

import numpy as np
import pytest

from sim.output.report import REPLICA_LINES, fig_timeline
from tests.test_cluster import WORKLOAD, run, scenario


def _panel_traces(fig, row: int) -> list:
    axis = "y" if row == 1 else f"y{row}"
    return [tr for tr in fig.data if (tr.yaxis or "y") == axis]


@pytest.mark.parametrize("replicas", [3, REPLICA_LINES + 2])
def test_busy_and_mfu_per_replica_stay_in_unit_interval(replicas: int) -> None:
    raw = scenario({"replicas": replicas, "router": "round_robin"})
    raw["workload"] = dict(WORKLOAD, arrival={"type": "poisson", "rate": 6.0 * replicas}, num_requests=60 * replicas)
    result, _, _ = run(raw)
    fig = fig_timeline(result)
    for row in (1, 2):
        traces = _panel_traces(fig, row)
        assert traces
        for tr in traces:
            y = np.asarray(tr.y, dtype=float)
            assert np.all((y >= 0) & (y <= 1 + 1e-6)), f"{tr.name}: max {y.max():.3f}"
        axis = fig.layout.yaxis if row == 1 else fig.layout[f"yaxis{row}"]
        assert tuple(axis.range) == (0, 1)
    busy = _panel_traces(fig, 1)
    if replicas <= REPLICA_LINES:
        assert [tr.name for tr in busy] == [f"busy: replica {i}" for i in range(replicas)]
    else:
        assert [tr.name for tr in busy][-1] == "busy: mean over replicas"
    # the sum over replicas, as the panel drew it before, does leave the axis
    total = np.sum([np.asarray(tr.y, dtype=float) for tr in busy[:replicas]], axis=0) if replicas <= REPLICA_LINES \
        else np.asarray(busy[-1].y, dtype=float) * replicas
    assert total.max() > 1.05


def test_queue_and_kv_panels_show_the_fleet_not_whichever_replica_stepped_last() -> None:
    # the requests and KV panels drew each step's own replica's figures in start order: with 3 replicas the
    # running line zigzagged between one replica's count and another's (1, 2, 1, 2...), the fleet's at no time
    raw = scenario({"replicas": 3, "router": "round_robin"})
    raw["workload"] = dict(WORKLOAD, num_requests=12, output_len={"type": "fixed", "value": 40})
    result, _, _ = run(raw)
    s = result.steps
    start, rep = np.asarray(s["start"]), np.asarray(s["replica"])
    assert len(start) <= 1000 and len(np.unique(rep)) == 3  # drawn as points, one per step
    fig = fig_timeline(result)
    traces = {tr.name: tr for tr in fig.data}

    def latest(col: str, t: float) -> float:  # each replica's figure at its last step starting by t, summed
        total = 0.0
        for r in range(3):
            mine = np.flatnonzero((rep == r) & (start <= t))
            total += float(np.asarray(s[col])[mine[np.argmax(start[mine])]]) if len(mine) else 0.0
        return total

    for name, col in (("running", "num_running"), ("waiting", "num_waiting")):
        tr = traces[name]
        for x, y in zip(np.asarray(tr.x), np.asarray(tr.y), strict=True):
            assert y == latest(col, x), (name, x)
    kv = traces["KV used"]
    for x, y in zip(np.asarray(kv.x), np.asarray(kv.y), strict=True):
        assert y == pytest.approx(latest("kv_blocks_used", x) / latest("kv_capacity_blocks", x), rel=1e-6)
    assert max(traces["running"].y) > max(np.asarray(s["num_running"]))  # replicas' requests add up
    assert fig.layout.annotations[3].text == "requests on the fleet, replicas summed (per-window peak)"


def test_power_table_limit_counts_the_fleets_gpus() -> None:
    # 3 replicas of one GPU drew 816 W on average beside a limit read "400 x 1": the fleet's GPUs are 3
    from sim.metrics.summary import summarize
    from sim.output.report.energy import energy_sections

    raw = scenario({"replicas": 3, "router": "round_robin"})
    raw["workload"] = dict(WORKLOAD, num_requests=12, output_len={"type": "fixed", "value": 40})
    result, _, _ = run(raw)
    summary = summarize(result)
    assert summary["num_replicas"] == 3 and summary["energy"]["gpus_per_replica"] == 1
    page = energy_sections([result], {result.name: summary})[0].html
    assert f"<td>{summary['energy']['power_limit_w']:g} x 3 (3 replicas of 1)</td>" in page, page
    # the peak step power is one replica's, under the fleet's mean: said so
    assert f"<td>{summary['energy']['peak_step_power_w']:,.0f} (one replica)</td>" in page, page
    assert summary["energy"]["peak_step_power_w"] < summary["energy"]["mean_power_w"]
