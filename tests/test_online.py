"""sim/costs/online.py: the online-serving layer (``deployment.serving``), against hand computations: the client's times
are the engine's plus the front end's, the API server (its request handling and its tokenizer) serves a burst first
come first served, offline runs keep what they computed, vLLM 0.5's host time already holds its API server."""

from __future__ import annotations

import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.online import (
    DETOKENIZE_S_PER_TOKEN,
    REQUEST_HANDLING_S,
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
    assert REQUEST_HANDLING_S == pytest.approx(10.2e-3 - 512 * 2.2e-6)  # vllm#54628 less its tokenization
    assert DETOKENIZE_S_PER_TOKEN == 20e-6


def test_one_request_pays_the_whole_path_on_ttft_and_e2e_not_on_tpot():
    _, _, (off,) = _run()
    _, _, (on,) = _run("online")
    path = TOKENIZE_S_PER_TOKEN * ISL + REQUEST_HANDLING_S + DETOKENIZE_S_PER_TOKEN
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


def test_a_burst_queues_for_the_api_servers_handling_too():
    # the API server handles one request at a time: the k-th of a burst reaches the engine after k handling times
    # and k tokenizations (before, only the tokenizations queued and each request added the handling alone)
    sc = parse_scenario({"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 3,
                                                   "prompt_len": {"type": "fixed", "value": ISL},
                                                   "output_len": {"type": "fixed", "value": OSL}}}, "t")
    fe = Frontend(0.0, TOKENIZE_S_PER_TOKEN, DETOKENIZE_S_PER_TOKEN, request_handling_s=REQUEST_HANDLING_S)
    wl, _ = to_engine(generate_workload(sc), fe)
    each = REQUEST_HANDLING_S + TOKENIZE_S_PER_TOKEN * ISL
    assert [r.arrival for r in wl.requests] == pytest.approx([each, 2 * each, 3 * each], abs=1e-12)
    # end to end, with a handling time long enough that each request finds the engine idle: the k-th's TTFT is k
    # handlings and tokenizations, then one request's engine time, then its detokenization
    _, _, (alone,) = _run()
    _, _, on = _run({"request_handling_s": 1.0}, n=3)
    each = 1.0 + TOKENIZE_S_PER_TOKEN * ISL
    assert [r.first_token - r.arrival for r in on] == \
        pytest.approx([k * each + alone.first_token + DETOKENIZE_S_PER_TOKEN for k in (1, 2, 3)], abs=1e-9)


def test_vllm_05_queues_nothing():
    # vLLM 0.5: its API server shared the engine's process (host time ratio): nothing in front of the engine
    _, _, off = _run(engine={"name": "vllm-v0", "version": "0.5"}, n=4)
    _, _, on = _run("online", engine={"name": "vllm-v0", "version": "0.5"}, n=4)
    assert [b.first_token - a.first_token for a, b in zip(off, on, strict=True)] == \
        pytest.approx([REQUEST_HANDLING_S] * 4, abs=1e-12)
    # a closed loop alike: a user sends as it holds the reply (the 9.1 ms after the finish), the engine sees it then
    loop = {"type": "closed_loop", "num_users": 1, "think_time": {"type": "fixed", "value": 0.0}}
    _, _, on = _run("online", engine={"name": "vllm-v0", "version": "0.5"}, arrival=loop, n=2)
    assert [r.arrival for r in on] == [0.0, on[0].finish]
    assert on[1].first_token - on[1].arrival == pytest.approx(on[0].first_token - on[0].arrival, abs=1e-12)


