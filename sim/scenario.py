"""Scenario files: what to simulate, validated at the boundary, and turned into the objects that run it.

A scenario names one workload and one or more *variants* (policy, KV cache, deployment) that all replay that
very workload, plus optional SLOs and a sweep (a grid over any parameters). The top-level ``workload``,
``deployment``, ``kv_cache``, ``policy`` and ``admission`` sections are the defaults every variant starts from; a
variant replaces ``kv_cache``, ``policy`` or ``admission`` whole and merges its ``deployment`` and ``workload``
keys into the default (a variant with workload keys of its own runs its own requests, drawn from the same seed).

    name: naive-vs-continuous
    seed: 0
    workload: {arrival: {type: poisson, rate: 4}, num_requests: 400, prompt_len: ..., output_len: ...}
    deployment: {model: llama-3.1-8b, gpu: a100-80gb}
    variants:
      - {name: naive, policy: {type: static, batch_size: 8}, kv_cache: {type: contiguous}}
      - {name: continuous, policy: {type: continuous}}

Everything here is pydantic (``extra="forbid"``); the simulator's hot path sees only plain objects.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import math
import re
from abc import abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from sim import spec_decode
from sim.block_manager import KVManager, PagedBlockManager
from sim.contiguous_allocator import ContiguousAllocator
from sim.costmodel import AnalyticCostModel, CostModel, FittedCostModel
from sim.disagg.config import DisaggConfig, PlanDisaggConfig
from sim.engine_costs import engine_cost_knobs, omit_when_unset, static_reserve_tokens
from sim.engine_sched import configure_kv, configure_policy, engine_kv_cache
from sim.engines import (
    EngineConfig,
    EngineField,
    budget_kwargs,
    classic_policy,
    engine_kv_budget,
    engine_validator,
    recorded_config,
    resolve_policy,
)
from sim.files import read_text_capped
from sim.host_kv_config import HostCacheConfig, attach_host_tier
from sim.limits import MAX_POOL_BLOCKS, check_kv_footprint, kv_footprint
from sim.metrics import SLOs
from sim.pipeline import PipelineLink, stage_model, wrap_pipeline
from sim.policies import Admission, ContinuousPolicy, Limits, Policy, StaticPolicy
from sim.scenario_messages import format_validation, short, yaml_error
from sim.specs import GPUSpec, KVBudget, ModelDoesNotFitError, ModelSpec, resolve_gpu, resolve_model
from sim.traces import resolve_trace
from sim.window import window_refusal
from sim.workload import EmpiricalLength, Float, InputModel, Int, TraceArrival, Workload
from sim.yaml_limits import MAX_SCENARIO_BYTES, safe_load_limited, unshared


class ScenarioError(ValueError):
    """A scenario that cannot run: the message names the field and the reason."""


# Size limits: a run past them would exhaust memory or never end; each is refused up front, saying what it needs.
MAX_SWEEP_RUNS = 100_000  # (sweep point, variant) runs in one scenario
MAX_REPLICAS = 1024  # replicas of one cluster (each its own policy, KV manager and cost model)
# KV blocks: sim/limits.py bounds what the KV managers can touch, not the pool (untouched blocks cost nothing)


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- deployment -----------------------------------------------------------------------------------------------
class CostModelConfigBase(_Model):
    """A ``cost_model`` section: each kind builds its own cost model (``build``), so adding a kind touches only
    its class and the ``CostModelConfig`` union."""

    @abstractmethod
    def build(self, model: ModelSpec, gpu: GPUSpec, deployment: Deployment) -> CostModel:
        """The cost model of one replica of ``deployment`` (``model`` on ``gpu``, already resolved)."""


class AnalyticCost(CostModelConfigBase):
    type: Literal["analytic"] = "analytic"
    compute_efficiency: Float | None = Field(
        default=None, ge=1e-4, le=1, description="Share of peak FLOP/s matmuls reach."
    )
    bandwidth_efficiency: Float | None = Field(
        default=None, ge=1e-4, le=1, description="Share of HBM bandwidth reached."
    )
    attention_efficiency: Float | None = Field(
        default=None, ge=1e-4, le=1, description="Share of peak FLOP/s attention kernels reach; none: the engine's "
        "(sim/engine_costs.py: FlashAttention-2/3 for vLLM), else compute_efficiency.")
    _record_set_keys = omit_when_unset("attention_efficiency")  # recorded only when given
    step_overhead: Float | None = Field(
        default=None, ge=0, le=3600, description="Fixed seconds per step (CPU, launches)."
    )
    per_request_overhead: Float | None = Field(default=None, ge=0, le=3600, description="Seconds per request per step.")
    profile: str | None = Field(default=None, description="Knobs fitted by `servesim calibrate --from-bench` (JSON); "
                                "knobs given here override the profile's.")

    def build(self, model: ModelSpec, gpu: GPUSpec, deployment: Deployment) -> AnalyticCostModel:
        """The roofline of ``model`` on ``gpu`` in the deployment's dtypes and parallelism; the efficiencies and
        overheads given here (or in the profile) replace the cost model's defaults."""
        extra: dict[str, Any] = engine_cost_knobs(deployment.engine, gpu)  # sim/engine_costs.py; keys below win
        if self.profile is not None:
            from sim.benchfiles.knobs import read_knob_profile

            try:
                extra.update(read_knob_profile(self.profile))
            except FileNotFoundError as e:
                raise ScenarioError(f"cost_model.profile: file not found: {e.filename or e}") from None
            except (ValueError, OSError) as e:
                raise ScenarioError(f"cost_model.profile: {e}") from None
        extra.update({k: v for k, v in self.model_dump().items() if k not in ("type", "profile") and v is not None})
        return AnalyticCostModel(
            model,
            gpu,
            weight_dtype=deployment.weight_dtype,
            kv_dtype=deployment.kv_dtype,
            tensor_parallel_size=deployment.tensor_parallel_size,
            block_size=deployment.block_size,
            **extra,
        )


class FittedCost(CostModelConfigBase):
    type: Literal["fitted"] = "fitted"
    profile: str = Field(description="Path of a calibration profile JSON (see `servesim calibrate`).")

    def build(self, model: ModelSpec, gpu: GPUSpec, deployment: Deployment) -> FittedCostModel:
        """The profile's fitted model (it describes one device and model: ``model`` and ``gpu`` are not read).
        A profile that cannot be read is a ``ScenarioError`` naming ``cost_model.profile``."""
        try:
            return FittedCostModel.from_profile(self.profile)
        except FileNotFoundError as e:
            raise ScenarioError(f"cost_model.profile: file not found: {e.filename or e}") from None
        except KeyError as e:
            raise ScenarioError(f"cost_model.profile: lacks the field {e}") from None
        except (ValueError, TypeError, OSError) as e:
            raise ScenarioError(f"cost_model.profile: {e}") from None


