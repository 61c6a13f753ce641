"""The real engine: a scenario's workload served by a real model, driven by the simulator's own serving loop.

The serving core, its policy and its KV block manager are the very objects the simulator builds
(``sim.loop.build.build``), and so is the loop: ``sim.loop.simulator.Simulation`` with one replica whose executor is
``realengine.executor.EngineExecutor`` (the batch runs on the model; the step lasts what it measurably took)
instead of a cost model. Arrivals, closed-loop users, cancellations, per-request errors and out-of-memory steps
are therefore handled by the same code in both, and the parity check (the simulator fed the engine's measured
step durations makes the same plans, preemptions and clock) holds by construction: every scheduling decision
depends only on what arrived at or before the step's start, and the clock is ``start + duration`` step by step.

Two clocks (``run_engine(clock=...)``): ``"virtual"`` (a ``simpy.Environment`` advanced by measured durations:
on CPU the serving thread's CPU time, on CUDA synchronised wall time; idle gaps are skipped) and ``"wall"``
(``simpy.rt.RealtimeEnvironment``: the workload replayed in real time, for live runs). See
``realengine.executor``.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simpy
import simpy.rt
import torch

from realengine.attention import build_metadata
from realengine.clock import CPU_CLOCKS, cpu_step_timer
from realengine.config import engine_config
from realengine.executor import EngineExecutor
from realengine.kv_cache import kv_bytes_per_block, profile_num_blocks
from realengine.model import LlamaModel, torch_dtype
from realengine.rapl import RaplCounter
from realengine.runner import ModelRunner
from realengine.spec_decode import SpecDecodeRunner
from sim.config.scenario import VariantConfig
from sim.config.schema import PagedKV
from sim.loop.build import build
from sim.loop.cluster import ClusterSimulation, cluster_result
from sim.loop.results import result_of, seeded_global_rngs
from sim.loop.run import autoscaler_of, policy_errors
from sim.loop.simulator import ClosedLoopPlan, Simulation
from sim.metrics.records import RunResult
from sim.metrics.summary import summarize
from sim.serving.core import ENGINE_LOOK_EVERY, ServingCore
from sim.serving.failures import FailurePlan
from sim.serving.request import Request
from sim.serving.spec_decode import summary_inputs
from sim.workload.arrivals import time_scale_problem

MEMORY_COLUMNS = ("variant", "step", "time", "rss_bytes", "max_rss_bytes", "cuda_allocated_bytes",
                  "cuda_max_allocated_bytes", "nvml_used_bytes", "nvml_gpu_util", "nvml_power_w", "nvml_energy_j",
                  "rapl_energy_j")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _max_rss_bytes()


def _max_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class MemorySampler:
    """Memory (and on CUDA utilisation) sampled by a background thread every ``interval_s`` seconds of the run.

    CPU: the process's resident and peak memory, and where RAPL's powercap files are readable the CPU packages'
    energy counter (``realengine.rapl``, joules since the first reading). CUDA: also torch's allocator statistics
    and, where pynvml can reach the driver, NVML's device memory used and GPU utilisation (NVML's own sampling
    window is about 1/6 s to 1 s, so utilisation is only meaningful over runs longer than that), its power draw and
    its energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded, Volta and later; written as
    joules since the sampler's first reading): the run's measured energy (``measured_energy``). A thread, not a per-step
    call, so that a long step (a big prefill) is sampled while it runs, and the step loop pays nothing but a
    shared integer (``step``, the number of steps done, which labels each row).
    """

    def __init__(self, variant: str, device: torch.device, interval_s: float = 0.05) -> None:
        if not interval_s > 0:
            raise ValueError(f"the memory sampling interval must be > 0 seconds, got {interval_s}")
        self.variant = variant
        self.device = device
        self.interval_s = interval_s
        self.rows: list[dict[str, Any]] = []
        self.step = 0
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._energy0_mj: int | None = None  # the energy counter's first reading
        self._rapl = RaplCounter() if device.type != "cuda" else None
        if device.type == "cuda":
            try:  # optional
                import pynvml

                pynvml.nvmlInit()
                index = device.index if device.index is not None else torch.cuda.current_device()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
            except Exception:  # noqa: BLE001 - no pynvml, no driver access: torch's statistics only
                self._nvml = None

    def start(self, t0: float) -> None:
        """Sample now and then every interval, times counted from ``t0`` (a ``perf_counter`` reading)."""
        self._t0 = t0
        self.sample()
        self._thread = threading.Thread(target=self._run, name=f"memory-sampler-{self.variant}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and take a last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        row: dict[str, Any] = {"variant": self.variant, "step": self.step, "time": time.perf_counter() - self._t0,
                               "rss_bytes": _rss_bytes(), "max_rss_bytes": _max_rss_bytes(),
                               "cuda_allocated_bytes": "", "cuda_max_allocated_bytes": "", "nvml_used_bytes": "",
                               "nvml_gpu_util": "", "nvml_power_w": "", "nvml_energy_j": "", "rapl_energy_j": ""}
        if self._rapl is not None and (joules := self._rapl.read()) is not None:
            row["rapl_energy_j"] = joules
        if self.device.type == "cuda":
            row["cuda_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            row["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            if self._nvml is not None:
                nv, handle = self._nvml
                row["nvml_used_bytes"] = nv.nvmlDeviceGetMemoryInfo(handle).used
                row["nvml_gpu_util"] = nv.nvmlDeviceGetUtilizationRates(handle).gpu
                try:  # a GPU before Volta, or a driver that refuses: no power figures
                    row["nvml_power_w"] = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
                    mj = nv.nvmlDeviceGetTotalEnergyConsumption(handle)
                    if self._energy0_mj is None:
                        self._energy0_mj = mj
                    row["nvml_energy_j"] = (mj - self._energy0_mj) / 1000.0
                except Exception:  # noqa: BLE001 - pynvml.NVMLError_NotSupported and the like
                    pass
        self.rows.append(row)  # list.append is atomic under the GIL: the loop thread only reads after stop()


def _default_dtype(cfg: VariantConfig, device: str) -> torch.dtype:
    if device != "cuda":
        return torch.float32
    wd = cfg.deployment.weight_dtype
    return torch_dtype(wd) if wd in ("fp32", "bf16", "fp16") else torch.bfloat16


def run_engine(
    cfg: VariantConfig,
    workload,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    model_spec: str | None = None,
    num_gpu_blocks: int | None = None,
    time_scale: float = 1.0,
    max_wall_s: float | None = None,
    name: str | None = None,
    seed: int = 0,
    record_plans: bool = False,
    memory_interval_s: float = 0.05,
    memory_samples: list | None = None,
    kv_layout: str = "paged",
    failures: FailurePlan | None = None,
    decode_kernel: str = "auto",
    on_runner: Callable[[ModelRunner], None] | None = None,
    real_model=None,
    texts: list | None = None,
    weight_quant: str | None = None,
    clock: str = "virtual",
    progress: Callable[[int, float], None] | None = None,
    cpu_clock: str = "thread",
    reference_seconds: float | None = None,
) -> tuple[RunResult, list[Request], ServingCore]:
    """Run one variant on the real model, replaying ``workload`` (a ``GeneratedWorkload`` or a list of
    ``RequestSpec``) on the run's ``clock`` (below; virtual by default, not the wall's); arrival ``a`` comes at
    ``a * time_scale`` seconds of that clock after the start.

    Returns ``(result, requests, core)`` like ``sim.loop.run.simulate_variant``; every time in them is seconds of
    that clock since the start. ``memory_samples``: a list the memory samples (dicts of ``MEMORY_COLUMNS``) are
    appended to. ``max_wall_s``: requests still in flight then end ``failed`` and unsent ones are dropped.
    ``failures``: cancellations, request errors and out-of-memory steps to inject (``sim.serving.failures``); default:
    the workload's own (a scenario's ``workload.failures``), taken between steps as the simulator takes them.
    ``decode_kernel``: on CUDA, ``"triton"`` (the paged decode kernel), ``"ref"`` (gather + SDPA) or ``"auto"``
    (Triton where it imports). ``on_runner``: called with the ``ModelRunner`` once built (tests inspect its cache).
    ``real_model``: a ``realengine.gguf_model.RealModel`` (real weights and a tokenizer) to run instead of random
    weights; its spec must be the run's model, and prompts are then real text (``text.text_prompt_ids``, exactly
    the workload's prompt lengths). ``texts``: a list that gets one dict per finished request with its prompt and
    output text (real models only; see ``write_engine_run``). ``weight_quant``: run the decoder's linear layers
    quantized (``int8``, ``int4`` or ``fp8``, ``realengine.quant``); the KV cache is sized after quantizing, as
    vLLM sizes it after loading the quantized weights.

    ``clock``: ``"virtual"`` (default) or ``"wall"``. Wall: the engine replays the arrivals against the wall
    clock, sleeping through idle gaps, and a step lasts the wall time it took. Virtual: time advances only by the
    measured step durations and jumps over idle gaps (to the next arrival, wake or cancellation time); a step's
    duration is, on CPU, the serving thread's CPU time (``time.thread_time``), so that other processes on a
    shared machine cannot lengthen it (torch then runs with one intra-op thread, restored afterwards), and on CUDA
    the synchronised ``perf_counter`` time. ``max_wall_s`` is wall-clock seconds in both. ``cpu_clock``: the
    virtual clock's step timer on CPU (``realengine.clock``): ``"thread"`` (the thread's CPU time) or
    ``"reference"`` (the same at a reference speed, ``reference_seconds`` being the reference's time at that speed,
    e.g. a profile's ``provenance.reference_seconds``; None: this machine at the run's start).
    ``progress(n, t)``: n more requests finished, the last at engine time t.

    A policy that raises, plans past a rule or leaves work waiting forever raises ``PolicyError`` (a
    ``ScenarioError``) naming the variant, as ``sim.loop.run.simulate_variant`` does.
    """
    if clock not in ("virtual", "wall"):
        raise ValueError(f"clock must be 'virtual' or 'wall', got {clock!r}")
    if cpu_clock not in CPU_CLOCKS:
        raise ValueError(f"cpu_clock must be one of {', '.join(CPU_CLOCKS)}, got {cpu_clock!r}")
    if cpu_clock != "thread" and cfg.disaggregation is not None:
        raise ValueError("a disaggregated run on the engine times its steps by the thread clock only")
    threads = torch.get_num_threads()
    if clock == "virtual" and device != "cuda":
        torch.set_num_threads(1)  # the thread's CPU time is then the forward pass's whole cost
    try:
        # the same policy in the same loop as the simulator's: a user's policy fails here as it fails there, and
        # draws from Python's and numpy's global generators what it draws there (validate's replay asks it again)
        with policy_errors(cfg, name, loop="engine run"), seeded_global_rngs(cfg.seed):
            if cfg.disaggregation is not None:  # prefill and decode pools of engine replicas (realengine/disagg.py)
                from realengine.disagg import serve_disaggregated

                return serve_disaggregated(cfg, workload, device=device, dtype=dtype, model_spec=model_spec,
                                           num_gpu_blocks=num_gpu_blocks, seed=seed, name=name, clock=clock,
                                           failures=failures, kv_layout=kv_layout, real_model=real_model,
                                           weight_quant=weight_quant)
            return _run_engine(cfg, workload, device=device, dtype=dtype, model_spec=model_spec,
                               num_gpu_blocks=num_gpu_blocks, time_scale=time_scale, max_wall_s=max_wall_s,
                               name=name, seed=seed, record_plans=record_plans, memory_interval_s=memory_interval_s,
                               memory_samples=memory_samples, kv_layout=kv_layout, failures=failures,
                               decode_kernel=decode_kernel, on_runner=on_runner, real_model=real_model, texts=texts,
                               weight_quant=weight_quant, virtual=clock == "virtual", progress=progress,
                               cpu_clock=cpu_clock, reference_seconds=reference_seconds)
    finally:
        torch.set_num_threads(threads)


def sized_config(cfg: VariantConfig, model: LlamaModel, built, tdtype: torch.dtype, device: str) -> VariantConfig:
    """On CUDA without a block count, the variant with its KV cache sized as vLLM sizes it (a profiling forward
    pass, then what ``gpu_memory_utilization`` leaves); otherwise as it is."""
    if device != "cuda" or cfg.deployment.num_gpu_blocks is not None:
        return cfg
    blocks = profile_num_blocks(model, block_size=cfg.deployment.block_size,
                                max_num_batched_tokens=built.limits.max_num_batched_tokens,
                                max_num_seqs=built.limits.max_num_seqs,
                                gpu_memory_utilization=cfg.deployment.gpu_memory_utilization)
    return engine_config(cfg, num_gpu_blocks=blocks, dtype=tdtype, device=device)


def _run_engine(cfg: VariantConfig, workload, *, device, dtype, model_spec, num_gpu_blocks, time_scale,
                max_wall_s, name, seed, record_plans, memory_interval_s, memory_samples, kv_layout, failures,
                decode_kernel, on_runner, real_model, texts, weight_quant, virtual: bool, progress=None,
                cpu_clock: str = "thread", reference_seconds: float | None = None,
                ) -> tuple[RunResult, list[Request], ServingCore]:
    requests_in = getattr(workload, "requests", workload)
    why = time_scale_problem(time_scale, "time_scale", max((s.arrival for s in requests_in), default=0.0))
    if why is not None:
        raise ValueError(why)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if decode_kernel not in ("auto", "triton", "ref"):
        raise ValueError(f"decode_kernel must be 'auto', 'triton' or 'ref', got {decode_kernel!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device")
    if failures is None:  # the scenario's timed failures (workload.failures), if any
        failures = getattr(workload, "failures", None) or FailurePlan()
    leak = cfg.deployment.leak_kv_on_failure
    if device == "cuda":
        _select_decode_kernel(decode_kernel)
    tdtype = torch_dtype(dtype) if dtype is not None else _default_dtype(cfg, device)
    cfg = engine_config(cfg, model_spec=model_spec, num_gpu_blocks=num_gpu_blocks, dtype=tdtype, device=device)
    # the builds before make_replica's size the model and cache: their policies' draws from the global generators
    # are put back, so the policy that runs makes its first draw at the seed, as in the simulator's run
    with seeded_global_rngs(cfg.seed):
        _, _, _, built = build(cfg)
    if real_model is not None:
        model = real_model.model
        if model.spec != built.model or model.dtype != tdtype or model.device.type != device:
            raise ValueError(f"the real model is {model.spec.name} ({model.dtype}, {model.device.type}); the run "
                             f"needs {built.model.name} ({tdtype}, {device})")
    else:
        model = LlamaModel(built.model, dtype=tdtype, device=device, seed=seed)
    if weight_quant is not None:
        from realengine.quant import quantize_model

        model = quantize_model(model, weight_quant)
    cfg = sized_config(cfg, model, built, tdtype, device)
    with seeded_global_rngs(cfg.seed):
        _, kv0, _, built = build(cfg)
    if kv_layout == "paged" and not isinstance(cfg.kv_cache, PagedKV):
        kv_layout = "contiguous"  # the contiguous allocator has no block tables
    prompt_fn = None
    if real_model is not None:
        from realengine.text import text_prompt_ids

        tok = real_model.tokenizer

        def prompt_fn(spec):
            return text_prompt_ids(spec.id, spec.prompt_len, tok, seed=seed)

    is_cuda = device == "cuda"
    sampler = MemorySampler(name or cfg.name, model.device, memory_interval_s)

    def count_step(_: int) -> None:
        sampler.step += 1  # steps done by every replica together

    # warm-up outside the clock: the first forward pays one-off costs (allocator, kernels' first calls)
    with torch.inference_mode():
        meta = build_metadata([0], [8], device=model.device, block_size=kv0.block_size)
        model(torch.zeros(8, dtype=torch.long, device=model.device), meta.positions, meta, None)
    if is_cuda:
        torch.cuda.synchronize(model.device)
    # every replica's steps on one timer (a reading's differences are what a step lasts)
    timer = cpu_step_timer(cpu_clock, model, reference_seconds) if virtual and not is_cuda else None

    # The simulator's own loop (sim.loop.simulator) drives the engine: every time it handles, the arrivals', the
    # users' think times and the clients' patience, is scaled by time_scale here.
    specs = [dataclasses.replace(s, arrival=s.arrival * time_scale) for s in requests_in]
    closed = getattr(workload, "closed_loop", None)
    plan = None if closed is None else ClosedLoopPlan(closed.num_users, np.asarray(closed.think_times) * time_scale)
    timed = dataclasses.replace(failures, cancel_after={i: d * time_scale for i, d in failures.cancel_after.items()})
    env = simpy.Environment() if virtual else simpy.rt.RealtimeEnvironment(strict=False)
    executors: list[EngineExecutor] = []
    spec_runners: list[SpecDecodeRunner] = []  # speculative decoding: what each replica's drafts measured

    def make_replica() -> tuple[ServingCore, EngineExecutor]:
        """One engine replica: its own policy, KV memory, cache tensors and runner; the model's weights are
        shared (read-only), as replicas of one checkpoint hold the same weights."""
        policy, kv, cost, built = build(cfg)
        speculative = cfg.deployment.speculative
        args = dict(block_manager=kv, model=model, kv_layout=kv_layout, max_num_seqs=min(built.limits.max_num_seqs,
                    1024), max_model_len=built.max_model_len, prompt_fn=prompt_fn)
        spec = None
        if speculative is None:
            runner = ModelRunner(built.model, **args)
        else:  # drafts with the target's first layers (realengine.spec_decode)
            runner = spec_runner = SpecDecodeRunner(built.model, **args)
            spec = spec_runner.speculate(speculative)
            spec_runners.append(spec_runner)
        core = ServingCore(policy, kv, fast_path=False, record_plans=record_plans, spec=spec,
                           look_every=ENGINE_LOOK_EVERY)
        if real_model is not None and texts is not None:
            core.finish_listeners.append(lambda r: texts.append(_request_text(r, runner, real_model.tokenizer,
                                                                              name or cfg.name)))
        core.finish_listeners.append(lambda r: runner.release(r.id))
        if on_runner is not None:
            on_runner(runner)
        executor = EngineExecutor(runner, clock="virtual" if virtual else "wall",
                                  price=cost if is_cuda else None, oom_steps=failures.oom_steps, timer=timer)
        executor.env = env
        executor.on_step = count_step
        executors.append(executor)
        return core, executor

    t0 = time.perf_counter()

    def wall_limit() -> str | None:
        return "engine wall-clock limit" if time.perf_counter() - t0 > max_wall_s else None

    limit = None if max_wall_s is None else wall_limit
    tp = cfg.deployment.tensor_parallel_size
    sim: Simulation
    if cfg.cluster is not None:  # replicas behind a router (and an autoscaler): the simulator's cluster
        if not virtual or max_wall_s is not None:
            raise ValueError("a cluster runs on the engine under the virtual clock only, without max_wall_s")
        cl = cfg.cluster
        sim = ClusterSimulation(specs, make_replica, replicas=cl.replicas, router=cl.router,
                                autoscaler=autoscaler_of(cfg), closed_loop=plan, fast_forward=False, failures=timed,
                                leak=leak, progress=progress)
    else:
        sim = Simulation(specs, [make_replica()], closed_loop=plan, fast_forward=False, failures=timed, leak=leak,
                         env=env, limit=limit, progress=progress)
    sampler.start(t0)
    if not virtual:
        env.sync()  # type: ignore[attr-defined]  # a RealtimeEnvironment: its time 0 is now
    try:
        with torch.inference_mode():
            sim.run()
    finally:
        sampler.stop()
    requests = sim.requests
    if memory_samples is not None:
        memory_samples.extend(sampler.rows)
    weight_bytes = float(model.weight_bytes())
    bpb = float(kv_bytes_per_block(built.model, tdtype, kv0.block_size))
    core = sim.replicas[0].core
    if isinstance(sim, ClusterSimulation):
        result = cluster_result(name or cfg.name, sim, executors, price_per_hour=built.gpu.price_per_hour * tp,
                                config=cfg.to_dict(), weight_bytes=weight_bytes, kv_bytes_per_block=bpb)
    else:
        result = result_of(name or cfg.name, requests, core, executors[0], config=cfg.to_dict(),
                           weight_bytes=weight_bytes, kv_bytes_per_block=bpb)
    if cfg.deployment.speculative is not None:  # the measured acceptance, summed over replicas
        result.spec_decode = summary_inputs([r.core.spec for r in sim.replicas if r.core.spec is not None],
                                            spec_runners, cfg.deployment.speculative)
    return result, requests, core


def _request_text(r: Request, runner: ModelRunner, tokenizer, variant: str) -> dict[str, Any]:
    """A finished request's prompt and output as text (before the runner releases its tokens)."""
    toks = runner.tokens(r.id) if r.id in runner.live_requests else []
    prompt, output = toks[: r.prompt_len], toks[r.prompt_len :]
    return {"variant": variant, "id": r.id, "outcome": None if r.outcome is None else str(r.outcome.value),
            "prompt_tokens": len(prompt), "output_tokens": len(output), "prompt": tokenizer.decode(prompt),
            "output": tokenizer.decode(output)}


