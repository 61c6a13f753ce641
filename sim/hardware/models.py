"""Models: ``ModelSpec`` read from a Hugging Face ``config.json`` (or a preset, sim/hardware/presets/models.py), its
per-GPU shard under tensor parallelism, and ``resolve_model``, the one way a name, a config or a path becomes a spec.

Everything here is plain arithmetic on published shapes: no torch, no GPU. The simulator's cost models read these
specs; the real engine builds its random-weight model from the same ``ModelSpec``. GPUs are in sim/hardware/gpu.py,
dtypes in sim/hardware/dtypes.py and the KV-cache budget a model leaves on a GPU in sim/hardware/kv_budget.py.

Units: bytes, seconds, bytes per second, FLOP per second. "Per GPU" always means one tensor-parallel shard.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, ClassVar, Literal

from sim.config.files import read_text_capped
from sim.hardware.dtypes import DTYPE_BITS, MiB, activation_dtype, canonical_dtype, finite_number, kv_dtype_bytes
from sim.hardware.mla import (
    DEEPSEEK_V2_FIELDS,
    mla_attention_params,
    mla_attn_flops_per_pair,
    mla_kv_elements_per_token,
)
from sim.hardware.moe import DEEPSEEK_MODEL_TYPES, MOE_MODEL_TYPES
from sim.hardware.presets.models import BASE_MODEL_ALIASES, BASE_MODEL_PRESETS, MORE_MODEL_ALIASES, MORE_MODEL_PRESETS
from sim.hardware.quant import modules_not_converted, unquantized_layers

MAX_SHAPE = 1 << 40  # largest model dimension taken (far past any model; keeps products inside float range)
MAX_CONFIG_BYTES = 4 * MiB  # a config.json is a few KB; a larger "file" (/dev/zero, a weights file) is refused


def read_json_file(path: str | PathLike[str], max_bytes: int) -> Any:
    """A JSON file's value, reading at most ``max_bytes`` (so that /dev/zero or a huge file cannot exhaust
    memory). Raises OSError (FileNotFoundError when absent) or ValueError naming the file and the problem."""
    text = read_text_capped(path, max_bytes, "a JSON file this reads")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError
        raise ValueError(f"{path}: not valid JSON: {e}") from None


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """Parameter counts held by one GPU under tensor parallelism (vLLM's column/row-parallel layout).

    Attention heads and MLP columns are split; KV heads are split while there are at least as many as GPUs and
    replicated (one per GPU) beyond; the vocabulary of the embedding and of the LM head is split; norms, learned
    position embeddings and the biases of row-parallel layers are replicated.
    """

    tensor_parallel_size: int
    num_attention_heads: int  # per GPU
    num_key_value_heads: int  # per GPU (replicated when tp > kv heads)
    intermediate_size: int  # per GPU
    vocab_size: int  # per GPU (rounded up)
    layer_matmul_params: int  # linear-layer weights of one decoder layer on this GPU
    body_matmul_params: int  # all decoder layers plus OPT's project_in/out: the matmuls computed for every token
    lm_head_params: int  # LM head weights on this GPU: computed only for the rows that sample
    embedding_params: int  # token (and learned position) embedding rows on this GPU
    other_params: int  # norms and biases on this GPU
    tied: bool  # LM head shares the token embedding (stored once)
    num_experts: int = 0  # MoE: experts per layer (0: a dense model)
    experts_per_tok: int = 0  # MoE: experts each token is routed to
    expert_params: int = 0  # MoE: matmul weights of one expert of one layer on this GPU
    num_moe_layers: int = 0  # MoE: decoder layers holding experts
    # matmul weights on this GPU that a quantized checkpoint keeps in the activation dtype (sim/hardware/quant.py)
    unquantized_params: int = 0

    @property
    def active_body_params(self) -> int:
        """Matmul weights one token passes through in the decoder (its ``experts_per_tok`` experts, not all)."""
        if not self.num_experts:
            return self.body_matmul_params
        return self.body_matmul_params - (self.num_experts - self.experts_per_tok) * self.expert_params * \
            self.num_moe_layers

    def expert_bytes(self, dtype: str) -> int:
        """MoE: bytes of one expert in every layer (what reading one more distinct expert per layer costs)."""
        return math.ceil(self.num_moe_layers * self.expert_params * DTYPE_BITS[canonical_dtype(dtype)] / 8)

    @property
    def stored_params(self) -> int:
        """Parameters resident on this GPU."""
        head = 0 if self.tied else self.lm_head_params
        return self.body_matmul_params + head + self.embedding_params + self.other_params

    def weight_bytes(self, dtype: str) -> int:
        """Bytes of weights resident on this GPU. Quantized formats (fp8, int8, int4) apply to the decoder's linear
        layers, less those the checkpoint leaves unconverted (``unquantized_params``); embeddings, LM head, norms
        and biases stay in bf16, as in vLLM's fp8/GPTQ/AWQ checkpoints. Quantization scales (a few per cent for
        int4 group-wise) are not counted."""
        key = canonical_dtype(dtype)
        hi_bits = DTYPE_BITS[activation_dtype(key)]
        rest = self.stored_params - self.body_matmul_params
        return math.ceil((self.body_matmul_params * DTYPE_BITS[key] + rest * hi_bits + self._unconverted_bits(key))
                         / 8)

    def _unconverted_bits(self, key: str) -> int:
        """Bits the unconverted matmuls add over the quantized dtype (0 when the dtype is not quantized)."""
        return self.unquantized_params * max(0, DTYPE_BITS[activation_dtype(key)] - DTYPE_BITS[key])

    def weight_bytes_read_per_step(self, dtype: str) -> int:
        """Bytes of weights every forward step streams from memory: all matmul weights (body and LM head, the
        latter even when tied) plus norms and biases. Embedding lookups touch a few rows only and are left out.
        MoE: the experts are left out too (``expert_bytes`` times the experts a step touches, sim.hardware.moe)."""
        key = canonical_dtype(dtype)
        hi_bits = DTYPE_BITS[activation_dtype(key)]
        body = self.body_matmul_params - self.num_experts * self.expert_params * self.num_moe_layers
        return math.ceil(
            (body * DTYPE_BITS[key] + (self.lm_head_params + self.other_params) * hi_bits + self._unconverted_bits(key))
            / 8
        )


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer, enough for exact parameter counts, FLOPs and KV bytes.

    Llama, Mistral, Qwen2 and SmolLM are ``mlp="gated"`` (SwiGLU: gate, up and down matrices), RMSNorm, rotary
    positions. OPT is ``mlp="plain"`` (fc1, fc2), LayerNorm with bias, biases on every linear layer, and a learned
    position table with two extra rows (``num_position_embeddings = max_position_embeddings + 2``).
    """

    # a pipeline stage (sim/serving/pipeline.py) may hold dense layers only: first_k_dense_replace == num_layers
    ALL_DENSE_OK: ClassVar[bool] = False
    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    tie_word_embeddings: bool = False
    mlp: Literal["gated", "plain"] = "gated"
    norm: Literal["rms", "layer"] = "rms"  # LayerNorm has a bias as well as a weight
    qkv_bias: bool = False  # Qwen2: biases on q, k and v only
    o_bias: bool = False
    mlp_bias: bool = False
    num_position_embeddings: int = 0  # rows of a learned position table; 0 for rotary embeddings
    word_embed_proj_dim: int = 0  # OPT: embedding width when it differs from hidden_size (adds project_in/out)
    final_norm: bool = True  # a norm after the last layer (OPT's post-norm variants have none)
    model_type: str = "llama"  # Hugging Face model_type, kept for the real engine and for round trips
    rope_theta: float = 10000.0  # rotary base (unused when num_position_embeddings > 0)
    norm_eps: float = 1e-5
    qk_norm: bool = False  # Qwen3: RMSNorm over each query and key head (head_dim weights each, per layer)
    num_experts: int = 0  # MoE (Mixtral, Qwen3-MoE): experts per layer replacing the MLP; 0: dense
    # (sim/hardware/moe.py)
    num_experts_per_tok: int = 0  # MoE: experts each token is routed to (top-k)
    moe_intermediate_size: int = 0  # MoE: one expert's intermediate width; 0: intermediate_size
    # DeepSeek-V2 (sim/hardware/mla.py): multi-head latent attention when kv_lora_rank > 0, shared experts, dense
    # first layers
    kv_lora_rank: int = 0  # MLA: width of the cached KV latent; 0: ordinary attention
    qk_rope_head_dim: int = 0  # MLA: rotary part of each query/key head (its key shared by the heads and cached)
    qk_nope_head_dim: int = 0  # MLA: non-rotary part of each query/key head
    v_head_dim: int = 0  # MLA: width of each value head
    q_lora_rank: int = 0  # MLA: width of the compressed query; 0: queries not compressed
    n_shared_experts: int = 0  # MoE: experts every token passes through besides its top-k routed ones
    first_k_dense_replace: int = 0  # MoE: the first layers keep a dense MLP of intermediate_size
    # Gemma-2 (sim/hardware/window.py): local layers attend to the last sliding_window tokens; every pattern-th is
    # global
    sliding_window: int = 0  # 0: every layer attends to the whole context
    sliding_window_pattern: int = 0  # every n-th layer (from 1) is global; 0: all layers local
    norms_per_layer: int = 2  # RMSNorms per decoder layer (Gemma-2: 4, before and after attention and MLP)
    # a quantized checkpoint's layers whose attention projections, and whose MLP, stay in the activation dtype
    # (quantization_config.modules_to_not_convert; Meta's Llama-3.1-405B-FP8: every attention, 2 MLPs;
    # sim/hardware/quant.py)
    unquantized_attention_layers: int = 0
    unquantized_mlp_layers: int = 0

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                  "vocab_size", "max_position_embeddings"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_SHAPE:
                raise ValueError(f"model {self.name!r}: {f} must be a positive integer up to {MAX_SHAPE}, got {v!r}")
        for f in ("head_dim", "num_position_embeddings", "word_embed_proj_dim"):  # 0: derived or none
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_SHAPE:
                raise ValueError(f"model {self.name!r}: {f} must be an integer in [0, {MAX_SHAPE}], got {v!r}")
        for f in ("rope_theta", "norm_eps"):
            v = getattr(self, f)
            if not finite_number(v) or v <= 0:
                raise ValueError(f"model {self.name!r}: {f} must be a finite number > 0, got {v!r}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"model {self.name!r}: hidden_size {self.hidden_size} is not divisible by "
                                 f"num_attention_heads {self.num_attention_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim < 1:
            raise ValueError(f"model {self.name!r}: head_dim must be positive, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"model {self.name!r}: num_attention_heads {self.num_attention_heads} is not a "
                             f"multiple of num_key_value_heads {self.num_key_value_heads}")
        if self.mlp not in ("gated", "plain"):
            raise ValueError(f"model {self.name!r}: mlp must be 'gated' or 'plain', got {self.mlp!r}")
        if self.norm not in ("rms", "layer"):
            raise ValueError(f"model {self.name!r}: norm must be 'rms' or 'layer', got {self.norm!r}")
        if self.word_embed_proj_dim == 0:
            object.__setattr__(self, "word_embed_proj_dim", self.hidden_size)
        if self.num_experts or self.num_experts_per_tok:
            if not (isinstance(self.num_experts, int) and isinstance(self.num_experts_per_tok, int)
                    and 1 <= self.num_experts_per_tok <= self.num_experts <= MAX_SHAPE):
                raise ValueError(f"model {self.name!r}: a mixture of experts needs 1 <= num_experts_per_tok "
                                 f"({self.num_experts_per_tok!r}) <= num_experts ({self.num_experts!r})")
            if self.mlp != "gated":
                raise ValueError(f"model {self.name!r}: experts are gated MLPs (mlp='gated')")
            if self.moe_intermediate_size == 0:
                object.__setattr__(self, "moe_intermediate_size", self.intermediate_size)
        if not 0 <= self.first_k_dense_replace < self.num_layers + self.ALL_DENSE_OK:
            raise ValueError(f"model {self.name!r}: first_k_dense_replace must be in [0, num_layers), got "
                             f"{self.first_k_dense_replace!r}")
        for f in ("unquantized_attention_layers", "unquantized_mlp_layers"):
            if not 0 <= getattr(self, f) <= self.num_layers:
                raise ValueError(f"model {self.name!r}: {f} must be in [0, num_layers], got {getattr(self, f)!r}")
        if self.kv_lora_rank and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) < 1:
            raise ValueError(f"model {self.name!r}: MLA (kv_lora_rank > 0) needs qk_rope_head_dim, "
                             "qk_nope_head_dim and v_head_dim")

    @property
    def samples(self) -> bool:
        """Whether the GPUs holding this spec compute logits and sample: the whole model's do; a pipeline's stages
        (sim/serving/pipeline.py) only the last, whatever they hold (OPT holds its LM head on every stage)."""
        return True

    # --- parameter counts (tensor_parallel_size=1 is the whole model) -------------------------------------------

    def shard(self, tensor_parallel_size: int = 1) -> ShardSpec:
        """Parameter counts on one of ``tensor_parallel_size`` GPUs; see ``ShardSpec``."""
        tp = check_tensor_parallel(self, tensor_parallel_size)
        h, hd, e = self.hidden_size, self.head_dim, self.word_embed_proj_dim
        heads = self.num_attention_heads // tp
        kv = max(1, self.num_key_value_heads // tp)
        inter = -(-self.intermediate_size // tp)
        vocab = -(-self.vocab_size // tp)
        n_up = 2 if self.mlp == "gated" else 1
        experts = expert = 0
        attn_mm, attn_norms = mla_attention_params(self, tp) if self.kv_lora_rank else \
            (h * (heads + 2 * kv) * hd + heads * hd * h, 0)
        dense_mm = 0  # DeepSeek: the first layers' dense MLP
        if self.num_experts:
            dense_mm = (n_up + 1) * h * inter  # intermediate_size split over the GPUs, before inter is the expert's
            # vLLM splits every expert's intermediate width over the GPUs; the router is replicated
            inter = -(-self.moe_intermediate_size // tp)
            expert = 3 * h * inter
            experts = self.num_experts
            layer_mm = attn_mm + h * experts + (experts + self.n_shared_experts) * expert
        else:
            layer_mm = attn_mm + (n_up + 1) * h * inter
        dense = self.first_k_dense_replace if experts else 0
        layer_other = (2 if self.norm == "layer" else 1) * h * self.norms_per_layer + attn_norms  # (+ MLA's)
        if self.qk_norm:
            layer_other += 2 * hd
        if self.qkv_bias:
            layer_other += (heads + 2 * kv) * hd
        if self.o_bias:
            layer_other += h
        if self.mlp_bias:
            layer_other += n_up * inter + h
        proj = 2 * e * h if e != h else 0
        final = (2 if self.norm == "layer" else 1) * h if self.final_norm else 0
        return ShardSpec(
            tensor_parallel_size=tp,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            intermediate_size=inter,
            vocab_size=vocab,
            layer_matmul_params=layer_mm,
            body_matmul_params=(self.num_layers - dense) * layer_mm + dense * (attn_mm + dense_mm) + proj,
            lm_head_params=vocab * e,
            embedding_params=vocab * e + self.num_position_embeddings * h,
            other_params=self.num_layers * layer_other + final,
            tied=self.tie_word_embeddings,
            num_experts=experts,
            experts_per_tok=self.num_experts_per_tok if experts else 0,
            expert_params=expert,
            num_moe_layers=self.num_layers - dense if experts else 0,
            unquantized_params=self.unquantized_attention_layers * attn_mm
            + (0 if experts else self.unquantized_mlp_layers * (n_up + 1) * h * inter),
        )

    @property
    def num_params(self) -> int:
        """Exact parameter count: embeddings, attention, MLP, norms, biases, and the LM head unless tied."""
        return self.shard(1).stored_params

    @property
    def matmul_params(self) -> int:
        """Weights of the linear layers a token passes through, LM head included (tied or not), embeddings
        excluded. ``2 * matmul_params`` is the classic forward FLOPs per token."""
        s = self.shard(1)
        return s.active_body_params + s.lm_head_params

    @property
    def flops_per_token(self) -> int:
        """Forward FLOPs per token in the linear layers (incl. LM head), attention excluded: 2 * matmul_params."""
        return 2 * self.matmul_params

    @property
    def attn_flops_per_pair(self) -> int:
        """Attention FLOPs per causal query-key pair: QK^T and PV, 2 FLOPs per multiply-add each, every layer."""
        if self.kv_lora_rank:
            return mla_attn_flops_per_pair(self, self.num_attention_heads)
        return 4 * self.num_layers * self.num_attention_heads * self.head_dim

    def attention_flops(self, attn_pairs: float) -> int | float:
        """Attention FLOPs for ``attn_pairs`` query-key pairs (see ``StepShape.attn_pairs``)."""
        return attn_pairs * self.attn_flops_per_pair

    def weight_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of all weights; see ``ShardSpec.weight_bytes`` for what a quantized dtype covers."""
        return self.shard(1).weight_bytes(dtype)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV-cache bytes one token occupies: 2 (K and V) * layers * kv heads * head_dim * bytes per element
        (MLA: layers * (kv_lora_rank + qk_rope_head_dim) * bytes, sim/hardware/mla.py)."""
        return self.kv_elements_per_token(1) * kv_dtype_bytes(kv_dtype)

    def kv_elements_per_token(self, tensor_parallel_size: int = 1) -> int:
        """KV elements one token caches on each of ``tensor_parallel_size`` GPUs: 2 * layers * that GPU's KV heads
        * head_dim (KV heads replicated past their count); MLA's latent is not split (sim/hardware/mla.py)."""
        if self.kv_lora_rank:
            return mla_kv_elements_per_token(self)
        kv = max(1, self.num_key_value_heads // tensor_parallel_size)
        return 2 * self.num_layers * kv * self.head_dim

    # --- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | PathLike[str], name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a dict, a file, or a folder holding config.json).

        Llama-like types (llama, mistral, qwen2, smollm, ...) read ``hidden_size, num_hidden_layers,
        num_attention_heads, num_key_value_heads (default: heads), head_dim (default: hidden/heads),
        intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings, attention_bias, mlp_bias``;
        ``opt`` reads ``ffn_dim`` instead of intermediate_size, plus ``word_embed_proj_dim, do_layer_norm_before,
        enable_bias``.
        """
        if isinstance(config, Mapping):
            cfg = dict(config)
            source = "config"
        else:
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            source = str(path)
            loaded = read_json_file(path, MAX_CONFIG_BYTES)
            if not isinstance(loaded, dict):
                raise ValueError(f"{source}: a config.json must be a JSON object of fields, got a "
                                 f"{type(loaded).__name__}")
            cfg = loaded
        model_type = str(cfg.get("model_type", "llama")).lower()
        if name is None:
            name = str(cfg.get("_name_or_path") or cfg.get("name") or model_type)
        _refuse_what_is_not_modelled(cfg, model_type, source)

        def whole(key: str, value: Any, low: int = 1) -> int:
            # int(1.5) would be 1 and int(True) 1: a shape field must be an integer as written
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                kind = "a positive integer" if low >= 1 else "an integer >= 0"
                raise ValueError(f"{source}: {key} must be {kind}, got {value!r}")
            return value

        def need(key: str) -> int:
            if cfg.get(key) is None:
                raise ValueError(f"{source} ({model_type}) lacks the field {key!r}, needed for the model's shape")
            return whole(key, cfg[key])

        def optional(key: str, default: int) -> int:
            # absent or null: the default; 0 is a value (and refused where it must be positive), not "unset"
            return default if cfg.get(key) is None else whole(key, cfg[key])

        def number(key: str, default: float) -> float:
            v = cfg.get(key, default)
            if not finite_number(v) or v <= 0:
                raise ValueError(f"{source}: {key} must be a finite number > 0, got {v!r}")
            return float(v)

        def flag(key: str, default: bool) -> bool:
            v = cfg.get(key, default)
            if not isinstance(v, bool):
                raise ValueError(f"{source}: {key} must be true or false, got {v!r}")
            return v

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        common: dict[str, Any] = dict(  # the fields every model type reads alike
            name=name,
            hidden_size=hidden,
            num_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            vocab_size=need("vocab_size"),
            max_position_embeddings=need("max_position_embeddings"),
            model_type=model_type,
        )
        common["unquantized_attention_layers"], common["unquantized_mlp_layers"] = unquantized_layers(
            cfg, common["num_layers"], source)
        if model_type == "opt":
            enable_bias = flag("enable_bias", True)
            pre_norm = flag("do_layer_norm_before", True)
            return cls(
                **common,
                num_key_value_heads=heads,
                intermediate_size=need("ffn_dim"),
                tie_word_embeddings=flag("tie_word_embeddings", True),
                mlp="plain",
                norm="layer",
                qkv_bias=enable_bias,
                o_bias=enable_bias,
                mlp_bias=enable_bias,
                num_position_embeddings=common["max_position_embeddings"] + 2,  # OPT's learned table has offset 2
                word_embed_proj_dim=optional("word_embed_proj_dim", hidden),
                final_norm=pre_norm and not flag("_remove_final_layer_norm", False),
                norm_eps=1e-5,
            )
        attention_bias = flag("attention_bias", False)
        moe: dict[str, Any] = {}
        if model_type in MOE_MODEL_TYPES:
            moe = dict(num_experts=need(MOE_MODEL_TYPES[model_type]), num_experts_per_tok=need("num_experts_per_tok"),
                       moe_intermediate_size=optional("moe_intermediate_size", 0))
        head_dim = optional("head_dim", 0)
        if model_type in DEEPSEEK_MODEL_TYPES:  # MLA and shared experts (sim/hardware/mla.py)
            moe.update(kv_lora_rank=need("kv_lora_rank"), qk_rope_head_dim=need("qk_rope_head_dim"),
                       qk_nope_head_dim=need("qk_nope_head_dim"), v_head_dim=need("v_head_dim"),
                       q_lora_rank=optional("q_lora_rank", 0), n_shared_experts=optional("n_shared_experts", 0),
                       first_k_dense_replace=optional("first_k_dense_replace", 0))
            head_dim = moe["qk_nope_head_dim"] + moe["qk_rope_head_dim"]  # a query/key head's width
        if model_type == "gemma2":  # alternating local and global layers (sim/hardware/window.py)
            moe.update(sliding_window=need("sliding_window"), sliding_window_pattern=2, norms_per_layer=4)
        return cls(
            **common,
            **moe,
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            num_key_value_heads=optional("num_key_value_heads", heads),
            head_dim=head_dim,  # absent: hidden_size // heads
            intermediate_size=need("intermediate_size"),
            tie_word_embeddings=flag("tie_word_embeddings", model_type == "gemma2"),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias,
            mlp_bias=flag("mlp_bias", False),
            rope_theta=number("rope_theta", 10000.0),
            norm_eps=number("rms_norm_eps", 1e-5),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The Hugging Face config fields this spec holds; ``from_hf_config`` reads them back to an equal spec."""
        cfg: dict[str, Any] = {
            "_name_or_path": self.name,
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.unquantized_attention_layers or self.unquantized_mlp_layers:
            cfg["quantization_config"] = {"modules_to_not_convert": modules_not_converted(
                self.unquantized_attention_layers, self.unquantized_mlp_layers, self.num_layers)}
        if self.model_type == "opt":
            cfg.update(
                ffn_dim=self.intermediate_size,
                word_embed_proj_dim=self.word_embed_proj_dim,
                do_layer_norm_before=self.final_norm,
                enable_bias=self.qkv_bias,
            )
            return cfg
        cfg.update(
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            attention_bias=self.o_bias,
            mlp_bias=self.mlp_bias,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.norm_eps,
        )
        if self.num_experts:
            cfg[MOE_MODEL_TYPES.get(self.model_type, "num_local_experts")] = self.num_experts
            cfg.update(num_experts_per_tok=self.num_experts_per_tok, moe_intermediate_size=self.moe_intermediate_size)
        if self.sliding_window:
            cfg["sliding_window"] = self.sliding_window
        if self.kv_lora_rank:
            cfg.update({k: getattr(self, k) for k in DEEPSEEK_V2_FIELDS if k != "moe_layer_freq"})
            cfg["q_lora_rank"] = self.q_lora_rank or None
        return cfg

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """A preset by name, case-insensitive (see ``MODEL_PRESETS``)."""
        key = name.strip().lower()
        key = _MODEL_ALIASES.get(key, key)
        if key not in MODEL_PRESETS:
            # a typo's preset first (llama-57n), before the list of every one
            close = difflib.get_close_matches(key, [*MODEL_PRESETS, *_MODEL_ALIASES], n=1, cutoff=0.85)
            raise ValueError(f"unknown model {name!r}; {f'did you mean {close[0]!r}? ' if close else ''}presets: "
                             f"{', '.join(MODEL_PRESETS)}")
        return cls.from_hf_config(MODEL_PRESETS[key], name=key)


# The Hugging Face model types whose shape ModelSpec represents whole: dense decoder-only transformers with
# full attention (Llama-like gated MLP and RMSNorm, or OPT). Another type may hold fields that change the cost
# (Gemma-2's soft-capping and alternating windows, DeepSeek's MLA and shared experts, Phi's partial
# rotary), so it is refused
# by name rather than read as a Llama.
KNOWN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "opt", "qwen3", "gemma2", *MOE_MODEL_TYPES})
# Fields that make a model a mixture of experts in the configs of Mixtral, Qwen-MoE, DeepSeek, DBRX and others.
_MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
               "moe_intermediate_size", "n_shared_experts", "moe_layer_freq", "shared_expert_intermediate_size")


def _refuse_what_is_not_modelled(cfg: Mapping[str, Any], model_type: str, source: str) -> None:
    """A config.json whose model the spec would misread is an error naming the field: a mixture of experts read as
    dense counts one expert's parameters (Mixtral-8x7B: 7.2 B of its 46.7 B), a sliding window it ignores makes
    long contexts' KV and attention too costly."""
    read = {MOE_MODEL_TYPES[model_type], "num_experts_per_tok", "moe_intermediate_size"} \
        if model_type in MOE_MODEL_TYPES else set()
    if model_type in DEEPSEEK_MODEL_TYPES:
        read |= {"n_shared_experts"}
        if cfg.get("moe_layer_freq", 1) != 1:
            raise ValueError(f"{source}: moe_layer_freq = {cfg.get('moe_layer_freq')!r}: experts only every n-th "
                             "layer, which servesim does not model (every layer past first_k_dense_replace holds them)")
    for key in _MOE_FIELDS:
        v = cfg.get(key)
        unset: tuple[Any, ...] = (None, 0, False, [], {}) if "shared" in key else (None, 0, 1, False, [], {})
        if key not in read and v not in unset:  # (one expert is a dense model)
            raise ValueError(f"{source}: {key} = {v!r}: a mixture-of-experts model whose experts servesim does not "
                             f"read from this config (it reads {', '.join(sorted(MOE_MODEL_TYPES))} experts, without "
                             "shared experts); it would count only the dense part of its parameters")
    window = cfg.get("sliding_window")
    if window is not None and cfg.get("use_sliding_window", True) is not False and model_type != "gemma2":
        limit = cfg.get("max_position_embeddings")
        if not (isinstance(window, int) and isinstance(limit, int) and window >= limit):
            raise ValueError(f"{source}: sliding_window = {window!r}: attention over a window of the context, which "
                             "servesim does not model (it would price full attention); set sliding_window to null "
                             "to model full attention")
    if model_type == "qwen3_moe":  # layers without experts, or experts only every n-th layer: not modelled
        for key, dense in (("decoder_sparse_step", 1), ("mlp_only_layers", [])):
            if cfg.get(key) not in (None, dense):
                raise ValueError(f"{source}: {key} = {cfg.get(key)!r}: dense layers among the MoE ones, which "
                                 "servesim does not model (every layer is taken to hold experts)")
    if model_type not in KNOWN_MODEL_TYPES:
        raise ValueError(f"{source}: model_type {model_type!r} is not one servesim reads (known: "
                         f"{', '.join(sorted(KNOWN_MODEL_TYPES))}); its fields may change the model's cost")


def check_tensor_parallel(model: ModelSpec, tensor_parallel_size: int) -> int:
    """Validate a tensor-parallel degree the way vLLM does: it must divide the attention heads, and either divide
    the KV heads or be a multiple of them (KV heads are then replicated)."""
    tp = tensor_parallel_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    kv = model.num_key_value_heads
    if model.num_attention_heads % tp or (kv % tp and tp % kv):
        raise ValueError(f"tensor_parallel_size={tp} does not split {model.name}: it must divide its "
                         f"{model.num_attention_heads} attention heads and divide or be a multiple of its {kv} "
                         "KV heads")
    return tp


# Presets: the shape fields of each model's published config.json (sim/hardware/presets/models.py).
MODEL_PRESETS: dict[str, dict[str, Any]] = dict(BASE_MODEL_PRESETS) | MORE_MODEL_PRESETS
_MODEL_ALIASES = dict(BASE_MODEL_ALIASES) | MORE_MODEL_ALIASES

ModelLike = ModelSpec | str | PathLike[str] | Mapping[str, Any]


def resolve_model(model: ModelLike) -> ModelSpec:
    """The one way a model given by the user becomes a ``ModelSpec``: a spec as it is; a mapping of Hugging Face
    ``config.json`` fields; a config.json path or its folder; a preset name (case-insensitive, ``MODEL_PRESETS``).
    A string ending in ``.json`` or holding a ``/`` is a path; else a preset, or a folder where it names no preset."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return ModelSpec.from_hf_config(model)
    text = str(model)
    if not isinstance(model, str) or text.endswith(".json") or "/" in text:
        return ModelSpec.from_hf_config(model)
    if text.strip() and not is_model_preset(text) and Path(text).is_dir():  # "" is no folder (Path("") is ".")
        return ModelSpec.from_hf_config(text)
    try:
        return ModelSpec.from_name(text)
    except ValueError as e:  # said here, not by from_name: engine run and calibrate take a preset only
        raise ValueError(f"{e} (or a config.json path, or the folder holding one)") from None


def is_model_preset(name: object) -> bool:
    """Whether ``name`` is a string ``ModelSpec.from_name`` knows (case-insensitive, aliases included)."""
    if not isinstance(name, str):
        return False
    key = name.strip().lower()
    return _MODEL_ALIASES.get(key, key) in MODEL_PRESETS
