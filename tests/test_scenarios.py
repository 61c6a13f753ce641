"""Every scenario file runs here, scaled down, and the lesson it teaches is checked; plus determinism of a run
folder, the exported JSON Schema, and sweeps.

The scaled-down settings keep each file's configuration and cut only the workload (fewer requests, or a shorter
trace window), chosen so that the effect the file shows is still there. Full-size figures are in each file's
comments.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import load_scenario
from sim.config.schema import json_schema
from sim.loop.run import run_scenario, write_scenario_run
from sim.metrics.summary import bottleneck
from tests.conftest import scenario_summaries

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
FILES = sorted(SCENARIOS.glob("*.yaml"))

Summaries = dict[str, dict]


# ---- per-file checks ------------------------------------------------------------------------------------------
def check_naive_vs_continuous(s: Summaries) -> None:
    naive, cont = s["naive"], s["continuous"]
    assert cont["output_throughput"] >= 3 * naive["output_throughput"]
    assert cont["ttft"]["p50"] < naive["ttft"]["p50"]
    assert cont["ttft"]["p99"] < 2.0  # continuous keeps up: no queue builds
    assert cont["goodput"] > naive["goodput"]
    # the naive server wastes most of what it reserves; paged KV stores tokens in nearly every slot it allocates
    assert naive["kv_token_utilization"] < 0.5 < 0.9 < cont["kv_token_utilization"]


def check_memory_ceiling(s: Summaries) -> None:
    bf16, fp8 = s["bf16-kv"], s["fp8-kv"]
    assert bf16["kv_usage"]["max"] > 0.9
    assert bf16["mfu"] < 0.15  # compute far from saturated
    assert bf16["num_rejected"] > 0
    assert bf16["num_preemptions"] > 0
    assert "memory" in bottleneck(bf16)
    # twice the KV capacity: more served, fewer refused, on the same GPU and weights
    assert fp8["output_throughput"] > 1.2 * bf16["output_throughput"]
    assert fp8["num_rejected"] < bf16["num_rejected"]
    assert fp8["mean_batch_size"] > bf16["mean_batch_size"]


def check_mooncake(s: Summaries) -> None:
    off, on = s["no-prefix-cache"], s["prefix-cache"]
    assert on["ttft"]["mean"] < 0.5 * off["ttft"]["mean"]
    assert on["output_throughput"] > off["output_throughput"]
    assert on["goodput"] > off["goodput"]
    assert on["num_preemptions"] < off["num_preemptions"]


def check_azure_conv(s: Summaries) -> None:
    assert len(s) == 6  # 3 variants x 2 rates
    for rate in ("1.0", "3.0"):
        chunked, unchunked, seqs64 = (s[f"{v}[rate_scale={rate}]"] for v in ("chunked", "unchunked", "seqs64"))
        for x in (chunked, unchunked, seqs64):
            assert x["num_completed"] == x["num_requests"] > 100
            assert x["num_rejected"] == x["num_preemptions"] == 0
            assert x["kv_usage"]["max"] < 0.5  # one H100 has KV to spare for this trace
            assert x["ttft"]["p50"] < 0.5
            assert 0.005 < x["tpot"]["p50"] < 0.05
        # chunking spreads prompts over steps, so decodes never wait long for a step
        assert chunked["itl"]["p99"] <= unchunked["itl"]["p99"]
    slow, fast = s["chunked[rate_scale=1.0]"], s["chunked[rate_scale=3.0]"]
    assert fast["request_throughput"] > 2 * slow["request_throughput"]
    # the cap of 64 requests per step is what queues first
    assert s["seqs64[rate_scale=3.0]"]["ttft"]["p99"] > s["chunked[rate_scale=3.0]"]["ttft"]["p99"]


def check_azure_code(s: Summaries) -> None:
    chunked, unchunked, adm = s["chunked"], s["unchunked"], s["admission-2s"]
    for x in (chunked, unchunked):
        assert x["num_completed"] == x["num_requests"] > 300
        assert x["ttft"]["p99"] > 5.0  # the burst queues seconds of prefill
    # decodes stall behind whole prompts without chunking
    assert unchunked["tpot"]["p99"] > 5 * chunked["tpot"]["p99"]
    # admission control refuses some of the burst and bounds the wait of the rest
    assert adm["num_rejected"] > 0
    assert adm["num_completed"] + adm["num_rejected"] == adm["num_requests"]
    assert adm["queue"]["p99"] <= 2.5  # max_queue_delay 2 s, checked at step boundaries
    assert adm["ttft"]["p99"] < chunked["ttft"]["p99"] / 2
    assert adm["goodput"] > chunked["goodput"]


def check_lesson_continuous_batching(s: Summaries) -> None:
    # the 4-8x range itself is asserted in tests/test_lessons.py
    assert s["continuous"]["output_throughput"] > 4 * s["naive"]["output_throughput"]


def check_lesson_paged_memory(s: Summaries) -> None:
    assert s["contiguous"]["kv_token_utilization"] < 0.4 < 0.95 < s["paged"]["kv_token_utilization"]


def check_lesson_memory_bound(s: Summaries) -> None:
    assert "memory" in bottleneck(s["bf16-two-gpus"])
    assert s["bf16-two-gpus"]["num_rejected"] > 0 == s["fp8-weights-and-kv"]["num_rejected"]


def check_lesson_speculative_decoding(s: Summaries) -> None:
    # a speed-up at batch 1 and a loss at 512 users (the ranges: tests/test_lessons.py)
    for users, faster in ((1, True), (512, False)):
        spec, base = s[f"draft-k4[num_users={users}]"], s[f"no-spec[num_users={users}]"]
        assert (spec["output_throughput"] > base["output_throughput"]) is faster, users
        assert "spec_decode" in spec and "spec_decode" not in base
def check_lesson_disaggregation(s: Summaries) -> None:
    # the 1.1-1.6x range itself is asserted in tests/test_disagg.py; the bad split loses
    assert s["2P2D"]["goodput"] > s["colocated"]["goodput"] > s["3P1D"]["goodput"]
    assert s["2P2D"]["disaggregation"]["num_transfers"] == s["2P2D"]["num_completed"]


def check_failure_leak(s: Summaries) -> None:
    ok, leak, leak2x = s["correct-40gb"], s["leaky-40gb"], s["leaky-80gb"]
    assert ok["num_failed"] > 0 and ok["num_rejected"] == 0 and ok["kv_usage"]["max"] < 0.3
    assert leak["kv_usage"]["max"] > 0.99 and leak["num_rejected"] > 0 and "memory" in bottleneck(leak)
    # twice the memory: the same stall, later and smaller
    assert 0 < leak2x["num_rejected"] < leak["num_rejected"]
    assert ok["kv_usage"]["mean"] < leak2x["kv_usage"]["mean"] < leak["kv_usage"]["mean"]


def check_plan_chat(s: Summaries) -> None:
    # `servesim run` simulates its deployment section (one H100), which meets the SLOs the plan targets;
    # tests/test_planner.py runs the plan itself
    (x,) = s.values()
    assert x["num_completed"] == x["num_requests"]
    assert x["ttft"]["p99"] < 0.5 and x["tpot"]["p99"] < 0.03 and x["slo_attainment"] == 1.0


def check_autoscale_memory_bound(s: Summaries) -> None:
    compute, busy, kv = s["scale-on-compute"], s["scale-on-busy"], s["scale-on-kv"]
    # the compute signal never sees the memory-bound overload: one replica, most requests refused
    assert compute["cluster"]["replicas_max"] == 1 and compute["slo_attainment"] < 0.3
    assert compute["mfu"] < 0.15 and compute["kv_usage"]["mean"] > 0.7
    # KV pressure catches it, for less than scaling on busy (which reads ~100% at any load and maxes out)
    assert kv["slo_attainment"] > compute["slo_attainment"] + 0.5
    assert kv["cluster"]["cost_usd"] < busy["cluster"]["cost_usd"]
    assert kv["cluster"]["replicas_mean"] < busy["cluster"]["replicas_mean"]


def check_lesson_pipeline_bubbles(s: Summaries) -> None:
    # tests/test_pipeline.py checks the lesson's range; here: one micro-batch idles most of each stage
    users = {int(k.split("num_users=")[1].rstrip("]")): v for k, v in s.items()}
    assert users[1]["pipeline"]["bubble_fraction"] > 0.6 > 0.2 > users[16]["pipeline"]["bubble_fraction"]


def check_lesson_host_kv_cache(s: Summaries) -> None:
    # tests/test_host_kv_tier.py checks the lesson's range; here: the tier loads prefixes back and TTFT falls
    assert "host_kv" not in s["gpu-only"] and s["host-1024"]["host_kv"]["loaded_blocks"] > 0
    assert s["host-1024"]["ttft"]["mean"] < s["gpu-only"]["ttft"]["mean"]


def check_classes_priority(s: Summaries) -> None:
    x, p = s["fcfs"], s["priority"]
    inter, batch = x["classes"]["interactive"], x["classes"]["batch"]
    assert abs(inter["num_requests"] / x["num_requests"] - 0.2) < 0.06  # 300 draws: binomial std 0.023
    assert (inter["priority"], batch["priority"]) == (0, 1)
    assert x["limits"]["queue_end"] > 10 * max(x["limits"]["queue_start"], 1)  # overloaded: the queue grows
    # FCFS: one queue for both classes, so interactive waits as long as batch and misses its 1 s TTFT SLO
    assert 0.5 < inter["ttft"]["p99"] / batch["ttft"]["p99"] < 2
    assert inter["slo_attainment"] < 0.5 and batch["slo_attainment"] == 1.0
    assert x["fairness"]["served_share_jain_index"] == 1.0  # every tenant fully served, only later
    # priority: interactive served first (its TTFT p99 at least 5x lower than batch's), batch pays with preemptions
    pi, pb = p["classes"]["interactive"], p["classes"]["batch"]
    assert pi["ttft"]["p99"] * 5 <= pb["ttft"]["p99"] and pi["slo_attainment"] > 0.95
    assert p["num_preemptions"] > 0 and p["num_completed"] == x["num_completed"]


# file stem -> (overrides that scale it down, checks)
def check_vidur(s: Summaries) -> None:
    (v,) = s.values()
    assert v["num_completed"] == v["num_requests"] == 300
    # the arxiv pairs: prefill mean 2,588, decode mean 291 over the file (300 draws: within 10%)
    assert abs(v["total_input_tokens"] / 300 - 2588) < 259 and abs(v["total_output_tokens"] / 300 - 291) < 45
    # 70B weights leave ~19,000 KV tokens on two A100s: a handful of arxiv requests fit at once
    assert v["mean_batch_size"] < 10 and v["busy_fraction"] > 0.9


CASES: dict[str, tuple[dict, Callable[[Summaries], None]]] = {
    "naive-vs-continuous": ({"workload.num_requests": 200}, check_naive_vs_continuous),
    "memory-ceiling": ({"workload.num_requests": 80}, check_memory_ceiling),
    "mooncake-long-context": ({"workload.arrival.end": 200}, check_mooncake),
    "azure-conv": ({"workload.arrival.end": 60}, check_azure_conv),
    # the largest burst of the first 20 minutes lies in this minute
    "azure-code-bursty": ({"workload.arrival.start": 840, "workload.arrival.end": 900}, check_azure_code),
    # the lessons (tests/test_lessons.py checks their published ranges on the same settings)
    "lesson-continuous-batching": ({"workload.num_requests": 600}, check_lesson_continuous_batching),
    "lesson-paged-memory": ({"workload.num_requests": 300}, check_lesson_paged_memory),
    "lesson-memory-bound": ({"workload.num_requests": 200}, check_lesson_memory_bound),
    # 768: tests/test_lessons.py's run of it, simulated once for both
    "lesson-speculative-decoding": ({"workload.num_requests": 768}, check_lesson_speculative_decoding),
    "lesson-disaggregation": ({}, check_lesson_disaggregation),
    "plan-chat": ({"workload.num_requests": 200}, check_plan_chat),
    # more failures, fewer requests: the leak still fills both caches
    "failure-leak": ({"workload.num_requests": 3000, "workload.failures.fraction": 0.6}, check_failure_leak),
    "autoscale-memory-bound": ({"workload.num_requests": 250}, check_autoscale_memory_bound),
    "vidur-arxiv-llama2-70b": ({"workload.num_requests": 300}, check_vidur),
    "lesson-pipeline-bubbles": ({"workload.num_requests": 32}, check_lesson_pipeline_bubbles),
    # end 200: tests/test_host_kv_tier.py's run of it, simulated once for both
    "lesson-host-kv-cache": ({"workload.arrival.end": 200}, check_lesson_host_kv_cache),
    "classes-priority": ({"workload.num_requests": 300}, check_classes_priority),
}


def _check_invariants(name: str, s: dict) -> None:
    n = s["num_requests"]
    assert s["num_completed"] + s["num_rejected"] + s["num_failed"] == n, name
    assert s["num_completed"] > 0, name
    for metric in ("ttft", "tpot", "e2el", "queue"):
        for key, v in s[metric].items():
            assert math.isfinite(v) and v >= 0, (name, metric, key, v)
    assert s["ttft"]["p50"] <= s["ttft"]["p99"] and s["ttft"]["p99"] <= s["e2el"]["p99"] + 1e-9, name
    assert 0 <= s["kv_usage"]["mean"] <= s["kv_usage"]["max"] <= 1 + 1e-9, name
    assert 0 < s["mfu"] < 1, name
    assert 0 < s["busy_fraction"] <= 1 + 1e-9, name
    assert 0 <= s["slo_attainment"] <= 1, name
    assert isinstance(bottleneck(s), str)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_file(path: Path) -> None:
    if path.stem not in CASES:
        pytest.fail(f"{path.name} has no scaled-down setting and checks in tests/test_scenarios.py CASES")
    overrides, check = CASES[path.stem]
    scenario, _ = load_scenario(path, overrides)
    assert scenario.name == path.stem
    assert scenario.description
    summaries = scenario_summaries(path, overrides)  # run_scenario(scenario, raw), shared with tests/test_lessons.py
    for name, s in summaries.items():
        _check_invariants(name, s)
    check(summaries)


def test_every_scenario_has_a_case() -> None:
    assert {p.stem for p in FILES} == set(CASES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_files_are_documented(path: Path) -> None:
    """A file explains itself in comments and states its measured full-size run time."""
    text = path.read_text()
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) >= 5
    assert any("Full size" in c and " s " in c + " " for c in comments)


# ---- determinism ----------------------------------------------------------------------------------------------
RUN_FILES = ("summary.json", "requests.csv", "steps.csv")


@pytest.mark.parametrize(
    "stem,args",
    [
        ("naive-vs-continuous", ["-n", "60"]),
        ("memory-ceiling", ["-n", "15"]),  # preemptions and rejections
        ("mooncake-long-context", ["--set", "workload.arrival.end=20"]),  # trace replay with prefix hashes
    ],
)
def test_same_seed_same_run_folder(tmp_path: Path, stem: str, args: list[str]) -> None:
    runner = CliRunner()
    outs = []
    for k in range(2):
        out = tmp_path / f"run{k}"
        res = runner.invoke(app, ["run", str(SCENARIOS / f"{stem}.yaml"), "--out", str(out), "-q", *args])
        assert res.exit_code == 0, res.output
        outs.append(out)
    for f in RUN_FILES:
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f


def test_other_seed_other_workload(tmp_path: Path) -> None:
    runs = []
    for seed in (0, 1):
        sc, raw = load_scenario(SCENARIOS / "naive-vs-continuous.yaml", {"workload.num_requests": 30, "seed": seed})
        runs.append(write_scenario_run(run_scenario(sc, raw), tmp_path / f"seed{seed}"))
    assert (runs[0] / "requests.csv").read_bytes() != (runs[1] / "requests.csv").read_bytes()


# ---- JSON Schema ----------------------------------------------------------------------------------------------
def test_schema_command_prints_json_schema() -> None:
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0
    schema = json.loads(res.stdout)
    assert schema == json.loads(json.dumps(json_schema()))
    assert schema["type"] == "object"
    assert "workload" in schema["required"]
    assert {"workload", "deployment", "kv_cache", "policy", "admission", "slos", "variants", "sweep"} <= set(
        schema["properties"]
    )
    assert schema["additionalProperties"] is False
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in FILES:  # what editors check against accepts every shipped file...
        validator.validate(yaml.safe_load(path.read_text()))
    bad = yaml.safe_load((SCENARIOS / "naive-vs-continuous.yaml").read_text())
    bad["deployment"]["bogus"] = 1  # ...and flags an unknown key
    assert not validator.is_valid(bad)


def test_schema_bounds_optional_numbers_as_json_schema_does() -> None:
    """pydantic wrote the bound of an optional number (``Int | None`` with ``ge=0``: admission.max_queue_len, 96
    bounds in all) under its own names, ``ge``/``gt``/``le``/``lt``, which JSON Schema does not know: an editor
    validating against `servesim schema` took ``max_queue_len: -1`` as valid."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    text = json.dumps(schema)
    assert not any(f'"{k}": ' in text for k in ("ge", "gt", "le", "lt")), "a bound JSON Schema does not know"
    validator = jsonschema.Draft202012Validator(schema)
    raw = yaml.safe_load((SCENARIOS / "naive-vs-continuous.yaml").read_text())
    for key, value in (("max_queue_len", 0), ("max_queue_len", -1)):
        raw["admission"] = {key: value}
        assert validator.is_valid(raw) == (value >= 0), (key, value)
    raw.pop("admission")
    for ttft, valid in ((0.5, True), ("200ms", True), (0, False), (-1, False)):  # an SLO's bound: on a number only
        raw["slos"] = {"ttft": ttft}
        assert validator.is_valid(raw) == valid, ttft
    raw.pop("slos")
    for think, valid in ((1.5, True), ({"type": "fixed", "value": 1.5}, True), (-1, False)):  # a bare number of
        raw["workload"]["arrival"] = {"type": "closed_loop", "num_users": 2, "think_time": think}  # seconds too
        assert validator.is_valid(raw) == valid, think


