"""Routers and admission rules of a user's own (servesim.Router, servesim.Admission) and the built-in token bucket,
run from scenarios as a policy is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from sim.config.scenario import load_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.loop.run import generate_workload, simulate_variant
from sim.policies.gates import AdmissionState, TokenBucket
from sim.serving.request import Request, RequestSpec
from tests.conftest import servesim as servesim_cli

HERE = Path(__file__).parent
POLICIES = HERE / "data" / "policies"

SCENARIO = """
name: gates
seed: 1
workload:
  arrival: {type: poisson, rate: 40.0}
  num_requests: 150
  prompt_len: {type: uniform, min: 20, max: 400}
  output_len: {type: uniform, min: 2, max: 80}
deployment: {model: llama-3.2-1b, gpu: l4, max_model_len: 1024}
variants:
  - {name: builtin, cluster: {replicas: 3, router: least_outstanding}}
  - {name: mine, cluster: {replicas: 3, router: {type: custom, cls: "bad_policies.py:Fewest"}}}
  - {name: short, admission: {rule: {type: custom, cls: "bad_policies.py:ShortOnly", args: {limit: 200}}}}
  - {name: bucket, admission: {rule: {type: token_bucket, rate: 10, burst: 5}}}
"""


def _scenario(tmp_path: Path, text: str = SCENARIO) -> Path:
    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_a_users_router_and_admission_rules_run_from_a_scenario(tmp_path: Path) -> None:
    sc, _ = load_scenario(_scenario(tmp_path))
    wl = generate_workload(sc)
    runs = {cfg.name: simulate_variant(cfg, wl)[1] for cfg in variant_configs(sc)}
    # the user's router is the built-in least_outstanding rewritten: the very same placement and times
    assert [(r.replica, r.first_token, r.finish) for r in runs["mine"]] == \
        [(r.replica, r.first_token, r.finish) for r in runs["builtin"]]
    assert len({r.replica for r in runs["mine"]}) == 3
    short = runs["short"]
    refused = [r for r in short if r.outcome == "rejected"]
    assert refused and all(r.prompt_len > 200 and r.reason == "prompt over 200 tokens" for r in refused)
    assert all(r.outcome == "completed" for r in short if r.prompt_len <= 200)
    bucket = [r for r in runs["bucket"] if r.outcome == "rejected"]
    assert bucket and all(r.reason.startswith("rate limit: token bucket") for r in bucket)
    # a bucket of 5 refilled at 10/s admits at most 5 + 10 x (last arrival - first) requests
    admitted = [r for r in runs["bucket"] if r.outcome != "rejected"]
    span = max(r.arrival for r in runs["bucket"]) - min(r.arrival for r in runs["bucket"])
    assert len(admitted) <= 5 + 10 * span + 1e-9


def test_a_router_may_return_a_numpy_integer(tmp_path: Path) -> None:
    """``return int(np.argmin(...))`` without the int(): a numpy integer is an index as good as an int (numpy's
    own arrays take it), but the run was refused with 'returned np.int64(0), not the index of one of the 3
    replicas'."""
    (tmp_path / "np_router.py").write_text(
        "import numpy as np\nimport servesim\n\n\nclass ArgminOutstanding(servesim.Router):\n"
        "    def route(self, request, replicas):\n"
        "        return np.argmin([r.num_outstanding for r in replicas])\n")
    text = SCENARIO.replace("bad_policies.py:Fewest", "np_router.py:ArgminOutstanding")
    sc, _ = load_scenario(_scenario(tmp_path, text))
    wl = generate_workload(sc)
    runs = {cfg.name: simulate_variant(cfg, wl)[1] for cfg in variant_configs(sc)[:2]}
    # least outstanding, ties to the lowest index: the built-in's placement exactly
    assert [(r.replica, r.finish) for r in runs["mine"]] == [(r.replica, r.finish) for r in runs["builtin"]]
    assert {r.replica for r in runs["mine"]} == {0, 1, 2} and all(type(r.replica) is int for r in runs["mine"])


