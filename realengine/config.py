"""The variant as the real engine runs it (``engine_config``) and the KV block count it gets on a CPU.

Below both ``realengine.engine`` (one replica or a cluster) and ``realengine.disagg`` (prefill and decode pools),
which each size their replicas with it: the engine dispatches to the pools, so the pools may not import the
engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from realengine.kv_cache import kv_bytes_per_block
from realengine.model import unbuildable
from sim.config.deployment import AnalyticCost, FittedCost, profile_model_problem
from sim.config.limits import kv_footprint
from sim.config.scenario import VariantConfig
from sim.config.schema import ScenarioError
from sim.costs.fitted import FittedCostModel
from sim.engines.sched import engine_kv_cache
from sim.hardware.models import ModelSpec, resolve_model
from sim.hardware.names import model_preset
from sim.loop.build import build
from sim.loop.results import seeded_global_rngs
from sim.serving.request import RequestSpec

CPU_KV_BYTES = 512 * 2**20  # CPU runs without num_gpu_blocks: KV cache of at most this many bytes (cpu_num_blocks)


def _with_deployment(cfg: VariantConfig, **update: Any) -> VariantConfig:
    return dataclasses.replace(cfg, deployment=cfg.deployment.model_copy(update=update))


def engine_config(cfg: VariantConfig, *, model_spec: str | None = None, num_gpu_blocks: int | None = None,
                  dtype: torch.dtype = torch.float32, device: str = "cpu") -> VariantConfig:
    """The variant as the engine runs it: the model replaced (``model_spec``, e.g. ``"tiny"``; max_model_len cut to
    its context), the KV block count given, or capped on CPU, and the swap space cut to what the engine can hold
    (on CPU at most as many blocks as the device cache: the CPU swap tensors are allocated up front)."""
    # what the simulator models but this engine does not run: refused rather than run as something else
    if cfg.deployment.pipeline_parallel_size > 1:
        raise ScenarioError(f"variant {cfg.name!r}: deployment.pipeline_parallel_size: the engine runs the model on "
                            "one device; pipeline stages are simulated only (servesim run)")
    if getattr(cfg.kv_cache, "host_cache", None) is not None:
        raise ScenarioError(f"variant {cfg.name!r}: kv_cache.host_cache: the engine keeps no host copy of evicted "
                            "prefix blocks; the host tier is simulated only (servesim run)")
    if model_spec is not None:
        try:  # the hint the scenario's deployment.model gets (a Hugging Face id's preset)
            spec = model_preset(model_spec, "the engine's --model takes a model preset; a config is the scenario's "
                                f"model: give --set deployment.model={model_spec}")
        except ValueError as e:
            raise ScenarioError(str(e)) from None
        mml = cfg.deployment.max_model_len
        cfg = _with_deployment(cfg, model=model_spec,
                               max_model_len=None if mml is None else min(mml, spec.max_position_embeddings))
        cfg = _without_other_models_profile(cfg, model_spec)
    if num_gpu_blocks is not None:
        if num_gpu_blocks < 1:
            raise ScenarioError(f"--num-gpu-blocks must be >= 1, got {num_gpu_blocks}")
        cfg = _with_deployment(cfg, num_gpu_blocks=num_gpu_blocks)
    if device != "cuda" and cfg.deployment.num_gpu_blocks is None:
        # weights past the host first: sizing the cache said "max_model_len 8192 is larger than the KV cache holds
        # (2048 tokens in 128 blocks); set ... num_gpu_blocks >= 512" for llama-3.1-8b without --model, sending the
        # user to run an 8B model on the CPU, where "give a smaller model (--model tiny)" was the answer
        model: ModelSpec | None
        try:
            model = resolve_model(cfg.deployment.model)
        except (KeyError, ValueError, TypeError, OSError):
            model = None  # build() below names the field
        if model is not None and (problem := cannot_run(model, dtype, device)) is not None:
            raise ScenarioError(f"variant {cfg.name!r}: deployment.model: {problem}")
        cfg = _with_deployment(cfg, num_gpu_blocks=cpu_num_blocks(cfg, dtype))
    with seeded_global_rngs(cfg.seed):  # the policy built here is not run: its draws are put back (run_engine)
        _, kv, _, built = build(cfg)
    problem = cannot_run(built.model, dtype, device)
    if problem is not None:  # refused here, with the scenario's checks, not as a traceback from the model's build
        raise ScenarioError(f"variant {cfg.name!r}: deployment.model: {problem}")
    cpu_blocks = getattr(kv, "num_cpu_blocks", 0)
    want = cpu_blocks if device == "cuda" else min(cpu_blocks, kv.num_blocks)
    if device == "cpu" and (problem := kv_too_large_for_host(built.model, dtype, kv.num_blocks + want,
                                                             cfg.deployment.block_size)) is not None:
        raise ScenarioError(f"variant {cfg.name!r}: deployment.num_gpu_blocks {kv.num_blocks:,}: {problem}")
    if want != cpu_blocks and built.budget.kv_bytes_per_block:
        # build() takes int(swap_space * 2**30 // kv_bytes_per_block) blocks: this float gives exactly ``want``
        cfg = _with_deployment(cfg, swap_space=want * built.budget.kv_bytes_per_block / 2**30)
    return cfg


def context_cut(cfg: VariantConfig, ecfg: VariantConfig, requests: Sequence[RequestSpec]) -> str | None:
    """What running ``cfg`` as ``ecfg`` (``engine_config``: ``--model`` replaced) cuts off its workload: the
    requests longer than the engine model's context, which the engine rejects and the simulator ran (those longer
    than the scenario's own max_model_len both reject); None when none is. The engine run once said only
    "rejected 2" in its table."""
    before = cfg.deployment.max_model_len or resolve_model(cfg.deployment.model).max_position_embeddings
    after = ecfg.deployment.max_model_len or resolve_model(ecfg.deployment.model).max_position_embeddings
    longer = sum(1 for r in requests if after < r.prompt_len + r.output_len <= before)
    if after >= before or not longer:
        return None
    return (f"--model {ecfg.deployment.model}: max_model_len {before:,} cut to its context of {after:,} tokens: "
            f"{longer:,} of {len(requests):,} requests need more and are rejected on the engine (`servesim run` "
            "runs them)")


def _without_other_models_profile(cfg: VariantConfig, model: str) -> VariantConfig:
    """The variant with the analytic cost model in place of a profile of another model than the engine now runs
    (--model tiny on a scenario priced by the llama-57m profile): the engine measures its steps, and that profile
    was refused as describing another model."""
    cost = cfg.deployment.cost_model
    if not isinstance(cost, FittedCost):
        return cfg
    try:
        measured = FittedCostModel.from_profile(cost.profile).model
    except (OSError, ValueError, KeyError, TypeError):  # build() names what is wrong with it
        return cfg
    return cfg if profile_model_problem(measured, model) is None else _with_deployment(cfg, cost_model=AnalyticCost())


def host_memory_available() -> int | None:
    """Bytes of memory the host can give without swapping (``MemAvailable`` of /proc/meminfo); None where it cannot
    be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cannot_run(spec: ModelSpec, dtype: torch.dtype, device: str) -> str | None:
    """Why the engine cannot run ``spec`` in ``dtype`` on ``device``, None if it can: a layer it does not build, or
    on the CPU weights past the host's memory. The engine run and the engine's calibration ask before building."""
    problem = unbuildable(spec)
    return too_large_for_host(spec, dtype) if problem is None and device == "cpu" else problem


