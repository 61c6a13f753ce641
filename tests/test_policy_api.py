"""The public policy API (sim.policies.api): a policy written only against it schedules exactly as the built-in
continuous policy does, the schedulers people compare give the gains they are known for (stated margins, seeded
workloads), and the core's fast path stays behind the API."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys
from pathlib import Path

import numpy as np
import pytest

import servesim
from sim.config.scenario import parse_scenario, variant_configs
from sim.costs.analytic import AnalyticCostModel
from sim.hardware.gpu import resolve_gpu
from sim.hardware.models import resolve_model
from sim.loop.run import generate_workload, simulate_variant
from sim.loop.simulator import Simulation
from sim.policies import ContinuousPolicy, Limits
from sim.policies.api import RequestView
from sim.policies.edf import EarliestDeadlineFirst
from sim.policies.predictors import BucketPredictor, NoisyOraclePredictor, OraclePredictor
from sim.policies.priority import PriorityPolicy
from sim.policies.queue import FCFSPolicy
from sim.policies.sjf import ShortestJobFirst
from sim.policies.user import UserPolicy
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import ServingCore
from sim.serving.request import Request, RequestSpec

CHAT = {
    "arrival": {"type": "poisson", "rate": 9.0},
    "num_requests": 250,
    "prompt_len": {"type": "lognormal", "mean": 500, "std": 400, "min": 8, "max": 2000},
    "output_len": {"type": "exponential", "mean": 150, "max": 700},
}


def _pair(builtin: dict, public: dict, blocks: int = 400):
    raw = {
        "workload": CHAT,
        "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096, "num_gpu_blocks": blocks},
        "variants": [{"name": "a", "policy": builtin}, {"name": "b", "policy": public}],
    }
    sc = parse_scenario(raw)
    wl = generate_workload(sc)
    return [simulate_variant(cfg, wl, keep_token_times=True) for cfg in variant_configs(sc)]


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_fcfs_on_the_public_api_schedules_as_the_builtin(chunked: bool, mode: str) -> None:
    builtin = {"type": "continuous", "enable_chunked_prefill": chunked, "preemption_mode": mode,
               "max_num_batched_tokens": 512 if chunked else 4096}
    if not chunked:
        builtin["prefill_mode"] = "mixed"  # decodes beside whole prompts (vLLM v1 unchunked)
    public = {"type": "fcfs", "enable_chunked_prefill": chunked, "preemption_mode": mode,
              "max_num_batched_tokens": 512 if chunked else 4096}
    (ra, qa, ca), (rb, qb, cb) = _pair(builtin, public)
    assert ra.requests == rb.requests and ca.stats == cb.stats
    for col in ra.steps:
        assert np.array_equal(ra.steps[col], rb.steps[col]), col
    assert {r.id: r.token_times for r in qa} == {r.id: r.token_times for r in qb}
    assert ca.stats.num_preemptions > 0  # the scarce KV made the comparison cover preemption


def test_a_declared_policy_is_asked_at_events_only() -> None:
    """depends_on={"arrivals", "finishes"} lets the core take decode stretches without asking; the default (every
    step) asks before each step. Both give the same schedule."""
    calls = {"n": 0}

    class Counting(FCFSPolicy):
        def schedule(self, view):
            calls["n"] += 1
            return super().schedule(view)

    class EveryStep(Counting):
        depends_on = frozenset({"every_step"})

    specs = [RequestSpec(i, 0.05 * i, 100 + 7 * i, 200) for i in range(40)]
    runs = {}
    for cls in (Counting, EveryStep):
        calls["n"] = 0
        core = _core(UserPolicy(cls(), Limits(16, 2048, 4096)), 2000)
        sim = Simulation(specs, [(core, _cost())])
        sim.run()
        runs[cls.__name__] = (calls["n"], len(core.steps), [(r.first_token, r.finish) for r in sim.requests])
    asked, steps, times = runs["Counting"]
    asked_all, steps_all, times_all = runs["EveryStep"]
    assert times == times_all and steps == steps_all
    assert asked_all >= steps_all  # asked before every step (and when idle)
    assert asked < steps / 5  # 40 arrivals and 40 finishes among ~2,000 steps


def _cost() -> AnalyticCostModel:
    return AnalyticCostModel(resolve_model("llama-3.1-8b"), resolve_gpu("a100-80gb"))


def _core(policy, blocks: int) -> ServingCore:
    return ServingCore(policy, PagedBlockManager(blocks, 16))


def _run(policy, specs, blocks: int = 100_000) -> list[Request]:
    sim = Simulation(specs, [(_core(policy, blocks), _cost())])
    sim.run()
    return sim.requests


def _poisson(n: int, rate: float, seed: int, out: np.ndarray, prompt: int = 200, **kw) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [RequestSpec(i, float(t[i]), prompt, int(out[i]), **{k: v(i) for k, v in kw.items()}) for i in range(n)]


def _ttft(reqs: list[Request]) -> np.ndarray:
    return np.array([r.first_token - r.arrival for r in reqs])


def _service_rate(slots: int, out_mean: float, prompt: int) -> float:
    """Requests per second a slot-bound server carries (measured with a probe run, not assumed)."""
    n = 400
    specs = [RequestSpec(i, 0.0, prompt, int(out_mean)) for i in range(n)]
    reqs = _run(UserPolicy(FCFSPolicy(), Limits(slots, 8192, 8192)), specs)
    return n / max(r.finish for r in reqs)


def test_priority_under_overload_serves_the_high_class_far_sooner() -> None:
    """vLLM's priority policy at 1.5x overload: the high class (priority 0, 20% of arrivals) gets a TTFT p99 at least
    5x lower than the low class (priority 1)."""
    slots = 8
    rate = 1.5 * _service_rate(slots, 100, 200)
    n = 600
    rng = np.random.default_rng(7)
    out = np.full(n, 100)
    high = rng.random(n) < 0.2
    specs = _poisson(n, rate, 3, out, priority=lambda i: 0 if high[i] else 1)
    reqs = _run(UserPolicy(PriorityPolicy(), Limits(slots, 8192, 8192)), specs)
    ttft = _ttft(reqs)
    p99_high, p99_low = np.percentile(ttft[high], 99), np.percentile(ttft[~high], 99)
    assert p99_high * 5 <= p99_low, (p99_high, p99_low)
    fcfs = _ttft(_run(UserPolicy(FCFSPolicy(), Limits(slots, 8192, 8192)), specs))
    assert np.percentile(fcfs[high], 99) > 3 * p99_high  # FCFS gives the high class no such protection


def test_priority_preempts_lower_priority_running_work() -> None:
    """A high-priority arrival that finds every slot taken displaces the lowest-priority running request, which
    restarts later (recompute)."""
    specs = [RequestSpec(0, 0.0, 50, 400, priority=1), RequestSpec(1, 0.0, 50, 400, priority=2),
             RequestSpec(2, 0.5, 50, 20, priority=0)]
    reqs = _run(UserPolicy(PriorityPolicy(), Limits(2, 8192, 8192)), specs)
    by = {r.id: r for r in reqs}
    assert by[1].num_preemptions == 1 and by[0].num_preemptions == 0
    assert by[2].first_token < by[1].finish and by[2].first_token - by[2].arrival < 0.1


def _sjf_case(seed: int):
    """80% load on a slot-bound server (max_num_seqs 2: waiting is most of the latency) with heavy-tailed outputs
    (lognormal, median 60 tokens, sigma 1.5). Seeds 11, 12, 13 gave oracle/FCFS mean E2EL ratios 0.53, 0.62, 0.50."""
    slots, n, prompt = 2, 1500, 100
    rng = np.random.default_rng(seed)
    out = np.clip(rng.lognormal(np.log(60), 1.5, n), 1, 3000).astype(int)
    rate = 0.8 * _service_rate(slots, float(out.mean()), prompt)
    return _poisson(n, rate, seed + 1, out, prompt=prompt), Limits(slots, 8192, 8192)


def _mean_e2e(reqs: list[Request]) -> float:
    return float(np.mean([r.finish - r.arrival for r in reqs]))


def test_sjf_with_an_oracle_cuts_mean_latency_and_noise_erodes_the_gain() -> None:
    specs, lim = _sjf_case(11)
    fcfs = _mean_e2e(_run(UserPolicy(FCFSPolicy(), lim), specs))
    oracle = _mean_e2e(_run(UserPolicy(ShortestJobFirst(), lim, predictor=OraclePredictor()), specs))
    assert oracle <= 0.7 * fcfs, (oracle, fcfs)  # at least 30% lower
    gains = [fcfs - oracle]
    for sigma in (0.5, 1.0, 2.0, 4.0):
        noisy = _mean_e2e(_run(UserPolicy(ShortestJobFirst(), lim, predictor=NoisyOraclePredictor(sigma, 5)), specs))
        gains.append(fcfs - noisy)
    assert all(a >= b for a, b in zip(gains, gains[1:], strict=False)), gains  # shrinks as the noise grows


def test_edf_meets_more_ttft_slos_than_fcfs() -> None:
    """Two classes at 1.1x load: tight (TTFT SLO 1 s) and loose (30 s). EDF serves by deadline."""
    slots = 8
    rate = 1.1 * _service_rate(slots, 100, 200)
    n = 600
    rng = np.random.default_rng(5)
    tight = rng.random(n) < 0.3
    specs = _poisson(n, rate, 9, np.full(n, 100), ttft_slo=lambda i: 1.0 if tight[i] else 30.0)
    lim = Limits(slots, 8192, 8192)

    def met(reqs: list[Request]) -> int:
        return sum(r.first_token - r.arrival <= r.spec.ttft_slo for r in reqs)

    fcfs = met(_run(UserPolicy(FCFSPolicy(), lim), specs))
    edf = met(_run(UserPolicy(EarliestDeadlineFirst(), lim), specs))
    assert edf >= fcfs + 0.05 * n, (edf, fcfs)


def test_edf_rejects_requests_past_their_deadline_when_asked() -> None:
    specs = [RequestSpec(i, 0.0, 100, 300, ttft_slo=0.5) for i in range(6)]
    reqs = _run(UserPolicy(EarliestDeadlineFirst(reject_late=True), Limits(2, 8192, 8192)), specs)
    rejected = [r for r in reqs if r.outcome == "rejected"]
    assert len(rejected) == 4 and all("deadline" in r.reason for r in rejected)
    # at the first step boundary after the deadline (a step is ~10 ms here), not when a running request finishes
    # (300 tokens later)
    assert all(0.5 <= r.finish < 0.6 for r in rejected), [r.finish for r in rejected]


def test_predictors_are_deterministic_per_request() -> None:
    r = Request(RequestSpec(5000, 0.0, 10, 400), 0.0)
    assert OraclePredictor().predict(r) == 400
    a, b = NoisyOraclePredictor(1.0, seed=3), NoisyOraclePredictor(1.0, seed=3)
    b.predict(Request(RequestSpec(1, 0.0, 10, 7), 0.0))  # asked in another order: same answers
    assert a.predict(r) == b.predict(r) != NoisyOraclePredictor(1.0, seed=4).predict(r)
    assert BucketPredictor([64, 256, 1024]).predict(r) == 1024
    assert BucketPredictor([64, 256]).predict(r) == 256  # past the last edge: the last edge


def test_request_view_is_read_only_and_current() -> None:
    r = Request(RequestSpec(1, 2.0, 30, 10, priority=3, tenant="t", slo_class="chat", ttft_slo=0.5), 2.0)
    v = RequestView(r)
    assert (v.priority, v.tenant, v.slo_class, v.deadline, v.num_remaining) == (3, "t", "chat", 2.5, 30)
    assert v.predicted_output_len is None
    with pytest.raises(AttributeError):
        v.priority = 0  # type: ignore[misc]
    assert not hasattr(v, "output_len")  # the true length is the predictor's business


@pytest.mark.parametrize(("name", "says"), [
    ("arrival_time", "; did you mean 'arrival'?"),  # vLLM's Request names
    ("num_prompt_tokens", "; did you mean 'prompt_len'?"),
    ("request_id", "; did you mean 'id'?"),
    ("max_tokens", "; a request's true output length is never shown: predicted_output_len"),
    ("prompt_length", "; did you mean 'prompt_len'?"),  # a near miss
    ("zzz", " (a RequestView has arrival, deadline, first_scheduled, id, "),
])
def test_a_name_the_view_lacks_points_to_its_own(name: str, says: str) -> None:
    """A vLLM user's req.arrival_time stopped the run with Python's bare "'RequestView' object has no attribute
    'arrival_time'" (its 'Did you mean' is printed only by Python's own traceback, which the run's message is not)."""
    v = RequestView(Request(RequestSpec(1, 2.0, 30, 10), 2.0))
    with pytest.raises(AttributeError) as e:
        getattr(v, name)
    assert str(e.value) == f"'RequestView' object has no attribute {name!r}" + says or \
        str(e.value).startswith(f"'RequestView' object has no attribute {name!r}{says}"), str(e.value)
    assert getattr(v, "_private", None) is None and not hasattr(v, "__deepcopy__")  # no hint work for these


