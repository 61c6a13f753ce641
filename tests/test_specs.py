"""Model and GPU specs: exact parameter counts and KV bytes of real models, config round trips, KV budgets."""

from __future__ import annotations

import json
import re

import pytest

from sim.hardware.dtypes import (
    GiB,
    MiB,
    activation_dtype,
    canonical_dtype,
    dtype_bytes,
    kv_dtype_bytes,
    resolve_kv_dtype,
)
from sim.hardware.gpu import GPU_PRESETS, GPUSpec
from sim.hardware.kv_budget import (
    KVBudget,
    ModelDoesNotFitError,
    estimate_activation_reserve,
    kv_budget,
    max_concurrent_sequences,
)
from sim.hardware.models import MODEL_PRESETS, ModelSpec
from sim.hardware.presets.gpus import MORE_GPU_PRESETS

# (exact count from the shapes, published figure) ; the published figures are the rounded counts of the model
# cards and safetensors metadata.
PARAMS = {
    "llama-3.2-1b": (1_235_814_400, 1.24e9),
    "llama-3.1-8b": (8_030_261_248, 8.03e9),
    "llama-3.1-70b": (70_553_706_496, 70.6e9),
    "mistral-7b": (7_248_023_552, 7.25e9),
    "qwen2.5-7b": (7_615_616_512, 7.61e9),
    "opt-13b": (12_853_473_280, 12.85e9),
    "smollm2-135m": (134_515_008, 134.5e6),
}

KV_BYTES_BF16 = {  # 2 * layers * kv_heads * head_dim * 2
    "tiny": 2 * 2 * 2 * 16 * 2,
    "smollm2-135m": 2 * 30 * 3 * 64 * 2,
    "llama-3.2-1b": 2 * 16 * 8 * 64 * 2,
    "llama-3.1-8b": 131072,
    "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,
    "mistral-7b": 131072,
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,
    "opt-13b": 2 * 40 * 40 * 128 * 2,
}


# --- dtypes ---------------------------------------------------------------------------------------------------


def test_dtype_bytes() -> None:
    assert [dtype_bytes(d) for d in ("fp32", "bf16", "fp16", "fp8", "int8", "int4")] == [4, 2, 2, 1, 1, 0.5]
    assert canonical_dtype("BFloat16") == "bf16"
    assert canonical_dtype("float16") == "fp16"
    assert canonical_dtype("fp8_e4m3") == "fp8"
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("fp6")


def test_int4_is_weight_only() -> None:
    assert kv_dtype_bytes("fp8") == 1
    with pytest.raises(ValueError, match="weight-only"):
        kv_dtype_bytes("int4")
    with pytest.raises(ValueError, match="weight-only"):
        ModelSpec.from_name("tiny").kv_bytes_per_token("int4")
    with pytest.raises(ValueError, match="weight-only"):
        kv_budget("tiny", "l4", kv_dtype="int4")


def test_activation_and_auto_kv_dtype() -> None:
    assert activation_dtype("int4") == "bf16"
    assert activation_dtype("fp8") == "bf16"
    assert activation_dtype("fp16") == "fp16"
    assert resolve_kv_dtype("auto", "fp32") == "fp32"
    assert resolve_kv_dtype("auto", "int4") == "bf16"
    assert resolve_kv_dtype("fp8", "bf16") == "fp8"


# --- parameter counts and KV bytes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_param_counts(name: str) -> None:
    exact, published = PARAMS[name]
    n = ModelSpec.from_name(name).num_params
    assert n == exact
    assert n == pytest.approx(published, rel=0.005)


def test_llama_8b_count_by_hand() -> None:
    h, inter, layers, vocab, kv_dim = 4096, 14336, 32, 128256, 8 * 128
    per_layer = h * h + 2 * h * kv_dim + h * h + 3 * h * inter + 2 * h
    expected = 2 * vocab * h + layers * per_layer + h
    m = ModelSpec.from_name("llama-3.1-8b")
    assert m.num_params == expected
    # matmul params: everything but the embedding table and the norms; the LM head counts
    assert m.matmul_params == expected - vocab * h - (2 * layers + 1) * h
    assert m.flops_per_token == 2 * m.matmul_params
    assert m.attn_flops_per_pair == 4 * 32 * 32 * 128
    assert m.attention_flops(10) == 10 * m.attn_flops_per_pair


