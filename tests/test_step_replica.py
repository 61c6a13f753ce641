"""steps.csv records which replica ran each step (issue 17, point 2: per-replica charts need it)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.output.run_folder import read_steps, steps_csv
from tests.test_cluster import run, scenario


def test_each_step_carries_the_replica_that_ran_it() -> None:
    result, requests, _ = run(scenario({"replicas": 3, "router": "round_robin"}))
    steps = result.steps
    rep = np.asarray(steps["replica"])
    assert set(rep.tolist()) == {0, 1, 2}
    # per-replica busy time from the column equals what the cluster accounts per replica
    per = result.cluster["per_replica"]
    for p in per:
        mine = rep == p["replica"]
        assert float(np.sum(np.asarray(steps["duration"])[mine])) == pytest.approx(p["busy_seconds"], rel=1e-12)
    # each replica's steps never overlap (one replica runs one step at a time)
    for i in range(3):
        s = np.asarray(steps["start"])[rep == i]
        d = np.asarray(steps["duration"])[rep == i]
        assert np.all(s[1:] >= s[:-1] + d[:-1] - 1e-12)


def test_replica_column_round_trips_through_steps_csv(tmp_path) -> None:
    result, _, _ = run(scenario({"replicas": 2, "router": "round_robin"}))
    text = steps_csv([result])
    assert text.splitlines()[0].split(",")[:3] == ["variant", "replica", "start_s"]
    (tmp_path / "steps.csv").write_text(text)
    back = read_steps(tmp_path)
    cols = next(iter(back.values()))
    assert cols["replica"].tolist() == np.asarray(result.steps["replica"]).tolist()