# ---- sweeps ---------------------------------------------------------------------------------------------------
SWEEP = """
name: sweep-test
seed: 3
workload:
  arrival: {type: poisson, rate: 20}
  num_requests: 30
  prompt_len: {type: uniform, min: 50, max: 300}
  output_len: {type: uniform, min: 5, max: 40}
deployment: {model: llama-3.2-1b, gpu: l4, max_model_len: 1024}
slos: {ttft: 0.5}
variants:
  - name: continuous
  - name: chunked
    policy: {type: continuous, enable_chunked_prefill: true, max_num_batched_tokens: 256}
sweep:
  policy.max_num_seqs: [2, 8]
  workload.arrival.rate: [5, 20]
"""


def test_sweep_rows(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "summary.json").read_text())
    expected = [
        f"{v}[max_num_seqs={m},rate={r}]" for m in (2, 8) for r in (5, 20) for v in ("continuous", "chunked")
    ]
    assert list(doc["variants"]) == expected
    rows = doc["scenario"]["sweep_points"]
    assert [r["name"] for r in rows] == expected
    assert {(r["variant"], r["policy.max_num_seqs"], r["workload.arrival.rate"]) for r in rows} == {
        (v, m, r) for m in (2, 8) for r in (5, 20) for v in ("continuous", "chunked")
    }
    for name in expected:
        assert doc["variants"][name]["num_requests"] == 30
    # one row per run in the CSVs too
    with open(out / "requests.csv", newline="") as f:
        variants_in_csv = {row["variant"] for row in csv.DictReader(f)}
    assert variants_in_csv == set(expected)
    # the point's values reached the policy that ran: a cap of 2 keeps batches at 2 or below
    for name in expected:
        if "max_num_seqs=2" in name:
            assert doc["variants"][name]["mean_batch_size"] <= 2


