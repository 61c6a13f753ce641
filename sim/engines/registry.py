"""Serving engines as servesim models them: ``deployment.engine``.

Each engine sets the rules a real server applies before and between steps, which the roofline alone does not know:

- the **memory budget**: how much of the GPU the KV cache gets (vLLM: a share of the whole card minus weights and
  profiled activations; TensorRT-LLM: a share of what is *left* after the engine loaded; SGLang: a static share
  of the card for weights plus KV);
- the **scheduler defaults**: chunked prefill and its token budget, the most sequences per step, how prompts
  and decodes share a step, and the **admission rule** (TensorRT-LLM's GUARANTEED_NO_EVICT admits a request only
  when the KV of its whole prompt + output is guaranteed, so nothing is ever preempted);
Every value is a default: a key given in the scenario's ``policy`` section wins. Without
``deployment.engine`` servesim keeps its classic idealised vLLM (chunked prefill off, prefill-first steps, 256
sequences, vLLM's memory rule): existing scenarios give the same results byte for byte.

Host time per step (vLLM 0.5 and 0.6's CPU work that the GPU waits for) is sim/engines/costs.py's. Scheduler
behaviours beyond these defaults (vLLM v1's prefix cache over every prompt block, vLLM 0.6's multi-step,
CUDA-graph batch padding, SGLang's prefill priority) are in ``sim/engines/sched.py``; their keys are in their own
block below. The per-request front end (HTTP, tokenization, streaming) of an online benchmark is sim/costs/online.py's
(``deployment.serving``). Not modelled yet (kept out rather than guessed): SGLang's new-token-ratio admission (it
admits while blocks are free and recomputes on shortage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.engines.costs import omit_when_unset
from sim.hardware.specs import (
    DEFAULT_RUNTIME_OVERHEAD_BYTES,
    GiB,
    GPUSpec,
    KVBudget,
    ModelDoesNotFitError,
    ModelSpec,
    estimate_activation_reserve,
    kv_budget,
)
from sim.workload.generator import Float, InputModel, Int

EngineName = Literal["vllm-v1", "vllm-v0", "tensorrt-llm", "sglang", "classic"]
ENGINE_NAMES: tuple[str, ...] = ("vllm-v1", "vllm-v0", "tensorrt-llm", "sglang", "classic")

# ---- the engines' own defaults, each with the version and the source it follows ----------------------------------

# vLLM v1 (0.8-0.11), vllm/engine/arg_utils.py EngineArgs (get_batch_defaults): on a GPU with >= 70 GiB that is
# not an A100, max_num_batched_tokens is 8192 for the OpenAI API server and 16384 for the offline LLM class, else
# 2048 and 8192; max_num_seqs is 1024 on such GPUs, else 256. Chunked prefill is always on in v1
# (vllm/v1/core/sched/scheduler.py: running requests first, then waiting ones, one token budget per step; a
# request that cannot get a block preempts the latest-admitted running one, by recompute).
VLLM_V1_LARGE_GPU_BYTES = 70 * GiB
VLLM_V1_BATCHED_TOKENS = {("api_server", True): 8192, ("offline", True): 16384,
                          ("api_server", False): 2048, ("offline", False): 8192}
VLLM_V1_MAX_NUM_SEQS = {True: 1024, False: 256}

# vLLM v0 (0.5-0.6), vllm/config.py SchedulerConfig: without chunked prefill max_num_batched_tokens is
# max(max_model_len, 2048) (_DEFAULT_MAX_NUM_BATCHED_TOKENS), with it 512; EngineArgs turns chunked prefill on by
# itself when max_model_len > 32K. max_num_seqs 256. vllm/core/scheduler.py schedules a step of prompts whenever
# one can start (prefill first), otherwise a step of decodes.
VLLM_V0_MIN_BATCHED_TOKENS = 2048
VLLM_V0_CHUNKED_BATCHED_TOKENS = 512
VLLM_V0_AUTO_CHUNK_LEN = 32 * 1024
VLLM_V0_MAX_NUM_SEQS = 256

# TensorRT-LLM 0.17 (the version of its perf-overview.md figures). KvCacheConfig.free_gpu_memory_fraction
# (tensorrt_llm/llmapi/llm_args.py, docs/source/reference/memory.md): the KV cache takes 0.9 of the memory still
# free once the engine (weights and the activation buffers TensorRT sized at build time for max_num_tokens) is
# loaded; trtllm-bench runs with 0.95 in most of the published rows. trtllm-build defaults: max_batch_size 2048,
# max_num_tokens 8192. Executor: capacity scheduler GUARANTEED_NO_EVICT (CapacitySchedulerPolicy), in-flight
# batching mixes context and generation requests in one step, chunked context off.
TRTLLM_FREE_GPU_MEMORY_FRACTION = 0.9
TRTLLM_MAX_BATCH_SIZE = 2048
TRTLLM_MAX_NUM_TOKENS = 8192

# SGLang 0.4 (python/sglang/srt/server_args.py): mem_fraction_static (weights + KV pool share of the whole GPU) is
# 0.88 at tp 1, 0.87 at tp >= 2, 0.85 at >= 4, 0.81 at >= 8, 0.79 at >= 16; the rest is for activations and CUDA
# graphs. chunked_prefill_size 8192 (2048 on GPUs under 25 GB). model_runner.py sizes the request pool as
# min(max(kv_tokens / context_len * 512, 2048), 4096): that bounds the running requests.
SGLANG_MEM_FRACTION_STATIC = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
SGLANG_CHUNKED_PREFILL_SIZE = 8192
SGLANG_SMALL_GPU_BYTES = 25_000 * (1 << 20)
SGLANG_SMALL_GPU_CHUNK = 2048


class EngineConfig(InputModel):
    """``deployment.engine``: which serving engine the simulated deployment runs (a name, or these keys)."""

    name: EngineName = Field(default="vllm-v1", description="vllm-v1 (0.8-0.11), vllm-v0 (0.5-0.6), tensorrt-llm "
                             "(0.17), sglang (0.4), or classic: servesim's own idealised vLLM, what a deployment "
                             "without an engine runs (to pin a scenario to it).")
    usage_context: Literal["api_server", "offline"] = Field(
        default="api_server", description="vLLM v1 sizes its step budget by how it is run: the OpenAI API server "
        "(8192 tokens on large GPUs) or the offline LLM class (16384).")
    kv_cache_free_gpu_mem_fraction: Float | None = Field(
        default=None, gt=0, le=1, description="tensorrt-llm: share of the memory left after loading that the KV "
        "cache takes; none: 0.9 (KvCacheConfig.free_gpu_memory_fraction).")
    mem_fraction_static: Float | None = Field(
        default=None, gt=0, le=1, description="sglang: share of the GPU for weights + KV pool; none: 0.88 at tp 1, "
        "less with more GPUs (server_args.py).")
    capacity_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] | None = Field(
        default=None, description="Admission: guaranteed_no_evict admits a request only when the KV of its whole "
        "prompt + output fits beside the running ones' (never preempts); max_utilization admits while blocks are "
        "free now (preempts when they run out). none: guaranteed_no_evict for tensorrt-llm, else max_utilization.")
    # host time per step (sim/engines/costs.py): the version it follows, and the ratio itself, overridable
    version: Literal["0.5", "0.6"] | None = Field(
        default=None, description="vllm-v0: the release followed, 0.5 (API server and scheduler in the GPU's "
        "process: host time 1.63x the GPU time, vLLM's 0.5.3 profile) or 0.6 (0.7x: V1's speedup over it); none: 0.6.")
    host_time_ratio: Float | None = Field(
        default=None, ge=0, le=100, description="Host (CPU) seconds a step adds per second of GPU work, the engine "
        "not overlapping them; none: the version's (vllm-v0 0.5: 1.63, 0.6: 0.7; other engines 0).")

    # sim/engines/costs.py's keys and sim/engines/sched.py's, recorded only when set
    _record_set_keys = omit_when_unset("version", "host_time_ratio", "enforce_eager", "cudagraph_capture_sizes",
                                       "enable_mixed_chunk", "num_scheduler_steps")
    # ---- scheduler behaviours (sim/engines/sched.py) ----
    enforce_eager: bool | None = Field(
        default=None, description="vllm-v1/vllm-v0: no CUDA graphs, so decode batches are not padded; none: false.")
    cudagraph_capture_sizes: list[Annotated[Int, Field(ge=1, le=1 << 20)]] | None = Field(
        default=None, min_length=1, description="vllm-v1/vllm-v0: decode batch sizes with a CUDA graph; a decode "
        "step is priced as the next size up (none: vLLM's list, 1, 2, 4, 8, 16, ... up to 512 (v1) or 256 (v0)).")
    enable_mixed_chunk: bool | None = Field(
        default=None, description="sglang: mix prompt chunks and decodes in one step (--enable-mixed-chunk); none: "
        "off, a step of prompts whenever one can run, else a step of decodes.")
    num_scheduler_steps: Int | None = Field(
        default=None, ge=1, le=1024, description="vllm-v0: vLLM 0.6's --num-scheduler-steps, decode steps run as "
        "one block; a prompt that arrives waits for the running block to end (chunked prefill off). none: 1.")

    @model_validator(mode="after")
    def _keys_of_the_engine(self) -> EngineConfig:
        if self.kv_cache_free_gpu_mem_fraction is not None and self.name != "tensorrt-llm":
            raise ValueError(f"kv_cache_free_gpu_mem_fraction is tensorrt-llm's; engine {self.name} sizes its KV "
                             "cache with " + ("mem_fraction_static" if self.name == "sglang"
                                              else "deployment.gpu_memory_utilization"))
        if self.version is not None and self.name != "vllm-v0":
            raise ValueError(f"version is vllm-v0's (0.5 or 0.6); engine {self.name} follows one release")
        if self.num_scheduler_steps is not None and self.name != "vllm-v0":
            raise ValueError(f"num_scheduler_steps is vllm-v0's (vLLM 0.6 multi-step); engine {self.name} schedules "
                             "every step")
        if (self.enforce_eager or self.cudagraph_capture_sizes is not None) and self.name not in ("vllm-v1",
                                                                                                  "vllm-v0"):
            raise ValueError(f"enforce_eager and cudagraph_capture_sizes are vLLM's; servesim runs engine "
                             f"{self.name} without CUDA-graph padding")
        if self.enable_mixed_chunk is not None and self.name != "sglang":
            raise ValueError(f"enable_mixed_chunk is sglang's; engine {self.name} sets how steps mix with "
                             "policy.enable_chunked_prefill and policy.prefill_mode")
        if self.mem_fraction_static is not None and self.name != "sglang":
            raise ValueError(f"mem_fraction_static is sglang's; engine {self.name} sizes its KV cache with " +
                             ("kv_cache_free_gpu_mem_fraction" if self.name == "tensorrt-llm"
                              else "deployment.gpu_memory_utilization"))
        return self


def engine_field(value: Any) -> Any:
    """``deployment.engine`` given as a bare name becomes ``{name: ...}``."""
    return {"name": value} if isinstance(value, str) else value


EngineField = Field(default=None, description="Serving engine whose memory rule and scheduler defaults apply "
                    "(vllm-v1, vllm-v0, tensorrt-llm, sglang, or {name: ..., its keys}); none: servesim's classic "
                    "idealised vLLM (chunking off, prefill-first steps).")
engine_validator = field_validator("engine", mode="before")(classmethod(lambda cls, v: engine_field(v)))


# ---- scheduler defaults --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SchedulerDefaults:
    """What an engine schedules with where the scenario's ``policy`` section leaves a key out."""

    enable_chunked_prefill: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    prefill_mode: str  # "prefill_first" or "mixed" (only read without chunking)
    capacity_scheduler_policy: str  # "guaranteed_no_evict" or "max_utilization"


