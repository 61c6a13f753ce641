"""The engine's measured energy (realengine/engine.py): NVML's energy counter read with the memory samples on
CUDA, RAPL's (realengine/rapl.py) on the CPU where its powercap files are readable, and a run that read neither
marked unmeasured in summary.json."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import realengine.rapl as rapl  # noqa: E402 - after the torch skip
from realengine.engine import MEMORY_COLUMNS, measured_energy, run_engine, write_engine_run  # noqa: E402
from sim.config.scenario import parse_scenario, variant_configs  # noqa: E402 - after the torch skip
from sim.loop.run import generate_workload  # noqa: E402 - after the torch skip

SCENARIO = {
    "name": "energy-engine", "seed": 0,
    "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 6,
                 "prompt_len": {"type": "fixed", "value": 8}, "output_len": {"type": "fixed", "value": 4}},
    "deployment": {"model": "tiny", "gpu": "h100-sxm", "num_gpu_blocks": 64, "max_model_len": 64},
    "policy": {"type": "continuous", "max_num_seqs": 4},
}


def _row(variant: str, t: float, joules: float | str) -> dict:
    return {"variant": variant, "time": t, "nvml_energy_j": joules}


def test_measured_energy_by_hand() -> None:
    # the counter's rise over the variant's samples: 12.5 J in 1.25 s, 10 W; 25 output tokens: 0.5 J each
    rows = [_row("a", 0.0, 0.0), _row("b", 0.1, 99.0), _row("a", 0.5, 5.0), _row("a", 1.25, 12.5)]
    assert measured_energy(rows, "a", 25) == {"measured": True, "source": "nvml", "energy_j": 12.5,
                                              "mean_power_w": 10.0, "j_per_output_token": 0.5, "seconds": 1.25}
    cpu = measured_energy([_row("a", 0.0, ""), _row("a", 1.0, "")], "a", 25)
    assert cpu["measured"] is False and "RAPL" in cpu["reason"] and "NVML" in cpu["reason"]
    # on the CPU, RAPL's counter: 30 J in 2 s
    rows = [{"variant": "a", "time": t, "nvml_energy_j": "", "rapl_energy_j": j} for t, j in ((0.5, 0.0), (2.5, 30.0))]
    assert measured_energy(rows, "a", 60) == {"measured": True, "source": "rapl", "energy_j": 30.0,
                                              "mean_power_w": 15.0, "j_per_output_token": 0.5, "seconds": 2.0}


def _zone(root: Path, name: str, uj: int, wrap: int = 1000_000_000) -> Path:
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
    return zone / "energy_uj"


def test_rapl_sums_the_packages_and_counts_across_a_wrap(tmp_path: Path) -> None:
    # two packages and a subzone of the first (inside it: not counted again); package 1 wraps at 1,000 J
    p0 = _zone(tmp_path, "intel-rapl:0", 5_000_000)
    sub = _zone(tmp_path, "intel-rapl:0:0", 1_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", 999_000_000)
    counter = rapl.RaplCounter(tmp_path)
    assert counter.readable and counter.read() == 0.0
    p0.write_text("7000000\n")  # +2 J
    sub.write_text("9000000\n")
    p1.write_text("500000\n")  # 999 J -> wraps at 1,000 J -> 0.5 J: +1.5 J
    assert counter.read() == pytest.approx(3.5, rel=1e-12)
    assert rapl.RaplCounter(tmp_path / "none").read() is None
    (tmp_path / "intel-rapl:0" / "energy_uj").unlink()  # a package without a counter is skipped
    assert [p.parent.name for p, _ in rapl.RaplCounter(tmp_path).zones] == ["intel-rapl:1"]


def _run(tmp_path: Path, device: str) -> tuple[dict, list[dict]]:
    sc = parse_scenario(SCENARIO)
    cfg = variant_configs(sc)[0]
    memory: list[dict] = []
    result, _, _ = run_engine(cfg, generate_workload(sc), device=device, memory_samples=memory,
                              memory_interval_s=0.01)
    write_engine_run(tmp_path, [result], memory)
    summary = json.loads((tmp_path / "summary.json").read_text())["variants"][result.name]
    with open(tmp_path / "memory.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == MEMORY_COLUMNS
    return summary, rows


def test_a_cpu_run_without_a_readable_rapl_is_marked_unmeasured(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rapl, "RAPL_ROOT", tmp_path / "no-powercap")
    summary, rows = _run(tmp_path, "cpu")
    assert summary["energy"]["measured"] is False
    assert all(r["nvml_energy_j"] == r["nvml_power_w"] == r["rapl_energy_j"] == "" for r in rows)


def test_a_cpu_run_reads_rapl_where_it_is_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: a CPU run was always marked unmeasured (RAPL was never read). A fake powercap tree whose package
    # counter rises 1 J at each read: summary.json says RAPL measured it, memory.csv has the readings
    root = tmp_path / "powercap"
    root.mkdir()
    counter = _zone(root, "intel-rapl:0", 0)
    real_read = rapl.RaplCounter.read

    def rising(self: rapl.RaplCounter) -> float | None:
        got = real_read(self)
        counter.write_text(str(int(counter.read_text()) + 1_000_000))
        return got

    monkeypatch.setattr(rapl, "RAPL_ROOT", root)
    monkeypatch.setattr(rapl.RaplCounter, "read", rising)
    summary, rows = _run(tmp_path / "run", "cpu")
    readings = [float(r["rapl_energy_j"]) for r in rows]
    assert readings == [float(i) for i in range(len(rows))] and len(rows) >= 2
    e = summary["energy"]
    assert e["measured"] is True and e["source"] == "rapl" and e["energy_j"] == readings[-1]
    assert e["j_per_output_token"] == pytest.approx(readings[-1] / summary["total_output_tokens"], rel=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with NVML")
def test_a_cuda_run_reads_the_energy_counter(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    summary, rows = _run(tmp_path, "cuda")
    e = summary["energy"]
    assert e["measured"] is True and e["energy_j"] > 0 and e["mean_power_w"] > 0
    readings = [float(r["nvml_energy_j"]) for r in rows]
    assert readings == sorted(readings)  # a counter


def test_validate_compares_the_measured_energy_with_the_simulated() -> None:
    from calibration.validate import compare

    real = {"energy": measured_energy([_row("a", 0.0, 0.0), _row("a", 2.0, 300.0)], "a", 1000)}
    sim = {"energy": {"energy_j": 240.0, "j_per_output_token": 0.24, "mean_power_w": 120.0}}
    m = compare(real, sim)
    assert m["energy_j"] == {"real": 300.0, "sim": 240.0, "rel_error": pytest.approx(-0.2)}
    assert m["j_per_output_token"]["rel_error"] == pytest.approx(-0.2)
    assert m["mean_power_w"] == {"real": 150.0, "sim": 120.0, "rel_error": pytest.approx(-0.2)}
    # a CPU run measured nothing: no error, and the other metrics absent from these summaries are n/a too
    cpu = compare({"energy": measured_energy([], "a", 1000)}, sim)
    assert cpu["energy_j"]["rel_error"] is None and cpu["ttft_p50"]["real"] is None


def test_rapl_leaves_out_the_platform_zone_that_holds_the_packages(tmp_path: Path) -> None:
    """A laptop's (and a recent server's) intel-rapl:1 is psys, the whole platform, packages included: it was summed
    with package-0, so the CPU's joules were counted about twice."""
    p0 = _zone(tmp_path, "intel-rapl:0", 1_000_000)
    psys = _zone(tmp_path, "intel-rapl:1", 3_000_000)
    (tmp_path / "intel-rapl:0" / "name").write_text("package-0\n")
    (tmp_path / "intel-rapl:1" / "name").write_text("psys\n")
    counter = rapl.RaplCounter(tmp_path)
    assert [p.parent.name for p, _ in counter.zones] == ["intel-rapl:0"]
    assert counter.read() == 0.0
    p0.write_text("3000000\n")  # +2 J in the package
    psys.write_text("9000000\n")  # +6 J on the platform, those 2 J among them
    assert counter.read() == pytest.approx(2.0, rel=1e-12)


