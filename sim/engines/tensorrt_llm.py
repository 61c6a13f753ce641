"""TensorRT-LLM 0.17 (the version of its perf-overview.md figures): ``deployment.engine: tensorrt-llm``.

Its memory rule takes a share of what is *left* after the engine loaded; its capacity scheduler
GUARANTEED_NO_EVICT admits a request only when the KV of its whole prompt + output is guaranteed, so nothing is
ever preempted; in-flight batching mixes context and generation requests in one step, chunked context off.
"""

from __future__ import annotations

import math
from typing import Any

from sim.engines.base import Engine, EngineKey
from sim.hardware.dtypes import GiB
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
# A decode step's linear layers: the measured share of the smaller roofline side (a decode row's compute, or the
# weight reads) that runs under the larger (``linear_overlap``, sim/costs/analytic.py). TensorRT-LLM's GEMM plugin
# runs cuBLASLt's heuristic kernels, as PyTorch's matmuls do; Vidur's per-operator profiles of them
# (github.com/microsoft/vidur at 7d47513, data/profiling/compute/{a100,h100}/<model>/mlp.csv: the median CUDA-event
# time of each layer's QKV, output, gate/up and down projections, 8 models on the A100 and 6 on the H100 at TP
# 1-8) at every decode-sized step (1-512 tokens, 3,350 points) fit ``max(c, m) + (1 - o) min(c, m)`` best (least
# squares on log time, c and m the cost model's sides at its default efficiencies) at o = 0.56: neither the
# roofline's max (1), which made the table's long-output runs at TP 2-8 up to 43% too fast, nor the sum (0, vLLM
# V1's, sim/engines/vllm_v1.py), which makes the table too slow (docs/throughput-residuals.md)
TRTLLM_LINEAR_OVERLAP = 0.56


class TensorRTLLM(Engine):
    name = "tensorrt-llm"
    aliases = ("trtllm", "trt-llm", "tensorrtllm")  # trtllm-serve, the project's own shorthand
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

    def linear_overlap(self, cfg: Any) -> float | None:
        return TRTLLM_LINEAR_OVERLAP

    def kv_budget(self, cfg: Any, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
        """``fraction x (total - weights - activations)``, the activations TensorRT's build-time buffers for
        max_num_tokens (estimated as vLLM's profile would find them, runtime overhead included)."""
        frac = cfg.kv_cache_free_gpu_mem_fraction or TRTLLM_FREE_GPU_MEMORY_FRACTION
        reserve = self.step_activations(model, kw)
        return self.free_share_budget(model, gpu, kw, frac, reserve, "", "activations")


ENGINE = TensorRTLLM()



def trtllm_bench_build(model: ModelSpec, tp: int, isl: int, osl: int, weight_bytes: float, kv_bytes: float,
                       gpu_memory_bytes: int, fraction: float = 0.95) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) that ``trtllm-bench build`` picks for a dataset of ``isl``/``osl`` tokens
    on ``tp`` GPUs of ``gpu_memory_bytes``, by the rule of tensorrt_llm/bench/build/tuning.py (calc_engine_setting,
    finetune_setting; its earliest version at hand, before the NVFP4 and hybrid-model changes; that 0.17's
    trtllm-bench ran the same rule is an assumption). The requests whose whole sequence fits the KV memory it
    estimates (``fraction`` of the GPUs' memory in GiB less the parameters counted in 10^9 bytes at
    ``weight_bytes`` each, as the tool mixes them; KV at ``kv_bytes`` an element, at least one KV head a GPU),
    capped at 4,096, give max_batch_size rounded up (to 32 below 256, at least 64; to 128 below 1,024; else to
    256), and that many requests times ``1 + isl / osl``, capped at 32,768, give max_num_tokens rounded up (to
    256 below 4,096, at least 2,048; to 512 below 8,192; else to 1,024). TensorRT sizes its activation buffers
    for max_num_tokens and its decoder buffers for max_batch_size: an engine built so for a small KV cache
    leaves more memory to it than trtllm-build's defaults (2,048 and 8,192) do."""
    per_token_gib = 2 * model.num_layers * max(tp, model.num_key_value_heads) * model.head_dim * kv_bytes / GiB
    free_gib = tp * gpu_memory_bytes / GiB - model.shard(1).stored_params * weight_bytes / 1e9
    requests = min(fraction * free_gib / per_token_gib / (isl + osl), 4096)
    tokens = min(requests * (1 + isl / osl), 32768)
    if requests < 256:
        max_batch_size = max(64, 32 * math.ceil(requests / 32))
    else:
        step = 128 if requests < 1024 else 256
        max_batch_size = step * math.ceil(requests / step)
    if tokens < 4096:
        return max_batch_size, max(2048, 256 * math.ceil(tokens / 256))
    step = 512 if tokens < 8192 else 1024
    return max_batch_size, step * math.ceil(tokens / step)
