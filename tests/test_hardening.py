"""Issue 16: bad input never runs silently wrong, never crashes, never hangs. One test per case the fuzz campaign
found: each must end with exit 2 and one message naming the field (or, for valid input, run with finite results)."""

from __future__ import annotations

import copy
import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import load_scenario, parse_scenario
from sim.loop.run import prepare_scenario, run_scenario

BASE: dict[str, Any] = {
    "name": "h",
    "seed": 1,
    "workload": {
        "arrival": {"type": "poisson", "rate": 20.0},
        "num_requests": 6,
        "prompt_len": {"type": "uniform", "low": 16, "high": 64},
        "output_len": {"type": "fixed", "value": 4},
    },
    "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024},
}
GPU = {"name": "g", "memory_bytes": 24 * 2**30, "mem_bandwidth": 3e11, "peak_flops": {"bf16": 1.2e14},
       "pcie_bandwidth": 2.5e10}
TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 2048}


def w(path: str, value: Any, base: dict | None = None) -> dict:
    """``base`` (BASE by default) with a dotted path set, creating levels."""
    d = copy.deepcopy(base if base is not None else BASE)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[keys[-1]] = value
    return d


def invoke(tmp_path: Path, scenario: Any = None, *, text: str | None = None, args: tuple[str, ...] = ()):
    path = tmp_path / "s.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(scenario, sort_keys=False))
    out = tmp_path / "out"
    return CliRunner().invoke(app, ["run", str(path), "--out", str(out), "-q", *args]), out


