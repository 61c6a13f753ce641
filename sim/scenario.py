"""Scenario files: what to simulate, validated at the boundary, and turned into the objects that run it.

A scenario names one workload and one or more *variants* (policy, KV cache, deployment) that all replay that
very workload, plus optional SLOs and a sweep (a grid over any parameters). The top-level ``deployment``,
``kv_cache``, ``policy`` and ``admission`` sections are the defaults every variant starts from; a variant
replaces ``kv_cache``, ``policy`` or ``admission`` whole and merges its ``deployment`` keys into the default.

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
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sim.block_manager import PagedBlockManager
from sim.contiguous_allocator import ContiguousAllocator
from sim.costmodel import AnalyticCostModel, FittedCostModel
from sim.metrics import SLOs
from sim.policies import Admission, ContinuousPolicy, Limits, StaticPolicy
from sim.specs import GPUSpec, KVBudget, ModelDoesNotFitError, ModelSpec, kv_budget
from sim.traces import resolve_trace
from sim.workload import MAX_REQUESTS, Float, InputModel, Int, TraceArrival, Workload


class ScenarioError(ValueError):
    """A scenario that cannot run: the message names the field and the reason."""


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- deployment -----------------------------------------------------------------------------------------------
class AnalyticCost(_Model):
    type: Literal["analytic"] = "analytic"
    compute_efficiency: Float | None = Field(None, gt=0, le=1, description="Share of peak FLOP/s matmuls reach.")
    bandwidth_efficiency: Float | None = Field(None, gt=0, le=1, description="Share of HBM bandwidth reached.")
    step_overhead: Float | None = Field(None, ge=0, description="Fixed seconds per step (CPU, launches).")
    per_request_overhead: Float | None = Field(None, ge=0, description="Seconds per request per step.")


class FittedCost(_Model):
    type: Literal["fitted"] = "fitted"
    profile: str = Field(description="Path of a calibration profile JSON (see `servesim calibrate`).")


CostModelConfig = Annotated[Union[AnalyticCost, FittedCost], Field(discriminator="type")]


class Deployment(_Model):
    model: str | dict[str, Any] = Field(
        "llama-3.1-8b", description="Model preset name, path to a Hugging Face config.json, or its fields inline."
    )
    gpu: str | dict[str, Any] = Field("h100-sxm", description="GPU preset name, or GPUSpec fields inline.")
    weight_dtype: Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"] = Field(
        "bf16", description="Data type of the weights."
    )
    kv_dtype: Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8"] = Field(
        "auto", description="Data type of the KV cache; auto: the model's activation dtype."
    )
    tensor_parallel_size: Int = Field(1, ge=1, description="GPUs one replica's weights and KV are split over.")
    gpu_memory_utilization: Float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory the engine may use (weights + activations + KV)."
    )
    num_gpu_blocks: Int | None = Field(None, ge=1, description="Override the KV block count vLLM would size.")
    block_size: Int = Field(16, ge=1, description="Tokens per KV block.")
    max_model_len: Int | None = Field(
        None, ge=1, description="Longest prompt+output a request may have; none: the model's context length."
    )
    swap_space: Float = Field(4.0, ge=0, description="CPU swap space per GPU in GiB (vLLM's swap_space).")
    cost_model: CostModelConfig = Field(default_factory=AnalyticCost, description="How step times are predicted.")
    leak_kv_on_failure: bool = Field(
        False,
        description="The bug the failure-mode scenarios show: the KV blocks of a request that fails mid-flight "
        "are never freed. Off: they are freed at once, as a correct server does.",
    )


# ---- KV cache -------------------------------------------------------------------------------------------------
class PagedKV(_Model):
    type: Literal["paged"] = "paged"
    enable_prefix_caching: bool = Field(False, description="Reuse KV blocks of equal prompt prefixes.")


class ContiguousKV(_Model):
    type: Literal["contiguous"] = "contiguous"
    reserve: Literal["max_model_len", "request"] = Field(
        "max_model_len",
        description="What each request reserves up front: max_model_len tokens (what a server that does not know "
        "the output length must do), or its own prompt+output (an oracle; still wastes the unfilled part).",
    )


KVCacheConfig = Annotated[Union[PagedKV, ContiguousKV], Field(discriminator="type")]


# ---- policies -------------------------------------------------------------------------------------------------
class StaticPolicyConfig(_Model):
    type: Literal["static"] = "static"
    batch_size: Int = Field(8, ge=1, description="Requests per batch.")
    max_wait: Float = Field(1.0, ge=0, description="Seconds the oldest queued request waits for a full batch.")
    preemption_mode: Literal["recompute", "swap"] = Field("recompute", description="If paged KV runs out.")


class ContinuousPolicyConfig(_Model):
    type: Literal["continuous"] = "continuous"
    max_num_seqs: Int = Field(256, ge=1, description="Requests in one step at most.")
    max_num_batched_tokens: Int | None = Field(
        None,
        ge=1,
        description="Tokens computed in one step at most; none: 8192 with chunked prefill, else "
        "max(8192, max_model_len).",
    )
    enable_chunked_prefill: bool = Field(False, description="Cut prompts into chunks that fill each step.")
    prefill_mode: Literal["prefill_first", "mixed"] = Field(
        "prefill_first", description="Without chunking: prompts-only steps first (vLLM v0), or mixed steps."
    )
    preemption_mode: Literal["recompute", "swap"] = Field(
        "recompute", description="What happens to the latest-admitted request when blocks run out."
    )


PolicyConfig = Annotated[Union[StaticPolicyConfig, ContinuousPolicyConfig], Field(discriminator="type")]


class AdmissionConfig(_Model):
    max_queue_len: Int | None = Field(None, ge=0, description="Reject arrivals beyond this many waiting requests.")
    max_queue_delay: Float | None = Field(
        None, gt=0, description="Reject a request still waiting (never scheduled) after this many seconds."
    )


class SLOConfig(_Model):
    ttft: Float | None = Field(None, gt=0, description="Time to first token bound, seconds.")
    tpot: Float | None = Field(None, gt=0, description="Time per output token bound, seconds.")
    e2el: Float | None = Field(None, gt=0, description="End-to-end latency bound, seconds.")


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
        None, min_length=1, description="GPU presets (or GPUSpec fields inline) to consider; none: every preset."
    )
    tensor_parallel_sizes: list[Annotated[Int, Field(ge=1)]] = Field(
        [1, 2, 4, 8], min_length=1, description="Tensor-parallel degrees; those that do not split the model are "
        "skipped."
    )
    weight_dtypes: list[PlanWeightDType] = Field(
        ["bf16", "fp8", "int8", "int4"], min_length=1,
        description="Weight data types (quality differs: the simulator does not model it; list only those you "
        "accept).",
    )
    kv_dtypes: list[PlanKVDType] = Field(["auto", "fp8"], min_length=1, description="KV cache data types.")
    max_num_seqs: list[Annotated[Int, Field(ge=1)]] = Field(
        [64, 256], min_length=1, description="Values of the policy's max_num_seqs."
    )
    enable_chunked_prefill: list[bool] = Field([True, False], min_length=1, description="Chunked prefill on/off.")
    max_gpus: Int = Field(8, ge=1, description="Most GPUs in one deployment (replicas x tensor_parallel_size).")
    percentile: Literal[50, 90, 95, 99] = Field(
        99, description="The SLOs bound this percentile of TTFT, TPOT and E2EL (99: p99 TTFT <= slos.ttft)."
    )
    api_price: ApiPrice | None = Field(
        None, description="A hosted API's price, for the break-even volume; none: no break-even."
    )
    stop_early: bool = Field(
        True, description="Stop simulating once the cheapest cost level with a configuration meeting the SLOs is "
        "done (costlier ones cannot be chosen); false: simulate every survivor, for the whole Pareto front.",
    )


# ---- cluster (many replicas behind a router) -------------------------------------------------------------------
class AutoscalerSection(_Model):
    signal: Literal["busy", "compute", "kv_usage", "queue", "ttft"] = Field(
        description="What it watches: busy (share of time replicas run steps, the usual GPU 'utilisation'), "
        "compute (FLOPs done over peak FLOPs, i.e. MFU), "
        "kv_usage (KV blocks in use or needed by queued prompts), queue (waiting requests per replica) or ttft "
        "(mean seconds to first token over the last interval)."
    )
    scale_up: Float = Field(gt=0, description="Add a replica when the signal is above this.")
    scale_down: Float = Field(ge=0, description="Drain a replica when the signal is below this.")
    interval: Float = Field(10.0, gt=0, description="Seconds between two looks at the signal.")
    cooldown: Float = Field(60.0, ge=0, description="Seconds after an action before the next one.")
    provisioning_delay: Float = Field(
        120.0, ge=0, description="Seconds from ordering a GPU to it serving (boot, weights); paid meanwhile."
    )
    min_replicas: Int = Field(1, ge=1, description="Fewest replicas.")
    max_replicas: Int = Field(8, ge=1, description="Most replicas, provisioning ones included.")


class ClusterConfig(_Model):
    replicas: Int = Field(1, ge=1, description="Replicas at the start (each a GPU or a tensor-parallel group).")
    router: Literal["round_robin", "least_outstanding", "least_kv", "prefix_affinity"] = Field(
        "round_robin", description="Which replica gets an arriving request."
    )
    autoscaler: AutoscalerSection | None = Field(None, description="Add and remove replicas; none: a fixed fleet.")


class Variant(_Model):
    name: str = Field(min_length=1, description="Name in tables and summary.json.")
    deployment: dict[str, Any] | None = Field(None, description="Keys merged into the default deployment.")
    kv_cache: KVCacheConfig | None = Field(None, description="Replaces the default KV cache.")
    policy: PolicyConfig | None = Field(None, description="Replaces the default policy.")
    admission: AdmissionConfig | None = Field(None, description="Replaces the default admission control.")
    cluster: ClusterConfig | None = Field(None, description="Replaces the default cluster.")


_SWEEP_HEADS = ("workload", "deployment", "kv_cache", "policy", "admission")


class Scenario(_Model):
    name: str = Field("scenario", description="Scenario name.")
    description: str = Field("", description="What the scenario shows.")
    seed: Int = Field(0, ge=0, description="Seed of the run's one random generator.")
    workload: Workload
    deployment: Deployment = Field(default_factory=Deployment)
    kv_cache: KVCacheConfig = Field(default_factory=PagedKV)
    policy: PolicyConfig = Field(default_factory=ContinuousPolicyConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    slos: SLOConfig | None = Field(None, description="Service-level objectives for goodput.")
    variants: list[Variant] = Field(
        default_factory=list, description="Compared configurations; none: one variant named after the scenario."
    )
    sweep: dict[str, list[Any]] | None = Field(
        None,
        description="Grid over parameters: dotted path -> values, e.g. {policy.max_num_seqs: [8, 32]}; paths "
        "start with workload, deployment, kv_cache, policy or admission and apply to every variant.",
    )
    keep_token_times: bool = Field(False, description="Keep every token's timestamp on the requests (memory!).")
    plan: PlanConfig | None = Field(None, description="Search space and API price for `servesim plan`.")
    cluster: ClusterConfig | None = Field(
        None, description="Several replicas behind a router, optionally autoscaled; none: one replica."
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
            head = key.split(".")[0]
            if head not in _SWEEP_HEADS:
                raise ValueError(f"key {key!r} must start with {', '.join(_SWEEP_HEADS)}")
            if not values:
                raise ValueError(f"key {key!r} has no values")
        return sweep


# ---- loading --------------------------------------------------------------------------------------------------
_MAX_PROBLEMS = 5  # validation problems listed in one message


def _clean_loc(loc: tuple[Any, ...], raw: Any, keep_last: bool = False) -> str:
    """A pydantic error location as the dotted path of the scenario file.

    pydantic inserts the member a union tried (a ``type`` tag such as ``poisson``, or a type name such as ``str``)
    into the location; those are not keys of the file. Walking the input keeps only the parts that are keys (or
    list indices) there, plus a final part that is absent (a missing or unknown key)."""
    parts: list[str] = []
    node = raw
    for i, p in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and p in node:
            node = node[p]
            parts.append(str(p))
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
            parts.append(str(p))
        elif last and (keep_last or not (isinstance(p, str) and (p in _UNION_TAGS or "[" in p or p in _TYPE_LABELS))):
            parts.append(str(p))
        # else: a union member label: not part of the file
    return ".".join(parts)


_TYPE_LABELS = {"str", "int", "float", "bool", "none", "list", "dict", "tuple"}
_UNION_TAGS = {
    "analytic", "fitted", "paged", "contiguous", "static", "continuous", "poisson", "gamma", "constant",
    "all_at_once", "closed_loop", "trace", "fixed", "uniform", "normal", "lognormal", "exponential", "empirical",
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_EXPECTED = {  # pydantic error type -> what the file should hold there
    "model_attributes_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "dict_type": "a mapping of keys to values",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "none_required": "null",
}


def _reason(e: dict[str, Any]) -> str:
    kind = e["type"]
    if kind in _EXPECTED:
        return "expected " + _EXPECTED[kind]
    if kind == "union_tag_invalid":
        return f"unknown type {e['ctx']['tag']}; expected one of {e['ctx']['expected_tags']}"
    msg = e["msg"].removeprefix("Value error, ")
    return "must be " + msg.removeprefix("Input should be ") if msg.startswith("Input should be ") else msg


def _format_validation(err: ValidationError, source: str, raw: Any = None, prefix: str = "") -> str:
    """One line per offending key: ``source: dotted.path: reason (got value)``. The errors a union reports once
    per member at the same key are merged into one line."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for e in err.errors():
        loc = _clean_loc(tuple(e["loc"]), raw, keep_last=e["type"] in ("missing", "extra_forbidden"))
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):  # name the tag key itself
            loc = ".".join(x for x in (loc, str(e["ctx"]["discriminator"]).strip("'")) if x)
        loc = prefix + loc if loc else prefix.rstrip(".")
        grouped.setdefault(loc, []).append(e)
    lines = []
    for loc, errs in list(grouped.items())[:_MAX_PROBLEMS]:
        kinds = {e["type"] for e in errs}
        if "extra_forbidden" in kinds:
            reason = "unknown key"
        elif kinds & {"missing", "union_tag_not_found"}:
            reason = "required key is missing"
        else:
            reasons: list[str] = []
            for e in errs:
                r = _reason(e)
                if r not in reasons:
                    reasons.append(r)
            if len(reasons) > 1 and all(r.startswith("expected ") for r in reasons):
                reason = "expected " + " or ".join(r.removeprefix("expected ") for r in reasons)
            else:
                reason = "; or ".join(reasons)
            value = errs[0].get("input")
            scalar = not isinstance(value, (dict, list))
            if "union_tag_invalid" not in kinds and (scalar or kinds & set(_EXPECTED)):
                reason += f" (got {_short(value)})"
        lines.append(f"{source}: {loc or '(top level)'}: {reason}")
    more = len(grouped) - _MAX_PROBLEMS
    if more > 0:
        lines.append(f"... and {more} more problem(s)")
    return "\n".join(lines)


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
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"cannot read value {text!r} as YAML: {_yaml_error(e)}") from None