def _select_decode_kernel(choice: str) -> None:
    from realengine import attention

    if choice == "ref":
        attention.register_cuda_decode_kernel(None)
        return
    try:
        from realengine import triton_decode
    except ImportError:
        if choice == "triton":
            raise
        attention.register_cuda_decode_kernel(None)
        return
    triton_decode.register()


def memory_csv(samples: list[dict[str, Any]]) -> str:
    """memory.csv's text: one row per sample, ``MEMORY_COLUMNS``."""
    lines = [",".join(MEMORY_COLUMNS)]
    for row in samples:
        lines.append(",".join(str(row[c]) for c in MEMORY_COLUMNS))
    return "\n".join(lines) + "\n"


def measured_energy(samples: list[dict[str, Any]], variant: str, output_tokens: int) -> dict[str, Any]:
    """summary.json's ``energy`` of an engine run, from its memory samples: the NVML energy counter's rise over
    the variant's samples (one GPU: the device the engine ran on), else on the CPU RAPL's (``source: rapl``: the
    whole CPU packages, other processes' draw included), its mean power and joules per output token;
    ``{"measured": false, "reason": ...}`` where no sample has a counter reading."""
    for source in ("nvml", "rapl"):
        rows = [r for r in samples if r["variant"] == variant and r.get(f"{source}_energy_j", "") != ""]
        if len(rows) >= 2:
            break
    else:
        return {"measured": False, "reason": "no energy counter was read: NVML's on CUDA (no pynvml or driver "
                                             "access?), RAPL's on the CPU (/sys/class/powercap/intel-rapl:*/"
                                             "energy_uj missing, or readable by root only)"}
    energy = float(rows[-1][f"{source}_energy_j"]) - float(rows[0][f"{source}_energy_j"])
    seconds = float(rows[-1]["time"]) - float(rows[0]["time"])
    return {"measured": True, "source": source, "energy_j": energy,
            "mean_power_w": energy / seconds if seconds > 0 else float("nan"),
            "j_per_output_token": energy / output_tokens if output_tokens else float("nan"),
            "seconds": seconds}