def test_token_bucket_exact() -> None:
    tb = TokenBucket(rate=2.0, burst=3)
    req = servesim.RequestView(Request(RequestSpec(0, 0.0, 10, 10), 0.0))
    times = [0.0, 0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 1.0, 1.0]
    got = [tb.admit(req, AdmissionState(t, 0, 0, 10, 10)) is None for t in times]
    # 3 at once, the 4th refused; 0.5 token by 0.25 s (refused), 1 by 0.5 s; 1 more by 1.0 s, then empty
    assert got == [True, True, True, False, False, True, True, False, False]


def test_a_token_bucket_admits_requests_sent_exactly_at_its_rate() -> None:
    """Arrivals 1/rate apart each find one token refilled: floating-point rounding left 0.9999999999999999 of one
    now and then, and a bucket of 1 at 10/s admitted 34 of 50 requests sent every 0.1 s (41 of 150 at 30/s
    against 50 due)."""
    req = servesim.RequestView(Request(RequestSpec(0, 0.0, 10, 10), 0.0))
    tb = TokenBucket(rate=10.0, burst=1)
    assert all(tb.admit(req, AdmissionState(i / 10, 0, 0, 10, 10)) is None for i in range(50))
    tb = TokenBucket(rate=10.0, burst=1)
    got = [tb.admit(req, AdmissionState(i / 30, 0, 0, 10, 10)) is None for i in range(150)]
    assert got == [i % 3 == 0 for i in range(150)]  # one in three: a token every third arrival


def test_a_router_returning_a_bad_index_exits_2(tmp_path: Path) -> None:
    text = SCENARIO.replace("bad_policies.py:Fewest", "bad_policies.py:OutOfRange")
    p = servesim_cli("run", str(_scenario(tmp_path, text)), "-q", "--out", str(tmp_path / "out"), cwd=HERE.parent)
    assert p.returncode == 2, p.stderr
    assert "router OutOfRange: route(request 0) returned 3, not the index of one of the 3 replicas" in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("section", "message"), [
    ('router: {type: custom, cls: "bad_policies.py:RoutesToAnUnprintable"}',
     "router RoutesToAnUnprintable: route(request 0) returned <_NoRepr instance at 0x"),
    ('router: {type: custom, cls: "bad_policies.py:Fewest"}}, admission: {rule: {type: custom, cls: '
     '"bad_policies.py:AdmitsWithAnUnprintable"}',
     "admission AdmitsWithAnUnprintable: admit(request 0) returned <_NoRepr instance at 0x")])
def test_a_hooks_result_whose_repr_raises_exits_2(tmp_path: Path, section: str, message: str) -> None:
    """route() or admit() returning an object of the user's whose __repr__ raises: the message about it raised in
    turn, servesim's traceback and exit 1."""
    text = SCENARIO.replace('router: {type: custom, cls: "bad_policies.py:Fewest"}', section)
    p = servesim_cli("run", str(_scenario(tmp_path, text)), "-q", "--out", str(tmp_path / "out"), cwd=HERE.parent)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_router_that_is_not_one_is_refused_at_load(tmp_path: Path) -> None:
    text = SCENARIO.replace("bad_policies.py:Fewest", "bad_policies.py:ShortOnly")
    p = servesim_cli("run", str(_scenario(tmp_path, text)), "-q", cwd=HERE.parent)
    assert p.returncode == 2 and "ShortOnly has no route() method (subclass servesim.Router)" in p.stderr, p.stderr


def test_a_router_whose_route_is_misspelled_is_told_the_name(tmp_path: Path) -> None:
    """route written rout: 'does not override route()', which left the user to find the typo."""
    text = SCENARIO.replace("bad_policies.py:Fewest", "bad_policies.py:RoutesUnderAMisspelledName")
    p = servesim_cli("run", str(_scenario(tmp_path, text)), "-q", cwd=HERE.parent)
    assert p.returncode == 2, p.stderr
    assert ("RoutesUnderAMisspelledName defines rout, which servesim never calls or reads; did you mean route?"
            in p.stderr), p.stderr


