"""A user's own policy, loaded from a file, drives the real engine (the tiny model on a CPU, one thread) exactly as
it drives the simulator:

- parity: the simulator fed the engine's measured step durations reproduces the engine's schedule step by step
  (plans, preemptions, token counts, clock, each request's first token and finish), for a user's class, a policy
  object given from Python, the three examples of examples/policies/ and the built-in policies on the public API
  (priority, sjf with a noisy predictor, edf rejecting late requests);
- the class is loaded once, at validation: the engine's policy and the simulator's are objects of that class;
- ``servesim engine run`` and ``servesim validate`` run every policy kind from a scenario file (``cls`` relative
  to it), and a policy that fails on the engine ends either command with exit 2, one message, nothing written.
"""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402 - after the torch skip

from realengine.engine import engine_config, run_engine  # noqa: E402 - after the torch skip
from sim.cli.main import app  # noqa: E402 - after the torch skip
from sim.config.scenario import parse_scenario, variant_configs  # noqa: E402 - after the torch skip
from sim.loop.build import build  # noqa: E402 - after the torch skip
from sim.loop.replay import compare, replay  # noqa: E402 - after the torch skip
from sim.loop.run import generate_workload  # noqa: E402 - after the torch skip
from sim.policies.loader import load_class  # noqa: E402 - after the torch skip
from sim.policies.user import UserPolicy  # noqa: E402 - after the torch skip
from tests.conftest import assert_replay_reproduces_engine  # noqa: E402 - after the torch skip

torch.set_num_threads(1)

HERE = Path(__file__).parent
POLICIES = HERE / "data" / "policies"
USER_CLS = f"{POLICIES / 'priority_shortest.py'}:PriorityShortestPrompt"
PROFILE = HERE.parent / "calibration" / "profiles" / "tiny-cpu.json"
NUM_BLOCKS = 12  # 48 tokens of 4-token blocks for prompts of up to 24 tokens: preemptions, and displacements
LIMITS = {"max_num_seqs": 8, "max_num_batched_tokens": 64}


def scenario(policy: dict, num_requests: int = 30) -> dict:
    """Two classes of two tenants, interactive (priority 0, a 50 ms TTFT SLO) and batch (priority 1), arriving
    faster than the engine serves them under time_scale 0.05, so that a queue forms and its order matters."""
    return {
        "name": "engine-user-policy",
        "seed": 3,
        "workload": {
            "arrival": {"type": "poisson", "rate": 40.0},
            "num_requests": num_requests,
            "prompt_len": {"type": "uniform", "low": 4, "high": 24},
            "output_len": {"type": "uniform", "low": 2, "high": 12},
            "classes": [{"name": "interactive", "share": 0.3, "priority": 0, "tenant": "chat", "slo": {"ttft": 0.05}},
                        {"name": "batch", "share": 0.7, "priority": 1, "tenant": "jobs"}],
        },
        "deployment": {"model": "tiny", "max_model_len": 40, "block_size": 4},
        "policy": {**policy, **LIMITS},
    }


def engine_run(policy: dict):
    sc = parse_scenario(scenario(policy))
    cfg = variant_configs(sc)[0]
    result, requests, core = run_engine(cfg, generate_workload(sc), num_gpu_blocks=NUM_BLOCKS, time_scale=0.05,
                                        record_plans=True)
    return cfg, result, requests, core


