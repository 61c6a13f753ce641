"""Ctrl-C in the long commands (engine run, calibrate, validate, plan): one line saying what it stopped and what
was or was not written, exit 130, no traceback and no half-written file. They exited 130 without a word (typer's
own handling of KeyboardInterrupt), as `servesim run` did before issue 35. The interrupt is raised in-process where
the command's long work is; tests/test_hardening.py sends a real SIGINT to `servesim run`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "calibration" / "profiles" / "tiny-cpu.json"
SCENARIO = {
    "name": "ctrl-c",
    "seed": 0,
    "workload": {"arrival": {"type": "poisson", "rate": 20.0}, "num_requests": 3,
                 "prompt_len": {"type": "fixed", "value": 16}, "output_len": {"type": "fixed", "value": 2}},
    "deployment": {"model": "tiny", "gpu": "l4", "max_model_len": 256},
    "slos": {"ttft": 1.0, "tpot": 0.1},
    "variants": [{"name": "a", "policy": {"type": "fcfs"}}],
}


def _ctrl_c(*_: Any, **__: Any) -> Any:
    raise KeyboardInterrupt


def _last_line(res: Any) -> str:
    assert res.exit_code == 130, res.output
    assert "Traceback" not in res.output and "Aborted" not in res.output, res.output
    return res.output.strip().splitlines()[-1]


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    return path


def test_ctrl_c_in_engine_run_says_so_and_writes_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import realengine.engine

    monkeypatch.setattr(realengine.engine, "run_engine", _ctrl_c)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["engine", "run", str(_scenario(tmp_path)), "--time-scale", "0", "--weights",
                                   "random", "--out", str(out), "-q"])
    assert _last_line(res) == f"interrupted while running variant a on the engine; {out} was not written"
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("kept")  # an earlier folder: left as it was
    res = CliRunner().invoke(app, ["engine", "run", str(_scenario(tmp_path)), "--time-scale", "0", "--weights",
                                   "random", "--out", str(out), "-q"])
    assert _last_line(res) == f"interrupted while running variant a on the engine; {out} was left as it was"
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_ctrl_c_in_calibrate_says_the_profile_was_not_written(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import calibration.measure

    monkeypatch.setattr(calibration.measure, "measure", _ctrl_c)
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["calibrate", "--model", "tiny", "--out", str(out), "-q"])
    assert _last_line(res) == f"interrupted while measuring tiny on cpu; {out} was not written"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_ctrl_c_in_validate_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import calibration.validate

    monkeypatch.setattr(calibration.validate, "validate", _ctrl_c)
    path = _scenario(tmp_path)
    res = CliRunner().invoke(app, ["validate", str(path), "--profile", str(PROFILE), "--out",
                                   str(tmp_path / "val"), "-q"])
    assert _last_line(res) == (f"interrupted while replaying {path} on the engine and in the simulator; nothing was "
                               "written")
    assert not (tmp_path / "val").exists()


def test_ctrl_c_in_plan_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.studies.planner

    monkeypatch.setattr(sim.studies.planner, "plan", _ctrl_c)
    doc = {**SCENARIO, "deployment": {"model": "llama-3.2-1b", "gpu": "l4"}}
    doc.pop("variants")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "s.yaml"), "-q"])
    assert _last_line(res) == "interrupted while planning ctrl-c; nothing was written"


SLOW_JOB = """import os
import time


def job(_shared, seconds):
    # a mark beside this file that a worker is in its job, so that the test interrupts jobs, not spawning workers
    open(os.path.join(os.path.dirname(__file__), f"started-{os.getpid()}"), "w").close()
    time.sleep(seconds)
    return seconds
"""
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from slow_job import job
from sim.studies.sweep import parallel_map
print("started", flush=True)
try:
    for _ in parallel_map(job, [60, 60, 60, 60], workers=2):
        pass
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
"""


def test_ctrl_c_in_a_process_pool_ends_the_workers_at_once_without_their_tracebacks(tmp_path: Path) -> None:
    """`servesim plan -j 2` and Ctrl-C: under the command's line, every worker printed 'Process SpawnProcess-1:' and
    a KeyboardInterrupt traceback (the terminal sends SIGINT to the whole process group)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "slow_job.py").write_text(SLOW_JOB)
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout is not None and p.stdout.readline() == "started\n"
    deadline = time.monotonic() + 180  # spawning two workers that import servesim takes seconds, more when busy
    while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(tmp_path.glob("started-*"))) == 2, "the two workers never started their jobs"
    time.sleep(0.5)  # both asleep in time.sleep
    start = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert err == "interrupted\n", err
    assert time.monotonic() - start < 30  # not the 60 s the jobs under way had left


def test_ctrl_c_in_a_sweep_says_where_its_finished_runs_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.studies.sweep

    out = tmp_path / "sw"

    def one_run_then_ctrl_c(*_: Any, **__: Any) -> Any:
        out.mkdir()
        (out / "sweep.csv").write_text("point,variant\n0,a\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.studies.sweep, "run_sweep", one_run_then_ctrl_c)
    path = _scenario(tmp_path)
    args = ["sweep", str(path), "--sweep", "workload.arrival.rate=1,2", "--out", str(out), "-q"]
    assert _last_line(CliRunner().invoke(app, args)) == (
        f"interrupted while running ctrl-c; the runs finished so far are in {out}/sweep.csv, and the same command "
        "resumes from them")
    monkeypatch.setattr(sim.studies.sweep, "run_sweep", _ctrl_c)
    assert _last_line(CliRunner().invoke(app, [*args[:-3], "--out", str(tmp_path / "none"), "-q"])) == \
        "interrupted while running ctrl-c; nothing was written"


def test_ctrl_c_in_check_policy_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.policies.check

    monkeypatch.setattr(sim.policies.check, "check_fast_path", _ctrl_c)
    doc = {**SCENARIO, "deployment": {"model": "llama-3.2-1b", "gpu": "l4"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = CliRunner().invoke(app, ["check-policy", str(tmp_path / "s.yaml")])
    assert _last_line(res) == "interrupted while checking variant a's policy; nothing was written"


def test_ctrl_c_in_engine_quality_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`servesim engine quality` (minutes of scoring on a CPU) ended on Ctrl-C with exit 130 and not a word, where
    every other long command says what it stopped; it says so now, and --json's file is not written."""
    pytest.importorskip("torch")
    import realengine.quality
    from realengine import gguf_model

    def load(*_: Any, **__: Any) -> Any:
        class Real:
            file_quantization = "Q4_1"

            def describe(self) -> str:
                return "a stand-in"
        return Real()

    def quality(*_: Any, progress: Any, **__: Any) -> Any:
        progress("int8")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_model, "real_weights_available", lambda name: True)  # the weights are not read
    monkeypatch.setattr(gguf_model, "load_real_model", load)
    monkeypatch.setattr(realengine.quality, "run_quality", quality)
    out = tmp_path / "q.json"
    res = CliRunner().invoke(app, ["engine", "quality", "--quant", "int8", "--json", str(out)])
    assert _last_line(res) == f"interrupted while measuring int8 on smollm2-135m; {out} was not written"
    assert not out.exists()


