"""A serving engine as servesim models it: the ``Engine`` base class every engine module subclasses, and the table
of engines by name.

An engine is one module (sim/engines/vllm_v1.py, vllm_v0.py, tensorrt_llm.py, sglang.py, lmdeploy.py, tgi.py,
classic.py, or a plugin's, see sim/plugins.py) holding its name, its constants with the version and source they
follow, and its hooks below; ``sim.engines.registry.register_engine`` adds it to the table. Every other module asks
the table (``engine_of``) and calls a hook, so no engine's name is compared anywhere but in its own module. Each
hook's default is what an engine does that has no rule of its own there (vLLM's memory rule, no CUDA-graph padding, no
host time, the cost model's attention efficiency, prefix caching off).

A hook receives the scenario's ``deployment.engine`` section (an ``EngineConfig``, ``cfg``; None for the engine a
deployment without one runs) for the keys it may read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from sim.hardware.dtypes import GiB
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import KVBudget, ModelDoesNotFitError, estimate_activation_reserve, kv_budget
from sim.hardware.models import ModelSpec
from sim.plugins import load_plugins


@dataclass(frozen=True, slots=True)
class SchedulerDefaults:
    """What an engine schedules with where the scenario's ``policy`` section leaves a key out."""

    enable_chunked_prefill: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    prefill_mode: str  # "prefill_first" or "mixed" (only read without chunking)
    capacity_scheduler_policy: str  # "guaranteed_no_evict" or "max_utilization"


@dataclass(frozen=True, slots=True)
class EngineKey:
    """``deployment.engine`` keys that only some engines read, and the refusal for the others: ``refusal`` is
    formatted with ``name`` (the engine refused) and ``memory_key`` (how that engine sizes its KV cache). A key
    whose value is false counts as not given when ``false_is_unset`` (enforce_eager: false is every engine's)."""

    keys: tuple[str, ...]
    refusal: str
    false_is_unset: bool = False

    def given(self, cfg: Any) -> bool:
        values = [getattr(cfg, k) for k in self.keys]
        return any(v if self.false_is_unset else v is not None for v in values)


# deployment.engine.version: the release an engine follows, for the engines that model more than one
VERSION_KEY = EngineKey(("version",), "version is vllm-v0's (0.5 or 0.6) and lmdeploy's (0.1 or 0.6); engine "
                        "{name} follows one release")


# NCCL's NVLink SHARP (NVLS): on NVSwitch machines of H100 and later NCCL turns it on for more than 2 GPUs, and its
# buffers take GPU memory that vLLM's memory profile counts (non-torch allocations) before it sizes the KV cache.
# vllm-project/vllm#9699 (2024-10-25): Llama-3.1-405B at TP 8 on 8x H200, 17,595 KV blocks with NVLS and 227xx with
# NCCL_NVLS_ENABLE=0, 1,032,192 bytes a block a GPU: 4.9-5.0 GiB a GPU. The H100 SXM's NVSwitch is the H200's.
NVLS_BYTES = int(4.95 * GiB)
NVLS_MIN_GPUS = 2  # "NVLS is only enabled for n > 2 GPUs"
NVLS_GPUS = ("h100-sxm", "h200")


