"""sim/engines/costs.py: the engines' host time per step and static batching's activation reserve, against hand
computations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from calibration.bench_fit import with_knobs
from sim.costs.analytic import TORCH_WEIGHT_ONLY_BANDWIDTH, AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.engines.costs import host_time_ratio
from sim.engines.registry import EngineConfig
from sim.engines.vllm_v0 import (VLLM_V0_DECODE_HOST_PER_ROW_S, VLLM_V0_DECODE_HOST_S, VLLM_V05_HOST_TIME_RATIO,
                                 VLLM_V06_ASYNC_OUTPUT_TPOT_GAIN, VLLM_V06_HOST_TIME_RATIO)
from sim.engines.vllm_v1 import VLLM_V1_LINEAR_OVERLAP
from sim.hardware.dtypes import GiB
from sim.hardware.gpu import resolve_gpu
from sim.hardware.kv_budget import DEFAULT_RUNTIME_OVERHEAD_BYTES
from sim.hardware.models import ModelSpec
from sim.loop.build import build


def _built(dep: dict, policy: dict | None = None, isl: int = 100, osl: int = 10):
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 2,
                                     "prompt_len": {"type": "fixed", "value": isl},
                                     "output_len": {"type": "fixed", "value": osl}},
           "deployment": dep}
    if policy is not None:
        raw["policy"] = policy
    return build(variant_configs(parse_scenario(raw, "t"))[0])


def test_versions_ratios_from_the_profiles():
    # vLLM 0.5.3's profile: 33% API server + 29% scheduling against 38% GPU; V1 up to 1.7x V0.6
    assert VLLM_V05_HOST_TIME_RATIO == pytest.approx(0.62 / 0.38)
    assert VLLM_V06_HOST_TIME_RATIO == pytest.approx(0.7)
    assert host_time_ratio(EngineConfig(name="vllm-v0", version="0.5")) == VLLM_V05_HOST_TIME_RATIO
    assert host_time_ratio(EngineConfig(name="vllm-v0")) == VLLM_V06_HOST_TIME_RATIO  # 0.6 by default
    assert host_time_ratio(EngineConfig(name="vllm-v0", version="0.6"), num_scheduler_steps=10) == \
        pytest.approx(0.07)
    for name in ("vllm-v1", "tensorrt-llm", "sglang", "classic"):
        assert host_time_ratio(EngineConfig(name=name)) == 0.0
    assert host_time_ratio(EngineConfig(name="vllm-v1", host_time_ratio=0.25)) == 0.25  # overridable
    assert host_time_ratio(None) == 0.0


def test_version_belongs_to_vllm_v0():
    with pytest.raises(ScenarioError, match="version is vllm-v0.s"):
        _built({"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": {"name": "sglang", "version": "0.5"}})


def test_one_decode_step_by_hand():
    """Llama-3.1-8B bf16 on one H100, one row attending 1,000 tokens: its GPU time is the weights and the KV read at
    0.8 of 3.35 TB/s (memory-bound at batch 1) plus the tiny activations; vLLM 0.5 adds 1.63x of that on the host.
    """
    m, g = ModelSpec.from_name("llama-3.1-8b"), resolve_gpu("h100-sxm")
    base = AnalyticCostModel(m, g)
    v05 = AnalyticCostModel(m, g, host_time_ratio=VLLM_V05_HOST_TIME_RATIO)
    shape = StepShape(1, 1, 1, 1000, 1000)
    bw = g.mem_bandwidth * 0.8
    kv = 2 * 32 * 8 * 128 * 2  # K and V x layers x KV heads x head_dim x bf16
    weights = m.shard(1).weight_bytes_read_per_step("bf16")
    parts = base.breakdown(shape)
    gpu = float(parts["linear"] + parts["attention"])
    assert float(parts["attention"]) == pytest.approx(1001 * kv / bw, rel=1e-12)
    assert float(parts["linear"]) == pytest.approx(weights / bw, rel=1e-3)  # activations: < 0.1%
    overhead = 1.5e-3 + 1.0e-5  # the analytic defaults: per step + per row
    assert base.step_time(shape) == pytest.approx(overhead + gpu, rel=1e-12)
    assert v05.step_time(shape) == pytest.approx(overhead + (1 + 0.62 / 0.38) * gpu, rel=1e-12)
    # the weights a step reads (the embedding table is not) + 0.13 GB of KV at 2.68 TB/s: 5.65 ms of GPU work,
    # 9.22 ms of host time on top
    assert gpu == pytest.approx((weights + 1001 * kv) / bw, rel=1e-3)
    assert gpu == pytest.approx(5.65e-3, abs=0.01e-3)
    assert v05.step_time(shape) - base.step_time(shape) == pytest.approx(9.22e-3, abs=0.01e-3)
    # the decode fast path gives the very same floats
    times, _ = v05.decode_steps([1, 64, 64], [1000, 64000, 70000])
    for t, (n, c) in zip(times, [(1, 1000), (64, 64000), (64, 70000)], strict=True):
        assert t == v05.step_time(StepShape(n, n, n, c, c))
        assert t == v05.decode_step_time(n, c)


def test_prompt_step_waits_for_a_decode_steps_host_time():
    """A step of prompts alone (no decode row) keeps its GPU time and waits for the host time of the decode step of
    the same rows, not for the ratio times its prompts' compute: Llama-3.1-8B on one A100, one 1,000-token prompt.
    Steps with a decode row (vLLM V0's chunked prefill mixes them) stay stretched as a whole."""
    m, g = ModelSpec.from_name("llama-3.1-8b"), resolve_gpu("a100-80gb")
    base = AnalyticCostModel(m, g)
    for r in (VLLM_V05_HOST_TIME_RATIO, VLLM_V06_HOST_TIME_RATIO):
        v0 = AnalyticCostModel(m, g, host_time_ratio=r)
        overhead = 1.5e-3 + 1.0e-5
        prompt = StepShape(1, 1000, 0, 1000, 1000 * 1001 // 2)
        decode = StepShape(1, 1, 1, 1000, 1000)  # the same row's decode step, attending the same 1,000 tokens
        host = r * (base.step_time(decode) - overhead)
        assert v0.step_time(decode) == pytest.approx(base.step_time(decode) + host, rel=1e-12)
        assert v0.step_time(prompt) == pytest.approx(base.step_time(prompt) + host, rel=1e-12)
        # the prompt: 2 x 6.98e9 body FLOPs a token at 0.6 of 312 TFLOP/s, 74.6 ms, + attention's 500,500 pairs,
        # 1.4 ms; a stretch of the whole step added 1.63x or 0.7x of that. Its decode step: 16 GB of weights at 0.8
        # of 2.04 TB/s, 9.3 ms, of which the host time is r times
        assert base.step_time(prompt) - overhead == pytest.approx(76.0e-3, abs=0.1e-3)
        assert host == pytest.approx(r * 9.29e-3, abs=r * 0.01e-3)
        mixed = StepShape(2, 1001, 1, 2000, 1000 * 1001 // 2 + 1000)  # one prompt beside one decode row
        assert v0.step_time(mixed) - overhead - 1.0e-5 == pytest.approx(
            (1 + r) * (base.step_time(mixed) - overhead - 1.0e-5), rel=1e-12)
        # many steps at once: the same floats as one at a time
        many = StepShape(np.array([1, 1, 2]), np.array([1000, 1, 1001]), np.array([0, 1, 1]),
                         np.array([1000, 1000, 2000]), np.array([500500, 1000, 501500]))
        assert list(v0.step_time(many)) == [v0.step_time(prompt), v0.step_time(decode), v0.step_time(mixed)]


def test_engine_sets_the_ratio_and_cost_model_keys_win():
    dep = {"model": "llama-3.1-8b", "gpu": "h100-sxm"}
    assert _built({**dep, "engine": {"name": "vllm-v0", "version": "0.5"}})[2].host_time_ratio == \
        VLLM_V05_HOST_TIME_RATIO
    assert _built({**dep, "engine": "vllm-v0"})[2].host_time_ratio == VLLM_V06_HOST_TIME_RATIO
    assert _built({**dep, "engine": {"name": "vllm-v0", "host_time_ratio": 0.1}})[2].host_time_ratio == 0.1
    classic = _built(dep)[2]
    v1 = _built({**dep, "engine": "vllm-v1"})[2]
    assert classic.host_time_ratio == v1.host_time_ratio == 0.0
    shape = StepShape(8, 8, 8, 8000, 8000)
    # vLLM V1's decode GEMMs do not overlap their weight reads and arithmetic (sim/engines/vllm_v1.py): 8 rows add
    # 8 tokens' compute, 25.3 us each; the rest of the step is the classic model's
    assert classic.linear_overlap == 1.0 and v1.linear_overlap == VLLM_V1_LINEAR_OVERLAP == 0.0
    assert v1.step_time(shape) - classic.step_time(shape) == pytest.approx(8 * 25.3e-6, rel=1e-3)
    # a scenario's cost_model key wins over the preset's, bit for bit the classic model then
    given = _built({**dep, "engine": "vllm-v1", "cost_model": {"type": "analytic", "linear_overlap": 1.0}})[2]
    assert given.step_time(shape) == classic.step_time(shape)


def test_moe_experts_stretched_too():
    m, g = ModelSpec.from_name("mixtral-8x7b"), resolve_gpu("h100-sxm")
    base, slow = AnalyticCostModel(m, g, tensor_parallel_size=2), AnalyticCostModel(
        m, g, tensor_parallel_size=2, host_time_ratio=1.0)
    shape = StepShape(4, 4, 4, 4000, 4000)
    overhead = 1.5e-3 + 4 * 1.0e-5
    assert slow.step_time(shape) - overhead == pytest.approx(2 * (base.step_time(shape) - overhead), rel=1e-12)


# ---- static batching ------------------------------------------------------------------------------------------
STATIC_70B = {"model": "llama-2-70b", "gpu": "a100-40gb", "tensor_parallel_size": 8, "max_model_len": 4096}


def test_static_batch_that_ran_now_fits():
    """Llama-2-70B, static batch 64 of 2048/2048 on 8 x A100-40GB: sized for 64 x 4096 tokens the activations
    (22.3 GiB) leave no KV; a real engine built for 2048-token prompts sizes them for 64 x 2048 (11.7 GiB)."""
    pol = {"type": "static", "batch_size": 64}
    with pytest.raises(ScenarioError, match="does not fit"):
        _built(STATIC_70B, pol, 2048, 2048)
    with pytest.raises(ScenarioError, match="does not fit"):  # an engine without max_input_len: max_model_len
        _built({**STATIC_70B, "engine": "vllm-v0"}, pol, 2048, 2048)
    b = _built({**STATIC_70B, "engine": "vllm-v0"}, {**pol, "max_input_len": 2048}, 2048, 2048)[3]
    h, inter, tp, vocab = 8192, 28672, 8, 32000
    reserve = 64 * 2048 * (4 * h + 3 * inter // tp) * 2 + 256 * vocab * 4 * 2 + DEFAULT_RUNTIME_OVERHEAD_BYTES
    assert b.budget.activation_reserve == reserve
    assert reserve / GiB == pytest.approx(11.69, abs=0.01)
    weights = ModelSpec.from_name("llama-2-70b").shard(8).weight_bytes("bf16")
    kv_token = 2 * 80 * 1 * 128 * 2  # 8 KV heads over 8 GPUs: one per GPU
    free = int(40 * GiB * 0.9) - weights - reserve
    assert b.budget.num_gpu_blocks == free // (16 * kv_token)
    assert b.budget.capacity_tokens // 4096 == 52  # it runs: 52 of the 64 sequences at their full length at once


def test_static_classic_unchanged():
    pol = {"type": "static", "batch_size": 8}
    dep = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 4096}
    classic = _built(dep, {**pol, "max_input_len": 1024})[3].budget  # the key is read only under an engine
    assert classic == _built(dep, pol)[3].budget
    assert classic.activation_reserve == _built({**dep, "engine": "vllm-v0"}, pol)[3].budget.activation_reserve


def test_attention_efficiency_of_the_engines_kernels():
    """One 2,048-token prompt of Llama-3.1-8B (bf16): its attention is compute-bound, 4 x layers x heads x head_dim
    FLOPs per causal pair, at the achievable share of the dense bf16 peak that the engine's kernel reaches."""
    pairs = 2048 * 2049 // 2
    flops = pairs * 4 * 32 * 32 * 128
    shape = StepShape(1, 2048, 0, 2048, pairs)
    dep = {"model": "llama-3.1-8b", "gpu": "h100-sxm"}
    expect = {"vllm-v0": 0.35, "vllm-v1": 0.75, "tensorrt-llm": 0.6, "sglang": 0.6}  # FA2, FA3, the default
    peak = resolve_gpu("h100-sxm").peak("bf16")
    for engine, eff in expect.items():
        # (vllm-v0's host time left out here: it stretches the whole step, test_one_decode_step_by_hand)
        cost = _built({**dep, "engine": {"name": engine, "host_time_ratio": 0}})[2]
        assert float(cost.breakdown(shape)["attention"]) == pytest.approx(flops / (peak * eff), rel=1e-12), engine
    assert _built({**dep, "gpu": "a100-80gb", "engine": "vllm-v1"})[2].attention_efficiency == 0.5  # FA2 on Ampere
    assert _built({**dep, "gpu": "l40", "engine": "vllm-v1"})[2].attention_efficiency is None  # no published share
    assert _built(dep)[2].attention_efficiency is None  # classic: the compute efficiency, as before
    given = _built({**dep, "engine": "vllm-v1", "cost_model": {"type": "analytic", "attention_efficiency": 0.5}})[2]
    assert given.attention_efficiency == 0.5  # the scenario's key wins


def test_new_keys_recorded_only_when_set():
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 1,
                                     "prompt_len": {"type": "fixed", "value": 10},
                                     "output_len": {"type": "fixed", "value": 2}},
           "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "vllm-v0"},
           "policy": {"type": "static", "batch_size": 2}}
    d = parse_scenario(raw, "t").model_dump(mode="json")
    assert "version" not in d["deployment"]["engine"] and "host_time_ratio" not in d["deployment"]["engine"]
    assert "attention_efficiency" not in d["deployment"]["cost_model"] and "max_input_len" not in d["policy"]
    raw["deployment"]["engine"] = {"name": "vllm-v0", "version": "0.5"}
    raw["policy"]["max_input_len"] = 8
    d = parse_scenario(raw, "t").model_dump(mode="json")
    assert d["deployment"]["engine"]["version"] == "0.5" and d["policy"]["max_input_len"] == 8
    assert parse_scenario(d, "again").model_dump(mode="json") == d  # reads back


def test_version_written_as_a_number_reads_as_its_text():
    """YAML reads ``version: 0.5`` (and ``--set deployment.engine.version=0.5``) as a number: it is the release
    0.5, not an error saying "must be '0.5' or '0.6' (got 0.5)"."""
    assert EngineConfig(name="vllm-v0", version=0.5).version == "0.5"
    assert EngineConfig(name="vllm-v0", version=0.6).version == "0.6"
    with pytest.raises(ScenarioError, match=r"must be '0.1', '0.5' or '0.6' \(got '0.7'\)"):
        _built({"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": {"name": "vllm-v0", "version": 0.7}})


def test_lmdeploy_01_runs_a_prompt_in_a_forward_of_its_own_then_the_decode_forward():
    # TurboMind at v0.1.0a1 (LlamaBatch.cc): ContextDecode on the prompt less its last token, then one decode forward
    # of every row computing that last token; the step's fixed overhead once
    dep = {"model": "llama-2-7b", "gpu": "a100-80gb", "weight_dtype": "fp16"}
    old = _built({**dep, "engine": {"name": "lmdeploy", "version": 0.1}})[2]
    new = _built({**dep, "engine": "lmdeploy"})[2]
    assert old.context_decode_pass and not new.context_decode_pass
    assert _built({**dep, "engine": {"name": "lmdeploy", "version": "0.6"}})[2] == new
    prompt = StepShape(num_seqs=1, num_tokens=128, num_decode_seqs=0, kv_read_tokens=128, attn_pairs=128 * 129 // 2)
    decode = StepShape(num_seqs=1, num_tokens=1, num_decode_seqs=1, kv_read_tokens=128, attn_pairs=128 * 129 // 2)
    rest = StepShape(num_seqs=0, num_tokens=127, num_decode_seqs=0, kv_read_tokens=0, attn_pairs=0)
    want = new.step_time(decode) + new.step_time(rest) - new.step_overhead
    assert old.step_time(prompt) == pytest.approx(want, rel=1e-12)
    assert old.step_time(prompt) > new.step_time(prompt) + 0.8 * (new.step_time(decode) - new.step_overhead)
    assert old.step_time(decode) == new.step_time(decode)  # a step without prompts is one forward either way
    many = StepShape(num_seqs=np.array([1, 1]), num_tokens=np.array([128, 1]), num_decode_seqs=np.array([0, 1]),
                     kv_read_tokens=np.array([128, 128]), attn_pairs=np.array([128 * 129 // 2] * 2))
    assert old.step_time(many).tolist() == [old.step_time(prompt), old.step_time(decode)]
    with pytest.raises(ScenarioError, match="version 0.5: engine lmdeploy follows 0.1 or 0.6"):
        _built({**dep, "engine": {"name": "lmdeploy", "version": "0.5"}})
    with pytest.raises(ScenarioError, match="version 0.1: engine vllm-v0 follows 0.5 or 0.6"):
        _built({**dep, "engine": {"name": "vllm-v0", "version": "0.1"}})


def test_a_step_of_verifying_rows_alone_stays_stretched():
    """A row verifying k drafts (speculative decoding) computes k + 1 tokens and is not counted in num_decode_seqs,
    but it decodes: a step of such rows alone is stretched as a whole, as a decode step is, not priced as a step of
    prompts. Before, it was, and one plain decode row added to 64 verifying rows made the step 3.5 ms (10%) longer
    (Llama-3.1-8B on an H100 under vLLM 0.5's ratio)."""
    m, g = ModelSpec.from_name("llama-3.1-8b"), resolve_gpu("h100-sxm")
    base = AnalyticCostModel(m, g)
    n, k, c = 64, 4, 2000
    overhead = 1.5e-3 + n * 1.0e-5
    verify = StepShape(n, n * (k + 1), 0, n * (c + k + 1), n * ((k + 1) * c + (k + 1) * (k + 2) // 2),
                       num_spec_seqs=n, num_draft_tokens=n * k, spec_context_tokens=n * c)
    for r in (VLLM_V05_HOST_TIME_RATIO, VLLM_V06_HOST_TIME_RATIO):
        v0 = AnalyticCostModel(m, g, host_time_ratio=r)
        assert v0.step_time(verify) - overhead == pytest.approx((1 + r) * (base.step_time(verify) - overhead),
                                                                 rel=1e-12)


@pytest.mark.parametrize("engine", [{"name": "vllm-v0", "version": "0.5"}, {"name": "vllm-v0", "version": "0.6"},
                                    {"name": "lmdeploy", "version": "0.1"}, "vllm-v1"])
def test_breakdown_sums_to_step_time_for_every_engine(engine: object) -> None:
    # Before: vllm-v0's steps of prompts alone (fcae9b0) and LMDeploy 0.1's prompt steps (5c868d3) were priced
    # past the roofline parts breakdown gave, whose sum was then not the step time
    cost = _built({"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": engine})[2]
    prompts = StepShape(2, 4000, 0, 4000, 2 * 2000 * 2001 // 2)
    shapes = (prompts, StepShape(3, 3, 3, 1500, 1500), StepShape(5, 900, 4, 20000, 100000, 0, 7),
              StepShape(2, 4000, 0, 4000, 4001000, host_load_time=0.002),
              StepShape(np.array([2, 3]), np.array([4000, 3]), np.array([0, 3]), np.array([4000, 1500]),
                        np.array([4001000, 1500])))
    for shape in shapes:
        parts = cost.breakdown(shape)
        total = sum(np.asarray(parts[k], dtype=float) for k in ("overhead", "linear", "attention", "allreduce",
                                                                "swap", "decode_pass", "prompt_host", "host_load"))
        np.testing.assert_allclose(total, cost.step_time(shape), rtol=1e-12)
    applies = {"prompt_host": cost.host_time_ratio > 0, "decode_pass": cost.context_decode_pass}
    assert {k: float(cost.breakdown(prompts)[k]) != 0.0 for k in applies} == applies


def test_a_v0_decode_step_of_few_rows_waits_for_its_measured_host_time():
    """vLLM V0 on one GPU: a step without prompt tokens waits for the ratio's share of its GPU time, but for no more
    than 4 ms + 80 us a row (vllm#6854's GPU bubble a decode step; vllm#6801's 20 ms at 200 rows), which a step of
    few rows reaches first. Llama-3.1-8B on one A100: one row's 9.3 ms of GPU time would add 6.5 ms (0.7x), 4.08 ms
    now; 256 rows of 200 tokens (24.7 ms of GPU time) keep the ratio's 17.3 ms, under 24.5 ms."""
    m, g = ModelSpec.from_name("llama-3.1-8b"), resolve_gpu("a100-80gb")
    r = VLLM_V06_HOST_TIME_RATIO
    base, whole = AnalyticCostModel(m, g), AnalyticCostModel(m, g, host_time_ratio=r)
    capped = AnalyticCostModel(m, g, host_time_ratio=r, host_time_cap=VLLM_V0_DECODE_HOST_S,
                               host_time_cap_per_row=VLLM_V0_DECODE_HOST_PER_ROW_S)
    assert (VLLM_V0_DECODE_HOST_S, VLLM_V0_DECODE_HOST_PER_ROW_S) == (4e-3, pytest.approx(80e-6))
    one, many = StepShape(1, 1, 1, 1000, 1000), StepShape(256, 256, 256, 51_200, 51_200)
    assert whole.step_time(one) - base.step_time(one) == pytest.approx(r * 9.29e-3, abs=0.01e-3)
    assert capped.step_time(one) - base.step_time(one) == pytest.approx(4e-3 + 80e-6, rel=1e-9)
    assert capped.step_time(many) == whole.step_time(many)
    assert whole.step_time(many) - base.step_time(many) == pytest.approx(17.26e-3, abs=0.01e-3)
    # a step of prompts alone waits for the host time of its rows' decode step, capped the same way, and so does a
    # step mixing prompt tokens and decodes (chunked prefill's): its two rows' 4.16 ms, not 0.7x its 76 ms of GPU
    # time; without the cap (tensor parallelism) such a step stays stretched
    prompt, mixed = StepShape(1, 1000, 0, 1000, 1000 * 1001 // 2), StepShape(2, 1001, 1, 2000, 501500)
    assert capped.step_time(prompt) - base.step_time(prompt) == pytest.approx(4e-3 + 80e-6, rel=1e-9)
    assert capped.step_time(mixed) - base.step_time(mixed) == pytest.approx(4e-3 + 2 * 80e-6, rel=1e-9)
    assert whole.step_time(mixed) - base.step_time(mixed) > 50e-3
    # the decode fast path and arrays give the very same floats
    times, _ = capped.decode_steps([1, 256, 256], [1000, 51_200, 257_000])
    for t, (n, c) in zip(times, [(1, 1000), (256, 51_200), (256, 257_000)], strict=True):
        assert t == capped.step_time(StepShape(n, n, n, c, c)) == capped.decode_step_time(n, c)
    arr = StepShape(np.array([1, 256, 1, 2]), np.array([1, 256, 1000, 1001]), np.array([1, 256, 0, 1]),
                    np.array([1000, 51_200, 1000, 2000]), np.array([1000, 51_200, 500500, 501500]))
    assert list(capped.step_time(arr)) == [capped.step_time(s) for s in (one, many, prompt, mixed)]
    # the preset sets it on one GPU only, divided by the steps scheduled at once; a ratio given stands alone
    dep = {"model": "llama-3.1-8b", "gpu": "a100-80gb"}
    caps = [(c.host_time_cap, c.host_time_cap_per_row) for c in (
        _built({**dep, "engine": "vllm-v0"})[2], _built({**dep, "engine": {"name": "vllm-v0", "version": "0.5"}})[2],
        _built({**dep, "engine": {"name": "vllm-v0", "num_scheduler_steps": 10}},
               {"type": "continuous", "enable_chunked_prefill": False})[2],
        _built({**dep, "tensor_parallel_size": 2, "engine": "vllm-v0"})[2],
        _built({**dep, "engine": {"name": "vllm-v0", "host_time_ratio": 0.7}})[2],
        _built({**dep, "engine": "vllm-v1"})[2])]
    assert caps == [(4e-3, pytest.approx(80e-6))] * 2 + [(4e-4, pytest.approx(8e-6))] + [(0.0, 0.0)] * 3


def test_enforce_eager_leaves_v06_without_async_output_processing():
    """vLLM 0.6 turns asynchronous output processing off under enforce_eager (ModelConfig.verify_async_output_proc),
    which the v0.6.0 post credits with 8.7% of Llama-70B's TPOT on 4 H100s: an eager V0.6 step takes 1 / (1 - 0.087)
    of the step the 0.6 ratio gives, its host time ratio (1 + 0.7) / 0.913 - 1 = 0.862. vLLM 0.5 had no async output
    processing (its profile's ratio holds either way); a ratio given stands alone."""
    assert VLLM_V06_ASYNC_OUTPUT_TPOT_GAIN == 0.087
    eager = host_time_ratio(EngineConfig(name="vllm-v0", enforce_eager=True))
    assert eager == pytest.approx(1.7 / 0.913 - 1) == pytest.approx(0.8620, abs=1e-4)
    assert host_time_ratio(EngineConfig(name="vllm-v0", enforce_eager=False)) == VLLM_V06_HOST_TIME_RATIO
    assert host_time_ratio(EngineConfig(name="vllm-v0", enforce_eager=True), num_scheduler_steps=10) == \
        pytest.approx(1.07 / 0.913 - 1)
    assert host_time_ratio(EngineConfig(name="vllm-v0", version="0.5", enforce_eager=True)) == \
        VLLM_V05_HOST_TIME_RATIO
    assert host_time_ratio(EngineConfig(name="vllm-v0", enforce_eager=True, host_time_ratio=0.7)) == 0.7
    # built: Llama-3.1-70B at TP 4 on H100s (the ratio whole), a decode step of 8 rows (a captured size, so no
    # padding either way) stretched 1.862 / 1.7 times as long in its GPU parts; the fixed overheads are not stretched
    dep = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "tensor_parallel_size": 4}
    graphs, eager_cost = (_built({**dep, "engine": {"name": "vllm-v0", "enforce_eager": e}})[2] for e in (False, True))
    assert graphs.host_time_ratio == VLLM_V06_HOST_TIME_RATIO and eager_cost.host_time_ratio == eager
    shape, overhead = StepShape(8, 8, 8, 8000, 8000), 1.5e-3 + 8 * 1.0e-5
    assert eager_cost.step_time(shape) - overhead == pytest.approx(
        (graphs.step_time(shape) - overhead) / (1 - 0.087), rel=1e-12)


def test_pytorchs_weight_only_kernels_stream_their_weights_slower():
    """torchao's quantization README (A100, batch 1): int8 weight-only streams 1131.18 and 1150.80 GB/s where bf16
    streams 1418.93 and 1435.54 (Llama-2-7B, Llama-3-8B), int4 (tinygemm) 751.42 and 763.33: shares 0.799 and 0.531
    of bf16's rate. With ``weight_only_bandwidth`` a weight-only model's weight reads take 1 / share as long; a model
    that is not weight-only (bf16, fp8 on an H100) is unchanged, and MoE experts (other kernels) keep the full rate."""
    assert TORCH_WEIGHT_ONLY_BANDWIDTH == {"int8": pytest.approx(0.79943, abs=1e-5),
                                           "int4": pytest.approx(0.53065, abs=1e-5)}
    g = resolve_gpu("a100-80gb")
    decode = StepShape(1, 1, 1, 100, 100)  # batch 1: the step waits for its weight reads
    for name in ("llama-2-7b", "mixtral-8x7b"):
        m = ModelSpec.from_name(name)
        for wd, share in TORCH_WEIGHT_ONLY_BANDWIDTH.items():
            full = AnalyticCostModel(m, g, weight_dtype=wd)
            torch = AnalyticCostModel(m, g, weight_dtype=wd, weight_only_bandwidth=share)
            dense = m.shard(1).weight_bytes_read_per_step(wd) / (g.mem_bandwidth * 0.8)  # experts left out
            assert torch.step_time(decode) - full.step_time(decode) == pytest.approx(dense * (1 / share - 1),
                                                                                       rel=1e-9)
    m = ModelSpec.from_name("llama-2-7b")
    for wd, gpu in (("bf16", g), ("fp8", resolve_gpu("h100-sxm"))):
        assert AnalyticCostModel(m, gpu, weight_dtype=wd, weight_only_bandwidth=0.5).step_time(decode) == \
            AnalyticCostModel(m, gpu, weight_dtype=wd).step_time(decode)
    with pytest.raises(ValueError, match="weight_only_bandwidth must be in"):
        AnalyticCostModel(m, g, weight_dtype="int4", weight_only_bandwidth=0.0)
    # a scenario's cost_model key, which a calibration's knobs leave in place
    dep = {"model": "llama-2-7b", "gpu": "a100-80gb", "weight_dtype": "int4"}
    assert _built({**dep, "cost_model": {"type": "analytic", "weight_only_bandwidth": 0.5}})[2].weight_only_bandwidth \
        == 0.5
    assert _built(dep)[2].weight_only_bandwidth == 1.0
    with pytest.raises(ScenarioError, match="weight_only_bandwidth"):
        _built({**dep, "cost_model": {"type": "analytic", "weight_only_bandwidth": 1.5}})
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 1,
                                     "prompt_len": {"type": "fixed", "value": 10},
                                     "output_len": {"type": "fixed", "value": 10}}, "deployment": {
        **dep, "cost_model": {"type": "analytic", "weight_only_bandwidth": 0.5, "compute_efficiency": 0.9}}}
    fitted = with_knobs(variant_configs(parse_scenario(raw, "t"))[0], {"compute_efficiency": 0.3}).deployment
    assert (fitted.cost_model.weight_only_bandwidth, fitted.cost_model.compute_efficiency) == (0.5, 0.3)


def test_turbomind_all_reduces_through_nccl_under_its_guard():
    """TurboMind (lmdeploy, v0.1.0a1 and v0.6.0a0 alike, until lmdeploy#3163) all-reduces through NCCL, not a custom
    kernel: vllm#2192 measured NCCL 1.80 s / (255 x 160) and 1.50 s / (255 x 120) slower per all-reduce than its custom
    kernel (Llama-70B TP 4, 33B TP 2, A100), 44.1 and 49.0 us, the mean 46.6 us on top of the cost model's 10 us. A
    70B decode step at TP 4 (80 layers, two all-reduces each) takes 160 x 46.6 us longer than the same step under
    vLLM's custom kernel would; at TP 1 there is no all-reduce and no knob."""
    from sim.engines.lmdeploy import TURBOMIND_NCCL_OVER_CUSTOM_S

    assert TURBOMIND_NCCL_OVER_CUSTOM_S == pytest.approx(46.57e-6, abs=0.01e-6)
    dep = {"model": "llama-2-70b", "gpu": "a100-80gb", "tensor_parallel_size": 4}
    lmd = {v: _built({**dep, "engine": {"name": "lmdeploy", "version": v}})[2] for v in ("0.1", "0.6")}
    for cost in lmd.values():
        assert cost.allreduce_latency == pytest.approx(10e-6 + TURBOMIND_NCCL_OVER_CUSTOM_S, rel=1e-12)
    plain = dataclasses.replace(lmd["0.6"], allreduce_latency=10e-6)
    shape = StepShape(8, 8, 8, 8000, 8000)
    assert lmd["0.6"].step_time(shape) - plain.step_time(shape) == pytest.approx(
        160 * TURBOMIND_NCCL_OVER_CUSTOM_S, rel=1e-9)
    assert _built({**dep, "engine": {"name": "sglang"}})[2].allreduce_latency == 10e-6
    one = {"model": "llama-2-7b", "gpu": "a100-80gb", "engine": {"name": "lmdeploy"}}
    assert _built(one)[2].allreduce_latency == 10e-6


def test_tensorrt_llm_decode_gemms_overlap_their_weight_reads_as_profiled():
    """TensorRT-LLM's decode step runs its linear layers at Vidur's profiled overlap (sim/engines/tensorrt_llm.py):
    the step is the roofline's max plus 0.44 of the smaller side, 0.44 of the way from the max (the classic model)
    to the sum (vLLM V1's). Llama-3.1-70B at TP 4 on A100s, 128 rows: compute and weight reads nearly equal."""
    from sim.engines.tensorrt_llm import TRTLLM_LINEAR_OVERLAP

    assert TRTLLM_LINEAR_OVERLAP == 0.56
    dep = {"model": "llama-3.1-70b", "gpu": "a100-80gb", "tensor_parallel_size": 4}
    trt = _built({**dep, "engine": "tensorrt-llm"})[2]
    assert trt.linear_overlap == TRTLLM_LINEAR_OVERLAP
    shape = StepShape(128, 128, 128, 128 * 1000, 128 * 1000)
    roof, summed = (dataclasses.replace(trt, linear_overlap=o).step_time(shape) for o in (1.0, 0.0))
    assert summed - roof > 0.01  # 128 rows' compute (~12 ms) is most of the weight reads' time
    assert trt.step_time(shape) - roof == pytest.approx((1 - TRTLLM_LINEAR_OVERLAP) * (summed - roof), rel=1e-9)
    # a prompt's tokens beyond one a row keep the roofline's max; the engine's other presets keep theirs
    assert _built({**dep, "engine": "sglang"})[2].linear_overlap == 1.0