CostModelConfig = Annotated[AnalyticCost | FittedCost, Field(discriminator="type")]


class Deployment(_Model):
    model: str | dict[str, Any] = Field(
        default="llama-3.1-8b",
        description="Model preset name, path to a Hugging Face config.json, or its fields inline.",
    )
    gpu: str | dict[str, Any] = Field(default="h100-sxm", description="GPU preset name, or GPUSpec fields inline.")
    weight_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"] = Field(
        default="bf16", description="Data type of the weights."
    )
    kv_dtype: Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8"] = Field(
        default="auto", description="Data type of the KV cache; auto: the model's activation dtype."
    )
    tensor_parallel_size: Int = Field(default=1, ge=1, description="GPUs one replica's weights and KV are split over.")
    pipeline_parallel_size: Int = Field(
        default=1, ge=1, le=1024, description="Pipeline stages the layers are split over, each tensor_parallel_size "
        "GPUs (sim/pipeline.py); a replica has tp x pp GPUs.")
    pipeline_link: PipelineLink = Field(default="auto", description="Link between pipeline stages: nvlink, pcie or "
                                        "infiniband (between nodes); auto: NVLink when the GPU has it, else PCIe.")
    gpu_memory_utilization: Float = Field(
        default=0.9, gt=0, le=1, description="Share of GPU memory the engine may use (weights + activations + KV)."
    )
    num_gpu_blocks: Int | None = Field(default=None, ge=1, description="Override the KV block count vLLM would size.")
    block_size: Int = Field(default=16, ge=1, description="Tokens per KV block.")
    max_model_len: Int | None = Field(
        default=None, ge=1, description="Longest prompt+output a request may have; none: the model's context length."
    )
    swap_space: Float = Field(
        default=4.0, ge=0, le=1 << 20, description="CPU swap space per GPU in GiB (vLLM's swap_space)."
    )
    cost_model: CostModelConfig = Field(default_factory=AnalyticCost, description="How step times are predicted.")
    engine: EngineConfig | None = EngineField  # sim/engines.py
    _engine = engine_validator
    speculative: spec_decode.SpeculativeConfig | None = Field(
        default=None, description="Speculative decoding (vLLM's speculative_config); none: off.")
    leak_kv_on_failure: bool = Field(
        default=False,
        description="The bug the failure-mode scenarios show: the KV blocks of a request that fails mid-flight "
        "are never freed. Off: they are freed at once, as a correct server does.",
    )

    @field_validator("num_gpu_blocks")
    @classmethod
    def _blocks_cap(cls, n: int | None) -> int | None:
        if n is not None and n > MAX_POOL_BLOCKS:
            raise ValueError(f"{n} blocks is past any GPU (at most {MAX_POOL_BLOCKS}); the simulator tracks only the "
                             "blocks in use, so size the pool as the GPU would")
        return n


# ---- KV cache -------------------------------------------------------------------------------------------------
class KVCacheConfigBase(_Model):
    """A ``kv_cache`` section: each kind builds its own KV manager (``build``)."""

    @abstractmethod
    def build(self, num_blocks: int, block_size: int, *, max_model_len: int, num_cpu_blocks: int) -> KVManager:
        """A KV manager of ``num_blocks`` GPU blocks of ``block_size`` tokens and ``num_cpu_blocks`` of swap."""


class PagedKV(KVCacheConfigBase):
    type: Literal["paged"] = "paged"
    enable_prefix_caching: bool = Field(default=False, description="Reuse KV blocks of equal prompt prefixes.")
    host_cache: HostCacheConfig | None = Field(
        default=None, description="Keep evicted prefix blocks in host memory, loaded back on a hit; none: off.")

    def build(self, num_blocks: int, block_size: int, *, max_model_len: int,
              num_cpu_blocks: int) -> PagedBlockManager:
        return PagedBlockManager(num_blocks, block_size, enable_prefix_caching=self.enable_prefix_caching,
                                 num_cpu_blocks=num_cpu_blocks)


class ContiguousKV(KVCacheConfigBase):
    type: Literal["contiguous"] = "contiguous"
    reserve: Literal["max_model_len", "request"] = Field(
        default="max_model_len",
        description="What each request reserves up front: max_model_len tokens (what a server that does not know "
        "the output length must do), or its own prompt+output (an oracle; still wastes the unfilled part).",
    )

    def build(self, num_blocks: int, block_size: int, *, max_model_len: int,
              num_cpu_blocks: int) -> ContiguousAllocator:
        return ContiguousAllocator(num_blocks, block_size, max_model_len=max_model_len, reserve=self.reserve,
                                   num_cpu_blocks=num_cpu_blocks)


KVCacheConfig = Annotated[PagedKV | ContiguousKV, Field(discriminator="type")]


# ---- policies -------------------------------------------------------------------------------------------------
class PolicyConfigBase(_Model):
    """A ``policy`` section: each kind gives its per-step limits and builds its policy, so adding a policy
    touches only its class and the ``PolicyConfig`` union (and a kind that lacks either cannot be created)."""

    @abstractmethod
    def limits(self, max_model_len: int) -> Limits:
        """The per-step limits the core checks this policy's plans against."""

    @abstractmethod
    def build(self, limits: Limits, admission: Admission) -> Policy:
        """The policy, planning within ``limits`` (from ``limits()``) and refusing whom ``admission`` says."""


class StaticPolicyConfig(PolicyConfigBase):
    type: Literal["static"] = "static"
    batch_size: Int = Field(default=8, ge=1, description="Requests per batch.")
    max_wait: Float = Field(
        default=1.0, ge=0, le=1e9, description="Seconds the oldest queued request waits for a full batch."
    )
    preemption_mode: Literal["recompute", "swap"] = Field(default="recompute", description="If paged KV runs out.")
    max_input_len: Int | None = Field(default=None, ge=1, description="Longest prompt the engine is built for "
                                      "(TensorRT-LLM's name): with deployment.engine the activations are sized for "
                                      "batch_size x this; none: max_model_len (sim/engine_costs.py).")
    _record_set_keys = omit_when_unset("max_input_len")  # recorded only when given

    def limits(self, max_model_len: int) -> Limits:
        # a padded batch computes at most batch_size x max_model_len tokens in one step
        return Limits(max(256, self.batch_size), self.batch_size * max_model_len, max_model_len)

    def build(self, limits: Limits, admission: Admission) -> StaticPolicy:
        return StaticPolicy(batch_size=self.batch_size, max_wait=self.max_wait, limits=limits,
                            preemption_mode=self.preemption_mode, admission=admission)


