"""`servesim sweep`: parallel runs give the rows a serial run gives, rows stream to disk, and an interrupted sweep
resumes without redoing finished runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.scenario import load_scenario
from sim.schema import ScenarioError
from sim.sweep import METRICS, column, plan_sweep, read_rows, run_sweep

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
OVERRIDES = {"workload.num_requests": 60, "sweep": {"workload.arrival.rate": [2.0, 4.0, 8.0]}}


def load(**extra):
    return load_scenario(SCENARIOS / "naive-vs-continuous.yaml", {**OVERRIDES, **extra})


def test_plan_has_one_run_per_point_and_variant() -> None:
    sc, raw = load()
    tasks = plan_sweep(sc, raw)
    assert [t.key for t in tasks] == [f"{v}[workload.arrival.rate={r}]" for r in (2.0, 4.0, 8.0)
                                      for v in ("naive", "continuous")]
    assert [t.index for t in tasks] == list(range(6))


def test_process_pool_gives_the_serial_rows(tmp_path: Path) -> None:
    sc, raw = load()
    serial = run_sweep(sc, raw, tmp_path / "serial", workers=1)
    pooled = run_sweep(sc, raw, tmp_path / "pool", workers=2)
    assert serial.ran == pooled.ran == 6
    assert serial.rows == pooled.rows
    assert (tmp_path / "serial" / "sweep.csv").read_text() == (tmp_path / "pool" / "sweep.csv").read_text()
    rows = serial.rows
    assert [r["index"] for r in rows] == list(range(6))
    # the numbers are the simulator's: continuous beats naive at every rate, and throughput follows the load
    for rate in (2.0, 4.0, 8.0):
        naive, cont = (next(r for r in rows if r["variant"] == v and r["workload.arrival.rate"] == rate)
                       for v in ("naive", "continuous"))
        assert cont["output_throughput"] > naive["output_throughput"] > 0
        assert cont["num_completed"] == 60
    html = (tmp_path / "serial" / "sweep.html").read_text()
    assert "output_throughput" in html and html.count("<tr>") == 7


class Interrupt(Exception):
    pass


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path: Path) -> None:
    sc, raw = load()
    out = tmp_path / "sw"

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_sweep(sc, raw, out, workers=1, progress=stop_after_two)
    with open(out / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 2  # the finished runs were on disk already
    resumed = run_sweep(sc, raw, out, workers=1)
    assert (resumed.ran, resumed.resumed) == (4, 2)
    full = run_sweep(sc, raw, tmp_path / "full", workers=1)
    assert resumed.rows == full.rows
    again = run_sweep(sc, raw, out, workers=1)
    assert (again.ran, again.resumed) == (0, 6)


def test_a_folder_of_another_sweep_is_refused(tmp_path: Path) -> None:
    sc, raw = load()
    run_sweep(sc, raw, tmp_path / "sw", workers=1)
    sc2, raw2 = load(sweep={"workload.arrival.rate": [2.0, 3.0]})
    with pytest.raises(ScenarioError, match="another scenario"):
        run_sweep(sc2, raw2, tmp_path / "sw", workers=1)
    fresh = run_sweep(sc2, raw2, tmp_path / "sw", workers=1, fresh=True)
    assert fresh.ran == 4 and len(read_rows(tmp_path / "sw" / "sweep.csv")) == 4


def test_cli_sweep(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--out", str(out), "-n", "40",
                              "--set", "sweep={policy.max_num_seqs: [4, 16]}", "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "4 runs (4 run now, 0 already done)" in res.output
    rows = read_rows(out / "sweep.csv")
    assert {r["key"] for r in rows} == {"naive[policy.max_num_seqs=4]", "naive[policy.max_num_seqs=16]",
                                        "continuous[policy.max_num_seqs=4]", "continuous[policy.max_num_seqs=16]"}
    assert {column(m) for m in METRICS} <= set(rows[0])
    assert {"duration_s", "ttft.p99_s", "e2el.mean_s", "output_throughput"} <= set(rows[0])  # unit in the name
    bad = runner.invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--executor", "dask"])
    assert bad.exit_code == 2 and "--executor" in bad.output


def test_ray_gives_the_local_rows(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sc, raw = load()
    local = run_sweep(sc, raw, tmp_path / "local", workers=1)
    on_ray = run_sweep(sc, raw, tmp_path / "ray", executor="ray", workers=2)
    assert on_ray.rows == local.rows
