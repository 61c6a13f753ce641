"""vLLM v0 (0.5-0.6): ``deployment.engine: vllm-v0``.

Prefill-first steps without chunking (chunked prefill on by itself past 32K tokens of context), vLLM's memory
rule, the host (CPU) time per step that 0.5 and 0.6 add (sim/engines/costs.py's docstring), 0.6's multi-step
scheduling (``num_scheduler_steps``, sim/engines/sched.py), CUDA-graph padding of decode steps, FlashAttention-2.
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import VERSION_KEY, CudaGraphEngine, EngineKey
from sim.engines.costs import FA2_AMPERE_EFFICIENCY, FA2_HOPPER_EFFICIENCY
from sim.engines.sampling import SAMPLER_KEYS, vllm_sort_time
from sim.hardware.gpu import GPUSpec

# vLLM v0 (0.5-0.6), vllm/config.py SchedulerConfig: without chunked prefill max_num_batched_tokens is
# max(max_model_len, 2048) (_DEFAULT_MAX_NUM_BATCHED_TOKENS), with it 512; EngineArgs turns chunked prefill on by
# itself when max_model_len > 32K. max_num_seqs 256. vllm/core/scheduler.py schedules a step of prompts whenever
# one can start (prefill first), otherwise a step of decodes.
VLLM_V0_MIN_BATCHED_TOKENS = 2048
VLLM_V0_CHUNKED_BATCHED_TOKENS = 512
VLLM_V0_AUTO_CHUNK_LEN = 32 * 1024
VLLM_V0_MAX_NUM_SEQS = 256

# vLLM 0.5.3's profile (blog.vllm.ai 2024-09-05): API server 33% + scheduling 29% of the run, GPU 38%
VLLM_V05_API_SERVER_SHARE = 0.33
VLLM_V05_SCHEDULING_SHARE = 0.29
VLLM_V05_GPU_SHARE = 0.38
VLLM_V05_HOST_TIME_RATIO = (VLLM_V05_API_SERVER_SHARE + VLLM_V05_SCHEDULING_SHARE) / VLLM_V05_GPU_SHARE
# vLLM V1 alpha (blog.vllm.ai 2025-01-27): up to 1.7x V0's throughput without multi-step, same kernels
VLLM_V1_SPEEDUP_OVER_V06 = 1.7
VLLM_V06_HOST_TIME_RATIO = VLLM_V1_SPEEDUP_OVER_V06 - 1.0
# vLLM 0.6's asynchronous output processing (vllm#7049, #7921, #8050) "improves the time-per-output-token of
# running Llama 70B models on 4xH100 by 8.7%" (blog.vllm.ai 2024-09-05): the ratio above is of a V0 with it on.
# ModelConfig.verify_async_output_proc turns it off under enforce_eager on CUDA and ROCm alike ("Since,
# enforce-eager is enabled, async output processor cannot be used"): such a step waits for its output processing
# too, 1 / (1 - 0.087) of the step with it
VLLM_V06_ASYNC_OUTPUT_TPOT_GAIN = 0.087
# The price of that overlap is a step of latency: a step's outputs are processed by a callback that the next step's
# model runner calls "right before sampler" (vllm#7049), and LLMEngine.step returns them when that step ends, so
# every token, the first too, reaches the API server one step after it was sampled (unless no step follows: the
# queue is drained at once). vllm#8918 ("TTFT regression from v0.5.4 to 0.6.2"): MQLLMEngine and async output
# processing "slightly sacrifice TTFT in exchange for MUCH better TPOT"; tenstorrent/vllm#116 fixes the same in
# its fork: "the first prefill output was not processed ... until after the first decode (resulting in higher
# ttft for the batch 1 case)". Every token is moved so (sim/loop/run.py ``tokens_one_step_late``): TTFT and E2E
# grow by the step after, TPOT and ITL hardly move
# Both ratios come from runs of large batches, where V0's host work (sampling, input preparation, output
# processing, the scheduler: per step and per row) outlasts the GPU's. A decode step of a few rows waits for
# less: the multi-step RFC's trace (vllm-project/vllm#6854, Llama-3-8B on one GPU) shows "about 4ms of GPU bubble"
# a decode step, paid once per N steps with N scheduled at once; vllm#6801 (mpjlu, 2024-08-08): "When BS is 200,
# all this together can be 20ms", (20 - 4) ms over 200 rows. Both measured on one GPU: with tensor parallelism
# V0's driver also sends every step's inputs to the other workers, which neither measures, so there the ratio
# stays whole
VLLM_V0_DECODE_HOST_S = 4e-3
VLLM_V0_DECODE_HOST_PER_ROW_S = (20e-3 - VLLM_V0_DECODE_HOST_S) / 200
# vllm/core/block/... SelfAttnBlockSpaceManager (0.6; BlockSpaceManagerV1 alike): can_allocate counts the blocks of
# every token of the waiting sequence (seq.get_token_ids(): a preempted one's outputs too) and answers LATER unless
# free - required >= watermark_blocks = int(watermark x num_gpu_blocks), watermark 0.01; allocate() then takes them
# all at admission, chunked prefill or not (vllm/core/scheduler.py _schedule_prefills)
VLLM_V0_WATERMARK = 0.01


class VllmV0(CudaGraphEngine):
    name = "vllm-v0"
    keys = (VERSION_KEY,
            EngineKey(("num_scheduler_steps",), "num_scheduler_steps is vllm-v0's (vLLM 0.6 multi-step); engine "
                      "{name} schedules every step"),
            CudaGraphEngine.CUDA_GRAPH_KEYS, SAMPLER_KEYS)
    versions = ("0.5", "0.6")
    prefill_mode = "prefill_first"
    whole_prompt_watermark = VLLM_V0_WATERMARK
    nccl_nvls = True  # sim/engines/base.py NVLS_BYTES

    def chunked_prefill(self, max_model_len: int) -> bool:
        return max_model_len > VLLM_V0_AUTO_CHUNK_LEN

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        return VLLM_V0_CHUNKED_BATCHED_TOKENS if chunked else max(max_model_len, VLLM_V0_MIN_BATCHED_TOKENS)

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        return VLLM_V0_MAX_NUM_SEQS

    def default_capture_sizes(self, max_num_seqs: int) -> tuple[int, ...]:
        # vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE (0.5-0.6, decode only): 1, 2, 4 and multiples of 8
        # up to 256, no larger than max_num_seqs padded the same way
        v0 = (1, 2, 4, *range(8, 257, 8))
        cap = next((s for s in v0 if s >= max_num_seqs), v0[-1])
        return tuple(s for s in v0 if s <= cap)

    def sampler_sort_time(self, cfg: Any) -> float:
        return vllm_sort_time(cfg)  # FlashInfer opt-in in V0 (sim/engines/sampling.py)

    def host_time_ratio(self, cfg: Any, num_scheduler_steps: int) -> float:
        # 0.5: the API server and the scheduler in the GPU's process; 0.6: what V1 then removed, divided by the
        # steps scheduled at once (multi-step), and the output processing that enforce_eager no longer overlaps
        steps = getattr(cfg, "num_scheduler_steps", None) or num_scheduler_steps
        if (getattr(cfg, "version", None) or "0.6") == "0.5":
            return VLLM_V05_HOST_TIME_RATIO
        ratio = VLLM_V06_HOST_TIME_RATIO / steps
        if getattr(cfg, "enforce_eager", None):  # no async output processing (VLLM_V06_ASYNC_OUTPUT_TPOT_GAIN)
            return (1.0 + ratio) / (1.0 - VLLM_V06_ASYNC_OUTPUT_TPOT_GAIN) - 1.0
        return ratio

    def host_time_cap(self, cfg: Any, tensor_parallel_size: int) -> tuple[float, float]:
        if tensor_parallel_size != 1:
            return 0.0, 0.0
        steps = getattr(cfg, "num_scheduler_steps", None) or 1
        return VLLM_V0_DECODE_HOST_S / steps, VLLM_V0_DECODE_HOST_PER_ROW_S / steps

    def attention_efficiency(self, cfg: Any, architecture: str) -> float | None:
        # vLLM 0.5-0.6 runs FlashAttention-2 (its vllm-flash-attn build) on Hopper and Ampere alike
        if architecture == "hopper":
            return FA2_HOPPER_EFFICIENCY
        return FA2_AMPERE_EFFICIENCY if architecture == "ampere" else None

    def tokens_one_step_late(self, cfg: Any) -> bool:
        # vLLM 0.6's asynchronous output processing, on unless enforce_eager (VLLM_V06_ASYNC_OUTPUT_TPOT_GAIN)
        return (getattr(cfg, "version", None) or "0.6") != "0.5" and not getattr(cfg, "enforce_eager", None)

    def frontend_in_host_time(self, cfg: Any) -> bool:
        # vLLM 0.5 ran its API server in the GPU's process: the host time ratio holds its (de)tokenization
        return getattr(cfg, "version", None) == "0.5"


ENGINE = VllmV0()