def test_sweep_applies_to_the_default_policy(tmp_path: Path) -> None:
    """A sweep over policy.* works when the file leaves the policy at its default (no policy section)."""
    raw = yaml.safe_load(SWEEP)
    raw["variants"] = [{"name": "continuous"}]
    raw["sweep"] = {"policy.max_num_seqs": [1, 4]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    sc, raw = load_scenario(path)
    run = run_scenario(sc, raw, source=str(path))
    assert list(run.summaries) == ["continuous[max_num_seqs=1]", "continuous[max_num_seqs=4]"]
    assert [r.config["policy"]["max_num_seqs"] for r in run.results] == [1, 4]
    assert [r.config["policy"]["type"] for r in run.results] == ["continuous", "continuous"]
    assert run.summaries["continuous[max_num_seqs=1]"]["mean_batch_size"] <= 1


def test_sweep_changes_only_the_sections_that_have_the_key(tmp_path: Path) -> None:
    """policy.max_num_seqs sweeps the continuous variant; the static variant has no such key and runs unchanged."""
    raw = yaml.safe_load(SWEEP)
    raw["variants"] = [
        {"name": "naive", "policy": {"type": "static", "batch_size": 4}, "kv_cache": {"type": "contiguous"}},
        {"name": "continuous"},
    ]
    raw["sweep"] = {"policy.max_num_seqs": [1, 4]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    sc, raw = load_scenario(path)
    run = run_scenario(sc, raw, source=str(path))
    s = run.summaries
    assert list(s) == ["naive[max_num_seqs=1]", "continuous[max_num_seqs=1]", "naive[max_num_seqs=4]",
                       "continuous[max_num_seqs=4]"]
    same = [json.dumps(s[f"naive[max_num_seqs={m}]"], sort_keys=True) for m in (1, 4)]
    assert same[0] == same[1]
    assert s["continuous[max_num_seqs=1]"]["mean_batch_size"] <= 1 < s["continuous[max_num_seqs=4]"]["mean_batch_size"]


WORKLOAD_VARIANTS = {
    "name": "own-workloads", "seed": 3,
    "workload": {"arrival": {"type": "poisson", "rate": 2}, "num_requests": 50,
                 "prompt_len": {"type": "fixed", "value": 64}, "output_len": {"type": "fixed", "value": 8}},
    "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb"},
    "variants": [{"name": "base"}, {"name": "same"},
                 {"name": "busy", "workload": {"arrival": {"type": "poisson", "rate": 8}}}],
}


def test_a_variant_can_change_the_workload() -> None:
    """A variant's workload keys merge into the default; the variants without any replay the very same requests,
    and one with its own arrival rate runs requests that arrive four times as fast (same seed, same lengths)."""
    from sim.config.scenario import parse_scenario

    runs = {r.name: r for r in run_scenario(parse_scenario(WORKLOAD_VARIANTS)).results}
    arrivals = {n: [q.arrival for q in sorted(r.requests, key=lambda q: q.id)] for n, r in runs.items()}
    assert arrivals["base"] == arrivals["same"]
    assert len(arrivals["busy"]) == 50
    assert arrivals["busy"][-1] == pytest.approx(arrivals["base"][-1] / 4)  # same seed: the gaps scale by the rate
    assert {q.prompt_tokens for q in runs["busy"].requests} == {64}


def test_a_key_of_a_section_a_variant_or_pool_inherits_changes_what_it_inherits() -> None:
    # Before: `--set variants.0.policy.max_num_seqs=16` on a variant running the scenario's policy, and
    # `--set disaggregation.decode.policy.max_num_seqs=16` on a pool running its variant's, were refused as
    # "policy.type: required key is missing": the key alone made a section of its own
    from sim.config.scenario import load_scenario, variant_configs

    lesson = Path(__file__).parent.parent / "scenarios" / "lesson-disaggregation.yaml"
    for key in ("variants.1.disaggregation.decode.policy.max_num_seqs", "disaggregation.decode.policy.max_num_seqs"):
        cfgs = {c.name: c for c in variant_configs(load_scenario(lesson, {key: 16})[0])}
        assert cfgs["2P2D"].disaggregation.decode.policy == {"type": "continuous", "max_num_seqs": 16}, key
        assert cfgs["2P2D"].disaggregation.prefill.policy is None and cfgs["2P2D"].policy.max_num_seqs is None
    cfgs = {c.name: c for c in variant_configs(load_scenario(lesson, {"variants.3.policy.max_num_seqs": 16})[0])}
    assert cfgs["colocated-chunked"].policy.max_num_seqs == 16 and cfgs["colocated-chunked"].policy.\
        enable_chunked_prefill  # its own policy, one key changed
    cfgs = {c.name: c for c in variant_configs(load_scenario(lesson, {"variants.0.policy.max_num_seqs": 16})[0])}
    assert cfgs["colocated"].policy.type == "continuous" and cfgs["colocated"].policy.max_num_seqs == 16
    assert cfgs["2P2D"].policy.max_num_seqs is None  # the others still run the scenario's
    # a pool sized by xpyd alone has no section of its own yet
    xpyd = {"variants": [{"name": "x", "disaggregation": {"xpyd": "2P1D", "kv_link": {"kind": "nvlink"}}}],
            "disaggregation.decode.policy.max_num_seqs": 16}
    (cfg,) = variant_configs(load_scenario(lesson, xpyd)[0])
    assert cfg.disaggregation.decode.replicas == 1
    assert cfg.disaggregation.decode.policy == {"type": "continuous", "max_num_seqs": 16}


def test_a_variants_policy_type_set_keeps_only_the_new_kinds_keys(tmp_path: Path) -> None:
    # --set variants.0.policy.type=static on a variant inheriting {type: continuous, enable_chunked_prefill: true,
    # max_num_batched_tokens: 512} made {type: static} before 50ec329; since, the inherited copy kept the
    # continuous keys and was refused ("enable_chunked_prefill: unknown key ... the kind 'static' not"). A variant's
    # (or pool's) own section retyped by --set keeps the keys its new kind has, as policy.type=static does
    from sim.config.scenario import load_scenario, variant_configs

    base = yaml.safe_load((SCENARIOS / "lesson-disaggregation.yaml").read_text())
    base["policy"] = {"type": "continuous", "enable_chunked_prefill": True, "max_num_batched_tokens": 512}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base))
    for key, name, pool in (("variants.0.policy.type", "colocated", None),
                            ("variants.3.policy.type", "colocated-chunked", None),
                            ("variants.1.disaggregation.decode.policy.type", "2P2D", "decode"),
                            ("disaggregation.decode.policy.type", "2P2D", "decode")):
        cfgs = {c.name: c for c in variant_configs(load_scenario(path, {key: "static"})[0])}
        got = cfgs[name].policy if pool is None else getattr(cfgs[name].disaggregation, pool).policy
        assert (got.type if pool is None else got["type"]) == "static", key
    cfgs = {c.name: c for c in variant_configs(load_scenario(path, {"variants.0.policy.type": "sjf"})[0])}
    assert cfgs["colocated"].policy.max_num_batched_tokens == 512  # the limits both kinds have are kept


