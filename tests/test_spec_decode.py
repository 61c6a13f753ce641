"""Speculative decoding in the simulator (sim/serving/spec_decode.py and its hooks in the core).

- exact schedules: every draft accepted (a request of 9 tokens takes 1 + 2 steps with k = 4), none accepted (one
  token a step, the verify step priced as 1 + k tokens per row), ITL one gap per step, TPOT as vLLM defines it;
- drafts never pass the request's last token, the token budget or the free KV blocks;
- acceptance draws: seeded (same seed, same run), their mean acceptance length that of the geometric model;
- memory: a draft model's weights and KV leave fewer target blocks; n-gram none;
- the proposer's time: n-gram adds none, a draft model k passes;
- measured acceptance replayed draft by draft;
- schema and bad input: `servesim schema` lists the keys, a bad section exits 2 with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import parse_scenario, variant_configs
from sim.costs.costmodel import StepShape
from sim.loop.build import build
from sim.loop.run import generate_workload, run_scenario, simulate_variant
from sim.loop.simulator import Simulation
from sim.serving.core import ServingCore
from sim.serving.request import RequestSpec
from sim.serving.spec_decode import (
    GeometricAcceptance,
    RateAcceptor,
    ReplayAcceptor,
    SpecDecoder,
    SpeculativeConfig,
    write_measured,
)


class UnitCost:
    """Every step takes 1 s plus 1 ms per token computed: exact schedules in round numbers."""

    peak_flops = 0.0

    def __init__(self) -> None:
        self.shapes: list[StepShape] = []

    def step_time(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return 1.0 + 1e-3 * int(shape.num_tokens)

    def step_flops(self, shape: StepShape) -> float:
        return 0.0


def scenario(**speculative) -> dict:
    dep: dict = {"model": "tiny", "max_model_len": 64, "block_size": 4, "num_gpu_blocks": 64}
    if speculative:
        dep["speculative"] = speculative
    return {
        "name": "spec", "seed": 1,
        "workload": {"arrival": {"type": "poisson", "rate": 2.0}, "num_requests": 20,
                     "prompt_len": {"type": "uniform", "min": 4, "max": 20},
                     "output_len": {"type": "uniform", "min": 2, "max": 40}},
        "deployment": dep,
        "policy": {"type": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 64},
    }


def one_request(rate: float, k: int = 4, output_len: int = 9):
    cfg = variant_configs(parse_scenario(scenario()))[0]
    policy, kv, _, _ = build(cfg)
    spec = SpecDecoder(k, RateAcceptor([rate] * k, seed=0))
    core = ServingCore(policy, kv, keep_token_times=True, spec=spec, record_plans=True)
    cost = UnitCost()
    sim = Simulation([RequestSpec(0, 0.0, 8, output_len)], [(core, cost)])
    sim.run()
    return sim.requests[0], core, cost, spec


def test_every_draft_accepted_emits_k_plus_1_tokens_a_step():
    r, core, cost, spec = one_request(1.0)
    # prefill (8 tokens) gives token 1; then each step verifies 1 + 4 tokens and emits 5: tokens 2-6, 7-9
    # (the second step drafts only 2: the request has 3 tokens left)
    assert [int(s.num_tokens) for s in cost.shapes] == [8, 5, 3]
    assert [int(s.num_draft_tokens) for s in cost.shapes] == [0, 4, 2]
    assert [int(s.num_decode_seqs) for s in cost.shapes] == [0, 0, 0]  # verifying rows are not one-token rows
    assert r.num_output_tokens == 9 and r.num_computed_tokens == 8 + 8
    t1, t2, t3 = 1.008, 1.008 + 1.005, 1.008 + 1.005 + 1.003
    assert r.token_times == pytest.approx([t1] + [t2] * 5 + [t3] * 3, abs=1e-12)
    gaps, counts = core.itl_gaps()
    assert gaps.tolist() == pytest.approx([1.005, 1.003]) and counts.tolist() == [1, 1]  # one gap per chunk
    assert (spec.stats.num_drafts, spec.stats.num_draft_tokens, spec.stats.num_accepted_tokens) == (2, 6, 6)
    assert spec.stats.num_accepted_tokens_per_pos == [2, 2, 1, 1]
    assert core.kv.num_free_blocks == core.kv.num_blocks


def test_no_draft_accepted_is_one_token_a_step_at_the_verify_price():
    r, core, cost, spec = one_request(0.0)
    assert [int(s.num_tokens) for s in cost.shapes] == [8] + [5] * 4 + [4, 3, 2, 1]  # drafts capped at the end
    assert r.num_output_tokens == 9
    assert spec.stats.num_accepted_tokens == 0 and spec.stats.num_drafts == 7
    steps = core.steps.columns()
    assert steps["decode_tokens"].tolist() == [0, 5, 5, 5, 5, 4, 3, 2, 1]


def test_tpot_and_itl_as_vllm_bench_serve_defines_them(tmp_path: Path):
    sc = parse_scenario(scenario(method="ngram", num_speculative_tokens=3,
                                 acceptance={"type": "geometric", "rate": 0.8}))
    run = run_scenario(sc)
    (s,) = run.summaries.values()
    res = run.results[0]
    done = [r for r in res.requests if r.completed and r.output_tokens > 1]
    tpot = [(r.finish - r.first_token) / (r.output_tokens - 1) for r in done]
    assert s["tpot"]["mean"] == pytest.approx(float(np.mean(tpot)), rel=1e-12)
    # ITL: one gap per step that delivered tokens after the first, not one per token
    gaps = int(res.itl_counts.sum())
    sd = s["spec_decode"]
    assert gaps < sum(r.output_tokens - 1 for r in done)
    assert s["total_output_tokens"] == sum(r.output_tokens for r in res.requests)
    assert sd["num_accepted_tokens"] == sum(sd["num_accepted_tokens_per_pos"])
    assert sd["mean_acceptance_length"] == pytest.approx(1 + sd["num_accepted_tokens"] / sd["num_drafts"])


def test_drafts_respect_the_token_budget_and_the_last_token():
    cfg = variant_configs(parse_scenario(scenario(method="ngram", num_speculative_tokens=8,
                                                  acceptance={"type": "geometric", "rate": 0.5})))[0]
    wl = generate_workload(parse_scenario(scenario()))
    policy, kv, _, _ = build(cfg)
    spec = SpecDecoder(8, RateAcceptor(GeometricAcceptance(rate=0.5).per_position(8), seed=3))
    core = ServingCore(policy, kv, spec=spec)
    cost = UnitCost()
    sim = Simulation(wl.requests, [(core, cost)])
    sim.run()
    assert all(int(s.num_tokens) <= 64 for s in cost.shapes)
    assert all(r.num_output_tokens == r.output_len for r in sim.requests)
    assert core.kv.num_free_blocks == core.kv.num_blocks


def test_same_seed_same_run_and_acceptance_follows_the_model():
    sc = parse_scenario({**scenario(method="ngram", num_speculative_tokens=4,
                                    acceptance={"type": "geometric", "rate": 0.6}),
                         "workload": {**scenario()["workload"], "num_requests": 400,
                                      "output_len": {"type": "fixed", "value": 40}}})
    a, b = run_scenario(sc).summaries, run_scenario(sc).summaries
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    sd = a["spec"]["spec_decode"]
    expected = 1 + 0.6 * (1 - 0.6**4) / 0.4  # 2.18, less the drafts capped at each request's end
    assert sd["num_drafts"] > 5000
    assert abs(sd["mean_acceptance_length"] - expected) < 0.05
    for i, rate in enumerate(sd["per_position_acceptance_rate"]):
        assert abs(rate - 0.6 ** (i + 1)) < 0.03


def test_draft_weights_and_kv_leave_fewer_target_blocks():
    def blocks(**spec) -> int:
        raw = {**scenario(**spec)}
        raw["deployment"] = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192}
        raw["policy"] = {"type": "continuous"}
        if spec:
            raw["deployment"]["speculative"] = spec
        return build(variant_configs(parse_scenario(raw))[0])[3].budget.num_gpu_blocks

    acc = {"type": "geometric", "rate": 0.7}
    base = blocks()
    assert blocks(method="ngram", num_speculative_tokens=4, acceptance=acc) == base
    eagle = blocks(method="eagle", num_speculative_tokens=4, acceptance=acc)
    draft = blocks(method="draft_model", model="llama-3.2-1b", num_speculative_tokens=4, acceptance=acc)
    # Llama-3.2-1B: 2.3 GiB of weights, 32 KiB of KV per token against the 8B's 128 KiB: about a fifth fewer
    assert 0.75 * base < draft < 0.82 * base
    # EAGLE: one layer (4 KiB of KV per token) and a 2h x h projection
    assert 0.95 * base < eagle < base


def test_proposer_time():
    cfg = variant_configs(parse_scenario(scenario(method="draft_model", model="tiny", num_speculative_tokens=4,
                                                  acceptance={"type": "geometric", "rate": 0.7})))[0]
    _, _, cost, _ = build(cfg)
    shape = StepShape(2, 10, 0, 110, 200, num_spec_seqs=2, num_draft_tokens=8, spec_context_tokens=100)
    plain = StepShape(2, 10, 0, 110, 200)
    assert cost.step_time(plain) == cost.target.step_time(plain)
    extra = cost.step_time(shape) - cost.target.step_time(shape)
    assert extra == pytest.approx(cost.draft_time(shape)) and extra > 4 * cfg.deployment.speculative.draft_step_overhead
    ngram = build(variant_configs(parse_scenario(scenario(method="ngram", num_speculative_tokens=4,
                                                          acceptance={"type": "geometric", "rate": 0.7})))[0])[2]
    assert ngram.step_time(shape) == ngram.target.step_time(shape)


def test_measured_acceptance_is_replayed_draft_by_draft(tmp_path: Path):
    acc = ReplayAcceptor({0: [2, 0, 3]})
    spec = SpecDecoder(3, acc)
    cfg = variant_configs(parse_scenario(scenario()))[0]
    policy, kv, _, _ = build(cfg)
    core = ServingCore(policy, kv, spec=spec)
    sim = Simulation([RequestSpec(0, 0.0, 5, 10)], [(core, UnitCost())])
    sim.run()
    # 1 (prefill) + 3 (2 accepted) + 1 + 4 + 1 (the last token: nothing left to draft)
    assert spec.stats.num_drafts == 3 and spec.stats.num_accepted_tokens == 5
    path = tmp_path / "acc.json"
    write_measured(path, {0: [2, 0, 3]})
    raw = scenario(method="ngram", num_speculative_tokens=3, acceptance={"type": "measured", "file": str(path)})
    raw["workload"]["num_requests"] = 1
    raw["workload"]["output_len"] = {"type": "fixed", "value": 10}
    sc = parse_scenario(raw)
    res, reqs, core2 = simulate_variant(variant_configs(sc)[0], generate_workload(sc))
    assert core2.spec is not None and core2.spec.stats.num_accepted_tokens == 5


def test_schema_lists_the_speculative_keys():
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0
    text = res.output
    for key in ("speculative", "num_speculative_tokens", "draft_model", "eagle", "ngram", "per_position"):
        assert key in text, key
    assert SpeculativeConfig.model_json_schema()["properties"]["method"]


@pytest.mark.parametrize("spec,needle", [
    ({"method": "draft_model", "num_speculative_tokens": 4, "acceptance": {"type": "geometric", "rate": 0.7}},
     "needs the draft's model"),
    ({"method": "ngram", "num_speculative_tokens": 0, "acceptance": {"type": "geometric", "rate": 0.7}},
     "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "acceptance": {"type": "per_position", "rates": [0.3, 0.5]}},
     "must not increase"),
    ({"method": "draft_model", "model": "opt-13b", "num_speculative_tokens": 2,
      "acceptance": {"type": "geometric", "rate": 0.5}}, "vocabulary"),
    ({"method": "ngram", "num_speculative_tokens": 2, "acceptance": {"type": "measured", "file": "nope.json"}},
     "not found"),
])
def test_bad_speculative_section_exits_2(tmp_path: Path, spec: dict, needle: str):
    raw = scenario(**spec)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["run", str(path), "-q", "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_report_section_and_openmetrics_export(tmp_path: Path):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from sim.output.benchfiles.export_metrics import openmetrics_text

    raw = scenario()
    raw["variants"] = [{"name": "plain"}, {"name": "ngram", "deployment": {"speculative": {
        "method": "ngram", "num_speculative_tokens": 3, "acceptance": {"type": "geometric", "rate": 0.6}}}}]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(path), "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert "Speculative decoding</h2>" in page and "mean acceptance length" in page
    summary = json.loads((out / "summary.json").read_text())["variants"]
    assert "spec_decode" in summary["ngram"] and "spec_decode" not in summary["plain"]
    sd = summary["ngram"]["spec_decode"]
    # a folder read back (servesim.load) draws the section from the summary's counters
    import servesim

    again = servesim.load(out).report(tmp_path / "again.html").read_text()
    assert "Speculative decoding</h2>" in again
    run = run_scenario(parse_scenario(raw))
    text = openmetrics_text(run.results[1])
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["vllm:spec_decode_num_drafts"].samples[0].value == sd["num_drafts"]
    assert fams["vllm:spec_decode_num_accepted_tokens"].samples[0].value == sd["num_accepted_tokens"]
    per_pos = fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
    assert [s.value for s in per_pos] == sd["num_accepted_tokens_per_pos"]
    assert "vllm:spec_decode_num_drafts" not in openmetrics_text(run.results[0])



def test_report_speedup_is_a_line_per_variant_against_the_swept_load():
    """lesson-speculative-decoding's speed-up panel drew one line through its ten runs by name, so it zigzagged
    between draft-k4 and draft-k4-off-under-load at each load (0.93, 1.03, 0.92, 1.02 at full size) under tick
    labels written over each other (seen rendered in Chromium). Now: a line per variant against num_users; runs
    outside a sweep get a bar each, no line between them."""
    from sim.config.scenario import load_scenario
    from sim.output.report.spec_decode import spec_decode_parts
    from sim.studies.teaching import find_scenario

    sc, raw = load_scenario(find_scenario("lesson-speculative-decoding"), {"workload.num_requests": 24})
    run = run_scenario(sc, raw)
    (_, fig, _), = spec_decode_parts(run.results, run.summaries)
    lines = {t.name: list(t.x) for t in fig.data if t.xaxis == "x2"}
    users = [1, 16, 64, 256, 512]
    assert lines == {"speed-up: draft-k4": users, "speed-up: draft-k4-off-under-load": users}
    assert fig.layout.xaxis2.type == "log" and fig.layout.xaxis2.title.text == "num_users, log scale"

    plain = run_scenario(parse_scenario({**scenario(), "variants": [
        {"name": "plain"}, {"name": "ngram", "deployment": {"speculative": {
            "method": "ngram", "num_speculative_tokens": 3, "acceptance": {"type": "geometric", "rate": 0.6}}}}]}))
    (_, fig, _), = spec_decode_parts(plain.results, plain.summaries)
    assert [(t.type, list(t.x)) for t in fig.data if t.xaxis == "x2"] == [("bar", ["ngram"])]

@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 6), rate=st.floats(0, 1), blocks=st.integers(16, 40),
       mode=st.sampled_from(["recompute", "swap"]), kv=st.sampled_from(["paged", "contiguous"]),
       seed=st.integers(0, 3))
def test_speculation_under_preemption_conserves_requests_and_blocks(k, rate, blocks, mode, kv, seed):
    raw = scenario(method="ngram", num_speculative_tokens=k, acceptance={"type": "geometric", "rate": rate})
    raw["seed"] = seed
    raw["deployment"]["num_gpu_blocks"] = blocks
    raw["kv_cache"] = {"type": kv}
    raw["policy"]["preemption_mode"] = mode
    raw["workload"]["arrival"] = {"type": "all_at_once"}  # contention: the cache fills, requests are preempted
    sc = parse_scenario(raw)
    cfg = variant_configs(sc)[0]
    res, reqs, core = simulate_variant(cfg, generate_workload(sc))
    assert all(r.outcome is not None for r in reqs)
    for r in reqs:
        if r.outcome.value == "completed":
            assert r.num_output_tokens == r.output_len
    assert core.kv.num_free_blocks == core.kv.num_blocks
    steps = res.steps
    assert (steps["prefill_tokens"] + steps["decode_tokens"] <= 64).all()
    assert (steps["batch_size"] <= 8).all()
    sd = res.spec_decode
    assert sd is not None and sd["num_accepted_tokens"] <= sd["num_draft_tokens"] <= k * sd["num_drafts"]


def test_acceptance_file_is_relative_to_the_scenario(tmp_path: Path):
    sub = tmp_path / "sc"
    sub.mkdir()
    (sub / "acc.json").write_text(json.dumps({"num_drafts": 10, "num_accepted_tokens_per_pos": [6, 3]}))
    raw = scenario(method="ngram", num_speculative_tokens=2, acceptance={"type": "measured", "file": "acc.json"})
    (sub / "s.yaml").write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["run", str(sub / "s.yaml"), "-q", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    sd = json.loads((tmp_path / "out" / "summary.json").read_text())["variants"]["spec"]["spec_decode"]
    assert abs(sd["per_position_acceptance_rate"][0] - 0.6) < 0.15  # drawn from the file's 0.6, 0.3


def test_plan_refuses_speculative_decoding(tmp_path: Path):
    raw = scenario(method="ngram", num_speculative_tokens=2, acceptance={"type": "geometric", "rate": 0.5})
    raw["slos"] = {"ttft": 1.0}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 2 and "does not search speculative decoding" in res.output, res.output


def test_disable_by_batch_size_drafts_only_in_smaller_steps():
    cfg = variant_configs(parse_scenario(scenario()))[0]
    policy, kv, _, _ = build(cfg)
    spec = SpecDecoder(2, RateAcceptor([1.0, 1.0], seed=0), disable_by_batch_size=2)
    core = ServingCore(policy, kv, spec=spec)
    cost = UnitCost()
    # two requests together: no drafts while both run; the longer one drafts once alone
    sim = Simulation([RequestSpec(0, 0.0, 4, 3), RequestSpec(1, 0.0, 4, 9)], [(core, cost)])
    sim.run()
    rows = [(int(s.num_seqs), int(s.num_draft_tokens)) for s in cost.shapes]
    assert all(d == 0 for n, d in rows if n >= 2) and any(d > 0 for n, d in rows if n == 1), rows
    assert [r.num_output_tokens for r in sim.requests] == [3, 9]


def test_pipeline_stages_with_speculation_are_refused() -> None:
    raw = scenario(method="ngram", num_speculative_tokens=2, acceptance={"type": "geometric", "rate": 0.5})
    raw["deployment"].update(model="llama-3.1-8b", pipeline_parallel_size=2)
    del raw["deployment"]["num_gpu_blocks"]
    with pytest.raises(ValueError, match="speculative with pipeline_parallel_size > 1 is not modelled"):
        build(variant_configs(parse_scenario(raw))[0])
