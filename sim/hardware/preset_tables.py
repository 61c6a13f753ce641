"""The model and GPU presets as the tables of docs/engines-and-hardware.md: each preset's name, aliases and figures
(a GPU's with their source), written from sim/hardware/presets/ (tests/test_hardware_doc.py fails when the page and
the presets part).

    python -m sim.hardware.preset_tables           # print the tables
    python -m sim.hardware.preset_tables --update  # rewrite the page's tables
"""

from __future__ import annotations

import sys

from sim.doc_sections import DOCS, update
from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec
from sim.hardware.presets.gpus import (
    BASE_GPU_ALIASES,
    BASE_GPU_PRESETS,
    GPU_SOURCES,
    MORE_GPU_ALIASES,
    MORE_GPU_PRESETS,
)
from sim.hardware.presets.models import BASE_MODEL_ALIASES, BASE_MODEL_PRESETS, MORE_MODEL_ALIASES, MORE_MODEL_PRESETS

BEGIN = "<!-- gpus: written by `python -m sim.hardware.preset_tables --update`; tests/test_hardware_doc.py checks -->"
END = "<!-- end of gpus -->"
MODELS_BEGIN = BEGIN.replace("gpus:", "models:")
MODELS_END = END.replace("gpus", "models")
PAGE = DOCS / "engines-and-hardware.md"
_MiB, _T, _G = 1 << 20, 1e12, 1e9


def _figure(x: float, scale: float) -> str:
    return "-" if x == 0 else f"{x / scale:,.5g}"


def table() -> str:
    aliases = BASE_GPU_ALIASES | MORE_GPU_ALIASES
    out = ["", "| preset | aliases | arch | memory (MiB) | bandwidth (TB/s) "
           "| bf16 / fp8 / int8 / fp32 (TFLOP/s, dense) | NVLink, PCIe (GB/s, one way) | TDP, idle (W) "
           "| price (USD/h) | source |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, fields in (BASE_GPU_PRESETS | MORE_GPU_PRESETS).items():
        g = GPUSpec(**fields)
        names = ", ".join(f"`{a}`" for a, to in aliases.items() if to == name) or "-"
        peaks = " / ".join(_figure(g.peak(d), _T) for d in ("bf16", "fp8", "int8", "fp32"))
        out.append(f"| `{name}` | {names} | {g.architecture} | {g.memory_bytes // _MiB:,} | "
                   f"{_figure(g.mem_bandwidth, _T)} | {peaks} | {_figure(g.nvlink_bandwidth, _G)}, "
                   f"{_figure(g.pcie_bandwidth, _G)} | {_figure(g.tdp_w, 1)}, {_figure(g.idle_w, 1)} | "
                   f"{_figure(g.price_per_hour, 1)} | {GPU_SOURCES[name]} |")
    return "\n".join([*out, ""])


def models_table() -> str:
    """Each model preset's shape (its source, the Hugging Face repository, is named beside it in
    sim/hardware/presets/models.py)."""
    aliases = BASE_MODEL_ALIASES | MORE_MODEL_ALIASES
    out = ["", "| preset | aliases | model_type | parameters (B) | layers | hidden | heads / KV heads | experts "
           "(active) | context |", "|---|---|---|---|---|---|---|---|---|"]
    for name in BASE_MODEL_PRESETS | MORE_MODEL_PRESETS:
        m = ModelSpec.from_name(name)
        names = ", ".join(f"`{a}`" for a, to in aliases.items() if to == name) or "-"
        experts = f"{m.num_experts} ({m.num_experts_per_tok})" if m.num_experts else "-"
        out.append(f"| `{name}` | {names} | {m.model_type} | {m.num_params / 1e9:,.4g} | {m.num_layers} | "
                   f"{m.hidden_size:,} | {m.num_attention_heads} / {m.num_key_value_heads} | {experts} | "
                   f"{m.max_position_embeddings:,} |")
    return "\n".join([*out, ""])


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update(PAGE, BEGIN, END, table())
        update(PAGE, MODELS_BEGIN, MODELS_END, models_table())
    else:
        print(models_table(), table(), sep="\n")