def assert_refused(result, out: Path, *needles: str) -> str:
    """Exit 2, one ``error:`` line holding every needle, no traceback, no run folder."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in result.output and result.stdout == ""
    for n in needles:
        assert n in err, (n, err)
    assert not out.exists()
    return err


def assert_ran(result, out: Path) -> dict:
    """Exit 0, nothing on stderr but the one description line, and every number in summary.json finite."""
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.stderr, result.stderr
    doc = json.loads((out / "summary.json").read_text())

    def numbers(v: Any):
        if isinstance(v, dict):
            for x in v.values():
                yield from numbers(x)
        elif isinstance(v, list):
            for x in v:
                yield from numbers(x)
        elif isinstance(v, float):
            yield v

    assert all(math.isfinite(x) for x in numbers(doc["variants"]))
    return doc


INF, NAN = float("inf"), float("nan")
REFUSED = {
    # 1. infinite or NaN numbers
    "step_overhead inf": (w("deployment.cost_model", {"type": "analytic", "step_overhead": INF}),
                          ["deployment.cost_model.step_overhead", "finite"]),
    "per_request_overhead inf": (w("deployment.cost_model", {"type": "analytic", "per_request_overhead": INF}),
                                 ["deployment.cost_model.per_request_overhead", "finite"]),
    "static max_wait inf": (w("policy", {"type": "static", "max_wait": INF}), ["policy.max_wait", "finite"]),
    "gpu mem_bandwidth nan": (w("deployment.gpu", {**GPU, "mem_bandwidth": NAN}), ["deployment.gpu", "mem_bandwidth"]),
    "gpu peak_flops nan": (w("deployment.gpu", {**GPU, "peak_flops": {"bf16": NAN}}),
                           ["deployment.gpu", "peak_flops.bf16"]),
    "gpu peak_flops inf": (w("deployment.gpu", {**GPU, "peak_flops": {"bf16": INF}}),
                           ["deployment.gpu", "peak_flops.bf16"]),
    "gpu mem_bandwidth inf": (w("deployment.gpu", {**GPU, "mem_bandwidth": INF}), ["deployment.gpu", "mem_bandwidth"]),
    "gpu pcie_bandwidth inf": (w("deployment.gpu", {**GPU, "pcie_bandwidth": INF}),
                               ["deployment.gpu", "pcie_bandwidth"]),
    "gpu memory_bytes nan": (w("deployment.gpu", {**GPU, "memory_bytes": NAN}), ["deployment.gpu", "memory_bytes"]),
    "swap_space inf": (w("deployment.swap_space", INF), ["deployment.swap_space", "finite"]),
    # 2. sweep typos
    "sweep over a misspelled key": (w("sweep", {"policy.max_num_seqz": [1, 2]}),
                                    ["sweep", "policy.max_num_seqz", "unknown key", "policy.max_num_seqs"]),
    "sweep key with an empty part": (w("sweep", {"policy..max_num_seqs": [1, 2]}), ["sweep", "policy..max_num_seqs"]),
    # 4. autoscaler ranges at load
    "autoscaler min above max": (w("cluster", {"autoscaler": {"signal": "queue", "scale_up": 2, "scale_down": 1,
                                                               "min_replicas": 4, "max_replicas": 2}}),
                                 ["cluster.autoscaler", "min_replicas (4)", "max_replicas (2)"]),
    "replicas outside the autoscaler's range": (
        w("cluster", {"replicas": 9, "autoscaler": {"signal": "queue", "scale_up": 2, "scale_down": 1}}),
        ["cluster", "replicas (9)", "[1, 8]"]),
    "autoscaler interval 1e-300 (hung)": (
        w("cluster", {"autoscaler": {"signal": "queue", "scale_up": 2, "scale_down": 1, "interval": 1e-300}}),
        ["cluster.autoscaler.interval", "greater than or equal to 0.001"]),
    "scale_down >= scale_up": (w("cluster", {"autoscaler": {"signal": "queue", "scale_up": 2, "scale_down": 2}}),
                               ["cluster.autoscaler", "scale_down"]),
    # 6. overflows
    "fixed length 2^70": (w("workload.output_len", {"type": "fixed", "value": 2**70}),
                          ["workload.output_len.value", "less than or equal"]),
    "lognormal std 1e300": (w("workload.prompt_len", {"type": "lognormal", "mean": 100, "std": 1e300}),
                            ["workload.prompt_len.std"]),
    # 7. size limits, saying what the run would need
    "num_requests 1e8": (w("workload.num_requests", 10**8), ["workload.num_requests", "GB", "at most 10000000"]),
    "num_gpu_blocks 2^41": (w("deployment.num_gpu_blocks", 2**41), ["deployment.num_gpu_blocks", "at most"]),
    # a block count given by hand: the advice was to raise gpu_memory_utilization, which the count overrides
    "num_gpu_blocks below max_model_len": (w("deployment.num_gpu_blocks", 10), [
        "deployment.max_model_len 1024 is larger than the KV cache holds (160 tokens in 10 blocks); set "
        "max_model_len <= 160 or deployment.num_gpu_blocks >= 64"]),
    "replicas 1e6": (w("cluster", {"replicas": 10**6}), ["cluster.replicas", "at most 1024"]),
    "sweep grid of 10^12 points": (
        w("sweep", {"policy.max_num_seqs": list(range(1, 1001)), "workload.num_requests": list(range(1, 1001)),
                    "deployment.block_size": list(range(1, 1001)), "workload.shared_prefix": list(range(1000))}),
        ["sweep", "1000000000000 points", "at most"]),
    # with prefix caching every block of the pool is touched before any is reused: a huge pool is refused
    "a prefix-cached KV cache past the memory cap": (
        w("kv_cache", {"type": "paged", "enable_prefix_caching": True},
          w("deployment", {"model": TINY, "gpu": "h200", "block_size": 1})),
        ["deployment", "blocks", "GB of memory", "enable_prefix_caching off"]),
    "repeat_to 1e12": (w("workload", {"arrival": {"type": "trace", "trace": "azure-conv", "repeat_to": 10**12}}),
                       ["workload.arrival.repeat_to", "GB"]),
    # 8. smaller
    "num_key_value_heads 0": (w("deployment.model", {**TINY, "num_key_value_heads": 0}),
                              ["deployment.model", "num_key_value_heads"]),
    "head_dim 0": (w("deployment.model", {**TINY, "head_dim": 0}), ["deployment.model", "head_dim"]),
    "num_hidden_layers 1.5": (w("deployment.model", {**TINY, "num_hidden_layers": 1.5}),
                              ["deployment.model", "num_hidden_layers", "1.5"]),
    "num_requests true": (w("workload.num_requests", True), ["workload.num_requests", "not true"]),
    "rate true": (w("workload.arrival.rate", True), ["workload.arrival.rate", "not true"]),
    # 9. an empty path is named, not read as the current folder: "trace file not found: ." and, for the model,
    # "file not found: config.json" (the current folder's)
    "trace ''": (w("workload", {"arrival": {"type": "trace", "trace": ""}}),
                 ["workload.arrival.trace: trace path is empty (''); name a trace file or a shipped trace"]),
    "model ''": (w("deployment.model", ""), ["deployment.model: unknown model ''; presets: tiny"]),
}


# Without prefix caching a freed block is reused at once, so a pool of any size costs only the blocks in use: these
# run (issue 15) where they were refused when the manager kept a list entry per block of the pool.
BOUNDED = {
    "num_gpu_blocks 1e8": w("deployment.num_gpu_blocks", 10**8),
    "tiny model on an H200 with block_size 1 (~3e8 blocks)": w("deployment", {"model": TINY, "gpu": "h200",
                                                                              "block_size": 1}),
}


@pytest.mark.parametrize("scenario", BOUNDED.values(), ids=list(BOUNDED))
def test_huge_pools_run_in_bounded_memory(tmp_path: Path, scenario: dict) -> None:
    result, out = invoke(tmp_path, scenario)
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").exists()


@pytest.mark.parametrize("scenario,needles", REFUSED.values(), ids=list(REFUSED))
def test_refused(tmp_path: Path, scenario: dict, needles: list[str]) -> None:
    result, out = invoke(tmp_path, scenario)
    assert_refused(result, out, *needles)


def test_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    result, out = invoke(tmp_path, text="\n".join(lines) + "\nname: *a9\n")
    err = assert_refused(result, out, "not valid YAML", "aliases")
    assert len(err) < 300  # the value is not rendered


def test_a_few_aliases_expanding_to_millions_are_refused(tmp_path: Path) -> None:
    lines = ['a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]  # 60 aliases, 10^7
    result, out = invoke(tmp_path, text="\n".join(lines) + "\n")
    assert_refused(result, out, "not valid YAML", "once aliases are expanded")


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, text="name: " + "[" * 500 + "]" * 500 + "\n")
    assert_refused(result, out, "not valid YAML", "nested more than")


def test_a_scenario_file_past_the_size_cap_is_refused(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, text="# " + "x" * (2 << 20) + "\n")
    assert_refused(result, out, "larger than 1 MiB")


def test_aliases_do_not_share_a_value_that_set_changes(tmp_path: Path) -> None:
    text = yaml.safe_dump(BASE) + "variants:\n  - {name: a, policy: &p {type: continuous, max_num_seqs: 4}}\n" \
        "  - {name: b, policy: *p}\n"
    path = tmp_path / "s.yaml"
    path.write_text(text)
    sc, raw = load_scenario(path, {"variants.0.policy.max_num_seqs": 8})
    assert [getattr(v.policy, "max_num_seqs", None) for v in sc.variants] == [8, 4]


@pytest.mark.parametrize("model", ["/dev/zero", "list.json"])
def test_model_path_that_is_no_config(tmp_path: Path, model: str) -> None:
    if model == "list.json":
        (tmp_path / "list.json").write_text("[1, 2]")
        model = str(tmp_path / "list.json")
    result, out = invoke(tmp_path, w("deployment.model", model))
    assert_refused(result, out, "deployment.model")


def test_profile_path_of_dev_zero_and_nan_wake_curve(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, w("deployment.cost_model", {"type": "fitted", "profile": "/dev/zero"}))
    assert_refused(result, out, "deployment.cost_model.profile", "larger than")
    profile = {"schema_version": 1, "model": "tiny", "device": "cpu", "coefficients": {"step": 0.001},
               "wake_curve": [[0, 0], [0.1, float("nan")]]}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    result, out = invoke(tmp_path, w("deployment.cost_model", {"type": "fitted", "profile": str(tmp_path / "p.json")}))
    assert_refused(result, out, "deployment.cost_model.profile", "wake_curve")


def _azure(tmp_path: Path, body: bytes) -> Path:
    p = tmp_path / "t.csv"
    p.write_bytes(body)
    return p


def test_azure_csv_with_a_byte_order_mark_runs(tmp_path: Path) -> None:
    rows = "".join(f"2023-11-16 18:15:{i:02d}.0000000,{100 + i},{10 + i}\n" for i in range(10))
    p = _azure(tmp_path, b"\xef\xbb\xbf" + ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows).encode())
    result, out = invoke(tmp_path, w("workload", {"arrival": {"type": "trace", "trace": str(p)}}))
    doc = assert_ran(result, out)
    assert doc["variants"]["h"]["num_requests"] == 10


@pytest.mark.parametrize("body,needles", [
    (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:00.0000000,1\xff0,5\n", ["not UTF-8"]),
    (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:00.0000000,9223372036854775808,5\n",
     ["t.csv:2", "ContextTokens", "at most"]),
], ids=["invalid utf-8", "length 2^63"])
def test_bad_trace_names_the_key(tmp_path: Path, body: bytes, needles: list[str]) -> None:
    p = _azure(tmp_path, body)
    result, out = invoke(tmp_path, w("workload", {"arrival": {"type": "trace", "trace": str(p)}}))
    assert_refused(result, out, "workload.arrival.trace", *needles)


def test_mooncake_length_past_int64(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 18446744073709551616, "output_length": 3, "hash_ids": []}\n')
    result, out = invoke(tmp_path, w("workload", {"arrival": {"type": "trace", "trace": str(p)}}))
    assert_refused(result, out, "workload.arrival.trace", "input_length")


# ---- --set ----------------------------------------------------------------------------------------------------
VARIANTS = w("variants", [{"name": "a", "policy": {"type": "continuous"}},
                          {"name": "b", "policy": {"type": "continuous", "max_num_seqs": 4}},
                          {"name": "c", "policy": {"type": "static", "batch_size": 2}}])


def test_set_reaches_every_variant_with_the_key(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, VARIANTS, args=("--set", "policy.max_num_seqs=64"))
    doc = assert_ran(result, out)
    policies = {name: doc["scenario"]["variants"][i]["policy"] for i, name in enumerate("abc")}
    assert policies["a"]["max_num_seqs"] == 64 and policies["b"]["max_num_seqs"] == 64
    assert "max_num_seqs" not in policies["c"]  # a static policy has no such key: left alone


def test_set_a_key_of_the_default_cost_model(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    sc, _ = load_scenario(path, {"deployment.cost_model.step_overhead": 0.25})
    assert sc.deployment.cost_model.type == "analytic" and sc.deployment.cost_model.step_overhead == 0.25


def test_set_refuses_a_key_that_exists_nowhere(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, VARIANTS, args=("--set", "policy.max_num_seqz=64"))
    assert_refused(result, out, "--set", "policy.max_num_seqz", "unknown key", "did you mean policy.max_num_seqs")


def test_set_refuses_a_key_no_variant_has(tmp_path: Path) -> None:
    only_continuous = w("variants", [{"name": "a", "policy": {"type": "continuous"}}])
    result, out = invoke(tmp_path, only_continuous, args=("--set", "policy.batch_size=8"))
    assert_refused(result, out, "--set", "policy.batch_size", "no variant")


DISAGG = w("variants", [{"name": "colocated"},
                        {"name": "1P1D", "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}}])


def test_set_reaches_the_variants_with_a_disaggregation_section(tmp_path: Path) -> None:
    # Before: "--set disaggregation: unknown key" (the defaults have no such section), though docs/running.md
    # says a key is set in every variant whose section has it.
    result, out = invoke(tmp_path, DISAGG, args=("--set", "disaggregation.kv_link.kind=nvlink",
                                                 "--set", "disaggregation.decode.replicas=2"))
    doc = assert_ran(result, out)
    colocated, disagg = doc["scenario"]["variants"]
    assert colocated.get("disaggregation") is None
    assert disagg["disaggregation"]["kv_link"]["kind"] == "nvlink"
    assert disagg["disaggregation"]["decode"]["replicas"] == 2 and disagg["disaggregation"]["prefill"]["replicas"] == 1


def test_set_disaggregation_refused_where_no_variant_has_it(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, VARIANTS, args=("--set", "disaggregation.kv_link.kind=nvlink"))
    assert_refused(result, out, "--set", "disaggregation.kv_link.kind", "no variant has a disaggregation section")
    result, out = invoke(tmp_path, DISAGG, args=("--set", "disaggregation.kv_link.knd=nvlink"))
    assert_refused(result, out, "--set", "did you mean disaggregation.kv_link.kind")


def test_sweep_over_a_disaggregation_key(tmp_path: Path) -> None:
    from sim.config.scenario import apply_point, sweep_points

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(w("sweep", {"disaggregation.kv_link.kind": ["nvlink", "pcie"]}, DISAGG)))
    sc, raw = load_scenario(path)
    kinds = [apply_point(raw, p, "s").variants[1].disaggregation.kv_link.kind for p in sweep_points(sc)]
    assert kinds == ["nvlink", "pcie"]


# ---- valid scenarios that crashed or read wrong ---------------------------------------------------------------
def test_contiguous_leak_with_reserve_request_ends_every_request() -> None:
    """Leaked contiguous ranges split the free space; a request whose reservation fits no gap, with nothing
    running, is rejected (it would wait forever) instead of the run stalling with RuntimeError."""
    raw = {"name": "s", "seed": 3, "workload": {
        "arrival": {"type": "poisson", "rate": 50.0}, "num_requests": 300,
        "prompt_len": {"type": "uniform", "low": 16, "high": 600},
        "output_len": {"type": "uniform", "low": 1, "high": 200},
        "failures": {"fraction": 0.5, "after": {"type": "uniform", "low": 0.0, "high": 0.5}}},
        "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 1024, "num_gpu_blocks": 200,
                       "leak_kv_on_failure": True},
        "kv_cache": {"type": "contiguous", "reserve": "request"}}
    run = run_scenario(prepare_scenario(parse_scenario(raw), raw))
    reqs = run.results[0].requests
    assert len(reqs) == 300 and all(r.outcome is not None for r in reqs)
    rejected = [r for r in reqs if r.outcome == "rejected"]
    assert rejected and all("in one gap" in r.reason for r in rejected)


def test_kv_token_utilisation_with_prefix_caching_is_a_share(tmp_path: Path) -> None:
    d = w("workload.shared_prefix", 512, w("kv_cache", {"type": "paged", "enable_prefix_caching": True},
                                            w("workload.num_requests", 40)))
    result, out = invoke(tmp_path, d)
    util = assert_ran(result, out)["variants"]["h"]["kv_token_utilization"]
    assert 0.0 < util <= 1.0


def test_inf_overhead_once_leaked_numpy_warnings(tmp_path: Path) -> None:
    """The cases that printed numpy RuntimeWarnings now stop at load; a valid run prints none."""
    result, out = invoke(tmp_path, BASE)
    assert_ran(result, out)
    assert "RuntimeWarning" not in result.stderr


def test_sweep_without_variants_changes_what_runs() -> None:
    """The other half of the sweep-typo case: a real key, no variants, takes effect at every point."""
    raw = w("sweep", {"policy.max_num_seqs": [1, 8]})
    run = run_scenario(prepare_scenario(parse_scenario(raw), raw))
    configs = [r.config or {} for r in run.results]
    assert [c["policy"]["max_num_seqs"] for c in configs] == [1, 8]
    assert [c["policy"]["type"] for c in configs] == ["continuous", "continuous"]


def test_sweep_over_a_whole_section() -> None:
    raw = w("sweep", {"kv_cache": [{"type": "paged"}, {"type": "contiguous"}]})
    run = run_scenario(prepare_scenario(parse_scenario(raw), raw))
    assert [(r.config or {})["kv_cache"]["type"] for r in run.results] == ["paged", "contiguous"]


def test_a_bad_gpu_in_the_plan_section_is_refused_by_run_too(tmp_path: Path) -> None:
    result, out = invoke(tmp_path, w("plan", {"gpus": ["l4", {"q": 1}]}))
    assert_refused(result, out, "plan.gpus", "item 1")


def test_engine_run_folder_states_the_kv_still_held(tmp_path: Path) -> None:
    """summary.json's kv_leak: 0 blocks on a correct server; the leaky variant keeps its failed requests' KV."""
    pytest.importorskip("torch")
    raw = {"name": "leak", "seed": 3,
           "workload": {"arrival": {"type": "poisson", "rate": 40.0}, "num_requests": 10,
                        "prompt_len": {"type": "uniform", "low": 8, "high": 24},
                        "output_len": {"type": "fixed", "value": 400},  # failures land mid-decode
                        "failures": {"fraction": 0.5, "after": {"type": "fixed", "value": 0.02}}},
           "deployment": {"model": "tiny", "max_model_len": 512, "block_size": 16},
           "policy": {"type": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 512},
           "variants": [{"name": "correct"}, {"name": "leaky", "deployment": {"leak_kv_on_failure": True}}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["engine", "run", str(path), "--device", "cpu", "--out", str(out),
                                   "--num-gpu-blocks", "400", "--weights", "random"])
    assert res.exit_code == 0, res.output
    variants = json.loads((out / "summary.json").read_text())["variants"]
    assert variants["correct"]["kv_leak"] == {"blocks": 0, "bytes": 0, "requests": 0}
    leak = variants["leaky"]["kv_leak"]
    failed = variants["leaky"]["num_failed"]
    # a request that fails before its first step holds nothing; the engine's timing (wall clock) decides how
    # many got KV first, so the count is bounded, not exact
    assert failed > 0 and 1 <= leak["requests"] <= failed
    assert leak["blocks"] >= leak["requests"] and leak["bytes"] > 0


def test_closed_loop_with_more_users_than_requests_starts_only_users_with_a_request() -> None:
    """Issue 35: a process was started per user, even those with no request (10^7 users, 20 requests: minutes and
    7.4 GB). Users past the requests change nothing, so the run equals the one with a user per request."""
    import tracemalloc

    def run(users: int) -> list[tuple[float, float]]:
        doc = w("workload.arrival", {"type": "closed_loop", "num_users": users,
                                     "think_time": {"type": "fixed", "value": 0.5}})
        doc["workload"]["num_requests"] = 20
        res = run_scenario(parse_scenario(doc)).results[0]
        return [(r.arrival, r.finish) for r in res.requests]

    tracemalloc.start()
    try:
        many = run(300_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert many == run(20)
    assert peak < 30 * 2**20  # a process, a queue and a counter per user: over 200 MB before


@pytest.mark.parametrize(("key", "value", "section", "expected"), [
    ("kv_cache.type", "contiguous", "kv_cache", {"type": "contiguous"}),
    ("policy.type", "static", "policy", {"type": "static"}),
])
def test_set_type_on_a_missing_section_builds_the_new_type(key: str, value: str, section: str, expected: dict) -> None:
    """Issue 35: the missing section was spelled out with the old type's every key, then its ``type`` changed:
    "kv_cache.enable_prefix_caching: unknown key". It now holds the new type's defaults."""
    from sim.config.scenario import apply_override, variant_configs

    d = copy.deepcopy(BASE)
    apply_override(d, key, value)
    assert d[section] == expected
    cfg = variant_configs(parse_scenario(d))[0]
    assert getattr(cfg, section).type == value
    # a nested default section likewise: the fitted cost model asks for its own key, not the analytic ones
    d = copy.deepcopy(BASE)
    apply_override(d, "deployment.cost_model.type", "fitted")
    with pytest.raises(Exception, match=r"deployment\.cost_model\.profile: required key is missing"):
        parse_scenario(d)