def _yaml_error(e: yaml.YAMLError) -> str:
    """A YAML error on one line: ``line:column: problem (context)``."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(e, "context", None)
    cmark = getattr(e, "context_mark", None)
    ctx = ""
    if context:
        ctx = f" ({context}" + (f" at line {cmark.line + 1}, column {cmark.column + 1}" if cmark else "") + ")"
    return f"{where}{problem}{ctx}"


def load_scenario(
    path: str | Path, overrides: dict[str, Any] | None = None
) -> tuple["Scenario", dict[str, Any]]:
    """Read and validate a scenario file. ``overrides`` maps dotted paths to values (the CLI's ``--set``).
    Returns the validated scenario and the raw dict it came from. Raises ScenarioError with one clear message."""
    p = Path(path)
    if not p.exists():
        raise ScenarioError(f"{p}: scenario file not found")
    if not p.is_file():
        raise ScenarioError(f"{p}: not a file (a scenario is a YAML file)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{p}: cannot read the file: {e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{p}: not valid YAML: {_yaml_error(e)}") from None
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise ScenarioError(f"{p}: a scenario must be a mapping of keys to values, got {got}")
    for key, value in (overrides or {}).items():
        try:
            set_path(raw, key, value)
        except ScenarioError as e:
            raise ScenarioError(f"--set {e}") from None
    _resolve_relative_paths(raw, p.parent)
    return parse_scenario(raw, source=str(p)), raw


def parse_scenario(raw: dict[str, Any], source: str = "scenario") -> "Scenario":
    """Validate a scenario dict: its schema, every variant's merged deployment, and that trace files exist.
    Raises ScenarioError naming the key path and the reason."""
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(_format_validation(e, source, raw)) from None
    base = scenario.deployment.model_dump()
    for i, v in enumerate(scenario.variants):
        if v.deployment:
            try:
                Deployment.model_validate({**base, **v.deployment})
            except ValidationError as e:
                raise ScenarioError(
                    _format_validation(e, source, v.deployment, prefix=f"variants.{i}.deployment.")
                ) from None
    _check_trace_files(scenario, source)
    return scenario


def _check_trace_files(scenario: "Scenario", source: str) -> None:
    wl = scenario.workload
    for key, part in (("arrival", wl.arrival), ("prompt_len", wl.prompt_len), ("output_len", wl.output_len)):
        trace = getattr(part, "trace", None)
        if isinstance(trace, str):
            try:
                resolve_trace(trace)
            except FileNotFoundError as e:
                raise ScenarioError(f"{source}: workload.{key}.trace: {e}") from None


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


# ---- resolving a variant into objects -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class VariantConfig:
    """One variant with every default filled in: what runs."""

    name: str
    deployment: Deployment
    kv_cache: PagedKV | ContiguousKV
    policy: StaticPolicyConfig | ContinuousPolicyConfig
    admission: AdmissionConfig
    params: dict[str, Any]  # sweep point, {} without a sweep
    cluster: ClusterConfig | None = None  # several replicas; None: one

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "deployment": self.deployment.model_dump(mode="json"),
            "kv_cache": self.kv_cache.model_dump(mode="json"),
            "policy": self.policy.model_dump(mode="json"),
            "admission": self.admission.model_dump(mode="json"),
            "params": self.params,
        }
        if self.cluster is not None:
            out["cluster"] = self.cluster.model_dump(mode="json")
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
            raise ScenarioError(_format_validation(e, f"variant {v.name!r} deployment")) from None
        out.append(
            VariantConfig(
                name=v.name,
                deployment=deployment,
                kv_cache=v.kv_cache or scenario.kv_cache,
                policy=v.policy or scenario.policy,
                admission=v.admission or scenario.admission,
                params={},
                cluster=v.cluster or scenario.cluster,
            )
        )
    return out


def sweep_points(scenario: Scenario) -> list[dict[str, Any]]:
    """Every combination of the sweep's values ({} once without a sweep)."""
    if not scenario.sweep:
        return [{}]
    keys = list(scenario.sweep)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(scenario.sweep[k] for k in keys))]


