"""vLLM 0.6's asynchronous output processing: a step's tokens leave the engine when the next step ends
(sim/engines/vllm_v0.py, sim/loop/run.py ``tokens_one_step_late``)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.engines.base import engine_of
from sim.engines.registry import EngineConfig
from sim.loop.run import generate_workload, simulate_variant


def _run(engine: dict | str, output_len: int, **dep):
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 1,
                                     "prompt_len": {"type": "fixed", "value": 1000},
                                     "output_len": {"type": "fixed", "value": output_len}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 2048, "engine": engine,
                          **dep}}
    sc = parse_scenario(raw, "t")
    cfg = variant_configs(sc)[0]
    _, reqs, core = simulate_variant(cfg, generate_workload(sc))
    cols = core.steps.columns()
    start = np.asarray(cols["start"])
    return reqs[0], start, start + np.asarray(cols["duration"])


def test_first_token_leaves_when_the_next_step_ends():
    """One 1,000-token prompt alone on vLLM 0.6 (V0): its first token is sampled at the end of the prompt's step
    and processed under the first decode step's forward, so it reaches the server when that step ends; its last
    token, with no step after it, at once. A one-token request has no next step: its token leaves at once."""
    r, start, end = _run("vllm-v0", 3)
    assert len(end) == 3 and start[1] == end[0]
    assert r.first_token == pytest.approx(end[1]) and r.finish == pytest.approx(end[2])
    r, start, end = _run("vllm-v0", 1)
    assert len(end) == 1 and r.first_token == pytest.approx(end[0]) == pytest.approx(r.finish)


def test_only_where_vllm_06_processes_outputs_asynchronously():
    """vLLM 0.5 had no asynchronous output processing, 0.6 turns it off under enforce_eager (and with pipeline
    stages: verify_async_output_proc); other engines stream a token when its step ends."""
    on = engine_of(EngineConfig(name="vllm-v0")).tokens_one_step_late
    assert on(EngineConfig(name="vllm-v0")) and on(EngineConfig(name="vllm-v0", version="0.6"))
    assert not on(EngineConfig(name="vllm-v0", version="0.5"))
    assert not on(EngineConfig(name="vllm-v0", enforce_eager=True))
    for name in ("vllm-v1", "sglang", "tgi"):
        assert not engine_of(EngineConfig(name=name)).tokens_one_step_late(EngineConfig(name=name))
    for engine, dep in (({"name": "vllm-v0", "version": "0.5"}, {}), ("vllm-v1", {}),
                        ("vllm-v0", {"tensor_parallel_size": 1, "pipeline_parallel_size": 2})):
        r, _, end = _run(engine, 3, **dep)
        assert r.first_token == pytest.approx(end[0])
