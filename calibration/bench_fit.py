"""`servesim calibrate --from-bench FILE... --model M --gpu G`: fit the analytic cost model's few knobs to a user's
own benchmark results.

The knobs are the analytic (roofline) model's: ``compute_efficiency`` and ``bandwidth_efficiency`` (shares of the
GPU's peak FLOP/s and HBM bandwidth reached), ``step_overhead`` (host seconds per step: scheduling, launches) and
``per_request_overhead`` (host seconds per row per step: input preparation, sampling, detokenization). Every
evaluation replays each training file's workload in the simulator with those knobs (sim/output/benchfiles/validate.py),
and the residuals are log(simulated / measured) over the latency statistics the files hold, so that each metric
weighs by its relative error whatever its size. ``scipy.optimize.least_squares`` (trust-region reflective) keeps
every knob inside physical bounds. Knobs are fitted only to several files together, never one constant per file.

Held-out files (every ``holdout_every``-th, by load, or every file at ``holdout_load``, their statistics also
averaged) are simulated with the fitted knobs and their errors printed:
that is the error to expect on a load the fit did not see. The profile written is JSON::

    {"kind": "servesim-analytic-knobs", "schema_version": 1, "model": ..., "gpu": ...,
     "cost_model": {"type": "analytic", "compute_efficiency": ..., ...},   (kind servesim-live-fit: + "serving")
     "fit": {"train": [...files], "heldout": [...files], "train_median_abs_error": ..., "heldout_errors": {...}}}

and a scenario uses it with ``deployment.cost_model: {type: analytic, profile: PATH}``.

With ``profile`` (``--profile``, a calibration profile measured on the engine itself by ``servesim calibrate``), the
knobs are instead ``scale`` and ``step_overhead`` on top of that profile (``deployment.cost_model: {type: fitted,
profile: P, scale: S, step_overhead: O}``) and ``request_latency_s`` (``deployment.serving``): the live server's step
takes the engine's measured time times S plus O seconds, and each token reaches the client L seconds after its step.
That is the model of a server whose device the analytic roofline does not describe (the engine on a CPU), or whose
engine is measured but whose serving process adds its own time (HTTP threads sharing the cores and the interpreter,
streaming); each knob has a physical reading and stays in bounds that keep it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.config.deployment import FittedCost
from sim.config.scenario import VariantConfig
from sim.config.schema import AnalyticCost, ScenarioError
from sim.costs.online import ServingConfig
from sim.output.benchfiles.common import BenchRun
from sim.output.benchfiles.knobs import PROFILE_KIND
from sim.output.benchfiles.validate import not_completed, rebuild_workload, relative_error, simulated_metrics

# fitted unless told otherwise: per_request_overhead moves TPOT by a share that grows with the batch, which a few
# noisy files rarely separate from the bandwidth term; it stays at its default unless asked for (--knobs)
DEFAULT_FREE = ("compute_efficiency", "bandwidth_efficiency", "step_overhead")
# the solver works on log(knob): every knob moves by relative steps, whatever its size
BOUNDS = {"compute_efficiency": (0.02, 1.0), "bandwidth_efficiency": (0.02, 1.0), "step_overhead": (1e-6, 0.1),
          "per_request_overhead": (1e-8, 1e-2)}
# means and medians: tail percentiles move in jumps as the order of events changes, which finite differences
# cannot follow
FIT_METRICS = ("mean_ttft", "mean_tpot", "mean_itl", "mean_e2el", "output_throughput")
DEFAULTS = {"compute_efficiency": 0.6, "bandwidth_efficiency": 0.8, "step_overhead": 1.5e-3,
            "per_request_overhead": 1e-5}  # sim/costs/analytic.py's defaults: the fit starts there


def with_knobs(cfg: VariantConfig, knobs: dict[str, float]) -> VariantConfig:
    """``cfg`` on the analytic cost model with ``knobs``, the fitted knobs (BOUNDS) at their defaults where not
    given. An analytic cost model's other keys describe the deployment, not the fit, and are kept
    (``weight_only_bandwidth``: its kernels; bench_published's gpt-fast rows ran without theirs before)."""
    base = cfg.deployment.cost_model
    kept = base.model_dump(exclude_none=True, exclude={"type", "profile", *BOUNDS}) \
        if isinstance(base, AnalyticCost) else {}
    dep = cfg.deployment.model_copy(update={"cost_model": AnalyticCost(**(kept | knobs))})
    return dataclasses.replace(cfg, deployment=dep)


@dataclass(frozen=True)
class KnobFamily:
    """What a fit moves: the knobs' bounds and starting values, and how a set of knobs enters a deployment."""

    bounds: dict[str, tuple[float, float]]
    defaults: dict[str, float]
    apply: Callable[[VariantConfig, dict[str, float]], VariantConfig]
    free: tuple[str, ...]
    deployment: Callable[[dict[str, float]], dict[str, Any]]  # the deployment keys (and sections) they set
    kind: str = PROFILE_KIND  # what the written file is: analytic knobs are read back by cost_model.profile
    unfitted: dict[str, float] | None = None  # what the fit is compared with (default: where it starts)


ANALYTIC = KnobFamily(BOUNDS, DEFAULTS, with_knobs, DEFAULT_FREE, lambda k: {"cost_model": {"type": "analytic", **k}})

# On top of a measured engine profile: a server at most 100 times slower per step than the engine alone, and no
# faster than a tenth of it (the profile is the engine's own time: a server cannot be much faster); up to 0.1 s of
# its own per step; up to 1 s of HTTP path per token (deployment.serving.request_latency_s: TTFT and E2EL, not the
# gaps between tokens). The floors are above 0 because the solver works on the logarithms.
LIVE_FIT_KIND = "servesim-live-fit"  # deployment sections to copy into a scenario, not a profile to name
PROFILE_BOUNDS = {"scale": (0.1, 100.0), "step_overhead": (1e-7, 0.1), "request_latency_s": (1e-6, 1.0)}
# where the fit starts: 1 ms per step and per request, mid-range in log terms (from 10 us the solver stalled on
# planted files, and at the bound the central differences leave a knob stuck); the fit is compared with the profile
# as it is
PROFILE_DEFAULTS = {"scale": 1.0, "step_overhead": 1e-3, "request_latency_s": 1e-3}
PROFILE_UNFITTED = {"scale": 1.0, "step_overhead": 0.0, "request_latency_s": 0.0}


def profile_family(profile: str) -> KnobFamily:
    """``scale`` and ``step_overhead`` on top of the engine profile at ``profile`` (a path), and the HTTP path's
    ``request_latency_s``."""

    def section(knobs: dict[str, float]) -> dict[str, Any]:
        return {"type": "fitted", "profile": profile, "scale": knobs["scale"], "step_overhead": knobs["step_overhead"]}

    def sections(knobs: dict[str, float]) -> dict[str, Any]:
        """The deployment keys these knobs set."""
        out: dict[str, Any] = {"cost_model": section(knobs)}
        if knobs.get("request_latency_s"):
            # the HTTP path, each token's way from the engine to the client; the server's own tokenizer is in it
            out["serving"] = {"request_latency_s": knobs["request_latency_s"], "request_handling_s": 0.0,
                              "tokenize_s_per_token": 0.0, "detokenize_s_per_token": 0.0}
        return out

    def apply(cfg: VariantConfig, knobs: dict[str, float]) -> VariantConfig:
        keys = sections(knobs)
        update: dict[str, Any] = {"cost_model": FittedCost(**keys["cost_model"])}
        if "serving" in keys:
            update["serving"] = ServingConfig(**keys["serving"])
        dep = cfg.deployment.model_copy(update=update)
        return dataclasses.replace(cfg, deployment=dep)

    return KnobFamily(PROFILE_BOUNDS, PROFILE_DEFAULTS, apply, tuple(PROFILE_BOUNDS), sections, LIVE_FIT_KIND,
                      PROFILE_UNFITTED)


Deployments = VariantConfig | list[VariantConfig]  # one for every run, or one per run (rows of many deployments)


@dataclass
class SimMemo:
    """What one calibration simulated, kept for its later asks: each run's workload (no knob changes it; every
    evaluation rebuilt it) and each run's metrics by knobs (the knobs the fit ends on were simulated again for
    the median error and the cost, and the unfitted ones three times: comparison, median error, cost). The
    simulator is deterministic, so an ask answered from here is the very result a new simulation gives. Keyed by
    the objects' ids: it lives no longer than the runs, deployments and family of the one calibration."""

    workloads: dict[tuple[int, int, int], Any] = field(default_factory=dict)
    metrics: dict[tuple[int, int, int, int, tuple[tuple[str, float], ...]], dict[str, float]] = field(
        default_factory=dict)


def simulate_runs(cfg: Deployments, runs: list[BenchRun], knobs: dict[str, float], seed: int = 0,
                  family: KnobFamily = ANALYTIC, memo: SimMemo | None = None) -> list[dict[str, float]]:
    from sim.loop.run import simulate_variant

    cfgs = cfg if isinstance(cfg, list) else [cfg] * len(runs)
    by_knobs = tuple(sorted(knobs.items()))
    out = []
    for base, run in zip(cfgs, runs, strict=True):
        key = (id(base), id(run), id(family), seed, by_knobs)
        if memo is not None and key in memo.metrics:
            out.append(dict(memo.metrics[key]))
            continue
        c = family.apply(base, knobs)
        max_len = int(base.deployment.max_model_len or (1 << 20))
        wl = memo.workloads.get((id(run), seed, max_len)) if memo is not None else None
        if wl is None:
            wl, _ = rebuild_workload(run, seed=seed, max_len=max_len)
            if memo is not None:
                memo.workloads[(id(run), seed, max_len)] = wl
        result, _, _ = simulate_variant(c, wl, name=c.name)
        n, done, why = not_completed(result)
        if done < n:  # knobs fitted to fewer requests than were measured describe neither (0 where none are left)
            raise ScenarioError(f"{run.source}: the simulated variant {c.name} rejects {n - done} of the benchmark's "
                                f"{n} requests, which the benchmark served ({why}): no fit to it")
        out.append(simulated_metrics(result, list(run.aggregates)))
        if memo is not None:
            memo.metrics[key] = dict(out[-1])
    return out


def plant_measurements(cfg: VariantConfig, run: BenchRun, knobs: dict[str, float], rng: np.random.Generator,
                       noise: float = 0.05, family: KnobFamily | None = None) -> BenchRun:
    """Fill ``run.aggregates`` as a benchmark of a deployment with ``knobs`` would: the run's workload simulated,
    each request's TTFT and decode time multiplied by lognormal noise of that sigma, the statistics recomputed
    from the noisy values as vLLM's would be (no per-token times: no ITL). For checking what a fit recovers."""
    from sim.loop.run import simulate_variant
    from sim.output.benchfiles.stats import bench_stats

    wl, _ = rebuild_workload(run)
    res, _, _ = simulate_variant((family or ANALYTIC).apply(cfg, knobs), wl)
    done = sorted(res.requests, key=lambda r: r.id)
    ttft = [(r.first_token - r.arrival) * rng.lognormal(0, noise) for r in done]
    e2el = [t + (r.finish - r.first_token) * rng.lognormal(0, noise) for t, r in zip(ttft, done, strict=True)]
    stats = bench_stats(ttft, e2el, [r.output_tokens for r in done], [r.prompt_tokens for r in done],
                        np.zeros(0), res.duration)
    run.aggregates = {k: v for k, v in stats.items() if "_itl" not in k}
    return run


def _pairs(runs: list[BenchRun], sims: list[dict[str, float]]) -> list[tuple[int, str, float, float]]:
    return [(i, k, run.aggregates[k], sim[k]) for i, (run, sim) in enumerate(zip(runs, sims, strict=True))
            for k in FIT_METRICS if k in run.aggregates and k in sim and run.aggregates[k] > 0]


@dataclass
class BenchFit:
    knobs: dict[str, float]
    train: list[str]
    heldout: list[str]
    train_median_abs_error: float
    heldout_errors: dict[str, dict[str, float | None]] = field(default_factory=dict)  # file -> metric -> error
    nfev: int = 0
    # the held-out errors of the knobs the fit started from (the defaults, or the engine profile as it is)
    heldout_errors_unfitted: dict[str, dict[str, float | None]] = field(default_factory=dict)
    family: KnobFamily = ANALYTIC
    train_median_abs_error_unfitted: float = math.nan
    # what the fit minimises: the root mean square of log(simulated / measured) over the training metrics; the
    # fit's is never above the unfitted one's (the median |error| can be: it is not what is minimised)
    train_rms_log_error: float = math.nan
    train_rms_log_error_unfitted: float = math.nan

    def heldout_median_abs_error(self) -> float | None:
        errs = [abs(e) for f, m in self.heldout_errors.items() if f != POOLED for e in m.values() if e is not None]
        return float(np.median(errs)) if errs else None


def fit_knobs(cfg: Deployments, train: list[BenchRun], *, x0: dict[str, float] | None = None, seed: int = 0,
              max_iter: int = 12, knobs: tuple[str, ...] = DEFAULT_FREE,
              robust: float | None = None, family: KnobFamily = ANALYTIC,
              compare: dict[str, float] | None = None, memo: SimMemo | None = None
              ) -> tuple[dict[str, float], float, int]:
    """Bounded least squares over the knobs; returns them, the training median |relative error| and the number
    of evaluations. With ``compare`` (the knobs a fit is judged against, such as an engine profile as it is): those
    knobs are returned instead whenever they describe the training runs better by the fit's own measure. ``memo``:
    simulations kept for the caller's later asks (``SimMemo``)."""
    from scipy.optimize import least_squares

    start = {**family.defaults, **(x0 or {})}
    free = knobs
    lo = np.log([family.bounds[k][0] for k in free])
    hi = np.log([family.bounds[k][1] for k in free])
    x_start = np.clip(np.log([start[k] for k in free]), lo, hi)

    def knobs_of(x: np.ndarray) -> dict[str, float]:
        return {**start, **{k: float(np.exp(v)) for k, v in zip(free, x, strict=True)}}

    def residuals(x: np.ndarray) -> np.ndarray:
        return residuals_of(knobs_of(x))

    def residuals_of(knobs: dict[str, float]) -> np.ndarray:
        pairs = _pairs(train, simulate_runs(cfg, train, knobs, seed, family, memo))
        r = np.array([math.log(max(s, 1e-12) / m) for _, _, m, s in pairs])
        if robust is None:
            return r
        # scipy's soft_l1 loss written into the residuals (their squares sum to it): a few points the model
        # cannot describe at all pull the knobs by their sign, not by their size
        return np.sign(r) * robust * np.sqrt(2.0 * (np.sqrt(1.0 + (r / robust) ** 2) - 1.0))

    # The simulated metrics are a staircase in the knobs at fine scale (a knob that reorders two events moves a
    # request into another step), so a trust-region solver on the simulator itself shrinks its region onto a
    # stair and stops. Instead: Gauss-Newton with coarse central differences (steps of 5% in every knob), each
    # step's bounded linear subproblem solved by least_squares, and a backtracking line search on the
    # simulator's true cost; stop when a step no longer lowers it.
    x = x_start
    r = residuals(x)
    nfev = 1
    h = 0.05
    lam = 1e-3 * float(r.size)
    for _ in range(max_iter):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            up, down = x.copy(), x.copy()
            up[j], down[j] = min(x[j] + h, hi[j]), max(x[j] - h, lo[j])
            jac[:, j] = (residuals(up) - residuals(down)) / (up[j] - down[j])
            nfev += 2
        # Levenberg damping: a rejected step is retried shorter and turned towards the gradient
        best = None
        for _ in range(8):
            damp = math.sqrt(lam)

            def model(d: np.ndarray, jac: np.ndarray = jac, r: np.ndarray = r, damp: float = damp) -> np.ndarray:
                return np.concatenate([r + jac @ d, damp * d])

            sub = least_squares(model, np.zeros(x.size), bounds=(lo - x, hi - x), method="trf")
            cand = np.clip(x + sub.x, lo, hi)
            rc = residuals(cand)
            nfev += 1
            if rc @ rc < r @ r:
                best = (cand, rc)
                lam /= 3.0
                break
            lam *= 4.0
        if best is None:
            break
        gain = r @ r - best[1] @ best[1]
        x, r = best
        if gain < 1e-4 * (r @ r):
            break
    fitted = knobs_of(x)
    if compare is not None:
        # The solver works on logarithms inside the bounds, so it never reaches a knob of exactly 0 (no step
        # overhead): on runs that the machine's other load disturbed, the profile as it is can then beat every
        # point the search visited, and a fit must never describe its own files worse than what it is compared
        # with.
        rc = residuals_of(compare)
        nfev += 1
        if rc @ rc < r @ r:
            fitted = {**start, **compare}
    return fitted, median_abs_error(cfg, train, fitted, seed, family, memo), nfev


def rms_log_error(cfg: Deployments, runs: list[BenchRun], knobs: dict[str, float], seed: int = 0,
                  family: KnobFamily = ANALYTIC, memo: SimMemo | None = None) -> float:
    """The root mean square of log(simulated / measured) over the fitted metrics of ``runs``: the fit's cost."""
    sims = simulate_runs(cfg, runs, knobs, seed, family, memo)
    r = [math.log(max(s, 1e-12) / m) for _, _, m, s in _pairs(runs, sims)]
    return math.sqrt(sum(x * x for x in r) / len(r)) if r else math.nan


def median_abs_error(cfg: Deployments, runs: list[BenchRun], knobs: dict[str, float], seed: int = 0,
                     family: KnobFamily = ANALYTIC, memo: SimMemo | None = None) -> float:
    """The median |relative error| over the fitted metrics of ``runs`` simulated with ``knobs``."""
    errs = [abs(s - m) / m for _, _, m, s in _pairs(runs, simulate_runs(cfg, runs, knobs, seed, family, memo))]
    return float(np.median(errs)) if errs else math.nan


POOLED = "held-out files together"  # the key of their averaged statistics' errors


def split_holdout(runs: list[BenchRun], holdout_every: int, holdout_load: float | None = None
                  ) -> tuple[list[BenchRun], list[BenchRun]]:
    """Every ``holdout_every``-th run by load (starting with the second) is held out; 0 holds none out. With
    ``holdout_load``: every run at that load instead (repeated observations of one load held out together)."""
    order = sorted(range(len(runs)), key=lambda i: (runs[i].load or math.inf, i))
    if holdout_load is not None:
        # nan is close to no load, so it read as "no files at that load"; inf and 0 or less are no load either
        if not (math.isfinite(holdout_load) and holdout_load > 0):
            raise ValueError(f"--holdout-load must be a finite number > 0 (requests/s or concurrency), got "
                             f"{holdout_load:g}")
        held_at = [i for i in order if math.isclose(runs[i].load or math.nan, holdout_load)]
        if not held_at or len(held_at) == len(runs):
            loads = sorted({r.load for r in runs if r.load is not None})
            raise ValueError(f"--holdout-load {holdout_load:g}: needs files at that load and at others; the loads "
                             f"are {', '.join(f'{x:g}' for x in loads) or 'unknown'}")
        return [runs[i] for i in order if i not in held_at], [runs[i] for i in held_at]
    if holdout_every <= 0 or len(runs) < 3:
        return [runs[i] for i in order], []
    held = {order[j] for j in range(1, len(order), holdout_every)}
    return [runs[i] for i in order if i not in held], [runs[i] for i in order if i in held]


def calibrate_from_bench(cfg: VariantConfig, runs: list[BenchRun], *, holdout_every: int = 4, seed: int = 0,
                         max_iter: int = 12, knobs: tuple[str, ...] | None = None,
                         robust: float | None = None, family: KnobFamily = ANALYTIC,
                         holdout_load: float | None = None) -> BenchFit:
    if len(runs) < 2:
        raise ValueError("calibrate --from-bench needs at least 2 benchmark runs: knobs are never fitted to one")
    train, held = split_holdout(runs, holdout_every, holdout_load)
    if len(train) < 2:
        how = f"--holdout-load {holdout_load:g}" if holdout_load is not None else f"--holdout-every {holdout_every}"
        raise ValueError(f"{how} leaves {len(train)} of the {len(runs)} benchmark runs to fit: knobs are never fitted "
                         "to one; hold out fewer")
    unfitted = family.unfitted or family.defaults
    memo = SimMemo()
    fitted, train_err, nfev = fit_knobs(cfg, train, seed=seed, max_iter=max_iter, knobs=knobs or family.free,
                                        family=family, compare=unfitted, memo=memo)

    def errors(knobs: dict[str, float]) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        sims = simulate_runs(cfg, held, knobs, seed, family, memo)
        for run, sim in zip(held, sims, strict=True):
            name = run.source + (f" {run.label}" if run.label else "")
            out[name] = {k: relative_error(v, sim[k]) for k, v in run.aggregates.items() if k in sim}
        if len(held) > 1:
            # several held-out files (repeated observations of one load): each statistic averaged over them, so
            # that a run disturbed by the machine's other jobs weighs as one of several
            keys = [k for k in held[0].aggregates if all(k in r.aggregates and k in s for r, s in
                                                         zip(held, sims, strict=True))]
            out[POOLED] = {k: relative_error(float(np.mean([r.aggregates[k] for r in held])),
                                             float(np.mean([s[k] for s in sims]))) for k in keys}
        return out

    label = [r.source + (f" {r.label}" if r.label else "") for r in train]
    return BenchFit(fitted, label, [r.source + (f" {r.label}" if r.label else "") for r in held], train_err,
                    errors(fitted) if held else {}, nfev, errors(unfitted) if held else {}, family,
                    median_abs_error(cfg, train, unfitted, seed, family, memo),
                    rms_log_error(cfg, train, fitted, seed, family, memo),
                    rms_log_error(cfg, train, unfitted, seed, family, memo))


def knobs_at_bounds(fit: BenchFit, free: tuple[str, ...]) -> list[str]:
    """The fitted knobs that ended on a bound ("scale at its floor 0.1"): there the files asked for more than the
    model can physically give, and the fit describes them only as far as that bound allows."""
    out = []
    for k in free:
        lo, hi = fit.family.bounds[k]
        v = fit.knobs[k]
        for edge, name in ((lo, "floor"), (hi, "ceiling")):
            if math.isclose(v, edge, rel_tol=1e-3):
                out.append(f"{k} at its {name} {edge:g}")
    return out


def profile_dict(fit: BenchFit, *, model: str, gpu: str) -> dict[str, Any]:
    return {
        "kind": fit.family.kind,
        "schema_version": 1,
        "model": model,
        "gpu": gpu,
        **fit.family.deployment(fit.knobs),
        "fit": {"method": "scipy.optimize.least_squares (trf, bounded), residuals log(sim / measured)",
                "metrics": list(FIT_METRICS), "train": fit.train, "heldout": fit.heldout,
                "train_median_abs_error": fit.train_median_abs_error,
                "train_median_abs_error_unfitted": fit.train_median_abs_error_unfitted,
                "train_rms_log_error": fit.train_rms_log_error,
                "train_rms_log_error_unfitted": fit.train_rms_log_error_unfitted,
                "heldout_median_abs_error": fit.heldout_median_abs_error(), "heldout_errors": fit.heldout_errors,
                "heldout_errors_unfitted": fit.heldout_errors_unfitted,
                "evaluations": fit.nfev},
    }