def apply_point(raw: dict[str, Any], point: dict[str, Any], source: str) -> Scenario:
    """The scenario at one sweep point: each path set in the defaults and in every variant that overrides its
    section, wherever that section has the key (``policy.max_num_seqs`` changes continuous policies and leaves a
    static one alone). A key that no variant's section has is an error."""
    d = copy.deepcopy(raw)
    d.pop("sweep", None)
    variants = [v for v in d.get("variants") or [] if isinstance(v, dict)]
    for key, value in point.items():
        head, _, rest = key.partition(".")
        field = rest.split(".")[0]
        if not isinstance(d.get(head), dict) and head in _DEFAULT_SECTIONS:
            # the file relies on the default section: spell it out, so that e.g. policy.max_num_seqs keeps the
            # default policy's type instead of replacing the section with a type-less {max_num_seqs: ...}
            d[head] = _DEFAULT_SECTIONS[head]().model_dump(mode="json")
        default_has = not rest or _has_key(head, d.get(head), field)
        used = not variants  # without variants the defaults run
        try:
            if default_has:
                set_path(d, key, value)
            for v in variants:
                section = v.get(head)
                if rest and isinstance(section, dict):
                    if _has_key(head, section, field):
                        set_path(section, rest, value)
                        used = True
                else:
                    used = used or default_has
        except ScenarioError as e:
            raise ScenarioError(f"{source}: sweep: {e}") from None
        if not used:
            raise ScenarioError(f"{source}: sweep: {key}: no variant's {head} has the key {field!r}")
    return parse_scenario(d, source=f"{source} at {point}")


