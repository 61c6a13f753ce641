"""Shared helpers for the serving-core tests: tiny deterministic cost models and a one-call simulation."""

from __future__ import annotations

import copy
import functools
import json
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings

from sim.loop.results import result_of
from sim.loop.simulator import ClosedLoopPlan, Simulation
from sim.metrics.records import RunResult
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import ServingCore
from sim.serving.request import Request, RequestSpec

# sys.path as the session began: servesim() below runs a command as a fresh process would, without the folders
# that tests running a user's policy in this process (servesim.run, load_class) have added since
_SESSION_PATH = list(sys.path)

# Property tests run on a busy machine too (CI's 2 cores, a neighbour's process): hypothesis's own timing checks
# (a slow example, slow data generation) measure the machine, not the code, so they are off for every test here.
# derandomize: each property test draws the same examples on every run (its seed from the test itself), so CI's
# verdict on a commit does not depend on the draw; HYPOTHESIS_PROFILE=explore draws afresh each run, to look further.
settings.register_profile("servesim", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "servesim"))


class LinearCost:
    """Step time linear in the shape; works on ints and on numpy arrays (the fast-forward path)."""

    peak_flops = 1e12

    def step_time(self, s):
        return 0.005 + 2e-5 * s.num_tokens + 1e-8 * s.kv_read_tokens + 1e-4 * s.swap_blocks

    def step_flops(self, s):
        return 2e6 * (s.num_tokens - s.num_padding_tokens) + 0.0


@dataclass(frozen=True)
class ConstCost:
    """Every step takes ``d`` seconds, whatever its shape."""

    d: float = 1.0
    peak_flops: float = 1e12

    def step_time(self, s):
        n = s.num_tokens
        return self.d if np.ndim(n) == 0 else np.full(np.shape(n), self.d)

    def step_flops(self, s):
        return 2e6 * (s.num_tokens - s.num_padding_tokens) + 0.0


@dataclass
class Run:
    sim: Simulation
    core: ServingCore
    result: RunResult

    @property
    def requests(self) -> dict[int, Request]:
        return {r.id: r for r in self.sim.requests}


def simulate(
    specs: Sequence[RequestSpec],
    policy,
    kv=None,
    *,
    cost=None,
    fast: bool = True,
    closed_loop: ClosedLoopPlan | None = None,
    keep_token_times: bool = True,
    record_plans: bool = True,
) -> Run:
    """Run one replica to the end; ``fast=False`` turns off both the core's fast path and fast-forwarding."""
    kv = kv if kv is not None else PagedBlockManager(1024, 16)
    cost = cost if cost is not None else LinearCost()
    core = ServingCore(
        policy, kv, fast_path=fast, keep_token_times=keep_token_times, record_plans=record_plans
    )
    sim = Simulation(specs, [(core, cost)], closed_loop=closed_loop, fast_forward=fast)
    sim.run()
    return Run(sim, core, result_of("test", sim.requests, core, cost))


def sorted_plans(core: ServingCore) -> list[tuple[tuple[int, int], ...]]:
    """Recorded plans with each step's entries in request-id order (the order within a step is not behaviour)."""
    assert core.plans is not None
    return [tuple(sorted(p)) for p in core.plans]



def assert_replay_reproduces_engine(engine_cfg, result: RunResult, requests: Sequence[Request],
                                    core: ServingCore) -> ServingCore:
    """Parity (``sim.loop.replay``): the simulator fed the engine's measured step durations makes the engine's every
    plan, step and per-request time. Returns the simulator's core."""
    from sim.loop.replay import compare, replay

    sim, sim_core, cost = replay(engine_cfg, result, requests)
    assert compare(core, requests, sim, sim_core, cost) == []
    return sim_core


_SCENARIO_RUNS: dict[tuple[str, str], tuple[dict[str, dict], dict[str, int] | None]] = {}


