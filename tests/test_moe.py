"""Mixtures of experts (sim/hardware/moe.py): Mixtral-8x7B's parameters and the weights one step reads, by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import parse_scenario, variant_configs
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.hardware.gpu import resolve_gpu
from sim.hardware.models import ModelSpec
from sim.hardware.moe import expected_experts
from sim.loop.run import simulate_variant

H, L, HEADS, KV, HD, INTER, E, K, V = 4096, 32, 32, 8, 128, 14336, 8, 2, 32000  # mistralai/Mixtral-8x7B-v0.1
ATTN = H * (HEADS + 2 * KV) * HD + HEADS * HD * H  # q, k, v and o of one layer
ROUTER = H * E
EXPERT = 3 * H * INTER  # gate, up, down of one expert
NORMS = 2 * H  # two RMSNorms per layer


def test_mixtral_8x7b_parameters_by_hand() -> None:
    m = ModelSpec.from_name("mixtral-8x7b")
    total = L * (ATTN + ROUTER + E * EXPERT + NORMS) + 2 * V * H + H  # + embedding, LM head, final norm
    assert m.num_params == total == 46_702_792_704  # the model card's 46.7 B
    active = L * (ATTN + ROUTER + K * EXPERT) + V * H  # what one token's matmuls pass through (LM head included)
    assert m.matmul_params == active  # 12.75 B (+ 0.13 B embedding = the card's 12.9 B active)
    assert m.flops_per_token == 2 * active
    assert m.weight_bytes("bf16") == 2 * total
    s = m.shard(2)  # each expert's intermediate width split over 2 GPUs, the router replicated
    assert s.expert_params == 3 * H * (INTER // 2)


def test_config_json_reads_the_experts() -> None:
    cfg = {"model_type": "mixtral", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": HEADS,
           "num_key_value_heads": KV, "intermediate_size": INTER, "vocab_size": V, "max_position_embeddings": 32768,
           "num_local_experts": E, "num_experts_per_tok": K, "sliding_window": None, "rope_theta": 1e6}
    assert ModelSpec.from_hf_config(cfg).num_params == ModelSpec.from_name("mixtral-8x7b").num_params


def test_expected_distinct_experts() -> None:
    assert expected_experts(E, K, 1) == 2.0  # one token: exactly its k experts
    assert expected_experts(E, K, 2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert expected_experts(E, K, 200) == pytest.approx(8.0)  # a big batch touches every expert
    arr = expected_experts(E, K, np.array([1, 2, 200]))
    assert list(arr) == [expected_experts(E, K, n) for n in (1, 2, 200)]  # arrays round as scalars


@pytest.mark.parametrize("tokens", [1, 2, 16, 256])
def test_weights_a_step_reads_by_hand(tokens: int) -> None:
    """The memory side of the linear layers for a decode of ``tokens`` rows (it bounds them: a decode is
    memory-bound): the attention, router, norms and LM head every step, plus 8 (1 - (3/4)^T) experts per layer,
    all in bf16, at 0.8 of the H100's 3.35 TB/s."""
    cm = AnalyticCostModel("mixtral-8x7b", "h100-sxm")
    bw = resolve_gpu("h100-sxm").mem_bandwidth * 0.8
    dense = (L * (ATTN + ROUTER) + V * H + L * NORMS + H) * 2
    experts = 8 * (1 - 0.75**tokens) * L * EXPERT * 2
    # plus the activations in and out of each matmul (a token's through its 2 experts) and the fp32 logits
    act_token = L * (H + (HEADS + 2 * KV) * HD + HEADS * HD + H + (H + 2 * INTER + INTER + H) * K) * 2
    act_row = H * 2 + V * 4
    shape = StepShape(tokens, tokens, tokens, tokens * 100, tokens * 100)
    linear = float(cm.breakdown(shape)["linear"])
    assert linear == pytest.approx((dense + experts + tokens * (act_token + act_row)) / bw, rel=1e-9)


def test_moe_fast_path_is_step_by_step_exactly() -> None:
    raw = {"name": "t", "seed": 1, "workload": {"arrival": {"type": "poisson", "rate": 20}, "num_requests": 40,
                                                "prompt_len": {"type": "uniform", "low": 50, "high": 400},
                                                "output_len": {"type": "uniform", "low": 20, "high": 200}},
           "deployment": {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tensor_parallel_size": 2,
                          "max_model_len": 1024}}
    sc = parse_scenario(raw, "t")
    cfg = variant_configs(sc)[0]
    wl = sc.workload.generate(np.random.default_rng(0))
    fast, _, _ = simulate_variant(cfg, wl, fast_path=True)
    slow, _, _ = simulate_variant(cfg, wl, fast_path=False)
    assert [(r.first_token, r.finish) for r in fast.requests] == [(r.first_token, r.finish) for r in slow.requests]


def test_unmodelled_moe_config_exits_2_naming_the_field(tmp_path) -> None:
    cfg = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512,
           "num_local_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(app, ["capacity", "--model", str(tmp_path / "config.json"), "--gpu", "h100",
                                   "--context", "256"])
    assert res.exit_code == 2 and "n_shared_experts = 1" in res.output and "Traceback" not in res.output
