"""The presets of sim/hardware/presets/: parameter counts against the figures their model cards publish, GPUs resolve."""

from __future__ import annotations

import pytest

from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec

# model card / paper figures (billions)
PUBLISHED = {"llama-2-7b": 6.74, "llama-2-13b": 13.02, "llama-2-70b": 68.98, "llama-3-8b": 8.03,
             "llama-3-70b": 70.55, "llama-3.1-405b": 405.85, "qwen2.5-14b": 14.77, "qwen2.5-32b": 32.76,
             "qwen2.5-72b": 72.71}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_matches_the_model_card(name: str) -> None:
    assert ModelSpec.from_name(name).num_params / 1e9 == pytest.approx(PUBLISHED[name], rel=2e-3)


@pytest.mark.parametrize("name", ["h100-pcie", "h100-nvl", "gh200", "h20", "b200", "a10g", "l40", "a100-40gb-pcie",
                                  "mi300x", "rtx-4090"])
def test_gpu_presets_resolve(name: str) -> None:
    g = GPUSpec.from_name(name)
    assert g.memory_bytes > 20 * 2**30 and g.mem_bandwidth > 5e11 and g.peak("bf16") > 5e13
