"""deployment.engine: each engine's KV memory rule and admission rule against hand computations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import apply_override, parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.hardware.dtypes import GiB
from sim.hardware.gpu import resolve_gpu
from sim.hardware.kv_budget import estimate_activation_reserve
from sim.hardware.models import ModelSpec
from sim.loop.build import build
from sim.policies import ContinuousPolicy, Limits
from sim.serving.block_manager import PagedBlockManager
from sim.serving.request import Outcome, RequestSpec
from tests.conftest import ConstCost, simulate

MML = 1024  # max_model_len of the deployments below
WL = {"arrival": {"type": "all_at_once"}, "num_requests": 2, "prompt_len": {"type": "fixed", "value": 100},
      "output_len": {"type": "fixed", "value": 10}}
KV_BYTES_PER_TOKEN_70B_FP8 = 2 * 80 * 8 * 128 * 1  # K and V x layers x KV heads x head_dim x 1 byte


def _built(engine, policy=None, **dep):
    raw = {"name": "t", "workload": WL,
           "deployment": {"model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8",
                          "max_model_len": MML, **dep}}
    if engine is not None:
        raw["deployment"]["engine"] = engine
    if policy is not None:
        raw["policy"] = policy
    cfg = variant_configs(parse_scenario(raw, "t"))[0]
    return build(cfg)


def _weights() -> int:
    return ModelSpec.from_name("llama-3.1-70b").shard(1).weight_bytes("fp8")


def test_vllm_v1_budget_and_scheduler_defaults() -> None:
    policy, _, _, b = _built("vllm-v1")
    total = resolve_gpu("h100-sxm").memory_bytes
    # vLLM v1 on an 80 GB H100 (API server): 8192 batched tokens, 1024 sequences, chunked prefill on
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (8192, 1024)
    assert policy.enable_chunked_prefill and not policy.no_evict
    reserve = estimate_activation_reserve("llama-3.1-70b", weight_dtype="fp8", max_num_batched_tokens=8192,
                                          max_num_seqs=1024)
    kv = int(0.9 * total) - _weights() - reserve
    assert b.budget.kv_memory == kv
    assert b.budget.num_gpu_blocks == kv // (16 * KV_BYTES_PER_TOKEN_70B_FP8)


def test_vllm_v1_offline_and_small_gpu() -> None:
    policy, *_ = _built({"name": "vllm-v1", "usage_context": "offline"}, model="llama-3.1-8b", weight_dtype="bf16",
                        kv_dtype="auto")
    assert policy.limits.max_num_batched_tokens == 16384
    raw = {"name": "t", "workload": WL,
           "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "engine": "vllm-v1", "max_model_len": MML}}
    policy, *_ = build(variant_configs(parse_scenario(raw, "t"))[0])
    # vLLM keeps an A100 on the small defaults (PR #17885): 2048 tokens, 256 sequences
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (2048, 256)


def test_tensorrt_llm_free_fraction_and_no_evict() -> None:
    policy, _, _, b = _built("tensorrt-llm")
    total = resolve_gpu("h100-sxm").memory_bytes
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (8192, 2048)
    assert policy.no_evict and not policy.enable_chunked_prefill and policy.prefill_mode == "mixed"
    reserve = estimate_activation_reserve("llama-3.1-70b", weight_dtype="fp8", max_num_batched_tokens=8192,
                                          max_num_seqs=2048)
    kv = math.floor(0.9 * (total - _weights() - reserve))
    assert b.budget.kv_memory == kv
    assert b.budget.num_gpu_blocks == kv // (16 * KV_BYTES_PER_TOKEN_70B_FP8)
    # what the fraction leaves is far more than vLLM's rule leaves for fp8 70B on one 80 GB GPU
    assert b.budget.num_gpu_blocks > 5 * _built("vllm-v1")[3].budget.num_gpu_blocks
    _, _, _, b95 = _built({"name": "tensorrt-llm", "kv_cache_free_gpu_mem_fraction": 0.95})
    assert b95.budget.kv_memory == math.floor(0.95 * (total - _weights() - reserve))


def test_sglang_static_fraction_and_request_pool() -> None:
    policy, _, _, b = _built("sglang")
    total = resolve_gpu("h100-sxm").memory_bytes
    kv = math.floor(0.88 * total) - _weights() - 1 * GiB  # tp 1: mem_fraction_static 0.88
    assert b.budget.kv_memory == kv
    blocks = kv // (16 * KV_BYTES_PER_TOKEN_70B_FP8)
    assert b.budget.num_gpu_blocks == blocks
    assert policy.enable_chunked_prefill and policy.limits.max_num_batched_tokens == 8192
    assert policy.limits.max_num_seqs == int(min(max(blocks * 16 / MML * 512, 2048), 4096))
    _, _, _, b2 = _built("sglang", tensor_parallel_size=4)  # tp 4: 0.85
    w4 = ModelSpec.from_name("llama-3.1-70b").shard(4).weight_bytes("fp8")
    assert b2.budget.kv_memory == math.floor(0.85 * total) - w4 - 1 * GiB


def test_lmdeploy_free_fraction_and_persistent_batch() -> None:
    """TurboMind (LMDeploy 0.6.0a0): 0.8 of what is free after the weights and the runtime's 1 GiB; every step may
    hold 8192 prompt tokens beside its 128 sequences' decodes; preempts (recomputes) rather than reserving."""
    policy, _, _, b = _built("lmdeploy")
    total = resolve_gpu("h100-sxm").memory_bytes
    kv = math.floor(0.8 * (total - _weights() - 1 * GiB))
    assert b.budget.kv_memory == kv
    assert b.budget.num_gpu_blocks == kv // (16 * KV_BYTES_PER_TOKEN_70B_FP8)
    assert policy.enable_chunked_prefill and not policy.no_evict
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (8192 + 128, 128)
    _, _, _, b6 = _built({"name": "lmdeploy", "cache_max_entry_count": 0.6})
    assert b6.budget.kv_memory == math.floor(0.6 * (total - _weights() - 1 * GiB))
    with pytest.raises(ScenarioError, match="cache_max_entry_count is lmdeploy's"):
        _built({"name": "vllm-v1", "cache_max_entry_count": 0.6})
    with pytest.raises(ScenarioError, match="mem_fraction_static is sglang's; engine lmdeploy sizes its KV cache "
                                            "with cache_max_entry_count"):
        _built({"name": "lmdeploy", "mem_fraction_static": 0.8})


