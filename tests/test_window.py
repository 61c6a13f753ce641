"""Gemma-2: parameter counts, KV with the sliding window bounding the local layers, and the refusal past the window
(sim/hardware/window.py), against hand computations."""

from __future__ import annotations

import pytest

from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.hardware.models import ModelSpec
from sim.hardware.window import num_local_layers, window_kv_elements
from sim.loop.build import build


def test_gemma2_parameters():
    m = ModelSpec.from_name("gemma-2-9b")
    h, layers, heads, kv, hd, inter, vocab = 3584, 42, 16, 8, 256, 14336, 256000
    layer = h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter
    norms = layers * 4 * h + h  # four RMSNorms per layer and the final one
    assert m.num_params == layers * layer + vocab * h + norms  # embeddings tied
    assert m.num_params / 1e9 == pytest.approx(9.24, abs=0.01)
    assert ModelSpec.from_name("gemma-2-27b").num_params / 1e9 == pytest.approx(27.23, abs=0.01)
    assert ModelSpec.from_hf_config(m.to_hf_config(), name=m.name) == m


def test_kv_with_the_window():
    m = ModelSpec.from_name("gemma-2-9b")
    assert num_local_layers(m) == 21  # layers 0, 2, ..., 40
    per_layer = 2 * 8 * 256  # K and V x KV heads x head_dim
    assert m.kv_bytes_per_token("bf16") == 42 * per_layer * 2 == 344064
    # within the window every layer holds every token
    assert window_kv_elements(m, 4096) == 42 * per_layer * 4096
    # 8,192 tokens: the 21 global layers hold 8,192, the 21 local ones the last 4,096
    assert window_kv_elements(m, 8192) == per_layer * (21 * 8192 + 21 * 4096)
    assert window_kv_elements(m, 8192) / (42 * per_layer * 8192) == 0.75
    # tensor parallelism splits the KV heads as before
    assert window_kv_elements(m, 8192, 2) * 2 == window_kv_elements(m, 8192)


def _build(max_model_len: int | None):
    dep = {"model": "gemma-2-9b", "gpu": "h100-sxm"}
    if max_model_len is not None:
        dep["max_model_len"] = max_model_len
    raw = {"name": "t", "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 2,
                                     "prompt_len": {"type": "fixed", "value": 100},
                                     "output_len": {"type": "fixed", "value": 10}}, "deployment": dep}
    return build(variant_configs(parse_scenario(raw, "t"))[0])


def test_past_the_window_refused_within_it_exact():
    with pytest.raises(ScenarioError, match="sliding_window of 4096 tokens.*max_model_len <= 4096"):
        _build(None)  # the model's 8,192-token context
    built = _build(4096)[3]  # every context fits the window: full attention in every layer is exact
    assert built.budget.bytes_per_token == 344064


def test_other_windows_still_refused():
    cfg = ModelSpec.from_name("llama-3.1-8b").to_hf_config() | {"model_type": "mistral", "sliding_window": 4096}
    with pytest.raises(ValueError, match="sliding_window = 4096"):
        ModelSpec.from_hf_config(cfg)