def test_a_variants_workload_is_checked_with_its_path(tmp_path: Path) -> None:
    from sim.config.scenario import apply_override, parse_scenario
    from sim.config.schema import ScenarioError

    for keys, message in (({"arival": {"type": "poisson", "rate": 8}}, "variants.0.workload.arival: unknown key; "
                           "did you mean arrival?"),
                          ({"arrival": {"type": "poisson", "rate": -1}}, "variants.0.workload.arrival.rate: must be "
                           "greater than 0")):
        with pytest.raises(ScenarioError, match=message.replace("?", r"\?")):
            parse_scenario({**WORKLOAD_VARIANTS, "variants": [{"name": "x", "workload": keys}]})
    # --set reaches a variant's own section where it has the key; elsewhere the variant inherits the default
    d = json.loads(json.dumps(WORKLOAD_VARIANTS))
    apply_override(d, "workload.arrival.rate", 5)
    assert d["workload"]["arrival"]["rate"] == 5 and d["variants"][2]["workload"]["arrival"]["rate"] == 5
    apply_override(d, "workload.num_requests", 7)
    assert d["workload"]["num_requests"] == 7 and "num_requests" not in d["variants"][2]["workload"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(WORKLOAD_VARIANTS))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), "-n", "20"])
    assert res.exit_code == 0, res.output
    reqs = list(csv.DictReader(open(tmp_path / "out" / "requests.csv")))
    assert {v: sum(r["variant"] == v for r in reqs) for v in ("base", "same", "busy")} == {"base": 20, "same": 20,
                                                                                             "busy": 20}