def test_tied_embeddings_counted_once_but_computed() -> None:
    m = ModelSpec.from_name("llama-3.2-1b")
    assert m.tie_word_embeddings
    untied = ModelSpec.from_hf_config({**m.to_hf_config(), "tie_word_embeddings": False})
    assert untied.num_params - m.num_params == 128256 * 2048
    assert untied.matmul_params == m.matmul_params  # the LM head is a matmul either way


def test_qwen_qkv_biases() -> None:
    m = ModelSpec.from_name("qwen2.5-7b")
    assert m.qkv_bias and not m.o_bias
    no_bias = ModelSpec.from_hf_config({**m.to_hf_config(), "model_type": "llama"})
    assert m.num_params - no_bias.num_params == 28 * (28 + 2 * 4) * 128


def test_opt_shape() -> None:
    m = ModelSpec.from_name("opt-13b")
    assert m.mlp == "plain" and m.norm == "layer" and m.num_key_value_heads == 40
    assert m.num_position_embeddings == 2048 + 2
    assert m.tie_word_embeddings


@pytest.mark.parametrize("name", sorted(KV_BYTES_BF16))
def test_kv_bytes_per_token(name: str) -> None:
    m = ModelSpec.from_name(name)
    assert m.kv_bytes_per_token("bf16") == KV_BYTES_BF16[name]
    assert m.kv_bytes_per_token("fp8") * 2 == KV_BYTES_BF16[name]
    assert m.kv_bytes_per_token("fp32") == 2 * KV_BYTES_BF16[name]


def test_weight_bytes() -> None:
    m = ModelSpec.from_name("llama-3.1-8b")
    s = m.shard(1)
    assert m.weight_bytes("bf16") == 2 * m.num_params
    assert m.weight_bytes("fp32") == 4 * m.num_params
    rest = m.num_params - s.body_matmul_params  # embeddings, LM head, norms stay bf16 when quantized
    assert m.weight_bytes("fp8") == s.body_matmul_params + 2 * rest
    assert m.weight_bytes("int4") == s.body_matmul_params // 2 + 2 * rest
    assert m.weight_bytes("int8") == m.weight_bytes("fp8")