def test_validate_compares_the_engines_counter_with_the_simulated_steps_not_the_skipped_gaps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the engine's counter ran over its steps alone (the virtual clock skips the idle gaps between arrivals)
    # while the simulated energy compared with it also paid the GPU's idle power over those gaps. A profile
    # relabelled as measured on an H200 gives the simulated side a power model; requests 0.5 s apart leave gaps
    import json

    from calibration.validate import validate_variant
    from sim.costs.energy import run_energy

    root = Path(__file__).resolve().parent.parent
    cpu = root / "calibration" / "profiles" / "tiny-cpu.json"
    profile = tmp_path / "tiny-h200.json"
    profile.write_text(json.dumps({**json.loads(cpu.read_text()), "device": "NVIDIA H200"}))
    monkeypatch.setattr(rapl, "RAPL_ROOT", tmp_path / "no-powercap")
    raw = {**SCENARIO, "workload": {**SCENARIO["workload"], "arrival": {"type": "poisson", "rate": 2.0},
                                    "num_requests": 3}}
    sc = parse_scenario(raw)
    v = validate_variant(variant_configs(sc)[0], generate_workload(sc), profile, model="tiny")
    e = run_energy(v.sim)
    assert e is not None and e.idle_energy_j > 0.5 * e.energy_j  # mostly gaps
    m = v.metrics
    assert v.sim_summary["energy"]["energy_j"] == pytest.approx(e.energy_j, rel=1e-12)  # sim/summary.json: whole
    assert m["energy_j"]["sim"] == pytest.approx(e.busy_energy_j, rel=1e-12)
    busy_s = float(v.sim.steps["duration"].sum())
    assert m["mean_power_w"]["sim"] == pytest.approx(e.busy_energy_j / busy_s, rel=1e-12)
    assert m["j_per_output_token"]["sim"] == pytest.approx(e.busy_energy_j / 12, rel=1e-12)
    assert m["energy_j"]["real"] is None  # nothing measured here (no NVML, no RAPL): n/a, said why
