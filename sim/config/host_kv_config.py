"""The ``kv_cache.host_cache`` section: a host-memory tier under the prefix cache (``sim.serving.host_kv_tier``)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from sim.config.input_model import Float, InputModel
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import KVBudget
from sim.serving.block_manager import PagedBlockManager
from sim.serving.host_kv_tier import DEFAULT_HOST_LOAD_LATENCY, HostKVTier
from sim.serving.kv_manager import KVManager

GB = 1e9


class HostCacheConfig(InputModel):
    """Evicted prefix blocks kept in host memory and loaded back over the host link on a hit (LMCache's
    ``max_local_cpu_size``, vLLM's CPU KV offloading size, SGLang HiCache's host pool)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    size_gib: Float = Field(gt=0, le=1 << 20, description="Host memory per GPU for offloaded prefix blocks, GiB.")
    bandwidth: Float | None = Field(
        default=None, gt=0, le=1e5,
        description="Host-to-GPU copy rate in GB/s (10^9 B/s); none: the GPU's PCIe rate from its spec "
        "(H100: 50, A100: 25).",
    )
    load_latency: Float = Field(
        default=DEFAULT_HOST_LOAD_LATENCY, ge=0, le=1,
        description="Seconds of fixed cost per request whose blocks are loaded (copy launch and sync).",
    )


def attach_host_tier(kv: KVManager, cfg: HostCacheConfig | None, budget: KVBudget, gpu: GPUSpec) -> None:
    """Give a paged manager with prefix caching the host tier ``cfg`` asks for (nothing when ``cfg`` is None).
    A ValueError when the KV cache cannot have one."""
    if cfg is None:
        return
    if not isinstance(kv, PagedBlockManager) or not kv.enable_prefix_caching:
        raise ValueError("host_cache holds evicted prefix-cache blocks: it needs enable_prefix_caching: true")
    bw = gpu.pcie_bandwidth if cfg.bandwidth is None else cfg.bandwidth * GB
    kv.host = HostKVTier(int(cfg.size_gib * 2**30 // budget.kv_bytes_per_block), budget.kv_bytes_per_block, bw,
                         cfg.load_latency)