def test_a_request_keeps_its_view_object_and_the_view_stays_current() -> None:
    """The adapter makes one view per request (not one per request and step: the policy is asked at every arrival
    with every running request in its view)."""
    seen: dict[int, list] = {}

    class Recording(FCFSPolicy):
        def schedule(self, view):
            for v in view.running:
                seen.setdefault(v.id, []).append((v, v.num_output_tokens))
            return super().schedule(view)

    specs = [RequestSpec(i, 0.05 * i, 100 + 7 * i, 50 + i) for i in range(40)]
    reqs = _run(UserPolicy(Recording(), Limits(16, 2048, 4096)), specs)
    assert all(r.num_output_tokens == r.output_len for r in reqs)
    asked_twice = [s for s in seen.values() if len(s) > 1]
    assert len(asked_twice) > 30
    for s in asked_twice:
        assert all(v is s[0][0] for v, _ in s)  # one object
        outs = [n for _, n in s]
        assert outs == sorted(outs) and outs[-1] > outs[0]  # read as the request went on, not frozen


def test_a_view_brings_a_decoding_request_up_to_date_when_read_and_no_other() -> None:
    """Decode-group members' own counters lag the group's steps. The adapter no longer brings every member up to
    date at each ask (a policy asked at every arrival with ~46 running requests spent 5% of an evaluate() there);
    a view does it when one of its counters is read. What the policy reads equals what it reads asked before every
    step without the fast path, at the same times, and the members it did not read still lag."""

    def run(fast: bool) -> tuple[dict, list[int], list]:
        seen: dict = {}
        lagging: list[int] = []

        class Reading(FCFSPolicy):
            def schedule(self, view):
                if view.running:
                    lagging.append(sum(0 <= v._r.group_base < v._g.steps for v in view.running[1:]))
                    v = view.running[0]
                    seen[(view.now, v.id)] = (v.num_computed_tokens, v.num_output_tokens, v.num_tokens)
                return super().schedule(view)

        specs = [RequestSpec(i, 0.05 * i, 100 + 7 * i, 50 + i) for i in range(40)]
        core = ServingCore(UserPolicy(Reading(), Limits(16, 2048, 4096)), PagedBlockManager(100_000, 16),
                           fast_path=fast, keep_token_times=True)
        sim = Simulation(specs, [(core, _cost())])
        sim.run()
        return seen, lagging, [(r.first_token, r.finish, r.token_times) for r in sim.requests]

    seen_fast, lagging, out_fast = run(True)
    seen_slow, _, out_slow = run(False)
    assert out_fast == out_slow
    assert len(seen_fast) > 30 and seen_fast.items() <= seen_slow.items()
    assert max(lagging) > 5  # unread members were left to the group


