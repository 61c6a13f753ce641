"""A tournament of scheduling policies over load: which policy wins at which load, and by how much over seeds.

    servesim tournament SPEC.yaml --out DIR [--executor local|ray] [--workers N] [--address ADDR] [--fresh]

A tournament is a sweep (``sim.studies.sweep``) whose variants are the policies and whose axes are the load and the
seed:
every policy runs on the scenario at every (load, seed), on the very same requests (the workload is drawn from
the scenario's workload section and the seed alone, so the policy cannot change it; each row carries a digest of
the requests its run simulated, the ``workload`` column, which the tests compare across policies). The runs fan
out on the sweep's executors (a local process pool, Ray), stream to ``DIR/sweep.csv`` as they finish, and an
interrupted tournament resumes where it stopped. At the end each run is scored (the fitness below), the seeds
of each (load, policy) are reduced to their mean, standard deviation, min and max, the best mean fitness at each
load wins it, and ``DIR/tournament.csv``, ``tournament.json`` and ``tournament.html`` (offline plotly) are written.

The spec (``TournamentSpec``, unknown keys refused)::

    name: priority-vs-fcfs                 # optional; default: the spec file's name
    scenario: ../scenarios/classes-priority.yaml   # a path (relative to this file) or the scenario inline
    num_requests: 300                      # optional: overrides the scenario's workload.num_requests
    policies:                              # name: a policy section, as a scenario's ``policy:`` is written
      fcfs: {type: continuous, max_num_seqs: 32}
      priority: {type: priority, max_num_seqs: 32}
      mine: {type: custom, cls: my_policies.py:ShortestFirst, args: {aging: 0.5}}   # a path relative to this file
      sjf: sjf                             # a bare kind: {type: sjf}; a bare "file.py:Class": a user's class
    loads: {multiplier: [0.5, 1.0, 1.5]}   # x the scenario's arrival rate; or {rate: [4, 8, 12]} in requests/s
    seeds: [0, 1, 2]                       # default: [0]
    fitness:
      weights: {throughput: 1, p99_ttft: 1, p99_e2e: 1}    # the default
      reference: {latency: 1.0, tpot: 0.05, requests_per_s: 100, tokens_per_s: 10000}   # the defaults

The scenario's own ``variants`` and ``sweep`` are not run: the policies replace the variants (each runs the
scenario's deployment, KV cache, admission and cluster sections) and the loads and seeds are the sweep. A load
sets the arrival's ``rate`` (poisson, gamma, constant) or, for a multiplier on a trace, its ``rate_scale``.

Fitness is BLIS's (inference-sim ``ComputeFitness``): the weighted sum of metrics each mapped to [0, 1], a
higher-is-better figure as ``v / (v + reference)``, a lower-is-better one as ``1 / (1 + v / reference)``, a
fraction as it is; a metric a run has none of (no request completed, no SLOs) scores 0, the worst. Keys:

=================  ======================================  ==============================
key                metric of the run's summary             mapped with
=================  ======================================  ==============================
throughput         request_throughput (requests/s)         reference.requests_per_s
tokens_per_sec     output_throughput (tokens/s)            reference.tokens_per_s
goodput            goodput (requests/s within SLOs)        reference.requests_per_s
p50_ttft ...       ttft.p50 / p99 / mean (s)               reference.latency
p50_e2e ...        e2el.p50 / p99 / mean (s)               reference.latency
p50_tpot ...       tpot.p50 / p99 / mean (s)               reference.tpot
slo_attainment     slo_attainment (fraction)               as it is
jain_index         fairness.jain_index (see below)         as it is
=================  ======================================  ==============================

BLIS's keys are the first eight (throughput, tokens_per_sec, and p50/p99/mean of TTFT and E2E); goodput, TPOT,
SLO attainment and Jain's index are servesim's. BLIS's latency reference is 1 ms, the scale of its routing
decisions; an LLM's TTFT and E2EL are seconds, where 1 ms maps every latency below 0.001 and throughput alone
decides, so servesim's default is 1 s (TPOT, tens of milliseconds, has its own: 50 ms). Its throughput
references are BLIS's. Weights are finite and >= 0, not all 0; goodput and slo_attainment need SLOs in the
scenario, jain_index tenants. jain_index is Jain's index of the tenants' service while backlogged, or of their
shares of demand served where that is lower (a tenant whose every request is refused is never backlogged).
"""