class Engine:
    """One serving engine's rules. Subclasses set ``name`` and override the hooks where the engine differs."""

    name: str = ""
    # other names users type for it (the command that starts it, its project's spelling): accepted for ``name``,
    # matched ignoring case and with "_" read as "-"
    aliases: tuple[str, ...] = ()
    # how the engine sizes its KV cache, named in the refusal of another engine's memory key
    memory_key: str = "deployment.gpu_memory_utilization"
    # the deployment.engine keys this engine reads beyond those every engine has
    keys: tuple[EngineKey, ...] = ()
    # the releases ``deployment.engine.version`` may name, where the engine reads it (VERSION_KEY in its keys)
    versions: tuple[str, ...] = ()
    prefill_mode: str = "mixed"  # how prompts and decodes share a step without chunking
    capacity_scheduler_policy: str = "max_utilization"  # the admission rule
    # the scheduler's request pool follows the KV cache's size (max_num_seqs needs kv_tokens)
    needs_kv_tokens: bool = False
    # prefix caching on by default, and every full prompt block cached, not only shared prefixes (vLLM v1)
    caches_every_prompt_block: bool = False
    # under ``policy: {type: priority}``, a waiting request preempts lower-priority running work when it finds no
    # slot or blocks (vLLM V0's _schedule_priority_preemption); False: only a running request short of blocks
    # preempts (vLLM V1). The policy's preempt_for_waiting, where the scenario leaves it out.
    priority_preempts_for_waiting: bool = True
    # a waiting request starts only when the blocks of all the tokens it must compute are free beside this share of
    # the KV blocks, and takes them at once (vLLM V0's block manager); None: blocks as its chunks need them (V1)
    whole_prompt_watermark: float | None = None
    # NCCL's NVLink SHARP buffers count in the engine's memory profile (vLLM): see NVLS_BYTES
    nccl_nvls: bool = False

    # ---- scheduler defaults (sim/engines/registry.py apply_engine) ----
    def chunked_prefill(self, max_model_len: int) -> bool:
        """Whether the engine chunks prompts by default."""
        raise NotImplementedError(f"engine {self.name} sets no chunked_prefill default")

    def token_budget(self, cfg: Any, gpu: GPUSpec, chunked: bool, max_model_len: int) -> int:
        """The default max_num_batched_tokens with chunked prefill on or off."""
        raise NotImplementedError(f"engine {self.name} sets no token_budget default")

    def max_num_seqs(self, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> int:
        """The default most sequences per step (``kv_tokens``: the KV cache's size, where ``needs_kv_tokens``)."""
        raise NotImplementedError(f"engine {self.name} sets no max_num_seqs default")

    def scheduler_defaults(self, cfg: Any, gpu: GPUSpec, max_model_len: int,
                           kv_tokens: int | None = None) -> SchedulerDefaults:
        chunked = self.chunked_prefill(max_model_len)
        return SchedulerDefaults(chunked, self.token_budget(cfg, gpu, chunked, max_model_len),
                                 self.max_num_seqs(cfg, gpu, max_model_len, kv_tokens), self.prefill_mode,
                                 getattr(cfg, "capacity_scheduler_policy", None) or self.capacity_scheduler_policy)

    def max_prompt_len(self, cfg: Any, max_model_len: int) -> int | None:
        """The longest prompt the engine accepts where it bounds prompts apart from ``max_model_len`` (a longer
        one is refused on arrival); None: ``max_model_len`` bounds prompt and output together. ValueError where
        the bound cannot be (the engine refuses to start)."""
        return None

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse (ValueError naming the key) what this engine does not read of ``deployment.engine.options``, the
        keys of an engine of one's own; its hooks read them as ``cfg.options``. The shipped engines take none."""
        if options:
            raise ValueError(f"engine {self.name} takes no options (got {', '.join(sorted(options))}); options are "
                             "the keys of an engine of your own")

    def fill_policy(self, policy: Any, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> Any:
        """A continuous policy config with every key it leaves unset (None) filled from the engine's defaults."""
        d = self.scheduler_defaults(cfg, gpu, max_model_len, kv_tokens)
        update = {k: getattr(d, k) for k in ("enable_chunked_prefill", "max_num_seqs", "prefill_mode",
                                              "capacity_scheduler_policy") if getattr(policy, k) is None}
        if policy.max_num_batched_tokens is None:
            chunked = update.get("enable_chunked_prefill", policy.enable_chunked_prefill)
            update["max_num_batched_tokens"] = self.token_budget(cfg, gpu, bool(chunked), max_model_len)
        return policy.model_copy(update=update)

    # ---- memory ----
    def kv_budget(self, cfg: Any, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
        """The KV cache one GPU gets; ``kw`` are ``sim.hardware.kv_budget.kv_budget``'s keywords. Default: vLLM's
        rule (vllm/worker/worker.py determine_num_available_blocks, vllm/v1/worker/gpu_worker.py
        determine_available_memory): ``gpu_memory_utilization x total - weights - profiled peak activations``,
        less NCCL's NVLS buffers where ``nccl_nvls`` and the machine has them (``NVLS_BYTES``; in the budget's
        activation reserve)."""
        nvls = self.nccl_nvls and kw.get("tensor_parallel_size", 1) > NVLS_MIN_GPUS and gpu.name in NVLS_GPUS
        if nvls and kw.get("activation_reserve_bytes") is None:
            kw = kw | {"activation_reserve_bytes": self.step_activations(model, kw) + NVLS_BYTES}
        return kv_budget(model, gpu, **kw)

    def kv_budget_of(self, model: ModelSpec, gpu: GPUSpec, kw: dict[str, Any], weights: int, reserve: int,
                     kv_mem: int, rule: str) -> KVBudget:
        """The budget of an engine whose own rule gave ``kv_mem`` bytes of KV beside ``weights`` and ``reserve``,
        in vLLM's arithmetic (usable = weights + reserve + KV memory); ``rule`` words it when nothing fits."""
        total = gpu.memory_bytes
        usable = weights + reserve + kv_mem
        args = {k: v for k, v in kw.items() if k not in ("gpu_memory_utilization", "max_num_batched_tokens",
                                                          "max_num_seqs")}
        try:
            b = kv_budget(model, gpu, gpu_memory_utilization=1.0, activation_reserve_bytes=total - weights - kv_mem,
                          **args)
        except ModelDoesNotFitError:
            tp = kw.get("tensor_parallel_size", 1)
            raise ModelDoesNotFitError(
                f"{model.name} does not fit on {tp} x {gpu.name} under {self.name}: its KV cache gets {rule}, less "
                f"than one KV block; use more GPUs (tensor_parallel_size) or smaller weights (weight_dtype)") from None
        return replace(b, gpu_memory_utilization=usable / total, usable_memory=usable, activation_reserve=reserve)

    @staticmethod
    def step_activations(model: ModelSpec, kw: dict[str, Any]) -> int:
        """The activations of the largest step ``kw``'s limits allow, as vLLM's profile would find them (runtime
        overhead included): what an engine that sizes its buffers for that step holds besides weights and KV."""
        return estimate_activation_reserve(
            model, weight_dtype=kw.get("weight_dtype", "bf16"), tensor_parallel_size=kw.get("tensor_parallel_size", 1),
            max_num_batched_tokens=kw["max_num_batched_tokens"], max_num_seqs=kw["max_num_seqs"])

    def free_share_budget(self, model: ModelSpec, gpu: GPUSpec, kw: dict[str, Any], frac: float, reserve: int,
                          label: str, reserve_name: str) -> KVBudget:
        """The budget of an engine whose KV cache takes ``frac`` of what is free once the weights and ``reserve``
        bytes are in memory (TensorRT-LLM, LMDeploy); ``label`` and ``reserve_name`` word the rule."""
        weights = model.shard(kw.get("tensor_parallel_size", 1)).weight_bytes(kw.get("weight_dtype", "bf16"))
        free = gpu.memory_bytes - weights - reserve
        kv_mem = math.floor(frac * free) if free > 0 else free
        rule = f"{label}{frac} x the {free / GiB:.2f} GiB left after {weights / GiB:.2f} GiB of weights and " \
               f"{reserve / GiB:.2f} GiB of {reserve_name}"
        return self.kv_budget_of(model, gpu, kw, weights, reserve, kv_mem, rule)

    # ---- scheduler behaviours (sim/engines/sched.py) ----
    def prefill_priority(self, cfg: Any) -> bool:
        """A step of prompts whenever one can start, else a step of decodes (SGLang without mixed chunks)."""
        return False

    def capture_sizes(self, cfg: Any, max_num_seqs: int) -> tuple[int, ...]:
        """The decode batch sizes the engine captures CUDA graphs for, ascending; () where it runs eagerly."""
        return ()

    # ---- costs (sim/engines/costs.py, sim/costs/online.py) ----
    def host_time_ratio(self, cfg: Any, num_scheduler_steps: int) -> float:
        """Host seconds per GPU second of a step, the engine not overlapping them (``host_time_ratio`` not given)."""
        return 0.0

    def host_time_cap(self, cfg: Any, tensor_parallel_size: int) -> tuple[float, float]:
        """The most host seconds a step without prompt tokens waits for, per step and per row, where the ratio's
        share would be more (sim/costs/analytic.py ``host_time_cap``); (0, 0): none."""
        return 0.0, 0.0

    def context_decode_pass(self, cfg: Any) -> bool:
        """Prompts run in a forward of their own, less their last token, which the step's decode forward computes
        (sim/costs/analytic.py ``context_decode_pass``); False: one forward of every token."""
        return False

    def attention_efficiency(self, cfg: Any, architecture: str) -> float | None:
        """Prefill attention's achievable share of the peak on a GPU of ``architecture``; None: the cost model's."""
        return None

    def allreduce_latency(self, cfg: Any, tensor_parallel_size: int) -> float | None:
        """Fixed seconds of one tensor-parallel all-reduce in the engine's collectives (sim/costs/analytic.py
        ``allreduce_latency``); None: the cost model's (a custom kernel's or NCCL's under CUDA graphs)."""
        return None

    def linear_overlap(self, cfg: Any) -> float | None:
        """Share of the smaller side of the linear layers' roofline (compute or weight reads) the engine's kernels
        run under the larger (sim/costs/analytic.py); None: the cost model's (1, the roofline's max)."""
        return None

    def per_request_busy(self, cfg: Any) -> bool:
        """The cost model's per-row overhead is GPU work (the power model counts it HBM-busy), the engine's host work
        running beside the GPU (sim/costs/analytic.py ``per_request_busy``); False: the GPU waits through it."""
        return False

    def sampler_sort_time(self, cfg: Any) -> float:
        """Seconds per logit (row x vocabulary entry) the engine's sampler spends on a top-p request by sorting the
        vocabulary (sim/engines/costs.py); 0: it does not sort, or its sampler is not modelled."""
        return 0.0

    def penalty_host_time(self, cfg: Any) -> float:
        """Host seconds per context token of a step's rows the engine spends on a penalized request's inputs each
        step (sim/engines/sampling.py); 0: not modelled."""
        return 0.0

    def static_reserve_tokens(self, batch_size: int, max_model_len: int, max_input_len: int | None) -> int:
        """Tokens of a static batch's largest forward: its longest prompt (sim/engines/costs.py's docstring)."""
        prompt = max_model_len if max_input_len is None else min(max_input_len, max_model_len)
        return batch_size * prompt

    def frontend_in_host_time(self, cfg: Any) -> bool:
        """The API server's tokenization and detokenization are already in the host time ratio (vLLM 0.5)."""
        return False

    def tokens_one_step_late(self, cfg: Any) -> bool:
        """A step's sampled tokens leave the engine when the step after it ends, their output processing run
        under that step's forward (vLLM 0.6's asynchronous output processing, sim/engines/vllm_v0.py)."""
        return False


class CudaGraphEngine(Engine):
    """An engine that replays CUDA graphs for decode batches (vLLM): a decode step of B requests is priced as the
    next captured size up; ``enforce_eager`` turns it off and ``cudagraph_capture_sizes`` replaces the list."""

    CUDA_GRAPH_KEYS = EngineKey(("enforce_eager", "cudagraph_capture_sizes"),
                                "enforce_eager and cudagraph_capture_sizes are vLLM's; servesim runs engine {name} "
                                "without CUDA-graph padding", false_is_unset=True)

    def default_capture_sizes(self, max_num_seqs: int) -> tuple[int, ...]:
        raise NotImplementedError(f"engine {self.name} names no CUDA-graph sizes")

    def capture_sizes(self, cfg: Any, max_num_seqs: int) -> tuple[int, ...]:
        if cfg is None or cfg.enforce_eager:
            return ()
        if cfg.cudagraph_capture_sizes is not None:
            return tuple(sorted(set(cfg.cudagraph_capture_sizes)))
        return self.default_capture_sizes(max_num_seqs)


# ---- the table --------------------------------------------------------------------------------------------------
_ENGINES: dict[str, Engine] = {}
_WITHOUT: list[Engine] = []  # the engine a deployment without deployment.engine runs


def register_engine(engine: Engine, *, without_engine: bool = False) -> Engine:
    """Add ``engine`` under its name (a plugin's, see sim/plugins.py; sim/engines/registry.py adds the shipped
    ones): afterwards ``deployment.engine: NAME`` runs it. Registering another engine under a name taken is
    refused; the same one again is a no-op. ``without_engine``: it is what a deployment without
    ``deployment.engine`` runs (the classic engine)."""
    if not engine.name:
        raise ValueError(f"engine {type(engine).__name__} has no name")
    taken = _ENGINES.get(engine.name)
    if taken is not None and taken is not engine:
        raise ValueError(f"engine {engine.name!r} is already registered ({type(taken).__name__})")
    _ENGINES[engine.name] = engine
    if without_engine:
        _WITHOUT[:] = [engine]
    return engine


def engines() -> dict[str, Engine]:
    """The registered engines by name, in the order registered."""
    return dict(_ENGINES)


def engine_named(typed: str) -> str | None:
    """The registered engine's name that ``typed`` is, or one of its aliases is (ignoring case, "_" read as
    "-"); None when no engine has it."""
    if typed in _ENGINES:
        return typed
    key = _spelling(typed)  # both sides: a plugin's name or alias may be written "my_engine" or "MyEng"
    return next((e.name for e in _ENGINES.values() if key in map(_spelling, (e.name, *e.aliases))), None)


def _spelling(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def engine_of(cfg: Any) -> Engine:
    """The engine a ``deployment.engine`` section names; None: the one a deployment without it runs."""
    if cfg is None:
        if not _WITHOUT:
            raise LookupError("no engine registered for a deployment without deployment.engine "
                              "(sim.engines.registry registers the shipped ones)")
        return _WITHOUT[0]
    if cfg.name not in _ENGINES:
        load_plugins()  # a process that received the config without reading a scenario (a sweep's worker)
    return _ENGINES[cfg.name]