def test_tiny_and_smollm_shapes() -> None:
    t = ModelSpec.from_name("tiny")
    assert (t.hidden_size, t.num_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (64, 2, 4, 2, 16)
    assert (t.intermediate_size, t.vocab_size, t.max_position_embeddings) == (128, 256, 2048)
    s = ModelSpec.from_name("smollm2-135m")
    assert (s.hidden_size, s.num_layers, s.num_attention_heads, s.num_key_value_heads, s.head_dim) == (576, 30, 9, 3, 64)
    assert s.tie_word_embeddings and s.vocab_size == 49152 and s.intermediate_size == 1536


# --- construction ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_hf_config_round_trip(name: str) -> None:
    m = ModelSpec.from_name(name)
    again = ModelSpec.from_hf_config(m.to_hf_config())
    assert again == m
    assert again.num_params == m.num_params


def test_from_hf_config_file_and_folder(tmp_path) -> None:
    cfg = dict(MODEL_PRESETS["llama-3.1-8b"], architectures=["LlamaForCausalLM"], torch_dtype="bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = ModelSpec.from_hf_config(tmp_path, name="x")
    b = ModelSpec.from_hf_config(tmp_path / "config.json", name="x")
    assert a == b
    assert a.num_params == PARAMS["llama-3.1-8b"][0]
    assert a.name == "x"


def test_missing_field_is_named() -> None:
    cfg = dict(MODEL_PRESETS["llama-3.1-8b"])
    del cfg["intermediate_size"]
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelSpec.from_hf_config(cfg)
    opt = dict(MODEL_PRESETS["opt-13b"])
    del opt["ffn_dim"]
    with pytest.raises(ValueError, match="ffn_dim"):
        ModelSpec.from_hf_config(opt)


def test_optional_fields_default_like_hf() -> None:
    cfg = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 512,
           "vocab_size": 1000, "max_position_embeddings": 512}
    m = ModelSpec.from_hf_config(cfg, name="mha")
    assert m.num_key_value_heads == 8 and m.head_dim == 32 and not m.tie_word_embeddings


def test_from_name() -> None:
    assert ModelSpec.from_name("Llama-3.1-8B") == ModelSpec.from_name("llama-3.1-8b")
    with pytest.raises(ValueError, match="presets: .*llama-3.1-8b"):
        ModelSpec.from_name("llama-9")


def test_invalid_shape() -> None:
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        ModelSpec(name="bad", hidden_size=64, num_layers=1, num_attention_heads=4, num_key_value_heads=3,
                  intermediate_size=128, vocab_size=10, max_position_embeddings=16)


# --- GPUs --------------------------------------------------------------------------------------------------------


def test_gpu_presets() -> None:
    assert set(GPU_PRESETS) >= {"h200", "h100-sxm", "a100-80gb", "a100-40gb", "l40s", "l4"}  # + sim/hardware/presets/gpus.py
    h100 = GPUSpec.from_name("H100-SXM")
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.peak("fp8") == pytest.approx(2 * 989.4e12, rel=1e-3)
    assert h100.mem_bandwidth == 3.35e12
    assert GPUSpec.from_name("a100-80gb").peak("fp8") == 0.0
    assert GPUSpec.from_name("h200").memory_bytes > GPUSpec.from_name("h100-sxm").memory_bytes
    for name, g in GPU_PRESETS.items():
        assert g.peak("bf16") > 0 and (g.price_per_hour > 0 or name in MORE_GPU_PRESETS)
    with pytest.raises(ValueError, match="presets"):
        GPUSpec.from_name("tpu-v5")


def test_custom_gpu() -> None:
    g = GPUSpec.from_dict({"name": "toy", "memory_bytes": 8 * GiB, "mem_bandwidth": 1e11,
                           "peak_flops": {"bfloat16": 1e13}, "pcie_bandwidth": 1e10})
    assert g.peak("bf16") == 1e13 and g.peak("fp16") == 1e13 and g.peak("fp8") == 0.0
    with pytest.raises(ValueError, match="unknown GPU field"):
        GPUSpec.from_dict({"name": "toy", "memory": 1})
    with pytest.raises(ValueError, match="lacks"):
        GPUSpec.from_dict({"name": "toy"})


# --- KV budget ---------------------------------------------------------------------------------------------------


def test_kv_budget_llama_8b_h100_by_hand() -> None:
    total = 81559 * MiB  # H100 SXM memory.total
    usable = int(total * 0.9)
    weights = 2 * 8_030_261_248
    # documented estimate: 8192 tokens * (4*hidden + 3*intermediate) * 2 B + 256 rows * vocab * 4 B * 2 + 1 GiB
    reserve = 8192 * (4 * 4096 + 3 * 14336) * 2 + 256 * 128256 * 4 * 2 + GiB
    per_block = 16 * 131072
    expected_blocks = (usable - weights - reserve) // per_block

    b = kv_budget("llama-3.1-8b", "h100-sxm", gpu_memory_utilization=0.9, weight_dtype="bf16", kv_dtype="bf16")
    assert isinstance(b, KVBudget)
    assert b.weight_bytes == weights
    assert b.activation_reserve == reserve
    assert b.kv_bytes_per_block == per_block and b.bytes_per_token == 131072
    assert b.num_gpu_blocks == expected_blocks == 27942
    assert b.capacity_tokens == 27942 * 16
    assert max_concurrent_sequences(b, 4096) == 27942 // 256
    assert max_concurrent_sequences(b, 4097) == 27942 // 257


def test_kv_budget_options() -> None:
    base = kv_budget("llama-3.1-8b", "h100-sxm")
    assert base.kv_dtype == "bf16"
    fp8 = kv_budget("llama-3.1-8b", "h100-sxm", kv_dtype="fp8")
    assert fp8.num_gpu_blocks in (2 * base.num_gpu_blocks, 2 * base.num_gpu_blocks + 1)
    fixed = kv_budget("llama-3.1-8b", "h100-sxm", activation_reserve_bytes=0)
    assert fixed.kv_memory == fixed.usable_memory - fixed.weight_bytes
    assert kv_budget("llama-3.1-8b", "h100-sxm", num_gpu_blocks_override=100).num_gpu_blocks == 100
    assert kv_budget("llama-3.1-8b", "h100-sxm", block_size=32).kv_bytes_per_block == 32 * 131072
    assert estimate_activation_reserve("llama-3.1-8b", max_num_batched_tokens=2048) < base.activation_reserve
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_budget("tiny", "l4", gpu_memory_utilization=1.5)


def test_70b_does_not_fit_on_one_l4() -> None:
    with pytest.raises(ModelDoesNotFitError) as err:
        kv_budget("llama-3.1-70b", "l4", weight_dtype="bf16")
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "131.42 GiB" in msg and "20.24 GiB" in msg  # needed, available
    assert "tensor_parallel_size=" in msg and "int4" in msg  # what would fit


def test_tensor_parallel_halves_weights() -> None:
    one = kv_budget("llama-3.1-8b", "h100-sxm", tensor_parallel_size=1)
    two = kv_budget("llama-3.1-8b", "h100-sxm", tensor_parallel_size=2)
    assert two.weight_bytes == pytest.approx(one.weight_bytes / 2, rel=1e-4)  # norms are replicated
    assert two.bytes_per_token == one.bytes_per_token // 2
    assert two.num_gpu_blocks > 2 * one.num_gpu_blocks * 0.99  # more room per GPU and half the KV per token


def test_tensor_parallel_replicates_kv_heads() -> None:
    m = ModelSpec.from_name("llama-3.1-8b")  # 8 KV heads
    assert m.shard(8).num_key_value_heads == 1
    assert m.shard(16).num_key_value_heads == 1  # replicated beyond 8 GPUs
    assert m.shard(1).stored_params == m.num_params
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        m.shard(3)


def test_seventy_b_fits_on_two_h100() -> None:
    b = kv_budget("llama-3.1-70b", "h100-sxm", tensor_parallel_size=2)
    assert b.num_gpu_blocks > 0
    with pytest.raises(ModelDoesNotFitError, match="tensor_parallel_size=2 with weight_dtype=bf16"):
        kv_budget("llama-3.1-70b", "h100-sxm", tensor_parallel_size=1)


# A config.json the spec would misread is refused, naming the field (issue 13: Mixtral read as 7.24 B dense).
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json (shape fields)
    "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
    "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
}


