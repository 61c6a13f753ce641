"""Scenario files: reading and validating them (``load_scenario``, ``parse_scenario``, ``--set`` overrides), and the
variants they describe (``variant_configs``, sweeps). The sections themselves are ``sim.config.schema``'s;
``sim.loop.build`` turns a variant into the objects that run it."""

from __future__ import annotations

import copy
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from sim.config.files import read_text_capped
from sim.config.scenario_messages import format_validation, short, yaml_error
from sim.config.schema import (
    PARTIAL_SECTIONS,
    AdmissionConfig,
    ClusterConfig,
    ContinuousPolicyConfig,
    Deployment,
    KVCacheConfigBase,
    PagedKV,
    PolicyConfigBase,
    Scenario,
    ScenarioError,
    Variant,
    field_type,
    has_path,
    models_of,
    narrow,
    unknown_key,
)
from sim.config.slos import SLOs, warn_slo_units
from sim.config.yaml_limits import MAX_SCENARIO_BYTES, safe_load_limited, unshared
from sim.engines.registry import (
    classic_policy,
    recorded_config,
)
from sim.engines.sched import engine_kv_cache
from sim.loop.disagg.config import DisaggConfig
from sim.plugins import load_plugins
from sim.workload.arrivals import TraceArrival
from sim.workload.generator import Workload
from sim.workload.lengths import EmpiricalLength
from sim.workload.sampling import Sampling
from sim.workload.traces import resolve_trace


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
    path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> tuple[Scenario, dict[str, Any]]:
    """Read and validate a scenario file. ``overrides`` maps dotted paths to values (the CLI's ``--set``).
    Returns the validated scenario and the raw dict it came from. Raises ScenarioError with one clear message."""
    if not os.fspath(path).strip():  # Path("") is the current folder: the error read ".: not a file"
        raise ScenarioError(f"scenario path is empty ({os.fspath(path)!r}); name a scenario YAML file")
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
            # a file named on the command line is relative to the working folder, as --out and --profile are (the
            # scenario's own, and its sweep's, are relative to the scenario)
            if key == "sweep" and isinstance(value, dict):  # --sweep policy.cls=a.py:A,b.py:B
                value = {k: [_cls_at(k, v, Path.cwd()) for v in vs] if isinstance(vs, list) else vs
                         for k, vs in value.items()}
            apply_override(raw, key, _cls_at(key, value, Path.cwd()))
        except ScenarioError as e:
            raise ScenarioError(f"{p}: --set {e}") from None
    _resolve_relative_paths(raw, p.parent)
    return parse_scenario(raw, source=str(p)), raw


def parse_scenario(raw: dict[str, Any], source: str = "scenario", *, warn_units: bool = True) -> Scenario:
    """Validate a scenario dict (schema, variants' deployments, trace files: else a ScenarioError naming the key
    path), then warn of SLOs that read as ms, unless ``warn_units=False`` (a sweep's point: warned once)."""
    load_plugins()  # a plugin's GPUs and engines are names the scenario may use
    if isinstance(raw, dict) and "policies" in raw and "workload" not in raw:
        # a tournament spec given to run (or sweep, check-policy, ...): five lines of missing and unknown keys
        raise ScenarioError(f"{source}: a tournament spec (scenario, policies, loads), not a scenario: run it with "
                            "servesim tournament")
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
    if warn_units:
        warn_slo_units(raw)  # a file's or the Python API's dict alike
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


def _cls_at(key: str, value: Any, base: Path) -> Any:
    """``value`` set at dotted ``key`` (a --set, a sweep value) with the file of a user's class it names
    (``...cls`` = "file.py:Class", or a policy, router or rule section holding one) made relative to ``base``."""
    last = str(key).rpartition(".")[2]
    holder = {"cls": value} if last == "cls" else value if last in ("policy", "router", "rule") else None
    if isinstance(holder, dict) and isinstance(holder.get("cls"), str):
        target, sep, name = holder["cls"].rpartition(":")
        if sep and target.endswith(".py") and not Path(target).is_absolute():
            holder = {**holder, "cls": f"{base / target}:{name}"}
            return holder["cls"] if last == "cls" else holder
    return value


