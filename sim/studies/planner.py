"""Capacity planning by simulation: the cheapest deployment that meets a scenario's SLOs at its load.

The space (the scenario's ``plan`` section, see ``PlanConfig``): GPU type x tensor-parallel degree x pipeline
stages x replicas (whole GPUs, at most ``max_gpus``) x weight dtype x KV dtype x ``max_num_seqs`` x chunked
prefill. Everything else (model, ``max_model_len``, block size, cost-model efficiencies, admission) comes from the
scenario.

Every point is first checked against analytic bounds; only the survivors are simulated, cheapest first.

- memory: the weights, vLLM's activation reserve and one ``max_model_len`` request's KV must fit per GPU (what
  ``sim.loop.build.build`` and vLLM refuse).
- latency: request i's TTFT is at least the step time of its whole prompt computed alone (chunks only add per-step
  costs, other requests only add work), and each of its TPOT gaps at least one decode step of it alone, which is
  bound by reading the weights (``bandwidth-bound decode``). TTFT_i >= bound_i for every i, and a percentile is
  monotone in every value, so when the percentile of the bounds exceeds an SLO the simulated one does too.
- throughput: the workload needs at least W seconds of busy GPU time, summed over replicas: the largest of (a)
  the whole work as one step (aggregates of the linear layers and attention), (b) its decode tokens at the
  largest possible decode batch (``max_num_seqs``, ``max_num_batched_tokens`` and the KV blocks the smallest
  prompts need cap it), (c) its tokens at ``max_num_batched_tokens`` per step. If W / replicas exceeds the span of
  the arrivals, the offered load is above what the replicas can serve: in steady state the queue grows without
  bound (utilisation above 1), so no latency SLO holds. This bound is the steady-state criterion; a finite run
  can end before its queue has grown far, which is why it is reported as "steady state". Open-loop arrivals only.

These hold for the analytic cost model (every step time non-decreasing in each shape field, per-step costs and
per-part maxima summed); the planner refuses a fitted profile, which describes one device only.

Search: survivors sorted by cost per hour; each cost level is simulated whole, and with ``stop_early`` the search
stops after the first level where a configuration meets the SLOs: any other is costlier, so it cannot be the
cheapest. Among equally cheap ones that meet the SLOs the planner prefers higher weight precision, then higher
KV precision (quality, which the simulator does not model), then the lowest tail latency relative to the SLOs;
equally cheap ones of lower precision than a configuration already meeting the SLOs are not simulated.

Price per token and the break-even volume are at the offered load, the output tokens the workload offers over its
arrival window (``OutputLoad``): the run's own throughput counts the drain after the last arrival, so it would make
them depend on ``num_requests``. A deployment that cannot keep up is marked saturated and priced at what it serves.

Replicas run in one simulation: a router sends each arrival to the replica with the fewest unfinished requests
(join the shortest queue, ties to the lowest index), as a load balancer in front of vLLM instances does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.config.scenario import VariantConfig, slos_of
from sim.config.schema import (
    AnalyticCost,
    ContinuousPolicyConfig,
    Deployment,
    FittedCost,
    PagedKV,
    PlanConfig,
    Scenario,
    ScenarioError,
)
from sim.costs.costmodel import CostModel, StepShape
from sim.engines.registry import resolve_policy
from sim.hardware.dtypes import DTYPE_BITS, resolve_kv_dtype
from sim.hardware.gpu import GPU_PRESETS, GPUSpec, resolve_gpu
from sim.hardware.kv_budget import KVBudget, ModelDoesNotFitError
from sim.hardware.models import ModelSpec, check_tensor_parallel, resolve_model
from sim.loop.build import resolve_max_model_len, size_kv_cache
from sim.metrics.intervals import LOSO_COVERAGE, bounds
from sim.metrics.records import RunResult
from sim.metrics.summary import SLOs, summarize
from sim.serving.pipeline import check_pipeline, wrap_pipeline
from sim.studies.sweep import parallel_map
from sim.workload.generator import GeneratedWorkload

NAN = float("nan")
SLO_METRICS = ("ttft", "tpot", "e2el")
# Served over offered output rate, in the second half of the arrival window, below this: the deployment cannot keep
# up. One that keeps up serves what arrives there less the growth of its in-flight work, which fills for about the
# longest request's latency: plan-chat's 2 x L40S measured 0.90-0.92 at 400 requests, 0.98-1.01 from 1,000 on;
# one that cannot serves its capacity, a ratio that does not rise with more requests (one L40S: 0.78-0.84).
KEEPS_UP = 0.85


# ---- the space ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Candidate:
    """One point of the deployment space."""

    gpu: str
    tensor_parallel_size: int
    replicas: int
    weight_dtype: str
    kv_dtype: str  # resolved (never "auto")
    max_num_seqs: int
    enable_chunked_prefill: bool
    gpu_price_per_hour: float  # USD per GPU-hour
    pipeline_parallel_size: int = 1  # stages of tp GPUs each (sim/serving/pipeline.py)
    prefill_replicas: int = 0  # > 0: disaggregated, this many of the replicas prefill, the rest decode

    @property
    def num_gpus(self) -> int:
        return self.replicas * self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def cost_per_hour(self) -> float:
        """USD per hour for every GPU of the deployment."""
        return self.num_gpus * self.gpu_price_per_hour

    @property
    def precision(self) -> tuple[int, int]:
        """(weight bits, KV bits): higher is closer to the unquantized model."""
        return DTYPE_BITS[self.weight_dtype], DTYPE_BITS[self.kv_dtype]

    def label(self) -> str:
        rep = f"{self.replicas} x " if self.replicas > 1 else ""
        tp = f" tp{self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
        tp += f" pp{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        if self.prefill_replicas:
            rep = f"{self.prefill_replicas}P{self.replicas - self.prefill_replicas}D x "
        return (f"{rep}{self.gpu}{tp}, weights {self.weight_dtype}, KV {self.kv_dtype}, max_num_seqs "
                f"{self.max_num_seqs}, chunked prefill {'on' if self.enable_chunked_prefill else 'off'}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "replicas": self.replicas,
            "num_gpus": self.num_gpus,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "max_num_seqs": self.max_num_seqs,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "gpu_price_per_hour": self.gpu_price_per_hour,
            "cost_per_hour": self.cost_per_hour,
            **({"prefill_replicas": self.prefill_replicas} if self.prefill_replicas else {}),
        }


@dataclass(frozen=True, slots=True)
class OutputLoad:
    """The output rate a simulated deployment is priced at, measured on its run (tokens / s).

    ``offered``: the workload's output tokens at its arrival rate, (n - 1) requests over the arrival window (n
    arrivals bound n - 1 gaps) times the mean output length; NaN without a window (closed loop, all at once).
    ``served`` and ``offered_late``: the output tokens produced, and those of the requests that arrived, in the
    second half of the arrival window, per second; a request's first token counts at ``first_token`` and the rest
    evenly up to its finish. The first half is left out: the server starts empty, so its output lags the arrivals
    there by about one request's latency whatever its capacity. ``saturated``: served below ``KEEPS_UP`` x
    offered_late, the queue grows. ``run``: the run's throughput, drain included (the fallback without a window).
    """

    offered: float
    served: float
    offered_late: float
    run: float

    @property
    def saturated(self) -> bool:
        return self.served < KEEPS_UP * self.offered_late

    @property
    def rate(self) -> float:
        """Offered when the deployment keeps up, served when saturated, the run's without an arrival window."""
        if not math.isfinite(self.offered):
            return self.run
        return self.served if self.saturated else self.offered


