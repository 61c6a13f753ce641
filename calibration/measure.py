"""Measuring the real engine's step times over a grid of step shapes (needs torch).

A calibration is a list of *scripts*: small workloads driven through the engine's own step loop (the serving
core with a real policy and KV block manager, ``realengine.ModelRunner`` and the model), with requests arriving
at chosen step numbers instead of wall-clock times. No wall clock is involved in scheduling, so a script makes
the very same sequence of steps every time it is run: each step is measured once per repeat, and its sample is
the median over the repeats of that step. Every step a script makes is a sample, labelled with the exact
``StepShape`` the core computed for it, so nothing about a step's shape is guessed.

What a step's duration covers is what ``realengine.engine.run_engine`` counts, since a script runs through the
same serving loop (``sim.loop.simulator``) and executor (``realengine.executor.EngineExecutor``): from the moment the
loop resumes after the previous step to the end of this one, i.e. the core's bookkeeping of the previous step
(``complete``), admitting arrivals, the policy's ``schedule``, input preparation, the forward pass and sampling;
by the engine's clock (``clock``: ``"virtual"``, the serving thread's CPU time on CPU, synchronised wall time on
CUDA; or ``"wall"``). The forward pass alone is timed too (a wrapper around the model, on the same clock), so that
the host's share (Python scheduling, input preparation, sampling) is reported separately as the engine's fixed
per-step and per-request overheads.

The grid of step shapes and its scripts are in ``calibration/grid.py``. Rounds interleave the scripts (script 1, 2,
..., then again), so that a slow spell of a shared machine spreads over many shapes instead of biasing one.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calibration.fit import Sample
from calibration.grid import Arrival, Grid, Script, default_grid, scripts_of
from calibration.serving import shape_row
from realengine.clock import CPU_CLOCKS, ReferenceClock, cpu_step_timer
from realengine.config import CPU_KV_BYTES
from realengine.executor import EngineExecutor
from realengine.kv_cache import KVCache, kv_bytes_per_block, profile_num_blocks
from realengine.model import LlamaModel, torch_dtype
from realengine.runner import ModelRunner
from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.costmodel import CostModel
from sim.hardware.models import ModelSpec
from sim.hardware.names import CALIBRATE_PRESETS_ONLY, model_preset
from sim.loop.build import build
from sim.loop.simulator import Simulation
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import Batch, ServingCore
from sim.serving.request import RequestSpec

CLOCKS = ("virtual", "wall")


def step_clock(device: str, clock: str = "virtual") -> Callable[[], float]:
    """The clock steps are timed by, the engine's: ``virtual`` times a CPU step by the serving thread's CPU time
    (``time.thread_time``: what the step itself costs, which other processes sharing the cores cannot stretch;
    torch runs on the calling thread with one torch thread) and a CUDA step by synchronized wall time; ``wall``
    is wall time everywhere (what a live run sees, neighbours included)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    return time.thread_time if clock == "virtual" and device != "cuda" else time.perf_counter


class _TimedModel:
    """Wraps the model the runner calls, adding up the time spent in its forward passes (by ``timer``: the same
    clock the step's duration is read from)."""

    def __init__(self, model: LlamaModel, sync: Callable[[], None]) -> None:
        self.model = model
        self.sync = sync
        self.spec = model.spec
        self.device = model.device
        self.dtype = model.dtype
        self.elapsed = 0.0
        self.timer: Callable[[], float] = time.perf_counter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t = self.timer()
        out = self.model(*args, **kwargs)
        self.sync()
        self.elapsed += self.timer() - t
        return out


@dataclass(slots=True)
class _Step:
    shape: tuple[int, ...]  # StepShape fields, in order, then the longest decode context (see shape_row)
    duration: float
    forward: float


def _policy_for(script: Script, model: str, max_model_len: int, block_size: int, num_blocks: int):
    raw = {
        "name": script.name,
        "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 1,
                     "prompt_len": {"type": "fixed", "value": 1}, "output_len": {"type": "fixed", "value": 1}},
        "deployment": {"model": model, "max_model_len": max_model_len, "block_size": block_size,
                       "num_gpu_blocks": num_blocks},
        "policy": script.policy,
    }
    policy, _, _, _ = build(variant_configs(parse_scenario(raw, source=f"calibration script {script.name}"))[0])
    return policy


