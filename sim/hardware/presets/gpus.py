"""GPU presets (sim/hardware/gpu.py makes GPUSpecs of them): datasheet dense tensor rates (sparsity figures halved),
memory as the driver reports it (rounded from the datasheet capacity where no nvidia-smi figure is at hand),
HBM/GDDR bandwidth, PCIe and NVLink per direction. The source is named beside each added preset; their prices
are left at 0 (unknown)."""

from __future__ import annotations

from typing import Any

_T = 1e12
_G = 1e9
_MiB = 1 << 20


# Datasheet dense rates (sparsity figures halved). fp32 is the plain (non-tensor-core) rate.
# Memory: nvidia-smi's memory.total. PCIe: effective pinned-memory copy rate per direction, about 50 GB/s for
# Gen5 x16 and 25 GB/s for Gen4 x16. NVLink: per GPU per direction (900 GB/s total on Hopper, 600 on A100).
# Prices: typical on-demand USD per GPU-hour at specialist GPU clouds in 2024-25; no single source, an
# assumption for cost-per-token comparisons only; override with GPUSpec.from_dict for a real quote.
# The presets added later carry no price (0): `servesim plan` leaves them out unless named.
# Power (sim/costs/energy.py): tdp_w is the board's default power limit from its datasheet (H100 SXM and H200 SXM
# 700 W, A100 SXM 400 W, A100 40 GB PCIe 250 W, H100 PCIe 350 W, H100 NVL and H20 400 W, L40S 350 W, L40 300 W,
# L4 72 W, B200 1000 W, RTX 4090 450 W: NVIDIA's datasheets; MI300X 750 W: AMD's). GH200 (module power shared
# with the CPU) and A10G carry none. idle_w is the draw of
# an idle GPU with a process holding it (clocks up, nothing running): no datasheet gives it; the figures are an
# assumption of about a tenth of the limit (a fifth on the 72 W L4), below the 137 W an H200 drew at its lightest
# decode (Ma et al., "The Illusion of Power Capping in LLM Decode", arXiv 2605.11999), except the B200's, measured
# (below). 0: unknown, no energy.
# architecture: the chip generation (hopper, ampere, ada, blackwell, cdna3), from the same datasheets; what reads it
# (FlashAttention-3 runs on Hopper only, sim/engines/) asks the GPU rather than guessing from its name.
# The presets servesim started with.
BASE_GPU_PRESETS: dict[str, dict[str, Any]] = {
    "h200": dict(
        name="h200", architecture="hopper", memory_bytes=143771 * _MiB, mem_bandwidth=4.8e12,
        peak_flops={"fp32": 67 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T,
                       "int8": 1978.9 * _T},
        pcie_bandwidth=50 * _G, nvlink_bandwidth=450 * _G, price_per_hour=3.50,
        tdp_w=700.0, idle_w=90.0,
    ),
    "h100-sxm": dict(
        name="h100-sxm", architecture="hopper", memory_bytes=81559 * _MiB, mem_bandwidth=3.35e12,
        peak_flops={"fp32": 67 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T,
                       "int8": 1978.9 * _T},
        pcie_bandwidth=50 * _G, nvlink_bandwidth=450 * _G, price_per_hour=2.50,
        tdp_w=700.0, idle_w=70.0,
    ),
    "a100-80gb": dict(
        name="a100-80gb", architecture="ampere", memory_bytes=81920 * _MiB, mem_bandwidth=2.039e12,
        peak_flops={"fp32": 19.5 * _T, "bf16": 312 * _T, "fp16": 312 * _T, "fp8": 0.0, "int8": 624 * _T},
        pcie_bandwidth=25 * _G, nvlink_bandwidth=300 * _G, price_per_hour=1.60,
        tdp_w=400.0, idle_w=50.0,
    ),
    "a100-40gb": dict(
        name="a100-40gb", architecture="ampere", memory_bytes=40960 * _MiB, mem_bandwidth=1.555e12,
        peak_flops={"fp32": 19.5 * _T, "bf16": 312 * _T, "fp16": 312 * _T, "fp8": 0.0, "int8": 624 * _T},
        pcie_bandwidth=25 * _G, nvlink_bandwidth=300 * _G, price_per_hour=1.20,
        tdp_w=400.0, idle_w=50.0,
    ),
    "l40s": dict(
        name="l40s", architecture="ada", memory_bytes=46068 * _MiB, mem_bandwidth=864 * _G,
        peak_flops={"fp32": 91.6 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T, "fp8": 733 * _T,
                       "int8": 733 * _T},
        pcie_bandwidth=25 * _G, nvlink_bandwidth=0.0, price_per_hour=0.90,
        tdp_w=350.0, idle_w=35.0,
    ),
    "l4": dict(
        name="l4", architecture="ada", memory_bytes=23034 * _MiB, mem_bandwidth=300 * _G,
        peak_flops={"fp32": 30.3 * _T, "bf16": 121 * _T, "fp16": 121 * _T, "fp8": 242.5 * _T,
                       "int8": 242.5 * _T},
        pcie_bandwidth=25 * _G, nvlink_bandwidth=0.0, price_per_hour=0.70,
        tdp_w=72.0, idle_w=16.0,
    ),
}
BASE_GPU_ALIASES = {"h100": "h100-sxm", "h100-80gb": "h100-sxm", "h200-sxm": "h200"}
# names of more than one preset whose memory differs, so that a capacity answer would be off by half: refused with
# the choices (``--gpu a100`` was the 80 GB part without a word, where a user of a 40 GB A100 gets half the KV)
AMBIGUOUS_GPU_NAMES = {"a100": ("a100-80gb", "a100-40gb", "a100-40gb-pcie")}