def test_a_router_of_the_wrong_signature_is_refused_at_load(tmp_path: Path) -> None:
    """route(self, request) without the replicas failed only at the first arrival, with Python's TypeError."""
    text = SCENARIO.replace("bad_policies.py:Fewest", "bad_policies.py:RoutesWithoutReplicas")
    p = servesim_cli("run", str(_scenario(tmp_path, text)), "-q", cwd=HERE.parent)
    assert p.returncode == 2, p.stderr
    assert ("RoutesWithoutReplicas has route(request), which cannot be called as route(request, replicas): too many "
            "positional arguments\n") in p.stderr, p.stderr


def test_a_router_or_admission_that_never_returns_is_stopped(tmp_path: Path) -> None:
    """docs/write-a-policy.md: a call that never returns is stopped with one message, 'the same for a router's route
    and an admission's admit' (sim/policies/watchdog.py), exit 2, nothing written."""
    import os

    for old, cls, call, line in (
            ("bad_policies.py:Fewest", "SpinsRouting", "router SpinsRouting: route(request 0)",
             "while request.prompt_len > 0"),
            ('bad_policies.py:ShortOnly", args: {limit: 200}', "SleepsAdmitting",
             "admission SleepsAdmitting: admit(request 0)", "time.sleep(3600)")):
        text = SCENARIO.replace(old, f'bad_policies.py:{cls}"' if "args" in old else f"bad_policies.py:{cls}")
        p = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(_scenario(tmp_path, text)), "-q",
                            "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                           cwd=HERE.parent, env={**os.environ, "SERVESIM_POLICY_TIMEOUT_S": "0.5"})
        assert p.returncode == 2, p.stderr
        assert f"{call} did not return within 0.5 s" in p.stderr and line in p.stderr, p.stderr
        assert not (tmp_path / "out").exists()


def test_an_admission_returning_an_empty_reason_exits_2(tmp_path: Path) -> None:
    """admit() returning "" to mean "accept" refused every request with an empty reason, and the run exited 0."""
    text = SCENARIO.replace('bad_policies.py:ShortOnly", args: {limit: 200}', 'bad_policies.py:TurnsAwayWithEmptyReason"')
    p = servesim_cli("run", str(_scenario(tmp_path, text)), "-q", "--out", str(tmp_path / "out"), cwd=HERE.parent)
    assert p.returncode == 2, p.stderr
    assert ("error: variant 'short': admission TurnsAwayWithEmptyReason: admit(request 2) returned an empty reason '': "
            "return None to accept or a reason string that says why to refuse\n") in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out").exists()


def test_the_token_bucket_is_each_replicas_own(tmp_path: Path) -> None:
    """The admission rule is the engine's, as max_queue_len is (docs/write-a-policy.md, section 9): on 3 replicas
    taking turns, 30 requests/s at constant spacing bring each replica 10/s, which a bucket of 1 refilled at 10/s
    admits whole; one replica admits one in three."""
    text = SCENARIO.replace("poisson, rate: 40.0", "constant, rate: 30.0").replace(
        "rate: 10, burst: 5}}}", "rate: 10, burst: 1}}}\n  - {name: bucket3, cluster: {replicas: 3, router: "
        "round_robin}, admission: {rule: {type: token_bucket, rate: 10, burst: 1}}}")
    sc, _ = load_scenario(_scenario(tmp_path, text))
    wl = generate_workload(sc)
    runs = {cfg.name: simulate_variant(cfg, wl)[1] for cfg in variant_configs(sc) if cfg.name.startswith("bucket")}
    assert sum(r.outcome == "rejected" for r in runs["bucket3"]) == 0
    assert sum(r.outcome == "rejected" for r in runs["bucket"]) == 100  # of 150


DEADLINES = """
import math

import servesim


def due(request):
    return round(request.deadline - request.arrival, 9)


class KnowsDeadlines(servesim.Admission):
    def admit(self, request, state):
        return None if due(request) in (0.5, 30.0) else f"TTFT SLO {due(request)}"


class RoutesByDeadline(servesim.Router):
    def route(self, request, replicas):
        return 0 if due(request) == 0.5 else 1 if due(request) == 30.0 else 2
"""