def sglang_mem_fraction_static(tensor_parallel_size: int) -> float:
    """SGLang's default mem_fraction_static for a tensor-parallel degree (server_args.py)."""
    return next(f for tp, f in SGLANG_MEM_FRACTION_STATIC if tensor_parallel_size >= tp)


def _large_gpu(gpu: GPUSpec) -> bool:
    """vLLM v1's test for its larger defaults: >= 70 GiB and not an A100 (PR #17885: larger budgets slowed it)."""
    return gpu.memory_bytes >= VLLM_V1_LARGE_GPU_BYTES and "a100" not in gpu.name.lower()


def _token_budget(engine: EngineConfig, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
    """The engine's default max_num_batched_tokens with chunked prefill on or off."""
    if engine.name == "vllm-v1":
        budget = VLLM_V1_BATCHED_TOKENS[(engine.usage_context, _large_gpu(gpu))]
        return budget if chunked else max(budget, max_model_len)  # unchunked, a whole prompt must fit one step
    if engine.name == "vllm-v0":
        return VLLM_V0_CHUNKED_BATCHED_TOKENS if chunked else max(max_model_len, VLLM_V0_MIN_BATCHED_TOKENS)
    if engine.name == "tensorrt-llm":
        # without chunked context a whole prompt must fit one step, so the engine is built for the longest one
        return TRTLLM_MAX_NUM_TOKENS if chunked else max(TRTLLM_MAX_NUM_TOKENS, max_model_len)
    chunk = SGLANG_SMALL_GPU_CHUNK if gpu.memory_bytes < SGLANG_SMALL_GPU_BYTES else SGLANG_CHUNKED_PREFILL_SIZE
    return chunk if chunked else max(chunk, max_model_len)


def scheduler_defaults(engine: EngineConfig, gpu: GPUSpec, max_model_len: int,
                       kv_tokens: int | None = None) -> SchedulerDefaults:
    """The engine's scheduler settings for a deployment on ``gpu`` with ``max_model_len``. ``kv_tokens`` (the KV
    cache's size in tokens) is needed for SGLang, whose request pool follows it."""
    name = engine.name
    policy = engine.capacity_scheduler_policy or ("guaranteed_no_evict" if name == "tensorrt-llm"
                                                  else "max_utilization")
    chunked = {"vllm-v1": True, "vllm-v0": max_model_len > VLLM_V0_AUTO_CHUNK_LEN, "tensorrt-llm": False,
               "sglang": True}[name]
    if name == "vllm-v1":
        seqs = VLLM_V1_MAX_NUM_SEQS[_large_gpu(gpu)]
    elif name == "vllm-v0":
        seqs = VLLM_V0_MAX_NUM_SEQS
    elif name == "tensorrt-llm":
        seqs = TRTLLM_MAX_BATCH_SIZE
    else:
        seqs = 2048 if kv_tokens is None else int(min(max(kv_tokens / max_model_len * 512, 2048), 4096))
    return SchedulerDefaults(chunked, _token_budget(engine, gpu, chunked, max_model_len), seqs,
                             "prefill_first" if name == "vllm-v0" else "mixed", policy)


CLASSIC_POLICY = {"max_num_seqs": 256, "enable_chunked_prefill": False, "prefill_mode": "prefill_first"}


def classic_policy(policy: Any) -> Any:
    """A continuous policy config with servesim's classic defaults where it has none, as before engines existed."""
    if getattr(policy, "type", None) != "continuous":
        return policy
    return policy.model_copy(update={k: v for k, v in CLASSIC_POLICY.items() if getattr(policy, k) is None})


def apply_engine(policy: Any, engine: EngineConfig | None, gpu: GPUSpec, max_model_len: int,
                 kv_tokens: int | None = None) -> Any:
    """The ``policy`` config with every key it leaves unset (None) filled from the engine's defaults; a static
    policy, or no engine, comes back as it is (the policy's own classic defaults then apply)."""
    if getattr(policy, "type", None) != "continuous":
        return policy
    if engine is None or engine.name == "classic":
        return classic_policy(policy)
    d = scheduler_defaults(engine, gpu, max_model_len, kv_tokens)
    update = {k: getattr(d, k) for k in ("enable_chunked_prefill", "max_num_seqs", "prefill_mode",
                                          "capacity_scheduler_policy") if getattr(policy, k) is None}
    if policy.max_num_batched_tokens is None:
        chunked = update.get("enable_chunked_prefill", policy.enable_chunked_prefill)
        update["max_num_batched_tokens"] = _token_budget(engine, gpu, bool(chunked), max_model_len)
    return policy.model_copy(update=update)


# ---- memory budget -------------------------------------------------------------------------------------------------
def engine_kv_budget(engine: EngineConfig | None, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
    """The KV cache ``engine`` gives one GPU; ``kw`` are ``sim.hardware.specs.kv_budget``'s keywords.

    - vLLM (v0 and v1; vllm/worker/worker.py determine_num_available_blocks, vllm/v1/worker/gpu_worker.py
      determine_available_memory): ``gpu_memory_utilization x total - weights - profiled peak activations``.
    - TensorRT-LLM: ``fraction x (total - weights - activations)``, the activations TensorRT's build-time buffers
      for max_num_tokens (estimated as vLLM's profile would find them, runtime overhead included).
    - SGLang (model_runner.py profile_max_num_token): ``mem_fraction_static x total - weights - runtime
      overhead`` (what is in use besides the weights when it measures the free memory).
    """
    if engine is None or engine.name in ("vllm-v1", "vllm-v0", "classic"):
        return kv_budget(model, gpu, **kw)
    tp = kw.get("tensor_parallel_size", 1)
    weights = model.shard(tp).weight_bytes(kw.get("weight_dtype", "bf16"))
    total = gpu.memory_bytes
    if engine.name == "tensorrt-llm":
        frac = engine.kv_cache_free_gpu_mem_fraction or TRTLLM_FREE_GPU_MEMORY_FRACTION
        reserve = estimate_activation_reserve(
            model, weight_dtype=kw.get("weight_dtype", "bf16"), tensor_parallel_size=tp,
            max_num_batched_tokens=kw["max_num_batched_tokens"], max_num_seqs=kw["max_num_seqs"])
        free = total - weights - reserve
        kv_mem = math.floor(frac * free) if free > 0 else free
        rule = f"{frac} x the {free / GiB:.2f} GiB left after {weights / GiB:.2f} GiB of weights and " \
               f"{reserve / GiB:.2f} GiB of activations"
    else:
        frac = engine.mem_fraction_static or sglang_mem_fraction_static(tp)
        reserve = DEFAULT_RUNTIME_OVERHEAD_BYTES
        kv_mem = math.floor(frac * total) - weights - reserve
        rule = f"mem_fraction_static {frac} x {total / GiB:.2f} GiB less {weights / GiB:.2f} GiB of weights and " \
               f"{reserve / GiB:.2f} GiB of runtime"
    # vLLM's arithmetic with the engine's KV memory: usable = weights + reserve + kv memory
    usable = weights + reserve + kv_mem
    args = {k: v for k, v in kw.items() if k not in ("gpu_memory_utilization", "max_num_batched_tokens",
                                                      "max_num_seqs")}
    try:
        b = kv_budget(model, gpu, gpu_memory_utilization=1.0, activation_reserve_bytes=total - weights - kv_mem,
                      **args)
    except ModelDoesNotFitError:
        raise ModelDoesNotFitError(
            f"{model.name} does not fit on {tp} x {gpu.name} under {engine.name}: its KV cache gets {rule}, less "
            f"than one KV block; use more GPUs (tensor_parallel_size) or smaller weights (weight_dtype)") from None
    return replace(b, gpu_memory_utilization=usable / total, usable_memory=usable, activation_reserve=reserve)


def budget_kwargs(deployment: Any, max_num_batched_tokens: int, max_num_seqs: int) -> dict[str, Any]:
    """``kv_budget``'s keywords for a ``Deployment`` section and the step limits its activations are sized for."""
    dep = deployment
    return dict(gpu_memory_utilization=dep.gpu_memory_utilization, weight_dtype=dep.weight_dtype,
                kv_dtype=dep.kv_dtype, block_size=dep.block_size, tensor_parallel_size=dep.tensor_parallel_size,
                num_gpu_blocks_override=dep.num_gpu_blocks, max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs)


def resolve_policy(policy: Any, deployment: Any, model: ModelSpec, gpu: GPUSpec, max_model_len: int) -> Any:
    """``apply_engine`` for a ``Deployment`` section: SGLang's request pool needs the KV size first (its memory
    rule does not depend on the step limits, so it is sized once here)."""
    eng = deployment.engine
    kv_tokens = None
    if eng is not None and eng.name == "sglang" and getattr(policy, "max_num_seqs", 0) is None:
        try:
            kv_tokens = engine_kv_budget(eng, model, gpu, **budget_kwargs(deployment, 1, 1)).capacity_tokens
        except ValueError:
            kv_tokens = None  # does not fit: size_kv_cache says so with the limits it is given
    return apply_engine(policy, eng, gpu, max_model_len, kv_tokens)


def recorded_config(deployment: dict[str, Any], policy: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The deployment and (resolved) policy sections as a run records them: keys this module added are left out
    while unset, so that a run without ``deployment.engine`` records exactly what it recorded before."""
    dep = {k: v for k, v in deployment.items() if not (k == "engine" and v is None)}
    pol = {k: v for k, v in policy.items() if not (k == "capacity_scheduler_policy" and v is None)}
    return dep, pol
