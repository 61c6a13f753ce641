"""The real-time engine loop: a scenario's workload replayed against the wall clock on a real model.

The serving core, its policy and its KV block manager are the very objects the simulator builds
(``sim.scenario.build``); only the executor differs. One iteration of the loop::

    add every request whose (scaled) arrival time has passed     # at the loop's clock, see below
    batch = core.schedule(now)                                  # None: sleep to the next arrival / wake time
    runner.execute(batch)                                       # the real forward pass (synchronised)
    core.complete(batch, end)                                   # end measured on the wall clock

The engine's clock: ``now`` is the time the step starts, and every step ends at ``end = now + d`` where ``d`` is
the measured wall time since ``now`` (``perf_counter``). A step that follows another starts exactly at the
previous step's end, so the scheduler's bookkeeping between two forward passes is part of a step's measured
duration, as in any real engine's step time. When the engine idles, it sleeps until the next arrival (or the
policy's wake time) and the next step starts exactly at that time: the oversleep (the OS's wake-up latency) is
folded into the step's duration. Requests are admitted at the loop top when their arrival time is at or before
``now``, with their true (scaled) arrival time. Thus every scheduling decision depends only on arrivals at or
before the step's start, and the clock is ``start + duration`` step by step: exactly what the simulator computes
when it is given the measured durations, which makes the parity check (same plans, same preemptions) exact.

Closed-loop workloads too: each user sends its next request a (scaled) think time after its previous one ended,
on the engine's clock, exactly as the simulator's users do.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from realengine.attention import build_metadata
from realengine.kv_cache import kv_bytes_per_block, profile_num_blocks
from realengine.model import LlamaModel, torch_dtype
from realengine.runner import ModelRunner
from sim.core import Batch, ServingCore
from sim.failures import FailurePlan
from sim.records import RunResult
from sim.request import Request, Status
from sim.scenario import PagedKV, ScenarioError, VariantConfig, build
from sim.simulator import result_of
from sim.specs import ModelSpec

CPU_KV_BYTES = 512 * 2**20  # CPU runs without num_gpu_blocks: KV cache of at most this many bytes
MEMORY_COLUMNS = ("variant", "step", "time", "rss_bytes", "max_rss_bytes", "cuda_allocated_bytes",
                  "cuda_max_allocated_bytes", "nvml_used_bytes", "nvml_gpu_util")


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

    CPU: the process's resident and peak memory. CUDA: also torch's allocator statistics and, where pynvml can
    reach the driver, NVML's device memory used and GPU utilisation (NVML's own sampling window is about
    1/6 s to 1 s, so utilisation is only meaningful over runs longer than that). A thread, not a per-step
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
                               "nvml_gpu_util": ""}
        if self.device.type == "cuda":
            row["cuda_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            row["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            if self._nvml is not None:
                nv, handle = self._nvml
                row["nvml_used_bytes"] = nv.nvmlDeviceGetMemoryInfo(handle).used
                row["nvml_gpu_util"] = nv.nvmlDeviceGetUtilizationRates(handle).gpu
        self.rows.append(row)  # list.append is atomic under the GIL: the loop thread only reads after stop()


def _with_deployment(cfg: VariantConfig, **update: Any) -> VariantConfig:
    return dataclasses.replace(cfg, deployment=cfg.deployment.model_copy(update=update))


def engine_config(cfg: VariantConfig, *, model_spec: str | None = None, num_gpu_blocks: int | None = None,
                  dtype: torch.dtype = torch.float32, device: str = "cpu") -> VariantConfig:
    """The variant as the engine runs it: the model replaced (``model_spec``, e.g. ``"tiny"``; max_model_len cut to
    its context), the KV block count given, or capped on CPU, and the swap space cut to what the engine can hold
    (on CPU at most as many blocks as the device cache: the CPU swap tensors are allocated up front)."""
    if model_spec is not None:
        spec = ModelSpec.from_name(model_spec)
        mml = cfg.deployment.max_model_len
        cfg = _with_deployment(cfg, model=model_spec,
                               max_model_len=None if mml is None else min(mml, spec.max_position_embeddings))
    if num_gpu_blocks is not None:
        if num_gpu_blocks < 1:
            raise ScenarioError(f"--num-gpu-blocks must be >= 1, got {num_gpu_blocks}")
        cfg = _with_deployment(cfg, num_gpu_blocks=num_gpu_blocks)
    _, kv, _, built = build(cfg)
    real_bpb = kv_bytes_per_block(built.model, dtype, cfg.deployment.block_size)
    if device != "cuda" and cfg.deployment.num_gpu_blocks is None:
        cap = max(1, CPU_KV_BYTES // real_bpb)
        if kv.num_blocks > cap:
            cfg = _with_deployment(cfg, num_gpu_blocks=cap)
            _, kv, _, built = build(cfg)
    cpu_blocks = getattr(kv, "num_cpu_blocks", 0)
    want = cpu_blocks if device == "cuda" else min(cpu_blocks, kv.num_blocks)
    if want != cpu_blocks and built.budget.kv_bytes_per_block:
        # build() takes int(swap_space * 2**30 // kv_bytes_per_block) blocks: this float gives exactly ``want``
        cfg = _with_deployment(cfg, swap_space=want * built.budget.kv_bytes_per_block / 2**30)
    return cfg


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
) -> tuple[RunResult, list[Request], ServingCore]:
    """Run one variant on the real model, replaying ``workload`` (a ``GeneratedWorkload`` or a list of
    ``RequestSpec``) against the wall clock; arrival ``a`` comes at ``a * time_scale`` seconds after the start.

    Returns ``(result, requests, core)`` like ``sim.run.simulate_variant``; every time in them is wall-clock
    seconds since the start. ``memory_samples``: a list the memory samples (dicts of ``MEMORY_COLUMNS``) are
    appended to. ``max_wall_s``: requests still in flight then end ``failed`` and unsent ones are dropped.
    ``failures``: cancellations, request errors and out-of-memory steps to inject (``sim.failures``); default:
    the workload's own (a scenario's ``workload.failures``), taken between steps as the simulator takes them.
    ``decode_kernel``: on CUDA, ``"triton"`` (the paged decode kernel), ``"ref"`` (gather + SDPA) or ``"auto"``
    (Triton where it imports). ``on_runner``: called with the ``ModelRunner`` once built (tests inspect its cache).
    ``real_model``: a ``realengine.gguf_model.RealModel`` (real weights and a tokenizer) to run instead of random
    weights; its spec must be the run's model, and prompts are then real text (``text.text_prompt_ids``, exactly
    the workload's prompt lengths). ``texts``: a list that gets one dict per finished request with its prompt and
    output text (real models only; see ``write_engine_run``). ``weight_quant``: run the decoder's linear layers
    quantized (``int8``, ``int4`` or ``fp8``, ``realengine.quant``); the KV cache is sized after quantizing, as
    vLLM sizes it after loading the quantized weights.
    """
    requests_in = getattr(workload, "requests", workload)
    if time_scale < 0:
        raise ValueError(f"time_scale must be >= 0, got {time_scale}")
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
    if device == "cuda" and cfg.deployment.num_gpu_blocks is None:  # size the cache as vLLM does
        blocks = profile_num_blocks(model, block_size=cfg.deployment.block_size,
                                    max_num_batched_tokens=built.limits.max_num_batched_tokens,
                                    max_num_seqs=built.limits.max_num_seqs,
                                    gpu_memory_utilization=cfg.deployment.gpu_memory_utilization)
        cfg = engine_config(cfg, num_gpu_blocks=blocks, dtype=tdtype, device=device)
    policy, kv, cost, built = build(cfg)
    if kv_layout == "paged" and not isinstance(cfg.kv_cache, PagedKV):
        kv_layout = "contiguous"  # the contiguous allocator has no block tables
    prompt_fn = None
    if real_model is not None:
        from realengine.text import text_prompt_ids

        tok = real_model.tokenizer

        def prompt_fn(spec):
            return text_prompt_ids(spec.id, spec.prompt_len, tok, seed=seed)

    runner = ModelRunner(built.model, block_manager=kv, model=model, kv_layout=kv_layout,
                         max_num_seqs=min(built.limits.max_num_seqs, 1024), max_model_len=built.max_model_len,
                         prompt_fn=prompt_fn)
    core = ServingCore(policy, kv, fast_path=False, record_plans=record_plans)
    if real_model is not None and texts is not None:
        core.finish_listeners.append(lambda r: texts.append(_request_text(r, runner, real_model.tokenizer,
                                                                          name or cfg.name)))
    core.finish_listeners.append(lambda r: runner.release(r.id))
    if on_runner is not None:
        on_runner(runner)
    is_cuda = device == "cuda"
    price = cost if is_cuda else SimpleNamespace(peak_flops=0.0)
    sampler = MemorySampler(name or cfg.name, runner.device, memory_interval_s)

    # warm-up outside the clock: the first forward pays one-off costs (allocator, kernels' first calls)
    with torch.inference_mode():
        meta = build_metadata([0], [8], device=runner.device, block_size=kv.block_size)
        model(torch.zeros(8, dtype=torch.long, device=runner.device), meta.positions, meta, None)
    if is_cuda:
        torch.cuda.synchronize(runner.device)

    # Requests not sent yet, as a heap of (send time, order, spec). Open loop: every request at its (scaled)
    # arrival time. Closed loop: each user's first request at time 0, the next one a (scaled) think time after
    # the previous one ended, whatever its outcome (as the simulator's users do).
    sends: list[tuple[float, int, Any]] = []
    closed = getattr(workload, "closed_loop", None)
    user_queues: list[list] = []
    if closed is None:
        for k, spec in enumerate(sorted(requests_in, key=lambda s: (s.arrival, s.id))):
            sends.append((spec.arrival * time_scale, k, spec))
    else:
        user_queues = [[] for _ in range(closed.num_users)]
        for spec in sorted(requests_in, key=lambda s: s.id):
            user_queues[spec.session_id or 0].append(spec)
        for queue in user_queues:
            queue.reverse()  # pop() takes the user's next request
        sends = [(0.0, u, q.pop()) for u, q in enumerate(user_queues) if q]
    order = len(sends)
    requests: list[Request] = []
    live: dict[int, Request] = {}  # arrived requests by id (those a fault can still reach)
    cancels: list[tuple[float, int]] = []  # (time, id) heap of the clients that will disconnect
    steps = 0

    def arrive(upto: float) -> None:
        while sends and sends[0][0] <= upto:
            due, _, spec = heapq.heappop(sends)
            req = Request(spec, due)
            requests.append(req)
            core.add_request(req, due)
            live[req.id] = req
            delay = failures.cancel_after.get(req.id)
            if delay is not None:
                heapq.heappush(cancels, (due + delay * time_scale, req.id))

    def next_send(r: Request) -> None:
        nonlocal order
        queue = user_queues[r.spec.session_id or 0]
        if queue:
            think = float(closed.think_times[r.id]) * time_scale
            heapq.heappush(sends, (r.finish + think, order, queue.pop()))
            order += 1

    if closed is not None:
        core.finish_listeners.append(next_send)

    clock = time.perf_counter
    t0 = clock()
    sampler.start(t0)
    now = 0.0
    try:
        while True:
            arrive(now)
            while cancels and cancels[0][0] <= now:
                _, rid = heapq.heappop(cancels)
                if live[rid].outcome is None:
                    core.abort(live[rid], now, failures.cancel_reason, leak=leak)
            if max_wall_s is not None and clock() - t0 > max_wall_s:
                for r in list(core.waiting) + list(core.running) + list(core.swapped):
                    core.abort(r, now, "engine wall-clock limit")
                break
            batch = core.schedule(now) if core.has_work else None
            if batch is None:
                nxt = sends[0][0] if sends else None
                wake = core.wake_time(now) if core.has_work else None
                if wake is not None and wake > now and (nxt is None or wake < nxt):
                    nxt = wake
                if cancels and core.has_work and (nxt is None or cancels[0][0] < nxt):
                    nxt = cancels[0][0]
                if nxt is None:
                    if core.has_work:
                        raise RuntimeError(f"engine stalled at {now:.3f}s: {len(core.waiting)} waiting, "
                                           f"{len(core.running)} running, {len(core.swapped)} swapped and the "
                                           f"policy schedules nothing")
                    break
                delay = nxt - (clock() - t0)
                if delay > 0:
                    time.sleep(delay)
                now = nxt  # the step starts at the arrival (wake) time; the oversleep counts in its duration
                continue
            oom = _execute(runner, batch, steps in failures.oom_steps)
            if is_cuda:
                torch.cuda.synchronize(runner.device)
            end = now + ((clock() - t0) - now)
            # requests that arrived during the step join the queue before the step completes, as in the
            # simulator (the step's row then shows them waiting)
            arrive(end)
            if oom is not None:  # the step produced nothing: every request in it fails, its blocks freed
                for r in _batch_requests(batch):
                    core.abort(r, end, f"out of memory: {oom}")
                if is_cuda:
                    torch.cuda.empty_cache()
            elif failures.error_after:
                for r, _ in batch.plan.scheduled:
                    n = failures.error_after.get(r.id)
                    if n is not None and r.num_output_tokens >= n and r.status is not Status.FINISHED:
                        core.abort(r, end, f"injected error after {r.num_output_tokens} output tokens")
            flops = float(cost.step_flops(batch.shape)) if is_cuda and oom is None else 0.0
            core.complete(batch, end, flops)
            steps += 1
            sampler.step = steps
            now = end
    finally:
        sampler.stop()
    if memory_samples is not None:
        memory_samples.extend(sampler.rows)
    result = result_of(name or cfg.name, requests, core, price, config=cfg.to_dict(),
                       weight_bytes=float(model.weight_bytes()),
                       kv_bytes_per_block=float(kv_bytes_per_block(built.model, tdtype, kv.block_size)))
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


def _batch_requests(batch: Batch) -> list[Request]:
    """The requests a step works for: those it computes tokens for and those it swaps back in."""
    seen = {r.id: r for r, _ in batch.plan.scheduled}
    for r in batch.plan.swap_in:
        seen.setdefault(r.id, r)
    return list(seen.values())


def _execute(runner: ModelRunner, batch: Batch, inject_oom: bool) -> str | None:
    """Run the step; on out-of-memory (real, or injected just before the forward pass) return its message."""
    if inject_oom:
        runner.fault = _raise_oom
    try:
        runner.execute(batch)
    except torch.OutOfMemoryError as e:
        return str(e).splitlines()[0] if str(e) else "OutOfMemoryError"
    finally:
        runner.fault = None
    return None


def _raise_oom(batch: Batch) -> None:
    raise torch.OutOfMemoryError("injected: the step's activations did not fit")


def write_memory_csv(out_dir: str | os.PathLike, samples: list[dict[str, Any]]) -> Path:
    path = Path(out_dir) / "memory.csv"
    lines = [",".join(MEMORY_COLUMNS)]
    for row in samples:
        lines.append(",".join(str(row[c]) for c in MEMORY_COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    return path


def kv_held_at_end(core: ServingCore, result: RunResult) -> dict[str, Any]:
    """The KV a finished run still holds: blocks no request gives back (0 on a correct server; a server that
    leaks the KV of failed requests keeps theirs), their bytes, and how many requests' tables hold them."""
    blocks = int(core.kv.num_used_blocks)
    holders = len(getattr(core.kv, "tables", None) or getattr(core.kv, "ranges", None) or {})
    return {"blocks": blocks, "bytes": int(blocks * result.kv_bytes_per_block), "requests": holders}