@pytest.mark.parametrize("name", ["min", "low", "max", "high"])
def test_set_a_bound_written_under_its_older_name(tmp_path: Path, name: str) -> None:
    """Issue 35: a file with uniform ``low``/``high`` could not have the bound overridden under either name
    (``.high``: unknown key; ``.max``: give max or high, not both). Both names now set it."""
    from sim.config.scenario import apply_override

    doc = w("workload.prompt_len", {"type": "uniform", "low": 16, "high": 64})
    doc["variants"] = [{"name": "a"}, {"name": "b", "workload": {"output_len": {"type": "uniform", "low": 2,
                                                                               "high": 9}}}]
    d = copy.deepcopy(doc)
    apply_override(d, f"workload.prompt_len.{name}", 32)
    sc = parse_scenario(d)
    new = {"low": "min", "high": "max"}.get(name, name)
    bounds = {"min": 16, "max": 64, new: 32}
    assert (sc.workload.prompt_len.min, sc.workload.prompt_len.max) == (bounds["min"], bounds["max"])
    # a variant's own section, and the command line
    apply_override(d, f"workload.output_len.{name}", 5)
    out = parse_scenario(d).variants[1].workload["output_len"]
    assert out[new] == 5 and {"min": "low", "max": "high"}[new] not in out
    assert_ran(*invoke(tmp_path, doc, args=("--set", f"workload.prompt_len.{name}=32")))


