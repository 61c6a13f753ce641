"""The scenario schema: every section a scenario file may have, validated at the boundary (``sim.config.scenario`` reads
the file, ``sim.loop.build`` turns a variant into the objects that run it).

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

import difflib
import math
import re
import unicodedata
from abc import abstractmethod
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from sim.config.deployment import AnalyticCost as AnalyticCost  # re-exported: the deployment section has its module
from sim.config.deployment import CostModelConfig as CostModelConfig
from sim.config.deployment import CostModelConfigBase as CostModelConfigBase
from sim.config.deployment import Deployment as Deployment
from sim.config.deployment import FittedCost as FittedCost
from sim.config.errors import ScenarioError as ScenarioError  # re-exported: where every caller finds it
from sim.config.host_kv_config import HostCacheConfig
from sim.config.input_model import SLO_UNIT_HELP as _UNIT
from sim.config.input_model import Float, InputModel, Int, SLOSeconds, kind_description
from sim.config.scenario_messages import OTHER_NAMES, all_keys, closest_key, closest_keys, either, key_section
from sim.engines.costs import omit_when_unset
from sim.hardware.gpu import GPUSpec
from sim.loop.disagg.config import DisaggConfig, PlanDisaggConfig
from sim.policies import Admission
from sim.policies.configs import AdmissionRuleConfig, RouterConfig
from sim.policies.configs import ContinuousPolicyConfig as ContinuousPolicyConfig  # re-exported: the policy
from sim.policies.configs import PolicyConfig as PolicyConfig  # sections live with the policies
from sim.policies.configs import PolicyConfigBase as PolicyConfigBase
from sim.policies.configs import StaticPolicyConfig as StaticPolicyConfig
from sim.serving.block_manager import PagedBlockManager
from sim.serving.contiguous_allocator import ContiguousAllocator
from sim.serving.kv_manager import KVManager
from sim.workload.generator import Workload

# Size limits: a run past them would exhaust memory or never end; each is refused up front, saying what it needs.
MAX_SWEEP_RUNS = 100_000  # (sweep point, variant) runs in one scenario
MAX_REPLICAS = 1024  # replicas of one cluster (each its own policy, KV manager and cost model)
# KV blocks: sim/config/limits.py bounds what the KV managers can touch, not the pool (untouched blocks cost nothing)


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- KV cache -------------------------------------------------------------------------------------------------
class KVCacheConfigBase(_Model):
    """A ``kv_cache`` section: each kind builds its own KV manager (``build``)."""

    @abstractmethod
    def build(self, num_blocks: int, block_size: int, *, max_model_len: int, num_cpu_blocks: int) -> KVManager:
        """A KV manager of ``num_blocks`` GPU blocks of ``block_size`` tokens and ``num_cpu_blocks`` of swap."""


class PagedKV(KVCacheConfigBase):
    """vLLM's paged KV cache: blocks of block_size tokens taken as a request's tokens come, freed as it ends."""

    type: Literal["paged"] = "paged"
    enable_prefix_caching: bool = Field(default=False, description="Reuse KV blocks of equal prompt prefixes.")
    host_cache: HostCacheConfig | None = Field(
        default=None, description="Keep evicted prefix blocks in host memory, loaded back on a hit; none: off.")

    def build(self, num_blocks: int, block_size: int, *, max_model_len: int,
              num_cpu_blocks: int) -> PagedBlockManager:
        return PagedBlockManager(num_blocks, block_size, enable_prefix_caching=self.enable_prefix_caching,
                                 num_cpu_blocks=num_cpu_blocks)


class ContiguousKV(KVCacheConfigBase):
    """A contiguous KV cache, as servers before vLLM kept it: each request reserves its space up front (reserve)."""

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




class AdmissionConfig(_Model):
    max_queue_len: Int | None = Field(
        default=None, ge=0, description="Reject arrivals beyond this many waiting requests."
    )
    max_queue_delay: Float | None = Field(
        default=None, gt=0, description="Reject a request still waiting (never scheduled) after this many seconds."
    )
    rule: AdmissionRuleConfig | None = Field(
        default=None, description="A rule asked at each arrival after the limits above: token_bucket (a rate "
        "limit) or custom (a servesim.Admission class); none: no rule.")
    _record_set_keys = omit_when_unset("rule")  # recorded only when given

    def build(self) -> Admission:
        from sim.policies.gates import UserAdmission

        rule = UserAdmission(self.rule.make()) if self.rule is not None else None  # a fresh one per replica
        return Admission(self.max_queue_len, self.max_queue_delay, rule)


class SLOConfig(_Model):
    ttft: SLOSeconds | None = Field(default=None, gt=0, description=f"Time to first token bound, seconds{_UNIT}.")
    tpot: SLOSeconds | None = Field(default=None, gt=0, description=f"Time per output token bound, seconds{_UNIT}.")
    e2el: SLOSeconds | None = Field(default=None, gt=0, description=f"End-to-end latency bound, seconds{_UNIT}.")


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
    objective: Literal["cost", "joules"] = Field(
        default="cost",
        description="What the choice minimises among the deployments meeting the SLOs: cost (USD per hour) or "
        "joules (per output token; every survivor is simulated, as a costlier one may draw less, and stop_early "
        "does not apply).",
    )


# ---- cluster (many replicas behind a router) -------------------------------------------------------------------
def _replicas_cap(n: int) -> int:
    if n > MAX_REPLICAS:
        raise ValueError(f"{n} replicas would each hold a policy, a KV cache and a cost model in memory; at most "
                         f"{MAX_REPLICAS}")
    return n


KV_USAGE_MAX_THRESHOLD = 2.0  # kv_usage thresholds above this are a percent written as a number (70 for 0.70)


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
        # kv_usage counts the blocks queued prompts need too, so it passes 1 under a backlog (queued prompts needing
        # more blocks than are free): a threshold a little above 1 means something; 70 (for 70%) never fired, silently
        for key, v in (("scale_up", self.scale_up), ("scale_down", self.scale_down)):
            if self.signal == "kv_usage" and v > KV_USAGE_MAX_THRESHOLD:
                raise ValueError(f"{key} ({v:g}): the kv_usage signal is a share of the KV cache (write {v / 100:g} "
                                 f"for {v:g}%); it passes 1 only while queued prompts need more blocks than are free, "
                                 f"so a threshold above {KV_USAGE_MAX_THRESHOLD:g} reads as a percent")
        if not self.scale_down < self.scale_up:
            raise ValueError(f"scale_down ({self.scale_down}) must be below scale_up ({self.scale_up})")
        # busy and compute are shares of at most 1 and the autoscaler adds a replica when the signal is strictly
        # above scale_up: at 1 or more (70 for 70%) it never scaled up, and the run said nothing
        if self.signal in ("busy", "compute") and not self.scale_up < 1:
            raise ValueError(f"scale_up ({self.scale_up}): the {self.signal} signal is a share of at most 1 and "
                             "must rise above it, so scale_up must be below 1 (70% is 0.7)")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        return self


RouterName = Literal["round_robin", "least_outstanding", "least_kv", "prefix_affinity"]  # built-ins named by a string
# the built-ins written as a mapping ({type: power_of_two, seed: 1}): RouterConfig's kinds but a user's own class
_MAPPED_ROUTERS = tuple(n for c in get_args(get_args(RouterConfig)[0])
                        if (n := get_args(c.model_fields["type"].annotation)[0]) != "custom")


class ClusterConfig(_Model):
    replicas: Int = Field(
        default=1, ge=1, description="Replicas at the start (each a GPU or a tensor-parallel group)."
    )
    router: RouterName | RouterConfig = Field(
        default="round_robin", description="Which replica gets an arriving request: a built-in's name; {type: "
        "power_of_two | cache_load_score | slo_aware, ...} (sim/policies/routers_public.py); or {type: custom, "
        "cls: 'file.py:Class', args: {...}} for a servesim.Router of your own."
    )
    autoscaler: AutoscalerSection | None = Field(
        default=None, description="Add and remove replicas; none: a fixed fleet."
    )

    _cap = field_validator("replicas")(classmethod(lambda cls, n: _replicas_cap(n)))

    @field_validator("router", mode="before")
    @classmethod
    def _router_in_either_form(cls, v: Any) -> Any:
        """A built-in router written in the other form than its own reads as its own: ``{type: least_kv}`` as
        ``least_kv``, ``power_of_two`` as ``{type: power_of_two}`` (each was refused with a message that listed only
        the other form's routers, as if the one written did not exist)."""
        if isinstance(v, dict) and v.get("type") in get_args(RouterName):
            if set(v) != {"type"}:
                raise ValueError(f"{v['type']} takes no keys but type (got {', '.join(sorted(set(v) - {'type'}))})")
            return v["type"]
        if isinstance(v, str) and v in _MAPPED_ROUTERS:
            return {"type": v}
        if isinstance(v, str) and v not in get_args(RouterName):
            # one line naming every built-in (the union's two messages named four, as if the others did not exist)
            names = (*get_args(RouterName), *_MAPPED_ROUTERS)
            close = difflib.get_close_matches(v.lower().replace("-", "_"), names, n=1, cutoff=0.6)
            raise ValueError(f"not a router's name; {f'did you mean {close[0]}? ' if close else ''}the built-ins: "
                             f"{', '.join(names)}; or {{type: custom, cls: 'file.py:Class'}} for a servesim.Router "
                             "of your own")
        return v

    @model_validator(mode="after")
    def _start_in_range(self) -> ClusterConfig:
        a = self.autoscaler
        if a is not None and not a.min_replicas <= self.replicas <= a.max_replicas:
            raise ValueError(f"replicas ({self.replicas}) must lie in the autoscaler's [min_replicas, max_replicas] "
                             f"= [{a.min_replicas}, {a.max_replicas}]")
        return self


# Unicode categories a variant's name may not hold: control characters (line breaks, tabs) and line and paragraph
# separators (U+2028, U+2029)
_NOT_IN_A_HEADER = frozenset({"Cc", "Zl", "Zp"})


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

    @field_validator("name")
    @classmethod
    def _printable(cls, name: str) -> str:
        # the name heads a column of the printed table and of the report: "a\nb" broke the header over two lines,
        # "   " headed a blank column. Control characters and line or paragraph separators only: isprintable()
        # also refused a no-break space ("tp\u00a02", pasted from a document) and an emoji's zero-width joiner
        if any(unicodedata.category(c) in _NOT_IN_A_HEADER for c in name):
            raise ValueError("holds a line break, tab or other control character; a variant's name heads a table "
                             "column")
        if not name.strip():
            raise ValueError("is only spaces; a variant's name heads a table column")
        return name


# what a sweep may vary: a section's key, or the seed (a sweep over seeds gives the seed-to-seed spread; every
# variant at one seed still replays the same requests); the cluster's keys make a cluster study (replicas x router
# x load) one sweep; disaggregation (a section only variants have) reaches the variants that have one; slos, the
# run's SLOs (goodput at several TTFT bounds; a sweep over slos.ttft was refused as if no key could vary them)
_SWEEP_HEADS = ("workload", "deployment", "kv_cache", "policy", "admission", "cluster", "disaggregation", "seed",
                "slos")


class Scenario(_Model):
    name: str = Field(default="scenario", description="Scenario name.")
    description: str = Field(default="", description="What the scenario shows.")
    seed: Int = Field(default=0, ge=0, description="Seed of the run's one random generator.")
    workload: Workload = Field(description="The requests every variant replays: arrivals, lengths, classes.")
    deployment: Deployment = Field(
        default_factory=Deployment, description="Model, GPU, parallelism, memory, cost model; variants merge keys in.")
    kv_cache: KVCacheConfig = Field(default_factory=PagedKV, description="How KV memory is allocated.")
    policy: PolicyConfig = Field(default_factory=ContinuousPolicyConfig,
                                 description="The scheduling policy and its limits (max_num_seqs, ...).")
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig,
                                       description="Which arrivals are refused before they queue; default: none.")
    slos: SLOConfig | None = Field(default=None, description="Service-level objectives for goodput.")
    variants: list[Variant] = Field(
        default_factory=list, description="Compared configurations; none: one variant named after the scenario."
    )
    sweep: dict[str, list[Any]] | None = Field(
        default=None,
        description="Grid over parameters: dotted path -> values, e.g. {policy.max_num_seqs: [8, 32]}; paths "
        "start with workload, deployment, kv_cache, policy, admission, cluster, disaggregation or slos (or are "
        "the seed) and apply to every variant that has the key.",
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
            problem = unknown_key(Variant if parts[0] not in cls.model_fields else Scenario, parts, None)
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


# ---- key paths (--set, sweeps, variants' partial sections) ----------------------------------------------------
PARTIAL_SECTIONS: dict[str, type[BaseModel]] = {"deployment": Deployment, "workload": Workload}


def _members(tp: Any) -> list[Any]:
    """The concrete types an annotation allows (Annotated and Optional unwrapped, unions spread)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin in (Union, UnionType):
        return [m for a in get_args(tp) for m in _members(a) if m is not type(None)]
    return [tp]


def models_of(tp: Any) -> list[type[BaseModel]]:
    return [m for m in _members(tp) if isinstance(m, type) and issubclass(m, BaseModel)]


def narrow(models: list[type[BaseModel]], node: Any) -> list[type[BaseModel]]:
    """The members of a discriminated union that a section of the file (with its ``type``) can be."""
    tag = node.get("type") if isinstance(node, dict) else None
    if len(models) > 1 and isinstance(tag, str):
        picked = [m for m in models if "type" in m.model_fields and m.model_fields["type"].default == tag]
        return picked or models
    return models


def field_type(model: type[BaseModel], name: str) -> Any:
    if model is Variant and name in PARTIAL_SECTIONS:
        return PARTIAL_SECTIONS[name]  # a variant's deployment or workload is partial, merged into the default
    return model.model_fields[name].annotation


def unknown_key(tp: Any, parts: list[str], node: Any, done: str = "", root: Any = None, scope: str = ""
                ) -> str | None:
    """Why the dotted path ``parts`` names no key of the schema below ``tp`` (None: it may), with the closest
    key as a suggestion, else the section elsewhere that has the very key (``deployment.max_num_seqs``: the
    policy's; within ``scope``, a list's item such as ``variants.1``, whose schema is ``root``). ``node`` is the
    file's value there, when it has one, to pick a union's member."""
    if not parts:
        return None
    root = tp if root is None else root
    part, rest = parts[0], parts[1:]
    where = f"{done}.{part}" if done else part
    members = _members(tp)
    models = narrow(models_of(tp), node)
    if models:
        fields = sorted({f for m in models for f in m.model_fields})
        if part not in fields:
            if len(models) < len(models_of(tp)) and any(part in m.model_fields for m in models_of(tp)):
                return None  # another member has it: the sweep or --set rules decide
            return f"{where}: unknown key{_set_key_hint(part, fields, done, root, scope)}"
        child = node.get(part) if isinstance(node, dict) else None
        for m in models:
            if part in m.model_fields:
                return unknown_key(field_type(m, part), rest, child, where, root, scope)
        return None
    for m in members:
        origin = get_origin(m)
        if origin is list and get_args(m):
            if not re.fullmatch(r"-?[0-9]+", part):
                return f"{where}: a list is indexed by a number, got {part!r}"
            item = node[int(part)] if isinstance(node, list) and -len(node) <= int(part) < len(node) else None
            return unknown_key(get_args(m)[0], rest, item, where, None, where)  # keys within the item
    return None  # a free-form value (a dict of GPU fields, a model config, any): checked where it is used


def _set_key_hint(part: str, fields: list[str], done: str, root: Any, scope: str) -> str:
    """The hint after an unknown dotted key's "unknown key", by the rules a scenario file's key gets
    (``unknown_key_hint``: initials, vllm bench's option names), written as a dotted key: ``--set deployment.tp``
    was told the section's eighteen keys where the file's ``tp`` got "did you mean tensor_parallel_size"."""
    other, source = OTHER_NAMES.get(part.lower(), ("", ""))
    close = [other] if other in fields else closest_keys(part, fields) or difflib.get_close_matches(part, fields, n=1)
    if close:
        note = f" ({source})" if close == [other] else ""
        return f"; did you mean {either([(done + '.' if done else '') + k for k in close])}{note}?"
    # elsewhere in the scenario: the very key first, else the closest; a section's own key, not one deep inside
    key: str | None = None
    if models_of(root):
        key = part if key_section(root, part) is not None else other or closest_key(part, sorted(all_keys(root)))
    place = key_section(root, key) if key is not None else None
    if place is None or "." in place and key != other:  # vllm bench's names are no guess: num_users is deep
        return f"; known keys: {', '.join(fields)}"
    note = f" ({source})" if key == other else ""
    return f"; did you mean {'.'.join(p for p in (scope, place, key) if p)}{note}?"


def has_path(tp: Any, node: Any, parts: list[str]) -> bool:
    """Whether a section of the file (of schema type ``tp``) can hold the dotted path: False when the kind of
    section it is (its ``type``) lacks a key on the way."""
    for part in parts:
        models = narrow(models_of(tp), node)
        if not models:
            return True
        model = next((m for m in models if part in m.model_fields), None)
        if model is None:
            return False
        tp = field_type(model, part)
        node = node.get(part) if isinstance(node, dict) else None
    return True


# pydantic (2.14) writes the bound of an optional number (``Int | None`` with ``Field(ge=0)``) under its own names,
# which JSON Schema does not know, so an editor checked none of those bounds
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _standard_bounds(node: Any) -> None:
    if isinstance(node, dict):
        # a number's schema, or a union of a number and text (an SLO's '200ms'), whose bounds JSON Schema applies to
        # numbers only: its keys are keywords, not properties
        if node.get("type") in ("integer", "number") or "anyOf" in node:
            for name, keyword in _BOUNDS.items():
                if name in node:
                    node[keyword] = node.pop(name)
        for value in node.values():
            _standard_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _standard_bounds(value)


def json_schema() -> dict[str, Any]:
    """JSON Schema of scenario files, for editors."""
    schema = Scenario.model_json_schema()
    _standard_bounds(schema)
    for section in schema.get("$defs", {}).values():  # a section's kind, where its ``type`` says nothing itself
        kind = section.get("properties", {}).get("type")
        if isinstance(kind, dict) and "description" not in kind:
            kind["description"] = kind_description(section.get("description"))
    schema["title"] = "servesim scenario"
    return schema