def test_a_policy_on_a_copy_of_the_running_tuple_schedules_the_same() -> None:
    """The adapter takes schedule_each's entries at once when they were made from the view's own running tuple
    (identity); made from an equal copy they are compared one by one, with the same schedule."""
    import dataclasses

    class OnACopy(FCFSPolicy):
        def schedule(self, view):
            return super().schedule(dataclasses.replace(view, running=tuple(list(view.running))))

    specs = [RequestSpec(i, 0.05 * i, 100 + 7 * i, 50 + i) for i in range(40)]
    a = _run(UserPolicy(FCFSPolicy(), Limits(16, 2048, 4096)), specs, blocks=300)
    b = _run(UserPolicy(OnACopy(), Limits(16, 2048, 4096)), specs, blocks=300)
    assert [(r.first_token, r.finish, r.num_preemptions) for r in a] == \
        [(r.first_token, r.finish, r.num_preemptions) for r in b]
    assert sum(r.num_preemptions for r in a) > 0


@pytest.mark.parametrize(("faults", "message"), [(("twice", "tokens"), "twice"), (("tokens", "twice"), "tokens")])
def test_a_plan_with_two_faults_is_refused_for_the_first(faults: tuple[str, str], message: str) -> None:
    """The scheduled list is checked in one pass and walked again only when something is wrong: the error still
    names the first wrong entry."""
    from sim.policies.user import PolicyError

    class TwoFaults(servesim.Policy):
        def schedule(self, view):
            plan = servesim.Plan()
            if len(view.waiting) >= 2:
                a, b = view.waiting[0], view.waiting[1]
                for f in faults:
                    if f == "twice":
                        plan.schedule(a, 1)
                        plan.schedule(a, 1)
                    else:
                        plan.schedule(b, 10**6)
            return plan

    specs = [RequestSpec(i, 0.0, 100, 10) for i in range(3)]
    with pytest.raises(PolicyError, match=f"schedules (request 0 {message}|1000000 tokens of request 1)") as e:
        _run(UserPolicy(TwoFaults(), Limits(16, 2048, 4096)), specs)
    assert message in str(e.value)


@pytest.mark.parametrize(("fault", "message"), [("twice", "schedules request \\d+ twice"),
                                                ("tokens", "schedules 2 tokens of request")])
def test_a_fault_after_the_running_decodes_is_found(fault: str, message: str) -> None:
    """QueuePolicy plans the running decodes in one call (``schedule_each``), whose entries the adapter checks at
    once when they cover the decode group: an entry changed afterwards, or a member scheduled a second time,
    is still refused."""
    from sim.policies.user import PolicyError

    class Faulty(servesim.QueuePolicy):
        def schedule(self, view):
            plan = super().schedule(view)
            running = view.running
            if len(running) >= 3 and view.waiting and len(plan.scheduled) > len(running) and \
                    all(r.num_remaining == 1 for r in running):
                if fault == "twice":
                    plan.schedule(running[1], 1)
                else:
                    plan.scheduled[1] = (running[1], 2)
            return plan

    specs = [RequestSpec(i, 0.05 * i, 100, 50) for i in range(12)]
    with pytest.raises(PolicyError, match=message):
        _run(UserPolicy(Faulty(), Limits(16, 2048, 4096)), specs)
    assert all(r.num_output_tokens == 50 for r in _run(UserPolicy(servesim.QueuePolicy(), Limits(16, 2048, 4096)),
                                                          specs))