_CHILD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive shell starts it, even under CI
where = sys.argv[1]
if where == "report":  # Ctrl-C while the report is built, after the simulation
    import sim.output.report
    real = sim.output.report.build_report
    def build_report(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    sim.output.report.build_report = build_report
elif where == "commit":  # Ctrl-C while the files are moved into place
    import sim.config.files
    real_replace = os.replace
    def replace(*a, **k):
        if not getattr(replace, "sent", False):
            replace.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return real_replace(*a, **k)
    sim.config.files.os.replace = replace
from sim.cli.main import app
app(sys.argv[2:], prog_name="servesim")
"""


def _interrupt(tmp_path: Path, where: str, doc: dict, out: Path, wait_for_line: bool = False):
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-c", _CHILD, where, "run", str(path), "--out", str(out), "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    if wait_for_line:  # the description line comes once the workload is drawn, as the simulation starts
        assert p.stderr is not None
        first = p.stderr.readline()
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out_text, err = p.communicate(timeout=120)
        err = first + err
    else:
        out_text, err = p.communicate(timeout=120)
    return p.returncode, out_text, err


def test_ctrl_c_while_simulating_says_so_and_writes_no_folder(tmp_path: Path) -> None:
    """Issue 35: Ctrl-C exited 130 with no message."""
    doc = w("workload.num_requests", 200_000)
    out = tmp_path / "out"
    rc, stdout, err = _interrupt(tmp_path, "none", doc, out, wait_for_line=True)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == "interrupted while simulating h; no run folder was written", err
    assert "Traceback" not in err and stdout == "" and not out.exists()


def test_ctrl_c_while_writing_leaves_no_empty_folder(tmp_path: Path) -> None:
    """Issue 35: Ctrl-C while the run folder was prepared left it empty; an earlier run's folder stays whole."""
    out = tmp_path / "runs" / "h"
    rc, _, err = _interrupt(tmp_path, "report", BASE, out)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == f"interrupted while writing {out}; no run folder was written", err
    assert not out.exists()
    assert_ran(*invoke(tmp_path, BASE))  # an earlier run's folder, then the same Ctrl-C: left as it was
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    rc, _, err = _interrupt(tmp_path, "report", w("workload.num_requests", 9), tmp_path / "out")
    assert rc == 130 and err.strip().endswith(f"{tmp_path / 'out'}/ was left as it was"), err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_ctrl_c_while_moving_the_files_into_place_finishes_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert_ran(*invoke(tmp_path, BASE))
    rc, _, err = _interrupt(tmp_path, "commit", w("workload.num_requests", 9), out)
    assert rc == 130 and err.strip().splitlines()[-1] == f"interrupted after writing {out}/ (complete)", err
    assert json.loads((out / "summary.json").read_text())["variants"]["h"]["num_requests"] == 9
    assert len((out / "requests.csv").read_text().splitlines()) == 1 + 9
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_run_whose_every_request_is_rejected_says_why(tmp_path: Path) -> None:
    """Issue 35: such a run said only "no steps ran: nothing to diagnose". It now says that all N were rejected
    and why, reasons that differ only in a request's own numbers counted together. The exit status stays 0: the
    input was valid and the run's result is the rejection (exit 2 is for bad input)."""
    doc = w("workload.prompt_len", {"type": "uniform", "min": 1100, "max": 1500})
    res, out = invoke(tmp_path, doc)
    summary = assert_ran(res, out)["variants"]["h"]
    lengths = [int(r["prompt_tokens"]) + 4 for r in csv.DictReader(open(out / "requests.csv"))]
    why = f"prompt+output {min(lengths)}-{max(lengths)} tokens exceeds max_model_len 1024"
    assert summary["rejections"] == {why: 6}
    assert f"h: all 6 requests were rejected: {why} (6).\n" in res.stdout


def test_rejection_reasons_group_by_text_and_rank_by_count() -> None:
    from sim.metrics.records import RequestRecord
    from sim.metrics.verdict import rank_limits, rejection_reasons

    def rec(i: int, outcome: str, reason: str) -> RequestRecord:
        return RequestRecord(i, 0.0, -1.0, -1.0, 0.0, 10, 0, 5, 0, outcome, reason, 0, -1)

    recs = [rec(0, "rejected", "prompt+output 900 tokens exceeds max_model_len 512"),
            rec(1, "rejected", "queue full (8 waiting)"),
            rec(2, "rejected", "prompt+output 700 tokens exceeds max_model_len 512"),
            rec(3, "completed", ""),
            rec(4, "rejected", "prompt+output 1000.5 tokens exceeds max_model_len 512")]
    reasons = rejection_reasons(recs)
    assert reasons == {"prompt+output 700-1000.5 tokens exceeds max_model_len 512": 3, "queue full (8 waiting)": 1}
    assert rank_limits({"num_requests": 4, "num_rejected": 4, "num_steps": 0, "rejections": reasons}).text == (
        "all 4 requests were rejected: prompt+output 700-1000.5 tokens exceeds max_model_len 512 (3); "
        "queue full (8 waiting) (1).")
    # a summary.json written before ``rejections``
    assert rank_limits({"num_requests": 2, "num_rejected": 2, "num_steps": 0}).text == "all 2 requests were rejected."


@pytest.mark.parametrize(("name", "folder"), [("../../esc", "esc"), ("a/b", "a_b"), ("h", "h")])
def test_default_run_folder_stays_one_folder_inside_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          name: str, folder: str) -> None:
    # Before: `name: ../../esc` wrote runs/../../esc/, outside runs/ and beside the working folder.
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    (cwd / "s.yaml").write_text(yaml.safe_dump(w("name", name)))
    result = CliRunner().invoke(app, ["run", "s.yaml", "-q"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (cwd / "runs").iterdir()] == [folder]
    assert (cwd / "runs" / folder / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
