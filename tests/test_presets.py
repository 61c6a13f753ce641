"""The presets of sim/hardware/presets/: parameter counts against the figures their model cards publish, GPUs resolve."""

from __future__ import annotations

import pytest

from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec

# model card / paper figures (billions)
PUBLISHED = {"llama-2-7b": 6.74, "llama-2-13b": 13.02, "llama-2-70b": 68.98, "llama-3-8b": 8.03,
             "llama-3-70b": 70.55, "llama-3.1-405b": 405.85, "qwen2.5-14b": 14.77, "qwen2.5-32b": 32.76,
             "qwen2.5-72b": 72.71, "llama-3.2-3b": 3.21}
# the Qwen3 model cards state two digits: parameters and parameters without the embeddings (billions)
QWEN3_CARDS = {"qwen3-0.6b": (0.6, 0.44), "qwen3-1.7b": (1.7, 1.4), "qwen3-4b": (4.0, 3.6), "qwen3-14b": (14.8, 13.2)}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_matches_the_model_card(name: str) -> None:
    assert ModelSpec.from_name(name).num_params / 1e9 == pytest.approx(PUBLISHED[name], rel=2e-3)


@pytest.mark.parametrize("name", list(QWEN3_CARDS))
def test_qwen3_counts_round_to_their_cards(name: str) -> None:
    m = ModelSpec.from_name(name)
    embeddings = m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    total, body = QWEN3_CARDS[name]
    assert round(m.num_params / 1e9, 1) == total
    assert round((m.num_params - embeddings) / 1e9, len(str(body).split(".")[1])) == body


@pytest.mark.parametrize("name", ["h100-pcie", "h100-nvl", "gh200", "h20", "b200", "a10g", "l40", "a100-40gb-pcie",
                                  "mi300x", "rtx-4090"])
def test_gpu_presets_resolve(name: str) -> None:
    g = GPUSpec.from_name(name)
    assert g.memory_bytes > 20 * 2**30 and g.mem_bandwidth > 5e11 and g.peak("bf16") > 5e13


def test_b200_streams_hbm_at_the_rate_its_bus_gives() -> None:
    # the driver reports a 7,680-bit bus at 3,996 MHz (double data rate): 7.67 TB/s, NVIDIA's Blackwell datasheet
    # 7.7; the 8 TB/s the preset carried before was the 8,192-bit bus once reported, 4% more than the HBM delivers
    g = GPUSpec.from_name("b200")
    assert g.mem_bandwidth == 7.7e12
    assert g.mem_bandwidth == pytest.approx(7680 / 8 * 3996e6 * 2, rel=0.004)