STARTING = """
import builtins, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive shell starts it, even under CI
real = builtins.__import__
def ctrl_c_on(name, *a, **k):  # Ctrl-C as the command's imports reach a module, seconds in when busy
    if name == os.environ["CTRL_C_ON"] and not getattr(ctrl_c_on, "sent", False):
        ctrl_c_on.sent = True
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *a, **k)
builtins.__import__ = ctrl_c_on
from sim.cli.main import app  # what the installed servesim script runs
app(sys.argv[1:], prog_name="servesim")
"""


@pytest.mark.parametrize("module", ["sim.config.scenario", "sim.loop.run"])
def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path: Path, module: str) -> None:
    """`servesim run ...` and Ctrl-C at once (a typo seen in the command line): the command's imports take 1-3 s on
    a busy machine, and a Ctrl-C in them printed a KeyboardInterrupt traceback of 7 to 34 lines (measured with
    SIGINT 0.5, 1, 1.5 and 2.5 s after the start), where docs/running.md promises one line saying what it stopped;
    in `run`'s own imports (sim.loop.run, 3.3 s in) it exited 130 without a word."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", STARTING, "run", "scenarios/naive-vs-continuous.yaml", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "CTRL_C_ON": module})
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == "interrupted while starting; nothing was written", p.stderr
    assert p.stdout == "" and not out.exists()


def test_ctrl_c_while_python_m_servesim_starts_is_one_line(tmp_path: Path) -> None:
    """`python -m servesim run ...` imports the servesim package (sim.api, numpy, pydantic: seconds on a busy
    machine) before the command's own guarded imports; a Ctrl-C there printed a KeyboardInterrupt traceback (SIGINT
    0.3, 0.6, 1.0 and 1.5 s after the start). Python names the module "-m" in sys.argv while it imports the package,
    as runpy does here."""
    import os
    import subprocess
    import sys

    script = STARTING.replace("from sim.cli.main import app  # what the installed servesim script runs\n"
                              "app(sys.argv[1:], prog_name=\"servesim\")\n",
                              "import runpy\nsys.argv[0] = '-m'\nrunpy.run_module('servesim', run_name='__main__', "
                              "alter_sys=True)\n")
    assert "runpy" in script
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", script, "run", "scenarios/naive-vs-continuous.yaml", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "CTRL_C_ON": "sim.api"})
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == "interrupted while starting; nothing was written", p.stderr
    assert p.stdout == "" and not out.exists()


def test_ctrl_c_as_the_commands_are_declared_is_one_line(tmp_path: Path) -> None:
    """The guarded imports of sim/cli/main.py end at its top; a Ctrl-C later in the module (the commands declared,
    sim.cli.live imported and registered: 2.4 s after the start of `python -m servesim run` on a busy machine)
    printed a KeyboardInterrupt traceback of 18 lines."""
    import os
    import subprocess
    import sys

    script = STARTING.replace('if name == os.environ["CTRL_C_ON"]',  # from sim.cli import live, near the end
                              "if name == 'sim.cli' and 'live' in ((a[2] if len(a) > 2 else k.get('fromlist')) or ())")
    assert "'live'" in script
    p = subprocess.run([sys.executable, "-c", script, "run", "scenarios/naive-vs-continuous.yaml", "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "CTRL_C_ON": ""})
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == "interrupted while starting; nothing was written", p.stderr


def test_an_import_that_fails_in_the_command_puts_the_ctrl_c_handler_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """sim/cli/main.py installs its "interrupted while starting" handler for its imports and put the caller's back
    at its end only: an import that failed (a caller that catches the ImportError, a notebook) left it, and the
    caller's next Ctrl-C printed "interrupted while starting" and exited 130."""
    import signal
    import sys

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.delitem(sys.modules, "sim.cli.main")  # put back as it was after the test
    monkeypatch.setitem(sys.modules, "sim.words", None)  # the last of its guarded imports fails
    with pytest.raises(ImportError, match="sim.words"):
        import sim.cli.main  # noqa: F401
    assert signal.getsignal(signal.SIGINT) is before
