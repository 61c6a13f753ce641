"""The CPU engine's step clocks (realengine/clock.py): the reference clock's arithmetic on a scripted thread clock
(exact), and the engine and calibration running on it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibration.validate import profile_clock  # noqa: E402 - after the torch skip
from realengine.clock import ReferenceClock, cpu_step_timer, model_probe  # noqa: E402 - after the torch skip
from realengine.engine import run_engine  # noqa: E402 - after the torch skip
from realengine.model import LlamaModel  # noqa: E402 - after the torch skip
from sim.config.scenario import parse_scenario, variant_configs  # noqa: E402 - after the torch skip
from sim.hardware.models import ModelSpec  # noqa: E402 - after the torch skip
from sim.loop.run import generate_workload  # noqa: E402 - after the torch skip


class Scripted:
    """A thread clock that moves only when told, and a probe that takes the given times on it."""

    def __init__(self, probe_times: list[float]) -> None:
        self.now = 0.0
        self.probe_times = list(probe_times)

    def clock(self) -> float:
        return self.now

    def probe(self) -> float:
        d = self.probe_times.pop(0)
        self.now += d
        return d


def test_reference_clock_reads_thread_time_at_the_reference_speed() -> None:
    # times that are powers of two, so every product and sum is exact
    s = Scripted([2**-7, 2**-6, 2**-6, 2**-8])
    clk = ReferenceClock(s.probe, base=2**-7, period=1.0, window=1, thread_time=s.clock)
    assert clk.scale == 1.0 and clk.probes == 1
    assert clk() == 0.0
    s.now += 1.0
    assert clk() == 1.0  # a period's thread time at scale 1; then a probe twice as slow: scale 1/2
    assert clk.scale == 0.5 and clk.probes == 2
    s.now += 1.0
    assert clk() == 1.5  # the probe's own 1/64 s is in no reading
    s.now += 0.5
    assert clk() == 1.75 and clk.probes == 3  # under a period since the last probe: none
    s.now += 0.5
    assert clk() == 2.0  # now 1 s since the last probe: one that is twice as fast as the base
    assert clk.scale == 2.0
    s.now += 0.25
    assert clk() == 2.5


def test_reference_clock_base_defaults_to_the_median_of_the_first_window() -> None:
    s = Scripted([2**-6, 2**-7, 2**-5, 2**-7])
    clk = ReferenceClock(s.probe, period=1.0, window=3, thread_time=s.clock)
    assert clk.base == 2**-6 and clk.scale == 1.0
    s.now += 1.0
    assert clk() == 1.0
    assert list(clk.recent) == [2**-7, 2**-5, 2**-7] and clk.scale == 2.0  # the oldest probe left the window


@pytest.mark.parametrize("kwargs", [{"base": 0.0}, {"base": -1.0}, {"period": 0.0}, {"window": 0}])
def test_reference_clock_refuses_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ReferenceClock(lambda: 1.0, **kwargs)


def test_cpu_step_timer_by_name() -> None:
    model = LlamaModel(ModelSpec.from_name("tiny"))
    assert cpu_step_timer("thread", model) is time.thread_time
    clk = cpu_step_timer("reference", model, base=0.5)
    assert isinstance(clk, ReferenceClock) and clk.base == 0.5 and clk.probes == 5
    assert model_probe(model)() > 0
    with pytest.raises(ValueError, match="cpu_clock must be one of thread, reference"):
        cpu_step_timer("instructions", model)


def _scenario() -> dict:
    return {"name": "clock-small", "seed": 1,
            "workload": {"arrival": {"type": "poisson", "rate": 50.0}, "num_requests": 10,
                         "prompt_len": {"type": "uniform", "low": 4, "high": 24},
                         "output_len": {"type": "uniform", "low": 2, "high": 10}},
            "deployment": {"model": "tiny", "max_model_len": 40, "block_size": 4},
            "policy": {"type": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 64}}


def test_engine_runs_on_the_reference_clock_and_refuses_an_unknown_one() -> None:
    sc = parse_scenario(_scenario())
    cfg, wl = variant_configs(sc)[0], generate_workload(sc)
    # a reference time 100 times the machine's: every step reads about 100 times its thread time
    thread, _, _ = run_engine(cfg, wl, num_gpu_blocks=40)
    slow, _, _ = run_engine(cfg, wl, num_gpu_blocks=40, cpu_clock="reference", reference_seconds=1.0)
    assert len(slow.requests) == len(thread.requests) == 10
    assert all(r.outcome == "completed" for r in slow.requests)
    ratio = slow.steps["duration"].sum() / thread.steps["duration"].sum()
    assert ratio > 20  # tiny's one-token forward takes well under 50 ms on any machine this runs on
    with pytest.raises(ValueError, match="cpu_clock must be one of"):
        run_engine(cfg, wl, cpu_clock="cycles")


def test_profile_clock_from_provenance(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"provenance": {"clock": "virtual"}}))
    assert profile_clock(old) == ("thread", None)
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"provenance": {"cpu_clock": "reference", "reference_seconds": 0.0125}}))
    assert profile_clock(new) == ("reference", 0.0125)


def _small_grid():
    from calibration.grid import Grid

    return Grid(decode_batches=(2,), decode_contexts=(16,), decode_steps=3, prefill_chunks=(16,), prefill_len=32,
                mixed_batches=(2,), mixed_chunks=(16,), mixed_prompt=32, static_batches=(2,), static_max_prompt=16,
                static_max_output=3, swap_blocks=(1, 2))


def test_calibration_on_the_reference_clock_records_its_reference() -> None:
    from calibration.measure import measure

    grid = _small_grid()
    ref = measure("tiny", grid=grid, repeats=1, cpu_clock="reference")
    thread = measure("tiny", grid=grid, repeats=1)
    assert ref.provenance["cpu_clock"] == "reference" and ref.provenance["reference_seconds"] > 0
    assert thread.provenance["cpu_clock"] == "thread" and "reference_seconds" not in thread.provenance
    assert [s.num_tokens for s in ref.samples] == [s.num_tokens for s in thread.samples]  # the same steps
    from sim.config.schema import ScenarioError

    with pytest.raises(ScenarioError, match="cpu_clock must be one of thread, reference"):
        measure("tiny", grid=grid, repeats=1, cpu_clock="cycles")


def test_calibrate_command_measures_on_the_clock_it_is_given(tmp_path: Path, monkeypatch) -> None:
    # `servesim calibrate --cpu-clock reference` makes the profile that validate and bench_fidelity then read the
    # engine on (profile_clock); the real measurement, on a small grid so that it takes seconds
    from typer.testing import CliRunner

    import calibration.measure
    from sim.cli.main import app

    real_measure = calibration.measure.measure
    monkeypatch.setattr(calibration.measure, "measure", lambda *a, **k: real_measure(*a, grid=_small_grid(), **k))
    for clock in ("reference", "thread"):
        out = tmp_path / f"{clock}.json"
        res = CliRunner().invoke(app, ["calibrate", "--model", "tiny", "--repeats", "1", "--threads", "1", "--quiet",
                                       "--cpu-clock", clock, "--out", str(out)])
        assert res.exit_code == 0, res.output
        kind, reference = profile_clock(out)
        assert kind == clock
        assert (reference is not None and reference > 0) if clock == "reference" else reference is None
