"""The GPU presets as the table of docs/engines-and-hardware.md: each preset's name, aliases, figures and their
source, written from sim/hardware/presets/gpus.py (tests/test_hardware_doc.py fails when the page and the presets
part).

    python -m sim.hardware.gpu_table           # print the table
    python -m sim.hardware.gpu_table --update  # rewrite the page's table
"""

from __future__ import annotations

import sys

from sim.doc_sections import DOCS, update
from sim.hardware.gpu import GPUSpec
from sim.hardware.presets.gpus import (
    BASE_GPU_ALIASES,
    BASE_GPU_PRESETS,
    GPU_SOURCES,
    MORE_GPU_ALIASES,
    MORE_GPU_PRESETS,
)

BEGIN = "<!-- gpus: written by `python -m sim.hardware.gpu_table --update`; tests/test_hardware_doc.py checks it -->"
END = "<!-- end of gpus -->"
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update(PAGE, BEGIN, END, table())
    else:
        print(table())
