"""A Llama-style decoder in plain PyTorch, built from the simulator's ``ModelSpec``.

RMSNorm, rotary positions (``rope_theta`` from the spec, Hugging Face's rotate-half layout), grouped-query
attention, SwiGLU MLP, tied or untied LM head; the optional q/k/v, o and MLP biases of Qwen2-like specs. The
q, k, v and the gate, up projections are fused into one matrix each (as vLLM does: one matmul instead of three);
Hugging Face checkpoints are split/joined on load and export.

Weights come from a seeded normal distribution (timing does not depend on their values), always drawn in float32
and then cast, so that models of any dtype built from one seed hold the same numbers (up to rounding): a float64
model is the float32 model's exact reference. Llama 3's long-context ``rope_scaling`` is not in the spec and is
not applied; it changes values, not cost.

The forward pass takes a flattened batch of new tokens (varlen, as vLLM does) and returns logits only at the rows
``meta.logits_indices`` names: the last new token of each sequence that samples.
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from realengine.attention import AttentionMetadata, attention
from sim.hardware.dtypes import ENGINE_DTYPE_NAMES
from sim.hardware.models import ModelSpec

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
_DTYPES = {name: _TORCH_DTYPES[short] for name, short in ENGINE_DTYPE_NAMES.items()}


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a torch dtype or a name (``fp32 float32 bf16 bfloat16 fp16 float16 fp64 float64``)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise ValueError(f"unsupported model dtype {dtype}")
        return dtype
    key = str(dtype).strip().lower()
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
    return _DTYPES[key]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms and rotary angles are computed in float32 (float64 for a float64 model), as Hugging Face does."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Linear(nn.Module):
    """``y = x W^T (+ b)`` without nn.Linear's kaiming initialisation (slow at 8B, and overwritten anyway)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(_compute_dtype(x.dtype))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, ``[T, head_dim // 2]`` each: angle = position * theta^(-2i / head_dim)."""
    cd = _compute_dtype(dtype)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=cd, device=positions.device) / head_dim))
    angles = positions.to(cd)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [T, heads, head_dim]`` (rotate-half layout: pairs are (i, i + head_dim / 2))."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.scale = self.head_dim ** -0.5
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(spec.hidden_size, q + 2 * kv, spec.qkv_bias, dtype=dtype, device=device)
        self.o_proj = Linear(q, spec.hidden_size, spec.o_bias, dtype=dtype, device=device)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, meta: AttentionMetadata,
                kv: tuple[Tensor, Tensor] | None) -> Tensor:
        t = x.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split((q_size, kv_size, kv_size), dim=-1)
        q = apply_rope(q.view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        o = attention(q, k, v, kv, meta, self.scale)
        return self.o_proj(o.reshape(t, q_size))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.intermediate_size = spec.intermediate_size
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, spec.mlp_bias,
                                   dtype=dtype, device=device)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, spec.mlp_bias, dtype=dtype, device=device)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, dtype=dtype, device=device)
        self.self_attn = Attention(spec, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, dtype=dtype, device=device)
        self.mlp = MLP(spec, dtype=dtype, device=device)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, meta: AttentionMetadata,
                kv: tuple[Tensor, Tensor] | None) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kv)
        return h + self.mlp(self.post_attention_layernorm(h))


def unbuildable(spec: ModelSpec) -> str | None:
    """Why the engine cannot build ``spec`` (the simulator prices more than this decoder builds), None if it can."""
    if spec.mlp != "gated" or spec.norm != "rms" or spec.num_position_embeddings:
        return (f"model {spec.name!r} ({spec.model_type}) is not Llama-like (gated MLP, RMSNorm, rotary positions); "
                "the real engine builds only those")
    if spec.num_experts or spec.qk_norm:  # the simulator prices them (sim/hardware/moe.py); no layer here builds them
        return f"model {spec.name!r}: mixture-of-experts layers and per-head q/k norms are not built by the real engine"
    if spec.sliding_window or spec.kv_lora_rank:  # Gemma-2, DeepSeek-V2: the simulator prices them only
        return (f"model {spec.name!r}: sliding-window layers and latent attention (MLA) are not built by the real "
                "engine")
    if spec.word_embed_proj_dim != spec.hidden_size or not spec.final_norm:
        return f"model {spec.name!r}: embedding projections and missing final norms are not built"
    if spec.head_dim % 2:
        return f"model {spec.name!r}: rotary positions need an even head_dim, got {spec.head_dim}"
    return None


