"""What ``servesim plan`` reports (sim/studies/planner.py searches): each candidate deployment, its evaluation (the
bound or the simulation that settled it, latency, price per token at the offered load), the break-even volume
against an API, and the plan's result with its Pareto front.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.hardware.dtypes import DTYPE_BITS
from sim.metrics.intervals import bounds
from sim.metrics.records import RunResult

NAN = float("nan")
SLO_METRICS = ("ttft", "tpot", "e2el")
# Served over offered output rate, in the second half of the arrival window, below this: the deployment cannot keep
# up. One that keeps up serves what arrives there less the growth of its in-flight work, which fills for about the
# longest request's latency: plan-chat's 2 x L40S measured 0.90-0.92 at 400 requests, 0.98-1.01 from 1,000 on;
# one that cannot serves its capacity, a ratio that does not rise with more requests (one L40S with max_num_seqs
# 64: 0.61-0.73 at 200 to 2,000 requests).
# Saturated also needs the waiting queue (vLLM's num_requests_waiting: arrived, not yet scheduled) to grow there, by
# more than (1 - KEEPS_UP) of the requests arriving, as the run verdict's overload test does (sim/metrics/verdict.py).
# The output ratio alone cannot tell a short run's filling from overload: with a half window shorter than the
# requests' lifetime, in-flight work grows in both (plan-chat at 200 requests: 6 s against an e2el p90 of 9-15 s;
# 2 x L40S served 0.82-0.86 of what arrived though it serves 1.01 at 2,000 requests). Its waiting queue did not
# grow (101 of the 103 arriving scheduled there), while one L40S with max_num_seqs 64, which cannot keep up (p99
# TTFT 2.7 s, 50 s at 2,000 requests), scheduled 70. An overload absorbed by a batch still growing (slower decode,
# no queue yet) is not flagged: the run is too short to show it.
KEEPS_UP = 0.85

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
    there by about one request's latency whatever its capacity. ``run``: the run's throughput, drain included (the
    fallback without a window). ``arrived_late`` and ``scheduled_late``: the requests that arrived, and those first
    scheduled, in that second half. ``saturated``: served below ``KEEPS_UP`` x offered_late and scheduled below
    ``KEEPS_UP`` x arrived_late, its output falls behind and its waiting queue grows (why both: ``KEEPS_UP``).
    """

    offered: float
    served: float
    offered_late: float
    run: float
    arrived_late: int = 0
    scheduled_late: int = 0

    @property
    def saturated(self) -> bool:
        return (self.served < KEEPS_UP * self.offered_late
                and self.scheduled_late < KEEPS_UP * self.arrived_late)

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
    scheduled = np.array([r.first_scheduled for r in reqs], dtype=np.float64)
    scheduled_late = int(np.sum((scheduled > mid) & (scheduled <= t1)))  # -1: never scheduled
    return OutputLoad(offered, (produced_by(t1) - produced_by(mid)) / half, float(target[late].sum()) / half,
                      run_throughput, int(late.sum()), scheduled_late)


def steady_joules_per_token(result: RunResult, load: OutputLoad, run_value: float) -> float:
    """Joules per output token in the second half of the arrival window, where ``load.served`` is measured: the
    run's energy over all its output counted the drain after the last arrival, a batch emptying while every GPU
    stays up, so it rose as the run shortened (plan-chat's two L40S: 0.208 J at 400 requests, 0.151 J at 4,000;
    0.144 J in that window at both). ``run_value`` (the run's figure) without a window; NaN without power."""
    if not math.isfinite(run_value):
        return NAN
    arrival = np.array([r.arrival for r in result.requests], dtype=np.float64)
    if arrival.size < 2 or not load.served > 0:
        return run_value
    from sim.costs.energy_time import energy_between

    t0, t1 = float(arrival.min()), float(arrival.max())
    joules = energy_between(result, (t0 + t1) / 2, t1)
    return run_value if joules is None else joules / (load.served * (t1 - t0) / 2)


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
    max_request_rate: float = NAN  # req/s it completes with a backlog (plan_capacity.py); NaN: not measured
    mean_e2el: float = NAN  # simulated mean E2EL, seconds: a request's lifetime, where no SLO bounds it (planner)

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
            "max_request_rate": num(self.max_request_rate),
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