_DEFAULT_SECTIONS = {"deployment": Deployment, "kv_cache": PagedKV, "policy": ContinuousPolicyConfig,
                     "admission": AdmissionConfig}
_SECTION_KINDS: dict[str, dict[str, type[BaseModel]]] = {
    "kv_cache": {"paged": PagedKV, "contiguous": ContiguousKV},
    "policy": {"static": StaticPolicyConfig, "continuous": ContinuousPolicyConfig},
}


def _has_key(head: str, section: Any, field: str) -> bool:
    """Whether a section of the file (of kind ``head``) has ``field``; True when unsure, so that validation,
    not the sweep, reports a bad key."""
    kinds = _SECTION_KINDS.get(head)
    if kinds is None or not isinstance(section, dict) or section.get("type") not in kinds:
        return True
    return field in kinds[section["type"]].model_fields


@dataclass(frozen=True, slots=True)
class Built:
    """The plain objects one variant runs with."""

    model: ModelSpec
    gpu: GPUSpec
    budget: KVBudget
    limits: Limits
    max_model_len: int


def _model_spec(model: str | dict[str, Any]) -> ModelSpec:
    if isinstance(model, dict):
        return ModelSpec.from_hf_config(model)
    if model.endswith(".json") or "/" in model:
        return ModelSpec.from_hf_config(model)
    return ModelSpec.from_name(model)


