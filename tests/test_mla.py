"""DeepSeek-V2-Lite: MLA's KV bytes, the parameter counts with shared experts and a dense first layer, and what
a step reads, against hand computations (sim/hardware/mla.py)."""

from __future__ import annotations

import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.hardware.dtypes import GiB
from sim.hardware.gpu import resolve_gpu
from sim.hardware.kv_budget import kv_budget
from sim.hardware.models import ModelSpec
from sim.loop.build import build

H, L, HEADS, VOCAB = 2048, 27, 16, 102400
NOPE, ROPE, V, LORA = 128, 64, 128, 512
EXPERT = 3 * H * 1408  # one gated expert: gate, up, down
ATTN = H * HEADS * (NOPE + ROPE) + H * (LORA + ROPE) + LORA * HEADS * (NOPE + V) + HEADS * V * H


def test_kv_bytes_per_token():
    m = ModelSpec.from_name("deepseek-v2-lite")
    # one latent of 512 and one shared rotary key of 64 per layer; no K/V pair, no heads
    assert m.kv_bytes_per_token("bf16") == 27 * (512 + 64) * 2 == 31104
    assert m.kv_bytes_per_token("fp8") == 15552
    # vLLM keeps the latent whole on every GPU: tensor parallelism does not shrink it
    assert m.kv_elements_per_token(1) == m.kv_elements_per_token(2) == 27 * 576
    # the same model with ordinary attention would cache 2 x 16 heads x 192 per layer: 10.7x more
    assert 2 * L * HEADS * (NOPE + ROPE) * 2 / 31104 == pytest.approx(10.67, abs=0.01)


def test_parameter_counts():
    m = ModelSpec.from_name("deepseek-v2-lite")
    s = m.shard(1)
    dense_layer = ATTN + 3 * H * 10944
    moe_layer = ATTN + H * 64 + (64 + 2) * EXPERT  # router, 64 routed and 2 shared experts
    assert s.body_matmul_params == dense_layer + 26 * moe_layer
    assert s.num_moe_layers == 26 and s.num_experts == 64 and s.experts_per_tok == 6
    norms = L * (2 * H + LORA) + H  # two RMSNorms and the kv_a norm per layer, the final norm
    assert m.num_params == s.body_matmul_params + 2 * VOCAB * H + norms
    assert m.num_params / 1e9 == pytest.approx(15.71, abs=0.01)  # the paper: 15.7 B
    active = dense_layer + 26 * (ATTN + H * 64 + (6 + 2) * EXPERT)
    assert s.active_body_params == active
    assert (active + VOCAB * H) / 1e9 == pytest.approx(2.45, abs=0.01)  # the paper: 2.4 B activated
    # round trip through config.json
    assert ModelSpec.from_hf_config(m.to_hf_config(), name=m.name) == m


def test_tensor_parallel_shard():
    s = ModelSpec.from_name("deepseek-v2-lite").shard(2)
    attn = H * 8 * (NOPE + ROPE) + H * (LORA + ROPE) + LORA * 8 * (NOPE + V) + 8 * V * H  # kv_a replicated
    expert = 3 * H * 704
    assert s.body_matmul_params == (attn + 3 * H * 5472) + 26 * (attn + H * 64 + 66 * expert)


def test_kv_budget_and_step_by_hand():
    m, g = ModelSpec.from_name("deepseek-v2-lite"), resolve_gpu("h100-sxm")
    b = kv_budget(m, g, max_num_batched_tokens=8192, max_num_seqs=256)
    assert b.bytes_per_token == 31104
    assert b.num_gpu_blocks == b.kv_memory // (16 * 31104)
    weights = m.shard(1).weight_bytes("bf16")
    assert b.kv_memory == int(g.memory_bytes * 0.9) - weights - b.activation_reserve
    assert b.capacity_tokens == 16 * b.num_gpu_blocks == 1_405_696  # 40.7 GiB of KV at 30.4 KiB a token
    assert b.kv_memory / GiB == pytest.approx(40.72, abs=0.01)
    cost = AnalyticCostModel(m, g)
    # one decode row at 4,000 tokens of context: attention reads 4,001 tokens' latents
    parts = cost.breakdown(StepShape(1, 1, 1, 4000, 4000))
    assert float(parts["attention"]) == pytest.approx(4001 * 31104 / (g.mem_bandwidth * 0.8), rel=1e-12)
    # attention FLOPs per pair: QK over 192 and PV over 128 per head, 2 FLOPs a multiply-add
    assert m.attn_flops_per_pair == 2 * L * HEADS * (192 + 128)


def test_scenario_runs():
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 2,
                                     "prompt_len": {"type": "fixed", "value": 100},
                                     "output_len": {"type": "fixed", "value": 10}},
           "deployment": {"model": "deepseek-v2-lite", "gpu": "h100-sxm", "max_model_len": 4096,
                          "engine": "vllm-v1"}}
    built = build(variant_configs(parse_scenario(raw, "t"))[0])[3]
    assert built.budget.bytes_per_token == 31104


def test_experts_every_other_layer_refused():
    cfg = ModelSpec.from_name("deepseek-v2-lite").to_hf_config() | {"moe_layer_freq": 2}
    with pytest.raises(ValueError, match="moe_layer_freq = 2"):
        ModelSpec.from_hf_config(cfg)


def test_deepseek_v3_against_its_report() -> None:
    """DeepSeek-V3 (and R1, its shapes): 671 B parameters, 37 B active (arXiv 2412.19437), one latent of 512 and a
    rotary key of 64 cached per layer; DeepSeek-V2's layout read from a deepseek_v3 config.json."""
    m = ModelSpec.from_name("deepseek-v3")
    s = m.shard(1)
    assert m.num_params / 1e9 == pytest.approx(671.0, abs=0.5)
    assert (s.active_body_params + m.vocab_size * m.hidden_size) / 1e9 == pytest.approx(37.0, abs=0.5)
    assert s.num_moe_layers == 61 - 3 and s.num_experts == 256 and s.experts_per_tok == 8
    assert m.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2
    assert ModelSpec.from_name("DeepSeek-R1") == m
    assert ModelSpec.from_hf_config(m.to_hf_config(), name=m.name) == m