def test_lmdeploy_01_prefills_every_admitted_prompt_whole_in_one_step() -> None:
    """TurboMind v0.1.0a1's ContextDecode() runs all the loop's new prompts (sub-batches of max_context_token_num x
    session_len) before its one Generate(): no step budget below every sequence's context, no chunking."""
    policy, *_ = _built({"name": "lmdeploy", "version": "0.1"})
    assert not policy.enable_chunked_prefill
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (128 * MML, 128)
    policy, *_ = _built({"name": "lmdeploy", "version": "0.1"}, {"type": "continuous", "max_num_batched_tokens": 4096})
    assert policy.limits.max_num_batched_tokens == 4096  # the scenario's own budget stands


def test_tgi_wiggle_room_no_evict_and_small_graphs() -> None:
    """TGI 2.2: 95% of what the weights and a warm-up prefill of its budget (max_input_tokens 4095 + 50) leave; a
    request's whole prompt + max_new_tokens reserved (never preempts); prefills apart; graphs up to 32."""
    policy, _, _, b = _built("tgi")
    total = resolve_gpu("h100-sxm").memory_bytes
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (4095 + 50, 128)
    assert policy.no_evict and not policy.enable_chunked_prefill and policy.prefill_mode == "prefill_first"
    assert policy.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 32)
    reserve = estimate_activation_reserve("llama-3.1-70b", weight_dtype="fp8", max_num_batched_tokens=4145,
                                          max_num_seqs=128)
    kv = math.floor(0.95 * (total - _weights() - reserve))
    assert b.budget.kv_memory == kv
    assert b.budget.num_gpu_blocks == kv // (16 * KV_BYTES_PER_TOKEN_70B_FP8)
    policy, *_ = _built("tgi", max_model_len=16384)  # longer prompts: --max-input-tokens raised, the budget too
    assert policy.limits.max_num_batched_tokens == 16383 + 50
    policy, *_ = _built({"name": "tgi", "enforce_eager": True})
    assert policy.cudagraph_capture_sizes == ()
    # TGI reads no memory key at all: the refusal of another engine's names TGI's own rule, not vLLM's key
    with pytest.raises(ScenarioError, match="engine tgi sizes its KV cache with 0.95 of the memory free after "
                                            "its warm-up prefill"):
        _built({"name": "tgi", "cache_max_entry_count": 0.5})


