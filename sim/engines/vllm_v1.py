"""vLLM v1 (0.8-0.11): ``deployment.engine: vllm-v1``, the default engine of a ``deployment.engine`` section.

Chunked prefill always on, a step budget sized by the GPU and by how vLLM is run, vLLM's memory rule, prefix
caching over every prompt block (sim/engines/sched.py), CUDA-graph padding of decode steps and FlashAttention-3
on Hopper.
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import CudaGraphEngine
from sim.engines.costs import FA2_AMPERE_EFFICIENCY, FA3_HOPPER_EFFICIENCY
from sim.hardware.dtypes import GiB
from sim.hardware.gpu import GPUSpec

# vLLM v1 (0.8-0.11), vllm/engine/arg_utils.py EngineArgs (get_batch_defaults): on a GPU with >= 70 GiB that is
# not an A100, max_num_batched_tokens is 8192 for the OpenAI API server and 16384 for the offline LLM class, else
# 2048 and 8192; max_num_seqs is 1024 on such GPUs, else 256. Chunked prefill is always on in v1
# (vllm/v1/core/sched/scheduler.py: running requests first, then waiting ones, one token budget per step; a
# request that cannot get a block preempts the latest-admitted running one, by recompute).
VLLM_V1_LARGE_GPU_BYTES = 70 * GiB
VLLM_V1_BATCHED_TOKENS = {("api_server", True): 8192, ("offline", True): 16384,
                          ("api_server", False): 2048, ("offline", False): 8192}
VLLM_V1_MAX_NUM_SEQS = {True: 1024, False: 256}


def _large_gpu(gpu: GPUSpec) -> bool:
    """vLLM v1's test for its larger defaults: >= 70 GiB and not an A100 (PR #17885: larger budgets slowed it)."""
    return gpu.memory_bytes >= VLLM_V1_LARGE_GPU_BYTES and "a100" not in gpu.name.lower()


class VllmV1(CudaGraphEngine):
    name = "vllm-v1"
    keys = (CudaGraphEngine.CUDA_GRAPH_KEYS,)
    # vLLM v1 turns prefix caching on by default (vllm/engine/arg_utils.py: enable_prefix_caching None becomes
    # True under V1) and hashes every full block of every prompt (vllm/v1/core/kv_cache_utils.py)
    caches_every_prompt_block = True

    def chunked_prefill(self, max_model_len: int) -> bool:
        return True

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        budget = VLLM_V1_BATCHED_TOKENS[(cfg.usage_context, _large_gpu(gpu))]
        return budget if chunked else max(budget, max_model_len)  # unchunked, a whole prompt must fit one step

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        return VLLM_V1_MAX_NUM_SEQS[_large_gpu(gpu)]

    def default_capture_sizes(self, max_num_seqs: int) -> tuple[int, ...]:
        # vllm/config/vllm.py _set_cudagraph_sizes (0.11): 1, 2, 4, then multiples of 8 below 256 and of 16 from
        # 256 up to min(2 x max_num_seqs, 512)
        top = min(2 * max_num_seqs, 512)
        return tuple(s for s in (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)) if s <= top)

    def attention_efficiency(self, cfg: Any, architecture: str) -> float | None:
        # FlashAttention-3 on Hopper (vllm/attention/utils/fa_utils.py picks version 3 on compute capability 9.0),
        # FlashAttention-2 elsewhere
        if architecture == "hopper":
            return FA3_HOPPER_EFFICIENCY
        return FA2_AMPERE_EFFICIENCY if architecture == "ampere" else None


ENGINE = VllmV1()
