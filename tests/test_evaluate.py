"""servesim.evaluate(): a policy scored for a search loop, its failures returned as scores (sim/studies/evaluate.py)."""

from __future__ import annotations

import math
import os
import sys

import pytest

import servesim
from sim.studies.evaluate import WorkloadCache, evaluate
from sim.studies.tournament import DEFAULT_WEIGHTS

SCENARIO = {
    "name": "eval-chat",
    "seed": 0,
    "workload": {"arrival": {"type": "poisson", "rate": 16.0}, "num_requests": 150,
                 "prompt_len": {"type": "lognormal", "mean": 600, "std": 500, "min": 16, "max": 3072},
                 "output_len": {"type": "exponential", "mean": 120, "min": 1, "max": 1024}},
    "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 4096},
    "slos": {"ttft": 0.2, "tpot": 0.03},
}
LIMITS = {"policy.max_num_seqs": 16}  # a slot-bound server: the order of the queue matters

HEADER = "import servesim\n\n\nclass P(servesim.QueuePolicy):\n    def rank(self, req):\n"
SHORT_FIRST = HEADER + "        return (req.prompt_len, req.arrival, req.id)\n"


def exact(summaries) -> str:
    """Summaries as text, every float's exact digits: a figure with no value is NaN (a summary's "unknown"), and
    a NaN equals another only as the same object, which one unpickled from the worker never is."""
    return repr(list(summaries))


ISOLATION = [pytest.param(True, id="worker"), pytest.param(False, id="in-process")]
if not hasattr(os, "fork"):
    ISOLATION = [pytest.param(False, id="in-process")]