def test_allocate_decodes_refuses_what_is_not_a_view() -> None:
    m = PagedBlockManager(10, 4)
    r = Request(RequestSpec(0, 0.0, 8, 4), 0.0)
    budget = servesim.KVView(m).budget()
    with pytest.raises(TypeError, match="expected a request from the view .*got Request"):
        budget.allocate_decodes([RequestView(r), r])
    assert budget.allocate_decodes([RequestView(r)]) == 0  # waiting: holds no KV


def test_public_names() -> None:
    for name in ("Policy", "Plan", "PolicyView", "RequestView"):
        assert hasattr(servesim, name), name
    assert issubclass(FCFSPolicy, servesim.Policy)


def test_builtin_continuous_is_unchanged_by_the_api() -> None:
    assert not hasattr(ContinuousPolicy, "may_repeat")  # the built-ins keep their own fast path


def test_run_from_python_with_a_policy_object() -> None:
    """servesim.run(scenario, policy=obj): variants without a policy of their own run a fresh copy of ``obj``."""

    class LongestPromptFirst(servesim.QueuePolicy):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0

        def schedule(self, view):
            self.asked += 1  # state: each run must get its own copy
            return super().schedule(view)

        def rank(self, req):
            return (-req.prompt_len, req.arrival, req.id)

    obj = LongestPromptFirst()
    scenario = {
        "workload": {**CHAT, "num_requests": 80, "arrival": {"type": "poisson", "rate": 40.0}},
        "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096},
        "variants": [{"name": "fcfs", "policy": {"type": "fcfs"}}, {"name": "mine"}],
    }
    res = servesim.run(scenario, policy=obj, set={"policy.max_num_seqs": 4})
    assert obj.asked == 0  # copied, never run itself
    s = res.summary
    assert s["mine"]["num_completed"] == s["fcfs"]["num_completed"] == 80
    assert s["mine"]["ttft"]["p50"] != s["fcfs"]["ttft"]["p50"]  # a different order at 4 slots
    assert res.results[1].config["policy"]["type"] == "custom"
    assert res.results[1].config["policy"]["cls"] == "python:test_run_from_python_with_a_policy_object.<locals>." \
        "LongestPromptFirst"


def test_run_with_a_policy_class_not_an_object_names_the_mistake() -> None:
    """policy=MyPolicy (the class, as servesim.evaluate takes it) raised AttributeError: type object 'type' has no
    attribute 'schedule' from deep in the check."""

    class Mine(servesim.QueuePolicy):
        pass

    scenario = {"workload": {**CHAT, "num_requests": 5}, "deployment": {"model": "llama-3.1-8b", "gpu": "l4"}}
    with pytest.raises(servesim.ScenarioError, match=r"^policy= takes a policy object, not the class "
                       r"test_run_with_a_policy_class_not_an_object_names_the_mistake.<locals>.Mine: pass "):
        servesim.run(scenario, policy=Mine)


def test_run_with_a_policy_named_by_text_says_how_to_name_a_file(tmp_path) -> None:
    """policy="my_policy.py:Mine" (the form a scenario's cls takes) raised "cls python:str: str has no
    schedule(view) method (subclass servesim.Policy)": as if the user's class lacked schedule."""
    scenario = {"workload": {**CHAT, "num_requests": 5}, "deployment": {"model": "llama-3.1-8b", "gpu": "l4"}}
    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(scenario, policy="my_policy.py:Mine")
    assert str(e.value) == ("policy= takes a policy object, not the text 'my_policy.py:Mine': pass Mine() from an "
                            "import, or name the file's class with set={'policy.type': 'custom', 'policy.cls': "
                            "'my_policy.py:Mine'}")


@pytest.mark.parametrize(("policy", "says"), [
    # was told to pass fcfs() from an import, or to name the file's class with cls 'fcfs'
    ("fcfs", "policy= takes a policy object, not the text 'fcfs': a built-in kind is named with set={'policy.type': "
     "'fcfs'}"),
    # a policy section: "cls python:dict: dict has no schedule(view) method (subclass servesim.Policy)"
    ({"type": "priority", "max_num_seqs": 8}, "policy= takes a policy object, not a policy section: give its keys "
     "in set, set={'policy.type': 'priority', 'policy.max_num_seqs': 8}"),
])
def test_run_with_a_built_in_policy_named_by_text_or_section_says_how(policy, says) -> None:
    scenario = {"workload": {**CHAT, "num_requests": 5}, "deployment": {"model": "llama-3.1-8b", "gpu": "l4"}}
    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(scenario, policy=policy)
    assert str(e.value) == says


def test_set_type_on_a_custom_policy_keeps_only_the_new_kinds_keys(tmp_path) -> None:
    """--set policy.type=fcfs on a custom policy: cls and args go, the shared limits stay (was: 'policy.cls:
    unknown key')."""
    from sim.config.scenario import load_scenario

    p = tmp_path / "s.yaml"
    p.write_text("workload: {num_requests: 5, arrival: {type: poisson, rate: 1}, prompt_len: {type: fixed, value: 8},"
                 " output_len: {type: fixed, value: 4}}\n"
                 "policy: {type: custom, cls: 'sim.policies.queue:FCFSPolicy', args: {}, max_num_seqs: 7}\n")
    sc, _ = load_scenario(p, {"policy.type": "fcfs"})
    assert sc.policy.type == "fcfs" and sc.policy.max_num_seqs == 7


def test_set_and_sweeps_reach_a_custom_policys_args(tmp_path) -> None:
    from sim.config.scenario import load_scenario
    from sim.loop.run import prepare_scenario

    (tmp_path / "mine.py").write_text(
        "import servesim\n\n\nclass Short(servesim.QueuePolicy):\n"
        "    def __init__(self, short: int = 512) -> None:\n        super().__init__()\n"
        "        if short < 1:\n            raise ValueError(f'short must be >= 1, got {short}')\n"
        "        self.short = short\n\n"
        "    def rank(self, req):\n        return (req.prompt_len > self.short, req.arrival, req.id)\n")
    p = tmp_path / "s.yaml"
    p.write_text("workload: {num_requests: 5, arrival: {type: poisson, rate: 1}, prompt_len: {type: fixed, value: 8},"
                 " output_len: {type: fixed, value: 4}}\n"
                 "policy: {type: custom, cls: 'mine.py:Short', args: {short: 100}}\n"
                 "sweep: {policy.args.short: [10, 20]}\n")
    sc, raw = load_scenario(p, {"policy.args.short": 64})
    assert sc.policy.args == {"short": 64} and sc.policy.make().short == 64
    prepared = prepare_scenario(sc, raw, source=str(p))
    assert [c[0].policy.make().short for _, _, c in prepared.plans] == [10, 20]
    with pytest.raises(servesim.ScenarioError, match="short must be >= 1, got 0"):
        load_scenario(p, {"policy.args.short": 0})