class ContinuousPolicyConfig(PolicyConfigBase):
    type: Literal["continuous"] = "continuous"
    # None: the deployment.engine's default (sim/engines.py), or without an engine the classic one named here
    max_num_seqs: Int | None = Field(default=None, ge=1, description="Requests in one step at most; none: the "
                                     "engine's default (256 without deployment.engine).")
    max_num_batched_tokens: Int | None = Field(
        default=None,
        ge=1,
        description="Tokens computed in one step at most; none: the engine's default (without deployment.engine: "
        "8192 with chunked prefill, else max(8192, max_model_len)).",
    )
    enable_chunked_prefill: bool | None = Field(
        default=None, description="Cut prompts into chunks that fill each step; none: the engine's default (off "
        "without deployment.engine).")
    prefill_mode: Literal["prefill_first", "mixed"] | None = Field(
        default=None, description="Without chunking: prompts-only steps first (vLLM v0), or mixed steps; none: the "
        "engine's default (prefill_first without deployment.engine)."
    )
    capacity_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] | None = Field(
        default=None, description="Admission (TensorRT-LLM's names): guaranteed_no_evict admits a request only when "
        "the KV of its whole prompt + output fits beside the running requests' (nothing is ever preempted); "
        "max_utilization admits while blocks are free now. none: the engine's default (max_utilization without "
        "deployment.engine).")
    preemption_mode: Literal["recompute", "swap"] = Field(
        default="recompute", description="What happens to the latest-admitted request when blocks run out."
    )

    def limits(self, max_model_len: int) -> Limits:
        mnbt = self.max_num_batched_tokens or (8192 if self.enable_chunked_prefill else max(8192, max_model_len))
        return Limits(self.max_num_seqs or 256, mnbt, max_model_len)

    def build(self, limits: Limits, admission: Admission) -> ContinuousPolicy:
        return ContinuousPolicy(limits=limits, enable_chunked_prefill=bool(self.enable_chunked_prefill),
                                prefill_mode=self.prefill_mode or "prefill_first", preemption_mode=self.preemption_mode,
                                admission=admission, no_evict=self.capacity_scheduler_policy == "guaranteed_no_evict")


PolicyConfig = Annotated[StaticPolicyConfig | ContinuousPolicyConfig, Field(discriminator="type")]


class AdmissionConfig(_Model):
    max_queue_len: Int | None = Field(
        default=None, ge=0, description="Reject arrivals beyond this many waiting requests."
    )
    max_queue_delay: Float | None = Field(
        default=None, gt=0, description="Reject a request still waiting (never scheduled) after this many seconds."
    )

    def build(self) -> Admission:
        return Admission(self.max_queue_len, self.max_queue_delay)


class SLOConfig(_Model):
    ttft: Float | None = Field(default=None, gt=0, description="Time to first token bound, seconds.")
    tpot: Float | None = Field(default=None, gt=0, description="Time per output token bound, seconds.")
    e2el: Float | None = Field(default=None, gt=0, description="End-to-end latency bound, seconds.")


# ---- plan (servesim plan) -------------------------------------------------------------------------------------
class ApiPrice(_Model):
    input: Float = Field(ge=0, allow_inf_nan=False, description="USD per million input (prompt) tokens.")
    output: Float = Field(gt=0, allow_inf_nan=False, description="USD per million output tokens.")


PlanWeightDType = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
PlanKVDType = Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8"]


class PlanConfig(_Model):
    """The deployment space `servesim plan` searches for the cheapest configuration meeting the scenario's SLOs.
    The scenario's own deployment, kv_cache, policy and admission sections give everything else (model,
    max_model_len, block size, cost model efficiencies, max_num_batched_tokens)."""

    gpus: list[str | dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        description="GPU presets (or GPUSpec fields inline) to consider; none: every preset with a price.",
    )

    @field_validator("gpus")
    @classmethod
    def _gpus_resolve(cls, gpus: list[str | dict[str, Any]] | None) -> list[str | dict[str, Any]] | None:
        # resolved here, so that `servesim run` refuses a bad plan section too instead of ignoring it
        for i, g in enumerate(gpus or []):
            try:
                GPUSpec.from_dict(g) if isinstance(g, dict) else GPUSpec.from_name(g)
            except (ValueError, TypeError) as e:
                raise ValueError(str(e) if len(gpus or []) == 1 else f"item {i}: {e}") from None
        return gpus
    tensor_parallel_sizes: list[Annotated[Int, Field(ge=1)]] = Field(
        default=[1, 2, 4, 8], min_length=1,
        description="Tensor-parallel degrees; those that do not split the model are skipped."
    )
    pipeline_parallel_sizes: list[Annotated[Int, Field(ge=1, le=1024)]] = Field(
        default=[1], min_length=1,
        description="Pipeline-parallel degrees, each combined with every tensor-parallel degree (tp x pp GPUs per "
        "replica); those with more stages than layers are skipped.",
    )
    weight_dtypes: list[PlanWeightDType] = Field(
        default=["bf16", "fp8", "int8", "int4"], min_length=1,
        description="Weight data types (quality differs: the simulator does not model it; list only those you "
        "accept).",
    )
    kv_dtypes: list[PlanKVDType] = Field(default=["auto", "fp8"], min_length=1, description="KV cache data types.")
    max_num_seqs: list[Annotated[Int, Field(ge=1)]] = Field(
        default=[64, 256], min_length=1, description="Values of the policy's max_num_seqs."
    )
    enable_chunked_prefill: list[bool] = Field(
        default=[True, False], min_length=1, description="Chunked prefill on/off."
    )
    max_gpus: Int = Field(default=8, ge=1, description="Most GPUs in one deployment (replicas x tp x pp).")
    percentile: Literal[50, 90, 95, 99] = Field(
        default=99, description="The SLOs bound this percentile of TTFT, TPOT and E2EL (99: p99 TTFT <= slos.ttft)."
    )
    api_price: ApiPrice | None = Field(
        default=None, description="A hosted API's price, for the break-even volume; none: no break-even."
    )
    disaggregation: PlanDisaggConfig | None = Field(
        default=None, description="Also search prefill/decode splits (xPyD) of each replica count; none: colocated "
        "replicas only.")
    stop_early: bool = Field(
        default=True,
        description="Stop simulating once the cheapest cost level with a configuration meeting the SLOs is "
        "done (costlier ones cannot be chosen); false: simulate every survivor, for the whole Pareto front.",
    )


