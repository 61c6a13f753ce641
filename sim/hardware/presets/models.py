"""Model presets: the shape fields of each model's published Hugging Face config.json (the repository named
beside each). sim/hardware/models.py joins them into MODEL_PRESETS."""

from __future__ import annotations

from typing import Any

from sim.hardware.quant import meta_fp8

# The presets servesim started with (tests and notebooks use them).
BASE_MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {  # a test model small enough for a CPU
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    },
    # A CPU model whose steps look like a GPU's: about 57 M parameters (random weights), so that on one CPU thread
    # a step takes 5-50 ms and is dominated by the forward pass (matmuls, attention), not by Python, the way a
    # real model's step is on a GPU; tiny's 1 ms steps are mostly the host's bookkeeping. A small Llama shape:
    # 8 layers, hidden 512, grouped-query attention (8 query heads over 2 KV heads), a 32000-token vocabulary.
    "llama-57m": {
        "model_type": "llama", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 1536, "vocab_size": 32000, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    },
    "smollm2-135m": {  # HuggingFaceTB/SmolLM2-135M
        "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
    },
    "llama-3.2-1b": {  # meta-llama/Llama-3.2-1B
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": True, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
    "llama-3.1-8b": {  # meta-llama/Llama-3.1-8B
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
    "llama-3.1-70b": {  # meta-llama/Llama-3.1-70B
        "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
    "mistral-7b": {  # mistralai/Mistral-7B-v0.3 (v0.1 is the same shape with a 32000-token vocabulary)
        "model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32768,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5,
    },
    "qwen2.5-7b": {  # Qwen/Qwen2.5-7B
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
    },
    "opt-13b": {  # facebook/opt-13b
        "model_type": "opt", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
        "ffn_dim": 20480, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 5120,
        "do_layer_norm_before": True, "enable_bias": True, "tie_word_embeddings": True,
    },
}
BASE_MODEL_ALIASES = {
    "llama-3.2-1b-instruct": "llama-3.2-1b",
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "llama-3.1-70b-instruct": "llama-3.1-70b",
    "mistral-7b-v0.3": "mistral-7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b",
    "smollm2-135m-instruct": "smollm2-135m",
}


def _llama(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, ctx: int, theta: float,
           eps: float = 1e-5) -> dict[str, Any]:
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab,
            "max_position_embeddings": ctx, "tie_word_embeddings": False, "rope_theta": theta, "rms_norm_eps": eps}


def _qwen2(hidden: int, layers: int, heads: int, kv: int, inter: int, ctx: int = 131072,
           eps: float = 1e-6) -> dict[str, Any]:
    return {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": 152064,
            "max_position_embeddings": ctx, "tie_word_embeddings": False, "rope_theta": 1000000.0,
            "rms_norm_eps": eps}


MORE_MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "llama-7b": _llama(4096, 32, 32, 32, 11008, 32000, 2048, 10000.0, 1e-6),  # huggyllama/llama-7b (LLaMA 1)
    "llama-13b": _llama(5120, 40, 40, 40, 13824, 32000, 2048, 10000.0, 1e-6),  # huggyllama/llama-13b (LLaMA 1)
    "llama-2-7b": _llama(4096, 32, 32, 32, 11008, 32000, 4096, 10000.0),  # meta-llama/Llama-2-7b-hf
    "llama-2-13b": _llama(5120, 40, 40, 40, 13824, 32000, 4096, 10000.0),  # meta-llama/Llama-2-13b-hf
    "llama-2-70b": _llama(8192, 80, 64, 8, 28672, 32000, 4096, 10000.0),  # meta-llama/Llama-2-70b-hf
    "llama-3-8b": _llama(4096, 32, 32, 8, 14336, 128256, 8192, 500000.0),  # meta-llama/Meta-Llama-3-8B
    "llama-3-70b": _llama(8192, 80, 64, 8, 28672, 128256, 8192, 500000.0),  # meta-llama/Meta-Llama-3-70B
    "llama-3.3-70b": _llama(8192, 80, 64, 8, 28672, 128256, 131072, 500000.0),  # meta-llama/Llama-3.3-70B-Instruct
    "llama-3.1-405b": _llama(16384, 126, 128, 8, 53248, 128256, 131072, 500000.0),  # meta-llama/Llama-3.1-405B
    # meta-llama/Llama-3.1-405B-FP8: FP8 feed-forward layers, bf16 attention and first and last layers
    # (sim/hardware/quant.py); run it with weight_dtype fp8
    "llama-3.1-405b-fp8": meta_fp8(_llama(16384, 126, 128, 8, 53248, 128256, 131072, 500000.0)),
    "qwen2.5-14b": _qwen2(5120, 48, 40, 8, 13824, eps=1e-5),  # Qwen/Qwen2.5-14B
    "qwen2.5-32b": _qwen2(5120, 64, 40, 8, 27648, eps=1e-5),  # Qwen/Qwen2.5-32B
    "qwen2.5-72b": _qwen2(8192, 80, 64, 8, 29568, eps=1e-5),  # Qwen/Qwen2.5-72B
}