def scenario_summaries(path: Path, overrides: dict, *, prefill_tokens: bool = False) -> dict[str, dict]:
    """Each variant's summary of the scenario file at ``path`` with ``overrides``, run as `servesim run` runs it
    (run_scenario), simulated once per session: tests/test_lessons.py, tests/test_host_kv_tier.py and
    tests/test_scenarios.py check the very same lesson runs (lesson-speculative-decoding's took 6.6 s of CPU).
    ``prefill_tokens``: each summary also holds its run's prefill tokens (its steps' sum, which a summary leaves
    out). A deep copy each call: no test sees another's edits."""
    from sim.config.scenario import load_scenario
    from sim.loop.run import run_scenario

    key = (str(path), json.dumps(overrides, sort_keys=True))
    if key not in _SCENARIO_RUNS or prefill_tokens and _SCENARIO_RUNS[key][1] is None:
        scenario, raw = load_scenario(path, overrides)
        run = run_scenario(scenario, raw, source=str(path))
        prefill = {r.name: int(r.steps["prefill_tokens"].sum()) for r in run.results} if prefill_tokens else None
        _SCENARIO_RUNS[key] = (run.summaries, prefill)
    summaries, prefill = copy.deepcopy(_SCENARIO_RUNS[key])
    if prefill_tokens:
        assert prefill is not None
        for name, tokens in prefill.items():
            summaries[name]["prefill_tokens"] = tokens
    return summaries


def screen(stderr: str) -> list[str]:
    """The non-blank lines a terminal shows for ``stderr``: a carriage return goes back to the line's start and
    what follows overwrites it (how a progress bar redraws and clears itself)."""
    lines = []
    for raw in stderr.split("\n"):
        cells: list[str] = []
        col = 0
        for ch in raw:
            if ch == "\r":
                col = 0
                continue
            cells[col:col + 1] = [ch]
            col += 1
        if "".join(cells).strip():
            lines.append("".join(cells).rstrip())
    return lines


@dataclass(frozen=True)
class Ran:
    """What ``servesim`` did, with subprocess.CompletedProcess's names."""

    returncode: int
    stdout: str
    stderr: str


def _under(file: str, folders: frozenset[Path]) -> bool:
    """``any(Path(file).is_relative_to(d) for d in folders)``: servesim() asks it of every loaded module, and late in
    the whole suite (thousands of modules, dozens to hundreds of folders that tests added to sys.path) building a
    Path per pair took seconds of CPU per call (test_teach's bad-knob checks: 0.13 s alone, 11-15 s each in the
    suite), and comparing parts per pair still ~70 ms a call with 400 folders. is_relative_to(d) holds exactly when d
    is the file's path or one of its folders: that set is kept per file, and one set test answers for all folders."""
    return bool(folders) and not _file_and_folders(file).isdisjoint(folders)


@functools.lru_cache(maxsize=None)
def _file_and_folders(file: str) -> frozenset[Path]:
    """The path and every folder above it (what ``_under`` tests folders against)."""
    p = Path(file)
    return frozenset((p, *p.parents))


def servesim(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
             timeout: float = 300) -> Ran:
    """``python -m sim.cli.main ARGS`` run in this process (typer's CliRunner), in ``cwd`` with ``env`` added to the
    environment. A subprocess pays an interpreter and the imports (torch's too, for the engine's commands) on every
    call, about 1 to 3 s of CPU; tests about the process itself (signals, its exit, sys.path, resource limits) still
    start one. As from a process: an exception the command lets out reaches stderr as Python writes it (exit 1), so
    a test that no traceback reaches the terminal still holds; and a command still running after ``timeout`` seconds
    fails (a TimeoutError raised in it), so a hang fails as subprocess.run's timeout made it."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    def _expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"servesim {' '.join(args)}: still running after {timeout} s")

    before, path = Path.cwd(), list(sys.path)
    # a fresh process has neither the folders earlier in-process tests added to sys.path nor the modules loaded from
    # them: in the whole suite 'bad_policies:Idle' was found (tests/data/policies on the path since another test
    # loaded a policy file there) where the test expects 'no such module'. Hidden for the call, put back after it
    foreign = frozenset(Path(p) for p in sys.path if p not in _SESSION_PATH)
    hidden = {n: m for n, m in sys.modules.items() if (f := getattr(m, "__file__", None)) and _under(f, foreign)}
    sys.path[:] = fresh = [p for p in path if p in _SESSION_PATH]
    for name in hidden:
        del sys.modules[name]
    modules = set(sys.modules)
    handler = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        if cwd is not None:
            os.chdir(cwd)
        res = CliRunner().invoke(app, [str(a) for a in args], env=env)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        os.chdir(before)
        # what a process forgets when it ends: the folders a user's policy file added to sys.path (its own folder,
        # so that its helpers import) and the modules loaded from them; a later call found 'bad_policies' importable
        added = frozenset(Path(p) for p in sys.path if p not in fresh)
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules[name], "__file__", None)
            if name.startswith("servesim_user_") or (file and _under(file, added)):
                del sys.modules[name]
        sys.modules.update(hidden)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        assert res.exc_info is not None
        stderr += "".join(traceback.format_exception(*res.exc_info))
    return Ran(res.exit_code, res.stdout, stderr)