# ---- cluster (many replicas behind a router) -------------------------------------------------------------------
def _replicas_cap(n: int) -> int:
    if n > MAX_REPLICAS:
        raise ValueError(f"{n} replicas would each hold a policy, a KV cache and a cost model in memory; at most "
                         f"{MAX_REPLICAS}")
    return n


class AutoscalerSection(_Model):
    signal: Literal["busy", "compute", "kv_usage", "queue", "ttft"] = Field(
        description="What it watches: busy (share of time replicas run steps, the usual GPU 'utilisation'), "
        "compute (FLOPs done over peak FLOPs, i.e. MFU), "
        "kv_usage (KV blocks in use or needed by queued prompts), queue (waiting requests per replica) or ttft "
        "(mean seconds to first token over the last interval)."
    )
    scale_up: Float = Field(gt=0, description="Add a replica when the signal is above this.")
    scale_down: Float = Field(ge=0, description="Drain a replica when the signal is below this.")
    # at least 1 ms: an interval of 1e-300 s never advanced the clock (the run hung); 1 ms still lets the autoscaler
    # act between the millisecond steps of the CPU engine
    interval: Float = Field(default=10.0, ge=1e-3, description="Seconds between two looks at the signal.")
    cooldown: Float = Field(default=60.0, ge=0, description="Seconds after an action before the next one.")
    provisioning_delay: Float = Field(
        default=120.0, ge=0, description="Seconds from ordering a GPU to it serving (boot, weights); paid meanwhile."
    )
    min_replicas: Int = Field(default=1, ge=1, description="Fewest replicas.")
    max_replicas: Int = Field(default=8, ge=1, description="Most replicas, provisioning ones included.")

    _cap = field_validator("min_replicas", "max_replicas")(classmethod(lambda cls, n: _replicas_cap(n)))

    @model_validator(mode="after")
    def _ranges(self) -> AutoscalerSection:
        # checked here so that a bad range fails at load (exit 2), not as the cluster is built
        if not self.scale_down < self.scale_up:
            raise ValueError(f"scale_down ({self.scale_down}) must be below scale_up ({self.scale_up})")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        return self


class ClusterConfig(_Model):
    replicas: Int = Field(
        default=1, ge=1, description="Replicas at the start (each a GPU or a tensor-parallel group)."
    )
    router: Literal["round_robin", "least_outstanding", "least_kv", "prefix_affinity"] = Field(
        default="round_robin", description="Which replica gets an arriving request."
    )
    autoscaler: AutoscalerSection | None = Field(
        default=None, description="Add and remove replicas; none: a fixed fleet."
    )

    _cap = field_validator("replicas")(classmethod(lambda cls, n: _replicas_cap(n)))

    @model_validator(mode="after")
    def _start_in_range(self) -> ClusterConfig:
        a = self.autoscaler
        if a is not None and not a.min_replicas <= self.replicas <= a.max_replicas:
            raise ValueError(f"replicas ({self.replicas}) must lie in the autoscaler's [min_replicas, max_replicas] "
                             f"= [{a.min_replicas}, {a.max_replicas}]")
        return self


class Variant(_Model):
    name: str = Field(min_length=1, description="Name in tables and summary.json.")
    workload: dict[str, Any] | None = Field(
        default=None,
        description="Keys merged into the default workload (e.g. {arrival: {type: poisson, rate: 8}}); none: the "
        "variant replays the default workload's very requests. A changed workload is drawn from the same seed.",
    )
    deployment: dict[str, Any] | None = Field(default=None, description="Keys merged into the default deployment.")
    kv_cache: KVCacheConfig | None = Field(default=None, description="Replaces the default KV cache.")
    policy: PolicyConfig | None = Field(default=None, description="Replaces the default policy.")
    admission: AdmissionConfig | None = Field(default=None, description="Replaces the default admission control.")
    cluster: ClusterConfig | None = Field(default=None, description="Replaces the default cluster.")
    disaggregation: DisaggConfig | None = Field(
        default=None, description="Prefill/decode disaggregation: a prefill pool, a decode pool, the KV link.")


_SWEEP_HEADS = ("workload", "deployment", "kv_cache", "policy", "admission")


