"""Serving engines as servesim models them: ``deployment.engine``.

Each engine sets the rules a real server applies before and between steps, which the roofline alone does not know:

- the **memory budget**: how much of the GPU the KV cache gets (vLLM: a share of the whole card minus weights and
  profiled activations; TensorRT-LLM: a share of what is *left* after the engine loaded; SGLang: a static share
  of the card for weights plus KV);
- the **scheduler defaults**: chunked prefill and its token budget, the most sequences per step, how prompts
  and decodes share a step, and the **admission rule** (TensorRT-LLM's GUARANTEED_NO_EVICT admits a request only
  when the KV of its whole prompt + output is guaranteed, so nothing is ever preempted);
Every value is a default: a key given in the scenario's ``policy`` section wins. Each engine is one module
(sim/engines/vllm_v1.py, vllm_v0.py, tensorrt_llm.py, sglang.py, lmdeploy.py, tgi.py, classic.py) that subclasses
``sim.engines.base.Engine`` and sets its rules with their sources; this module registers them (a plugin registers
its own with ``register_engine``, see sim/plugins.py) and holds ``EngineConfig``, whose name is any registered
engine's. Nothing outside an engine's module tells engines apart by name. Without
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

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.input_model import Float, InputModel, Int
from sim.engines import classic, lmdeploy, sglang, tensorrt_llm, tgi, vllm_v0, vllm_v1
from sim.engines.base import (
    Engine,
    EngineKey,
    SchedulerDefaults,
    engine_named,
    engine_of,
    engines,
    register_engine,
)
from sim.engines.classic import classic_policy
from sim.engines.costs import omit_when_unset
from sim.hardware.gpu import GPUSpec
from sim.hardware.kv_budget import KVBudget
from sim.hardware.models import ModelSpec
from sim.plugins import load_plugins

# the shipped engines, one module each; the first is a deployment.engine section's default, classic what a
# deployment without one runs. A plugin adds its own with register_engine (sim/plugins.py).
for _engine in (vllm_v1.ENGINE, vllm_v0.ENGINE, tensorrt_llm.ENGINE, sglang.ENGINE, lmdeploy.ENGINE, tgi.ENGINE):
    register_engine(_engine)
register_engine(classic.ENGINE, without_engine=True)
DEFAULT_ENGINE = vllm_v1.ENGINE.name


def _names_typed() -> list[str]:
    """The names ``deployment.engine`` takes as written (each engine's, then their aliases; any case runs too)."""
    return [*engines(), *(a for e in engines().values() for a in e.aliases)]


def _names_listed(schema: dict[str, Any]) -> None:
    """The JSON schema lists the registered engines' names and aliases (a plugin's too, once loaded)."""
    schema["enum"] = _names_typed()


def _bare_name_too(schema: dict[str, Any]) -> None:
    """``deployment.engine`` in the JSON schema takes a bare name too, as the file does (``engine_field``)."""
    schema["anyOf"] = [{"type": "string", "enum": _names_typed()}, *schema.get("anyOf", [])]


def _names_for_humans() -> str:
    names = [repr(n) for n in engines()]
    return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


class EngineConfig(InputModel):
    """``deployment.engine``: which serving engine the simulated deployment runs (a name, or these keys)."""

    name: str = Field(default=DEFAULT_ENGINE, json_schema_extra=_names_listed,
                      description="vllm-v1 (0.8-0.11), vllm-v0 (0.5-0.6), tensorrt-llm (0.17), sglang (0.4), "
                      "lmdeploy (0.6, TurboMind), tgi (2.2), or classic: servesim's own idealised vLLM, what a "
                      "deployment without an engine runs (to pin a scenario to it).")
    usage_context: Literal["api_server", "offline"] = Field(
        default="api_server", description="vLLM v1 sizes its step budget by how it is run: the OpenAI API server "
        "(8192 tokens on large GPUs) or the offline LLM class (16384).")
    kv_cache_free_gpu_mem_fraction: Float | None = Field(
        default=None, gt=0, le=1, description="tensorrt-llm: share of the memory left after loading that the KV "
        "cache takes; none: 0.9 (KvCacheConfig.free_gpu_memory_fraction).")
    mem_fraction_static: Float | None = Field(
        default=None, gt=0, le=1, description="sglang: share of the GPU for weights + KV pool; none: 0.88 at tp 1, "
        "less with more GPUs (server_args.py).")
    cache_max_entry_count: Float | None = Field(
        default=None, gt=0, lt=1, description="lmdeploy: share of the memory free after loading that the KV cache "
        "takes; none: 0.8 (TurbomindEngineConfig).")
    max_input_tokens: Int | None = Field(
        default=None, ge=1, description="tgi: --max-input-tokens, the longest prompt TGI accepts (a longer one is "
        "refused), below deployment.max_model_len (its --max-total-tokens, prompt + output); its default prefill "
        "budget is this + 50 tokens. none: prompts bounded by max_model_len alone.")
    capacity_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] | None = Field(
        default=None, description="Admission: guaranteed_no_evict admits a request only when the KV of its whole "
        "prompt + output fits beside the running ones' (never preempts); max_utilization admits while blocks are "
        "free now (preempts when they run out). none: guaranteed_no_evict for tensorrt-llm, else max_utilization.")
    # host time per step (sim/engines/costs.py): the version it follows, and the ratio itself, overridable
    version: Literal["0.1", "0.5", "0.6"] | None = Field(
        default=None, description="vllm-v0: the release followed, 0.5 (API server and scheduler in the GPU's "
        "process: host time 1.63x the GPU time, vLLM's 0.5.3 profile) or 0.6 (0.7x: V1's speedup over it); none: 0.6. "
        "lmdeploy: 0.1 (TurboMind's prompts in a forward of their own before the decode forward) or 0.6; none: 0.6.")
    host_time_ratio: Float | None = Field(
        default=None, ge=0, le=100, description="Host (CPU) seconds a step adds per second of GPU work, the engine "
        "not overlapping them; none: the version's (vllm-v0 0.5: 1.63, 0.6: 0.7; other engines 0).")

    use_flashinfer_sampler: bool | None = Field(
        default=None, description="vllm-v1/vllm-v0: VLLM_USE_FLASHINFER_SAMPLER, top-p through FlashInfer's kernel "
        "instead of sorting each row's vocabulary (workload.sampling); none: off, vLLM 0.11.1's and V0's default.")

    # an engine of one's own (a plugin's) reads its keys here; each engine checks them (Engine.check_options)
    options: dict[str, Any] | None = Field(
        default=None, description="Keys of an engine of your own (a plugin's, sim/plugins.py), checked by that "
        "engine; the shipped engines take none.")

    # sim/engines/costs.py's keys and sim/engines/sched.py's, recorded only when set
    _record_set_keys = omit_when_unset("cache_max_entry_count", "max_input_tokens", "version", "host_time_ratio",
                                       "enforce_eager", "cudagraph_capture_sizes", "enable_mixed_chunk",
                                       "num_scheduler_steps", "options", "use_flashinfer_sampler")
    # ---- scheduler behaviours (sim/engines/sched.py) ----
    enforce_eager: bool | None = Field(
        default=None, description="vllm-v1/vllm-v0/tgi: no CUDA graphs, so decode batches are not padded; none: false.")
    cudagraph_capture_sizes: list[Annotated[Int, Field(ge=1, le=1 << 20)]] | None = Field(
        default=None, min_length=1, description="vllm-v1/vllm-v0: decode batch sizes with a CUDA graph; a decode "
        "step is priced as the next size up (none: vLLM's list, 1, 2, 4, 8, 16, ... up to 512 (v1) or 256 (v0)).")
    enable_mixed_chunk: bool | None = Field(
        default=None, description="sglang: mix prompt chunks and decodes in one step (--enable-mixed-chunk); none: "
        "off, a step of prompts whenever one can run, else a step of decodes.")
    num_scheduler_steps: Int | None = Field(
        default=None, ge=1, le=1024, description="vllm-v0: vLLM 0.6's --num-scheduler-steps, decode steps run as "
        "one block; a prompt that arrives waits for the running block to end (chunked prefill off). none: 1.")

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: Any) -> Any:
        # YAML reads `version: 0.5` (and --set ...version=0.5) as a number: the release it names is its text
        return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if engine_named(name) is None:
            load_plugins()  # a plugin's engine is a name the scenario may use
        own = engine_named(name)  # `vllm`, `trtllm`: the names users type, recorded as the engine's own
        if own is None:
            # pydantic's words for a Literal, as when the names were one
            raise ValueError(f"Input should be {_names_for_humans()}")
        return own

    @model_validator(mode="after")
    def _keys_of_the_engine(self) -> EngineConfig:
        """A key only some engines read is refused under the others, with what they use instead."""
        own = engine_of(self)
        seen: list[EngineKey] = []
        for e in engines().values():
            seen += [k for k in e.keys if k not in seen]
        for key in seen:
            if key.given(self) and key not in own.keys:
                raise ValueError(key.refusal.format(name=self.name, memory_key=own.memory_key))
        if self.version is not None and self.version not in own.versions:
            raise ValueError(f"version {self.version}: engine {self.name} follows {' or '.join(own.versions)}")
        own.check_options(self.options or {})
        return self