def too_large_for_host(spec: ModelSpec, dtype: torch.dtype) -> str | None:
    """Why ``spec``'s weights in ``dtype`` cannot be built in host memory, None if they fit: they are allocated
    whole, and past what the host has the process is killed by the kernel (or swaps for minutes), saying nothing."""
    need, have = spec.num_params * torch.empty(0, dtype=dtype).element_size(), host_memory_available()
    if have is None or need <= have:
        return None
    return (f"{spec.name} needs {need / 2**30:.1f} GiB of {str(dtype).removeprefix('torch.')} weights, more than the "
            f"{have / 2**30:.1f} GiB this host has available; give a smaller model (--model tiny or llama-57m) or "
            "--device cuda")


def kv_too_large_for_host(spec: ModelSpec, dtype: torch.dtype, blocks: int, block_size: int) -> str | None:
    """Why ``blocks`` KV blocks (device cache and swap space, both allocated up front on a CPU) beside ``spec``'s
    weights cannot be allocated in host memory, None if they fit: ``--num-gpu-blocks 100000000`` on the tiny model
    asked torch for 190.7 GiB per layer's keys and ended in its allocator's traceback."""
    per_block = kv_bytes_per_block(spec, dtype, block_size)
    weights = spec.num_params * torch.empty(0, dtype=dtype).element_size()
    have = host_memory_available()
    if have is None or blocks * per_block + weights <= have:
        return None
    most = max(0, (have - weights) // per_block)
    return (f"{blocks:,} blocks of {block_size} tokens need {blocks * per_block / 2**30:.1f} GiB of "
            f"{str(dtype).removeprefix('torch.')} KV cache (swap space included), more than the {have / 2**30:.1f} "
            f"GiB this host has available beside the weights; it holds at most {most:,} blocks (device and swap "
            "together)")


def cpu_num_blocks(cfg: VariantConfig, dtype: torch.dtype) -> int:
    """The KV block count the engine gives a variant on CPU when the scenario names none. It is sized for the
    device the engine runs on, not the scenario's GPU preset (which gives the tiny model millions of blocks):
    at most ``CPU_KV_BYTES`` of cache (vLLM's CPU backend likewise takes a fixed ``VLLM_CPU_KVCACHE_SPACE``), and
    without prefix caching no more than the running requests can ever hold, ``max_num_seqs`` x the blocks of
    ``max_model_len``: every further block would be allocated up front (swap space included) and never used.
    With prefix caching the spare blocks keep freed prefixes, so the byte budget alone applies."""
    dep = cfg.deployment
    try:
        model = resolve_model(dep.model)
    except (KeyError, ValueError, TypeError, OSError):
        build(cfg)  # raises the ScenarioError that names the field
        raise
    budget = max(1, CPU_KV_BYTES // kv_bytes_per_block(model, dtype, dep.block_size))
    # sized with the byte budget, so that no GPU preset's memory enters; the limits and prefix caching as built
    _, _, _, built = build(_with_deployment(cfg, num_gpu_blocks=budget))
    kvc = engine_kv_cache(cfg.kv_cache, dep.engine)
    running = kv_footprint(budget, dep.block_size, built.max_model_len, built.limits.max_num_seqs,
                           prefix_caching=bool(getattr(kvc, "enable_prefix_caching", False))).touched_blocks
    return max(1, min(budget, running))