def _resolve_relative_paths(raw: dict, base: Path) -> None:
    """Trace and profile paths in a scenario are relative to the scenario file when they exist there; a user's class
    file (``cls: "file.py:Class"``) always is."""

    def fix(d: Any, key: str) -> None:
        if isinstance(d, dict) and isinstance(d.get(key), str):
            v = d[key]
            if ("/" in v or v.endswith((".csv", ".jsonl", ".json"))) and not Path(v).is_absolute():
                cand = base / v
                if cand.exists():
                    d[key] = str(cand)

    def fix_cls(d: Any) -> None:  # cls: "file.py:Class" of a user's policy
        # always beside the file that names it, found or not: a file missing there was taken from the working
        # folder without a word (another my_policy.py, run in its place), and the error of one missing from both
        # named neither place it was looked for
        if isinstance(d, dict) and isinstance(d.get("cls"), str):
            target, sep, name = d["cls"].rpartition(":")
            if sep and target.endswith(".py") and not Path(target).is_absolute():
                d["cls"] = f"{base / target}:{name}"

    def fix_all(section: Any) -> None:  # a policy, a router and an admission rule may each name a user's class
        if isinstance(section, dict):
            fix_cls(section.get("policy"))
            for head, key in (("cluster", "router"), ("admission", "rule")):
                if isinstance(section.get(head), dict):
                    fix_cls(section[head].get(key))

    fix_all(raw)
    listed = raw.get("variants")
    for v in listed if isinstance(listed, list) else []:
        fix_all(v)
    sweep = raw.get("sweep")
    # a sweep over a user's class (policy.cls, variants.1.policy, cluster.router.cls, ...): each value is named by
    # the scenario too, and was looked for in the working folder (a file beside the scenario: "file not found")
    for key, values in sweep.items() if isinstance(sweep, dict) else ():
        if isinstance(values, list):
            values[:] = [_cls_at(key, v, base) for v in values]
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
    disaggregation: DisaggConfig | None = None  # prefill and decode pools (sim/loop/disagg); None: colocated
    sampling: Sampling | None = None  # its workload's sampling (the cost model prices a sort, sim/engines/sampling.py)
    # the scenario's TTFT SLO (slos.ttft), seconds: the deadline a policy, router or admission rule sees for a
    # request whose class has none, as the metrics hold such a request to it (RequestView.deadline)
    ttft_slo: float | None = None
    seed: int = 0  # the scenario's: Python's and numpy's global generators start from it (results.seeded_global_rngs)

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
                sampling=(workload or scenario.workload).sampling,
                ttft_slo=scenario.slos.ttft if scenario.slos is not None else None,
                seed=scenario.seed,
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
    return parse_scenario(d, source=f"{source} at {point}", warn_units=False)  # warned as the whole scenario


_VARIANT_SECTIONS = ("workload", "deployment", "kv_cache", "policy", "admission", "cluster")
_DEFAULT_SECTIONS = {"deployment": Deployment, "kv_cache": PagedKV, "policy": ContinuousPolicyConfig,
                     "admission": AdmissionConfig}


def _spelled_out(default: BaseModel) -> dict[str, Any]:
    """A default section as a file would write it: its ``type`` and the values its class does not default to.
    Not every key: ``--set kv_cache.type=contiguous`` would then carry the paged cache's keys into the new type."""
    return {**default.model_dump(mode="json", include={"type"}),
            **default.model_dump(mode="json", exclude_defaults=True)}


_OLDER_BOUNDS = {"low": "min", "high": "max"}  # uniform's older names (sim.workload.lengths.uniform_bounds)


