"""Validation over a family of workloads: the calibrated simulator against the engine on many unseen workloads.

``run_family`` takes workloads from ``calibration.workloads`` and, for each, sets its arrival rate from its
offered load (``rho`` times the rate at which the simulator, with the profile, finishes the same requests queued
all at once), runs it on the engine and in the simulator (``calibration.validate.validate_variant``: the same
policy and KV block manager, the engine's block count) and keeps the comparison and the engine's steps (exact
shapes and measured durations, for fitting on serving steps: ``calibration.serving``). ``error_table`` reduces
the runs to one row per metric: the median and the p90 across workloads of ``|relative error|``, against the
targets. Latencies are judged on every workload; output throughput only on the saturated ones, where the
engine rather than the arrivals sets it.

Needs torch (the engine).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit import Sample
from calibration.serving import StepRecorder
from calibration.validate import VariantValidation, validate_variant
from calibration.workloads import FamilyWorkload
from sim.config.scenario import VariantConfig, parse_scenario, variant_configs
from sim.config.schema import FittedCost
from sim.workload.generator import GeneratedWorkload

LATENCY_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2el_p50", "e2el_p99")
THROUGHPUT_METRIC = "output_throughput"
# the targets of |relative error| for the median across workloads; the p90 across workloads is held to twice them
TARGETS: dict[str, float] = {**{m: 0.05 if m.endswith("p50") else 0.10 for m in LATENCY_METRICS},
                             THROUGHPUT_METRIC: 0.03}


@dataclass(slots=True)
class WorkloadRun:
    workload: FamilyWorkload
    rate: float  # requests/s the workload was offered at
    saturated_rate: float  # requests/s the simulator finishes them at when all are queued at once
    validation: VariantValidation
    samples: list[Sample]  # the engine's steps as calibration samples (one script per workload)

    @property
    def slowdown(self) -> float | None:
        """How much slower the machine ran the profile's reference step around this run (None: no probe)."""
        return self.validation.machine_slowdown

    def errors(self, adjusted: bool = False) -> dict[str, float | None]:
        """Relative error per judged metric (throughput only when saturated, else None); ``adjusted``: with the
        simulator's step times scaled by the machine's measured slowdown (None without a probe)."""
        m = self.validation.adjusted_metrics if adjusted else self.validation.metrics
        if m is None:
            return {k: None for k in TARGETS}
        out: dict[str, float | None] = {k: m[k]["rel_error"] for k in LATENCY_METRICS}
        out[THROUGHPUT_METRIC] = m[THROUGHPUT_METRIC]["rel_error"] if self.workload.saturated else None
        return out


def variant_of(fw: FamilyWorkload) -> VariantConfig:
    return variant_configs(parse_scenario(fw.scenario(), source=fw.name))[0]


def saturated_rate(cfg: VariantConfig, fw: FamilyWorkload, profile_path: str | Path, *, model: str,
                   device: str = "cpu") -> float:
    """Requests per second the simulator (with the profile, on the engine's configuration) serves the workload's
    requests at when every one of them is queued at time 0: the engine's capacity for this mix."""
    from realengine.engine import engine_config
    from sim.loop.run import simulate_variant

    sim_cfg = engine_config(cfg, model_spec=model, device=device)
    dep = sim_cfg.deployment.model_copy(update={"cost_model": FittedCost(profile=str(Path(profile_path).resolve()))})
    sim_cfg = dataclasses.replace(sim_cfg, deployment=dep)
    reqs = tuple(dataclasses.replace(r, arrival=0.0) for r in fw.requests)
    res, _, _ = simulate_variant(sim_cfg, GeneratedWorkload(reqs), name=fw.name)
    return len(reqs) / max(float(res.duration), 1e-9)  # duration: from time 0 to the last completion


def run_workload(fw: FamilyWorkload, profile_path: str | Path, *, model: str, device: str = "cpu",
                 probe: Any = None) -> WorkloadRun:
    """One workload on the engine and in the simulator. With a ``calibration.measure.SpeedProbe``, the
    profile's reference step is timed before and after the engine run (``WorkloadRun.slowdown``)."""
    cfg = variant_of(fw)
    cap = saturated_rate(cfg, fw, profile_path, model=model, device=device)
    rate = fw.rho * cap
    wl = GeneratedWorkload(fw.with_rate(rate))
    rec = StepRecorder()
    v = validate_variant(cfg, wl, profile_path, model=model, device=device, seed=fw.seed, on_runner=rec.attach,
                         probe=probe)
    return WorkloadRun(fw, rate, cap, v, rec.samples(v.real.steps, fw.name))


