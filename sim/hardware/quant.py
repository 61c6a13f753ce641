"""Quantized checkpoints that leave some matmuls in the activation dtype: Hugging Face's
``quantization_config.modules_to_not_convert``.

Meta's FP8 release of Llama 3.1 405B (``meta-llama/Llama-3.1-405B-FP8``, FBGEMM row-wise FP8) quantizes the
feed-forward layers only: "We do not quantize parameters in the self-attention layers of the model" and "we do
not perform quantization in the first and last Transformer layers" (Llama Team, "The Llama 3 Herd of Models",
arXiv 2407.21783, section 6.2); its config.json lists those modules under ``modules_to_not_convert``. The bf16
attention adds 72 B parameters' worth of a byte each: vLLM 0.6.3 logged "Loading model weights took 56.7677 GB"
on each of 8 H100s (dstackai/benchmarks, comparison/h100sxm5_vs_mi300x/raw_data/gpu-usage.md), where every
matmul in FP8 would be 47.7 GiB and this rule gives 56.7 GiB. Those weights are read at two bytes each every
step and computed at the bf16 rate (sim/costs/analytic.py).

A spec counts the layers whose attention projections, and those whose MLP, stay unconverted
(``ModelSpec.unquantized_attention_layers``, ``unquantized_mlp_layers``); under an unquantized weight dtype they
change nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_LAYER_MODULE = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.")


def unquantized_layers(cfg: Mapping[str, Any], num_layers: int, source: str) -> tuple[int, int]:
    """(layers whose attention projections stay, layers whose MLP stays) that a config.json's
    ``quantization_config.modules_to_not_convert`` names (``model.layers.12.self_attn.q_proj``); a layer counts
    once whichever of its projections are named (Meta's list names all of them). (0, 0) without the list."""
    qc = cfg.get("quantization_config")
    names = qc.get("modules_to_not_convert") if isinstance(qc, Mapping) else None
    if names is None:
        return 0, 0
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{source}: quantization_config.modules_to_not_convert must be a list of module names")
    found: dict[str, set[int]] = {"self_attn": set(), "mlp": set()}
    for n in names:
        if m := _LAYER_MODULE.search(n):
            found[m.group(2)].add(int(m.group(1)))
    if any(i >= num_layers for s in found.values() for i in s):
        raise ValueError(f"{source}: quantization_config.modules_to_not_convert names a layer past the "
                         f"{num_layers} layers of the model")
    return len(found["self_attn"]), len(found["mlp"])


def modules_not_converted(attention_layers: int, mlp_layers: int, num_layers: int) -> list[str]:
    """A ``modules_to_not_convert`` list that ``unquantized_layers`` reads back as these counts: the attention of
    the first ``attention_layers`` layers, the MLP of the first and last layers alternately (Meta's: the first and
    the last), Llama's module names."""
    mlp = sorted({*range(0, (mlp_layers + 1) // 2), *range(num_layers - mlp_layers // 2, num_layers)})
    return [f"model.layers.{i}.self_attn.{p}" for i in range(attention_layers) for p in ("q_proj", "k_proj",
                                                                                         "v_proj", "o_proj")] \
        + [f"model.layers.{i}.mlp.{p}" for i in mlp for p in ("gate_proj", "up_proj", "down_proj")]


def meta_fp8(config: dict[str, Any]) -> dict[str, Any]:
    """A Llama config as Meta's FP8 release states it: FBGEMM FP8 with every layer's attention and the first and
    last layers' MLP (and the LM head) left in bf16."""
    layers = int(config["num_hidden_layers"])
    return config | {"quantization_config": {"quant_method": "fbgemm_fp8", "modules_to_not_convert": [
        *modules_not_converted(layers, 2, layers), "lm_head"]}}
