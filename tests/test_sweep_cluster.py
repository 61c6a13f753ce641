"""A cluster study as one sweep: the cluster's keys (replicas, router) are sweep axes beside the load, the points are
their product, each point's row is what `servesim run` gives for that configuration alone, and Ray writes the
serial rows. Before, `cluster.*` keys were refused ("must start with workload, deployment, ...")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import apply_point, load_scenario, variant_configs
from sim.metrics.summary import bottleneck
from sim.studies.sweep import METRICS, column, plan_sweep, read_rows, run_sweep

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "examples" / "studies" / "cluster-study.yaml"
SMALL = {"workload.num_requests": 30,
         "sweep": {"cluster.replicas": [2, 4], "cluster.router": ["least_kv", {"type": "power_of_two"}],
                   "workload.arrival.rate": [8.0, 32.0]}}


def test_the_example_study_expands_to_replicas_x_routers_x_loads() -> None:
    sc, raw = load_scenario(STUDY)
    tasks = plan_sweep(sc, raw, source="study")
    routers = ["round_robin", "least_outstanding", "least_kv", "prefix_affinity"]
    expected = [(n, r, rate) for n in (2, 4, 8, 16) for r in routers for rate in (8.0, 16.0, 32.0, 64.0)]
    assert len(tasks) == 64
    assert [t.key for t in tasks] == [f"cluster-study[cluster.replicas={n},cluster.router={r},"
                                      f"workload.arrival.rate={rate}]" for n, r, rate in expected]
    for t, (n, r, rate) in zip(tasks, expected, strict=True):
        (cfg,) = variant_configs(apply_point(raw, t.point, "study"))
        assert cfg.cluster is not None and (cfg.cluster.replicas, cfg.cluster.router) == (n, r)
        assert apply_point(raw, t.point, "study").workload.arrival.rate == rate  # type: ignore[union-attr]


def test_a_variant_with_its_own_cluster_gets_the_swept_replicas() -> None:
    """apply_override sets a cluster key in every variant whose cluster section has it (as for policy keys)."""
    sc, raw = load_scenario(ROOT / "scenarios" / "autoscale-memory-bound.yaml",
                            {"sweep": {"cluster.replicas": [2, 3]}})
    tasks = plan_sweep(sc, raw)
    assert [t.key for t in tasks] == [f"{v}[cluster.replicas={n}]" for n in (2, 3)
                                      for v in ("scale-on-compute", "scale-on-busy", "scale-on-kv")]
    cfgs = variant_configs(apply_point(raw, {"cluster.replicas": 3}, "s"))
    assert [c.cluster.replicas for c in cfgs if c.cluster] == [3, 3, 3]


def test_each_point_equals_its_configuration_run_alone(tmp_path: Path) -> None:
    """Every row of the sweep holds exactly the figures of `servesim run` on a file with that point's values written
    in (no sweep section); a mapping value (a public router) keeps its YAML spelling in the key and the cell."""
    sc, raw = load_scenario(STUDY, SMALL)
    rows = run_sweep(sc, raw, tmp_path / "sw", workers=1).rows
    assert [r["key"] for r in rows] == [f"cluster-study[cluster.replicas={n},cluster.router={r},"
                                        f"workload.arrival.rate={rate}]" for n in (2, 4)
                                        for r in ("least_kv", "{type: power_of_two}") for rate in (8.0, 32.0)]
    base = yaml.safe_load(STUDY.read_text())
    del base["sweep"]
    base["workload"]["num_requests"] = 30
    for row in rows:
        alone = json.loads(json.dumps(base))
        alone["cluster"] = {"replicas": row["cluster.replicas"], "router": yaml.safe_load(row["cluster.router"])}
        alone["workload"]["arrival"]["rate"] = row["workload.arrival.rate"]
        path = tmp_path / f"p{row['index']}.yaml"
        path.write_text(yaml.safe_dump(alone))
        res = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / f"run{row['index']}")])
        assert res.exit_code == 0, res.output
        summary = json.loads((tmp_path / f"run{row['index']}" / "summary.json").read_text())["variants"][
            "cluster-study"]
        assert summary["cluster"]["replicas_start"] == row["cluster.replicas"]
        for m in METRICS:
            want = bottleneck(summary) if m == "bottleneck" else _at(summary, m)
            assert row[column(m)] == want, (row["key"], m)
    # the axes matter: more replicas cut TTFT's tail at the high load, the two routers place requests differently
    by = {(r["cluster.replicas"], r["cluster.router"], r["workload.arrival.rate"]): r for r in rows}
    assert by[4, "least_kv", 32.0]["ttft.p99_s"] < by[2, "least_kv", 32.0]["ttft.p99_s"]
    assert by[2, "least_kv", 32.0]["ttft.p99_s"] != by[2, "{type: power_of_two}", 32.0]["ttft.p99_s"]


def _at(summary: dict, metric: str):
    v = summary
    for part in metric.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def test_ray_writes_the_serial_rows_of_a_cluster_study(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sc, raw = load_scenario(STUDY, SMALL)
    run_sweep(sc, raw, tmp_path / "serial", workers=1)
    run_sweep(sc, raw, tmp_path / "ray", executor="ray", workers=2)
    assert (tmp_path / "ray" / "sweep.csv").read_text() == (tmp_path / "serial" / "sweep.csv").read_text()
    assert len(read_rows(tmp_path / "ray" / "sweep.csv")) == 8


@pytest.mark.parametrize("axis, message", [
    ("cluster.replicas=2,0", "at {'cluster.replicas': 0}: cluster.replicas: must be greater than or equal to 1"),
    ("cluster.replicas=2,x", "at {'cluster.replicas': 'x'}: cluster.replicas: expected an integer (got 'x')"),
    ("cluster.router=least_kv,nonsense", "cluster.router: not a router's name; the built-ins: round_robin, "
                                         "least_outstanding, least_kv, prefix_affinity, power_of_two"),
    ("cluster.router={type: nope}", "cluster.router.type: unknown type nope"),
    ("cluster.replicaz=2,4", "sweep: cluster.replicaz: unknown key; did you mean cluster.replicas?"),
])
def test_bad_cluster_axis_values_exit_2_with_one_message(tmp_path: Path, axis: str, message: str) -> None:
    out = tmp_path / "bad"
    res = CliRunner().invoke(app, ["sweep", str(STUDY), "--out", str(out), "-q", "--sweep", axis])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("error: ") == 1 and "Traceback" not in res.output
    assert message in res.stderr
    assert not out.exists()