def make_probe(profile_path: str | Path, device: str = "cpu") -> Any:
    """A ``SpeedProbe`` for the profile (None when it has no reference script), sized to take about a second:
    fewer runs of the reference script for a model whose steps are tens of milliseconds."""
    import json

    from calibration.measure import SpeedProbe

    with open(profile_path) as f:
        probe = SpeedProbe(json.load(f), device=device)
    if probe.script is None or not probe.base:
        return None
    probe.repeats = 5 if probe.base < 5e-3 else 2
    return probe


def run_family(workloads: Sequence[FamilyWorkload], profile_path: str | Path, *, model: str, device: str = "cpu",
               on_done: Callable[[WorkloadRun], None] | None = None, probe: Any = None) -> list[WorkloadRun]:
    """Every workload on the engine and in the simulator; ``on_done`` is called after each."""
    runs = []
    for fw in workloads:
        run = run_workload(fw, profile_path, model=model, device=device, probe=probe)
        runs.append(run)
        if on_done is not None:
            on_done(run)
    return runs


def resimulate(run: WorkloadRun, profile_path: str | Path, *, model: str, device: str = "cpu") -> dict[str, Any]:
    """The simulator's side of a run again with another profile (the engine's run is kept): the metrics dict of
    ``calibration.validate.compare``. Same arrivals, same KV blocks."""
    from calibration.validate import compare
    from realengine.engine import engine_config
    from sim.loop.run import simulate_variant
    from sim.metrics.summary import summarize

    v = run.validation
    cfg = engine_config(variant_of(run.workload), model_spec=model, num_gpu_blocks=v.num_gpu_blocks, device=device)
    dep = cfg.deployment.model_copy(update={"cost_model": FittedCost(profile=str(Path(profile_path).resolve()))})
    cfg = dataclasses.replace(cfg, deployment=dep)
    sim, _, _ = simulate_variant(cfg, GeneratedWorkload(run.workload.with_rate(run.rate)), name=v.name)
    return compare(v.real_summary, summarize(sim))


def error_table(errors: Sequence[dict[str, float | None]]) -> dict[str, dict[str, Any]]:
    """Per metric: workloads judged, median and p90 across them of |relative error|, the targets (median < target,
    p90 < twice it) and whether both are met."""
    out: dict[str, dict[str, Any]] = {}
    for metric, target in TARGETS.items():
        given = [e.get(metric) for e in errors]
        vals = np.array([abs(v) for v in given if v is not None and math.isfinite(v)], dtype=np.float64)
        med = float(np.median(vals)) if vals.size else math.nan
        p90 = float(np.percentile(vals, 90)) if vals.size else math.nan
        out[metric] = {"n": int(vals.size), "median_abs": med, "p90_abs": p90, "target": target,
                       "target_p90": 2 * target, "met": bool(vals.size and med < target and p90 < 2 * target)}
    return out


def format_table(table: dict[str, dict[str, Any]], title: str = "") -> str:
    lines = [title] if title else []
    lines.append(f"{'metric':<20}{'n':>4}{'median|err|':>13}{'target':>8}{'p90|err|':>10}{'target':>8}  met")
    for metric, r in table.items():
        lines.append(f"{metric:<20}{r['n']:>4}{100 * r['median_abs']:>12.1f}%{100 * r['target']:>7.0f}%"
                     f"{100 * r['p90_abs']:>9.1f}%{100 * r['target_p90']:>7.0f}%  {'yes' if r['met'] else 'NO'}")
    return "\n".join(lines)


# --- calibration from serving -------------------------------------------------------------------------------------

# The family seeds: serving runs that calibration fits on, and the validation family, never the same workloads
CALIBRATION_SEED = 1000
VALIDATION_SEED = 0