def test_tgi_max_input_tokens_bounds_the_prompt_apart() -> None:
    """TGI's --max-input-tokens bounds a prompt under --max-total-tokens (max_model_len): its prefill budget is
    max_input_tokens + 50, which a prompt never passes, so max_model_len may exceed it (dstack's MI300X server:
    125000 under 130000); a longer prompt is refused on arrival, as TGI's router answers it with an error."""
    policy, *_ = _built({"name": "tgi", "max_input_tokens": 900})
    assert (policy.limits.max_prompt_len, policy.limits.max_num_batched_tokens, policy.limits.max_model_len) == (
        900, 950, MML)
    # the same budget without the bound is refused: a whole sequence of max_model_len could not be prefilled
    with pytest.raises(ScenarioError, match="max_model_len 1024 exceeds max_num_batched_tokens 950"):
        _built("tgi", policy={"type": "continuous", "max_num_batched_tokens": 950})
    # TGI's launcher refuses max_input_tokens >= max_total_tokens; the other engines have no such key
    with pytest.raises(ScenarioError, match="deployment.engine: max_input_tokens 1024 must be < max_model_len 1024"):
        _built({"name": "tgi", "max_input_tokens": 1024})
    with pytest.raises(ScenarioError, match="max_input_tokens is tgi's"):
        _built({"name": "vllm-v0", "max_input_tokens": 900})
    # a prompt of 900 runs, one of 901 (its output inside max_model_len) is refused on arrival
    lim = Limits(max_num_seqs=8, max_num_batched_tokens=950, max_model_len=MML, max_prompt_len=900)
    run = simulate([RequestSpec(0, 0.0, 900, 8), RequestSpec(1, 0.0, 901, 8)],
                   ContinuousPolicy(limits=lim, no_evict=True), PagedBlockManager(256, 16), cost=ConstCost())
    first, second = run.requests[0], run.requests[1]
    assert (first.outcome, second.outcome) == (Outcome.COMPLETED, Outcome.REJECTED)
    assert second.reason == "prompt 901 tokens exceeds the engine's max_input_tokens 900"
    # with preemption a recomputed sequence may be max_model_len long: the bound then does not lift the check
    with pytest.raises(ValueError, match="max_model_len 1024 exceeds max_num_batched_tokens 950"):
        ContinuousPolicy(limits=lim)


def test_vllm_v0_prefill_first_and_its_budget() -> None:
    policy, *_ = _built("vllm-v0")
    assert not policy.enable_chunked_prefill and policy.prefill_mode == "prefill_first"
    assert (policy.limits.max_num_batched_tokens, policy.limits.max_num_seqs) == (max(MML, 2048), 256)


@pytest.mark.parametrize(("engine", "gpu", "tp", "nvls"), [
    ("vllm-v0", "h100-sxm", 8, True), ("vllm-v1", "h200", 4, True), ("vllm-v0", "h100-sxm", 2, False),
    ("vllm-v1", "h100-nvl", 4, False), ("vllm-v0", "a100-80gb", 8, False), ("sglang", "h100-sxm", 8, False)])