def kv_held_at_end(core: ServingCore, result: RunResult) -> dict[str, Any]:
    """The KV a finished run still holds: blocks no request gives back (0 on a correct server; a server that
    leaks the KV of failed requests keeps theirs), their bytes, and how many requests' tables hold them."""
    blocks = int(core.kv.num_used_blocks)
    holders = len(getattr(core.kv, "tables", None) or getattr(core.kv, "ranges", None) or {})
    return {"blocks": blocks, "bytes": int(blocks * result.kv_bytes_per_block), "requests": holders}


def write_engine_run(out_dir: str | os.PathLike, results: list[RunResult], memory_samples: list[dict[str, Any]],
                     summaries: dict | None = None, *, scenario: dict | None = None,
                     title: str | None = None, texts: list[dict[str, Any]] | None = None,
                     kv_leak: dict[str, dict[str, Any]] | None = None, written: list[str] | None = None) -> Path:
    """The simulator's run folder (summary.json, requests.csv, steps.csv, report.html, the per-variant exports;
    ``written`` receives every file's name as :func:`sim.output.run_folder.write_run` says) plus memory.csv, and with a
    real model ``texts.jsonl``: one JSON object per request (variant, id, outcome, token counts, prompt and
    output text; output lengths are the workload's, so the text runs on past the model's end-of-turn token).
    ``kv_leak`` (variant name -> :func:`kv_held_at_end`) goes into each variant's summary as ``kv_leak``, so that
    a leak is visible from outside the run. Each variant's ``energy`` is what NVML (or on the CPU RAPL) measured
    (:func:`measured_energy`), or says that nothing was."""
    import json

    from sim.output.run_folder import MEMORY_FILE, TEXTS_FILE, write_run

    if kv_leak and summaries is not None:
        summaries = {name: {**s, "kv_leak": kv_leak[name]} if name in kv_leak else s for name, s in summaries.items()}
    if summaries is None:
        summaries = {r.name: summarize(r) for r in results}
    # the engine's power is measured, not modelled (sim/costs/energy.py models the simulator's)
    summaries = {name: {**s, "energy": measured_energy(memory_samples, name, s["total_output_tokens"])}
                 for name, s in summaries.items()}
    # written with the run's other files, all moved into place at once: memory.csv and texts.jsonl written after
    # them were cut short by a Ctrl-C, and an earlier run's texts.jsonl stayed beside a run without one
    extra = {MEMORY_FILE: memory_csv(memory_samples)}
    if texts:
        rows = sorted(texts, key=lambda t: (t["variant"], t["id"]))
        extra[TEXTS_FILE] = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in rows)
    names: list[str] = []
    out = write_run(out_dir, results, summaries, scenario=scenario, title=title, written=names, extra=extra)
    if written is not None:
        written.extend(names)
    return out