@pytest.mark.parametrize("change, field", [
    ({"n_shared_experts": 2}, "n_shared_experts = 2"),  # shared experts: not modelled
    ({"model_type": "llama"}, "num_local_experts = 8"),  # relabelled, still a mixture of experts
    ({"model_type": "mistral", "num_local_experts": None, "num_experts_per_tok": None, "sliding_window": 4096},
     "sliding_window = 4096"),  # Mistral-7B v0.1's window over a 32k context
    ({"model_type": "phi3", "num_local_experts": None, "num_experts_per_tok": None}, "model_type 'phi3'"),
    ({"model_type": "gemma2", "num_local_experts": None, "num_experts_per_tok": None}, "'sliding_window'"),
])
def test_config_the_spec_would_misread_is_refused(change: dict, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        ModelSpec.from_hf_config({**MIXTRAL_8X7B, **change})


def test_configs_it_represents_still_read() -> None:
    dense = {**MIXTRAL_8X7B, "model_type": "mistral", "num_local_experts": None, "num_experts_per_tok": None}
    assert ModelSpec.from_hf_config(dense).num_params > 7e9
    # Qwen2's config names a window it does not use; a window as long as the context is full attention
    assert ModelSpec.from_hf_config({**dense, "model_type": "qwen2", "sliding_window": 131072,
                                     "use_sliding_window": False})
    assert ModelSpec.from_hf_config({**dense, "sliding_window": 32768})


def test_refused_config_exits_2_naming_the_field(tmp_path) -> None:
    from typer.testing import CliRunner

    from sim.cli.main import app

    (tmp_path / "config.json").write_text(json.dumps({**MIXTRAL_8X7B, "model_type": "llama"}))
    res = CliRunner().invoke(app, ["capacity", "--model", str(tmp_path / "config.json"), "--gpu", "h100",
                                   "--context", "4096"])
    assert res.exit_code == 2, res.output
    assert "num_local_experts = 8: a mixture-of-experts model" in res.output and "Traceback" not in res.output