def test_a_policy_file_edited_between_two_runs_in_one_process_runs_its_new_code(tmp_path, monkeypatch) -> None:
    """A notebook edits my_policy.py and runs the cell again: the second run went on with the first version of the
    class, silently (the file's module was cached by its path alone)."""
    monkeypatch.chdir(tmp_path)
    scenario = {"workload": {**CHAT, "num_requests": 10}, "policy": {"type": "custom", "cls": "mine.py:Mine"},
                "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096}}
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n    pass\n")
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 0
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n"
                                      "    def refuse(self, req, view):\n        return 'edited'\n")
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 10
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 10  # and kept while unchanged


def test_a_same_length_edit_within_the_second_runs_its_new_code(tmp_path, monkeypatch) -> None:
    """The loader saw the new bytes (their digest) but ran the import system's loader, which took __pycache__'s
    bytecode of the old file: Python checks a .pyc by the source's mtime in whole seconds and its size, so an edit
    of the same length within the second (a notebook cell run twice quickly) ran the old code. Whether two edits fell
    in one second was chance; here the mtime is pinned, and bytecode is written whatever PYTHONDONTWRITEBYTECODE
    says. A helper beside it likewise."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "path", [*sys.path])  # the folder the loader appends goes with the test
    scenario = {"workload": {**CHAT, "num_requests": 10}, "policy": {"type": "custom", "cls": "mine.py:Mine"},
                "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096}}

    def write(name: str, text: str) -> None:
        f = tmp_path / name
        stamp = f.stat().st_mtime_ns if f.exists() else None
        f.write_text(text)
        if stamp is not None:
            os.utime(f, ns=(stamp, stamp))

    write("mine_helper.py", "WHY = None\n")
    write("mine.py", "import servesim\nimport mine_helper\n\n\nclass Mine(servesim.QueuePolicy):\n"
                     "    def refuse(self, req, view):\n        return None or mine_helper.WHY\n")
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 0
    for name in ("mine.py", "mine_helper.py"):  # the old bytecode there to be taken, as an import system would leave
        py_compile.compile(str(tmp_path / name), cfile=importlib.util.cache_from_source(str(tmp_path / name)))
    write("mine.py", "import servesim\nimport mine_helper\n\n\nclass Mine(servesim.QueuePolicy):\n"
                     "    def refuse(self, req, view):\n        return 'ab' or mine_helper.WHY\n")
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 10
    write("mine.py", "import servesim\nimport mine_helper\n\n\nclass Mine(servesim.QueuePolicy):\n"
                     "    def refuse(self, req, view):\n        return None or mine_helper.WHY\n")
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 0
    write("mine_helper.py", "WHY = 'ab'\n")  # the same length as "None"
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 10
    del sys.modules["mine_helper"]


def test_a_helper_edited_within_the_second_is_imported_anew_by_a_fresh_process(tmp_path, monkeypatch) -> None:
    """7de686b ran the policy file's own bytes and re-ran an edited helper's, but a helper's first import in a
    process (a sweep's spawned worker, a notebook's restarted kernel) went through Python's import system, which
    took the helper's __pycache__ bytecode written by the last process while its mtime (whole seconds) and size
    were unchanged: the old helper ran. A fresh process is the two modules gone from sys.modules."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "path", [*sys.path])
    scenario = {"workload": {**CHAT, "num_requests": 10}, "policy": {"type": "custom", "cls": "mine.py:Mine"},
                "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096}}
    helper = tmp_path / "fresh_helper.py"
    helper.write_text("WHY = None\n")
    (tmp_path / "mine.py").write_text("import servesim\nimport fresh_helper\n\n\nclass Mine(servesim.QueuePolicy):\n"
                                      "    def refuse(self, req, view):\n        return fresh_helper.WHY\n")
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 0
    # what an earlier process leaves: the helper's bytecode (written here, should the loader not have)
    py_compile.compile(str(helper), cfile=importlib.util.cache_from_source(str(helper)))
    stamp = helper.stat().st_mtime_ns
    helper.write_text("WHY = 'ab'\n")  # the same length as "None", the same mtime
    os.utime(helper, ns=(stamp, stamp))
    for name in [n for n in sys.modules if n == "fresh_helper" or n.startswith("servesim_user_")]:
        monkeypatch.delitem(sys.modules, name)
    assert servesim.run(scenario).summary["scenario"]["num_rejected"] == 10
    monkeypatch.delitem(sys.modules, "fresh_helper")


def test_a_queue_policy_whose_init_skips_super_runs_on_the_defaults(tmp_path) -> None:
    """``def __init__(self, short=100): self.short = short`` with no ``super().__init__()`` (Python does not
    insist): every step raised AttributeError: 'Mine' object has no attribute 'enable_chunked_prefill'."""
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n"
                                      "    def __init__(self, short: int = 100) -> None:\n"
                                      "        self.short = short\n")
    (ra, _, ca), (rb, _, cb) = _pair({"type": "fcfs"}, {"type": "custom", "cls": f"{tmp_path / 'mine.py'}:Mine"})
    assert ra.requests == rb.requests and ca.stats == cb.stats  # QueuePolicy()'s defaults: FCFS, chunked, recompute
    assert ca.stats.num_preemptions > 0


def _two_variants(tmp_path, cls: str) -> dict:
    """Two variants of one custom policy, written to tmp_path/s.yaml: the second run makes a second object."""
    scenario = {"workload": {**CHAT, "num_requests": 30}, "policy": {"type": "custom", "cls": cls},
                "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096},
                "variants": [{"name": "a"}, {"name": "b"}]}
    (tmp_path / "s.yaml").write_text(__import__("yaml").safe_dump(scenario))
    return scenario


