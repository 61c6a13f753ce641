"""sim/costs/online.py: the online-serving layer (``deployment.serving``), against hand computations: the client's times
are the engine's plus the front end's, the tokenizer serves a burst first come first served, offline runs keep
what they computed, vLLM 0.5's host time already holds its API server."""

from __future__ import annotations

import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.online import (
    DETOKENIZE_S_PER_TOKEN,
    REQUEST_LATENCY_S,
    TOKENIZE_S_PER_TOKEN,
    Frontend,
    frontend,
    to_engine,
)
from sim.loop.run import generate_workload, simulate_variant

ISL, OSL = 1000, 20


def _run(serving=None, engine="vllm-v1", arrival=None, n=1, **extra):
    dep = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": engine, "max_model_len": 4096, **extra}
    if serving is not None:
        dep["serving"] = serving
    raw = {"name": "t", "seed": 1,
           "workload": {"arrival": arrival or {"type": "all_at_once"}, "num_requests": n,
                        "prompt_len": {"type": "fixed", "value": ISL},
                        "output_len": {"type": "fixed", "value": OSL}},
           "deployment": dep}
    sc = parse_scenario(raw, "t")
    cfg = variant_configs(sc)[0]
    result, reqs, _ = simulate_variant(cfg, generate_workload(sc), keep_token_times=True)
    return cfg, result, sorted(reqs, key=lambda r: r.id)


def test_constants_from_their_sources():
    assert TOKENIZE_S_PER_TOKEN == pytest.approx(2.2e-6)  # 220 ms for 100k tokens
    assert REQUEST_LATENCY_S == pytest.approx(10.2e-3 - 512 * 2.2e-6)  # vllm#54628 less its tokenization
    assert DETOKENIZE_S_PER_TOKEN == 20e-6


def test_one_request_pays_the_whole_path_on_ttft_and_e2e_not_on_tpot():
    _, _, (off,) = _run()
    _, _, (on,) = _run("online")
    path = TOKENIZE_S_PER_TOKEN * ISL + REQUEST_LATENCY_S + DETOKENIZE_S_PER_TOKEN
    assert on.arrival == off.arrival == 0.0
    assert on.first_token - on.arrival == pytest.approx(off.first_token - off.arrival + path, abs=1e-12)
    assert on.finish - on.arrival == pytest.approx(off.finish - off.arrival + path, abs=1e-12)
    # TPOT and ITL are differences of token times: unchanged
    assert on.finish - on.first_token == pytest.approx(off.finish - off.first_token, abs=1e-12)
    assert on.token_times is not None and off.token_times is not None
    gaps = [b - a for a, b in zip(on.token_times, on.token_times[1:], strict=False)]
    assert gaps == pytest.approx([b - a for a, b in zip(off.token_times, off.token_times[1:], strict=False)])


def test_a_burst_is_tokenized_first_come_first_served():
    cfg, _, _ = _run("online", n=4)
    sc = parse_scenario({"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 4,
                                                   "prompt_len": {"type": "fixed", "value": ISL},
                                                   "output_len": {"type": "fixed", "value": OSL}}}, "t")
    wl, sends = to_engine(generate_workload(sc), Frontend(0.0, 1e-3, 0.0))
    assert sends == [0.0] * 4
    assert [r.arrival for r in wl.requests] == pytest.approx([1.0, 2.0, 3.0, 4.0])  # 1000 tokens x 1 ms each
    assert [r.id for r in wl.requests] == [0, 1, 2, 3]


def test_offline_run_is_unchanged_and_records_no_serving_key():
    # offline results stay byte for byte (tests/test_pinned_outputs.py); the recorded config has no new key
    cfg, _, _ = _run()
    assert "serving" not in cfg.to_dict()["deployment"]
    cfg_on, _, _ = _run("online")
    assert cfg_on.to_dict()["deployment"]["serving"] == {"request_latency_s": None, "tokenize_s_per_token": None,
                                                         "detokenize_s_per_token": None}


def test_defaults_per_preset_and_overrides():
    cfg, _, _ = _run("online", engine={"name": "vllm-v0", "version": "0.5"})
    fe = frontend(cfg.deployment.serving, cfg.deployment.engine)
    # vLLM 0.5's API server ran in the GPU's process: its host time ratio holds tokenization and detokenization
    assert fe == Frontend(REQUEST_LATENCY_S, 0.0, 0.0)
    cfg, _, _ = _run({"tokenize_s_per_token": 1e-6, "request_latency_s": 0.05},
                     engine={"name": "vllm-v0", "version": "0.5"})
    assert frontend(cfg.deployment.serving, cfg.deployment.engine) == Frontend(0.05, 1e-6, 0.0)
    for engine in ("vllm-v1", "sglang", "tensorrt-llm", {"name": "vllm-v0", "version": "0.6"}):
        cfg, _, _ = _run("online", engine=engine)
        assert frontend(cfg.deployment.serving, cfg.deployment.engine) == \
            Frontend(REQUEST_LATENCY_S, TOKENIZE_S_PER_TOKEN, DETOKENIZE_S_PER_TOKEN)


@pytest.mark.parametrize("serving, msg", [("offline", "give 'online' or its keys"),
                                          ({"request_latency": 1}, "unknown key; did you mean request_latency_s"),
                                          ({"request_latency_s": -1}, "greater than or equal to 0")])
def test_bad_serving_says_why(serving, msg):
    with pytest.raises(ScenarioError, match=msg):
        _run(serving)


def test_cluster_behind_one_front_end_is_refused():
    dep = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "serving": "online"}
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 2,
                                     "prompt_len": {"type": "fixed", "value": 10},
                                     "output_len": {"type": "fixed", "value": 2}},
           "deployment": dep, "cluster": {"replicas": 2}}
    sc = parse_scenario(raw, "t")
    with pytest.raises(ScenarioError, match="not modelled yet"):
        simulate_variant(variant_configs(sc)[0], generate_workload(sc))