class _Recorder:
    """The engine's executor, recording each step's shape, duration and forward-pass time."""

    def __init__(self, engine: EngineExecutor, timed: _TimedModel, idle: float) -> None:
        self.engine = engine
        self.timed = timed
        self.idle = idle
        self.cost: CostModel | None = None  # measured: no fast path
        self.peak_flops = 0.0
        self.failure: str | None = None
        self.steps: list[_Step] = []

    def resume(self) -> None:
        self.engine.resume()

    def execute(self, batch: Batch) -> float:
        if self.idle > 0:
            wake = self.engine.timer() + self.idle
            time.sleep(self.idle)
            self.engine.resume(at=wake)
        f0 = self.timed.elapsed
        duration = self.engine.execute(batch)
        self.failure = self.engine.failure
        self.steps.append(_Step(shape_row(batch), duration, self.timed.elapsed - f0))
        return duration

    def step_flops(self, batch: Batch) -> float:
        return 0.0


def _scripted(pending: list[Arrival], specs: list[RequestSpec]):
    """An arrival source for the serving loop: request j arrives just before step ``pending[j].step`` is
    scheduled (counting the replica's steps); when nothing is left to run before the next arrival, it arrives at
    once (the step count jumps to it)."""

    def source(sim: Simulation):
        rep = sim.replicas[0]
        k, i = 0, 0

        def send_due() -> None:
            nonlocal k, i
            while i < len(pending) and pending[i].step <= k:
                sim.send(specs[i])
                i += 1
            if i < len(pending) and not rep.core.has_work:  # nothing to run until the next arrival
                k = pending[i].step
                send_due()
            elif i == len(pending):
                sim.close_arrivals()

        def after_step(_rep) -> None:
            nonlocal k
            k += 1
            if i < len(pending):
                send_due()

        rep.step_listeners.append(after_step)
        send_due()
        yield sim.env.timeout(0)

    return source


# idle times at which the wake-up cost is measured (seconds); past the last one it is taken as flat
WAKE_IDLES = (0.0002, 0.001, 0.003, 0.008, 0.02)