def test_a_users_policy_from_a_file_has_exact_parity_on_the_engine() -> None:
    cfg, result, requests, core = engine_run({"type": "custom", "cls": USER_CLS})
    assert all(r.outcome is not None and r.outcome.value == "completed" for r in requests)
    # the user's order, not first come first served: some request started before one that arrived earlier
    # (FCFS admits in arrival order), and waiting interactive requests displaced running batch ones
    started = sorted(requests, key=lambda r: (r.first_scheduled, r.id))
    inversions = sum(1 for i, a in enumerate(started) for b in started[i + 1:] if b.arrival < a.arrival)
    assert inversions > 0 and core.stats.num_preemptions > 0
    sim_core = assert_replay_reproduces_engine(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS), result, requests,
                                               core)
    # one class, loaded once when the scenario was validated: the engine's policy and the simulator's are its
    # objects (each replica builds its own instance of it)
    cls = cfg.policy._cls
    assert cls.__name__ == "PriorityShortestPrompt"
    for c in (core, sim_core):
        assert isinstance(c.policy, UserPolicy) and type(c.policy.user) is cls
    assert core.policy.user is not sim_core.policy.user
    # the check is not vacuous: FCFS fed the same measured steps parts from the user's schedule, and so does the
    # user's policy fed one step 1 ms longer
    fcfs = parse_scenario(scenario({"type": "fcfs"}))
    diff = compare(core, requests, *replay(engine_config(variant_configs(fcfs)[0], num_gpu_blocks=NUM_BLOCKS),
                                           result, requests))
    assert any(d.startswith("plans part at step") for d in diff), diff
    longer = np.array(result.steps["duration"])
    longer[5] += 1e-3
    slower = dataclasses.replace(result, steps={**result.steps, "duration": longer})
    diff = compare(core, requests, *replay(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS), slower, requests))
    assert "step column start differs by more than 1e-09 s" in diff, diff


def test_a_policy_drawing_from_pythons_global_generator_has_exact_parity_on_the_engine(tmp_path: Path) -> None:
    """Ties broken with random.random(): the engine's run and the simulator's replay each drew from wherever the
    process's generator stood, so the replay parted from the engine's plans; both now start from the seed."""
    (tmp_path / "ties.py").write_text("import random\n\nimport servesim\n\n\nclass RandomTies(servesim.QueuePolicy):\n"
                                      "    def rank(self, req):\n        return (random.random(), req.id)\n")
    cfg, result, requests, core = engine_run({"type": "custom", "cls": f"{tmp_path / 'ties.py'}:RandomTies"})
    __import__("random").random()  # the process's generator moves on between the engine's run and the replay
    assert_replay_reproduces_engine(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS), result, requests, core)


def test_a_policy_object_from_python_has_exact_parity_on_the_engine() -> None:
    """``servesim.run(scenario, policy=obj)``'s way in: the object in the policy section, copied for each run."""
    obj = load_class(USER_CLS)(displace=False)
    cfg, result, requests, core = engine_run({"type": "custom", "cls": "python:PriorityShortestPrompt",
                                              "instance": obj})
    sim_core = assert_replay_reproduces_engine(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS), result, requests,
                                               core)
    for c in (core, sim_core):
        assert type(c.policy.user) is type(obj) and c.policy.user is not obj
        assert c.policy.user.preempt_for_waiting is False  # the object's own setting travelled with the copy


EXAMPLES = HERE.parent / "examples" / "policies"
POLICIES_ON_THE_API = {
    "priority": {"type": "priority"},
    "sjf-noisy": {"type": "sjf", "predictor": {"type": "lognormal", "sigma": 1.0, "seed": 5}},
    "edf-reject-late": {"type": "edf", "reject_late": True},
    # the examples a user copies (examples/policies/): a Policy from scratch, a stateful QueuePolicy asked every
    # step, and one that rejects on its own clock (wake_time)
    "example-shortest-prompt-first": {"type": "custom",
                                      "cls": f"{EXAMPLES / 'shortest_prompt_first.py'}:ShortestPromptFirst"},
    "example-fair-share": {"type": "custom", "cls": f"{EXAMPLES / 'fair_share.py'}:FairShare"},
    "example-slo-admission": {"type": "custom", "cls": f"{EXAMPLES / 'slo_admission.py'}:SLOAdmission",
                              "args": {"service_rate": 100.0}},
}


@pytest.mark.parametrize("policy", list(POLICIES_ON_THE_API.values()), ids=list(POLICIES_ON_THE_API))
def test_policies_on_the_public_api_have_exact_parity_on_the_engine(policy: dict) -> None:
    cfg, result, requests, core = engine_run(policy)
    assert all(r.outcome is not None for r in requests)
    sim_core = assert_replay_reproduces_engine(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS), result, requests,
                                               core)
    assert type(core.policy) is type(sim_core.policy) is UserPolicy  # the public API's adapter
    assert type(core.policy.user) is type(sim_core.policy.user) is type(build(cfg)[0].user)