def build(cfg: VariantConfig):
    """Resolve a variant into (policy, kv manager, cost model, Built). Raises ScenarioError naming the field."""
    dep = cfg.deployment
    where = f"variant {cfg.name!r}"
    try:
        model = _model_spec(dep.model)
    except FileNotFoundError as e:
        raise ScenarioError(f"{where}: deployment.model: file not found: {e.filename or e}") from None
    except KeyError as e:
        raise ScenarioError(f"{where}: deployment.model: lacks the field {e}") from None
    except (ValueError, TypeError, OSError) as e:
        raise ScenarioError(f"{where}: deployment.model: {e}") from None
    try:
        gpu = GPUSpec.from_dict(dep.gpu) if isinstance(dep.gpu, dict) else GPUSpec.from_name(dep.gpu)
    except (ValueError, TypeError, AttributeError) as e:
        raise ScenarioError(f"{where}: deployment.gpu: {e}") from None
    pol = cfg.policy
    max_model_len = dep.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        # vLLM refuses this too: positions past the trained context are not defined
        raise ScenarioError(
            f"{where}: deployment.max_model_len {max_model_len} is longer than {model.name}'s context of "
            f"{model.max_position_embeddings} tokens"
        )
    if isinstance(pol, ContinuousPolicyConfig):
        mnbt = pol.max_num_batched_tokens or (8192 if pol.enable_chunked_prefill else max(8192, max_model_len))
        limits = Limits(pol.max_num_seqs, mnbt, max_model_len)
    else:
        # a padded batch computes at most batch_size x max_model_len tokens in one step
        limits = Limits(max(256, pol.batch_size), pol.batch_size * max_model_len, max_model_len)
    try:
        budget = kv_budget(
            model,
            gpu,
            gpu_memory_utilization=dep.gpu_memory_utilization,
            weight_dtype=dep.weight_dtype,
            kv_dtype=dep.kv_dtype,
            block_size=dep.block_size,
            tensor_parallel_size=dep.tensor_parallel_size,
            num_gpu_blocks_override=dep.num_gpu_blocks,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_num_seqs=limits.max_num_seqs,
        )
    except ModelDoesNotFitError as e:
        hint = ""
        weights = model.shard(dep.tensor_parallel_size).weight_bytes(dep.weight_dtype)
        if limits.max_num_batched_tokens > 8192 and weights < gpu.memory_bytes * dep.gpu_memory_utilization:
            # vLLM sizes the activation reserve for the largest step, so a long max_model_len without chunking
            # costs memory too
            hint = (f" (the activation reserve is sized for max_num_batched_tokens "
                    f"{limits.max_num_batched_tokens}: a smaller deployment.max_model_len or "
                    f"policy.max_num_batched_tokens, or enable_chunked_prefill, lowers it)")
        raise ScenarioError(f"{where}: deployment: {e}{hint}") from None
    except ValueError as e:
        raise ScenarioError(f"{where}: deployment: {e}") from None
    if max_model_len > budget.capacity_tokens:
        # vLLM refuses to start in this case; say what would fit
        raise ScenarioError(
            f"{where}: deployment.max_model_len {max_model_len} is larger than the KV cache holds "
            f"({budget.capacity_tokens} tokens in {budget.num_gpu_blocks} blocks); set max_model_len <= "
            f"{budget.capacity_tokens}, raise gpu_memory_utilization, or use more GPUs or a smaller kv_dtype"
        )
    num_cpu_blocks = int(dep.swap_space * 2**30 // budget.kv_bytes_per_block) if budget.kv_bytes_per_block else 0
    admission = Admission(cfg.admission.max_queue_len, cfg.admission.max_queue_delay)
    try:
        if isinstance(pol, ContinuousPolicyConfig):
            policy = ContinuousPolicy(
                limits=limits,
                enable_chunked_prefill=pol.enable_chunked_prefill,
                prefill_mode=pol.prefill_mode,
                preemption_mode=pol.preemption_mode,
                admission=admission,
            )
        else:
            policy = StaticPolicy(
                batch_size=pol.batch_size,
                max_wait=pol.max_wait,
                limits=limits,
                preemption_mode=pol.preemption_mode,
                admission=admission,
            )
    except ValueError as e:
        raise ScenarioError(f"{where}: policy: {e}") from None
    kvc = cfg.kv_cache
    if isinstance(kvc, PagedKV):
        kv = PagedBlockManager(
            budget.num_gpu_blocks,
            dep.block_size,
            enable_prefix_caching=kvc.enable_prefix_caching,
            num_cpu_blocks=num_cpu_blocks,
        )
    else:
        kv = ContiguousAllocator(
            budget.num_gpu_blocks,
            dep.block_size,
            max_model_len=max_model_len,
            reserve=kvc.reserve,
            num_cpu_blocks=num_cpu_blocks,
        )
    cm = dep.cost_model
    try:
        if isinstance(cm, FittedCost):
            cost = FittedCostModel.from_profile(cm.profile)
        else:
            extra = {k: v for k, v in cm.model_dump().items() if k != "type" and v is not None}
            cost = AnalyticCostModel(
                model,
                gpu,
                weight_dtype=dep.weight_dtype,
                kv_dtype=dep.kv_dtype,
                tensor_parallel_size=dep.tensor_parallel_size,
                block_size=dep.block_size,
                **extra,
            )
    except FileNotFoundError as e:
        raise ScenarioError(f"{where}: deployment.cost_model.profile: file not found: {e.filename or e}") from None
    except KeyError as e:
        raise ScenarioError(f"{where}: deployment.cost_model.profile: lacks the field {e}") from None
    except (ValueError, TypeError, OSError) as e:
        field = "cost_model.profile" if isinstance(cm, FittedCost) else "cost_model"
        raise ScenarioError(f"{where}: deployment.{field}: {e}") from None
    return policy, kv, cost, Built(model, gpu, budget, limits, max_model_len)


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