class _Bench:
    """The model, the KV cache and the runner, built once and reused by every script."""

    def __init__(self, spec: ModelSpec, model_name: str, device: str, dtype: torch.dtype, block_size: int,
                 num_blocks: int, seed: int, clock: str = "virtual", cpu_clock: str = "thread",
                 reference_seconds: float | None = None) -> None:
        self.spec = spec
        self.model_name = model_name
        self.device = device
        self.block_size = block_size
        self.kv = PagedBlockManager(num_blocks, block_size)
        model = LlamaModel(spec, dtype=dtype, device=device, seed=seed)
        self.is_cuda = device == "cuda"
        self.sync: Callable[[], None] = (lambda: torch.cuda.synchronize()) if self.is_cuda else (lambda: None)
        self.runner = ModelRunner(spec, block_manager=self.kv, model=model)
        self.clock = step_clock(device, clock)  # what the swap copies are timed by (the steps: the engine's timer)
        self.timed = _TimedModel(model, self.sync)
        # duck-typed: the runner only calls its model and reads spec, device and dtype
        self.runner.model = self.timed  # type: ignore[assignment]  # the runner calls self.model(...): time the forward passes
        self.next_id = 0
        self.cpu_clock = cpu_clock
        self.reference_seconds = reference_seconds
        self._virtual_timer: Callable[[], float] | None = None

    def virtual_timer(self) -> Callable[[], float] | None:
        """The virtual clock's step timer, the engine's (``realengine.clock``; None on CUDA: the executor's own);
        built at first use, on the one torch thread the steps run on, and kept (a reference clock's speed
        estimate carries over from script to script)."""
        if self.is_cuda:
            return None
        if self._virtual_timer is None:
            self._virtual_timer = cpu_step_timer(self.cpu_clock, self.timed.model, self.reference_seconds)
            if isinstance(self._virtual_timer, ReferenceClock):
                self.reference_seconds = self._virtual_timer.base
        return self._virtual_timer

    def run(self, script: Script, policy, idle: float = 0.0, wall: bool = False) -> list[_Step]:
        """Drive the script to the end through the serving loop (``sim.loop.simulator``) on the engine's executor, as
        ``run_engine`` does with its virtual clock; one ``_Step`` per step. ``wall``: time steps by the wall clock
        (``perf_counter``) instead of the engine's virtual clock. ``idle > 0`` sleeps that long before every step
        and times the step from the moment the sleep should have ended, as the wall clock times a step that
        follows an idle period (its wake-up included); only meaningful with ``wall``."""
        kv, runner, timed = self.kv, self.runner, self.timed
        core = ServingCore(policy, kv, fast_path=False)
        core.finish_listeners.append(lambda r: runner.release(r.id))
        threads = torch.get_num_threads()
        if not self.is_cuda and not wall:
            torch.set_num_threads(1)  # the virtual clock counts the serving thread's CPU time only
        try:
            engine = EngineExecutor(runner, timer=time.perf_counter if wall else self.virtual_timer())
            timed.timer = engine.timer
            rec = _Recorder(engine, timed, idle)
            pending = sorted(script.arrivals, key=lambda a: a.step)
            specs = [RequestSpec(id=self.next_id + j, arrival=0.0, prompt_len=a.prompt_len,
                                 output_len=a.output_len) for j, a in enumerate(pending)]
            self.next_id += len(specs)
            sim = Simulation(specs, [(core, rec)], fast_forward=False, arrivals=_scripted(pending, specs))
            sim.run()
        except RuntimeError as e:
            raise RuntimeError(f"calibration script {script.name}: {e}") from None
        finally:
            torch.set_num_threads(threads)
        if kv.num_free_blocks != kv.num_blocks:
            raise RuntimeError(f"calibration script {script.name} left {kv.num_blocks - kv.num_free_blocks} blocks")
        return rec.steps

    def wake_curve(self, scripts: list[Script], policies: list, repeats: int,
                   idles: tuple[float, ...] = WAKE_IDLES) -> list[tuple[float, float]]:
        """How much longer a step takes after the engine idled: per idle time, the median over matched steps
        of (after that sleep - back to back) on the grid's first decode and prefill scripts. On a shared VM it
        grows from tens of microseconds (sub-millisecond idles) to about a millisecond (the CPU leaves its
        power-saving state, caches are cold), which is what makes time to first token long at light load."""
        picked = [next((s, p) for s, p in zip(scripts, policies, strict=True) if s.kind == kind)
                  for kind in ("decode", "prefill")]
        curve = [(0.0, 0.0)]
        for idle in idles:
            diffs: list[float] = []
            for _ in range(repeats):
                for script, policy in picked:
                    busy = self.run(script, policy, wall=True)
                    woken = self.run(script, policy, idle=idle, wall=True)
                    diffs += [w.duration - b.duration for b, w in zip(busy, woken, strict=True)]
            curve.append((idle, max(float(np.median(diffs)), 0.0)))
        return curve

    def swap_per_block(self, counts: tuple[int, ...], repeats: int) -> float:
        """Seconds to copy one KV block (all layers' K and V) between device and CPU memory, one way: the slope
        of the copy time against the block count, out and in measured alike."""
        n_max = max(counts)
        cache = KVCache(self.spec, block_size=self.block_size, dtype=self.timed.dtype, device=self.device,
                        num_blocks=n_max, num_cpu_blocks=n_max)
        xs, ys = [], []
        for _ in range(repeats + 1):
            for n in counts:
                blocks = list(range(n))
                t = self.clock()
                h = cache.swap_out(blocks)
                cache.swap_in(h, blocks)
                self.sync()
                xs.append(2 * n)
                ys.append(self.clock() - t)
        x, y = np.asarray(xs[len(counts):], float), np.asarray(ys[len(counts):], float)  # first round: warm-up
        slope = float(np.polyfit(x, y, 1)[0])
        return max(slope, 0.0)


