"""TensorRT-LLM 0.17 (the version of its perf-overview.md figures): ``deployment.engine: tensorrt-llm``.

Its memory rule takes a share of what is *left* after the engine loaded; its capacity scheduler
GUARANTEED_NO_EVICT admits a request only when the KV of its whole prompt + output is guaranteed, so nothing is
ever preempted; in-flight batching mixes context and generation requests in one step, chunked context off.
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import Engine, EngineKey
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import KVBudget
from sim.hardware.models import ModelSpec

# KvCacheConfig.free_gpu_memory_fraction (tensorrt_llm/llmapi/llm_args.py, docs/source/reference/memory.md): the
# KV cache takes 0.9 of the memory still free once the engine (weights and the activation buffers TensorRT sized
# at build time for max_num_tokens) is loaded; trtllm-bench runs with 0.95 in most of the published rows.
# trtllm-build defaults: max_batch_size 2048, max_num_tokens 8192. Executor: capacity scheduler
# GUARANTEED_NO_EVICT (CapacitySchedulerPolicy), in-flight batching mixes context and generation requests in one
# step, chunked context off.
TRTLLM_FREE_GPU_MEMORY_FRACTION = 0.9
TRTLLM_MAX_BATCH_SIZE = 2048
TRTLLM_MAX_NUM_TOKENS = 8192


class TensorRTLLM(Engine):
    name = "tensorrt-llm"
    memory_key = "kv_cache_free_gpu_mem_fraction"
    keys = (EngineKey(("kv_cache_free_gpu_mem_fraction",), "kv_cache_free_gpu_mem_fraction is tensorrt-llm's; "
                      "engine {name} sizes its KV cache with {memory_key}"),)
    capacity_scheduler_policy = "guaranteed_no_evict"

    def chunked_prefill(self, max_model_len: int) -> bool:
        return False

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        # without chunked context a whole prompt must fit one step, so the engine is built for the longest one
        return TRTLLM_MAX_NUM_TOKENS if chunked else max(TRTLLM_MAX_NUM_TOKENS, max_model_len)

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        return TRTLLM_MAX_BATCH_SIZE

    def kv_budget(self, cfg: Any, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
        """``fraction x (total - weights - activations)``, the activations TensorRT's build-time buffers for
        max_num_tokens (estimated as vLLM's profile would find them, runtime overhead included)."""
        frac = cfg.kv_cache_free_gpu_mem_fraction or TRTLLM_FREE_GPU_MEMORY_FRACTION
        reserve = self.step_activations(model, kw)
        return self.free_share_budget(model, gpu, kw, frac, reserve, "", "activations")


ENGINE = TensorRTLLM()