def fewest_joules(evaluations: list[Evaluation], chosen: Evaluation | None) -> Evaluation | None:
    """Of the simulated ``evaluations`` that meet the SLOs, the one with the fewest joules per output token, the
    cheaper on a tie; a tie with ``chosen`` is ``chosen`` (not whichever the search met first). None: none meets
    them with a power model (a GPU without power figures has NaN joules)."""
    ok = [e for e in evaluations if e.simulated and e.meets and math.isfinite(e.j_per_output_token)]
    return min(ok, key=lambda e: (e.j_per_output_token, e.candidate.cost_per_hour, e is not chosen), default=None)


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
    objective: str = "cost"  # what the choice minimises (plan.objective): "cost" or "joules"
    cheapest: Evaluation | None = None  # the cheapest deployment meeting the SLOs (the choice under "cost")

    def count(self, status: str, bound: str | None = None) -> int:
        return sum(1 for e in self.evaluations if e.status == status and (bound is None or e.bound == bound))

    @property
    def simulated(self) -> list[Evaluation]:
        return [e for e in self.evaluations if e.simulated]

    def fewest_joules(self) -> Evaluation | None:
        """Of the simulated deployments that meet the SLOs, the one with the fewest joules per output token (the
        cheaper on a tie). With ``stop_early`` the search simulates nothing costlier than the choice, so this is
        among the deployments as cheap as the choice; ``stop_early: false`` weighs the whole space."""
        return fewest_joules(self.evaluations, self.chosen)

    def cheapest_80(self) -> Evaluation | None:
        """The cheapest simulated deployment that meets the SLOs with 80% confidence (``Evaluation.meets_80``),
        higher precision first on a tie. With ``stop_early`` nothing costlier than the choice was simulated."""
        ok = [e for e in self.simulated if e.meets_80]
        return min(ok, key=lambda e: (e.candidate.cost_per_hour, tuple(-p for p in e.candidate.precision),
                                      e is not self.chosen), default=None)  # a tie with the choice: the choice

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
        pruned or skipped one too), with the ``units`` of their numbers (``PLAN_UNITS``)."""
        out = {
            "scenario": self.scenario,
            "units": PLAN_UNITS,
            "percentile": self.percentile,
            "slos": self.slos,
            "objective": self.objective,
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
        if self.objective != "cost":  # the cheapest deployment meeting the SLOs, beside the choice
            out["cheapest"] = None if self.cheapest is None else self.cheapest.to_dict()
        if all_evaluations:
            out["evaluations"] = [e.to_dict() for e in self.evaluations]
        return out


# The unit of every number ``PlanResult.to_dict`` writes, by key (a deployment's keys, ``break_even.*``), as
# summary.json's ``units`` block names its own: the latencies are seconds, as the scenario's slos.
PLAN_UNITS: dict[str, str] = {
    "percentile": "percent", "slos": "s", "seconds": "s (the search's wall time)",
    "tensor_parallel_size": "GPUs", "pipeline_parallel_size": "GPUs", "replicas": "replicas", "num_gpus": "GPUs",
    "max_num_seqs": "requests", "gpu_price_per_hour": "USD/h per GPU", "cost_per_hour": "USD/h",
    "lower_bounds": "s", "latency": "s", "latency_80_high": "s",
    "utilization_bound": "fraction (above 1: the queue grows without bound)",
    "output_throughput": "tokens/s", "offered_output_rate": "tokens/s", "served_output_rate": "tokens/s",
    "output_rate": "tokens/s", "cost_per_million_output_tokens": "USD per million output tokens",
    "j_per_output_token": "J per output token", "max_request_rate": "requests/s", "num_completed": "requests",
    "num_requests": "requests",
    "break_even.api_input_per_million": "USD per million input tokens",
    "break_even.api_output_per_million": "USD per million output tokens",
    "break_even.input_per_output": "input tokens per output token",
    "break_even.api_per_million_output": "USD per million output tokens", "break_even.cost_per_hour": "USD/h",
    "break_even.break_even_output_tokens_per_hour": "tokens/h",
    "break_even.break_even_requests_per_second": "requests/s",
    "break_even.load_output_tokens_per_hour": "tokens/h", "break_even.api_cost_per_hour_at_load": "USD/h",
}


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a`` is at most ``b`` everywhere and below it somewhere."""
    pairs = list(zip(a, b, strict=True))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


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
