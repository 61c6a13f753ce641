"""Disaggregated prefill/decode on the real engine (realengine/disagg.py), tiny model, CPU, one thread:

- the KV really moves: each request's staged bytes are its prompt's K and V; the decode replica's first token is
  the one the prefill replica sampled, and every output equals a colocated engine replica's (float64, greedy);
  without the copy the outputs differ;
- parity: the simulator's DisaggSimulation, fed the engine's measured step durations per replica and its
  measured transfer times, reproduces the engine's schedule on every replica, the routing and the transfers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import realengine.disagg as rd  # noqa: E402 - after the torch skip
from realengine.disagg import run_disagg_engine  # noqa: E402 - after the torch skip
from realengine.engine import engine_config  # noqa: E402 - after the torch skip
from realengine.kv_cache import kv_bytes_per_block  # noqa: E402 - after the torch skip
from realengine.model import LlamaModel  # noqa: E402 - after the torch skip
from realengine.runner import ModelRunner  # noqa: E402 - after the torch skip
from sim.config.scenario import parse_scenario, variant_configs  # noqa: E402 - after the torch skip
from sim.loop.build import build  # noqa: E402 - after the torch skip
from sim.loop.disagg.kv_transfer import KVLink  # noqa: E402 - after the torch skip
from sim.loop.disagg.pools import DisaggSimulation, check_disaggregation  # noqa: E402 - after the torch skip
from sim.loop.replay import MeasuredDurations  # noqa: E402 - after the torch skip
from sim.loop.run import generate_workload  # noqa: E402 - after the torch skip
from sim.loop.simulator import Simulation  # noqa: E402 - after the torch skip
from sim.serving.core import ServingCore  # noqa: E402 - after the torch skip

torch.set_num_threads(1)


def scenario(num_requests: int = 16, rate: float = 400.0, prefill: int = 1, decode: int = 2) -> dict:
    return {
        "name": "engine-disagg", "seed": 5,
        "workload": {"arrival": {"type": "poisson", "rate": rate}, "num_requests": num_requests,
                     "prompt_len": {"type": "uniform", "low": 3, "high": 40},
                     "output_len": {"type": "uniform", "low": 2, "high": 12}},
        "deployment": {"model": "tiny", "max_model_len": 64, "block_size": 4, "num_gpu_blocks": 40},
        "policy": {"type": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 64},
        "variants": [{"name": f"{prefill}P{decode}D", "disaggregation": {
            "prefill": {"replicas": prefill},
            # a small decode cache: 24 blocks of 4 tokens, so admissions wait for KV
            "decode": {"replicas": decode, "deployment": {"num_gpu_blocks": 24}},
            "kv_link": {"kind": "pcie"}}}],
    }


def setup(**kw):
    sc = parse_scenario(scenario(**kw))
    cfg = variant_configs(sc)[0]
    return cfg, generate_workload(sc)


CFG, WL = setup()
MODEL = LlamaModel(build(CFG)[3].model, seed=0, dtype="float64")
RUN = run_disagg_engine(CFG, WL, model=MODEL)


def colocated_tokens(cfg, wl, model) -> dict[int, list[int]]:
    """Every request's tokens served by one colocated engine replica (the variant's own deployment)."""
    policy, kv, _, built = build(engine_config(dataclasses.replace(cfg, disaggregation=None), dtype=model.dtype))
    runner = ModelRunner(built.model, block_manager=kv, model=model)
    core = ServingCore(policy, kv, fast_path=False)
    out: dict[int, list[int]] = {}
    core.finish_listeners.append(lambda r: out.__setitem__(r.id, runner.tokens(r.id)))
    core.finish_listeners.append(lambda r: runner.release(r.id))
    from realengine.executor import EngineExecutor

    sim = Simulation(list(wl.requests), [(core, EngineExecutor(runner))], fast_forward=False)
    with torch.inference_mode():
        sim.run()
    return out


def test_every_request_is_served_by_both_pools() -> None:
    sim = RUN.sim
    assert len(RUN.result.requests) == 16
    assert all(r.outcome == "completed" and r.output_tokens == r.target_output_tokens for r in RUN.result.requests)
    served = {rep.index: len(rep.core.done) for rep in sim.replicas}
    assert served[0] == 16 and served[1] > 0 and served[2] > 0 and served[1] + served[2] == 16
    for rep in sim.replicas:  # every block back, nothing left in the runners
        assert rep.core.kv.num_free_blocks == rep.core.kv.num_blocks
        assert rep.executor.runner.live_requests == set()
    assert RUN.decode_runners[0].staged == {}  # every staged KV was taken by a decode replica
    # the small decode caches made some requests wait for KV after their transfer
    d = RUN.result.disaggregation
    assert d is not None and (d["decode_admitted"] - d["transfer_end"]).max() > 0


def test_the_kv_is_really_copied() -> None:
    per_token = kv_bytes_per_block(MODEL.spec, MODEL.dtype, 1)  # 2 x 2 layers x 2 heads x 16 dims x 8 bytes
    assert per_token == 1024
    for r in WL.requests:
        assert RUN.staged_bytes[r.id] == r.prompt_len * per_token
        assert RUN.transfer_seconds[r.id] > 0
    firsts = {k: v for dr in RUN.decode_runners for k, v in dr.first_tokens.items()}
    expected = {k: v for dr in RUN.decode_runners for k, v in dr.expected_first.items()}
    assert len(firsts) == 16 and firsts == expected  # the decode replica samples the prefill's token again
    # the outputs are a colocated replica's, token for token
    assert RUN.tokens == colocated_tokens(CFG, WL, MODEL)


def test_without_the_copy_the_output_changes(monkeypatch) -> None:
    monkeypatch.setattr(rd, "import_kv", lambda runner, table, staged: None)
    broken = run_disagg_engine(CFG, WL, model=MODEL)
    assert broken.tokens != RUN.tokens


def test_parity_simulator_fed_the_measured_times_reproduces_the_schedule() -> None:
    d = CFG.disaggregation
    pools = check_disaggregation(CFG)
    eng = RUN.sim
    cores, replays = {}, []
    for role in ("prefill", "decode"):
        cores[role] = []
        for rep in (eng.prefill_replicas if role == "prefill" else eng.decode_replicas):
            policy, kv, _, _ = build(engine_config(pools[role][0], dtype=MODEL.dtype))
            replay = MeasuredDurations(rep.core.steps.columns()["duration"])
            replays.append(replay)
            cores[role].append((ServingCore(policy, kv, fast_path=False, record_plans=True), replay))
    links = [KVLink(d.kv_link.bandwidth, d.kv_link.latency, 1)]
    twin = DisaggSimulation(list(WL.requests), cores["prefill"], cores["decode"], links=links,
                            kv_bytes_per_token=eng.kv_bytes_per_token, prefill_router=d.prefill.router,
                            decode_router=d.decode.router, kv_mover=lambda p: RUN.transfer_seconds[p.id])
    twin.run()
    assert all(r.used == len(r.durations) for r in replays)
    for a, b in zip(eng.replicas, twin.replicas, strict=True):
        assert a.core.plans == b.core.plans and a.core.stats == b.core.stats
        ca, cb = a.core.steps.columns(), b.core.steps.columns()
        for col in ("batch_size", "prefill_tokens", "decode_tokens", "kv_blocks_used", "kv_tokens", "num_waiting"):
            assert np.array_equal(ca[col], cb[col]), col
        assert np.allclose(ca["start"], cb["start"], rtol=0, atol=1e-9)
    for i, t in eng.transfers.items():
        u = twin.transfers[i]
        assert abs(t.start - u.start) < 1e-9 and abs(t.end - u.end) < 1e-9
    mine = {r.id: r for r in twin.merged()}
    for r in eng.merged():
        m = mine[r.id]
        assert m.replica == r.replica
        assert abs(m.first_token - r.first_token) < 1e-9 and abs(m.finish - r.finish) < 1e-9


def test_engine_run_command_serves_a_disaggregated_variant(tmp_path) -> None:
    import json

    import yaml
    from typer.testing import CliRunner

    from sim.cli.main import app

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario(num_requests=6)))
    res = CliRunner().invoke(app, ["engine", "run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "out" / "summary.json").read_text())["variants"]["1P2D"]
    assert s["num_completed"] == 6 and s["disaggregation"]["num_transfers"] == 6
    # float32 KV of the tiny model: 512 bytes per token
    assert s["disaggregation"]["bytes_moved"] == s["total_input_tokens"] * 512
    # the table's row said "KV moved (GiB) 0.00" for these few hundred KB, as if nothing had moved; the report too
    from sim.output.table import ratio_text

    moved = ratio_text(s["disaggregation"]["bytes_moved"] / 2**30)  # three significant digits: 0.0000672
    assert moved.startswith("0.0000")
    assert [line.split()[-1] for line in res.output.splitlines() if line.startswith("KV moved (GiB)")] == [moved]
    assert f"<td>{moved}</td>" in (tmp_path / "out" / "report.html").read_text()
    res = CliRunner().invoke(app, ["engine", "run", str(path), "--out", str(tmp_path / "o2"), "--quant", "int8"])
    assert res.exit_code == 2 and "unquantized" in res.output


def test_a_policy_drawing_in_its_constructor_draws_what_it_draws_in_the_simulator(tmp_path, monkeypatch) -> None:
    """The engine's disaggregated run built each pool's policy once more than the simulator's (to size the
    pool, after engine_config), without putting the draws back: a policy salting its ties with random.random()
    in its constructor got other salts on the engine than in the simulator, replica by replica."""
    import sim.loop.disagg.pools as pools_module
    from realengine.engine import run_engine
    from sim.loop.run import simulate_variant

    (tmp_path / "salted.py").write_text(
        "import random\n\nimport servesim\n\n\nclass Salted(servesim.QueuePolicy):\n"
        "    def __init__(self):\n        self.salt = random.random()\n\n"
        "    def rank(self, req):\n        return (random.random() + self.salt, req.id)\n")
    raw = scenario(num_requests=4)
    raw["policy"] = {"type": "custom", "cls": f"{tmp_path / 'salted.py'}:Salted", "max_num_seqs": 8,
                     "max_num_batched_tokens": 64}
    sc = parse_scenario(raw)
    cfg, wl = variant_configs(sc)[0], generate_workload(sc)
    seen = []
    real = pools_module.disagg_result

    def keep(name, sim, *args, **kwargs):
        seen.append([rep.core.policy for rep in sim.replicas])
        return real(name, sim, *args, **kwargs)

    monkeypatch.setattr(pools_module, "disagg_result", keep)
    monkeypatch.setattr(rd, "disagg_result", keep)
    simulate_variant(cfg, wl)
    run_engine(cfg, wl, dtype="float64")

    def salts(policies):
        return [getattr(p, "salt", None) or getattr(getattr(p, "user", None), "salt", None) for p in policies]

    sim_salts, engine_salts = (salts(p) for p in seen)
    assert None not in sim_salts and len(set(sim_salts)) == 3
    assert engine_salts == sim_salts


def test_the_run_records_the_decode_pools_slots_as_the_simulator_does() -> None:
    """A decode pool with a policy of its own (2 slots a replica, the variant's 8): the engine's result recorded
    the variant's policy, so its verdict and its report's batch-slot chart read max_num_seqs 8, the simulator's
    2."""
    from realengine.engine import run_engine
    from sim.loop.run import simulate_variant
    from sim.metrics.summary import summarize

    raw = scenario(num_requests=6)
    raw["variants"][0]["disaggregation"]["decode"]["policy"] = {"type": "continuous", "max_num_seqs": 2}
    sc = parse_scenario(raw)
    cfg, wl = variant_configs(sc)[0], generate_workload(sc)
    simulated, real = simulate_variant(cfg, wl)[0], run_engine(cfg, wl, dtype="float64")[0]
    assert real.config["policy"] == simulated.config["policy"]
    assert summarize(real)["limits"]["slot_cap"] == summarize(simulated)["limits"]["slot_cap"] == 2
