"""DeepSeek-V2's multi-head latent attention (MLA) and its MoE layout, as ``sim.hardware.models.ModelSpec`` counts them.

MLA (DeepSeek-V2 paper, arXiv 2405.04434, section 2.1; Hugging Face ``modeling_deepseek.py``) caches, per token
and layer, one compressed latent of ``kv_lora_rank`` values plus one shared rotary key of ``qk_rope_head_dim``:
no heads, no factor 2 for K and V. vLLM's MLA backends keep that latent whole on every tensor-parallel GPU (its
KV cache has one "head" of ``kv_lora_rank + qk_rope_head_dim``), so the KV bytes per token do not shrink with tp:

    KV bytes per token = num_layers x (kv_lora_rank + qk_rope_head_dim) x bytes per element

The weights of one layer's attention (q not compressed when ``q_lora_rank`` is 0, as in V2-Lite):

    q_proj      hidden x heads x (qk_nope_head_dim + qk_rope_head_dim)     (or q_a: hidden x q_lora_rank,
                                                                             q_b: q_lora_rank x heads x (...))
    kv_a_proj   hidden x (kv_lora_rank + qk_rope_head_dim)                 (replicated over tp)
    kv_b_proj   kv_lora_rank x heads x (qk_nope_head_dim + v_head_dim)
    o_proj      heads x v_head_dim x hidden

MoE layout: the first ``first_k_dense_replace`` layers keep a dense MLP of ``intermediate_size``; the others hold
``n_routed_experts`` routed experts (top ``num_experts_per_tok``) plus ``n_shared_experts`` shared ones that every
token passes through, each a gated MLP of ``moe_intermediate_size`` (vLLM builds the shared ones as one MLP of
``n_shared_experts x moe_intermediate_size``).
"""

from __future__ import annotations

from typing import Any


def mla_attention_params(m: Any, tp: int) -> tuple[int, int]:
    """(matmul weights, norm weights) of one MLA layer's attention on one of ``tp`` GPUs."""
    h, heads = m.hidden_size, m.num_attention_heads // tp
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank:
        q = h * m.q_lora_rank + m.q_lora_rank * heads * qk
        norms = m.q_lora_rank + m.kv_lora_rank
    else:
        q = h * heads * qk
        norms = m.kv_lora_rank
    kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
    kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    o = heads * m.v_head_dim * h
    return q + kv_a + kv_b + o, norms


def mla_kv_elements_per_token(m: Any) -> int:
    """KV elements one token caches over all layers on each GPU (the latent is not split by tp)."""
    return m.num_layers * (m.kv_lora_rank + m.qk_rope_head_dim)


def mla_attn_flops_per_pair(m: Any, heads: int) -> int:
    """Attention FLOPs per causal query-key pair over all layers for ``heads`` heads: QK^T over the query-key
    width (nope + rope) and PV over v_head_dim, 2 FLOPs per multiply-add (the unabsorbed form prefill runs)."""
    return 2 * m.num_layers * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)


# config.json fields of DeepSeek-V2 that ModelSpec reads (besides the Llama ones and the MoE ones)
DEEPSEEK_V2_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
                      "n_shared_experts", "first_k_dense_replace", "moe_layer_freq")
