"""Resolving one variant of a scenario into the plain objects that run it: the policy, the KV manager and the
cost model, with the model, GPU, step limits and KV size they were built for (``Built``).

``sim.config.scenario`` validates what a scenario says; this module decides what it means on a GPU: the longest request
(``resolve_max_model_len``), the KV cache one GPU gets under the deployment's engine (``size_kv_cache``), and the
objects themselves (``build``). Every refusal is a ``ScenarioError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sim.config.host_kv_config import attach_host_tier
from sim.config.limits import check_kv_footprint, kv_footprint
from sim.config.scenario import VariantConfig
from sim.config.schema import (
    CostModelConfigBase,
    Deployment,
    KVCacheConfigBase,
    PolicyConfigBase,
    ScenarioError,
    StaticPolicyConfig,
)
from sim.costs.costmodel import CostModel
from sim.engines.costs import static_reserve_tokens
from sim.engines.registry import budget_kwargs, engine_kv_budget, max_prompt_len, resolve_policy
from sim.engines.sampling import with_sampling
from sim.engines.sched import configure_kv, configure_policy, engine_kv_cache
from sim.hardware.gpu import GPUSpec, resolve_gpu
from sim.hardware.kv_budget import KVBudget, ModelDoesNotFitError
from sim.hardware.models import ModelSpec, resolve_model
from sim.hardware.names import preset_hint
from sim.hardware.window import window_refusal
from sim.policies import Limits, Policy
from sim.serving import spec_decode
from sim.serving.kv_manager import KVManager
from sim.serving.pipeline import stage_model, wrap_pipeline


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
    window = window_refusal(model, max_model_len)  # Gemma-2's local layers (sim/hardware/window.py)
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
    kw = budget_kwargs(dep, limits.max_num_batched_tokens, limits.max_num_seqs)

    def blocks(stage: ModelSpec) -> int:  # a stage that does not fit binds (and says so below)
        try:
            return engine_kv_budget(dep.engine, stage, gpu, **kw).num_gpu_blocks
        except (ModelDoesNotFitError, ValueError):
            return -1

    try:
        model = stage_model(model, dep.pipeline_parallel_size, blocks)  # the stage that holds the fewest blocks
    except ValueError as e:
        raise ScenarioError(f"deployment: {e}") from None
    try:
        budget = engine_kv_budget(dep.engine, model, gpu, **kw)
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
        # vLLM refuses to start in this case; say what would fit (a count given by hand overrides memory's)
        grow = (f" or deployment.num_gpu_blocks >= {-(-max_model_len // dep.block_size)}" if dep.num_gpu_blocks
                else ", raise gpu_memory_utilization, or use more GPUs or a smaller kv_dtype")
        raise ScenarioError(
            f"deployment.max_model_len {max_model_len} is larger than the KV cache holds "
            f"({budget.capacity_tokens} tokens in {budget.num_gpu_blocks} blocks); set max_model_len <= "
            f"{budget.capacity_tokens}{grow}"
        )
    return budget


def _section(value: Any, base: type, field: str, where: str) -> Any:
    """``value`` when it is a config of the kind ``base`` (it then knows how to build its object); a clear error
    for anything else, instead of an AttributeError deep inside ``build``."""
    if not isinstance(value, base):
        raise ScenarioError(f"{where}: {field}: {type(value).__name__} is not a {base.__name__} (every {field} "
                            f"config subclasses sim.config.schema.{base.__name__} and defines how it builds)")
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
        raise ScenarioError(f"{where}: deployment.model: file not found: {e.filename or e}"
                            f"{preset_hint(dep.model, 'model')}") from None
    except KeyError as e:
        raise ScenarioError(f"{where}: deployment.model: lacks the field {e}") from None
    except (ValueError, TypeError, OSError) as e:
        raise ScenarioError(f"{where}: deployment.model: {e}{preset_hint(dep.model, 'model', str(e))}") from None
    try:
        gpu = resolve_gpu(dep.gpu)
    except (ValueError, TypeError, AttributeError) as e:
        raise ScenarioError(f"{where}: deployment.gpu: {e}{preset_hint(dep.gpu, 'gpu', str(e))}") from None
    try:
        max_model_len = resolve_max_model_len(dep, model)
        pol = resolve_policy(pol, dep, model, gpu, max_model_len)  # the engine's defaults where policy has none
        try:  # TGI bounds a prompt apart from prompt + output (its --max-input-tokens)
            limits = replace(pol.limits(max_model_len), max_prompt_len=max_prompt_len(dep.engine, max_model_len))
        except ValueError as e:
            raise ScenarioError(f"deployment.engine: {e}") from None
        static = isinstance(pol, StaticPolicyConfig)
        sized = replace(limits, max_num_batched_tokens=static_reserve_tokens(  # sim/engines/costs.py
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
    kvc = engine_kv_cache(kvc, dep.engine)  # vLLM v1 caches prefixes by default (sim/engines/sched.py)
    prefix = bool(getattr(kvc, "enable_prefix_caching", False))
    fp = kv_footprint(budget.num_gpu_blocks, dep.block_size, max_model_len, limits.max_num_seqs,
                      prefix_caching=prefix, replicas=replicas)
    too_big = check_kv_footprint(fp, num_blocks=budget.num_gpu_blocks, block_size=dep.block_size,
                                 prefix_caching=prefix)
    if too_big is not None:  # refuse before the run grows into it
        raise ScenarioError(f"{where}: deployment: {too_big}")
    num_cpu_blocks = int(dep.swap_space * 2**30 // budget.kv_bytes_per_block) if budget.kv_bytes_per_block else 0
    try:
        policy = configure_policy(with_ttft_slo(pol.build(limits, cfg.admission.build()), cfg.ttft_slo), dep.engine)
    except ValueError as e:
        raise ScenarioError(f"{where}: policy: {e}") from None
    # a built-in's preemption_mode, or a user's QueuePolicy's (its constructor's): swap with no CPU block to swap to
    # preempted by recompute every time, silently, where vLLM aborts for lack of CPU swap space
    mode = getattr(pol, "preemption_mode", None) or getattr(getattr(policy, "user", None), "preemption_mode", None)
    if mode == "swap" and num_cpu_blocks == 0:
        raise ScenarioError(f"{where}: policy preemption_mode swap, but deployment.swap_space {dep.swap_space:g} GiB "
                            "holds no KV block: every preemption would recompute; give swap_space > 0 (vLLM's default "
                            "is 4 GiB) or preemption_mode recompute")
    kv = kvc.build(budget.num_gpu_blocks, dep.block_size, max_model_len=max_model_len, num_cpu_blocks=num_cpu_blocks)
    kv = configure_kv(kv, dep.engine)
    try:
        attach_host_tier(kv, getattr(kvc, "host_cache", None), budget, gpu)
    except ValueError as e:
        raise ScenarioError(f"{where}: kv_cache: {e}") from None
    try:
        cost = with_sampling(cm.build(model, gpu, dep), dep.engine, cfg.sampling)  # sim/engines/sampling.py
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


def with_ttft_slo(policy: Any, ttft_slo: float | None) -> Any:
    """``policy`` whose request views (its own, and its admission rule's) give a request without a class TTFT SLO
    the scenario's as its deadline: a scenario's ``slos: {ttft: 1.0}`` reached the metrics but no policy, so edf
    with reject_late ran as first come first served (RequestView.deadline inf for every request)."""
    from sim.policies.gates import UserAdmission
    from sim.policies.user import UserPolicy

    if ttft_slo is not None:
        if isinstance(policy, UserPolicy):
            policy.ttft_slo = ttft_slo
        rule = getattr(getattr(policy, "admission", None), "rule", None)
        if isinstance(rule, UserAdmission):
            rule.ttft_slo = ttft_slo
    return policy


def user_policy(cfg: VariantConfig) -> Any:
    """The variant's policy when it is a user's class (``type: custom``) on one replica, else None: what the run
    commands tell about (``capabilities()``), and whose describe() they check before any run."""
    from sim.policies.user import UserPolicy

    if getattr(cfg.policy, "type", None) != "custom" or cfg.cluster is not None or cfg.disaggregation is not None:
        return None
    policy = build(cfg)[0]
    return policy if isinstance(policy, UserPolicy) else None


def uncached_note(cfg: VariantConfig) -> str | None:
    """A note when the variant's policy orders by prefix-cache hits (``lpm``, or a user's class that reads
    ``num_cached_tokens``) while its KV cache keeps no prefixes: every request then shows 0 cached tokens, and lpm
    served first come first served without a word (as SGLang turns lpm into fcfs when its radix cache is off)."""
    from sim.policies.user import reads

    if getattr(engine_kv_cache(cfg.kv_cache, cfg.deployment.engine), "enable_prefix_caching", False):
        return None
    if getattr(cfg.policy, "type", None) == "lpm":
        who, then = "lpm orders by prefix-cache hits", ", so it serves first come first served"
    elif (policy := user_policy(cfg)) is not None and reads(type(policy.user), "num_cached_tokens"):
        who, then = f"policy {policy.name} reads num_cached_tokens", ""
    else:
        return None
    return (f"{who}, but the KV cache keeps no prefixes: every request shows 0 cached tokens{then} (kv_cache: "
            "{type: paged, enable_prefix_caching: true} keeps them)")