def engine_field(value: Any) -> Any:
    """``deployment.engine`` given as a bare name becomes ``{name: ...}``."""
    return {"name": value} if isinstance(value, str) else value


EngineField = Field(default=None, json_schema_extra=_bare_name_too, description="Serving engine whose memory rule "
                    "and scheduler defaults apply (vllm-v1, vllm-v0, tensorrt-llm, sglang, lmdeploy, tgi, or "
                    "{name: ..., its keys}); none: servesim's classic idealised vLLM (chunking off, prefill-first "
                    "steps).")
engine_validator = field_validator("engine", mode="before")(classmethod(lambda cls, v: engine_field(v)))


# ---- scheduler defaults and memory: each engine's own (sim/engines/base.py's hooks) ---------------------------
def scheduler_defaults(engine: EngineConfig, gpu: GPUSpec, max_model_len: int,
                       kv_tokens: int | None = None) -> SchedulerDefaults:
    """The engine's scheduler settings for a deployment on ``gpu`` with ``max_model_len``. ``kv_tokens`` (the KV
    cache's size in tokens) is needed for an engine whose request pool follows it (SGLang)."""
    return engine_of(engine).scheduler_defaults(engine, gpu, max_model_len, kv_tokens)


def apply_engine(policy: Any, engine: EngineConfig | None, gpu: GPUSpec, max_model_len: int,
                 kv_tokens: int | None = None) -> Any:
    """The ``policy`` config with every key it leaves unset (None) filled from the engine's defaults; a static
    policy comes back as it is; no engine: the classic defaults."""
    kind = getattr(policy, "type", None)
    if kind == "priority" and policy.preempt_for_waiting is None:
        return policy.model_copy(update={"preempt_for_waiting": engine_of(engine).priority_preempts_for_waiting})
    if kind != "continuous":
        return policy
    return engine_of(engine).fill_policy(policy, engine, gpu, max_model_len, kv_tokens)