def test_the_scenarios_ttft_slo_is_the_deadline_of_a_request_whose_class_has_none(tmp_path: Path) -> None:
    """``slos: {ttft: ...}`` holds every request without a class SLO of its own in the metrics, but a policy, router
    or admission rule saw RequestView.deadline inf for it: edf with reject_late on a classless scenario with a 1 s
    TTFT SLO ran exactly as fcfs (200 requests at 14/s: TTFT p99 6.87 s both, 0 rejected, 29% within the SLO); with
    it, 54 rejected, 62.5% within."""
    (tmp_path / "deadlines.py").write_text(DEADLINES)
    text = SCENARIO.replace("  output_len: {type: uniform, min: 2, max: 80}\n", (
        "  output_len: {type: uniform, min: 2, max: 80}\n  classes:\n"
        "    - {name: chat, share: 0.3, slo: {ttft: 0.5}}\n    - {name: batch, share: 0.7}\nslos: {ttft: 30.0}\n"))
    text = text[:text.index("variants:")] + (
        "variants:\n  - {name: gated, cluster: {replicas: 3, router: {type: custom, cls: 'deadlines.py:RoutesByDeadline'}},"
        " admission: {rule: {type: custom, cls: 'deadlines.py:KnowsDeadlines'}}}\n")
    sc, _ = load_scenario(_scenario(tmp_path, text))
    wl = generate_workload(sc)
    reqs = simulate_variant(variant_configs(sc)[0], wl)[1]
    assert all(r.outcome == "completed" for r in reqs)  # every request's deadline: its class's SLO or the scenario's
    assert {(r.spec.slo_class, r.replica) for r in reqs} == {("chat", 0), ("batch", 1)}
    edf = {"workload": {"arrival": {"type": "poisson", "rate": 14.0}, "num_requests": 100,
                        "prompt_len": {"type": "lognormal", "mean": 500, "std": 300, "min": 16, "max": 2048},
                        "output_len": {"type": "lognormal", "mean": 200, "std": 150, "min": 1, "max": 1024}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096}, "slos": {"ttft": 1.0},
           "variants": [{"name": "fcfs", "policy": {"type": "fcfs", "max_num_seqs": 32}},
                        {"name": "edf", "policy": {"type": "edf", "reject_late": True, "max_num_seqs": 32}}]}
    res = servesim.run(edf)
    assert (res.summary["fcfs"]["num_rejected"], res.summary["edf"]["num_rejected"]) == (0, 14)
    assert (res.summary["fcfs"]["slo_attainment"], res.summary["edf"]["slo_attainment"]) == (0.58, 0.79)


def test_a_router_drawing_from_pythons_global_generator_is_reproducible(tmp_path: Path) -> None:
    """Power of two choices written with random.sample: the same command twice read TTFT mean 70.2 ms, then 62.8 ms,
    and two identical variants differed. Each run now starts the global generators from the scenario's seed, and
    gives the caller's back as they were."""
    import random

    (tmp_path / "p2c.py").write_text(
        "import random\n\nimport servesim\n\n\nclass P2C(servesim.Router):\n    def route(self, request, replicas):\n"
        "        a, b = random.sample(list(replicas), 2)\n"
        "        return min((a, b), key=lambda r: (r.num_outstanding, r.index)).index\n")
    router = "{replicas: 3, router: {type: custom, cls: 'p2c.py:P2C'}}"
    text = SCENARIO[:SCENARIO.index("variants:")] + f"variants:\n  - {{name: a, cluster: {router}}}\n" \
        f"  - {{name: b, cluster: {router}}}\n"
    random.seed(7)
    before = random.getstate()
    runs = [servesim.run(_scenario(tmp_path, text)) for _ in range(2)]
    assert random.getstate() == before
    placed = [[(r.replica, r.finish) for r in res.results[i].requests] for res in runs for i in (0, 1)]
    assert placed[0] == placed[1] == placed[2] == placed[3] and len({p[0] for p in placed[0]}) == 3


def test_a_router_without_route_is_not_told_to_subclass_router(tmp_path: Path) -> None:
    """'RoutesNowhere does not override route() (subclass servesim.Router)': it subclasses Router already, and the
    hint sent the user looking for what was done."""
    text = SCENARIO.replace("bad_policies.py:Fewest", "bad_policies.py:RoutesNowhere")
    with pytest.raises(ScenarioError) as e:
        load_scenario(_scenario(tmp_path, text))
    assert str(e.value).endswith("RoutesNowhere does not override route()"), str(e.value)