# ---- the commands ---------------------------------------------------------------------------------------------
def write_scenario(tmp_path: Path, policy: dict, variants: list[dict] | None = None) -> Path:
    (tmp_path / "policies").mkdir(exist_ok=True)
    for name in ("priority_shortest.py", "bad_policies.py"):
        (tmp_path / "policies" / name).write_text((POLICIES / name).read_text())
    raw = scenario(policy, num_requests=20)
    raw["deployment"]["num_gpu_blocks"] = NUM_BLOCKS
    if variants:
        raw["variants"] = variants
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


KINDS = [{"name": kind, "policy": {"type": kind, **LIMITS}} for kind in ("fcfs", "priority", "sjf", "edf")]
MINE = {"type": "custom", "cls": "policies/priority_shortest.py:PriorityShortestPrompt", "args": {"displace": True}}


def test_engine_run_command_runs_every_policy_kind(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, MINE, [{"name": "mine"}, *KINDS])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["engine", "run", str(path), "--out", str(out), "--time-scale", "0.05"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["variants"]
    for name in ("mine", "fcfs", "priority", "sjf", "edf"):
        assert runs[name]["num_completed"] == 20, name


def test_validate_command_runs_a_users_policy(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, MINE)
    out = tmp_path / "val"
    res = CliRunner().invoke(app, ["validate", str(path), "--profile", str(PROFILE), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "validation.json").read_text())
    (v,) = doc["variants"].values()
    assert v["num_completed"]["real"] == v["num_completed"]["sim"] == 20
    # docs/write-a-policy.md: validate replays the engine's measured step times in the simulator, and for a policy
    # of one's own the two schedules match step for step; validate compared only metrics under its profile (35%
    # apart on a busy machine), so a user could not see that the policy decided the same in both
    assert v["schedule"] == {"same": True, "steps": v["steps"]["real_steps"], "differences": []}
    assert v["steps"]["real_steps"] > 20
    line = f"schedule: the simulator fed the engine's {v['steps']['real_steps']:,} measured step times made its every"
    assert line in res.output and line in html.unescape((out / "validation.html").read_text())


def test_validate_names_where_a_policy_decides_otherwise_on_the_engine(tmp_path: Path) -> None:
    """A policy that reads something besides its view (here whether the engine's frames are on the stack; a wall
    clock, say) decides otherwise on the engine than in the simulator: validate says so, and still compares."""
    path = write_scenario(tmp_path, {"type": "custom", "cls": "knows.py:KnowsTheEngine"})
    (tmp_path / "knows.py").write_text(
        "import sys\n\nimport servesim\n\n\nclass KnowsTheEngine(servesim.QueuePolicy):\n"
        "    def rank(self, req):\n"
        "        f, engine = sys._getframe(), False\n"
        "        while f is not None and not engine:\n"
        "            engine, f = 'realengine' in f.f_code.co_filename, f.f_back\n"
        "        return (-req.arrival if engine else req.arrival, req.id)\n")
    out = tmp_path / "val"
    res = CliRunner().invoke(app, ["validate", str(path), "--profile", str(PROFILE), "--out", str(out), "-q",
                                   "--time-scale", "0.05"])  # a queue forms, so the order matters
    assert res.exit_code == 0, res.output
    (v,) = json.loads((out / "validation.json").read_text())["variants"].values()
    assert v["schedule"]["same"] is False and v["schedule"]["differences"], v["schedule"]
    assert f"schedule: DIFFERS from the engine's: {v['schedule']['differences'][0]}" in res.output


@pytest.mark.parametrize(("section", "same"), [
    ({"workload": {"failures": {"fraction": 0.3, "after": {"type": "uniform", "min": 0.0, "max": 0.5},
                                "reason": "cancelled"}}}, True),
    ({"cluster": {"replicas": 2}}, None),
    # validate refused it: 'closed-loop workloads are not supported by the engine yet', which engine run ran
    ({"workload": {"arrival": {"type": "closed_loop", "num_users": 4, "think_time": 0.02}}}, True),
], ids=["failures", "replicas", "closed-loop"])
def test_validates_schedule_line_replays_failures_and_leaves_out_what_it_cannot(tmp_path: Path, section: dict,
                                                                               same: bool | None) -> None:
    """The replay behind validate's schedule line took no failures: a scenario whose clients disconnect (the engine
    cancelled 7 of 30 requests) read 'DIFFERS: the replay took 100 steps, the engine 64' for a policy that decided
    alike; it takes the engine's timed failures now. Replicas behind a router (and speculative decoding, whose
    acceptance the engine measured) it cannot replay: 'not compared', where it said DIFFERS. A closed loop replays
    too, and the profile's simulation takes the think times and failures on the engine's clock (x time_scale)."""
    path = write_scenario(tmp_path, MINE)
    raw = yaml.safe_load(path.read_text())
    for key, value in section.items():
        raw[key] = {**raw.get(key, {}), **value}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "val"
    res = CliRunner().invoke(app, ["validate", str(path), "--profile", str(PROFILE), "--out", str(out), "-q",
                                   "--time-scale", "0.05"])
    assert res.exit_code == 0, res.output
    (v,) = json.loads((out / "validation.json").read_text())["variants"].values()
    assert v["schedule"]["same"] is same, v["schedule"]
    if same is None:
        assert "schedule: not compared (the replay of the engine's step times models one replica" in res.output
        # nor disaggregated pools (serve_disaggregated's replicas), which validate runs too
        from calibration.validate import schedule_parity
        from sim.config.scenario import load_scenario

        disagg, _ = load_scenario(HERE.parent / "scenarios" / "lesson-disaggregation.yaml")
        cfg = next(c for c in variant_configs(disagg) if c.disaggregation is not None)
        assert schedule_parity(cfg, None, [], None, None) is None  # type: ignore[arg-type]
    elif "failures" in section["workload"]:
        engine = (out / "engine" / "requests.csv").read_text()
        assert ",failed," in engine, engine  # some requests were cancelled on the engine
        # and in the simulator, whose clients disconnected at the delays unscaled (up to 0.5 s, not 25 ms) after
        # the scaled arrivals: every request there completed
        assert v["num_completed"]["sim"] < 20, v["num_completed"]


BAD = [
    ("Raises", "variant 'engine-user-policy': policy Raises: schedule(view) at t="),
    # the engine's run is no simulation: its stall said "simulation stalled"
    ("Idle", "variant 'engine-user-policy': policy Idle: engine run stalled: 20 requests without outcome"),
    ("Twice", "schedules request 0 twice"),
    # describe() printing its line and returning None: exit 2 under `servesim run`, exit 0 on the engine
    ("PrintsItsDescription", "policy PrintsItsDescription: describe() returned None, not a str"),
    # admits a request and preempts it at the next ask, forever: the engine ran until 60 s of engine time had gone
    # by without progress (90,112 asks, 3.6 minutes of wall time here); its steps' thrown-away tokens stop it now
    ("TakesBackWhatItPlans", "policy TakesBackWhatItPlans: stalled at t="),
]


@pytest.mark.parametrize(("cls", "message"), BAD, ids=[c for c, _ in BAD])
@pytest.mark.parametrize("command", ["engine", "validate"])
def test_a_policy_failing_on_the_engine_exits_2_with_one_message(tmp_path: Path, command: str, cls: str,
                                                                message: str) -> None:
    path = write_scenario(tmp_path, {"type": "custom", "cls": f"policies/bad_policies.py:{cls}"})
    out = tmp_path / "out"
    args = ["engine", "run", str(path), "--time-scale", "0.05"] if command == "engine" else \
        ["validate", str(path), "--profile", str(PROFILE), "-q"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not out.exists()  # nothing half-written


def test_a_policy_drawing_from_pythons_global_generator_in_its_constructor_has_exact_parity(tmp_path: Path) -> None:
    """The constructor draws too (a salt for its ties): the engine built the policy twice (once to size the KV
    cache) and the replay built it before seeding, so their ranks drew from three different places; each run's
    policy now makes its first draw at the seed, as in the simulator's own run."""
    (tmp_path / "salted.py").write_text(
        "import random\n\nimport servesim\n\n\nclass Salted(servesim.QueuePolicy):\n"
        "    def __init__(self):\n        self.salt = random.random()\n\n"
        "    def rank(self, req):\n        return (random.random() + self.salt, req.id)\n")
    cfg, result, requests, core = engine_run({"type": "custom", "cls": f"{tmp_path / 'salted.py'}:Salted"})
    assert_replay_reproduces_engine(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS), result, requests, core)