def test_a_key_under_args_reaches_the_sections_whose_args_give_it(tmp_path: Path) -> None:
    """`--sweep policy.args.age_s=1,50` on a scenario comparing custom policies set age_s in every custom variant,
    and the classes without that argument refused it: a sweep over one policy's argument could not run. A key
    under args now reaches the sections whose args give it; when none does, every custom section, as before."""
    from sim.config.scenario import apply_override

    (tmp_path / "p.py").write_text("import servesim\n\n\nclass Aging(servesim.QueuePolicy):\n"
                                   "    def __init__(self, age_s=5.0, **kwargs):\n        super().__init__(**kwargs)\n"
                                   "        self.age_s = age_s\n\n\nclass Plain(servesim.QueuePolicy):\n    pass\n")
    raw = {**WORKLOAD_VARIANTS, "variants": [
        {"name": "aging", "policy": {"type": "custom", "cls": "p.py:Aging", "args": {"age_s": 5.0}}},
        {"name": "plain", "policy": {"type": "custom", "cls": "p.py:Plain"}},
        {"name": "fcfs", "policy": {"type": "fcfs"}}]}
    d = json.loads(json.dumps(raw))
    apply_override(d, "policy.args.age_s", 1.0)
    assert [v["policy"].get("args") for v in d["variants"]] == [{"age_s": 1.0}, None, None]
    apply_override(d, "policy.args.other", 2)  # given by no section: every custom one takes it
    assert [v["policy"].get("args") for v in d["variants"]] == [{"age_s": 1.0, "other": 2}, {"other": 2}, None]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["sweep", str(path), "--sweep", "policy.args.age_s=1,50", "-n", "5", "-q",
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "sweep.csv").is_file()