def _qwen3(hidden: int, layers: int, heads: int, kv: int, inter: int, tie: bool = False, **moe: int) -> dict[str, Any]:
    return {"model_type": "qwen3_moe" if moe else "qwen3", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 128, "intermediate_size": inter,
            "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": tie,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, **moe}


def _mixtral(hidden: int, layers: int, heads: int, inter: int, ctx: int) -> dict[str, Any]:
    return {"model_type": "mixtral", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": 8, "intermediate_size": inter, "vocab_size": 32000, "max_position_embeddings": ctx,
            "tie_word_embeddings": False, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "num_local_experts": 8,
            "num_experts_per_tok": 2}


def _gemma2(hidden: int, layers: int, heads: int, kv: int, head_dim: int, inter: int) -> dict[str, Any]:
    return {"model_type": "gemma2", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": head_dim, "intermediate_size": inter, "vocab_size": 256000,
            "max_position_embeddings": 8192, "sliding_window": 4096, "tie_word_embeddings": True,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-6}


MORE_MODEL_PRESETS.update({
    "qwen3-0.6b": _qwen3(1024, 28, 16, 8, 3072, tie=True),  # Qwen/Qwen3-0.6B (nano-vllm's benchmark model)
    "qwen3-1.7b": _qwen3(2048, 28, 16, 8, 6144, tie=True),  # Qwen/Qwen3-1.7B
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728, tie=True),  # Qwen/Qwen3-4B
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288),  # Qwen/Qwen3-8B
    "qwen3-14b": _qwen3(5120, 40, 40, 8, 17408),  # Qwen/Qwen3-14B
    "llama-3.2-3b": {  # meta-llama/Llama-3.2-3B
        "model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": True, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
    "qwen3-32b": _qwen3(5120, 64, 64, 8, 25600),  # Qwen/Qwen3-32B
    # mixtures of experts (sim/hardware/moe.py)
    "qwen3-30b-a3b": _qwen3(2048, 48, 32, 4, 6144, num_experts=128, num_experts_per_tok=8,
                            moe_intermediate_size=768),  # Qwen/Qwen3-30B-A3B
    "mixtral-8x7b": _mixtral(4096, 32, 32, 14336, 32768),  # mistralai/Mixtral-8x7B-v0.1
    "mixtral-8x22b": _mixtral(6144, 56, 48, 16384, 65536),  # mistralai/Mixtral-8x22B-v0.1
    # google/gemma-2-9b and google/gemma-2-27b (their config.json): local layers of a 4,096-token window
    # alternating with global ones over 8,192 (sim/hardware/window.py); tied embeddings
    "gemma-2-9b": _gemma2(3584, 42, 16, 8, 256, 14336),
    "gemma-2-27b": _gemma2(4608, 46, 32, 16, 128, 36864),
    # deepseek-ai/DeepSeek-V2-Lite (its config.json; DeepSeek-V2 paper, arXiv 2405.04434, appendix B: 27 layers,
    # hidden 2048, 16 heads, KV latent 512 + decoupled rotary key 64, queries not compressed, every layer but the
    # first MoE with 2 shared + 64 routed experts of 1408, 6 routed per token; 15.7 B parameters, 2.4 B active).
    # MLA: sim/hardware/mla.py
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
        "num_key_value_heads": 16, "intermediate_size": 10944, "vocab_size": 102400,
        "max_position_embeddings": 163840, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    },
    # deepseek-ai/DeepSeek-V3 (its config.json; DeepSeek-V3 technical report, arXiv 2412.19437: 61 layers, hidden
    # 7168, 128 heads, KV latent 512 + rotary key 64, queries through a 1536 latent, the first 3 layers dense, then
    # 1 shared + 256 routed experts of 2048, 8 routed per token; 671 B parameters, 37 B active). DeepSeek-R1 has its
    # shapes. Its multi-token-prediction layer (num_nextn_predict_layers 1, 14 B more in the checkpoint) is left out:
    # it runs only as a draft model.
    "deepseek-v3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "intermediate_size": 18432, "vocab_size": 129280,
        "max_position_embeddings": 163840, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    },
})
MORE_MODEL_ALIASES = {"deepseek-r1": "deepseek-v3", "deepseek-v3-0324": "deepseek-v3",
                      "deepseek-r1-0528": "deepseek-v3",
                      # the R1 distillations are their base models' shapes (their config.json files)
                      "deepseek-r1-distill-llama-8b": "llama-3.1-8b", "deepseek-r1-distill-llama-70b": "llama-3.3-70b",
                      "deepseek-r1-distill-qwen-14b": "qwen2.5-14b", "deepseek-r1-distill-qwen-32b": "qwen2.5-32b",
                      "llama-3.3-70b-instruct": "llama-3.3-70b", "deepseek-v2-lite-chat": "deepseek-v2-lite",
                      "mixtral-8x7b-v0.1": "mixtral-8x7b",
                      "meta-llama-3-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b"}