def output_load(result: RunResult, run_throughput: float) -> OutputLoad:
    """``OutputLoad`` of one run; ``run_throughput`` is its summary's ``output_throughput``."""
    reqs = result.requests
    arrival = np.array([r.arrival for r in reqs], dtype=np.float64)
    if arrival.size < 2 or not arrival.max() - arrival.min() > 0:
        return OutputLoad(NAN, NAN, NAN, run_throughput)
    t0, t1 = float(arrival.min()), float(arrival.max())
    target = np.array([r.target_output_tokens for r in reqs], dtype=np.float64)
    offered = (arrival.size - 1) / (t1 - t0) * target.mean()
    mid = (t0 + t1) / 2
    out = np.array([r.output_tokens for r in reqs], dtype=np.float64)
    first = np.array([r.first_token for r in reqs], dtype=np.float64)
    finish = np.array([r.finish for r in reqs], dtype=np.float64)

    def produced_by(t: float) -> float:
        began = (out > 0) & (first >= 0) & (first <= t)
        gap = np.maximum(finish - first, 1e-12)
        share = np.clip((t - first) / gap, 0.0, 1.0)
        return float(np.sum(np.where(began, 1.0 + (out - 1.0) * share, 0.0)))

    late = (arrival > mid) & (arrival <= t1)
    half = t1 - mid
    return OutputLoad(offered, (produced_by(t1) - produced_by(mid)) / half, float(target[late].sum()) / half,
                      run_throughput)