def _gpu(name: str, architecture: str, mem_mib: int, bw: float, bf16: float, fp8: float, int8: float, fp32: float,
         pcie: float, nvlink: float, tdp_w: float = 0.0, idle_w: float = 0.0) -> dict[str, Any]:
    return {"name": name, "architecture": architecture, "memory_bytes": mem_mib * _MiB, "mem_bandwidth": bw,
            "peak_flops": {"fp32": fp32, "bf16": bf16, "fp16": bf16, "fp8": fp8, "int8": int8},
            "pcie_bandwidth": pcie, "nvlink_bandwidth": nvlink, "tdp_w": tdp_w, "idle_w": idle_w}


MORE_GPU_PRESETS: dict[str, dict[str, Any]] = {
    # NVIDIA H100 datasheet (PCIe and NVL columns): 80 GB at 2.0 TB/s, 756 dense bf16 TFLOP/s; NVL 94 GB at 3.9 TB/s
    "h100-pcie": _gpu("h100-pcie", "hopper", 81559, 2.0e12, 756 * _T, 1513 * _T, 1513 * _T, 51 * _T, 50 * _G, 300 * _G,
                      350.0, 45.0),
    "h100-nvl": _gpu("h100-nvl", "hopper", 95830, 3.9e12, 835.5 * _T, 1670.5 * _T, 1670.5 * _T, 60 * _T, 50 * _G,
                      300 * _G, 400.0, 50.0),
    # NVIDIA GH200 Grace Hopper datasheet: 96 GB HBM3 at 4 TB/s, the H100 SXM's compute; NVLink-C2C to the CPU
    "gh200": _gpu("gh200", "hopper", 97871, 4.0e12, 989.4 * _T, 1978.9 * _T, 1978.9 * _T, 67 * _T, 450 * _G, 450 * _G),
    # NVIDIA H20 (China SKU) product brief: 96 GB HBM3 at 4.0 TB/s, 148 dense bf16 TFLOP/s, 296 fp8
    "h20": _gpu("h20", "hopper", 97871, 4.0e12, 148 * _T, 296 * _T, 296 * _T, 44 * _T, 50 * _G, 450 * _G,
                      400.0, 50.0),
    # NVIDIA HGX B200 datasheet, per GPU: 180 GB HBM3e, 2.25 dense bf16 PFLOP/s, 4.5 fp8; NVLink 5. HBM at 7.7 TB/s,
    # NVIDIA's Blackwell datasheet for the B200 SXM (the 8 TB/s of earlier material matches the 8,192-bit bus the driver
    # once reported; it reports 7,680 bits at 3,996 MHz, 7.67 TB/s: pytorch/ao PR #4002, ai-dynamo/aiconfigurator
    # PR #1246).
    # idle_w measured, not assumed: 251.3 W a GPU with Llama-3.1-70B loaded and nothing running (8x B200, vLLM
    # 0.19.1; 191.2 W with nothing loaded), vllm-project/semantic-router at 5805266, src/fleet-sim/studies/
    # context-length-power-efficiency/README.md. ML.ENERGY v3.0's host-bound B200 rows agree: Qwen3 8B/32B/30B-A3B
    # at batch 8-16 of GPQA draw 294-535 W with the GPU's roofline busy 13-44% of each step, a static draw of 213-302 W
    # under sim/costs/energy.py's formula (docs/engines-and-hardware.md)
    "b200": _gpu("b200", "blackwell", 183359, 7.7e12, 2250 * _T, 4500 * _T, 4500 * _T, 75 * _T, 50 * _G, 900 * _G,
                      1000.0, 251.3),
    # NVIDIA A10G (AWS G5; A10-class GA102): 24 GB GDDR6 at 600 GB/s, 70 dense bf16 TFLOP/s, no fp8
    "a10g": _gpu("a10g", "ampere", 23028, 600 * _G, 70 * _T, 0.0, 140 * _T, 31.2 * _T, 25 * _G, 0.0),
    # NVIDIA L40 datasheet: 48 GB GDDR6 at 864 GB/s, 181 dense bf16 TFLOP/s, 362 fp8
    "l40": _gpu("l40", "ada", 46068, 864 * _G, 181 * _T, 362 * _T, 362 * _T, 90.5 * _T, 25 * _G, 0.0,
                      300.0, 35.0),
    # NVIDIA A100 datasheet, 40 GB PCIe column: 1,555 GB/s, 312 dense bf16 TFLOP/s
    "a100-40gb-pcie": _gpu("a100-40gb-pcie", "ampere", 40960, 1.555e12, 312 * _T, 0.0, 624 * _T, 19.5 * _T, 25 * _G,
                      0.0, 250.0, 35.0),
    # AMD Instinct MI300X datasheet: 192 GB HBM3 at 5.3 TB/s, 1307 dense bf16 TFLOP/s, 2615 fp8; Infinity Fabric
    "mi300x": _gpu("mi300x", "cdna3", 196592, 5.3e12, 1307.4 * _T, 2614.9 * _T, 2614.9 * _T, 163.4 * _T, 50 * _G,
                      448 * _G, 750.0, 120.0),
    # NVIDIA Ada (RTX 4090) whitepaper: 24 GB GDDR6X at 1,008 GB/s, 165 dense bf16 TFLOP/s (fp32 accumulate), 330 fp8
    "rtx-4090": _gpu("rtx-4090", "ada", 24564, 1008 * _G, 165.2 * _T, 330.3 * _T, 330.3 * _T, 82.6 * _T, 25 * _G, 0.0,
                      450.0, 30.0),
    # NVIDIA Blackwell datasheet, GB200 NVL72 per GPU (1,200 W): 2.5 dense bf16 PFLOP/s, 5 fp8, 90 TFLOP/s fp32;
    # 13.4 TB of HBM3e over 72 GPUs (186 GB each) at 8 TB/s; NVLink 5 (900 GB/s each way)
    "gb200": _gpu("gb200", "blackwell", 177383, 8.0e12, 2500 * _T, 5000 * _T, 5000 * _T, 90 * _T, 50 * _G, 900 * _G,
                  1200.0, 140.0),
    # AMD Instinct MI325X datasheet: 256 GB HBM3E at 6 TB/s, the MI300X's compute (1307 dense bf16 TFLOP/s), 1,000 W
    "mi325x": _gpu("mi325x", "cdna3", 262144, 6.0e12, 1307.4 * _T, 2614.9 * _T, 2614.9 * _T, 163.4 * _T, 50 * _G,
                   448 * _G, 1000.0, 120.0),
    # NVIDIA H800 / A800 (China SKUs): the H100 SXM's and A100 80 GB's memory and compute, NVLink cut to 400 GB/s
    # (200 each way)
    "h800": _gpu("h800", "hopper", 81559, 3.35e12, 989.4 * _T, 1978.9 * _T, 1978.9 * _T, 67 * _T, 50 * _G, 200 * _G,
                 700.0, 70.0),
    "a800": _gpu("a800", "ampere", 81920, 2.039e12, 312 * _T, 0.0, 624 * _T, 19.5 * _T, 25 * _G, 200 * _G,
                 400.0, 50.0),
    # NVIDIA L20 product brief: 48 GB GDDR6 at 864 GB/s, 119.5 dense fp16 TFLOP/s, 239 fp8, 275 W
    "l20": _gpu("l20", "ada", 46068, 864 * _G, 119.5 * _T, 239 * _T, 239 * _T, 59.8 * _T, 25 * _G, 0.0, 275.0, 30.0),
    # NVIDIA A10 datasheet: 24 GB GDDR6 at 600 GB/s, 125 dense bf16 TFLOP/s, 150 W
    "a10": _gpu("a10", "ampere", 23028, 600 * _G, 125 * _T, 0.0, 250 * _T, 31.2 * _T, 25 * _G, 0.0, 150.0, 20.0),
    # NVIDIA T4 datasheet: 16 GB GDDR6 at 320 GB/s, 65 fp16 TFLOP/s (no bf16: engines run it in fp16), 70 W
    "t4": _gpu("t4", "turing", 15360, 320 * _G, 65 * _T, 0.0, 130 * _T, 8.1 * _T, 16 * _G, 0.0, 70.0, 10.0),
}
MORE_GPU_ALIASES = {"rtx4090": "rtx-4090", "4090": "rtx-4090", "h100-94gb": "h100-nvl"}