class Scenario(_Model):
    name: str = Field(default="scenario", description="Scenario name.")
    description: str = Field(default="", description="What the scenario shows.")
    seed: Int = Field(default=0, ge=0, description="Seed of the run's one random generator.")
    workload: Workload
    deployment: Deployment = Field(default_factory=Deployment)
    kv_cache: KVCacheConfig = Field(default_factory=PagedKV)
    policy: PolicyConfig = Field(default_factory=ContinuousPolicyConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    slos: SLOConfig | None = Field(default=None, description="Service-level objectives for goodput.")
    variants: list[Variant] = Field(
        default_factory=list, description="Compared configurations; none: one variant named after the scenario."
    )
    sweep: dict[str, list[Any]] | None = Field(
        default=None,
        description="Grid over parameters: dotted path -> values, e.g. {policy.max_num_seqs: [8, 32]}; paths "
        "start with workload, deployment, kv_cache, policy or admission and apply to every variant.",
    )
    keep_token_times: bool = Field(default=False, description="Keep every token's timestamp on the requests (memory!).")
    plan: PlanConfig | None = Field(default=None, description="Search space and API price for `servesim plan`.")
    cluster: ClusterConfig | None = Field(
        default=None, description="Several replicas behind a router, optionally autoscaled; none: one replica."
    )

    @field_validator("variants")
    @classmethod
    def _unique_names(cls, variants: list[Variant]) -> list[Variant]:
        names = [v.name for v in variants]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"variant names must be unique; repeated: {sorted(dup)}")
        return variants

    @field_validator("sweep")
    @classmethod
    def _sweep_keys(cls, sweep: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        for key, values in (sweep or {}).items():
            parts = key.split(".")
            if parts[0] not in _SWEEP_HEADS:
                raise ValueError(f"key {key!r} must start with {', '.join(_SWEEP_HEADS)}")
            if any(not p for p in parts):
                raise ValueError(f"key {key!r}: empty part in a dotted key (e.g. policy.max_num_seqs)")
            problem = _unknown_key(Scenario, parts, None)
            if problem is not None:
                raise ValueError(problem)
            if not values:
                raise ValueError(f"key {key!r} has no values")
        return sweep

    @field_validator("sweep")
    @classmethod
    def _sweep_size(cls, sweep: dict[str, list[Any]] | None, info: ValidationInfo) -> dict[str, list[Any]] | None:
        # counted before any point is built: itertools.product over 10^12 points would never end
        if sweep:
            points = math.prod(len(v) for v in sweep.values())
            variants = max(1, len(info.data.get("variants") or []))
            runs = points * variants
            if runs > MAX_SWEEP_RUNS:
                raise ValueError(f"{points} points x {variants} variant(s) = {runs} runs; at most {MAX_SWEEP_RUNS} "
                                 "(fewer values, or split the sweep)")
        return sweep


# ---- loading --------------------------------------------------------------------------------------------------
def set_path(d: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts, creating levels as needed; a numeric part indexes an existing list
    (``variants.0.name``)."""
    keys = dotted.split(".")
    if any(not k for k in keys):
        raise ScenarioError(f"{dotted!r}: empty part in a dotted key")
    node: Any = d
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            if not (re.fullmatch(r"-?[0-9]+", k) and -len(node) <= int(k) < len(node)):
                raise ScenarioError(f"{'.'.join(keys[:i + 1])}: no item {k} in a list of {len(node)}")
            if last:
                node[int(k)] = value
                return
            node = node[int(k)]
            continue
        if last:
            node[k] = value
            return
        nxt = node.get(k)
        if not isinstance(nxt, (dict, list)):
            nxt = {}
            node[k] = nxt
        node = nxt


def parse_value(text: str) -> Any:
    """A ``--set key=value`` value, read as YAML (numbers, booleans, lists, null). Raises ScenarioError."""
    try:
        return safe_load_limited(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"cannot read value {short(text)} as YAML: {yaml_error(e)}") from None


def load_scenario(
    path: str | Path, overrides: dict[str, Any] | None = None
) -> tuple[Scenario, dict[str, Any]]:
    """Read and validate a scenario file. ``overrides`` maps dotted paths to values (the CLI's ``--set``).
    Returns the validated scenario and the raw dict it came from. Raises ScenarioError with one clear message."""
    p = Path(path)
    if not p.exists():
        raise ScenarioError(f"{p}: scenario file not found")
    if not p.is_file():
        raise ScenarioError(f"{p}: not a file (a scenario is a YAML file)")
    try:
        text = read_text_capped(p, MAX_SCENARIO_BYTES, "a scenario file")
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read the file: {e.strerror or e}") from None
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    try:
        raw = safe_load_limited(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{p}: not valid YAML: {yaml_error(e)}") from None
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise ScenarioError(f"{p}: a scenario must be a mapping of keys to values, got {got}")
    # an alias shares one object between keys: copy, so that a --set or sweep value lands at one key only
    raw = unshared(raw)
    for key, value in (overrides or {}).items():
        try:
            apply_override(raw, key, value)
        except ScenarioError as e:
            raise ScenarioError(f"{p}: --set {e}") from None
    _resolve_relative_paths(raw, p.parent)
    return parse_scenario(raw, source=str(p)), raw


def parse_scenario(raw: dict[str, Any], source: str = "scenario") -> Scenario:
    """Validate a scenario dict: its schema, every variant's merged deployment, and that trace files exist.
    Raises ScenarioError naming the key path and the reason."""
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(format_validation(e, source, raw, model=Scenario)) from None
    base = scenario.deployment.model_dump()
    workloads = [("workload", scenario.workload)]
    for i, v in enumerate(scenario.variants):
        if v.deployment:
            try:
                Deployment.model_validate({**base, **v.deployment})
            except ValidationError as e:
                raise ScenarioError(
                    format_validation(e, source, v.deployment, prefix=f"variants.{i}.deployment.", model=Deployment)
                ) from None
        if v.workload:
            try:
                workloads.append((f"variants.{i}.workload", merged_workload(scenario.workload, v.workload)))
            except ValidationError as e:
                raise ScenarioError(
                    format_validation(e, source, v.workload, prefix=f"variants.{i}.workload.", model=Workload)
                ) from None
    for where, wl in workloads:
        _check_trace_files(wl, source, where)
    return scenario


def _check_trace_files(wl: Workload, source: str, where: str = "workload") -> None:
    """Read every trace the workload names (the reader caches it), so that a missing or malformed file fails here
    naming its key, not later as the workload is drawn."""
    for key, part in (("arrival", wl.arrival), ("prompt_len", wl.prompt_len), ("output_len", wl.output_len)):
        if isinstance(part, (TraceArrival, EmpiricalLength)):
            try:
                resolve_trace(part.trace)
                part.load()  # read as the workload will read it (its columns too)
            except (ValueError, OSError) as e:  # FileNotFoundError is an OSError
                raise ScenarioError(f"{source}: {where}.{key}.trace: {e}") from None


def _resolve_relative_paths(raw: dict, base: Path) -> None:
    """Trace and profile paths in a scenario are relative to the scenario file when they exist there."""

    def fix(d: Any, key: str) -> None:
        if isinstance(d, dict) and isinstance(d.get(key), str):
            v = d[key]
            if ("/" in v or v.endswith((".csv", ".jsonl", ".json"))) and not Path(v).is_absolute():
                cand = base / v
                if cand.exists():
                    d[key] = str(cand)

    wl = raw.get("workload")
    if isinstance(wl, dict):
        fix(wl.get("arrival"), "trace")
        fix(wl.get("prompt_len"), "trace")
        fix(wl.get("output_len"), "trace")
    variants = raw.get("variants")
    variants = variants if isinstance(variants, list) else []
    for section in [raw.get("deployment")] + [v.get("deployment") for v in variants if isinstance(v, dict)]:
        if isinstance(section, dict):
            fix(section.get("cost_model"), "profile")
            if isinstance(section.get("model"), str) and section["model"].endswith(".json"):
                fix(section, "model")
            spec = section.get("speculative")
            if isinstance(spec, dict):  # the draft's config.json and a measured acceptance file
                fix(spec.get("acceptance"), "file")
                if isinstance(spec.get("model"), str) and spec["model"].endswith(".json"):
                    fix(spec, "model")


# ---- resolving a variant into objects -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class VariantConfig:
    """One variant with every default filled in: what runs."""

    name: str
    deployment: Deployment
    kv_cache: KVCacheConfigBase  # one of KVCacheConfig's kinds
    policy: PolicyConfigBase  # one of PolicyConfig's kinds
    admission: AdmissionConfig
    params: dict[str, Any]  # sweep point, {} without a sweep
    cluster: ClusterConfig | None = None  # several replicas; None: one
    workload: Workload | None = None  # the variant's own workload; None: the scenario's
    disaggregation: DisaggConfig | None = None  # prefill and decode pools (sim/disagg); None: colocated

    def to_dict(self, policy: PolicyConfigBase | None = None) -> dict[str, Any]:
        """The variant as a run records it; ``policy``: the policy as resolved against the engine (Built.policy)."""
        if policy is None and self.deployment.engine is None:
            policy = classic_policy(self.policy)
        dep, pol = recorded_config(self.deployment.model_dump(mode="json"),
                                   (policy or self.policy).model_dump(mode="json"))
        out = {
            "name": self.name,
            "deployment": dep,
            "kv_cache": engine_kv_cache(self.kv_cache, self.deployment.engine).model_dump(mode="json"),
            "policy": pol,
            "admission": self.admission.model_dump(mode="json"),
            "params": self.params,
        }
        if self.cluster is not None:
            out["cluster"] = self.cluster.model_dump(mode="json")
        if self.workload is not None:
            out["workload"] = self.workload.model_dump(mode="json")
        if self.disaggregation is not None:
            out["disaggregation"] = self.disaggregation.model_dump(mode="json")
        return out


def variant_configs(scenario: Scenario) -> list[VariantConfig]:
    """The scenario's variants (one per variant; the scenario itself when it lists none), defaults filled in."""
    variants = scenario.variants or [Variant(name=scenario.name)]
    out = []
    for v in variants:
        dep = scenario.deployment.model_dump()
        if v.deployment:
            dep.update(v.deployment)
        try:
            deployment = Deployment.model_validate(dep)
        except ValidationError as e:
            raise ScenarioError(format_validation(e, f"variant {v.name!r} deployment", model=Deployment)) from None
        workload = None
        if v.workload:
            try:
                workload = merged_workload(scenario.workload, v.workload)
            except ValidationError as e:
                raise ScenarioError(format_validation(e, f"variant {v.name!r} workload", model=Workload)) from None
        out.append(
            VariantConfig(
                name=v.name,
                deployment=deployment,
                kv_cache=v.kv_cache or scenario.kv_cache,
                policy=v.policy or scenario.policy,
                admission=v.admission or scenario.admission,
                params={},
                cluster=v.cluster or scenario.cluster,
                workload=workload,
                disaggregation=v.disaggregation,
            )
        )
    return out


def merged_workload(default: Workload, keys: dict[str, Any]) -> Workload:
    """A variant's workload: its keys replace the default's whole (``arrival``, ``prompt_len``...), the rest
    inherited, as a variant's deployment keys are."""
    return Workload.model_validate({**default.model_dump(mode="json", exclude_none=True), **keys})


def sweep_points(scenario: Scenario) -> list[dict[str, Any]]:
    """Every combination of the sweep's values ({} once without a sweep)."""
    if not scenario.sweep:
        return [{}]
    keys = list(scenario.sweep)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(scenario.sweep[k] for k in keys))]


def apply_point(raw: dict[str, Any], point: dict[str, Any], source: str) -> Scenario:
    """The scenario at one sweep point: each path set as :func:`apply_override` sets it (in the defaults and in
    every variant whose section has the key)."""
    d = copy.deepcopy(raw)
    d.pop("sweep", None)
    for key, value in point.items():
        try:
            apply_override(d, key, value)
        except ScenarioError as e:
            raise ScenarioError(f"{source}: sweep: {e}") from None
    return parse_scenario(d, source=f"{source} at {point}")


_VARIANT_SECTIONS = ("workload", "deployment", "kv_cache", "policy", "admission", "cluster")
_PARTIAL_SECTIONS: dict[str, type[BaseModel]] = {"deployment": Deployment, "workload": Workload}
_DEFAULT_SECTIONS = {"deployment": Deployment, "kv_cache": PagedKV, "policy": ContinuousPolicyConfig,
                     "admission": AdmissionConfig}


def _members(tp: Any) -> list[Any]:
    """The concrete types an annotation allows (Annotated and Optional unwrapped, unions spread)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin in (Union, UnionType):
        return [m for a in get_args(tp) for m in _members(a) if m is not type(None)]
    return [tp]


def _models(tp: Any) -> list[type[BaseModel]]:
    return [m for m in _members(tp) if isinstance(m, type) and issubclass(m, BaseModel)]


def _narrow(models: list[type[BaseModel]], node: Any) -> list[type[BaseModel]]:
    """The members of a discriminated union that a section of the file (with its ``type``) can be."""
    tag = node.get("type") if isinstance(node, dict) else None
    if len(models) > 1 and isinstance(tag, str):
        picked = [m for m in models if "type" in m.model_fields and m.model_fields["type"].default == tag]
        return picked or models
    return models


def _field_type(model: type[BaseModel], name: str) -> Any:
    if model is Variant and name in _PARTIAL_SECTIONS:
        return _PARTIAL_SECTIONS[name]  # a variant's deployment or workload is partial, merged into the default
    return model.model_fields[name].annotation


def _unknown_key(tp: Any, parts: list[str], node: Any, done: str = "") -> str | None:
    """Why the dotted path ``parts`` names no key of the schema below ``tp`` (None: it may), with the closest
    key as a suggestion. ``node`` is the file's value there, when it has one, to pick a union's member."""
    if not parts:
        return None
    part, rest = parts[0], parts[1:]
    where = f"{done}.{part}" if done else part
    members = _members(tp)
    models = _narrow(_models(tp), node)
    if models:
        fields = sorted({f for m in models for f in m.model_fields})
        if part not in fields:
            if len(models) < len(_models(tp)) and any(part in m.model_fields for m in _models(tp)):
                return None  # another member has it: the sweep or --set rules decide
            close = difflib.get_close_matches(part, fields, n=1)
            hint = f"; did you mean {(done + '.' if done else '') + close[0]}?" if close else \
                f"; known keys: {', '.join(fields)}"
            return f"{where}: unknown key{hint}"
        child = node.get(part) if isinstance(node, dict) else None
        for m in models:
            if part in m.model_fields:
                return _unknown_key(_field_type(m, part), rest, child, where)
        return None
    for m in members:
        origin = get_origin(m)
        if origin is list and get_args(m):
            if not re.fullmatch(r"-?[0-9]+", part):
                return f"{where}: a list is indexed by a number, got {part!r}"
            item = node[int(part)] if isinstance(node, list) and -len(node) <= int(part) < len(node) else None
            return _unknown_key(get_args(m)[0], rest, item, where)
    return None  # a free-form value (a dict of GPU fields, a model config, any): checked where it is used


def _fill_defaults(tp: Any, node: dict[str, Any], parts: list[str]) -> None:
    """Spell out the default of each missing section along ``parts`` (all but the last), so that setting one
    key keeps the default's type: deployment.cost_model.step_overhead needs cost_model's ``type: analytic``."""
    for part in parts[:-1]:
        models = _narrow(_models(tp), node)
        model = next((m for m in models if part in m.model_fields), None)
        if model is None:
            return
        field = model.model_fields[part]
        if not isinstance(node.get(part), dict):
            default = field.get_default(call_default_factory=True)
            if not isinstance(default, BaseModel):
                return
            node[part] = default.model_dump(mode="json")
        node = node[part]
        tp = field.annotation


def _has_path(tp: Any, node: Any, parts: list[str]) -> bool:
    """Whether a section of the file (of schema type ``tp``) can hold the dotted path: False when the kind of
    section it is (its ``type``) lacks a key on the way."""
    for part in parts:
        models = _narrow(_models(tp), node)
        if not models:
            return True
        model = next((m for m in models if part in m.model_fields), None)
        if model is None:
            return False
        tp = _field_type(model, part)
        node = node.get(part) if isinstance(node, dict) else None
    return True


def apply_override(d: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key as ``--set`` and sweeps do. A key of a section that variants may override
    (workload, deployment, kv_cache, policy, admission, cluster) is set in the defaults and in every variant whose
    own section has the key (``policy.max_num_seqs`` changes continuous policies and leaves a static one alone; a
    variant's partial workload or deployment gets it only where it sets that key itself, the rest inherit the
    default).
    A missing default section is spelled out first, keeping its type. A key that exists nowhere in the schema,
    or that no variant's section has, is an error naming the closest key."""
    parts = key.split(".")
    if any(not k for k in parts):
        raise ScenarioError(f"{key!r}: empty part in a dotted key")
    problem = _unknown_key(Scenario, parts, d)
    if problem is not None:
        raise ScenarioError(problem)
    head, rest = parts[0], parts[1:]
    if head not in _VARIANT_SECTIONS or not rest:
        set_path(d, key, value)
        return
    tp = _field_type(Scenario, head)
    variants = [v for v in d.get("variants") or [] if isinstance(v, dict)]
    if not isinstance(d.get(head), dict):
        default = _DEFAULT_SECTIONS.get(head)
        d[head] = default().model_dump(mode="json") if default is not None else {}
    default_has = _has_path(tp, d[head], rest)
    if default_has:
        _fill_defaults(tp, d[head], rest)
        set_path(d[head], ".".join(rest), value)
    used = default_has
    if variants:
        used = False
        for v in variants:
            section = v.get(head)
            if not isinstance(section, dict):
                used = used or default_has  # the variant runs the default section
                continue
            if head in _PARTIAL_SECTIONS and rest[0] not in section:
                used = used or default_has  # merged: the default's value reaches it
                continue
            if _has_path(_PARTIAL_SECTIONS.get(head, tp), section, rest):
                set_path(section, ".".join(rest), value)
                used = True
    if not used:
        raise ScenarioError(f"{key}: no variant's {head} has the key {rest[-1]!r}")


@dataclass(frozen=True, slots=True)
class Built:
    """The plain objects one variant runs with."""

    model: ModelSpec
    gpu: GPUSpec
    budget: KVBudget
    limits: Limits
    max_model_len: int
    policy: PolicyConfigBase | None = None  # the policy section with the engine's defaults filled in


def resolve_max_model_len(deployment: Deployment, model: ModelSpec) -> int:
    """The deployment's ``max_model_len``, the model's context when none is given; a ScenarioError past it."""
    max_model_len = deployment.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        # vLLM refuses this too: positions past the trained context are not defined
        raise ScenarioError(
            f"deployment.max_model_len {max_model_len} is longer than {model.name}'s context of "
            f"{model.max_position_embeddings} tokens"
        )
    window = window_refusal(model, max_model_len)  # Gemma-2's local layers (sim/window.py)
    if window is not None:
        raise ScenarioError(window)
    return max_model_len


def size_kv_cache(deployment: Deployment, model: ModelSpec, gpu: GPUSpec, limits: Limits, *,
                  static: bool = False) -> KVBudget:
    """The KV cache one GPU of the deployment gets, as vLLM sizes it for ``limits`` (its activation reserve
    follows the largest step); a ScenarioError, with what would fit, where vLLM refuses to start. ``static``: the
    policy is static batching (the hint then names the keys that policy has). With pipeline stages, one GPU holds
    its stage's layers only."""
    dep = deployment
    try:
        model = stage_model(model, dep.pipeline_parallel_size)
    except ValueError as e:
        raise ScenarioError(f"deployment: {e}") from None
    try:
        budget = engine_kv_budget(dep.engine, model, gpu,
                                  **budget_kwargs(dep, limits.max_num_batched_tokens, limits.max_num_seqs))
    except ModelDoesNotFitError as e:
        hint = ""
        weights = model.shard(dep.tensor_parallel_size).weight_bytes(dep.weight_dtype)
        if limits.max_num_batched_tokens > 8192 and weights < gpu.memory_bytes * dep.gpu_memory_utilization:
            # vLLM sizes the activation reserve for the largest step, so a long max_model_len without chunking
            # costs memory too
            hint = (f" (the activation reserve is sized for max_num_batched_tokens "
                    f"{limits.max_num_batched_tokens}: a smaller deployment.max_model_len or "
                    f"policy.max_num_batched_tokens, or enable_chunked_prefill, lowers it)")
            if static:  # a static policy has neither key: its largest step is a padded batch of whole sequences
                hint = (f" (the activation reserve is sized for batch_size x the longest prompt = "
                        f"{limits.max_num_batched_tokens} tokens, the largest step a padded static batch takes: a "
                        f"smaller policy.batch_size or deployment.max_model_len lowers it, or with "
                        f"deployment.engine policy.max_input_len)")
        raise ScenarioError(f"deployment: {e}{hint}") from None
    except ValueError as e:
        raise ScenarioError(f"deployment: {e}") from None
    max_model_len = limits.max_model_len
    if max_model_len > budget.capacity_tokens:
        # vLLM refuses to start in this case; say what would fit
        raise ScenarioError(
            f"deployment.max_model_len {max_model_len} is larger than the KV cache holds "
            f"({budget.capacity_tokens} tokens in {budget.num_gpu_blocks} blocks); set max_model_len <= "
            f"{budget.capacity_tokens}, raise gpu_memory_utilization, or use more GPUs or a smaller kv_dtype"
        )
    return budget


def _section(value: Any, base: type, field: str, where: str) -> Any:
    """``value`` when it is a config of the kind ``base`` (it then knows how to build its object); a clear error
    for anything else, instead of an AttributeError deep inside ``build``."""
    if not isinstance(value, base):
        raise ScenarioError(f"{where}: {field}: {type(value).__name__} is not a {base.__name__} (every {field} "
                            f"config subclasses sim.scenario.{base.__name__} and defines how it builds)")
    return value


def build(cfg: VariantConfig) -> tuple[Policy, KVManager, CostModel, Built]:
    """Resolve a variant into (policy, kv manager, cost model, Built). Raises ScenarioError naming the field.

    Each section builds its own object (``PolicyConfigBase.build``, ``KVCacheConfigBase.build``,
    ``CostModelConfigBase.build``); this function only resolves what they share (model, GPU, limits, KV size)
    and words the errors."""
    dep = cfg.deployment
    where = f"variant {cfg.name!r}"
    pol: PolicyConfigBase = _section(cfg.policy, PolicyConfigBase, "policy", where)
    kvc: KVCacheConfigBase = _section(cfg.kv_cache, KVCacheConfigBase, "kv_cache", where)
    cm: CostModelConfigBase = _section(dep.cost_model, CostModelConfigBase, "deployment.cost_model", where)
    try:
        model = resolve_model(dep.model)
    except FileNotFoundError as e:
        raise ScenarioError(f"{where}: deployment.model: file not found: {e.filename or e}") from None
    except KeyError as e:
        raise ScenarioError(f"{where}: deployment.model: lacks the field {e}") from None
    except (ValueError, TypeError, OSError) as e:
        raise ScenarioError(f"{where}: deployment.model: {e}") from None
    try:
        gpu = resolve_gpu(dep.gpu)
    except (ValueError, TypeError, AttributeError) as e:
        raise ScenarioError(f"{where}: deployment.gpu: {e}") from None
    try:
        max_model_len = resolve_max_model_len(dep, model)
        pol = resolve_policy(pol, dep, model, gpu, max_model_len)  # the engine's defaults where policy has none
        limits = pol.limits(max_model_len)
        static = isinstance(pol, StaticPolicyConfig)
        sized = replace(limits, max_num_batched_tokens=static_reserve_tokens(  # sim/engine_costs.py
            dep.engine, pol.batch_size, max_model_len, pol.max_input_len)) if isinstance(pol, StaticPolicyConfig) \
            else limits
        budget = size_kv_cache(dep, model, gpu, sized, static=static)
    except ScenarioError as e:
        raise ScenarioError(f"{where}: {e}") from None
    if dep.speculative is not None:  # the proposer's weights and KV take memory from the target's KV
        try:
            budget = spec_decode.budget_for(dep, budget, model, max_model_len)
        except ValueError as e:
            raise ScenarioError(f"{where}: deployment.speculative: {e}") from None
    replicas = 1 if cfg.cluster is None else max(
        cfg.cluster.replicas, cfg.cluster.autoscaler.max_replicas if cfg.cluster.autoscaler else 0)
    kvc = engine_kv_cache(kvc, dep.engine)  # vLLM v1 caches prefixes by default (sim/engine_sched.py)
    prefix = bool(getattr(kvc, "enable_prefix_caching", False))
    fp = kv_footprint(budget.num_gpu_blocks, dep.block_size, max_model_len, limits.max_num_seqs,
                      prefix_caching=prefix, replicas=replicas)
    too_big = check_kv_footprint(fp, num_blocks=budget.num_gpu_blocks, block_size=dep.block_size,
                                 prefix_caching=prefix)
    if too_big is not None:  # refuse before the run grows into it
        raise ScenarioError(f"{where}: deployment: {too_big}")
    num_cpu_blocks = int(dep.swap_space * 2**30 // budget.kv_bytes_per_block) if budget.kv_bytes_per_block else 0
    try:
        policy = configure_policy(pol.build(limits, cfg.admission.build()), dep.engine)
    except ValueError as e:
        raise ScenarioError(f"{where}: policy: {e}") from None
    kv = kvc.build(budget.num_gpu_blocks, dep.block_size, max_model_len=max_model_len, num_cpu_blocks=num_cpu_blocks)
    kv = configure_kv(kv, dep.engine)
    try:
        attach_host_tier(kv, getattr(kvc, "host_cache", None), budget, gpu)
    except ValueError as e:
        raise ScenarioError(f"{where}: kv_cache: {e}") from None
    try:
        cost = cm.build(model, gpu, dep)
        cost = wrap_pipeline(cost, model, gpu, pipeline_parallel_size=dep.pipeline_parallel_size,
                             link=dep.pipeline_link, weight_dtype=dep.weight_dtype)
    except ScenarioError as e:  # the section named its own field
        raise ScenarioError(f"{where}: deployment.{e}") from None
    except (ValueError, TypeError, OSError) as e:
        raise ScenarioError(f"{where}: deployment.cost_model: {e}") from None
    if dep.speculative is not None:
        if dep.pipeline_parallel_size > 1:  # the draft's stages and the verify step's pipeline are not modelled
            raise ScenarioError(f"{where}: deployment.speculative with pipeline_parallel_size > 1 is not modelled")
        try:
            cost = spec_decode.cost_for(dep, cost, model, gpu)
        except ValueError as e:
            raise ScenarioError(f"{where}: deployment.speculative: {e}") from None
    return policy, kv, cost, Built(model, gpu, budget, limits, max_model_len, pol)


def slos_of(scenario: Scenario) -> SLOs | None:
    s = scenario.slos
    return None if s is None else SLOs(ttft=s.ttft, tpot=s.tpot, e2el=s.e2el)


def is_trace(scenario: Scenario) -> bool:
    return isinstance(scenario.workload.arrival, TraceArrival)


def json_schema() -> dict[str, Any]:
    """JSON Schema of scenario files, for editors."""
    schema = Scenario.model_json_schema()
    schema["title"] = "servesim scenario"
    return schema
