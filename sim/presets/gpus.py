"""GPU presets beyond sim/specs.py's: datasheet dense tensor rates (sparsity figures halved), memory as the
driver reports it (rounded from the datasheet capacity where no nvidia-smi figure is at hand), HBM/GDDR
bandwidth, PCIe and NVLink per direction. The source is named beside each; prices are left at 0 (unknown)."""

from __future__ import annotations

from typing import Any

_T = 1e12
_G = 1e9
_MiB = 1 << 20


def _gpu(name: str, mem_mib: int, bw: float, bf16: float, fp8: float, int8: float, fp32: float, pcie: float,
         nvlink: float) -> dict[str, Any]:
    return {"name": name, "memory_bytes": mem_mib * _MiB, "mem_bandwidth": bw,
            "peak_flops": {"fp32": fp32, "bf16": bf16, "fp16": bf16, "fp8": fp8, "int8": int8},
            "pcie_bandwidth": pcie, "nvlink_bandwidth": nvlink}


MORE_GPU_PRESETS: dict[str, dict[str, Any]] = {
    # NVIDIA H100 datasheet (PCIe and NVL columns): 80 GB at 2.0 TB/s, 756 dense bf16 TFLOP/s; NVL 94 GB at 3.9 TB/s
    "h100-pcie": _gpu("h100-pcie", 81559, 2.0e12, 756 * _T, 1513 * _T, 1513 * _T, 51 * _T, 50 * _G, 300 * _G),
    "h100-nvl": _gpu("h100-nvl", 95830, 3.9e12, 835.5 * _T, 1670.5 * _T, 1670.5 * _T, 60 * _T, 50 * _G, 300 * _G),
    # NVIDIA GH200 Grace Hopper datasheet: 96 GB HBM3 at 4 TB/s, the H100 SXM's compute; NVLink-C2C to the CPU
    "gh200": _gpu("gh200", 97871, 4.0e12, 989.4 * _T, 1978.9 * _T, 1978.9 * _T, 67 * _T, 450 * _G, 450 * _G),
    # NVIDIA H20 (China SKU) product brief: 96 GB HBM3 at 4.0 TB/s, 148 dense bf16 TFLOP/s, 296 fp8
    "h20": _gpu("h20", 97871, 4.0e12, 148 * _T, 296 * _T, 296 * _T, 44 * _T, 50 * _G, 450 * _G),
    # NVIDIA HGX B200 datasheet, per GPU: 180 GB HBM3e at 8 TB/s, 2.25 dense bf16 PFLOP/s, 4.5 fp8; NVLink 5
    "b200": _gpu("b200", 183359, 8.0e12, 2250 * _T, 4500 * _T, 4500 * _T, 75 * _T, 50 * _G, 900 * _G),
    # NVIDIA A10G (AWS G5; A10-class GA102): 24 GB GDDR6 at 600 GB/s, 70 dense bf16 TFLOP/s, no fp8
    "a10g": _gpu("a10g", 23028, 600 * _G, 70 * _T, 0.0, 140 * _T, 31.2 * _T, 25 * _G, 0.0),
    # NVIDIA L40 datasheet: 48 GB GDDR6 at 864 GB/s, 181 dense bf16 TFLOP/s, 362 fp8
    "l40": _gpu("l40", 46068, 864 * _G, 181 * _T, 362 * _T, 362 * _T, 90.5 * _T, 25 * _G, 0.0),
    # NVIDIA A100 datasheet, 40 GB PCIe column: 1,555 GB/s, 312 dense bf16 TFLOP/s
    "a100-40gb-pcie": _gpu("a100-40gb-pcie", 40960, 1.555e12, 312 * _T, 0.0, 624 * _T, 19.5 * _T, 25 * _G, 0.0),
    # AMD Instinct MI300X datasheet: 192 GB HBM3 at 5.3 TB/s, 1307 dense bf16 TFLOP/s, 2615 fp8; Infinity Fabric
    "mi300x": _gpu("mi300x", 196592, 5.3e12, 1307.4 * _T, 2614.9 * _T, 2614.9 * _T, 163.4 * _T, 50 * _G, 448 * _G),
    # NVIDIA Ada (RTX 4090) whitepaper: 24 GB GDDR6X at 1,008 GB/s, 165 dense bf16 TFLOP/s (fp32 accumulate), 330 fp8
    "rtx-4090": _gpu("rtx-4090", 24564, 1008 * _G, 165.2 * _T, 330.3 * _T, 330.3 * _T, 82.6 * _T, 25 * _G, 0.0),
}
MORE_GPU_ALIASES = {"rtx4090": "rtx-4090", "4090": "rtx-4090", "h100-94gb": "h100-nvl"}