def test_nccl_nvls_buffers_come_out_of_vllms_kv_cache(engine: str, gpu: str, tp: int, nvls: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm#9699: on NVSwitch Hopper machines NCCL's NVLS buffers (more than 2 GPUs) take about 4.95 GiB a GPU that
    vLLM's memory profile counts before it sizes the KV cache; not at TP 2, not on the H100 NVL (NVLink bridges, no
    NVSwitch) nor the A100 (no NVLS), not under SGLang (NVLS off by default, sgl-project/sglang#631). dstack's
    Llama-3.1-405B FP8 at TP 8 on 8x H100 SXM under vLLM 0.6: 226,944 tokens of KV before, 144,560 with it."""
    from sim.engines.base import NVLS_BYTES
    from sim.engines.vllm_v0 import VllmV0
    from sim.engines.vllm_v1 import VllmV1

    def kv() -> tuple[int, int]:
        raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 1,
                                         "prompt_len": {"type": "fixed", "value": 8},
                                         "output_len": {"type": "fixed", "value": 8}},
               "deployment": {"model": "llama-3.1-405b-fp8" if tp == 8 else "llama-3.1-70b", "gpu": gpu,
                              "tensor_parallel_size": tp, "weight_dtype": "fp8", "max_model_len": 91680,
                              "engine": engine}}
        budget = build(variant_configs(parse_scenario(raw, "t"))[0])[3].budget
        return budget.num_gpu_blocks, budget.kv_bytes_per_block

    blocks, per_block = kv()
    monkeypatch.setattr(VllmV0, "nccl_nvls", False)
    monkeypatch.setattr(VllmV1, "nccl_nvls", False)
    without, _ = kv()
    # floor(kv / block) less floor((kv - NVLS) / block): NVLS's whole blocks, or one more
    assert without - blocks in ((NVLS_BYTES // per_block, NVLS_BYTES // per_block + 1) if nvls else (0,))
    if (engine, gpu, tp) == ("vllm-v0", "h100-sxm", 8):
        assert (blocks * 16, without * 16) == (144_560, 226_944)


def test_policy_keys_win_over_the_engine() -> None:
    policy, *_ = _built("tensorrt-llm", policy={"type": "continuous", "max_num_seqs": 64,
                                               "capacity_scheduler_policy": "max_utilization"})
    assert policy.limits.max_num_seqs == 64 and not policy.no_evict
    policy, *_ = _built("vllm-v1", policy={"type": "continuous", "enable_chunked_prefill": False})
    assert not policy.enable_chunked_prefill and policy.limits.max_num_batched_tokens == 8192  # max(8192, 1024)


def test_a_key_of_another_engine_is_refused() -> None:
    with pytest.raises(ScenarioError, match="mem_fraction_static is sglang's"):
        _built({"name": "vllm-v1", "mem_fraction_static": 0.8})


@pytest.mark.parametrize(("engine", "rule"), [("tensorrt-llm", "kv_cache_free_gpu_mem_fraction"),
                                              ("sglang", "mem_fraction_static"),
                                              ("lmdeploy", "cache_max_entry_count"), ("tgi", "0.95 of the memory")])
def test_gpu_memory_utilization_under_an_engine_that_ignores_it_is_refused(engine: str, rule: str) -> None:
    """These engines size their KV cache by a rule of their own: a gpu_memory_utilization once changed nothing."""
    with pytest.raises(ScenarioError, match=f"gpu_memory_utilization 0.5 is vLLM's; engine {engine} sizes its KV "
                                            f"cache with {rule}"):
        _built(engine, gpu_memory_utilization=0.5)
    _built(engine, gpu_memory_utilization=0.9)  # the default's value, as a variant's dumped section holds it
    _, _, _, b = _built("vllm-v1", gpu_memory_utilization=0.95)  # read where the rule is vLLM's
    assert b.budget.gpu_memory_utilization == 0.95


def test_unknown_engine_exits_2_naming_it(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "workload": WL,
                                 "deployment": {"engine": "vllm-v9"}}))
    res = CliRunner().invoke(app, ["run", str(p), "-q", "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "deployment.engine" in res.output and "Traceback" not in res.output


def test_guaranteed_no_evict_against_max_utilization_by_hand() -> None:
    """8 blocks of 4 tokens; three requests at t=0 of 4 prompt + 8 output tokens (12 tokens = 3 blocks at the
    end); steps of 1 s. No-evict admits r0 and r1 (6 of 8 blocks promised; r2's 3 do not fit the 2 left): they
    prefill in step 1 (first token at t=1), decode 7 more tokens and finish at t=8; r2 then runs alone from t=8:
    first token at 9, finish at 16; nothing is ever preempted. Max-utilization admits all three at once (a block
    each) and must preempt when their third blocks are due."""
    specs = [RequestSpec(i, 0.0, 4, 8) for i in range(3)]
    lim = Limits(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=16)
    safe = simulate(specs, ContinuousPolicy(limits=lim, enable_chunked_prefill=True, no_evict=True),
                    PagedBlockManager(8, 4), cost=ConstCost())
    r = safe.requests
    assert [(r[i].first_token, r[i].finish) for i in range(3)] == [(1.0, 8.0), (1.0, 8.0), (9.0, 16.0)]
    assert sum(x.num_preemptions for x in r.values()) == 0
    greedy = simulate(specs, ContinuousPolicy(limits=lim, enable_chunked_prefill=True), PagedBlockManager(8, 4), cost=ConstCost())
    assert sum(x.num_preemptions for x in greedy.requests.values()) > 0
    # the fast path and step-by-step agree on the no-evict schedule
    slow = simulate(specs, ContinuousPolicy(limits=lim, enable_chunked_prefill=True, no_evict=True),
                    PagedBlockManager(8, 4), cost=ConstCost(), fast=False)
    assert [(x.first_token, x.finish) for x in slow.requests.values()] == \
        [(x.first_token, x.finish) for x in r.values()]


def test_no_engine_records_the_classic_config() -> None:
    raw = {"name": "t", "workload": WL, "deployment": {"max_model_len": MML}}
    cfg = variant_configs(parse_scenario(raw, "t"))[0]
    d = cfg.to_dict(build(cfg)[3].policy)
    assert "engine" not in d["deployment"] and "capacity_scheduler_policy" not in d["policy"]
    assert (d["policy"]["max_num_seqs"], d["policy"]["enable_chunked_prefill"], d["policy"]["prefill_mode"]) == \
        (256, False, "prefill_first")


def test_static_policy_hint_names_its_own_keys() -> None:
    raw = {"name": "t", "workload": WL, "policy": {"type": "static", "batch_size": 64},
           "kv_cache": {"type": "contiguous"},
           "deployment": {"model": "llama-3.1-70b", "gpu": "h100-sxm", "tensor_parallel_size": 2,
                          "max_model_len": 4096}}
    with pytest.raises(ScenarioError) as e:
        build(variant_configs(parse_scenario(raw, "t"))[0])
    msg = str(e.value)
    assert "policy.batch_size" in msg and "max_num_batched_tokens 262144" not in msg
    assert "enable_chunked_prefill" not in msg and "policy.max_num_batched_tokens" not in msg


def test_classic_pins_the_behaviour_of_no_engine() -> None:
    a = _built(None, policy={"type": "continuous"})
    b = _built("classic", policy={"type": "continuous"})
    assert (a[0].limits, a[0].enable_chunked_prefill, a[0].prefill_mode) == \
        (b[0].limits, b[0].enable_chunked_prefill, b[0].prefill_mode)
    assert a[3].budget == b[3].budget


def test_setting_a_key_of_an_engine_given_by_name_keeps_the_engine() -> None:
    """``engine: vllm-v0`` with ``--set deployment.engine.enforce_eager=true`` (or a sweep over that key): the
    bare name is spelled out as ``{name: vllm-v0}`` first; the key once replaced it, and the run went to vllm-v1
    (the default name) without a word. In a variant's own deployment alike."""
    raw = {"name": "t", "workload": WL, "deployment": {"engine": "vllm-v0"},
           "variants": [{"name": "a"}, {"name": "b", "deployment": {"engine": "tgi"}}]}
    apply_override(raw, "deployment.engine.enforce_eager", True)
    assert raw["deployment"]["engine"] == {"name": "vllm-v0", "enforce_eager": True}
    assert raw["variants"][1]["deployment"]["engine"] == {"name": "tgi", "enforce_eager": True}
    cfgs = variant_configs(parse_scenario(raw, "t"))
    assert [(c.deployment.engine.name, c.deployment.engine.enforce_eager) for c in cfgs] == [("vllm-v0", True),
                                                                                            ("tgi", True)]


def test_trtllm_bench_build_settings() -> None:
    # trtllm-bench's estimate, by hand: an H100's 81,559 MiB are 79.647 GiB; Llama-3.1-70B's 70,553,706,496
    # parameters at one byte count 70.554; a token's fp8 KV is 2 x 80 x 8 x 128 bytes = 1.526e-4 GiB
    from sim.engines.tensorrt_llm import trtllm_bench_build

    h100 = resolve_gpu("h100-sxm").memory_bytes
    m70, m8 = ModelSpec.from_name("llama-3.1-70b"), ModelSpec.from_name("llama-3.1-8b")
    # one GPU: 0.95 x 9.094 GiB hold 56,617 tokens, 26.0 sequences of 2,176: the floors, 64 and 2,048
    assert trtllm_bench_build(m70, 1, 128, 2048, 1, 1, h100) == (64, 2048)
    # four GPUs: 365.6 sequences of 4,224 -> 384 (a multiple of 128); 377 tokens -> 2,048
    assert trtllm_bench_build(m70, 4, 128, 4096, 1, 1, h100) == (384, 2048)
    # 8B: over 4,096 sequences of 256 fit, capped at 4,096; 8,192 tokens
    assert trtllm_bench_build(m8, 1, 128, 128, 1, 1, h100) == (4096, 8192)