# Where each preset's figures come from (docs/engines-and-hardware.md's GPU table prints them): the datasheet's
# column, or what the figures were taken from. Common to all: the PCIe rate is the effective copy rate above, idle_w
# the assumption above (the B200's measured) and the price an assumption (0: none).
GPU_SOURCES: dict[str, str] = {
    "h200": "NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, the H100 SXM's compute",
    "h100-sxm": "NVIDIA H100 datasheet, SXM column",
    "a100-80gb": "NVIDIA A100 datasheet, 80 GB SXM column",
    "a100-40gb": "NVIDIA A100 datasheet, 40 GB SXM column",
    "l40s": "NVIDIA L40S datasheet",
    "l4": "NVIDIA L4 datasheet",
    "h100-pcie": "NVIDIA H100 datasheet, PCIe column",
    "h100-nvl": "NVIDIA H100 datasheet, NVL column",
    "gh200": "NVIDIA GH200 Grace Hopper datasheet (the H100 SXM's compute; module power shared with the CPU: none)",
    "h20": "NVIDIA H20 product brief",
    "b200": "NVIDIA HGX B200 datasheet, per GPU; HBM 7.7 TB/s: Blackwell datasheet (pytorch/ao PR #4002); idle "
            "measured: vllm-project/semantic-router fleet-sim",
    "a10g": "NVIDIA A10G (AWS G5, A10-class GA102); power: none",
    "l40": "NVIDIA L40 datasheet",
    "a100-40gb-pcie": "NVIDIA A100 datasheet, 40 GB PCIe column",
    "mi300x": "AMD Instinct MI300X datasheet",
    "rtx-4090": "NVIDIA Ada (RTX 4090) whitepaper (bf16 with fp32 accumulate)",
    "gb200": "NVIDIA Blackwell datasheet, GB200 NVL72 per GPU",
    "mi325x": "AMD Instinct MI325X datasheet (the MI300X's compute)",
    "h800": "the H100 SXM's figures, NVLink cut to 400 GB/s (China SKU)",
    "a800": "the A100 80 GB's figures, NVLink cut to 400 GB/s (China SKU)",
    "l20": "NVIDIA L20 product brief",
    "a10": "NVIDIA A10 datasheet",
    "t4": "NVIDIA T4 datasheet (fp16; no bf16)",
}