def test_a_closed_loop_user_sends_after_holding_the_reply_and_queues_at_the_api_server():
    # two users, 1 s of API server handling a request (long enough that each request is alone in the engine, taking
    # one request's engine time F to its first token and E to its finish), 0.25 s think. Before, a user's next
    # request reached the engine at the finish plus think and its send was dated the server's time earlier, so it
    # left the client about 11 ms before the reply it follows arrived there; and its queue was not modelled
    _, _, (alone,) = _run()
    F, E = alone.first_token, alone.finish
    loop = {"type": "closed_loop", "num_users": 2, "think_time": {"type": "fixed", "value": 0.25}}
    _, _, on = _run({"request_handling_s": 1.0}, arrival=loop, n=4)
    e = 1.0 + TOKENIZE_S_PER_TOKEN * ISL  # the API server's time on a request
    d = DETOKENIZE_S_PER_TOKEN  # engine to client
    # t=0: both users send; the server hands request 0 to the engine at e, request 1 at 2e. Request 0's reply
    # reaches user 0 at e + E + d, who sends request 2 0.25 s later; the server is busy with request 1 until 2e,
    # so request 2 reaches the engine at 3e. User 1 holds request 1's reply at 2e + E + d, sends request 3 0.25 s
    # later; the server is done with request 2 at 3e, so request 3 reaches the engine at 4e
    sends = [0.0, 0.0, e + E + d + 0.25, 2 * e + E + d + 0.25]
    at_engine = [e, 2 * e, 3 * e, 4 * e]
    assert [r.spec.session_id for r in on] == [0, 1, 0, 1]
    assert [r.arrival for r in on] == pytest.approx(sends, abs=1e-12)
    assert [r.first_token for r in on] == pytest.approx([t + F + d for t in at_engine], abs=1e-9)
    assert [r.finish for r in on] == pytest.approx([t + E + d for t in at_engine], abs=1e-9)
    # causal: each user's next request leaves after the reply before it reached the user, by the think time
    assert on[2].arrival - on[0].finish == pytest.approx(0.25, abs=1e-12)
    assert on[3].arrival - on[1].finish == pytest.approx(0.25, abs=1e-12)


def test_offline_run_is_unchanged_and_records_no_serving_key():
    # offline results stay byte for byte (tests/test_pinned_outputs.py); the recorded config has no new key
    cfg, _, _ = _run()
    assert "serving" not in cfg.to_dict()["deployment"]
    cfg_on, _, _ = _run("online")
    assert cfg_on.to_dict()["deployment"]["serving"] == {"request_handling_s": None, "request_latency_s": None,
                                                         "tokenize_s_per_token": None, "detokenize_s_per_token": None}


def test_defaults_per_preset_and_overrides():
    cfg, _, _ = _run("online", engine={"name": "vllm-v0", "version": "0.5"})
    fe = frontend(cfg.deployment.serving, cfg.deployment.engine)
    # vLLM 0.5's API server ran in the GPU's process: its host time ratio holds tokenization and detokenization
    assert fe == Frontend(REQUEST_HANDLING_S, 0.0, 0.0, request_handling_s=0.0)
    cfg, _, _ = _run({"tokenize_s_per_token": 1e-6, "request_latency_s": 0.05},
                     engine={"name": "vllm-v0", "version": "0.5"})
    assert frontend(cfg.deployment.serving, cfg.deployment.engine) == Frontend(0.05, 1e-6, 0.0)
    for engine in ("vllm-v1", "sglang", "tensorrt-llm", {"name": "vllm-v0", "version": "0.6"}):
        cfg, _, _ = _run("online", engine=engine)
        assert frontend(cfg.deployment.serving, cfg.deployment.engine) == \
            Frontend(0.0, TOKENIZE_S_PER_TOKEN, DETOKENIZE_S_PER_TOKEN, request_handling_s=REQUEST_HANDLING_S)
    cfg, _, _ = _run({"request_handling_s": 0.002})
    assert frontend(cfg.deployment.serving, cfg.deployment.engine).request_handling_s == 0.002