def write_engine_run(out_dir: str | os.PathLike, results: list[RunResult], memory_samples: list[dict[str, Any]],
                     summaries: dict | None = None, *, scenario: dict | None = None,
                     title: str | None = None, texts: list[dict[str, Any]] | None = None,
                     kv_leak: dict[str, dict[str, Any]] | None = None) -> Path:
    """The simulator's run folder (summary.json, requests.csv, steps.csv, report.html) plus memory.csv, and with a
    real model ``texts.jsonl``: one JSON object per request (variant, id, outcome, token counts, prompt and
    output text; output lengths are the workload's, so the text runs on past the model's end-of-turn token).
    ``kv_leak`` (variant name -> :func:`kv_held_at_end`) goes into each variant's summary as ``kv_leak``, so that
    a leak is visible from outside the run."""
    import json

    from sim.output import write_run

    if kv_leak and summaries is not None:
        summaries = {name: {**s, "kv_leak": kv_leak[name]} if name in kv_leak else s for name, s in summaries.items()}
    out = write_run(out_dir, results, summaries, scenario=scenario, title=title)
    write_memory_csv(out, memory_samples)
    if texts:
        rows = sorted(texts, key=lambda t: (t["variant"], t["id"]))
        (Path(out) / "texts.jsonl").write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in rows))
    return out
