"""`servesim tournament`: every policy sees the very same requests at each (load, seed), the winner of each load is
the best mean fitness, priority beats FCFS on the interactive class's TTFT, and a bad spec exits 2."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import apply_point, variant_configs
from sim.loop.run import generate_workload, simulate_variant
from sim.studies.sweep import read_rows, workload_digest
from sim.studies.tournament import fitness_of, load_spec, run_tournament
from tests.conftest import screen

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "policies"
LIMITS = "max_num_seqs: 32, enable_chunked_prefill: true, max_num_batched_tokens: 2048"


def spec_file(tmp_path: Path, body: str, name: str = "t.yaml") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def classes_spec(tmp_path: Path, *, policies: str = "fcfs priority", loads: str = "[1.0, 1.5]",
                 num_requests: int = 100, extra: str = "") -> Path:
    kinds = {"fcfs": "continuous", "priority": "priority", "sjf": "sjf"}
    lines = "".join(f"  {p}: {{type: {kinds[p]}, {LIMITS}}}\n" for p in policies.split())
    return spec_file(tmp_path, f"scenario: {SCENARIOS / 'classes-priority.yaml'}\nnum_requests: {num_requests}\n"
                               f"policies:\n{lines}loads: {{multiplier: {loads}}}\nseeds: [0, 1]\n{extra}")


def test_every_policy_serves_the_same_requests_at_each_load_and_seed(tmp_path: Path) -> None:
    t = load_spec(classes_spec(tmp_path))
    res = run_tournament(t, tmp_path / "out", workers=1)
    assert (res.runs, res.ran) == (8, 8)
    rows = read_rows(tmp_path / "out" / "sweep.csv")
    digests: dict[tuple, set] = {}
    for r in rows:
        digests.setdefault((r["workload.arrival.rate"], r["seed"]), set()).add(r["workload"])
    assert sorted(digests) == [(13.5, 0), (13.5, 1), (20.25, 0), (20.25, 1)]
    assert all(len(d) == 1 for d in digests.values())  # one workload per (load, seed) whatever the policy
    assert len({next(iter(d)) for d in digests.values()}) == 4  # and a load or a seed changes it
    # the digest is that of the requests simulated: the arrival sets of both policies, run here, are equal and
    # give the row's digest
    point = {"workload.arrival.rate": 20.25, "seed": 1}
    sc = apply_point(t.raw, point, "test")
    runs = {cfg.name: simulate_variant(cfg, generate_workload(sc))[0] for cfg in variant_configs(sc)}
    arrivals = {name: sorted((r.id, r.arrival) for r in res_.requests) for name, res_ in runs.items()}
    assert arrivals["fcfs"] == arrivals["priority"] and len(arrivals["fcfs"]) == 100
    assert workload_digest(runs["fcfs"].requests) == next(iter(digests[(20.25, 1)]))
    # run again: every run is found done
    again = run_tournament(t, tmp_path / "out", workers=1)
    assert (again.ran, again.resumed) == (0, 8)


def test_the_winner_of_each_load_is_the_best_mean_fitness(tmp_path: Path) -> None:
    spec = classes_spec(tmp_path, policies="sjf fcfs priority", loads="[0.75, 1.5]",
                        extra="fitness: {weights: {p99_ttft: 1, goodput: 2}}\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(out), "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    t = load_spec(spec)
    rows = read_rows(out / "sweep.csv")
    best = {}
    for load, rate in zip(t.loads, t.rates, strict=True):
        means = {}
        for p in t.policies:
            fs = [fitness_of(r, t.spec.fitness) for r in rows
                  if r["variant"] == p and r["workload.arrival.rate"] == rate]
            assert len(fs) == 2
            means[p] = sum(fs) / 2
        best[t.load_label(load)] = max(means, key=lambda p: means[p])
        assert sorted(means.values())[-1] > sorted(means.values())[-2]  # no tie: the argmax is one policy
    line = next(x for x in res.stdout.splitlines() if x.startswith("winner per load: "))
    assert line == "winner per load: " + ", ".join(f"{k} {v}" for k, v in best.items())
    lines = res.stdout.splitlines()
    table = lines[2 : next(i for i, x in enumerate(lines) if x.startswith("mean ±"))]
    assert len(table) == 6
    assert [m.group(1) for x in table if (m := re.search(r"(\S+) \*\s", x))] == list(best.values())
    assert set(best.values()) != {t.policies[0]}  # the first listed does not win by default
    assert (out / "tournament.html").read_text().count("<tr class='win'>") == 2
    # the closing line names every file in the folder (it left out the runs' sweep.json and sweep.html)
    wrote = next(x for x in lines if x.startswith("wrote "))
    assert sorted(wrote.split(": ", 1)[1].split(", ")) == sorted(p.name for p in out.iterdir())


def test_priority_beats_fcfs_on_the_interactive_class_ttft_under_overload(tmp_path: Path) -> None:
    """At 1.5x the replica's capacity (the scenario's rate), interactive requests (priority 0) jump the queue:
    their TTFT p99 under priority is at least 5x lower than under FCFS at each seed."""
    t = load_spec(classes_spec(tmp_path, loads="[1.5]", num_requests=200))
    res = run_tournament(t, tmp_path / "out", workers=1)
    rows = read_rows(tmp_path / "out" / "sweep.csv")
    p99 = {(r["variant"], r["seed"]): r["classes.interactive.ttft.p99_s"] for r in rows}
    for seed in (0, 1):
        assert p99[("priority", seed)] * 5 <= p99[("fcfs", seed)], p99
    by = {s.policy: s for s in res.standings}
    col = "classes.interactive.ttft.p99_s"
    assert by["priority"].figures[col].max * 5 <= by["fcfs"].figures[col].min
    # the price: the batch class starves longer (the anomaly counter's longest wait; 10.5 s against 9.8 s and
    # 8.3 s against 7.8 s measured)
    wait = {(r["variant"], r["seed"]): r["anomalies.starvation.longest_wait"] for r in rows}
    assert all(wait[("priority", seed)] > wait[("fcfs", seed)] for seed in (0, 1)), wait


NVC = f"scenario: {SCENARIOS / 'naive-vs-continuous.yaml'}\n"
ONE = "policies: {a: {type: continuous}}\nloads: {multiplier: [1]}\n"


def inline(arrival: str) -> str:
    """A scenario written in the spec, without SLOs."""
    return (f"scenario: {{workload: {{arrival: {arrival}, num_requests: 20, prompt_len: {{type: fixed, value: 100}}, "
            "output_len: {type: fixed, value: 10}}, deployment: {model: llama-3.1-8b, gpu: a100-80gb}}\n")


BAD = [
    (NVC + "policies: {}\n", "policies: give at least one policy"),
    (NVC + "policies: {a: {type: continuous}}\nloads: {rate: [1], multiplier: [2]}\n", "give exactly one of rate"),
    (NVC + ONE + "fitnes: {}\n", "fitnes: unknown key"),
    (NVC + ONE + "fitness: {weights: {p99_tft: 1}}\n", "unknown fitness key 'p99_tft'"),
    (NVC + "policies: {a: {type: contiuous}}\nloads: {multiplier: [1]}\n", "policies.a"),
    (NVC + "policies: {a: {type: custom, cls: 'nowhere.py:Mine'}}\nloads: {multiplier: [1]}\n", "nowhere.py"),
    (NVC + "policies: {a: {type: continuous}}\nloads: {multiplier: [1, 1]}\n", "loads must differ"),
    (NVC + ONE + "seeds: [-1]\n", "seeds must be distinct"),
    (NVC + ONE + "fitness: {weights: {jain_index: 1}}\n", "jain_index: the scenario's requests have no tenants"),
    (inline("{type: trace, trace: azure-conv, end: 20}") + ONE + "fitness: {weights: {jain_index: 1}}\n",
     "jain_index: the scenario's requests have no tenants (a class's tenant:, or a trace's tenant column)"),
    (NVC + "policies: {a: {type: vtc, tenant_weights: {chat-ap: 3}}}\nloads: {multiplier: [1]}\n",
     "policies.a: variant 'naive-vs-continuous': policy.tenant_weights: no request has the tenant 'chat-ap'"),
    (inline("{type: poisson, rate: 2}") + ONE + "fitness: {weights: {goodput: 1}}\n",
     "goodput: the scenario has no SLOs"),
    (inline("{type: all_at_once}") + ONE, "the scenario's arrival (all_at_once) has no rate to set"),
    (NVC + ONE.replace("multiplier", "rate") + "fitness: {weights: {p99_ttft: 0}}\n", "at least one weight above 0"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_a_bad_spec_exits_2_with_one_message(tmp_path: Path, body: str, message: str) -> None:
    spec = spec_file(tmp_path, body)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(out), "-q"])
    assert res.exit_code == 2, res.output
    assert message in res.stderr, res.stderr
    assert res.stderr.startswith("error: ") and res.stdout == ""
    assert not out.exists()


def test_an_inline_scenario_and_a_user_policy_file_run(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text((EXAMPLES / "shortest_prompt_first.py").read_text())
    spec = spec_file(tmp_path, inline("{type: poisson, rate: 2}") + "policies: {a: {type: continuous}, "
                     "b: {type: custom, cls: 'mine.py:ShortestPromptFirst'}}\nloads: {rate: [1, 3]}\n")
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output
    assert "1 req/s" in res.stdout and "goodput" not in res.stdout  # no SLOs: throughput instead
    assert sorted(r["workload.arrival.rate"] for r in read_rows(tmp_path / "out" / "sweep.csv")) == [1, 1, 3, 3]


def test_a_policy_written_as_its_kind_or_its_class_runs(tmp_path: Path) -> None:
    """``policies: {fcfs: fcfs}``, a name and the kind it runs, the way one lists built-ins: refused with
    "expected a mapping of keys to values (got 'fcfs')". A bare kind is ``{type: kind}``, a bare 'file.py:Class'
    ``{type: custom, cls: ...}``; an unknown kind is refused with the kinds there are."""
    (tmp_path / "mine.py").write_text((EXAMPLES / "shortest_prompt_first.py").read_text())
    spec = spec_file(tmp_path, inline("{type: poisson, rate: 2}") + "policies: {fcfs: fcfs, sjf: sjf, "
                     "mine: 'mine.py:ShortestPromptFirst'}\nloads: {rate: [1, 3]}\n")
    t = load_spec(spec)
    assert t.spec.policies == {"fcfs": {"type": "fcfs"}, "sjf": {"type": "sjf"},
                               "mine": {"type": "custom", "cls": "mine.py:ShortestPromptFirst"}}
    assert [c.policy.type for c in variant_configs(t.scenario)] == ["fcfs", "sjf", "custom"]
    spec = spec_file(tmp_path, inline("{type: poisson, rate: 2}") + "policies: {a: fcfz}\nloads: {rate: [1]}\n")
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 2 and "policies.a: " in res.stderr and "'fcfs'" in res.stderr, res.stderr


def test_a_spec_file_that_is_no_spec_exits_2(tmp_path: Path) -> None:
    for text, message in (("- a\n", "a tournament spec is a mapping"), ("a: [\n", "not valid YAML")):
        spec = spec_file(tmp_path, text)
        res = CliRunner().invoke(app, ["tournament", str(spec), "-q"])
        assert res.exit_code == 2 and message in res.stderr, res.stderr
    res = CliRunner().invoke(app, ["tournament", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "tournament spec not found" in res.stderr


def test_a_scenario_given_as_a_spec_and_a_spec_given_as_a_scenario_say_so() -> None:
    """The two files mixed up (both live in examples/): each answer was five lines of missing and unknown keys."""
    scenario = EXAMPLES / "fair_share.yaml"
    spec = EXAMPLES.parent / "tournaments" / "priority-vs-fcfs.yaml"
    res = CliRunner().invoke(app, ["tournament", str(scenario), "-q"])
    assert res.exit_code == 2 and res.stderr == (
        f"error: {scenario}: a scenario, not a tournament spec: run it with servesim run, or name it in a spec's "
        "scenario key beside policies and loads (examples/tournaments/priority-vs-fcfs.yaml)\n"), res.stderr
    for command in (["run", str(spec), "-q"], ["sweep", str(spec), "-q"], ["check-policy", str(spec)]):
        res = CliRunner().invoke(app, command)
        assert res.exit_code == 2 and res.stderr == (
            f"error: {spec}: a tournament spec (scenario, policies, loads), not a scenario: run it with servesim "
            "tournament\n"), (command, res.stderr)


def test_fitness_maps_each_key_as_blis_does() -> None:
    from sim.studies.tournament import Fitness

    row = {"request_throughput": 100.0, "ttft.p99_s": 1.0, "fairness.jain_index": 0.5, "goodput": None}
    assert fitness_of(row, Fitness(weights={"throughput": 1})) == 0.5  # v / (v + 100 req/s)
    assert fitness_of(row, Fitness(weights={"p99_ttft": 2})) == 1.0  # 2 x 1 / (1 + 1 s / 1 s)
    assert fitness_of(row, Fitness(weights={"jain_index": 1, "goodput": 3})) == 0.5  # none of it scores 0
    assert math.isclose(fitness_of(row, Fitness(weights={"p99_ttft": 1}, reference={"latency": 0.001})),
                        1 / 1001)  # BLIS's 1 ms reference


def test_the_shipped_example_spec_is_valid() -> None:
    """examples/tournaments/priority-vs-fcfs.yaml: its scenario and user policy resolve from the spec's folder and
    every policy builds."""
    t = load_spec(EXAMPLES.parent / "tournaments" / "priority-vs-fcfs.yaml")
    assert t.policies == ["fcfs", "priority", "sjf", "shortest-prompt"]
    assert t.rates == [6.75, 13.5, 20.25] and t.spec.seeds == [0, 1]


def test_the_docs_spec_is_the_example_file() -> None:
    """docs/policies.md shows examples/tournaments/priority-vs-fcfs.yaml as 'one to copy': the page's block had
    other policies (mine, a bare sjf with 256 seqs) and other limits than the file, so a reader copied neither."""
    doc = (EXAMPLES.parent.parent / "docs" / "policies.md").read_text()
    shown = re.search(r"`examples/tournaments/priority-vs-fcfs\.yaml` is one to copy:\n\n```yaml\n(.*?)```", doc, re.S)
    file = (EXAMPLES.parent / "tournaments" / "priority-vs-fcfs.yaml").read_text()
    assert shown and shown.group(1) == "name: " + file.split("\nname: ", 1)[1]  # the file less its header


def test_a_failing_run_clears_the_progress_bars_before_its_error(tmp_path: Path) -> None:
    # Before: the header followed the checking bar's text on its line ("t: checking points:   0%|...t: 2 policies
    # x ..."), and the error the runs bar's
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Bad(servesim.QueuePolicy):\n"
                                      "    def rank(self, req):\n        raise RuntimeError('boom')\n")
    spec = spec_file(tmp_path, f"scenario: {SCENARIOS / 'classes-priority.yaml'}\nnum_requests: 20\npolicies:\n"
                     f"  fcfs: {{type: continuous, {LIMITS}}}\n  bad: {{type: custom, cls: 'mine.py:Bad'}}\n"
                     "loads: {multiplier: [1.0, 1.5]}\nseeds: [0]\n")
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(tmp_path / "out"), "-j", "1"])
    assert res.exit_code == 2 and "checking points" in res.stderr and "runs:" in res.stderr, res.stderr
    shown = screen(res.stderr)
    assert shown[0] == f"t: 2 policies x 2 loads x 1 seed = 4 runs -> {tmp_path / 'out'}/", res.stderr  # '1 seeds'

    assert shown[1].startswith("error: variant 'bad[workload.arrival.rate="), res.stderr
    assert shown[-1] == "RuntimeError: boom", res.stderr


def test_the_winner_table_shows_every_policy_of_a_tie(tmp_path: Path) -> None:
    """Two policies of one configuration under two names score the very same fitness at every load: the text said
    'a (tied with b)', but tournament.html's "Winner per load" table showed a alone, as if b had lost, and so did
    tournament.json's winners ({"x1": "a"}) and tournament.csv's winner column (1 for a, 0 for b)."""
    lines = "".join(f"  {p}: {{type: continuous, {LIMITS}}}\n" for p in "ab")
    spec = spec_file(tmp_path, f"scenario: {SCENARIOS / 'classes-priority.yaml'}\nnum_requests: 40\n"
                               f"policies:\n{lines}loads: {{multiplier: [1.0]}}\nseeds: [0]\n")
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(tmp_path / "out"), "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "winner per load: x1 a (tied with b)" in res.stdout
    page = (tmp_path / "out" / "tournament.html").read_text()
    winners = page.split("<h2>Winner per load</h2>")[1].split("</table>")[0]
    assert re.findall(r"<tr><td>[^<]*</td><td>([^<]*)</td>", winners) == ["a, b (tie)"]
    assert json.loads((tmp_path / "out" / "tournament.json").read_text())["winners"] == {"x1": ["a", "b"]}
    rows = read_rows(tmp_path / "out" / "tournament.csv")
    assert [(r["policy"], r["winner"]) for r in rows] == [("a", 1), ("b", 1)]


def test_policies_with_different_step_limits_are_noted(tmp_path: Path) -> None:
    """docs/policies.md's spec listed 'fcfs: {type: fcfs, max_num_seqs: 32}' beside 'sjf: sjf' and a user's file
    without limits, which take their kind's defaults (256 sequences): a bare policy beat priority at full load (my
    QueuePolicy copy of vLLM's priority rule, fitness 1.93 against 1.40, the same rule with 32 slots scoring as
    priority) on eight times the batch slots, and the table read as a better order. The table and the page now
    say so; policies of equal limits get no note."""
    lines = f"  a: {{type: continuous, {LIMITS}}}\n  b: fcfs\n"
    spec = spec_file(tmp_path, f"scenario: {SCENARIOS / 'classes-priority.yaml'}\nnum_requests: 30\n"
                               f"policies:\n{lines}loads: {{multiplier: [1.0]}}\nseeds: [0]\n")
    res = CliRunner().invoke(app, ["tournament", str(spec), "--out", str(tmp_path / "out"), "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    note = ("note: the policies ran with different step limits, so more than their order differs: max_num_seqs 32 "
            "(a), 256 (b); max_num_batched_tokens 2,048 (a), 8,192 (b). Give every policy section the same (a bare "
            "kind or file takes its defaults)")
    assert note in res.stdout, res.stdout
    assert html.escape(note) in (tmp_path / "out" / "tournament.html").read_text()
    same = classes_spec(tmp_path, num_requests=30, loads="[1.0]")
    res = CliRunner().invoke(app, ["tournament", str(same), "--out", str(tmp_path / "same"), "-j", "1", "-q"])
    assert res.exit_code == 0 and "step limits" not in res.stdout, res.stdout