from __future__ import annotations

import csv
import html
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.config.files import read_text_capped
from sim.config.scenario import _resolve_relative_paths, apply_override, load_scenario, parse_scenario, variant_configs
from sim.config.scenario_messages import format_validation, yaml_error
from sim.config.schema import Scenario, ScenarioError
from sim.config.yaml_limits import MAX_SCENARIO_BYTES, safe_load_limited, unshared
from sim.studies.sweep import METRICS, WORKLOAD, column, read_rows, run_sweep
from sim.words import counted
from sim.workload.arrivals import TraceArrival

# fitness key -> (sweep.csv column, how it maps to [0, 1]: the reference it is divided by, "" for a fraction)
FITNESS_KEYS: dict[str, tuple[str, str, bool]] = {  # (column, reference, higher is better)
    "throughput": ("request_throughput", "requests_per_s", True),
    "tokens_per_sec": ("output_throughput", "tokens_per_s", True),
    "goodput": ("goodput", "requests_per_s", True),
    **{f"{q}_{k}": (column(f"{m}.{q}"), ref, False)
       for k, m, ref in (("ttft", "ttft", "latency"), ("e2e", "e2el", "latency"), ("tpot", "tpot", "tpot"))
       for q in ("p50", "p99", "mean")},
    "slo_attainment": ("slo_attainment", "", True),
    "jain_index": ("fairness.jain_index", "", True),
}
DEFAULT_WEIGHTS = {"throughput": 1.0, "p99_ttft": 1.0, "p99_e2e": 1.0}
_NEEDS_SLOS = ("goodput", "slo_attainment")
# each class's figures kept in the rows (a class name of letters, digits, '_' and '-' only: the column names it)
CLASS_METRICS = ("ttft.p50", "ttft.p99", "e2el.p99", "goodput", "slo_attainment")
_CLASS_NAME = re.compile(r"[A-Za-z0-9_-]+")
_POLICY_NAME = re.compile(r"[^\s\[\],=]+")  # a policy's name is a variant's, inside the sweep's run keys


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Reference(_Strict):
    """The scales at which a metric maps to 0.5 (see the module's notes)."""

    latency: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="Seconds, for TTFT and E2EL.")
    tpot: float = Field(default=0.05, gt=0, allow_inf_nan=False, description="Seconds, for TPOT.")
    requests_per_s: float = Field(default=100.0, gt=0, allow_inf_nan=False, description="For throughput, goodput.")
    tokens_per_s: float = Field(default=10_000.0, gt=0, allow_inf_nan=False, description="For tokens_per_sec.")


class Fitness(_Strict):
    weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_WEIGHTS),
                                      description="Fitness key: weight (finite, >= 0).")
    reference: Reference = Field(default_factory=Reference)

    @field_validator("weights")
    @classmethod
    def _known(cls, w: dict[str, float]) -> dict[str, float]:
        for k, v in w.items():
            if k not in FITNESS_KEYS:
                raise ValueError(f"unknown fitness key {k!r}; the keys: {', '.join(FITNESS_KEYS)}")
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"the weight of {k} must be finite and >= 0, got {v}")
        if not any(w.values()):
            raise ValueError("give at least one weight above 0")
        return w