def max_prompt_len(engine: EngineConfig | None, max_model_len: int) -> int | None:
    """The longest prompt ``engine`` accepts where it bounds prompts apart from ``max_model_len`` (TGI's
    max_input_tokens), else None; ValueError where the engine would refuse to start."""
    return engine_of(engine).max_prompt_len(engine, max_model_len)


def engine_kv_budget(engine: EngineConfig | None, model: ModelSpec, gpu: GPUSpec, **kw: Any) -> KVBudget:
    """The KV cache ``engine`` gives one GPU; ``kw`` are ``sim.hardware.kv_budget.kv_budget``'s keywords. Each
    engine's rule is its module's (``Engine.kv_budget``; vLLM's by default)."""
    return engine_of(engine).kv_budget(engine, model, gpu, **kw)


def budget_kwargs(deployment: Any, max_num_batched_tokens: int, max_num_seqs: int) -> dict[str, Any]:
    """``kv_budget``'s keywords for a ``Deployment`` section and the step limits its activations are sized for."""
    dep = deployment
    return dict(gpu_memory_utilization=dep.gpu_memory_utilization, weight_dtype=dep.weight_dtype,
                kv_dtype=dep.kv_dtype, block_size=dep.block_size, tensor_parallel_size=dep.tensor_parallel_size,
                num_gpu_blocks_override=dep.num_gpu_blocks, max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs)


def resolve_policy(policy: Any, deployment: Any, model: ModelSpec, gpu: GPUSpec, max_model_len: int) -> Any:
    """``apply_engine`` for a ``Deployment`` section: an engine whose request pool follows the KV cache (SGLang)
    needs the KV size first (its memory rule does not depend on the step limits, so it is sized once here)."""
    eng = deployment.engine
    kv_tokens = None
    if engine_of(eng).needs_kv_tokens and getattr(policy, "max_num_seqs", 0) is None:
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


__all__ = ["DEFAULT_ENGINE", "Engine", "EngineConfig", "SchedulerDefaults", "apply_engine", "budget_kwargs",
           "classic_policy", "engine_kv_budget", "engine_of", "engines", "max_prompt_len", "recorded_config",
           "register_engine", "resolve_policy", "scheduler_defaults"]