class LlamaModel(nn.Module):
    """The decoder. ``device="meta"`` builds the shapes without memory (parameter counts of large presets).

    ``forward(input_ids [T], positions [T], meta, kv_cache)`` returns ``[len(meta.logits_indices), vocab]``.
    ``kv_cache`` is a ``realengine.kv_cache.KVCache`` (or anything with ``layer(i) -> (k_cache, v_cache)``);
    None attends only among the step's own tokens (a plain full-sequence forward).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        seed: int = 0,
        init_std: float = 0.02,  # standard deviation of the random weights (norm weights: 1 + N(0, init_std))
        weights_path: str | PathLike[str] | None = None,  # a safetensors file with Hugging Face names
    ) -> None:
        super().__init__()
        problem = unbuildable(spec)
        if problem is not None:
            raise ValueError(problem)
        self.spec = spec
        self.dtype = torch_dtype(dtype)
        device = torch.device(device)
        dt = self.dtype
        self.embed_tokens = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size, dtype=dt, device=device),
                                         requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype=dt, device=device) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps, dtype=dt, device=device)
        self.lm_head = (None if spec.tie_word_embeddings else
                        nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size, dtype=dt, device=device),
                                     requires_grad=False))
        if device.type != "meta":
            if weights_path is not None:
                self.load_hf_state_dict(load_safetensors(weights_path))
            else:
                self.init_random(seed, init_std)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """``layers`` as what they are: iterating an ``nn.ModuleList`` yields plain ``Module``s to a type checker.
        (``quantize_model`` swaps the linear layers inside them, never the layers themselves.)"""
        return cast(list[DecoderLayer], list(self.layers))

    def init_random(self, seed: int, std: float = 0.02) -> None:
        """Fill every parameter from ``torch.Generator(device).manual_seed(seed)``, in registration order."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        for name, p in self.named_parameters():
            w = torch.randn(p.shape, generator=g, dtype=torch.float32, device=self.device).mul_(std)
            if name.endswith("norm.weight"):
                w.add_(1.0)
            p.data.copy_(w)

    def weight_bytes(self) -> int:
        """Bytes of the parameters as stored (a tied LM head counted once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())

    @property
    def lm_head_weight(self) -> Tensor:
        return self.embed_tokens if self.lm_head is None else self.lm_head

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata, kv_cache=None) -> Tensor:
        x = F.embedding(input_ids, self.embed_tokens)
        cos, sin = rope_cos_sin(positions, self.spec.head_dim, self.spec.rope_theta, self.dtype)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, cos, sin, meta, None if kv_cache is None else kv_cache.layer(i))
        x = self.norm(x[meta.logits_indices])  # only the rows that sample reach the LM head
        return F.linear(x, self.lm_head_weight)

    # ---- Hugging Face names ----------------------------------------------------------------------------------
    def hf_state_dict(self) -> dict[str, Tensor]:
        """The weights under Hugging Face Llama names (q/k/v and gate/up split again)."""
        s = self.spec
        q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
        out: dict[str, Tensor] = {"model.embed_tokens.weight": self.embed_tokens.data,
                                  "model.norm.weight": self.norm.weight.data}
        if self.lm_head is not None:
            out["lm_head.weight"] = self.lm_head.data
        for i, layer in enumerate(self.decoder_layers):
            p = f"model.layers.{i}."
            a, m = layer.self_attn, layer.mlp
            out[p + "input_layernorm.weight"] = layer.input_layernorm.weight.data
            out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.data
            for part, name in (("weight", "weight"), ("bias", "bias")):
                t = getattr(a.qkv_proj, part)
                if t is not None:
                    for proj, piece in zip("qkv", t.data.split((q, kv, kv), dim=0), strict=True):
                        out[p + f"self_attn.{proj}_proj.{name}"] = piece
                t = getattr(a.o_proj, part)
                if t is not None:
                    out[p + f"self_attn.o_proj.{name}"] = t.data
                t = getattr(m.gate_up_proj, part)
                if t is not None:
                    gate, up = t.data.chunk(2, dim=0)
                    out[p + f"mlp.gate_proj.{name}"], out[p + f"mlp.up_proj.{name}"] = gate, up
                t = getattr(m.down_proj, part)
                if t is not None:
                    out[p + f"mlp.down_proj.{name}"] = t.data
        return out

    def load_hf_state_dict(self, state: dict[str, Tensor], *, device: torch.device | str | None = None) -> None:
        """Copy weights given under Hugging Face Llama names; every parameter must be present. A checkpoint's
        ``lm_head.weight`` is ignored when the spec ties the head to the embedding. With ``device``, the
        checkpoint's tensors become the parameters instead (moved there and cast to the model's dtype, which copies
        nothing where they already are; the fused q/k/v and gate/up are joined once): a model built on ``meta`` is
        loaded so without memory of its own to fill (SmolLM2: 0.5 GB less, and no second pass over it)."""
        mine = self.hf_state_dict()  # views into this model's parameters (the fused ones split)
        missing = sorted(set(mine) - set(state))
        if missing:
            raise KeyError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        for name, t in mine.items():
            if tuple(state[name].shape) != tuple(t.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(state[name].shape)}, model {tuple(t.shape)}")

        def put(owner: nn.Module, attr: str, *names: str) -> None:
            dst = getattr(owner, attr)
            if device is None:
                if len(names) == 1:
                    dst.data.copy_(state[names[0]].to(device=dst.device, dtype=dst.dtype))
                else:  # each piece into its rows: no joined copy first
                    at = 0
                    for n in names:
                        dst.data[at : at + len(state[n])].copy_(state[n].to(device=dst.device, dtype=dst.dtype))
                        at += len(state[n])
                return
            src = torch.cat([state[n] for n in names], dim=0) if len(names) > 1 else state[names[0]]
            setattr(owner, attr, nn.Parameter(src.to(device=device, dtype=self.dtype).contiguous(),
                                              requires_grad=False))

        with torch.no_grad():
            put(self, "embed_tokens", "model.embed_tokens.weight")
            put(self.norm, "weight", "model.norm.weight")
            if self.lm_head is not None:
                put(self, "lm_head", "lm_head.weight")
            for i, layer in enumerate(self.decoder_layers):
                p = f"model.layers.{i}."
                a, m = layer.self_attn, layer.mlp
                put(layer.input_layernorm, "weight", p + "input_layernorm.weight")
                put(layer.post_attention_layernorm, "weight", p + "post_attention_layernorm.weight")
                put(a.qkv_proj, "weight", *(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
                if a.qkv_proj.bias is not None:  # present exactly when the spec has the bias
                    put(a.qkv_proj, "bias", *(p + f"self_attn.{x}_proj.bias" for x in "qkv"))
                put(a.o_proj, "weight", p + "self_attn.o_proj.weight")
                if a.o_proj.bias is not None:
                    put(a.o_proj, "bias", p + "self_attn.o_proj.bias")
                put(m.gate_up_proj, "weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
                put(m.down_proj, "weight", p + "mlp.down_proj.weight")
                if m.gate_up_proj.bias is not None:
                    put(m.gate_up_proj, "bias", p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias")
                if m.down_proj.bias is not None:
                    put(m.down_proj, "bias", p + "mlp.down_proj.bias")


# ---- safetensors (the format is simple enough not to need the package) -----------------------------------------
# File: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the data.

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def load_safetensors(path: str | PathLike[str]) -> dict[str, Tensor]:
    """Read every tensor of a safetensors file onto the CPU."""
    out: dict[str, Tensor] = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _ST_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            buf = bytearray(f.read(end - begin))
            shape = info["shape"]
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out[name] = t.reshape(shape)
    return out


def save_safetensors(tensors: dict[str, Tensor], path: str | PathLike[str]) -> None:
    """Write tensors (moved to the CPU, made contiguous) as a safetensors file."""
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data to 8 bytes, as the reference writer does
    with open(Path(path), "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for data in blobs:
            f.write(data)


__all__ = ["LlamaModel", "apply_rope", "load_safetensors", "rope_cos_sin", "save_safetensors", "torch_dtype"]