def _node_at(node: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and re.fullmatch(r"-?[0-9]+", part) and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _current_bound_name(d: dict[str, Any], parts: list[str]) -> list[str]:
    """``parts`` with a uniform bound under its current name (``min``, ``max``), whichever name ``--set`` used;
    a uniform section of the file that spells that bound under the older name (``low``, ``high``) is renamed
    too, so the two spellings never meet (which the schema refuses)."""
    last = parts[-1]
    new = _OLDER_BOUNDS.get(last, last)
    if new not in _OLDER_BOUNDS.values():
        return parts
    if last != new and unknown_key(Scenario, parts[:-1] + [new], d) is not None:
        return parts  # not a uniform's bound: the caller words the unknown key
    old = next(k for k, v in _OLDER_BOUNDS.items() if v == new)
    for root in [d] + [v for v in d.get("variants") or [] if isinstance(v, dict)]:
        node = _node_at(root, parts[:-1])
        if isinstance(node, dict) and node.get("type") == "uniform" and old in node and new not in node:
            node[new] = node.pop(old)
    return parts[:-1] + [new]


def _fill_defaults(tp: Any, node: dict[str, Any], parts: list[str]) -> None:
    """Spell out the default of each missing section along ``parts`` (all but the last), so that setting one
    key keeps the default's type: deployment.cost_model.step_overhead needs cost_model's ``type: analytic``."""
    for part in parts[:-1]:
        models = narrow(models_of(tp), node)
        model = next((m for m in models if part in m.model_fields), None)
        if model is None:
            return
        field = model.model_fields[part]
        if not isinstance(node.get(part), dict):
            default = field.get_default(call_default_factory=True)
            if not isinstance(default, BaseModel):
                return
            node[part] = _spelled_out(default)
        node = node[part]
        tp = field.annotation


def _spell_out_names(tp: Any, node: Any, parts: list[str]) -> None:
    """A section given by its bare name along ``parts`` (``engine: vllm-v0``, read as ``{name: vllm-v0}``) spelled
    out as that mapping, so that setting one of its keys keeps the name: the key once replaced the section, and
    the run took the default engine without a word."""
    for part in parts[:-1]:
        model = next((m for m in narrow(models_of(tp), node) if part in m.model_fields), None)
        if model is None or not isinstance(node, dict):
            return
        tp = field_type(model, part)
        if isinstance(node.get(part), str) and any("name" in m.model_fields for m in models_of(tp)):
            node[part] = {"name": node[part]}
        node = node.get(part)


def apply_override(d: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key as ``--set`` and sweeps do. A key of a section that variants may override
    (workload, deployment, kv_cache, policy, admission, cluster) is set in the defaults and in every variant whose
    own section has the key (``policy.max_num_seqs`` changes continuous policies and leaves a static one alone; a
    variant's partial workload or deployment gets it only where it sets that key itself, the rest inherit the
    default).
    A missing default section is spelled out first, keeping its type (and taking the new type's defaults when
    the key is its ``type``). A uniform's bound is set under either name, ``min``/``max`` or the older
    ``low``/``high``. A key that exists nowhere in the schema, or that no variant's section has, is an error
    naming the closest key."""
    parts = key.split(".")
    if any(not k for k in parts):
        raise ScenarioError(f"{key!r}: empty part in a dotted key")
    parts = _current_bound_name(d, parts)
    key = ".".join(parts)
    if parts[0] == "variants" and len(parts) > 3 and re.fullmatch(r"-?[0-9]+", parts[1]):
        variant = _node_at(d, parts[:2])
        if isinstance(variant, dict):
            _spell_out_inherited(d, variant, parts[2:])
    if parts[0] in _VARIANT_ONLY:
        _set_in_variants(d, parts, value)
        return
    problem = unknown_key(Scenario, parts, d)
    if problem is not None:
        raise ScenarioError(problem)
    head, rest = parts[0], parts[1:]
    if head not in _VARIANT_SECTIONS or not rest:
        set_path(d, key, value)
        _retype_at(d, parts)
        return
    tp = field_type(Scenario, head)
    variants = [v for v in d.get("variants") or [] if isinstance(v, dict)]
    if not isinstance(d.get(head), dict):
        default = _DEFAULT_SECTIONS.get(head)
        d[head] = _spelled_out(default()) if default is not None else {}
    _spell_out_names(tp, d[head], rest)
    givers = _args_givers([d[head], *(v.get(head) for v in variants)], rest)
    default_has = has_path(tp, d[head], rest) and (givers is None or id(d[head]) in givers)
    if default_has:
        _fill_defaults(tp, d[head], rest)
        set_path(d[head], ".".join(rest), value)
        _retype_at(d, parts)
    used = default_has
    if variants:
        used = False
        for v in variants:
            section = v.get(head)
            if not isinstance(section, dict):
                used = used or default_has  # the variant runs the default section
                continue
            if head in PARTIAL_SECTIONS and rest[0] not in section:
                used = used or default_has  # merged: the default's value reaches it
                continue
            _spell_out_names(PARTIAL_SECTIONS.get(head, tp), section, rest)
            if has_path(PARTIAL_SECTIONS.get(head, tp), section, rest) and (givers is None or id(section) in givers):
                set_path(section, ".".join(rest), value)
                _retype_at(v, parts)
                used = True
    if not used:
        raise ScenarioError(f"{key}: no variant's {head} has the key {rest[-1]!r}")


def _args_givers(sections: list[Any], rest: list[str]) -> set[int] | None:
    """For a key under a class's ``args`` (``policy.args.age_s``: a free mapping whose keys the constructor names),
    the ids of the sections whose args give that key already: when any does, only they take it (a sweep over one
    custom policy's argument reached every custom variant, and the other classes refused it); None for any other
    key, or when no section gives it (then every custom section takes it, as any key)."""
    if "args" not in rest[:-1]:
        return None
    given = {id(s) for s in sections
             if isinstance(parent := _node_at(s, rest[:-1]), dict) and rest[-1] in parent}
    return given or None


# sections a variant may have and the defaults may not (the file refuses a default disaggregation): --set reaches
# the variants that have one, as it reaches those whose policy has a key
_VARIANT_ONLY = tuple(k for k in Variant.model_fields if k not in Scenario.model_fields)


def _inherited(d: dict[str, Any], variant: dict[str, Any], head: str) -> dict[str, Any] | None:
    """A copy of the section a variant without its own ``head`` runs: the scenario's, or the schema's default."""
    if isinstance(variant.get(head), dict):
        return copy.deepcopy(variant[head])
    if isinstance(d.get(head), dict):
        return copy.deepcopy(d[head])
    default = _DEFAULT_SECTIONS.get(head)
    return None if default is None else _spelled_out(default())


def _spell_out_inherited(d: dict[str, Any], variant: dict[str, Any], rest: list[str]) -> None:
    """Before one key of a section a variant inherits is set (``variants.0.policy.max_num_seqs``, a pool's
    ``disaggregation.decode.policy.max_num_seqs``), the inherited section spelled out in the variant (or pool),
    so that the key changes it: the key alone made a section of its own, refused as "policy.type: required key
    is missing". A merged section (deployment, workload) takes the key as it is."""
    head = rest[0]
    if head in _VARIANT_SECTIONS and head not in PARTIAL_SECTIONS and len(rest) > 1 and head not in variant:
        section = _inherited(d, variant, head)
        if section is not None:
            variant[head] = section
    disagg = variant.get("disaggregation")
    if head == "disaggregation" and len(rest) > 3 and rest[2] == "policy" and isinstance(disagg, dict):
        if rest[1] in ("prefill", "decode") and disagg.get(rest[1]) is None:  # xpyd: 2P1D sized it, nothing else
            disagg[rest[1]] = {}
        pool = disagg.get(rest[1])
        if isinstance(pool, dict) and pool.get("policy") is None:
            pool["policy"] = _inherited(d, variant, "policy")


def _set_in_variants(d: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set ``parts`` (under a section only variants have) in every variant whose section has it."""
    key, head, rest = ".".join(parts), parts[0], parts[1:]
    if not rest:
        raise ScenarioError(f"{key}: a section of each variant; set one of its keys (e.g. {head}.kv_link.kind)")
    sections = [v[head] for v in d.get("variants") or [] if isinstance(v, dict) and isinstance(v.get(head), dict)]
    problem = unknown_key(Variant, parts, None)
    if problem is not None:
        raise ScenarioError(problem)
    if not sections:
        raise ScenarioError(f"{key}: no variant has a {head} section")
    tp = field_type(Variant, head)
    for v in d.get("variants") or []:
        if isinstance(v, dict) and isinstance(v.get(head), dict):
            _spell_out_inherited(d, v, parts)
    used = False
    for section in sections:
        if has_path(tp, section, rest):
            _fill_defaults(tp, section, rest)
            set_path(section, ".".join(rest), value)
            _retype_at(section, rest)
            used = True
    if not used:
        raise ScenarioError(f"{key}: no variant's {head} has the key {rest[-1]!r}")


def _retype(tp: Any, section: dict[str, Any]) -> None:
    """A section whose ``type`` was just changed keeps only the keys its new kind has: a custom policy's ``cls`` and
    ``args`` mean nothing to ``fcfs``, and the limits both kinds share are kept; a bare name (a router's
    ``round_robin``) keeps its type alone."""
    kind = next((m for m in models_of(tp) if "type" in m.model_fields
                 and section.get("type") in get_args(m.model_fields["type"].annotation)), None)
    for key in [k for k in section if k not in (kind.model_fields if kind is not None else ("type",))]:
        del section[key]


def _retype_at(root: dict[str, Any], parts: list[str]) -> None:
    """After ``--set`` of a ``type`` at ``parts`` under ``root`` (``policy.type``, ``variants.0.policy.type``,
    ``disaggregation.decode.policy.type``, ``cluster.router.type``, ``admission.rule.type``), ``_retype`` of the
    section it types: a type deeper than a section's own (a custom router set to round_robin) kept the old kind's
    keys, refused under the new kind."""
    heads = [i for i, p in enumerate(parts[:-1]) if p in _VARIANT_SECTIONS]
    if parts[-1] != "type" or not heads:
        return
    tp, node = field_type(Scenario, parts[heads[0]]), _node_at(root, parts[:heads[0] + 1])
    for part in parts[heads[0] + 1:-1]:
        model = next((m for m in narrow(models_of(tp), node) if part in m.model_fields), None)
        if model is None or not isinstance(node, dict):
            return
        tp, node = model.model_fields[part].annotation, node.get(part)
    if isinstance(node, dict) and (heads[0] < len(parts) - 2 or parts[heads[0]] not in PARTIAL_SECTIONS):
        _retype(tp, node)


def slos_of(scenario: Scenario) -> SLOs | None:
    s = scenario.slos
    return None if s is None else SLOs(ttft=s.ttft, tpot=s.tpot, e2el=s.e2el)


def is_trace(scenario: Scenario) -> bool:
    return isinstance(scenario.workload.arrival, TraceArrival)