def test_state_kept_on_the_class_that_a_run_changes_is_refused_before_the_next_run(tmp_path) -> None:
    """``served = {}`` written on the class, not in __init__: one dict for every object, so the second variant
    started with the counts the first left there and the two were compared on different footing, silently. A
    class-level constant that runs only read, and a registry the constructor itself fills, stay allowed."""
    (tmp_path / "mine.py").write_text(
        "import servesim\n\n\nclass OnClass(servesim.QueuePolicy):\n    served = {}\n\n"
        "    def schedule(self, view):\n        plan = super().schedule(view)\n"
        "        for r, n in plan.scheduled:\n            self.served[r.tenant] = self.served.get(r.tenant, 0) + n\n"
        "        return plan\n\n\n"
        "class ReadsOnly(servesim.QueuePolicy):\n    WEIGHTS = {'a': 2}\n    made = []\n\n"
        "    def __init__(self):\n        super().__init__()\n        self.made.append(self)\n\n"
        "    def rank(self, req):\n        return (self.WEIGHTS.get(req.tenant, 1), req.arrival, req.id)\n")
    scenario = _two_variants(tmp_path, "mine.py:OnClass")
    with pytest.raises(servesim.ScenarioError, match=r"variant 'b': policy: cls \S*mine.py:OnClass: OnClass.served "
                       r"is a dict on the class, shared by every object of it \(each run's, each replica's\), and it "
                       r"changed after the last object of it was made"):
        servesim.run(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(__import__("yaml").safe_dump(
        {**scenario, "policy": {"type": "custom", "cls": "mine.py:ReadsOnly"}}))
    res = servesim.run(tmp_path / "s.yaml")
    assert res.summary["a"]["num_completed"] == res.summary["b"]["num_completed"] == 30


def test_state_kept_at_the_top_of_the_module_that_a_run_changes_is_refused_before_the_next_run(tmp_path) -> None:
    """``SERVED = {}`` beside the class, written to by its methods, is as shared as one on the class, and was not
    looked at: two identical variants of a policy that turns newest-first after 300 asks (a module-level counter)
    read TTFT mean 7.56 s and 7.41 s, exit 0. A module-level table that runs only read stays allowed."""
    (tmp_path / "mine.py").write_text(
        "import servesim\n\nCALLS = [0]\nWEIGHTS = {'a': 2}\n\n\ndef count():\n    CALLS[0] += 1\n\n\n"
        "class Flips(servesim.QueuePolicy):\n    def rank(self, req):\n"
        "        return (-req.arrival if CALLS[0] > 30 else req.arrival, req.id)\n\n"
        "    def schedule(self, view):\n        count()\n        return super().schedule(view)\n\n\n"
        "class ReadsOnly(servesim.QueuePolicy):\n"
        "    def rank(self, req):\n        return (WEIGHTS.get(req.tenant, 1), req.arrival, req.id)\n")
    _two_variants(tmp_path, "mine.py:Flips")
    with pytest.raises(servesim.ScenarioError, match=r"variant 'b': policy: cls \S*mine.py:Flips: CALLS is a list at "
                       r"the top of Flips's module, which its code uses, shared by every object of it \(each run's, "
                       r"each replica's\), and it changed after the last object of it was made .*name it in "
                       r"shared_caches = \('CALLS',\) on the class"):
        servesim.run(tmp_path / "s.yaml")
    _two_variants(tmp_path, "mine.py:ReadsOnly")
    res = servesim.run(tmp_path / "s.yaml")
    assert res.summary["a"]["num_completed"] == res.summary["b"]["num_completed"] == 30


def test_an_attribute_named_as_a_module_global_is_not_that_global(tmp_path) -> None:
    """The check looked names up in the class's code's co_names, which holds attribute names too: Own keeps its
    count in self.CALLS, and after a sibling class in its file counted up the module's CALLS, Own's next object was
    refused ("CALLS is a list at the top of Own's module, which its code uses"). Only names the code loads or stores
    as globals count."""
    (tmp_path / "mine.py").write_text(
        "import servesim\n\nCALLS = [0]\n\n\nclass Own(servesim.QueuePolicy):\n    def __init__(self):\n"
        "        super().__init__()\n        self.CALLS = [0]\n\n    def schedule(self, view):\n"
        "        self.CALLS[0] += 1\n        return super().schedule(view)\n\n\n"
        "class Other(servesim.QueuePolicy):\n    def schedule(self, view):\n        CALLS[0] += 1\n"
        "        return super().schedule(view)\n")
    scenario = _two_variants(tmp_path, "mine.py:Own")
    scenario["variants"] = [{"name": "a"}, {"name": "b", "policy": {"type": "custom", "cls": "mine.py:Other"}},
                            {"name": "c"}]
    (tmp_path / "s.yaml").write_text(__import__("yaml").safe_dump(scenario))
    a, _, c = servesim.run(tmp_path / "s.yaml").results
    assert a.requests == c.requests


def test_a_random_generator_a_run_draws_from_is_refused_before_the_next_run(tmp_path) -> None:
    """A generator made once at the top of the file or on the class goes on from where the last run left it: two
    identical variants breaking ties with a module-level np.random.default_rng(0) read TTFT mean 6.31 s and 6.28 s,
    exit 0. One made in __init__ starts afresh for every run."""
    (tmp_path / "rng.py").write_text(
        "import random\n\nimport numpy as np\nimport servesim\n\nRNG = np.random.default_rng(0)\n\n\n"
        "class AtTop(servesim.QueuePolicy):\n    def rank(self, req):\n        return (RNG.random(), req.id)\n\n\n"
        "class OnClass(servesim.QueuePolicy):\n    rng = random.Random(0)\n\n"
        "    def rank(self, req):\n        return (self.rng.random(), req.id)\n\n\n"
        "class Own(servesim.QueuePolicy):\n    def __init__(self):\n        super().__init__()\n"
        "        self.rng = np.random.default_rng(0)\n\n"
        "    def rank(self, req):\n        return (self.rng.random(), req.id)\n")
    for cls, what in (("AtTop", "RNG is a Generator at the top of AtTop's module"),
                      ("OnClass", "OnClass.rng is a Random on the class")):
        _two_variants(tmp_path, f"rng.py:{cls}")
        with pytest.raises(servesim.ScenarioError, match=rf"variant 'b': policy: cls \S*rng.py:{cls}: {what}"):
            servesim.run(tmp_path / "s.yaml")
    _two_variants(tmp_path, "rng.py:Own")
    a, b = servesim.run(tmp_path / "s.yaml").results
    assert a.requests == b.requests


def test_shared_state_the_constructor_sets_afresh_is_allowed(tmp_path) -> None:
    """A policy whose __init__ starts its file's state afresh (``CALLS[0] = 0``, or ``global SERVED; SERVED = {}``)
    starts every object fresh, but was refused before its constructor ran ("CALLS is a list at the top of Resets's
    module ... would not start fresh"). The state is looked at again once the constructor has run; one it leaves as
    the last run left it is still refused."""
    (tmp_path / "mine.py").write_text(
        "import servesim\n\nCALLS = [0]\n\n\nclass Resets(servesim.QueuePolicy):\n    def __init__(self):\n"
        "        super().__init__()\n        CALLS[0] = 0\n\n    def rank(self, req):\n"
        "        return (-req.arrival if CALLS[0] > 30 else req.arrival, req.id)\n\n"
        "    def schedule(self, view):\n        CALLS[0] += 1\n        return super().schedule(view)\n\n\n"
        "class Rebinds(servesim.QueuePolicy):\n    def __init__(self):\n        super().__init__()\n"
        "        global SERVED\n        SERVED = {}\n\n    def rank(self, req):\n"
        "        SERVED[req.id] = SERVED.get(req.id, 0) + 1\n        return (req.arrival, req.id)\n\n\n"
        "class Keeps(Resets):\n    def __init__(self):\n        servesim.QueuePolicy.__init__(self)\n")
    for cls in ("mine.py:Resets", "mine.py:Rebinds"):
        _two_variants(tmp_path, cls)
        res = servesim.run(tmp_path / "s.yaml")
        assert res.results[0].requests == res.results[1].requests, cls
    _two_variants(tmp_path, "mine.py:Keeps")
    with pytest.raises(servesim.ScenarioError, match=r"variant 'b': policy: cls \S*mine.py:Keeps: CALLS is a list at "
                       r"the top of Keeps's module"):
        servesim.run(tmp_path / "s.yaml")


def test_a_cache_the_class_declares_is_shared_on_purpose(tmp_path) -> None:
    """A memo of pure results on the class (``_memo = {}``, filled by rank) is state no run depends on, but the
    check above refused it as a run's ("changed after the last object of it was made"), with no way to say it is
    a cache. Named in ``shared_caches`` it is left out of the check; a cache not named is still refused, and the
    message says how to name it."""
    body = ("import servesim\n\n\nclass Memo(servesim.QueuePolicy):\n{decl}    _memo = {{}}\n\n"
            "    def rank(self, req):\n        key = req.prompt_len // 64\n"
            "        if key not in self._memo:\n            self._memo[key] = key * key\n"
            "        return (self._memo[key], req.arrival, req.id)\n")
    _two_variants(tmp_path, "memo.py:Memo")
    (tmp_path / "memo.py").write_text(body.format(decl=""))
    with pytest.raises(servesim.ScenarioError, match=r"Memo._memo is a dict on the class.*or, if it only caches "
                       r"results no run changes, name it in shared_caches = \('_memo',\) on the class"):
        servesim.run(tmp_path / "s.yaml")
    (tmp_path / "memo.py").write_text(body.format(decl="    shared_caches = ('_memo',)\n"))
    res = servesim.run(tmp_path / "s.yaml")
    assert res.results[0].requests == res.results[1].requests


def test_the_class_state_check_copies_no_large_table_and_sees_a_small_list_grow_large() -> None:
    """A class-level lookup table of 100,000 entries was copied at every object made (a sweep's every point); a
    history list that starts empty is still caught however long a run makes it."""
    import time

    from sim.policies.configs import _SHARED, _shared_state_changed, _snapshot

    class Tables(servesim.QueuePolicy):
        TABLE = {i: i for i in range(100_000)}
        history: list[int] = []

    _SHARED[Tables] = _snapshot(Tables)
    assert set(_SHARED[Tables]) == {"history"}  # the table is not copied
    t = time.process_time()
    for _ in range(100):
        assert _shared_state_changed(Tables) is None
        _SHARED[Tables] = _snapshot(Tables)
    assert time.process_time() - t < 0.5  # a copy of the table each time took about 5 s
    Tables.history.extend(range(5000))
    assert _shared_state_changed(Tables) == "history"


def test_a_stall_of_prompts_longer_than_the_step_budget_says_so() -> None:
    """A custom QueuePolicy with chunking off keeps the budget a chunking policy gets (8192 tokens); prompts longer
    than that were skipped at every step and the run ended 'simulation stalled ... (a policy never schedules
    them?)', the reason left to guess."""
    scenario = {"workload": {"arrival": {"type": "poisson", "rate": 1.0}, "num_requests": 6,
                             "prompt_len": {"type": "uniform", "min": 9000, "max": 12000},
                             "output_len": {"type": "fixed", "value": 4}},
                "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 16384},
                "policy": {"type": "custom", "cls": "sim.policies.queue:FCFSPolicy", "max_num_batched_tokens": 8192,
                           "args": {"enable_chunked_prefill": False}}}
    with pytest.raises(servesim.ScenarioError, match=r"simulation stalled: 6 requests without outcome, 0 never sent "
                       r"\(a policy never schedules them\?\); \d waiting requests have more prompt tokens left than "
                       r"max_num_batched_tokens \(8192\): a policy that does not chunk prompts never fits them in a "
                       r"step \(raise max_num_batched_tokens, or chunk them\)$"):
        servesim.run(scenario)
    one = {**scenario, "workload": {**scenario["workload"], "num_requests": 1}}  # it said '1 waiting requests have'
    # and '(a policy never schedules them?)', '... never fits them in a step' of that one request
    with pytest.raises(servesim.ScenarioError, match=r"simulation stalled: 1 request without outcome, 0 never sent "
                       r"\(a policy never schedules it\?\); 1 waiting request has more prompt tokens left than "
                       r"max_num_batched_tokens \(8192\): a policy that does not chunk prompts never fits it in a "
                       r"step \(raise max_num_batched_tokens, or chunk it\)$"):
        servesim.run(one)
    scenario["policy"]["max_num_batched_tokens"] = 12000
    assert servesim.run(scenario).summary["scenario"]["num_completed"] == 6


def test_a_policy_taking_back_a_lone_request_is_told_in_the_singular() -> None:
    """The stall rule for a policy whose steps compute tokens and take them back (d4a4601) wrote its counts as
    '1 requests in its queues' after 27c0520 had made the other stall messages count with sim/words.py."""
    bad = Path(__file__).resolve().parent / "data" / "policies" / "bad_policies.py"
    scenario = {"workload": {"arrival": {"type": "poisson", "rate": 2.0}, "num_requests": 1,
                             "prompt_len": {"type": "fixed", "value": 100}, "output_len": {"type": "fixed", "value": 10}},
                "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096},
                "policy": {"type": "custom", "cls": f"{bad}:TakesBackWhatItPlans"}}
    with pytest.raises(servesim.PolicyError, match=r"stalled at t=[0-9.]+ s: over the last 4096 asks of the policy "
                       r"its steps computed 2048 tokens and it took them back .* with 1 request in its queues \(0 "
                       r"running\) needing 110 tokens \("):
        servesim.run(scenario)


def test_a_custom_policy_without_chunking_gets_the_unchunked_token_budget() -> None:
    """max_num_batched_tokens left out: 'none: 8192 with chunked prefill, else max(8192, max_model_len)', as the
    built-ins get it; a custom QueuePolicy made with enable_chunked_prefill=False got 8192 and never ran a prompt
    longer than that (the run stalled)."""
    scenario = {"workload": {"arrival": {"type": "poisson", "rate": 1.0}, "num_requests": 6,
                             "prompt_len": {"type": "uniform", "min": 9000, "max": 12000},
                             "output_len": {"type": "fixed", "value": 4}},
                "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 16384},
                "variants": [{"name": "builtin", "policy": {"type": "fcfs", "enable_chunked_prefill": False}},
                             {"name": "custom", "policy": {"type": "custom", "cls": "sim.policies.queue:FCFSPolicy",
                                                           "args": {"enable_chunked_prefill": False}}}]}
    res = servesim.run(scenario)
    assert [r.config["policy"].get("max_num_batched_tokens") for r in res.results] == [None, None]
    builtin, custom = res.results
    assert custom.requests == builtin.requests  # the same schedule: budget max(8192, max_model_len) = 16384
    assert res.summary["custom"]["num_completed"] == 6


def test_a_plan_may_take_numpy_integer_token_counts(tmp_path) -> None:
    """``tokens = np.int64(view.limits.max_num_batched_tokens)`` (a budget kept in numpy), then ``n = min(
    r.num_remaining, tokens)``: a prompt cut by the budget got an np.int64 count, refused as 'not an int', where a
    router's np.int64 is taken (7cd9a93). Any integer but a bool is taken, and the run is the one ints give."""
    (tmp_path / "mine.py").write_text(
        "import numpy as np\nimport servesim\n\n\nclass Mine(servesim.Policy):\n"
        "    def __init__(self, numpy=False):\n        self.numpy = numpy\n\n"
        "    def schedule(self, view):\n        plan = servesim.Plan()\n        budget = view.kv.budget()\n"
        "        tokens = view.limits.max_num_batched_tokens\n"
        "        tokens = np.int64(tokens) if self.numpy is True else float(tokens) if self.numpy else tokens\n"
        "        for r in list(view.running) + list(view.waiting):\n"
        "            n = min(r.num_remaining, tokens)\n"
        "            if n < 1 or not budget.allocate(r, n):\n                break\n"
        "            plan.schedule(r, n)\n            tokens -= n\n"
        "        return plan\n")
    cls = f"{tmp_path / 'mine.py'}:Mine"
    (ra, _, ca), (rb, _, cb) = _pair({"type": "custom", "cls": cls, "max_num_batched_tokens": 512},
                                     {"type": "custom", "cls": cls, "args": {"numpy": True},
                                      "max_num_batched_tokens": 512}, blocks=20_000)
    assert ra.requests == rb.requests and ca.stats == cb.stats
    for col in ra.steps:
        assert np.array_equal(ra.steps[col], rb.steps[col]), col
    assert int(np.count_nonzero(ra.steps["prefill_tokens"] == 512)) > 0  # prompts were cut by the budget
    with pytest.raises(servesim.ScenarioError, match=r"schedules request \d+ with 512.0 tokens, not an int"):
        _pair({"type": "fcfs"}, {"type": "custom", "cls": cls, "args": {"numpy": "float"},
                                 "max_num_batched_tokens": 512}, blocks=20_000)  # a float is still no count


def test_state_kept_on_the_class_in_a_numpy_array_is_refused_too() -> None:
    """``counts = np.zeros(4)`` on the class, added to in place by a run: the same one array for every object as a
    class-level dict, so the next run started with the counts the last left, and the check, which looked at dicts,
    lists, sets and deques, let it through. A numpy array (alone or inside a container) is compared by value."""
    from sim.policies.configs import _SHARED, _shared_state_changed, _snapshot

    class Counts(servesim.QueuePolicy):
        counts = np.zeros(4)
        nested = {"served": np.zeros(2, dtype=np.int64)}
        WEIGHTS = np.array([1.0, np.nan])  # read only: never refused, its NaN equal to itself

    _SHARED[Counts] = _snapshot(Counts)
    assert _shared_state_changed(Counts) is None
    Counts.counts[1] += 3
    assert _shared_state_changed(Counts) == "counts"
    _SHARED[Counts] = _snapshot(Counts)
    Counts.nested["served"][0] += 1
    assert _shared_state_changed(Counts) == "nested"


def test_swap_preemption_without_swap_space_is_refused() -> None:
    """preemption_mode swap with swap_space 0 preempted by recompute every time, silently (60 requests on 200 blocks:
    38 preemptions and TTFT mean 14.88 s, exactly the recompute variant's), where vLLM aborts for lack of CPU swap
    space. A built-in's mode and a user's QueuePolicy's alike."""
    base = {"workload": {**CHAT, "num_requests": 10},
            "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096, "swap_space": 0}}
    for policy in ({"type": "fcfs", "preemption_mode": "swap"},
                   {"type": "custom", "cls": "sim.policies.queue:FCFSPolicy", "args": {"preemption_mode": "swap"}}):
        with pytest.raises(servesim.ScenarioError, match=r"variant 'scenario': policy preemption_mode swap, but "
                           r"deployment.swap_space 0 GiB holds no KV block: every preemption would recompute; give "
                           r"swap_space > 0 \(vLLM's default is 4 GiB\) or preemption_mode recompute$"):
            servesim.run({**base, "policy": policy})
    assert servesim.run({**base, "policy": {"type": "fcfs"}}).summary["scenario"]["num_completed"] == 10


@pytest.mark.parametrize("name", ["max_num_seqs", "note"])
def test_what_a_policy_router_or_admission_rule_is_shown_says_it_is_read_only(name: str) -> None:
    """A name that is not a field of a frozen slots dataclass raised Python 3.11's "TypeError: super(type, obj): obj
    must be an instance or subtype of type" on assignment; every such view now says which is read-only."""
    import dataclasses

    from sim.policies.gates import AdmissionState, ReplicaView

    for shown in (Limits(), ReplicaView(0, 0, 0, 0, 8, 8, 0), AdmissionState(0.0, 0, 0, 8, 8)):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot change '{name}': {type(shown).__name__} "
                           "is read-only"):
            setattr(shown, name, 1)
