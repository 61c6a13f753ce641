"""Quantized checkpoints that leave matmuls unconverted (sim/hardware/quant.py): Meta's Llama-3.1-405B-FP8 keeps
every layer's attention and the first and last layers' MLP in bf16."""

from __future__ import annotations

import pytest

from sim.costs.analytic import AnalyticCostModel
from sim.hardware.dtypes import GiB
from sim.hardware.kv_budget import kv_budget
from sim.hardware.models import ModelSpec, resolve_model
from sim.hardware.names import match_model
from sim.hardware.quant import modules_not_converted, unquantized_layers

H, LAYERS, TP = 16384, 126, 8
ATTN = (2 * H * H + 2 * H * 1024) // TP  # q, o and the 8 KV heads' k, v of one layer on one of 8 GPUs
MLP = 3 * H * 53248 // TP


def test_meta_fp8_weights_are_what_vllm_loaded():
    """vLLM 0.6.3 logged 56.7677 GiB of weights on each of 8 H100s for meta-llama/Llama-3.1-405B-FP8; every matmul
    in FP8 would be 47.7 GiB."""
    meta, plain = resolve_model("llama-3.1-405b-fp8"), resolve_model("llama-3.1-405b")
    assert (meta.unquantized_attention_layers, meta.unquantized_mlp_layers) == (LAYERS, 2)
    s = meta.shard(TP)
    assert s.unquantized_params == LAYERS * ATTN + 2 * MLP
    # one more byte for each unconverted weight, resident and read every step
    assert s.weight_bytes("fp8") - plain.shard(TP).weight_bytes("fp8") == s.unquantized_params
    assert s.weight_bytes_read_per_step("fp8") - plain.shard(TP).weight_bytes_read_per_step("fp8") == \
        s.unquantized_params
    assert s.weight_bytes("fp8") / GiB == pytest.approx(56.7677, rel=2e-3)
    assert plain.shard(TP).weight_bytes("fp8") / GiB == pytest.approx(47.74, abs=0.01)
    # bf16 weights: nothing is converted, nothing changes
    assert s.weight_bytes("bf16") == plain.shard(TP).weight_bytes("bf16")
    # the KV cache gets what the weights leave
    kv = {m: kv_budget(m, "h100-sxm", weight_dtype="fp8", kv_dtype="bf16", tensor_parallel_size=TP,
                       max_num_batched_tokens=512) for m in (meta, plain)}
    assert kv[plain].kv_memory - kv[meta].kv_memory == s.unquantized_params


def test_unconverted_matmuls_compute_at_the_activation_rate():
    meta = AnalyticCostModel("llama-3.1-405b-fp8", "h100-sxm", weight_dtype="fp8", tensor_parallel_size=TP)
    plain = AnalyticCostModel("llama-3.1-405b", "h100-sxm", weight_dtype="fp8", tensor_parallel_size=TP)
    s = meta.model.shard(TP)
    fp8, bf16 = (1 / (meta.gpu.peak(d) * meta.compute_efficiency) for d in ("fp8", "bf16"))
    assert meta._k[2] == pytest.approx(2 * ((s.active_body_params - s.unquantized_params) * fp8
                                            + s.unquantized_params * bf16), rel=1e-12)
    assert plain._k[2] == pytest.approx(2 * s.active_body_params * fp8, rel=1e-12)
    assert meta._k[4] > plain._k[4]  # more bytes read every step
    as_bf16 = [AnalyticCostModel(m, "h100-sxm", weight_dtype="bf16", tensor_parallel_size=TP)._k
               for m in ("llama-3.1-405b-fp8", "llama-3.1-405b")]
    assert as_bf16[0] == as_bf16[1]


def test_config_json_modules_to_not_convert():
    cfg = resolve_model("llama-3.1-405b-fp8").to_hf_config()
    assert ModelSpec.from_hf_config(cfg) == resolve_model("llama-3.1-405b-fp8")
    names = modules_not_converted(3, 2, 10)
    assert unquantized_layers({"quantization_config": {"modules_to_not_convert": names + ["lm_head"]}}, 10, "x") \
        == (3, 2)
    assert {n.split(".")[2] for n in names if ".mlp." in n} == {"0", "9"}  # the first and the last layer
    assert unquantized_layers({}, 10, "x") == (0, 0)
    with pytest.raises(ValueError, match="list of module names"):
        unquantized_layers({"quantization_config": {"modules_to_not_convert": "lm_head"}}, 10, "x")
    with pytest.raises(ValueError, match="past the 10 layers"):
        unquantized_layers({"quantization_config": {"modules_to_not_convert": ["model.layers.10.mlp.up_proj"]}},
                           10, "x")
    assert match_model("meta-llama/Llama-3.1-405B-FP8") == "llama-3.1-405b-fp8"
    assert match_model("amd/Llama-3.1-405B-Instruct-FP8-KV") == "llama-3.1-405b"  # Quark: every matmul FP8