class Loads(_Strict):
    rate: list[float] | None = Field(default=None, description="Arrival rates in requests per second.")
    multiplier: list[float] | None = Field(default=None, description="Multiples of the scenario's arrival rate.")

    @model_validator(mode="after")
    def _one(self) -> Loads:
        given = [v for v in (self.rate, self.multiplier) if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of rate (requests/s) or multiplier (x the scenario's rate)")
        values = given[0]
        if not values:
            raise ValueError("give at least one load")
        if any(not (math.isfinite(v) and v > 0) for v in values):
            raise ValueError(f"loads must be finite and > 0, got {values}")
        if len(set(values)) != len(values):
            raise ValueError(f"loads must differ, got {values}")
        return self

    @property
    def values(self) -> list[float]:
        return list(self.rate if self.rate is not None else self.multiplier or [])


class TournamentSpec(_Strict):
    name: str | None = Field(default=None, min_length=1, description="Default: the spec file's name.")
    scenario: str | dict[str, Any] = Field(description="A scenario file (relative to the spec) or one inline.")
    num_requests: int | None = Field(default=None, ge=1, description="Overrides workload.num_requests.")
    policies: dict[str, dict[str, Any]] = Field(description="Name: a policy section, as a scenario writes it.")
    loads: Loads
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="Workload seeds.")
    fitness: Fitness = Field(default_factory=Fitness)

    @field_validator("policies", mode="before")
    @classmethod
    def _bare(cls, p: Any) -> Any:
        # `fcfs: fcfs` (a name and the kind it runs) was refused as "expected a mapping": a bare kind is its
        # section, a bare 'file.py:Class' a user's class
        if not isinstance(p, dict):
            return p
        return {k: ({"type": "custom", "cls": v} if ":" in v else {"type": v}) if isinstance(v, str) else v
                for k, v in p.items()}

    @field_validator("policies")
    @classmethod
    def _names(cls, p: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if not p:
            raise ValueError("give at least one policy")
        for name in p:
            if not _POLICY_NAME.fullmatch(name):
                raise ValueError(f"policy name {name!r}: no spaces, brackets, commas or '='")
        return p

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, s: list[int]) -> list[int]:
        if any(x < 0 for x in s) or len(set(s)) != len(s):
            raise ValueError(f"seeds must be distinct and >= 0, got {s}")
        return s


@dataclass
class Tournament:
    """A checked spec: the tournament as a scenario whose variants are the policies and whose sweep is
    (load key, seed), ready for ``run_sweep``."""

    name: str
    source: str
    spec: TournamentSpec
    scenario: Scenario  # variants: the policies; sweep: {load_key: rates, "seed": seeds}
    raw: dict[str, Any]
    load_key: str  # the swept key: workload.arrival.rate or .rate_scale
    loads: list[float]  # as the spec gives them
    rates: list[float]  # the values set at load_key, one per load
    unit: str  # "x" (multiplier) or "req/s"
    metrics: tuple[str, ...] = field(default=METRICS)
    # each policy's step limits as built: (max_num_seqs, max_num_batched_tokens)
    limits: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def policies(self) -> list[str]:
        return list(self.spec.policies)

    def load_label(self, load: float) -> str:
        return f"x{load:g}" if self.unit == "x" else f"{load:g} req/s"


def tournament_shape(t: Tournament) -> str:
    """"4 policies x 8 loads x 3 seeds", each count with its noun in its number ("1 seed", not "1 seeds")."""
    return (f"{counted(len(t.policies), 'policy', 'policies')} x {counted(len(t.loads), 'load')} x "
            f"{counted(len(t.spec.seeds), 'seed')}")


def _fail(source: str, message: str) -> ScenarioError:
    return ScenarioError(f"{source}: {message}")


def load_spec(path: str | os.PathLike) -> Tournament:
    """Read and check a tournament spec; every policy is built once here, so a bad one fails before any run.
    Raises ScenarioError with one message."""
    p = Path(path)
    source = str(p)
    if not p.is_file():
        raise _fail(source, "tournament spec not found" if not p.exists() else "not a file")
    try:
        raw = safe_load_limited(read_text_capped(p, MAX_SCENARIO_BYTES, "a tournament spec"))
    except yaml.YAMLError as e:
        raise _fail(source, f"not valid YAML: {yaml_error(e)}") from None
    except (OSError, ValueError) as e:
        raise _fail(source, str(e)) from None
    if not isinstance(raw, dict):
        raise _fail(source, "a tournament spec is a mapping (scenario, policies, loads, seeds, fitness)")
    if "workload" in raw and "policies" not in raw:  # five lines of missing and unknown keys said it less plainly
        raise _fail(source, "a scenario, not a tournament spec: run it with servesim run, or name it in a spec's "
                    "scenario key beside policies and loads (examples/tournaments/priority-vs-fcfs.yaml)")
    try:
        spec = TournamentSpec.model_validate(unshared(raw))
    except ValidationError as e:
        raise ScenarioError(format_validation(e, source, raw, model=TournamentSpec)) from None
    return check_spec(spec, base=p.parent, source=source, name=spec.name or p.stem)


def check_spec(spec: TournamentSpec, *, base: Path, source: str, name: str) -> Tournament:
    """The spec against its scenario: the load key, each policy built, the fitness keys' needs."""
    from sim.loop.build import build
    from sim.loop.run import check_workload_fits_policy, generate_workload

    overrides = {} if spec.num_requests is None else {"workload.num_requests": spec.num_requests}
    if isinstance(spec.scenario, str):
        sc, sc_raw = load_scenario(base / spec.scenario, overrides)
    else:
        sc_raw = unshared(spec.scenario)
        for k, v in overrides.items():
            apply_override(sc_raw, k, v)
        _resolve_relative_paths(sc_raw, base)
        sc = parse_scenario(sc_raw, source=f"{source}: scenario")
    arrival = sc.workload.arrival
    if isinstance(arrival, TraceArrival):
        if spec.loads.rate is not None:
            raise _fail(source, "loads.rate: the scenario's arrivals are a trace; give loads.multiplier (x its rate)")
        key, base_value = "workload.arrival.rate_scale", arrival.rate_scale
    elif hasattr(arrival, "rate"):
        key, base_value = "workload.arrival.rate", float(arrival.rate)
    else:
        raise _fail(source, f"loads: the scenario's arrival ({arrival.type}) has no rate to set")
    loads = spec.loads.values
    rates = loads if spec.loads.rate is not None else [base_value * m for m in loads]
    common = {k: v for k, v in sc_raw.items() if k not in ("variants", "sweep", "policy")}
    variants = []
    limits: dict[str, tuple[int, int]] = {}
    for pname, section in spec.policies.items():
        holder = {"policy": unshared(section)}
        _resolve_relative_paths(holder, base)  # a user's cls: relative to the spec
        where = f"{source}: policies.{pname}"
        try:
            one = parse_scenario({**common, **holder}, source=where, warn_units=False)
            cfg = variant_configs(one)[0]
            built = build(cfg)[3]
            limits[pname] = (built.limits.max_num_seqs, built.limits.max_num_batched_tokens)
            if getattr(cfg.policy, "tenant_weights", None):  # names tenants: the requests must have them
                check_workload_fits_policy(one, cfg, generate_workload(one))
        except ScenarioError as e:
            raise ScenarioError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
        variants.append({"name": pname, **holder})
    classes = sc.workload.classes or []
    weights = spec.fitness.weights
    has_slos = sc.slos is not None or any(c.slo.ttft is not None or c.slo.tpot is not None for c in classes)
    for k in _NEEDS_SLOS:
        if weights.get(k) and not has_slos:
            raise _fail(source, f"fitness.weights.{k}: the scenario has no SLOs (slos:, or a class's slo:)")
    # a trace's tenants are its column's, known once read: without any, every policy scored 0 and "won" tied
    if weights.get("jain_index") and not any(c.tenant for c in classes) and not (
            isinstance(arrival, TraceArrival) and any(r.tenant for r in generate_workload(sc).requests)):
        raise _fail(source, "fitness.weights.jain_index: the scenario's requests have no tenants (a class's tenant:, "
                    "or a trace's tenant column)")
    t_raw = {**common, "variants": variants, "sweep": {key: rates, "seed": list(spec.seeds)}}
    scenario = parse_scenario(t_raw, source=source, warn_units=False)
    extra = ["fairness.jain_index", *ANOMALIES, WORKLOAD]
    extra += [f"classes.{c.name}.{m}" for c in classes if _CLASS_NAME.fullmatch(c.name) for m in CLASS_METRICS]
    return Tournament(name, source, spec, scenario, t_raw, key, loads, rates,
                      "req/s" if spec.loads.rate is not None else "x", (*METRICS, *extra), limits)


def limits_note(t: Tournament) -> str | None:
    """A line when the policies ran with different step limits, or None. A bare kind or file ("sjf",
    "mine.py:Mine") takes its kind's defaults (256 sequences), so beside "fcfs: {max_num_seqs: 32}" it won on
    eight times the batch slots, and the table read as a better order."""
    parts = []
    for i, key in enumerate(("max_num_seqs", "max_num_batched_tokens")):
        by: dict[int, list[str]] = {}
        for name, lim in t.limits.items():
            by.setdefault(lim[i], []).append(name)
        if len(by) > 1:
            parts.append(f"{key} " + ", ".join(f"{v:,} ({', '.join(names)})" for v, names in sorted(by.items())))
    if not parts:
        return None
    return ("note: the policies ran with different step limits, so more than their order differs: "
            + "; ".join(parts) + ". Give every policy section the same (a bare kind or file takes its defaults)")


# ---- scoring -----------------------------------------------------------------------------------------------------
def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def fitness_of(row: dict[str, Any], fit: Fitness) -> float:
    """A run's fitness (see the module's notes) from its sweep.csv row."""
    ref = fit.reference.model_dump()
    score = 0.0
    for k, w in fit.weights.items():
        col, scale, higher = FITNESS_KEYS[k]
        v = _num(row.get(col))
        if not math.isfinite(v) or v < 0:
            part = 0.0  # none of it (nothing completed, no SLOs): the worst
        elif not scale:
            part = v
        elif higher:
            part = v / (v + ref[scale])
        else:
            part = 1.0 / (1.0 + v / ref[scale])
        score += w * part
    return score


@dataclass(frozen=True)
class Spread:
    """One figure of a (load, policy) over its seeds."""

    mean: float
    std: float  # sample standard deviation (0 with one seed)
    min: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        xs = [v for v in values if math.isfinite(v)]
        if not xs:
            return Spread(math.nan, math.nan, math.nan, math.nan)
        m = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        return Spread(m, sd, min(xs), max(xs))


# (label, sweep.csv column, scale for display): what the table, the page and tournament.csv show
SHOWN: tuple[tuple[str, str, float], ...] = (
    ("fitness", "fitness", 1.0),
    ("goodput (req/s)", "goodput", 1.0),
    ("throughput (req/s)", "request_throughput", 1.0),
    ("TTFT p50 (ms)", column("ttft.p50"), 1e3),
    ("TTFT p99 (ms)", column("ttft.p99"), 1e3),
    ("TPOT p50 (ms)", column("tpot.p50"), 1e3),
    ("TPOT p99 (ms)", column("tpot.p99"), 1e3),
    ("E2EL p50 (s)", column("e2el.p50"), 1.0),
    ("E2EL p99 (s)", column("e2el.p99"), 1.0),
    ("Jain index", "fairness.jain_index", 1.0),
)


@dataclass
class Standing:
    """One policy at one load: each SHOWN figure over the seeds."""

    load: float
    rate: float
    policy: str
    seeds: int
    figures: dict[str, Spread]  # by SHOWN column
    winner: bool = False
    ties: list[str] = field(default_factory=list)  # the winner's: policies of the very same mean fitness


# the anomaly counters of every run's summary (sim/metrics/anomalies.py) the rows keep: (label, summary key)
ANOMALY_FIGURES = (("priority inversions", "anomalies.inversions.count"),
                   ("longest wait (s)", "anomalies.starvation.longest_wait"))
ANOMALIES = tuple(key for _, key in ANOMALY_FIGURES)


def figures_of(t: Tournament) -> tuple[tuple[str, str, float], ...]:
    """SHOWN, the anomaly counters and each class's TTFT p99 (the figures a priority or fairness policy moves)."""
    anomalies = tuple((label, column(key), 1.0) for label, key in ANOMALY_FIGURES)
    classes = tuple((f"TTFT p99 {m.split('.')[1]} (ms)", column(m), 1e3) for m in t.metrics
                    if m.startswith("classes.") and m.endswith(".ttft.p99"))
    return SHOWN + anomalies + classes


def standings(t: Tournament, rows: Sequence[dict[str, Any]]) -> list[Standing]:
    """Every (load, policy), in the spec's order, with the winner of each load marked: the best mean fitness
    (a tie goes to the policy listed first; ``ties`` names the others)."""
    by: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((_num(r.get(t.load_key)), str(r["variant"])), []).append(r)
    out: list[Standing] = []
    for load, rate in zip(t.loads, t.rates, strict=True):
        here = []
        for p in t.policies:
            rs = by.get((rate, p), [])
            figs = {col: Spread.of([fitness_of(r, t.spec.fitness) if col == "fitness" else _num(r.get(col))
                                    for r in rs]) for _, col, _ in figures_of(t)}
            here.append(Standing(load, rate, p, len(rs), figs))
        best = None
        for s in here:
            f = s.figures["fitness"].mean
            if math.isfinite(f) and (best is None or f > best.figures["fitness"].mean):
                best = s
        if best is not None:
            best.winner = True
            best.ties = [s.policy for s in here if s is not best and s.figures["fitness"].mean ==
                         best.figures["fitness"].mean]
        out.extend(here)
    return out


def _shown(sts: Sequence[Standing], figures: Sequence[tuple[str, str, float]] = SHOWN
           ) -> list[tuple[str, str, float]]:
    """The figures less those no run has (goodput without SLOs, Jain's index without tenants); throughput only
    where goodput is missing."""
    have = {col for s in sts for col, sp in s.figures.items() if math.isfinite(sp.mean)}
    return [x for x in figures if x[1] in have and not (x[1] == "request_throughput" and "goodput" in have)]


def _cell(sp: Spread, scale: float) -> str:
    if not math.isfinite(sp.mean):
        return "-"
    m, s = sp.mean * scale, sp.std * scale
    digits = 3 if abs(m) < 10 else 1 if abs(m) < 1000 else 0
    return f"{m:,.{digits}f} ±{s:,.{digits}f}"


def format_standings(t: Tournament, sts: Sequence[Standing]) -> str:
    """The terminal table: a row per (load, policy), each figure as its mean ± standard deviation over the
    seeds, the winner of each load marked ``*``; then the winners in one line."""
    from sim.output.table import format_cells

    shown = _shown(sts)
    header = ["load", "policy", *(label for label, _, _ in shown)]
    cells = []
    last = None
    for s in sts:
        label = t.load_label(s.load) if s.load != last else ""
        last = s.load
        cells.append([label, s.policy + (" *" if s.winner else ""), *(_cell(s.figures[c], k) for _, c, k in shown)])
    seeds = len(t.spec.seeds)
    text = format_cells(header, cells)
    text += (f"mean ±standard deviation over {seeds} seed(s); * the best mean fitness at its load "
             f"(weights: {', '.join(f'{k} {v:g}' for k, v in t.spec.fitness.weights.items())})\n")
    text += "winner per load: " + ", ".join(
        f"{t.load_label(s.load)} {s.policy}" + (f" (tied with {', '.join(s.ties)})" if s.ties else "")
        for s in sts if s.winner) + "\n"
    note = limits_note(t)
    return text + (f"{note}\n" if note else "")


# ---- writing -----------------------------------------------------------------------------------------------------
def write_standings_csv(path: Path, t: Tournament, sts: Sequence[Standing]) -> Path:
    figs = figures_of(t)
    cols = ["load", t.load_key, "policy", "seeds", "winner"]
    won = {p for s in sts if s.winner for p in (s.policy, *s.ties)}  # a tie's policies each won
    for _, c, _ in figs:
        cols += [f"{c}.{k}" for k in ("mean", "std", "min", "max")]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for s in sts:
            row: list[Any] = [s.load, s.rate, s.policy, s.seeds, int(s.policy in won)]
            for _, c, _ in figs:
                sp = s.figures[c]
                row += ["" if not math.isfinite(x) else repr(x) for x in (sp.mean, sp.std, sp.min, sp.max)]
            w.writerow(row)
    return path


def write_standings_html(path: Path, t: Tournament, sts: Sequence[Standing]) -> Path:
    """The page: the winners, one panel per figure against load (a line per policy at its mean over seeds, the
    bars its min and max), and the table."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sim.output.report.common import TEMPLATE, color

    shown = _shown(sts, figures_of(t))
    cols_n = 3
    rows_n = math.ceil(len(shown) / cols_n)
    fig = make_subplots(rows=rows_n, cols=cols_n, subplot_titles=[label for label, _, _ in shown],
                        horizontal_spacing=0.07, vertical_spacing=0.12)
    x_title = "load (x the scenario's rate)" if t.unit == "x" else "arrival rate (req/s)"
    for pi, p in enumerate(t.policies):
        mine = [s for s in sts if s.policy == p]
        xs = [s.load for s in mine]
        for i, (label, c, k) in enumerate(shown):
            sp = [s.figures[c] for s in mine]
            fig.add_trace(go.Scatter(
                x=xs, y=[v.mean * k for v in sp], name=p, legendgroup=p, showlegend=i == 0, mode="lines+markers",
                line=dict(color=color(pi)),
                error_y=dict(type="data", symmetric=False, array=[(v.max - v.mean) * k for v in sp],
                             arrayminus=[(v.mean - v.min) * k for v in sp], thickness=1),
                hovertemplate=f"{html.escape(p)}<br>load %{{x}}<br>{html.escape(label)}: %{{y:.4g}}<extra></extra>"),
                row=i // cols_n + 1, col=i % cols_n + 1)
            fig.update_xaxes(title_text=x_title, row=i // cols_n + 1, col=i % cols_n + 1)
    fig.update_layout(template=TEMPLATE, height=330 * rows_n, hovermode="closest",
                      title="Each policy against load: mean over seeds, bars from min to max")
    winners = "".join(f"<tr><td>{html.escape(t.load_label(s.load))}</td><td>"
                      f"{html.escape(', '.join([s.policy, *s.ties]) + (' (tie)' if s.ties else ''))}</td>"
                      f"<td>{s.figures['fitness'].mean:.4f}</td></tr>" for s in sts if s.winner)
    head = "".join(f"<th>{html.escape(x)}</th>" for x in ["load", "policy", *(lb for lb, _, _ in shown)])
    body = "".join(
        "<tr" + (" class='win'" if s.winner else "") + f"><td>{html.escape(t.load_label(s.load))}</td>"
        f"<td>{html.escape(s.policy)}</td>" + "".join(f"<td>{html.escape(_cell(s.figures[c], k))}</td>"
                                                      for _, c, k in shown) + "</tr>" for s in sts)
    fit = t.spec.fitness
    notes = (f"<p>Scenario <b>{html.escape(t.scenario.name)}</b>; {html.escape(tournament_shape(t))} "
             f"(seeds {', '.join(map(str, t.spec.seeds))}): every policy served the "
             f"very same requests at each (load, seed). Fitness weights: "
             f"{html.escape(', '.join(f'{k} {v:g}' for k, v in fit.weights.items()))}; references: "
             f"{html.escape(', '.join(f'{k} {v:g}' for k, v in fit.reference.model_dump().items()))}.</p>")
    if (note := limits_note(t)) is not None:
        notes += f"<p><b>{html.escape(note)}</b></p>"
    style = ("body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse;font-size:12px;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} tr.win{font-weight:bold;"
             "background:#eef6ee}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(t.name)} tournament</title>"
            f"<style>{style}</style></head><body><h1>servesim tournament: {html.escape(t.name)}</h1>{notes}"
            f"<h2>Winner per load</h2><table><tr><th>load</th><th>policy</th><th>fitness</th></tr>{winners}</table>"
            + fig.to_html(full_html=False, include_plotlyjs=True)
            + f"<h2>Every policy at every load</h2><p>Mean ±standard deviation over the seeds.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>\n")
    path.write_text(page)
    return path


@dataclass
class TournamentOutcome:
    out_dir: Path
    standings: list[Standing]
    runs: int
    ran: int
    resumed: int


def run_tournament(
    t: Tournament,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    fresh: bool = False,
    progress: Callable[[int, int], None] | None = None,
    checking: Callable[[int, int], None] | None = None,
) -> TournamentOutcome:
    """Run every (policy, load, seed) not already in ``out_dir`` on the sweep's executors, then score them and
    write tournament.csv, tournament.json and tournament.html beside the runs' sweep.csv."""
    res = run_sweep(t.scenario, t.raw, out_dir, source=t.source, executor=executor, workers=workers,
                    address=address, fresh=fresh, progress=progress, checking=checking, metrics=t.metrics)
    sts = standings(t, read_rows(res.table))
    out = res.out_dir
    write_standings_csv(out / "tournament.csv", t, sts)
    write_standings_html(out / "tournament.html", t, sts)
    (out / "tournament.json").write_text(json.dumps({
        "name": t.name, "scenario": t.scenario.name, "load_key": t.load_key, "unit": t.unit, "loads": t.loads,
        "rates": t.rates, "policies": t.spec.model_dump(mode="json")["policies"], "seeds": t.spec.seeds,
        "fitness": t.spec.fitness.model_dump(mode="json"),
        # every policy of a tie: naming the first alone read as if the others had lost (the text and the page name
        # them all)
        "winners": {t.load_label(s.load): [s.policy, *s.ties] for s in sts if s.winner},
    }, indent=2) + "\n")
    return TournamentOutcome(out, sts, res.runs, res.ran, res.resumed)