def test_set_type_of_a_router_or_rule_keeps_only_the_new_kinds_keys(tmp_path: Path) -> None:
    """Comparing one's own router and admission rule with built-ins by --set: `--set cluster.router.type=round_robin`
    on a custom router failed with "round_robin takes no keys but type (got cls)", and
    `--set admission.rule.type=token_bucket` with "admission.rule.cls: unknown key": only a section's own type
    (policy.type) dropped the old kind's keys, not a type deeper in it."""
    (tmp_path / "g.py").write_text("import servesim\n\n\nclass First(servesim.Router):\n"
                                   "    def route(self, request, replicas):\n        return 0\n\n\n"
                                   "class All(servesim.Admission):\n    def admit(self, request, state):\n"
                                   "        return None\n")
    raw = {**WORKLOAD_VARIANTS, "cluster": {"replicas": 2, "router": {"type": "custom", "cls": "g.py:First"}},
           "admission": {"rule": {"type": "custom", "cls": "g.py:All"}},
           "variants": [{"name": "mine"}, {"name": "own", "cluster": {"replicas": 2, "router": {
               "type": "custom", "cls": "g.py:First", "args": {}}}}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    for sets in (["cluster.router.type=round_robin"], ["cluster.router.type=power_of_two"],
                 ["variants.1.cluster.router.type=least_kv"],
                 ["admission.rule.type=token_bucket", "admission.rule.rate=100", "admission.rule.burst=10"]):
        res = CliRunner().invoke(app, ["run", str(path), "-n", "5", "-q", "--out", str(tmp_path / "out"),
                                       *(a for s in sets for a in ("--set", s))])
        assert res.exit_code == 0, (sets, res.output)
