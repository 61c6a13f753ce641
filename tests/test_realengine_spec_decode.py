"""Speculative decoding on the real engine (realengine/spec_decode.py), CPU, one thread, the tiny model.

- the draft is tiny's first layer: its greedy drafts are accepted for real (a good share, not 0 and not all);
- greedy speculative decoding emits exactly the tokens plain greedy decoding emits;
- parity: the simulator, fed the engine's measured step durations and its measured acceptance (replayed draft by
  draft), reproduces the engine's schedule step by step, under recompute and swap preemption;
- `servesim engine run` writes the measured counters, which `servesim run` then reads as its acceptance;
- a draft the engine cannot run is refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from realengine.engine import engine_config, run_engine  # noqa: E402 - after the torch skip
from sim.config.scenario import parse_scenario, variant_configs  # noqa: E402 - after the torch skip
from sim.hardware.models import ModelSpec  # noqa: E402 - after the torch skip
from sim.loop.build import build  # noqa: E402 - after the torch skip
from sim.loop.replay import MeasuredDurations  # noqa: E402 - after the torch skip
from sim.loop.run import generate_workload  # noqa: E402 - after the torch skip
from sim.loop.simulator import Simulation  # noqa: E402 - after the torch skip
from sim.serving.core import ServingCore  # noqa: E402 - after the torch skip
from sim.serving.spec_decode import (  # noqa: E402 - after the torch skip
    MeasuredAcceptance,
    ReplayAcceptor,
    SpecDecoder,
    SpeculativeConfig,
    build_acceptor,
    summarize_spec,
    write_measured,
)

torch.set_num_threads(1)

NUM_BLOCKS = 40
K = 3


def draft_model(layers: int = 1) -> dict:
    cfg = ModelSpec.from_name("tiny").to_hf_config()
    cfg["num_hidden_layers"] = layers
    return cfg


def scenario(speculative: bool, mode: str = "recompute") -> dict:
    dep: dict = {"model": "tiny", "max_model_len": 96, "block_size": 4}
    if speculative:
        dep["speculative"] = {"method": "draft_model", "model": draft_model(), "num_speculative_tokens": K,
                              "acceptance": {"type": "geometric", "rate": 0.5}}  # the engine measures its own
    return {
        "name": "engine-spec", "seed": 5,
        "workload": {"arrival": {"type": "poisson", "rate": 40.0}, "num_requests": 12,
                     "prompt_len": {"type": "uniform", "min": 4, "max": 24},
                     "output_len": {"type": "uniform", "min": 8, "max": 48}},
        "deployment": dep,
        "policy": {"type": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 96, "preemption_mode": mode},
    }


def engine_run(speculative: bool, mode: str = "recompute"):
    sc = parse_scenario(scenario(speculative, mode))
    cfg = variant_configs(sc)[0]
    wl = generate_workload(sc)
    outputs: dict[int, list[int]] = {}
    runners = []

    def capture(runner) -> None:
        runners.append(runner)
        release = runner.release

        def keep(rid: int) -> None:
            if rid in runner.live_requests:
                outputs[rid] = runner.tokens(rid)
            release(rid)

        runner.release = keep

    result, requests, core = run_engine(cfg, wl, num_gpu_blocks=NUM_BLOCKS, time_scale=0.05, record_plans=True,
                                        on_runner=capture)
    return cfg, result, requests, core, outputs, runners[0]


@pytest.fixture(scope="module")
def runs():
    return engine_run(False), engine_run(True)


@pytest.fixture(scope="module")
def swap_run():
    return engine_run(True, "swap")


def test_drafts_are_accepted_for_real_and_change_no_token(runs):
    (_, plain, _, _, out_plain, _), (_, spec, reqs, core, out_spec, runner) = runs
    assert all(r.outcome is not None and r.outcome.value == "completed" for r in reqs)
    s = summarize_spec(spec.spec_decode, float(np.sum(spec.steps["duration"])))
    # tiny's first layer agrees with the whole model on about 40% of greedy tokens
    assert s["num_drafts"] > 50
    assert 0.15 < s["draft_acceptance_rate"] < 0.8, s
    assert s["num_accepted_tokens"] == sum(map(sum, runner.measured.values()))
    assert s["per_position_acceptance_rate"] == sorted(s["per_position_acceptance_rate"], reverse=True)
    assert 0 < s["draft_time_share"] < 1
    # greedy speculative decoding is lossless: the very tokens of plain greedy decoding
    assert out_spec.keys() == out_plain.keys() and len(out_spec) == 12
    assert out_spec == out_plain
    # fewer steps for the same tokens
    assert len(spec.steps["duration"]) < len(plain.steps["duration"])
    assert core.kv.num_free_blocks == core.kv.num_blocks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parity_simulator_fed_the_engine_times_and_acceptance(runs, swap_run, tmp_path: Path, mode: str):
    cfg, result, requests, core, outputs, runner = runs[1] if mode == "recompute" else swap_run
    assert core.stats.num_preemptions > 0  # the small cache preempts requests with drafts in flight
    if mode == "swap":
        assert core.stats.num_swaps > 0
        assert outputs == runs[0][4]  # lossless across swaps too
    policy, kv, _, _ = build(engine_config(cfg, num_gpu_blocks=NUM_BLOCKS))
    # the engine's measured acceptance, through the file a scenario's acceptance: {type: measured} reads
    path = tmp_path / "acceptance.json"
    write_measured(path, runner.measured)
    acceptor = build_acceptor(SpeculativeConfig(method="ngram", num_speculative_tokens=K,
                                                acceptance=MeasuredAcceptance(file=str(path))))
    assert isinstance(acceptor, ReplayAcceptor)
    spec = SpecDecoder(K, acceptor)
    sim_core = ServingCore(policy, kv, fast_path=False, record_plans=True, spec=spec)
    cost = MeasuredDurations(result.steps["duration"])
    specs = [dataclasses.replace(r.spec, arrival=r.arrival) for r in requests]
    sim = Simulation(specs, [(sim_core, cost)], fast_forward=False)
    sim.run()
    assert cost.used == len(cost.durations)
    assert sim_core.plans == core.plans
    assert sim_core.stats == core.stats
    assert spec.stats == core.spec.stats
    a, b = sim_core.steps.columns(), core.steps.columns()
    for col in ("batch_size", "prefill_tokens", "decode_tokens", "kv_blocks_used", "kv_tokens", "num_running",
                "num_waiting", "num_swapped", "num_preempted", "swap_blocks"):
        assert np.array_equal(a[col], b[col]), col
    assert np.allclose(a["start"], b["start"], rtol=0, atol=1e-9)
    eng = {r.id: r for r in requests}
    for r in sim.requests:
        e = eng[r.id]
        assert (r.num_output_tokens, r.outcome) == (e.num_output_tokens, e.outcome)
        assert abs(r.first_token - e.first_token) < 1e-9 and abs(r.finish - e.finish) < 1e-9


def test_engine_refuses_a_draft_it_cannot_run():
    raw = scenario(True)
    raw["deployment"]["speculative"] = {"method": "ngram", "num_speculative_tokens": 2,
                                        "acceptance": {"type": "geometric", "rate": 0.5}}
    sc = parse_scenario(raw)
    with pytest.raises(ValueError, match="draft_model"):
        run_engine(variant_configs(sc)[0], generate_workload(sc), num_gpu_blocks=NUM_BLOCKS)


def test_cli_engine_run_then_simulate_with_its_measured_acceptance(tmp_path: Path):
    import yaml
    from typer.testing import CliRunner

    from sim.cli.main import app

    raw = scenario(True)
    raw["workload"]["num_requests"] = 6
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    eng = tmp_path / "engine"
    res = CliRunner().invoke(app, ["engine", "run", str(path), "--num-gpu-blocks", str(NUM_BLOCKS), "-o", str(eng)])
    assert res.exit_code == 0, res.output
    measured = json.loads((eng / "summary.json").read_text())["variants"]["engine-spec"]["spec_decode"]
    assert measured["num_accepted_tokens"] > 0
    # the simulator takes the engine's per-position acceptance from its summary.json
    raw["deployment"]["speculative"]["acceptance"] = {"type": "measured", "file": str(eng / "summary.json")}
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["run", str(path), "-q", "-o", str(tmp_path / "sim")])
    assert res.exit_code == 0, res.output
    sim_sd = json.loads((tmp_path / "sim" / "summary.json").read_text())["variants"]["engine-spec"]["spec_decode"]
    assert sim_sd["num_drafts"] > 0
    # a draft the engine cannot run: exit 2, one line, before anything runs
    raw["deployment"]["speculative"]["model"] = draft_model(2)  # as deep as the target: not a draft
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["engine", "run", str(path), "--num-gpu-blocks", str(NUM_BLOCKS),
                                   "-o", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "first layers" in res.output and "Traceback" not in res.output
