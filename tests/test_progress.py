"""Progress reports simulated requests and simulated time per run, and the writing phases (issue 17 point 6)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sim.config.scenario import load_scenario
from sim.loop.run import prepare_scenario, run_scenario, write_scenario_run
from sim.output.progress import BarProgress
from sim.output.run_folder import read_requests

ROOT = Path(__file__).resolve().parent.parent


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def begin(self, name: str, num_requests: int) -> None:
        self.events.append(("begin", name, num_requests))

    def advance(self, n: int, now: float) -> None:
        self.events.append(("advance", n, now))

    def end(self) -> None:
        self.events.append(("end",))

    def phase(self, what: str) -> None:
        self.events.append(("phase", what))

    def close(self) -> None:
        self.events.append(("close",))


@pytest.mark.parametrize("scenario,n", [("lesson-paged-memory", 40), ("autoscale-memory-bound", 30)])
def test_progress_counts_every_request_of_every_run(tmp_path: Path, scenario: str, n: int) -> None:
    sc, raw = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", {"workload.num_requests": n})
    prepared = prepare_scenario(sc, raw)
    rec = Recorder()
    run = run_scenario(prepared, progress=rec)
    begins = [e for e in rec.events if e[0] == "begin"]
    assert [e[1] for e in begins] == [r.name for r in run.results]
    assert all(e[2] == n for e in begins)
    assert prepared.num_requests == n * len(run.results)
    # between each begin and its end: one request at a time, n in all, each at its finish time (replicas of a
    # cluster run ahead of each other between router decisions, so the clock is per request, not monotonic)
    runs: list[list[tuple]] = []
    for e in rec.events:
        if e[0] == "begin":
            runs.append([])
        elif e[0] == "advance":
            runs[-1].append(e)
    assert [e[0] for e in rec.events].count("end") == len(begins)
    for result, adv in zip(run.results, runs, strict=True):
        assert sum(e[1] for e in adv) == n
        assert sorted(e[2] for e in adv) == sorted(r.finish for r in result.requests)
    write_scenario_run(run, tmp_path / "out", progress=rec)
    phases = [e[1] for e in rec.events if e[0] == "phase"]
    assert phases[0] == "building report.html" and "requests.csv" in phases[1] and "steps.csv" in phases[1]
    assert sum(len(v) for v in read_requests(tmp_path / "out").values()) == n * len(run.results)


def test_bar_shows_requests_simulated_time_and_phases() -> None:
    f = io.StringIO()
    bar = BarProgress(200, "demo", file=f, updates=10)
    bar.begin("v", 200)
    for i in range(200):
        bar.advance(1, 0.5 * (i + 1))
    bar.end()
    bar.phase("writing out/")
    bar.close()
    text = f.getvalue()
    assert "200/200" in text and "req" in text and "sim 100 s" in text
    assert "writing out/ ..." in text and "done in" in text


def test_plan_default_parallelism_follows_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 2 cores a process pool was slower than one worker (issue 17 point 6): below 4 cores plan runs in-process,
    above it keeps one core for the parent."""
    import os

    from sim.config.limits import default_workers

    for cores, expected in [(1, 1), (2, 1), (3, 1), (4, 3), (16, 15)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, c=cores: set(range(c)))
        assert default_workers() == expected