def _host_cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def engine_num_blocks(spec: ModelSpec, model: LlamaModel | None, device: str, dtype: torch.dtype, block_size: int,
                      max_num_batched_tokens: int, max_num_seqs: int, gpu_memory_utilization: float = 0.9) -> int:
    """The KV block count ``run_engine`` gives this model on this device when the scenario names none: on CUDA
    sized from device memory after a warm-up forward (as vLLM does); on CPU the ``CPU_KV_BYTES`` budget, of which
    a variant gets fewer when its running requests can never hold them all (``realengine.config.cpu_num_blocks``)."""
    if device == "cuda" and model is not None:
        return int(profile_num_blocks(model, block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
                                      max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization))
    return max(1, CPU_KV_BYTES // kv_bytes_per_block(spec, dtype, block_size))


@dataclass(slots=True)
class Measurements:
    """What ``measure`` returns: one sample per script step (median over repeats) and the context."""

    samples: list[Sample]
    swap_block: float  # s per block copied one way
    num_gpu_blocks: int  # the engine's KV block count for this model and device (see ``engine_num_blocks``)
    provenance: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the measurement
    wake_curve: list[tuple[float, float]] = field(default_factory=list)  # see ``_Bench.wake_curve``


def measure(
    model: str = "tiny",
    *,
    device: str = "cpu",
    dtype: str | None = None,
    grid: Grid | None = None,
    repeats: int = 5,
    block_size: int = 16,
    seed: int = 0,
    progress: bool = False,
    clock: str = "virtual",
    cpu_clock: str = "thread",
) -> Measurements:
    """Run every script of the grid ``repeats`` times (after one warm-up round) and return the median step
    times. ``clock``: the engine clock the profile is for (``run_engine(clock=...)``); only the wall clock
    measures the wake-up after idling (the virtual clock never sleeps, so its profile has no wake-up curve).
    ``cpu_clock``: the virtual clock's step timer on CPU (``realengine.clock``; a ``"reference"`` profile records
    the reference's time it reads at, ``provenance.reference_seconds``, for the engine runs compared with it).
    Raises ``ScenarioError`` for an unknown model or device, ``ValueError`` for bad settings."""
    if clock not in ("virtual", "wall"):
        raise ValueError(f"clock must be 'virtual' or 'wall', got {clock!r}")
    wall = clock == "wall"
    t_start = time.perf_counter()
    if device not in ("cpu", "cuda"):
        raise ScenarioError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device cuda: torch sees no CUDA device")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if clock not in CLOCKS:
        raise ScenarioError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    try:  # the command line's message (it gave library callers no preset for a typo or a Hugging Face id)
        spec = model_preset(model, CALIBRATE_PRESETS_ONLY)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    tdtype = torch_dtype(dtype) if dtype else (torch.float32 if device == "cpu" else torch.bfloat16)
    grid = grid or default_grid(device, spec)
    scripts = scripts_of(grid, seed)
    max_len = max(max(a.prompt_len + a.output_len for a in s.arrivals) for s in scripts)
    if max_len > spec.max_position_embeddings:
        raise ValueError(f"the grid needs {max_len} positions; {spec.name} has {spec.max_position_embeddings}")
    need = max(sum(-(-(a.prompt_len + a.output_len) // block_size) for a in s.arrivals) for s in scripts)
    if cpu_clock not in CPU_CLOCKS:
        raise ScenarioError(f"cpu_clock must be one of {', '.join(CPU_CLOCKS)}, got {cpu_clock!r}")
    bench = _Bench(spec, model, device, tdtype, block_size, need + 8, seed, clock, cpu_clock)
    policies = [_policy_for(s, model, max_len, block_size, need + 8) for s in scripts]
    num_blocks = engine_num_blocks(spec, bench.timed.model, device, tdtype, block_size,
                                   max_num_batched_tokens=max(grid.prefill_chunks), max_num_seqs=256)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=(repeats + 1) * len(scripts), desc=f"calibrate {model} on {device}", unit="script",
                   leave=False)
    runs: list[list[list[_Step]]] = [[] for _ in scripts]  # script -> repeat -> steps
    with torch.inference_mode():
        for rnd in range(repeats + 1):
            for j, (script, policy) in enumerate(zip(scripts, policies, strict=True)):
                steps = bench.run(script, policy, wall=wall)
                if rnd > 0:  # round 0 warms up every shape (allocator, kernels' first calls)
                    runs[j].append(steps)
                if bar is not None:
                    bar.update(1)
        swap = bench.swap_per_block(grid.swap_blocks, repeats)
        wake = bench.wake_curve(scripts, policies, max(1, repeats // 2)) if wall else []
    if bar is not None:
        bar.close()
    samples: list[Sample] = []
    for script, reps in zip(scripts, runs, strict=True):
        n = len(reps[0])
        for r in reps[1:]:
            if len(r) != n or any(a.shape != b.shape for a, b in zip(r, reps[0], strict=False)):
                raise RuntimeError(f"calibration script {script.name} did not repeat its steps")
        for k in range(n):
            d = np.array([r[k].duration for r in reps])
            f = np.array([r[k].forward for r in reps])
            q1, q3 = np.percentile(d, [25, 75])
            med = float(np.median(d))
            shape = reps[0][k].shape
            samples.append(Sample(script.name, script.kind, k, shape[0], shape[1], shape[2], shape[3], shape[4],
                                  shape[5], shape[6], duration=med, forward=float(np.median(f)),
                                  spread=float((q3 - q1) / med) if med > 0 else 0.0, max_decode_len=shape[7]))
    # the virtual clock runs the steps on one torch thread (``_Bench.run``)
    threads = torch.get_num_threads() if wall or device == "cuda" else 1
    if device == "cuda":
        dev_name = torch.cuda.get_device_name()
    else:
        dev_name = f"cpu ({_host_cpu()}, {threads} torch threads)"
    provenance: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device": dev_name,
        "host_cpu": _host_cpu(),
        "host_cpus": os.cpu_count(),
        "torch_threads": threads,
        "clock": clock,
        "cpu_clock": cpu_clock,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "engine_commit": _git_commit(),
        "dtype": str(tdtype).replace("torch.", ""),
        "block_size": block_size,
        "model_config": dataclasses.asdict(spec),
        "grid": grid.describe(),
        "repeats": repeats,
        "warmup_rounds": 1,
        "seed": seed,
    }
    if bench.reference_seconds is not None:
        provenance["reference_seconds"] = bench.reference_seconds
    return Measurements(samples, swap, num_blocks, provenance, time.perf_counter() - t_start, wake)


REFERENCE_KIND = "decode"


def reference_script(profile: dict[str, Any]) -> Script | None:
    """The decode script of the profile's grid used to measure the machine's speed later: the middle batch size
    at the middle context. None when the profile carries no grid (not made by ``servesim calibrate``)."""
    g = profile.get("provenance", {}).get("grid")
    if not g:
        return None
    # a stored grid: JSON lists back to tuples (mypy cannot type a dict of mixed fields)
    grid = Grid(**{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()})  # type: ignore[arg-type]
    b = grid.decode_batches[len(grid.decode_batches) // 2]
    c = grid.decode_contexts[len(grid.decode_contexts) // 2]
    name = f"decode-b{b}-c{c}"
    return next((s for s in scripts_of(grid, profile["provenance"].get("seed", 0)) if s.name == name), None)


class SpeedProbe:
    """Measures how fast this machine runs the profile's reference script now, against the profile's samples
    of that script: ``ratio() > 1`` means slower than at calibration (another process sharing the CPU, a
    different clock). Built once (model and cache), run around each validation run."""

    def __init__(self, profile: dict[str, Any], *, device: str = "cpu") -> None:
        self.script = reference_script(profile)
        self.base: float | None = None
        self.repeats = 5  # runs of the script per measurement (after one warm-up run)
        if self.script is None:
            return
        samples = [s for s in profile.get("samples", []) if s["script"] == self.script.name]
        if not samples:
            self.script = None
            return
        # the decode steps only (the first step prefills the prompts)
        self.base = float(np.median([s["duration"] for s in samples if s["num_decode_seqs"] == s["num_seqs"]]))
        prov = profile["provenance"]
        spec = ModelSpec.from_name(profile["model"])
        dtype = torch_dtype(prov.get("dtype", "float32"))
        bs = int(prov.get("block_size", 16))
        need = sum(-(-(a.prompt_len + a.output_len) // bs) for a in self.script.arrivals) + 8
        self.bench = _Bench(spec, profile["model"], device, dtype, bs, need, int(prov.get("seed", 0)),
                            prov.get("clock", "wall"),  # profiles before the virtual clock were timed by wall
                            prov.get("cpu_clock", "thread"), prov.get("reference_seconds"))
        max_len = max(a.prompt_len + a.output_len for a in self.script.arrivals)
        self.policy_args = (profile["model"], max_len, bs, need)

    def measure(self, repeats: int | None = None) -> float | None:
        """Median decode step time of the reference script now (seconds), over ``repeats`` runs (default
        ``self.repeats``) after one warm-up run."""
        if self.script is None:
            return None
        repeats = self.repeats if repeats is None else repeats
        times: list[float] = []
        with torch.inference_mode():
            for r in range(repeats + 1):
                steps = self.bench.run(self.script, _policy_for(self.script, *self.policy_args))
                if r:
                    times += [s.duration for s in steps if s.shape[2] == s.shape[0]]
        return float(np.median(times))

    def ratio(self, repeats: int | None = None) -> float | None:
        now = self.measure(repeats)
        return None if now is None or not self.base else now / self.base