def refit_with_serving(profile: dict[str, Any], serving: Sequence[Sample],
                       readings: dict[str, float | None] | None = None) -> dict[str, Any]:
    """The profile fitted again on its grid samples plus ``serving`` steps (``calibration.serving``). The fit
    record gains ``serving_before``: the grid-only coefficients' error on the serving steps (none of which that
    fit saw), beside the new held-out error per class (each serving run held out whole, class ``serving``).
    ``readings`` (``serving_steps``' speed probe per run) are kept as ``provenance.serving.machine_slowdowns``."""
    from calibration.fit import build_profile, fit_errors, profile_coefficients, samples_from_profile

    grid = [s for s in samples_from_profile(profile) if s.kind != "serving"]
    before = fit_errors(profile_coefficients(profile), list(serving))
    prov = dict(profile.get("provenance", {}))
    prov["serving"] = {"workloads": len({s.script for s in serving}), "steps": len(serving),
                       "family_seed": CALIBRATION_SEED}
    if readings is not None:
        prov["serving"]["machine_slowdowns"] = dict(readings)
    out = build_profile(profile["model"], profile["device"], grid + list(serving),
                        swap_block=profile["coefficients"].get("swap_block", 0.0),
                        wake_curve=[tuple(p) for p in profile.get("wake_curve", [])],
                        num_gpu_blocks=profile.get("num_gpu_blocks"), peak_flops=profile.get("peak_flops", 0.0),
                        provenance=prov)
    out["fit"]["serving_before"] = before
    out["fit"]["method"] += "; grid and serving steps (engine runs of random workloads) fitted together"
    return out


def serving_steps(profile_path: str | Path, model: str, n: int, *, device: str = "cpu", seed: int = CALIBRATION_SEED,
                  on_done: Callable[[WorkloadRun], None] | None = None,
                  readings: dict[str, float | None] | None = None) -> list[Sample]:
    """Run ``n`` workloads of the calibration family on the engine (rates from the profile) and return their
    steps as samples, each run's durations divided by the machine's slowdown around it (the profile's reference
    step timed before and after): on a shared machine the speed drifts between runs (measured on this
    project's 2-core VM: the tiny model's reference step at 0.84x to 2.4x its calibration time within 40 s, in
    thread CPU time), and the fit must see every run at the grid's speed. ``readings``, when given, receives each
    run's reading by workload name (None: no probe), so that a profile can keep what its steps were divided by:
    validation runs are not divided, and the two can only be compared when the calibration's readings are kept."""
    from calibration.workloads import family

    probe = make_probe(profile_path, device)
    runs = run_family(family(n, model, seed), profile_path, model=model, device=device, on_done=on_done,
                      probe=probe)
    out: list[Sample] = []
    for r in runs:
        if readings is not None:
            readings[r.workload.name] = r.slowdown
        k = r.slowdown or 1.0
        out += [dataclasses.replace(s, duration=s.duration / k) for s in r.samples]
    return out


def calibrate_cpu(model: str, *, cpu_clock: str, repeats: int = 3, serving_workloads: int = 8) -> dict[str, Any]:
    """A CPU profile measured on ``cpu_clock`` (``realengine.clock``): the grid (``calibration.measure``), then the
    grid and the steps of ``serving_workloads`` runs of the calibration family fitted together, as ``servesim
    calibrate --serving-workloads N`` makes one on the thread clock. The serving runs read their steps on the
    grid profile's clock and reference speed (``calibration.validate.profile_clock``)."""
    import json
    import tempfile

    from calibration.fit import build_profile
    from calibration.measure import measure

    m = measure(model, device="cpu", repeats=repeats, cpu_clock=cpu_clock)
    profile = build_profile(model, m.provenance["device"], m.samples, swap_block=m.swap_block,
                            num_gpu_blocks=m.num_gpu_blocks,
                            provenance={**m.provenance, "calibration_seconds": round(m.seconds, 2)})
    if not serving_workloads:
        return profile
    with tempfile.TemporaryDirectory() as tmp:
        grid_path = Path(tmp) / "grid.json"
        grid_path.write_text(json.dumps(profile))
        readings: dict[str, float | None] = {}
        serving = serving_steps(grid_path, model, serving_workloads, readings=readings)
    return refit_with_serving(profile, serving, readings)
