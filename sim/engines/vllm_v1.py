"""vLLM v1 (0.8-0.11): ``deployment.engine: vllm-v1``, the default engine of a ``deployment.engine`` section.

Chunked prefill always on, a step budget sized by the GPU and by how vLLM is run, vLLM's memory rule, prefix
caching over every prompt block (sim/engines/sched.py), CUDA-graph padding of decode steps, FlashAttention-3
on Hopper and decode GEMMs whose weight reads and arithmetic add up.
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import CudaGraphEngine
from sim.engines.costs import FA2_AMPERE_EFFICIENCY, FA3_HOPPER_EFFICIENCY
from sim.engines.sampling import PENALTY_HOST_TIME, SAMPLER_KEYS, vllm_sort_time
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
# A decode step's linear layers take the time of reading the weights plus the tensor cores' time, not the larger
# of the two (the roofline's max): the measured step grows with the batch by about the model's compute per token
# where the weight reads alone would hide it (issue 38's residuals by batch, docs/engines-and-hardware.md). Two
# published sources outside each other show it, each on its own:
# - ML.ENERGY Leaderboard v3.0 (vLLM 0.11.1; step = average batch / output tok/s; `bench_energy.py --step-gaps`):
#   at batch 64-256 of the chat task on H100s the time per row the roofline misses is 28-32 us for Llama-3.1-8B
#   and 34-53 us for Qwen3-8B (compute per token at the default efficiency: 25 us), 57-71 us for Llama-3.1-70B on
#   4 GPUs (59 us) and for Qwen3-32B on 2 (54 us), while Llama-3.1-8B draws 610-690 W of 700 (busy, not waiting
#   for the host);
# - dennislee22/vLLM-benchmarking (vLLM 0.10.1.1, Qwen2-7B on an A100, 1-500 requests at once): TPOT and ITL
#   predicted +17.6% too fast (median) with the max, +0.0% with the sum.
# The two differ in how they sample: ML.ENERGY's requests take top-p 0.95, which vLLM 0.11.1 filters by sorting
# each row's vocabulary, priced apart (sim/engines/sampling.py, 15 us a row for Llama-3.1-8B); dennislee22's used
# benchmark_serving.py's default, greedy, which never sorts. With the sort priced, ML.ENERGY's H100 rows still need
# the sum: output tok/s +1.0% (median) with it, +18.7% with the max (bench_energy).
# A structural choice between the two forms (0 or 1), not a fitted share; TensorRT-LLM's table is predicted too
# slow by the sum, so it keeps the share Vidur's profiles measure (sim/engines/tensorrt_llm.py). Only the decode
# rows' share of a step's tokens pays it: a prompt chunk's GEMMs have rows enough to overlap as the roofline assumes.
VLLM_V1_LINEAR_OVERLAP = 0.0
# The cost model's per-row overhead (10 us a row a step, sim/costs/analytic.py) is GPU time, not a gap the GPU waits
# through: V1 runs tokenization, detokenization and output streaming in the API server's process, beside the engine
# core's loop (vllm/v1/engine/core.py, async_llm.py), and with async scheduling (ML.ENERGY v3.0's configurations set
# it, vLLM 0.11.1; on by default by 0.20) the next step is scheduled while the GPU runs this one. What the step's
# per-row seconds hold is then GPU work the roofline does not itemize, and the published power says so: where the
# simulated time is right (output tok/s within 10%), ML.ENERGY's H100 rows at batch 192-1,024 draw 0.80-0.98 of the
# dynamic range (Llama-3.1-8B 685-690 W of 700), where the model, the per-row seconds (2-10% of each step) at static
# power, gave 0.69-0.78. Counted HBM-busy, as the sampler's sort is; the 1.5 ms step overhead stays idle: with it
# idle the H100's GPU-paced rows at batch 8-64 draw what was published (+2.5% median), counted busy +11.8%
# (bench_energy; docs/engines-and-hardware.md gives the figures before and after).
VLLM_V1_PER_REQUEST_BUSY = True


def _large_gpu(gpu: GPUSpec) -> bool:
    """vLLM v1's test for its larger defaults: >= 70 GiB and not an A100 (PR #17885: larger budgets slowed it)."""
    return gpu.memory_bytes >= VLLM_V1_LARGE_GPU_BYTES and "a100" not in gpu.name.lower()


class VllmV1(CudaGraphEngine):
    name = "vllm-v1"
    aliases = ("vllm",)  # `vllm serve` runs v1 since 0.8
    keys = (CudaGraphEngine.CUDA_GRAPH_KEYS, SAMPLER_KEYS)
    # vLLM v1 turns prefix caching on by default (vllm/engine/arg_utils.py: enable_prefix_caching None becomes
    # True under V1) and hashes every full block of every prompt (vllm/v1/core/kv_cache_utils.py)
    caches_every_prompt_block = True
    nccl_nvls = True  # sim/engines/base.py NVLS_BYTES
    # vllm/v1/core/sched/scheduler.py schedule(): the priority victim is chosen only when a running request's
    # allocate_slots fails; a waiting request that finds no slot or blocks stops the waiting loop and waits
    priority_preempts_for_waiting = False

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

    def linear_overlap(self, cfg: Any) -> float | None:
        return VLLM_V1_LINEAR_OVERLAP

    def per_request_busy(self, cfg: Any) -> bool:
        return VLLM_V1_PER_REQUEST_BUSY

    def sampler_sort_time(self, cfg: Any) -> float:
        return vllm_sort_time(cfg)  # 0.11.1's default: top-p by a sort (sim/engines/sampling.py)

    def penalty_host_time(self, cfg: Any) -> float:
        return PENALTY_HOST_TIME  # the V1 sampler's per-step penalty inputs (sim/engines/sampling.py)

    def attention_efficiency(self, cfg: Any, architecture: str) -> float | None:
        # FlashAttention-3 on Hopper (vllm/attention/utils/fa_utils.py picks version 3 on compute capability 9.0),
        # FlashAttention-2 on Ampere. On Blackwell (sm_100) vLLM 0.10-0.11 picks FlashInfer instead
        # (vllm/platforms/cuda.py: "Using FlashInfer backend with HND KV cache layout on V1 engine by default for
        # Blackwell (SM 10.0) GPUs"), its decode through TRT-LLM's kernels (vLLM PR #19825); no published share of
        # the peak for its prefill, so the cost model's default. Decode attention reads KV at the bandwidth either way
        if architecture == "hopper":
            return FA3_HOPPER_EFFICIENCY
        return FA2_AMPERE_EFFICIENCY if architecture == "ampere" else None


ENGINE = VllmV1()