class ShortFirst(servesim.QueuePolicy):
    def __init__(self, scale: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scale = scale

    def rank(self, req: servesim.RequestView) -> tuple[float, float, int]:
        return (self.scale * req.prompt_len, req.arrival, req.id)


def score(policy, **kw):
    kw.setdefault("set", LIMITS)
    kw.setdefault("cache", WorkloadCache())
    return evaluate(policy, SCENARIO, **kw)


@pytest.mark.parametrize("isolate", ISOLATION)
@pytest.mark.parametrize(("source", "reason", "says"), [
    ("import servesim\nclass P(servesim.Policy:\n    pass\n", "syntax", "SyntaxError"),
    (HEADER + "        return 1 / 0\n", "exception", "ZeroDivisionError: division by zero"),
    (HEADER + "        while True:\n            pass\n", "timeout", "CPU-time budget"),
    ("import servesim\nclass P(servesim.Policy):\n    def schedule(self, view):\n        return servesim.Plan()\n",
     "stall", "stalled"),
    ("import servesim\nclass P(servesim.Policy):\n    def schedule(self, view):\n        return None\n",
     "bad_plan", "not a servesim.Plan"),
    ("import servesim\nclass P(servesim.Policy):\n    def schedule(self, view):\n        plan = servesim.Plan()\n"
     "        for r in view.waiting[:1]:\n            plan.schedule(r, 1)\n            plan.schedule(r, 1)\n"
     "        return plan\n", "bad_plan", "twice"),
    (SHORT_FIRST + "\n\nclass Q(P):\n    pass\n", "load", "exactly one servesim.Policy subclass, it defines 2 (P, Q)"),
    ("import servesim\nraise RuntimeError('at import')\n", "load", "RuntimeError: at import"),
])
def test_a_failure_comes_back_as_a_score_with_its_reason(isolate, source, reason, says):
    s = score(source, isolate=isolate, time_limit=1.0)
    assert (s.ok, s.reason) == (False, reason), s.error
    assert says in s.error
    assert s.fitness == -math.inf and math.isnan(s.goodput)


def test_state_at_the_top_of_the_source_text_does_not_carry_from_seed_to_seed():
    """A counter at the top of the text, counted up by schedule(), went on from one seed's run into the next: a
    policy turning newest-first after 150 asks scored seed 1 at TTFT mean 9.21 s after seed 0, 8.99 s before it."""
    text = ("import servesim\n\nCALLS = [0]\n\n\nclass Flips(servesim.QueuePolicy):\n    def rank(self, req):\n"
            "        return (-req.arrival if CALLS[0] > 30 else req.arrival, req.id)\n\n"
            "    def schedule(self, view):\n        CALLS[0] += 1\n        return super().schedule(view)\n")
    s = score(text, seeds=[0, 1], isolate=False)
    assert not s.ok and "CALLS is a list at the top of Flips's module, which its code uses" in s.error, s.error


def test_the_traceback_shows_the_policys_own_lines():
    s = score(HEADER + "        return 1 / 0\n", isolate=False)
    assert '"<policy source>", line 6, in rank' in s.error and "return 1 / 0" in s.error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS holds on Linux")
def test_memory_budget_in_the_worker():
    grows = "import servesim\nKEEP = []\n\n\nclass P(servesim.QueuePolicy):\n    def rank(self, req):\n" \
            "        KEEP.append(bytearray(20 * 2**20))\n        return req.id\n"
    s = score(grows, memory_limit=200, time_limit=20)
    assert (s.ok, s.reason) == (False, "memory"), s.error


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker needs fork")
def test_a_worker_that_dies_is_a_crash_and_the_caller_lives_on():
    s = score(HEADER + "        import os\n        os._exit(3)\n")
    assert (s.ok, s.reason) == (False, "crash") and "status 3" in s.error


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker needs fork")
def test_a_policy_raising_keyboardinterrupt_in_the_worker_is_its_exception():
    """A candidate whose rank raises KeyboardInterrupt killed its worker, and the loop read 'crash: the policy's
    worker exited with status 1 and no result', without the line that raised. The caller was not interrupted (a
    Ctrl-C reaches it too and ends the call), so the worker reports the policy's exception and its line; in the
    calling process (isolate=False) too, a KeyboardInterrupt the policy raises is its exception (a Ctrl-C, a
    signal, still ends the call: sim.policies.user.raised_by_code)."""
    text = HEADER + "        raise KeyboardInterrupt\n"
    for policy in (text, ShortFirstRaising()):  # the kept worker (source text), a worker forked for the call
        s = score(policy)
        assert (s.ok, s.reason) == (False, "exception"), s.error
        assert "raised KeyboardInterrupt" in s.error and ", in rank" in s.error, s.error
    assert '"<policy source>", line 6, in rank' in score(text).error
    # raised while handling another exception: its own line, not the one of the exception it was handling
    handling = HEADER + "        try:\n            return {}['gone']\n        except KeyError:\n            raise KeyboardInterrupt\n"
    s = score(handling)
    assert '"<policy source>", line 9, in rank' in s.error and "line 7" not in s.error, s.error
    s = score(text, isolate=False)
    assert (s.ok, s.reason) == (False, "exception") and "raised KeyboardInterrupt" in s.error, s.error


class ShortFirstRaising(ShortFirst):
    def rank(self, req: servesim.RequestView) -> tuple[float, float, int]:
        raise KeyboardInterrupt


def test_constructor_args_and_a_constructor_that_refuses():
    assert score(ShortFirst, args={"scale": 2.0}, isolate=False).ok
    s = score(ShortFirst, args={"nope": 1}, isolate=False)
    assert (s.ok, s.reason) == (False, "load") and "unexpected keyword argument 'nope'" in s.error
    # scale: float given the string "2" ran silently, each rank "2" repeated prompt_len times (ok, fitness 0.430)
    s = score(ShortFirst, args={"scale": "2"}, isolate=False)
    assert (s.ok, s.reason, s.error) == (False, "load", "args scale='2' does not fit ShortFirst's constructor, which "
                                         "takes scale: float (input should be a valid number)")
    assert score(ShortFirst, args={"scale": __import__("numpy").int64(2)}, isolate=False).ok  # a search's draw



class RandomTies(servesim.QueuePolicy):
    def rank(self, req):
        return (__import__("random").random(), req.id)


@pytest.mark.parametrize("isolate", ISOLATION)
def test_a_policy_drawing_from_random_scores_servesim_runs_of_each_seed(isolate):
    """Each seed's run starts Python's global generator from that seed, as servesim.run(seed=s) does: evaluate
    seeded every seed's run from the scenario's seed (0), so seed 1's figures were not servesim.run's."""
    s = score(RandomTies(), seeds=[1, 2], isolate=isolate)
    runs = [servesim.run(SCENARIO, policy=RandomTies(), seed=seed, set=LIMITS) for seed in (1, 2)]
    assert s.ok and exact(s.summaries) == exact(r.summary[r.variants[0]] for r in runs)

@pytest.mark.parametrize("isolate", ISOLATION)
def test_scores_are_servesim_runs_summaries_and_their_means(isolate):
    s = score(ShortFirst(), seeds=[0, 1], isolate=isolate)
    assert s.ok and s.seeds == (0, 1)
    summaries = []
    for seed in (0, 1):
        res = servesim.run(SCENARIO, policy=ShortFirst(), seed=seed, set=LIMITS)
        summaries.append(res.summary[res.variants[0]])
    assert exact(s.summaries) == exact(summaries)  # the very figures, not close ones
    assert s.goodput == (summaries[0]["goodput"] + summaries[1]["goodput"]) / 2
    assert s.ttft_p99 == (summaries[0]["ttft"]["p99"] + summaries[1]["ttft"]["p99"]) / 2
    assert s.throughput == (summaries[0]["request_throughput"] + summaries[1]["request_throughput"]) / 2
    # the tournament's fitness, BLIS's mapping to [0, 1] with its default weights and references, seed by seed
    assert DEFAULT_WEIGHTS == {"throughput": 1.0, "p99_ttft": 1.0, "p99_e2e": 1.0}
    per_seed = [x["request_throughput"] / (x["request_throughput"] + 100.0) + 1 / (1 + x["ttft"]["p99"] / 1.0)
                + 1 / (1 + x["e2el"]["p99"] / 1.0) for x in summaries]
    assert s.fitness == pytest.approx(sum(per_seed) / 2, rel=1e-12)


def test_source_text_object_and_class_score_the_same_and_repeat_exactly():
    def same(s):  # NaN (no tenants: no Jain's index) is None here, so that equal scores compare equal
        return {k: v for k, v in s.to_dict().items() if k != "cpu_seconds"}

    a = score(SHORT_FIRST, seeds=[3, 4])
    assert same(a) == same(score(SHORT_FIRST, seeds=[3, 4])) == same(score(ShortFirst, seeds=[3, 4])) == \
        same(score(ShortFirst(), seeds=[3, 4], isolate=False))
    assert all(math.isfinite(v) for k, v in a.metrics().items() if k != "jain_index")
    assert score(SHORT_FIRST, seeds=[5]).summaries != a.summaries[:1]  # another seed, another workload


def test_the_workload_is_generated_once_per_scenario_and_seed():
    cache = WorkloadCache()
    for policy in (SHORT_FIRST, ShortFirst(), servesim.QueuePolicy()):
        assert evaluate(policy, SCENARIO, seeds=[0, 1], set=LIMITS, cache=cache).ok
    assert cache.generated == 2
    evaluate(SHORT_FIRST, SCENARIO, seeds=[1, 2], set=LIMITS, cache=cache)  # seed 2 is new
    assert cache.generated == 3
    evaluate(SHORT_FIRST, SCENARIO, seeds=[0], num_requests=100, set=LIMITS, cache=cache)  # another workload
    assert cache.generated == 4


def test_fitness_takes_the_tournaments_weights_and_references_and_blis_spelling():
    s = score(SHORT_FIRST, weights="goodput:1, p99_ttft:2", reference={"requests_per_s": 1.0}, isolate=False)
    assert s.fitness == pytest.approx(s.goodput / (s.goodput + 1.0) + 2 / (1 + s.ttft_p99), rel=1e-12)
    assert score(SHORT_FIRST, weights={"slo_attainment": 0.5}, isolate=False).fitness == 0.5 * s.slo_attainment


@pytest.mark.parametrize(("kw", "says"), [
    ({"weights": {"latency": 1.0}}, "unknown fitness key 'latency'"),
    ({"weights": "goodput"}, "is not 'key:weight' with a number"),
    ({"weights": {"goodput": -1.0}}, "must be finite and >= 0"),
    ({"seeds": []}, "seeds must be"),
    ({"seeds": 1.5}, "seeds must be an integer >= 0 or a non-empty list of them, got 1.5"),  # was a TypeError
    ({"time_limit": 0}, "time_limit must be a number > 0"),
    ({"set": {"deployment.nope": 1}}, "nope"),
    # before: AttributeError ('int' object has no attribute 'get'), a TypeError from os.fspath, and a truthy
    # "no" that forked a worker
    ({"cache": 5}, "cache must be a servesim.WorkloadCache \\(or None: the default one\\), got int"),
    ({"out": 5}, "out must be a path \\(text or pathlib.Path\\), got int 5"),
    ({"isolate": "no"}, "isolate must be True, False or None \\(the platform's default\\), got 'no'"),
])
def test_a_mistake_in_the_call_itself_raises(kw, says):
    with pytest.raises(servesim.ScenarioError, match=says):
        score(SHORT_FIRST, **kw)


def test_an_unknown_fitness_key_is_worded_without_pydantics_prefix():
    with pytest.raises(servesim.ScenarioError) as e:
        score(SHORT_FIRST, weights={"latency": 1.0})
    assert str(e.value).startswith("fitness: weights: unknown fitness key 'latency'; the keys: ")  # was "Value error, "


def test_goodput_without_slos_is_refused_before_anything_runs():
    no_slos = {k: v for k, v in SCENARIO.items() if k != "slos"}
    with pytest.raises(servesim.ScenarioError, match="needs SLOs"):
        evaluate(SHORT_FIRST, no_slos, weights={"goodput": 1.0}, cache=WorkloadCache())
    assert evaluate(SHORT_FIRST, no_slos, cache=WorkloadCache()).ok


def test_nothing_is_written_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert score(SHORT_FIRST).ok
    assert list(tmp_path.iterdir()) == []
    s = score(SHORT_FIRST, seeds=[0, 1], out=tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["scores.json", "seed-0", "seed-1"]
    assert (tmp_path / "out" / "seed-1" / "summary.json").is_file()
    import json

    assert json.loads((tmp_path / "out" / "scores.json").read_text())["goodput"] == s.goodput


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker needs fork")
def test_the_worker_holds_the_time_budget_when_called_from_a_thread():
    import threading

    out = []
    thread = threading.Thread(target=lambda: out.append(score(HEADER + "        while True:\n            pass\n",
                                                              time_limit=0.5)))
    thread.start()
    thread.join(timeout=120)
    assert [(s.ok, s.reason) for s in out] == [(False, "timeout")]


def test_a_hook_under_a_wrong_name_is_told_so_without_the_subclass_hint():
    """A QueuePolicy subclass with rnak for rank was told to '(subclass servesim.Policy)', which it does."""
    source = ("import servesim\nclass P(servesim.QueuePolicy):\n    def rnak(self, req):\n"
              "        return (req.prompt_len, req.arrival, req.id)\n")
    s = score(source, isolate=False)
    assert (s.ok, s.reason, s.error) == (False, "load", "P defines rnak, which servesim never calls or reads; did you "
                                         "mean rank? (a helper of your own: start its name with _)")
    s = score("import servesim\nclass P(servesim.Policy):\n    pass\n", isolate=False)
    # it subclasses servesim.Policy already: the hint to do so sent the user looking for what was done (b46fe15)
    assert s.error == "P does not override schedule(view)"