def test_setting_either_half_of_the_measured_time_leaves_the_other_at_zero():
    # the 9.1 ms is one measurement split by the preset; a scenario that sets one half has stated its own split.
    # A file written before a26202f (request_latency_s = the whole HTTP path) got the queued 9.1 ms on top of it,
    # and vLLM 0.5 with request_handling_s kept its 9.1 ms on the way back: the same time counted twice
    def fe(serving, engine="vllm-v1"):
        cfg, _, _ = _run(serving, engine=engine)
        return frontend(cfg.deployment.serving, cfg.deployment.engine)

    v05 = {"name": "vllm-v0", "version": "0.5"}
    assert fe({"request_latency_s": 0.02}) == \
        Frontend(0.02, TOKENIZE_S_PER_TOKEN, DETOKENIZE_S_PER_TOKEN, request_handling_s=0.0)
    assert fe({"request_handling_s": 0.02}, v05) == Frontend(0.0, 0.0, 0.0, request_handling_s=0.02)
    assert fe({"request_handling_s": 0.01, "request_latency_s": 0.02}, v05) == \
        Frontend(0.02, 0.0, 0.0, request_handling_s=0.01)
    # an old file's whole path is paid once: one request's TTFT grows by it (and the tokenizer's), not by 9.1 ms more
    _, _, (off,) = _run()
    _, _, (on,) = _run({"request_latency_s": 0.02})
    assert on.first_token - on.arrival == pytest.approx(
        off.first_token - off.arrival + 0.02 + TOKENIZE_S_PER_TOKEN * ISL + DETOKENIZE_S_PER_TOKEN, abs=1e-12)


def test_calibrates_live_fit_writes_both_halves():
    # so a fit file means the same under the rule above, whatever the preset's split
    from calibration.bench_fit import profile_family

    serving = profile_family("p.json").deployment({"scale": 1.0, "step_overhead": 0.0, "request_latency_s": 0.004})
    assert serving["serving"]["request_latency_s"] == 0.004 and serving["serving"]["request_handling_s"] == 0.0


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


def test_a_closed_loop_s_sends_are_written_and_read_back(tmp_path):
    # the client's send times, not the engine's, are the arrivals written (once dated before the engine's time 0,
    # which requests.csv wrote as empty cells and read back as -1 s); the users send at 0 and the API server spreads
    # their first requests out
    import servesim
    from sim.output.run_folder import read_requests

    loop = {"type": "closed_loop", "num_users": 2, "think_time": {"type": "fixed", "value": 0.0}}
    raw = {"name": "t", "seed": 1,
           "workload": {"arrival": loop, "num_requests": 4, "prompt_len": {"type": "fixed", "value": ISL},
                        "output_len": {"type": "fixed", "value": OSL}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "serving": "online"}}
    res = servesim.run(raw)
    reqs = sorted(res.results[0].requests, key=lambda r: r.id)
    path = REQUEST_HANDLING_S + TOKENIZE_S_PER_TOKEN * ISL
    assert [r.arrival for r in reqs[:2]] == [0.0, 0.0]
    assert reqs[1].first_token - reqs[0].first_token > path - 1e-9  # the second waited for the first's handling
    folder = res.write(tmp_path / "run")
    (back,) = read_requests(folder).values()
    assert [r.arrival for r in back] == [r.arrival for r in reqs]
    assert [r.first_token - r.arrival for r in back] == pytest.approx([r.first_token - r.arrival for r in reqs])
    pytest.importorskip("pyarrow")
    from sim.output.parquet_out import read_requests_parquet, write_requests_parquet

    with open(tmp_path / "requests.parquet", "wb") as f:
        write_requests_parquet(f, list(res.results))
    (back,) = read_requests_parquet(tmp_path / "requests.parquet").values()
    assert [r.arrival for r in back] == [r.arrival for r in reqs]
    assert res.requests["arrival_s"] == [r.arrival for r in reqs]  # the Python API's columns alike


def test_plan_refuses_an_online_scenario(tmp_path):
    # the planner simulates every candidate as replicas behind a router, which deployment.serving refuses: each
    # candidate was pruned as if it did not fit in memory and the plan said no deployment meets the SLOs (exit 0)
    import yaml
    from typer.testing import CliRunner

    from sim.cli.main import app

    raw = {"name": "t", "seed": 0,
           "workload": {"arrival": {"type": "poisson", "rate": 2.0}, "num_requests": 20,
                        "prompt_len": {"type": "fixed", "value": 100}, "output_len": {"type": "fixed", "value": 10}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "serving": "online"},
           "slos": {"ttft": 1.0}, "plan": {"gpus": ["h100-sxm"], "tensor_parallel_sizes": [1], "max_gpus": 2}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 2, res.output
    assert "plan: deployment.serving" in res.output and "Traceback" not in res.output