@dataclass(slots=True)
class Evaluation:
    """What the planner found out about one candidate."""

    candidate: Candidate
    status: str = "pending"  # pruned | met | missed | not simulated
    bound: str = ""  # for pruned: memory | ttft | tpot | e2el | throughput | max_gpus
    reason: str = ""  # the numbers behind a pruning or a skip
    lower_bounds: dict[str, float] = field(default_factory=dict)  # percentile of the per-request latency bounds
    utilization_bound: float = NAN  # lower bound on busy time / (replicas x arrival span); > 1: overloaded
    latency: dict[str, float] = field(default_factory=dict)  # simulated percentile of ttft, tpot, e2el
    output_throughput: float = NAN  # simulated output tokens / s over the run, the drain after the last arrival too
    load: OutputLoad | None = None  # the output rate it is priced at (offered, or served when saturated)
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    num_completed: int = 0
    num_requests: int = 0
    sim_seconds: float = 0.0  # wall time of the simulation
    j_per_output_token: float = NAN  # simulated energy per output token (sim/costs/energy.py); NaN: no power figures
    latency_80_high: dict[str, float] = field(default_factory=dict)  # each latency at its 80% interval's slow end
    meets_80: bool = False  # every request completed and every latency_80_high within its SLO

    @property
    def simulated(self) -> bool:
        return self.status in ("met", "missed")

    @property
    def meets(self) -> bool:
        return self.status == "met"

    @property
    def output_rate(self) -> float:
        """Output tokens / s the deployment is priced at: the offered load it keeps up with, what it serves under
        load when saturated, the run's throughput without an offered rate (``OutputLoad.rate``)."""
        if self.load is None:
            return self.output_throughput
        return self.load.rate

    @property
    def saturated(self) -> bool:
        return self.load is not None and self.load.saturated

    @property
    def cost_per_million_output_tokens(self) -> float:
        """USD per million output tokens at ``output_rate`` (NaN unless simulated). Not the finite run's
        throughput: its drain after the last arrival would make the price depend on ``num_requests``."""
        rate = self.output_rate
        if not self.simulated or not rate > 0:
            return NAN
        return self.candidate.cost_per_hour / (rate * 3600.0) * 1e6

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if x is None or not math.isfinite(x) else x

        return {
            **self.candidate.to_dict(),
            "status": self.status,
            "bound": self.bound,
            "reason": self.reason,
            "lower_bounds": {k: num(v) for k, v in self.lower_bounds.items()},
            "utilization_bound": num(self.utilization_bound),
            "latency": {k: num(v) for k, v in self.latency.items()},
            "output_throughput": num(self.output_throughput),
            "offered_output_rate": num(NAN if self.load is None else self.load.offered),
            "served_output_rate": num(NAN if self.load is None else self.load.served),
            "saturated": self.saturated,
            "output_rate": num(self.output_rate),
            "cost_per_million_output_tokens": num(self.cost_per_million_output_tokens),
            "j_per_output_token": num(self.j_per_output_token),
            "latency_80_high": {k: num(v) for k, v in self.latency_80_high.items()},
            "meets_slos_80": self.meets_80,
            "num_completed": self.num_completed,
            "num_requests": self.num_requests,
        }


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Self-hosting the chosen deployment (paid per hour, busy or not) against a per-token hosted API."""

    api_input_per_million: float  # USD per million input tokens
    api_output_per_million: float  # USD per million output tokens
    input_per_output: float  # input tokens per output token in the workload
    api_per_million_output: float  # USD the API charges per million output tokens, with their input tokens
    cost_per_hour: float  # USD per hour of the deployment
    break_even_output_tokens_per_hour: float  # above this volume self-hosting is cheaper
    break_even_requests_per_second: float  # the same, in requests of the workload's mean output length
    load_output_tokens_per_hour: float  # the scenario's load the deployment carries (``Evaluation.output_rate``)
    api_cost_per_hour_at_load: float

    def to_dict(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in self.__slots__}


def break_even(cost_per_hour: float, api_input_per_million: float, api_output_per_million: float,
               input_tokens: int, output_tokens: int, num_requests: int, output_rate: float) -> BreakEven:
    """Break-even volume of a deployment costing ``cost_per_hour`` against an API charging per token.

        api $ per M output = output price + input price x (input tokens / output tokens)
        break-even output tokens per hour = cost_per_hour / api $ per M output x 1e6

    Above that volume the fixed hourly cost is cheaper than paying per token (as long as the deployment carries
    the volume: it was sized for the scenario's load). ``output_rate``: output tokens / s the deployment carries."""
    ratio = input_tokens / output_tokens if output_tokens else 0.0
    api_per_m = api_output_per_million + api_input_per_million * ratio
    tokens_per_hour = cost_per_hour / api_per_m * 1e6
    mean_out = output_tokens / num_requests if num_requests else NAN
    load = output_rate * 3600.0
    return BreakEven(
        api_input_per_million=api_input_per_million,
        api_output_per_million=api_output_per_million,
        input_per_output=ratio,
        api_per_million_output=api_per_m,
        cost_per_hour=cost_per_hour,
        break_even_output_tokens_per_hour=tokens_per_hour,
        break_even_requests_per_second=tokens_per_hour / 3600.0 / mean_out,
        load_output_tokens_per_hour=load,
        api_cost_per_hour_at_load=load / 1e6 * api_per_m,
    )


@dataclass(slots=True)
class PlanResult:
    """The search: every candidate's evaluation, the choice and its economics."""

    scenario: str
    percentile: int
    slos: dict[str, float | None]
    evaluations: list[Evaluation]
    chosen: Evaluation | None
    break_even: BreakEven | None
    seconds: float  # wall time of the whole search
    notes: list[str]

    def count(self, status: str, bound: str | None = None) -> int:
        return sum(1 for e in self.evaluations if e.status == status and (bound is None or e.bound == bound))

    @property
    def simulated(self) -> list[Evaluation]:
        return [e for e in self.evaluations if e.simulated]

    def fewest_joules(self) -> Evaluation | None:
        """Of the simulated deployments that meet the SLOs, the one with the fewest joules per output token (the
        cheaper on a tie). With ``stop_early`` the search simulates nothing costlier than the choice, so this is
        among the deployments as cheap as the choice; ``stop_early: false`` weighs the whole space."""
        ok = [e for e in self.simulated if e.meets and math.isfinite(e.j_per_output_token)]
        return min(ok, key=lambda e: (e.j_per_output_token, e.candidate.cost_per_hour), default=None)

    def cheapest_80(self) -> Evaluation | None:
        """The cheapest simulated deployment that meets the SLOs with 80% confidence (``Evaluation.meets_80``),
        higher precision first on a tie. With ``stop_early`` nothing costlier than the choice was simulated."""
        ok = [e for e in self.simulated if e.meets_80]
        return min(ok, key=lambda e: (e.candidate.cost_per_hour, tuple(-p for p in e.candidate.precision)),
                   default=None)

    def pareto_front(self) -> list[Evaluation]:
        """Simulated candidates that no other simulated one beats: none at most as costly with every SLO
        metric's percentile at most as high, one of them strictly better. Sorted by cost."""
        keys = [k for k in SLO_METRICS if self.slos.get(k) is not None]
        pts = [e for e in self.simulated if all(math.isfinite(e.latency.get(k, NAN)) for k in keys)]

        def vec(e: Evaluation) -> tuple[float, ...]:
            return (e.candidate.cost_per_hour,) + tuple(e.latency[k] for k in keys)

        front = []
        for e in pts:
            v = vec(e)
            dominated = any(_dominates(vec(o), v) for o in pts if o is not e)
            if not dominated:
                front.append(e)
        # equal points: keep the first of each
        seen, out = set(), []
        for e in sorted(front, key=lambda e: (vec(e), e is not self.chosen)):
            if vec(e) not in seen:
                seen.add(vec(e))
                out.append(e)
        return out

    def to_dict(self, all_evaluations: bool = False) -> dict[str, Any]:
        """Counts, the choice, the front and every simulated deployment (and, with ``all_evaluations``, every
        pruned or skipped one too)."""
        out = {
            "scenario": self.scenario,
            "percentile": self.percentile,
            "slos": self.slos,
            "chosen": None if self.chosen is None else self.chosen.to_dict(),
            "fewest_joules": None if (f := self.fewest_joules()) is None else f.to_dict(),
            "cheapest_80": None if (c := self.cheapest_80()) is None else c.to_dict(),
            "break_even": None if self.break_even is None else self.break_even.to_dict(),
            "pareto_front": [e.to_dict() for e in self.pareto_front()],
            "counts": {
                "candidates": len(self.evaluations),
                "pruned": {b: self.count("pruned", b) for b in ("memory", "ttft", "tpot", "e2el", "throughput",
                                                                 "max_gpus")},
                "simulated": len(self.simulated),
                "not_simulated": self.count("not simulated"),
            },
            "seconds": self.seconds,
            "notes": self.notes,
            "simulated": [e.to_dict() for e in self.simulated],
        }
        if all_evaluations:
            out["evaluations"] = [e.to_dict() for e in self.evaluations]
        return out


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a`` is at most ``b`` everywhere and below it somewhere."""
    pairs = list(zip(a, b, strict=True))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


# ---- bounds ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """What the bounds read from a workload."""

    prompt: np.ndarray  # tokens per request, shared prefix included (int64)
    output: np.ndarray  # output tokens per request (int64)
    span: float  # seconds from the first to the last arrival; 0: no offered rate (all at once, closed loop)

    @classmethod
    def of(cls, workload: GeneratedWorkload) -> WorkloadShape:
        reqs = workload.requests
        prompt = np.array([r.prompt_len for r in reqs], dtype=np.int64)
        output = np.array([r.output_len for r in reqs], dtype=np.int64)
        span = 0.0
        if workload.closed_loop is None and reqs:
            arrivals = [r.arrival for r in reqs]
            span = float(max(arrivals) - min(arrivals))
        return cls(prompt, output, span)


def latency_bounds(cost: CostModel, shape: WorkloadShape, percentile: int, *,
                   prefix_caching: bool = False) -> dict[str, float]:
    """The ``percentile`` of per-request lower bounds on TTFT, TPOT and E2EL (seconds).

    TTFT_i >= step time of the whole uncached prompt alone (with prefix caching: of one token); every TPOT gap
    >= a one-row decode step attending the prompt. E2EL_i >= TTFT bound + (output - 1) x TPOT bound."""
    p, o = shape.prompt, shape.output
    ones = np.ones_like(p)
    u = ones if prefix_caching else p
    ttft = np.asarray(cost.step_time(StepShape(ones, u, 0 * ones, u, u * (u + 1) // 2)), dtype=np.float64)
    tpot = np.asarray(cost.step_time(StepShape(ones, ones, ones, p, p)), dtype=np.float64)
    e2el = ttft + (o - 1) * tpot
    multi = o > 1
    return {
        "ttft": float(np.percentile(ttft, percentile)) if len(p) else NAN,
        "tpot": float(np.percentile(tpot[multi], percentile)) if multi.any() else NAN,
        "e2el": float(np.percentile(e2el, percentile)) if len(p) else NAN,
    }


def max_decode_rows(shape: WorkloadShape, *, max_num_seqs: int, max_num_batched_tokens: int, num_gpu_blocks: int,
                    block_size: int, prefix_caching: bool = False) -> int:
    """Most requests one step can decode: ``max_num_seqs``, ``max_num_batched_tokens`` (a token each), and the
    largest b whose b smallest prompts' KV blocks fit in the cache (without prefix caching, which shares blocks)."""
    rows = min(max_num_seqs, max_num_batched_tokens)
    if not prefix_caching and len(shape.prompt):
        need = np.sort(-(-shape.prompt // block_size))
        rows = min(rows, int(np.searchsorted(np.cumsum(need), num_gpu_blocks, side="right")))
    return max(rows, 1)


def work_lower_bound(cost: CostModel, shape: WorkloadShape, *, max_num_seqs: int,
                     max_num_batched_tokens: int, num_gpu_blocks: int, block_size: int,
                     prefix_caching: bool = False) -> float:
    """Seconds of busy GPU time, summed over replicas, that any schedule of the workload needs (see the module
    docstring): max of the aggregate step, the decode tokens at the largest decode batch, and all tokens at
    ``max_num_batched_tokens`` per step."""
    p, o = shape.prompt, shape.output
    if not len(p):
        return 0.0
    u = np.ones_like(p) if prefix_caching else p
    decode = int((o - 1).sum())
    tokens = int(u.sum()) + decode
    rows = len(p) + decode
    kv = int(u.sum() + ((o - 1) * p).sum())
    pairs = int((u * (u + 1) // 2).sum() + ((o - 1) * p).sum())
    whole = float(cost.step_time(StepShape(rows, tokens, decode, kv, pairs)))
    b = max_decode_rows(shape, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        num_gpu_blocks=num_gpu_blocks, block_size=block_size, prefix_caching=prefix_caching)
    c = int(p.min())
    per_decode = float(cost.step_time(StepShape(b, b, b, b * c, b * c))) / b
    m = max_num_batched_tokens
    per_token = float(cost.step_time(StepShape(1, m, 0, m, m))) / m
    return max(whole, decode * per_decode, tokens * per_token)


# ---- simulation -----------------------------------------------------------------------------------------------
def simulate_replicas(cfg: VariantConfig, workload: GeneratedWorkload, replicas: int = 1, *,
                      name: str | None = None) -> RunResult:
    """Simulate ``replicas`` copies of a variant behind a least-outstanding-requests router (``sim.loop.cluster``);
    one ``RunResult`` over every request and every replica's steps."""
    from sim.config.schema import ClusterConfig
    from sim.loop.run import simulate_variant

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if cfg.disaggregation is not None:  # a split of the replicas into pools (sim/loop/disagg/plan.py)
        return simulate_variant(cfg, workload, name=name)[0]
    fleet = dataclasses.replace(cfg, cluster=ClusterConfig(replicas=replicas, router="least_outstanding"))
    result, _, _ = simulate_variant(fleet, workload, name=name)
    return result


def _simulate_job(workload: GeneratedWorkload, job: tuple[VariantConfig, int, str]) -> tuple[RunResult | str, float]:
    """One planner simulation in a worker: its result (or the build error's message) and its wall seconds."""
    vcfg, replicas, name = job
    t0 = time.perf_counter()
    try:
        result: RunResult | str = simulate_replicas(vcfg, workload, replicas, name=name)
    except ScenarioError as e:
        result = str(e)
    return result, time.perf_counter() - t0


# ---- the search -----------------------------------------------------------------------------------------------
def _gpus_of(cfg: PlanConfig) -> list[tuple[str | dict[str, Any], GPUSpec]]:
    # by default every preset with a price (sim/hardware/presets/gpus.py's have none: a cost search cannot rank them)
    names: list[str | dict[str, Any]] = list(cfg.gpus) if cfg.gpus else \
        [n for n, g in GPU_PRESETS.items() if g.price_per_hour > 0]
    out = []
    for g in names:
        try:
            out.append((g, resolve_gpu(g)))
        except (ValueError, TypeError) as e:
            raise ScenarioError(f"plan.gpus: {e}") from None
    return out


def _meets(latency: dict[str, float], slos: SLOs) -> bool:
    for k in SLO_METRICS:
        limit = getattr(slos, k)
        if limit is not None and latency.get(k, NAN) > limit:  # NaN (no multi-token request for TPOT) passes
            return False
    return True


# an SLO's metric -> its class of sim/metrics/intervals.py
SLO_CLASSES = {"ttft": "TTFT", "tpot": "decode speed", "e2el": "E2E"}


def latency_80_high(latency: dict[str, float]) -> dict[str, float]:
    """Each simulated SLO percentile at the slow end of its class's 80% interval (sim/metrics/intervals.py). An SLO is
    met
    "with 80% confidence" when that slow end is within it: by the development rows' errors a measurement lies
    below it 90% of the time (one-sided), so at least 80%. Where the simulator over-predicts a class (TTFT) the slow
    end is below the prediction. The intervals come from errors of means and rates; applied to the SLO's
    percentile they assume a tail is off by as much as a mean, which no published row checks."""
    return {k: bounds(SLO_CLASSES[k], v, False)[1] for k, v in latency.items()
            if k in SLO_CLASSES and math.isfinite(v)}


def _slo_ratio(e: Evaluation, slos: SLOs) -> float:
    """The tail latency relative to its SLO, the worst over the SLOs given (< 1: every SLO met)."""
    r = [e.latency.get(k, NAN) / getattr(slos, k) for k in SLO_METRICS if getattr(slos, k) is not None]
    r = [x for x in r if math.isfinite(x)]
    return max(r) if r else 0.0


def check_plan(scenario: Scenario) -> tuple[PlanConfig, SLOs, ModelSpec, list[tuple[str | dict[str, Any], GPUSpec]]]:
    """What the planner needs from the scenario, or a ScenarioError saying what is missing: SLOs, the analytic
    cost model, a model and GPUs it can resolve. Returns (plan section, SLOs, model, [(GPU as given, spec)])."""
    cfg = scenario.plan or PlanConfig()
    slos = slos_of(scenario)
    if slos is None or slos.empty:
        raise ScenarioError("plan: the scenario has no slos to meet (give slos.ttft, slos.tpot or slos.e2el)")
    dep = scenario.deployment
    if isinstance(dep.cost_model, FittedCost):
        raise ScenarioError("plan: deployment.cost_model is a fitted profile, which describes one device; the "
                            "planner compares GPUs with the analytic cost model")
    if dep.speculative is not None:  # its candidates would be priced without the drafts: refuse, not mislead
        raise ScenarioError("plan: deployment.speculative: the planner does not search speculative decoding; "
                            "compare variants with and without it with `servesim run`")
    try:
        model = resolve_model(dep.model)
    except (ValueError, OSError, KeyError) as e:
        raise ScenarioError(f"plan: deployment.model: {e}") from None
    return cfg, slos, model, _gpus_of(cfg)


def plan(scenario: Scenario, *, stop_early: bool | None = None, progress: bool = False,
         workload: GeneratedWorkload | None = None, executor: str = "local", workers: int | None = 1,
         address: str | None = None) -> PlanResult:
    """Search the scenario's deployment space (its ``plan`` section, defaults when absent) for the cheapest
    configuration whose simulated percentile of TTFT, TPOT and E2EL meet ``slos`` with every request completed.
    ``stop_early`` overrides ``plan.stop_early``. The simulations of one cost level run in parallel on
    ``executor`` ("local": a process pool of ``workers``, None: every core; "ray": a Ray cluster at ``address``);
    the result does not depend on it. Raises ScenarioError for a scenario the planner cannot use."""
    from sim.loop.run import generate_workload

    start = time.perf_counter()
    cfg, slos, model, gpus = check_plan(scenario)
    stop = cfg.stop_early if stop_early is None else stop_early
    dep = scenario.deployment
    notes: list[str] = []
    base_policy = scenario.policy
    if not isinstance(base_policy, ContinuousPolicyConfig):
        base_policy = ContinuousPolicyConfig()
        notes.append("the scenario's static policy is replaced by continuous batching (the planner tunes "
                     "max_num_seqs and chunked prefill)")
    if scenario.variants or scenario.sweep:
        notes.append("the scenario's variants and sweep are ignored: the planner starts from its top-level "
                     "deployment, kv_cache, policy and admission")
    if dep.num_gpu_blocks is not None:
        notes.append("deployment.num_gpu_blocks is ignored: the KV cache is sized for each GPU")
    wl = workload if workload is not None else generate_workload(scenario)
    if getattr(wl, "failures", None) is not None:
        notes.append("the workload's failures are left out: the plan is for a healthy server")
    shape = WorkloadShape.of(wl)
    prefix = isinstance(scenario.kv_cache, PagedKV) and scenario.kv_cache.enable_prefix_caching
    q = cfg.percentile
    if shape.span <= 0:
        notes.append("no offered rate (closed loop or all at once): the throughput bound is not applied")
    if cfg.disaggregation is not None and prefix:
        notes.append("plan.disaggregation is ignored: disaggregated pools run without prefix caching")

    evaluations: list[Evaluation] = []
    survivors: list[tuple[Evaluation, VariantConfig]] = []
    base = dep.model_dump()
    base["num_gpu_blocks"] = None
    latency_cache: dict[tuple, dict[str, float]] = {}
    for gname, g in gpus:
        if g.price_per_hour <= 0:
            notes.append(f"{g.name} has no price_per_hour: left out")
            continue
        splits = [(tp, pp) for pp in dict.fromkeys(cfg.pipeline_parallel_sizes)
                  for tp in dict.fromkeys(cfg.tensor_parallel_sizes)]
        for tp, pp in splits:
            try:
                check_tensor_parallel(model, tp)
                check_pipeline(model, pp)
            except ValueError:
                continue
            if tp * pp > cfg.max_gpus:
                continue
            for wd in dict.fromkeys(cfg.weight_dtypes):
                for kd in dict.fromkeys(resolve_kv_dtype(k, wd) for k in cfg.kv_dtypes):
                    for mns in dict.fromkeys(cfg.max_num_seqs):
                        for chunk in dict.fromkeys(cfg.enable_chunked_prefill):
                            per = _evaluate_replica_config(
                                scenario, model, base, base_policy, gname, g, tp, wd, kd, mns, chunk, cfg, slos, shape,
                                q, prefix, latency_cache, pp,
                            )
                            for ev, vcfg in per:
                                evaluations.append(ev)
                                if vcfg is not None:
                                    survivors.append((ev, vcfg))

    survivors.sort(key=lambda s: (round(s[0].candidate.cost_per_hour, 6), tuple(-x for x in s[0].candidate.precision),
                                  s[0].candidate.replicas, s[0].candidate.prefill_replicas,
                                  -s[0].candidate.max_num_seqs,
                                  not s[0].candidate.enable_chunked_prefill, s[0].candidate.gpu))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(survivors), desc=f"plan {scenario.name}", unit="sim", leave=False)
    chosen: Evaluation | None = None
    level_cost: float | None = None
    # Survivors of one cost level are simulated together (in parallel), then judged in the sorted order, so the
    # choice is the one a serial search makes; with stop_early nothing costlier than the choice is simulated.
    levels: dict[float, list[tuple[Evaluation, VariantConfig]]] = {}
    for ev, vcfg in survivors:
        levels.setdefault(round(ev.candidate.cost_per_hour, 6), []).append((ev, vcfg))
    for cost, group in levels.items():
        if chosen is not None and stop:
            for ev, _ in group:
                ev.status = "not simulated"
                ev.reason = f"costlier than the choice (${chosen.candidate.cost_per_hour:.2f}/h)"
            if bar is not None:
                bar.update(len(group))
            continue
        jobs = [(vcfg, ev.candidate.replicas, ev.candidate.label()) for ev, vcfg in group]
        results: list = [None] * len(group)
        for i, out in parallel_map(_simulate_job, jobs, shared=wl, executor=executor, workers=workers,
                                   address=address):
            results[i] = out
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"${group[i][0].candidate.cost_per_hour:.2f}/h", refresh=False)
        for (ev, _), (result, seconds) in zip(group, results, strict=True):
            c = ev.candidate
            if chosen is not None and stop and c.precision < chosen.candidate.precision:
                ev.status = "not simulated"  # simulated already (in parallel), but a serial search skips it
                ev.reason = "as costly as the choice, with lower precision"
                continue
            if isinstance(result, str):  # build refused what the bounds let through: the memory check, reworded
                ev.status, ev.bound, ev.reason = "pruned", "memory", result
                continue
            s = summarize(result, slos)
            ev.sim_seconds = seconds
            ev.latency = {k: s[k][f"p{q}"] for k in SLO_METRICS}
            ev.output_throughput = s["output_throughput"]
            ev.load = output_load(result, s["output_throughput"])
            ev.total_input_tokens, ev.total_output_tokens = s["total_input_tokens"], s["total_output_tokens"]
            ev.num_completed, ev.num_requests = s["num_completed"], s["num_requests"]
            ev.j_per_output_token = NAN if not s["energy"] else s["energy"]["j_per_output_token"]
            ok = ev.num_completed == ev.num_requests and _meets(ev.latency, slos)
            ev.status = "met" if ok else "missed"
            ev.latency_80_high = latency_80_high(ev.latency)
            ev.meets_80 = ev.num_completed == ev.num_requests and _meets(ev.latency_80_high, slos)
            if not ok and ev.num_completed < ev.num_requests:
                ev.reason = f"{ev.num_requests - ev.num_completed} requests not completed"
            if ok:
                better = chosen is None or (c.precision, -_slo_ratio(ev, slos)) > (
                    chosen.candidate.precision, -_slo_ratio(chosen, slos))
                if chosen is None or (cost == level_cost and better):
                    chosen, level_cost = ev, cost
    if bar is not None:
        bar.close()

    be = None
    if chosen is not None and cfg.api_price is not None and chosen.total_output_tokens > 0:
        be = break_even(chosen.candidate.cost_per_hour, cfg.api_price.input, cfg.api_price.output,
                        chosen.total_input_tokens, chosen.total_output_tokens, chosen.num_completed,
                        chosen.output_rate)
    if any(e.candidate.replicas > 1 for e in evaluations if e.simulated):
        notes.append("replicas are simulated together behind a router sending each request to the replica with "
                     "the fewest unfinished requests (sim/loop/cluster.py, least_outstanding)")
    return PlanResult(
        scenario=scenario.name,
        percentile=q,
        slos=slos.as_dict(),
        evaluations=evaluations,
        chosen=chosen,
        break_even=be,
        seconds=time.perf_counter() - start,
        notes=notes,
    )


def _resolve(vcfg: VariantConfig, model: ModelSpec, gpu: GPUSpec) -> tuple[CostModel, KVBudget, int]:
    """The cost model, KV budget and token limit one replica of ``vcfg`` gets, from the very builders
    ``sim.loop.build.build`` uses, without building the KV block manager (the bounds need only its size). Raises
    ScenarioError (a ValueError) where ``build`` refuses the deployment."""
    dep, pol = vcfg.deployment, vcfg.policy
    assert isinstance(dep.cost_model, AnalyticCost)  # check_plan refuses the others
    max_model_len = resolve_max_model_len(dep, model)
    limits = resolve_policy(pol, dep, model, gpu, max_model_len).limits(max_model_len)
    budget = size_kv_cache(dep, model, gpu, limits)
    cost = wrap_pipeline(dep.cost_model.build(model, gpu, dep), model, gpu,
                         pipeline_parallel_size=dep.pipeline_parallel_size, link=dep.pipeline_link,
                         weight_dtype=dep.weight_dtype)
    return cost, budget, limits.max_num_batched_tokens


def _evaluate_replica_config(
    scenario: Scenario, model: ModelSpec, base: dict[str, Any], base_policy: ContinuousPolicyConfig,
    gname: str | dict[str, Any], g: GPUSpec, tp: int, wd: str, kd: str, mns: int, chunk: bool, cfg: PlanConfig,
    slos: SLOs, shape: WorkloadShape, q: int, prefix: bool, latency_cache: dict[tuple, dict[str, float]],
    pp: int = 1,
) -> list[tuple[Evaluation, VariantConfig | None]]:
    """Every replica count of one per-replica configuration: pruned ones with their reason, survivors with the
    variant that simulates them."""
    counts = range(1, cfg.max_gpus // (tp * pp) + 1)

    def cand(r: int) -> Candidate:
        return Candidate(g.name, tp, r, wd, kd, mns, chunk, g.price_per_hour, pp)

    def pruned(bound: str, reason: str, **kw: Any) -> list[tuple[Evaluation, VariantConfig | None]]:
        return [(Evaluation(cand(r), status="pruned", bound=bound, reason=reason, **kw), None) for r in counts]

    dep = Deployment.model_validate({**base, "gpu": gname, "tensor_parallel_size": tp, "weight_dtype": wd,
                                     "kv_dtype": kd, "pipeline_parallel_size": pp})
    pol = base_policy.model_copy(update={"max_num_seqs": mns, "enable_chunked_prefill": chunk})
    vcfg = VariantConfig(name="plan", deployment=dep, kv_cache=scenario.kv_cache, policy=pol,
                         admission=scenario.admission, params={})
    try:
        cost, budget, max_num_batched_tokens = _resolve(vcfg, model, g)
    except (ModelDoesNotFitError, ValueError) as e:
        return pruned("memory", str(e))
    key = (g.name, tp, wd, kd, pp)
    if key not in latency_cache:
        latency_cache[key] = latency_bounds(cost, shape, q, prefix_caching=prefix)
    lb = latency_cache[key]
    for k in SLO_METRICS:
        limit = getattr(slos, k)
        if limit is not None and lb[k] > limit:
            return pruned(k, f"p{q} {k.upper()} >= {lb[k]:.4g} s even alone on the GPU > SLO {limit:g} s",
                          lower_bounds=dict(lb))
    out: list[tuple[Evaluation, VariantConfig | None]] = []
    work = NAN
    if shape.span > 0:
        work = work_lower_bound(cost, shape, max_num_seqs=mns, max_num_batched_tokens=max_num_batched_tokens,
                                num_gpu_blocks=budget.num_gpu_blocks, block_size=budget.block_size,
                                prefix_caching=prefix)
    for r in counts:
        util = work / (r * shape.span) if shape.span > 0 else NAN
        ev = Evaluation(cand(r), lower_bounds=dict(lb), utilization_bound=util)
        if util > 1.0:
            need = math.ceil(work / shape.span)
            ev.status, ev.bound = "pruned", "throughput"
            ev.reason = (f"needs >= {work:.1f} s of GPU time for {shape.span:.1f} s of arrivals: utilisation >= "
                         f"{util:.2f} on {r} replica(s), >= {need} replicas to keep up")
            out.append((ev, None))
        else:
            out.append((ev, vcfg))
    if cfg.disaggregation is not None and not prefix:
        from sim.loop.disagg.plan import split_candidates

        out += [split for ev, v in list(out) for split in split_candidates(ev, v, cfg.disaggregation)]
    if not any(v is not None for _, v in out) and shape.span > 0:
        need = math.ceil(work / shape.span)
        if need * tp * pp > cfg.max_gpus:
            for ev, _ in out:
                ev.bound = "max_gpus" if ev.bound == "throughput" else ev.bound
                ev.reason += f" ({need * tp * pp} GPUs > plan.max_gpus {cfg.max_gpus})"
    return out


# ---- text -----------------------------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    """A latency in seconds as milliseconds: every latency the plan prints is in ms, as in the run table."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x * 1000:,.1f}"


def _metric_names(result: PlanResult) -> list[str]:
    return [k for k in SLO_METRICS if result.slos.get(k) is not None]


def _load_text(e: Evaluation) -> str:
    """The output rate a deployment is priced at, and why that one (``OutputLoad``)."""
    load = e.load
    if load is None or not math.isfinite(load.offered):
        return f"{e.output_throughput:,.0f} output tok/s over the run (no offered rate: closed loop or all at once)"
    if load.saturated:
        return (f"saturated: serves {load.served:,.0f} output tok/s of the {load.offered:,.0f} offered (second half "
                "of the arrival window), it cannot keep up")
    return (f"carries the offered {load.offered:,.0f} output tok/s (the run's {load.run:,.0f} counts the drain "
            "after the last arrival)")


def _confidence_lines(result: PlanResult, ch: Evaluation) -> list[str]:
    """Whether the choice meets its SLOs with 80% confidence, the numbers, and the cheapest that does."""
    q, keys = result.percentile, _metric_names(result)
    cover = ", ".join(f"{SLO_CLASSES[k]} {'unchecked' if (v := LOSO_COVERAGE[SLO_CLASSES[k]]) is None else f'{v:.0%}'}"
                      for k in keys)
    highs = ", ".join(f"p{q} {k.upper()} {_ms(ch.latency_80_high.get(k))} ms" for k in keys)
    out = [f"  with 80% confidence: {'met' if ch.meets_80 else 'not met'} (slow ends of the 80% intervals, "
           f"sim/metrics/intervals.py: {highs}; their leave-one-source-out coverage {cover})"]
    best = result.cheapest_80()
    if best is None:
        out.append("  no simulated deployment meets the SLOs with 80% confidence" + (
            "; --all (plan.stop_early: false) simulates the costlier ones too" if result.count("not simulated")
            else ""))
    elif best is not ch:
        out.append(f"  cheapest simulated deployment meeting them with 80% confidence: {best.candidate.label()} "
                   f"at ${best.candidate.cost_per_hour:.2f}/h")
    return out


def format_plan(result: PlanResult) -> str:
    """The search in words: counts, the Pareto front, the choice, its cost per token and the break-even."""
    q = result.percentile
    keys = _metric_names(result)
    slo_text = ", ".join(f"p{q} {k.upper()} <= {_ms(result.slos[k])} ms" for k in keys)
    n = len(result.evaluations)
    pruned = {b: result.count("pruned", b) for b in ("memory", "ttft", "tpot", "e2el", "throughput", "max_gpus")}
    pruned_text = ", ".join(f"{b} {v:,}" for b, v in pruned.items() if v)
    lines = [
        f"{result.scenario}: SLOs {slo_text}, every request completed",
        f"searched {n:,} deployments; pruned by analytic bounds: {pruned_text or 'none'} "
        f"(throughput: steady state, utilisation > 1); simulated {len(result.simulated)}"
        + (f", {result.count('not simulated'):,} not simulated (costlier than the choice or equally cheap with "
           "lower precision)" if result.count("not simulated") else "")
        + f"; {result.seconds:.1f} s",
        "",
        f"Pareto front of the simulated deployments (cost vs p{q} latency):",
    ]
    head = f"  {'$/h':>7} {'GPUs':>4}  " + "".join(f"{k.upper() + ' p' + str(q) + ' ms':>14}" for k in keys)
    head += f"  {'meets':<5} {'$/M out':>8}  deployment"
    lines.append(head)
    front = result.pareto_front()
    for e in front:
        cells = "".join(f"{_ms(e.latency[k]):>14}" for k in keys)
        lines.append(f"  {e.candidate.cost_per_hour:>7.2f} {e.candidate.num_gpus:>4}  {cells}  "
                     f"{'yes' if e.meets else 'no':<5} {e.cost_per_million_output_tokens:>8.3f}"
                     f"{'*' if e.saturated else ' '} {e.candidate.label()}")
    offered = next((e.load.offered for e in front if e.load is not None and math.isfinite(e.load.offered)), NAN)
    if math.isfinite(offered):
        lines.append(f"$/M out: USD per million output tokens at the offered {offered:,.0f} output tok/s"
                     + ("; *: saturated, at the rate it served in the second half of the arrival window"
                        if any(e.saturated for e in front) else ""))
    lines.append("")
    ch = result.chosen
    if ch is None:
        lines.append("no deployment in the space meets the SLOs: widen plan (more GPUs, other GPUs or dtypes) or "
                     "relax the SLOs")
    else:
        c = ch.candidate
        lat = ", ".join(f"p{q} {k.upper()} {_ms(ch.latency[k])} ms (SLO {_ms(result.slos[k])} ms)" for k in keys)
        lines += [
            f"chosen: {c.label()}",
            f"  {c.num_gpus} GPU(s) at ${c.gpu_price_per_hour:.2f}/h = ${c.cost_per_hour:.2f}/h; {lat}",
            f"  {_load_text(ch)}: ${ch.cost_per_million_output_tokens:.3f} per million output tokens"
            + ("" if not math.isfinite(ch.j_per_output_token) else f", {ch.j_per_output_token:.4f} J per output token"),
        ]
        lines += _confidence_lines(result, ch)
        fj = result.fewest_joules()
        if fj is not None and fj is not ch:
            c2 = fj.candidate
            lines.append(f"fewest joules per output token among the simulated deployments that meet the SLOs: "
                         f"{c2.label()}, {fj.j_per_output_token:.4f} J at ${c2.cost_per_hour:.2f}/h")
        be = result.break_even
        if be is not None:
            cheaper = be.load_output_tokens_per_hour >= be.break_even_output_tokens_per_hour
            lines += [
                (f"break-even against the API (${be.api_input_per_million:g}/M input, ${be.api_output_per_million:g}"
                f"/M output; {be.input_per_output:.2f} input tokens per output token: ${be.api_per_million_output:.3f}"
                f" per M output tokens):"),
                f"  self-hosting is cheaper above {be.break_even_output_tokens_per_hour / 1e6:.3f} M output "
                f"tokens/hour ({be.break_even_requests_per_second:.3g} req/s of this workload); at "
                + ("the" if ch.saturated else "the scenario's")
                + f" {be.load_output_tokens_per_hour / 1e6:.3f} M/hour"
                + (" it serves" if ch.saturated else "")
                + f" it costs ${be.cost_per_hour:.2f}/h against "
                f"${be.api_cost_per_hour_at_load:.2f}/h for the API: "
                + ("self-hosting is cheaper" if cheaper else "the API is cheaper"),
            ]
    for note in result.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
