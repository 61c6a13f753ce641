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
