"""Validation: the same workload on the real engine and in the calibrated simulator, metric by metric.

For every variant of a scenario: replay the workload on the engine (``realengine.engine.run_engine``), then
simulate it with the fitted profile as the cost model and the engine's actual KV block count (and swap space),
the arrivals scaled as the engine scaled them. Both runs go through the same policy and KV block manager code,
so every difference is the cost model's (and the machine's noise). The comparison per variant and metric
(TTFT, TPOT, ITL, E2EL at p50, p90 and p99; output throughput; KV usage; preemptions) is the real value, the
simulated value and the relative error ``(simulated - real) / real``.

``compare`` and the figures are torch-free; ``validate`` needs torch (the engine).
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from sim.config.scenario import VariantConfig, load_scenario, variant_configs
from sim.config.schema import FittedCost, Scenario, ScenarioError
from sim.costs.energy_time import steps_energy
from sim.costs.fitted import FittedCostModel
from sim.hardware.names import match_gpu, preset_hint
from sim.metrics.records import RunResult
from sim.metrics.summary import summarize
from sim.output.benchfiles.validate import error_reason, error_text, relative_error
from sim.output.report import TEMPLATE, color, ecdf_points
from sim.workload.arrivals import time_scale_problem
from sim.workload.generator import GeneratedWorkload

PERCENTILE_KEYS = ("p50", "p90", "p99")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
# metric name -> path in a summary
METRICS: dict[str, tuple[str, ...]] = {
    **{f"{m}_{p}": (m, p) for m in LATENCIES for p in PERCENTILE_KEYS},
    "output_throughput": ("output_throughput",),
    "kv_usage_mean": ("kv_usage", "mean"),
    "kv_usage_max": ("kv_usage", "max"),
    "num_preemptions": ("num_preemptions",),
    # the engine's energy as NVML (or RAPL) measured it (realengine.engine.measured_energy) against the simulator's
    # power model (sim/costs/energy.py) over the steps alone: the engine's virtual clock skips the idle gaps
    "energy_j": ("energy", "energy_j"),
    "j_per_output_token": ("energy", "j_per_output_token"),
    "mean_power_w": ("energy", "mean_power_w"),
}


def _get(summary: dict, path: tuple[str, ...]) -> float:
    """The figure at ``path``; NaN where a section is null or lacks it (an unmeasured or unmodelled energy)."""
    v: Any = summary
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return math.nan
        v = v[k]
    return float(v) if v is not None else math.nan


def compare(real: dict, sim: dict) -> dict[str, dict[str, Any]]:
    """Per metric of ``METRICS``: {real, sim, rel_error} from two ``summarize`` dicts, and rel_error_reason beside
    a null rel_error."""
    out: dict[str, dict[str, Any]] = {}
    for name, path in METRICS.items():
        r, s = _get(real, path), _get(sim, path)
        out[name] = {"real": r if math.isfinite(r) else None, "sim": s if math.isfinite(s) else None,
                     "rel_error": relative_error(r, s)}
        if out[name]["rel_error"] is None:  # a null says why (validation.json had bare nulls)
            out[name]["rel_error_reason"] = error_reason(r, s)
    return out


@dataclass(slots=True)
class VariantValidation:
    name: str
    num_gpu_blocks: int
    real: RunResult
    sim: RunResult
    real_summary: dict
    sim_summary: dict
    metrics: dict[str, dict[str, Any]]
    # How much slower the machine ran the profile's reference step around this run than at calibration (1.0:
    # as fast; None: not measured), and the comparison again with the simulator's step times scaled by it.
    machine_slowdown: float | None = None
    adjusted_metrics: dict[str, dict[str, Any]] | None = None
    # the engine run's memory samples (realengine.engine.MEMORY_COLUMNS), engine/memory.csv as `engine run` writes
    memory: list[dict[str, Any]] = field(default_factory=list)
    # where the simulator fed the engine's measured step times parts from the engine's schedule (sim.loop.replay;
    # empty: every plan, step and request time the same; None: not compared), and how many steps the engine took
    schedule_differences: list[str] | None = field(default_factory=list)
    schedule_steps: int = 0

    def schedule_line(self) -> str:
        """The parity of the two schedules, one line: the policy object the engine ran decided as in the simulator."""
        if self.schedule_differences is None:
            return ("schedule: not compared (the replay of the engine's step times models one replica, without "
                    "disaggregated pools or speculative decoding)")
        if not self.schedule_differences:
            return (f"schedule: the simulator fed the engine's {self.schedule_steps:,} measured step times made its "
                    f"every plan, step and request time")
        more = len(self.schedule_differences) - 1
        return f"schedule: DIFFERS from the engine's: {self.schedule_differences[0]}" + \
            (f" (and {more} more)" if more else "")

    def rejected_text(self) -> str:
        """``, 7 rejected (...)``: the requests the metrics leave out (longer than --model tiny's context of 2,048
        tokens, say), which the table's "20 requests" hid; "" when none was."""
        real, sim = self.real_summary.get("num_rejected", 0), self.sim_summary.get("num_rejected", 0)
        if not real and not sim:
            return ""
        said = f"{real} rejected" if real == sim else f"{real} rejected on the engine, {sim} in the simulator"
        return f", {said} (engine/requests.csv says why)"

    def step_stats(self) -> dict[str, Any]:
        dr, ds = self.real.steps["duration"], self.sim.steps["duration"]
        return {"real_steps": int(dr.size), "sim_steps": int(ds.size),
                "real_busy_s": float(dr.sum()), "sim_busy_s": float(ds.sum()),
                "real_mean_step_ms": float(dr.mean() * 1e3) if dr.size else None,
                "sim_mean_step_ms": float(ds.mean() * 1e3) if ds.size else None}


@dataclass(slots=True)
class Validation:
    scenario: str
    profile: str
    device: str
    model: str
    time_scale: float
    variants: list[VariantValidation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "profile": self.profile,
            "device": self.device,
            "model": self.model,
            "time_scale": self.time_scale,
            "metric_definitions": "vllm bench serve: TTFT, TPOT, ITL, E2EL in seconds; output_throughput in tokens/s; "
                                  "kv_usage = allocated KV blocks / capacity (time-weighted mean, max); "
                                  "rel_error = (sim - real) / real; where it is null, rel_error_reason says why",
            "variants": {
                v.name: {
                    "num_gpu_blocks": v.num_gpu_blocks,
                    "num_requests": v.real_summary["num_requests"],
                    "num_completed": {"real": v.real_summary["num_completed"], "sim": v.sim_summary["num_completed"]},
                    "steps": v.step_stats(),
                    "metrics": v.metrics,
                    "machine_slowdown": v.machine_slowdown,
                    "speed_adjusted_metrics": v.adjusted_metrics,
                    "schedule": {"same": None if v.schedule_differences is None else not v.schedule_differences,
                                 "steps": v.schedule_steps, "differences": v.schedule_differences},
                }
                for v in self.variants
            },
        }

    def table(self) -> str:
        """Real, simulated and error per metric, one block per variant."""
        lines = []
        for v in self.variants:
            slow = "" if v.machine_slowdown is None else f", machine {v.machine_slowdown:.2f}x calibration's step time"
            lines.append(f"{v.name} ({v.num_gpu_blocks} KV blocks, {v.real_summary['num_requests']} requests"
                         f"{v.rejected_text()}{slow})")
            lines.append(f"  {v.schedule_line()}")
            rows = []
            for name, m in v.metrics.items():
                scale, unit = (1e3, " ms") if name.split("_")[0] in LATENCIES else (1.0, "")
                if name.startswith("kv_usage"):
                    scale, unit = 100.0, " %"
                r = "n/a" if m["real"] is None else f"{m['real'] * scale:.4g}"
                s = "n/a" if m["sim"] is None else f"{m['sim'] * scale:.4g}"
                rows.append((name + unit, r, s, error_text(m["real"], m["sim"], m["rel_error"], scale, unit)))
            # the error column as wide as its widest cell: "n/a (measured ~0, ...)" pushed that row's end past
            # the others' (right-aligned to 9 characters)
            w = max([9, *(len(e) + 2 for *_, e in rows)])
            lines.append(f"  {'metric':<20}{'real':>12}{'sim':>12}{'error':>{w}}")
            lines += [f"  {n:<20}{r:>12}{s:>12}{e:>{w}}" for n, r, s, e in rows]
        return "\n".join(lines)


# --- the runs ------------------------------------------------------------------------------------------------------


def load_profile(path: str | Path) -> FittedCostModel:
    """The profile as a cost model; every problem with the file as one ``ScenarioError`` naming it."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"--profile {p}: file not found")
    try:
        return FittedCostModel.from_profile(p)
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        first = str(e).strip().splitlines()
        msg = " ".join(line.strip() for line in first[:3])
        if msg.startswith(f"{p}: "):  # from_profile's own message names the file and what it is (bad JSON too)
            raise ScenarioError(f"--profile {msg}") from None
        raise ScenarioError(f"--profile {p}: not a calibration profile: {msg}") from None


def resolve_model(profile: FittedCostModel, model: str | None) -> str:
    """The preset name the engine runs (it builds its model from a preset): the one the profile measured, which
    ``model`` (when given) must name. The spec comes from ``sim.hardware.models.resolve_model``, the one model resolver;
    this adds only that the engine needs a preset and that it must agree with the profile."""
    from sim.hardware.models import is_model_preset
    from sim.hardware.models import resolve_model as resolve_spec

    if model is not None and not model.strip():  # an unset variable: it ran the profile's model without a word
        raise ScenarioError(f"--model: empty; name a model preset (the profile's is {profile.model or 'unnamed'})")
    name = model or profile.model
    if not name:
        raise ScenarioError("--model: the profile names no model; give --model")
    try:
        spec = resolve_spec(name)
    except FileNotFoundError as e:  # a Hugging Face id, read as a config.json path: said as deployment.model says it
        raise ScenarioError(f"--model: file not found: {e.filename or e}{preset_hint(name, 'model')}") from None
    except (ValueError, OSError, KeyError) as e:
        raise ScenarioError(f"--model: {e}{preset_hint(name, 'model', str(e))}") from None
    if not is_model_preset(spec.name):
        raise ScenarioError(f"--model {name}: the engine runs preset models only "
                            "(see sim.hardware.models.MODEL_PRESETS)")
    if model and profile.model and is_model_preset(profile.model) and resolve_spec(profile.model).name != spec.name:
        raise ScenarioError(f"--model {model}: the profile was measured on {profile.model}, not {model}")
    return spec.name


def _check_scenario_model(cfg: VariantConfig, name: str) -> None:
    """Refuse a variant whose model is not ``name``, the profile's: validate ran the profile's model on both sides
    without a word, a validation of a model the scenario never named."""
    from sim.hardware.models import resolve_model as resolve_spec

    theirs = cfg.deployment.model
    if resolve_spec(theirs).name != name:
        label = theirs if isinstance(theirs, str) else resolve_spec(theirs).name
        raise ScenarioError(f"variant {cfg.name!r}: deployment.model is {label}, but the profile was measured on "
                            f"{name}: give --model {name} to replay the workload on {name}, or a profile of {label}")


def prepare(scenario_path: str | Path, overrides: dict[str, Any] | None = None, variant: str | None = None,
            ) -> tuple[Scenario, list[VariantConfig], dict[str, Any]]:
    """Scenario, variants (every one, or the one named ``variant``) and each variant's workload (by name: a variant
    with workload keys of its own replays its own requests, as ``servesim run`` and ``engine run`` replay them;
    validate replayed the scenario's for every variant), with every input problem as a ``ScenarioError``."""
    from sim.loop.run import generate_workload
    from sim.output.benchfiles.validate import chosen_variants

    sc, _ = load_scenario(scenario_path, overrides)
    if sc.sweep:
        raise ScenarioError("sweeps are not supported by `servesim validate`; validate one point (--set)")
    cfgs = chosen_variants(variant_configs(sc), variant)
    wls = {cfg.name: generate_workload(sc, cfg.workload) for cfg in cfgs}
    return sc, cfgs, wls


def on_engine_clock(workload: Any, time_scale: float) -> GeneratedWorkload:
    """The workload as the engine ran it (``realengine.engine.run_engine``): arrivals, a closed loop's think times
    and the timed failures' delays x ``time_scale``. (validate refused closed loops, 'not supported by the engine
    yet', which ran them, and gave the simulator the failures' unscaled delays.)"""
    specs = getattr(workload, "requests", workload)
    arrived = tuple(dataclasses.replace(s, arrival=s.arrival * time_scale) for s in specs)
    if not isinstance(workload, GeneratedWorkload):
        return GeneratedWorkload(arrived)
    closed, failures = workload.closed_loop, workload.failures
    if closed is not None:
        closed = dataclasses.replace(closed, think_times=np.asarray(closed.think_times) * time_scale)
    if failures is not None:
        failures = dataclasses.replace(failures, cancel_after={i: d * time_scale
                                                               for i, d in failures.cancel_after.items()})
    return dataclasses.replace(workload, requests=arrived, closed_loop=closed, failures=failures)


def _simulate(cfg: VariantConfig, workload: GeneratedWorkload, cost, name: str) -> RunResult:
    """``sim.loop.run.simulate_variant`` with a cost model given as an object (the speed-adjusted profile)."""
    from sim.loop.build import build
    from sim.loop.results import result_of
    from sim.loop.run import policy_errors
    from sim.loop.simulator import ClosedLoopPlan, Simulation
    from sim.serving.core import ServingCore

    policy, kv, _, built = build(cfg)
    core = ServingCore(policy, kv)
    closed = workload.closed_loop
    sim = Simulation(workload.requests, [(core, cost)], failures=workload.failures,
                     leak=cfg.deployment.leak_kv_on_failure,
                     closed_loop=None if closed is None else ClosedLoopPlan(closed.num_users, closed.think_times))
    with policy_errors(cfg, name):  # other step times than the plain run's: a policy can fail here alone
        sim.run()
    return result_of(name, sim.requests, core, cost, config=cfg.to_dict(),
                     weight_bytes=float(built.budget.weight_bytes),
                     kv_bytes_per_block=float(built.budget.kv_bytes_per_block))


def schedule_parity(engine_cfg: VariantConfig, real: RunResult, requests: Sequence, core: Any,
                    workload: GeneratedWorkload) -> list[str] | None:
    """Where the simulator, fed the engine's measured step durations and arrivals (``sim.loop.replay``), parts from
    the engine's schedule; empty when the policy decided the same in both; None where the replay cannot tell
    (several replicas, disaggregated pools, or speculative decoding, whose drafts' acceptance the engine
    measured). A policy that
    fails in the replay alone (one that reads the wall clock, say) is a difference, not the end of the
    validation."""
    from sim.loop.replay import compare as compare_schedules
    from sim.loop.replay import replay
    from sim.loop.run import policy_errors

    if engine_cfg.cluster is not None or engine_cfg.disaggregation is not None or \
            engine_cfg.deployment.speculative is not None:
        return None
    try:
        with policy_errors(engine_cfg, real.name):
            sim, sim_core, cost = replay(engine_cfg, real, requests, workload.failures)
    except ScenarioError as e:
        return [f"the replay failed: {e}"]
    return compare_schedules(core, requests, sim, sim_core, cost)


def scaled(model: FittedCostModel, factor: float) -> FittedCostModel:
    """The same cost model with every time coefficient multiplied by ``factor``."""
    from sim.costs.fitted import COEFFICIENT_NAMES

    return dataclasses.replace(model, **{k: getattr(model, k) * factor for k in COEFFICIENT_NAMES})


def profile_clock(profile_path: str | Path) -> tuple[str, float | None]:
    """The CPU step clock a profile was measured on and its reference time (``realengine.clock``): an engine run
    compared with the profile reads its steps on the same clock, at the same reference speed."""
    with open(profile_path) as f:
        prov = json.load(f).get("provenance", {})
    return str(prov.get("cpu_clock", "thread")), prov.get("reference_seconds")


def validate_variant(cfg: VariantConfig, workload, profile_path: str | Path, *, model: str, device: str = "cpu",
                     num_gpu_blocks: int | None = None, time_scale: float = 1.0, seed: int = 0,
                     memory: list | None = None, probe=None, on_runner=None) -> VariantValidation:
    """One variant on the engine, then in the simulator with the profile and the engine's KV block count. With a
    ``SpeedProbe``, the machine's speed is measured before and after the engine run, and the comparison is
    repeated with the profile scaled by the slowdown. The engine times its steps on the profile's CPU clock
    (``profile_clock``). ``on_runner`` goes to ``run_engine`` (a
    ``calibration.serving.StepRecorder``'s ``attach`` logs the engine's step shapes)."""
    from realengine.engine import engine_config, measured_energy, run_engine
    from sim.loop.run import simulate_variant

    memory = [] if memory is None else memory
    before = probe.measure() if probe is not None else None
    cpu_clock, reference = profile_clock(profile_path)
    real, requests, core = run_engine(cfg, workload, device=device, model_spec=model, num_gpu_blocks=num_gpu_blocks,
                                      time_scale=time_scale, seed=seed, memory_samples=memory, on_runner=on_runner,
                                      cpu_clock=cpu_clock, reference_seconds=reference, record_plans=True)
    blocks = int(core.kv.num_blocks)
    sim_cfg = engine_config(cfg, model_spec=model, num_gpu_blocks=blocks, device=device)
    wl_scaled = on_engine_clock(workload, time_scale)
    differences = schedule_parity(sim_cfg, real, requests, core, wl_scaled)
    update: dict[str, Any] = {"cost_model": FittedCost(profile=str(Path(profile_path).resolve()))}
    gpu = match_gpu(load_profile(profile_path).device)
    if gpu is not None:  # the engine ran on the profile's GPU: the simulator prices that GPU, not the scenario's
        update["gpu"] = gpu  # (a profile of another GPU than deployment.gpu is refused, sim.config.deployment)
    dep = sim_cfg.deployment.model_copy(update=update)
    sim_cfg = dataclasses.replace(sim_cfg, deployment=dep)
    after = probe.measure() if probe is not None else None
    sim, _, _ = simulate_variant(sim_cfg, wl_scaled, name=real.name)
    rs, ss = summarize(real), summarize(sim)
    rs["energy"] = measured_energy(memory, real.name, rs["total_output_tokens"])
    rs["device"] = device  # as `servesim engine run` records it: its report's busy time is a CPU's on a CPU
    out = VariantValidation(real.name, blocks, real, sim, rs, ss, compare(rs, _steps_only(sim, ss)), memory=memory,
                            schedule_differences=differences, schedule_steps=int(real.steps["duration"].size))
    if before is not None and after is not None and probe.base:
        out.machine_slowdown = float(np.sqrt(before * after)) / probe.base
        cost = scaled(load_profile(profile_path), out.machine_slowdown)
        adj = _simulate(sim_cfg, wl_scaled, cost, real.name)
        out.adjusted_metrics = compare(rs, _steps_only(adj, summarize(adj)))
    return out


def _steps_only(result: RunResult, summary: dict) -> dict:
    """``summary`` with its energy over the steps alone (``steps_energy``), as the engine's counter ran."""
    return {**summary, "energy": steps_energy(result, summary.get("energy"), summary["total_output_tokens"])}


def validate(scenario_path: str | Path, profile_path: str | Path, *, device: str = "cpu", model: str | None = None,
             num_gpu_blocks: int | None = None, time_scale: float = 1.0, overrides: dict[str, Any] | None = None,
             progress: bool = False, speed_probe: bool = True, variant: str | None = None) -> Validation:
    """Every variant of the scenario (or the one named ``variant``) on the engine and in the simulator (see the
    module docstring). With
    ``speed_probe`` (and a profile made by ``servesim calibrate``), the profile's reference step is timed around
    every engine run, and each variant also carries the comparison with the profile scaled by the slowdown."""
    import torch

    if device not in ("cpu", "cuda"):
        raise ScenarioError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device cuda: torch sees no CUDA device")
    why = time_scale_problem(time_scale)
    if why is not None:
        raise ScenarioError(why)
    if num_gpu_blocks is not None and num_gpu_blocks < 1:
        raise ScenarioError(f"--num-gpu-blocks must be >= 1, got {num_gpu_blocks}")
    profile = load_profile(profile_path)
    name = resolve_model(profile, model)
    sc, cfgs, wls = prepare(scenario_path, overrides, variant)
    why = time_scale_problem(time_scale, last_arrival=max((r.arrival for wl in wls.values() for r in wl.requests),
                                                          default=0.0))
    if why is not None:
        raise ScenarioError(why)
    from realengine.engine import engine_config
    from sim.loop.build import user_policy

    for cfg in cfgs:  # everything the input can get wrong fails before the first run
        if model is None:  # the profile's model in place of the scenario's only when asked (--model)
            _check_scenario_model(cfg, name)
        try:
            engine_config(cfg, model_spec=name, num_gpu_blocks=num_gpu_blocks, device=device)
        except ValueError as e:
            raise ScenarioError(str(e)) from None
        if (policy := user_policy(cfg)) is not None:
            policy.describe()  # one returning no line fails here, as under `servesim run` (it ran, exit 0)
    out = Validation(sc.name, str(profile_path), device, name, time_scale)
    probe = None
    if speed_probe:
        from calibration.measure import SpeedProbe
        from sim.hardware.models import is_model_preset

        with open(profile_path) as f:
            raw_profile = json.load(f)
        if raw_profile.get("model") and is_model_preset(raw_profile["model"]):
            probe = SpeedProbe(raw_profile, device=device)
            if probe.script is None:
                probe = None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cfgs), desc=f"validate {sc.name}", unit="variant", leave=False)
    for cfg in cfgs:
        out.variants.append(validate_variant(cfg, wls[cfg.name], profile_path, model=name, device=device,
                                             num_gpu_blocks=num_gpu_blocks, time_scale=time_scale, seed=sc.seed,
                                             probe=probe))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


# --- figures and the page -------------------------------------------------------------------------------------


def _latency_values(result: RunResult) -> dict[str, np.ndarray]:
    """The report's latencies, plus every inter-token gap (expanded from the pooled counts)."""
    from sim.output.report import latencies

    gaps, counts = np.asarray(result.itl_gaps, float), np.asarray(result.itl_counts, np.int64)
    return {**latencies(result), "itl": np.repeat(gaps[counts > 0], counts[counts > 0])}


PANELS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"), ("e2el", "E2EL (ms)"))


def fig_real_vs_sim_cdfs(v: VariantValidation) -> go.Figure:
    """Latency CDFs of one variant: the engine (solid) and the simulator (dashed)."""
    fig = make_subplots(rows=1, cols=4, subplot_titles=[p[1] for p in PANELS], horizontal_spacing=0.06)
    for i, (label, res) in enumerate((("engine", v.real), ("simulator", v.sim))):
        lat = _latency_values(res)
        for col, (key, title) in enumerate(PANELS, start=1):
            x = lat[key] * 1e3
            if x.size == 0:
                continue
            fig.add_trace(go.Scatter(name=label, legendgroup=label, showlegend=col == 1, mode="lines",
                                     line=dict(color=color(i), dash="solid" if i == 0 else "dash"),
                                     hovertemplate=f"{title}: %{{x:.4g}}<br>fraction: %{{y:.3f}}",
                                     **ecdf_points(x)), row=1, col=col)
            fig.update_xaxes(title_text=title, row=1, col=col)
    fig.update_yaxes(title_text="fraction", range=[0, 1.02], row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=360, hovermode="closest",
                      title=f"{v.name}: latency distributions, engine vs simulator")
    return fig


def _kv_series(res: RunResult, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    s = res.steps
    order = np.argsort(s["start"], kind="stable")
    t = np.asarray(s["start"])[order] + np.asarray(s["duration"])[order]
    cap = np.asarray(s["kv_capacity_blocks"], float)[order]
    cap = np.where(cap > 0, cap, float(res.kv_capacity_blocks))
    u = np.asarray(s["kv_blocks_used"], float)[order] / np.maximum(cap, 1.0)
    if t.size > max_points:
        keep = np.linspace(0, t.size - 1, max_points).astype(np.int64)
        t, u = t[keep], u[keep]
    return t, u


def fig_kv_over_time(v: VariantValidation) -> go.Figure:
    """KV blocks in use over capacity against time: the engine and the simulator."""
    fig = go.Figure()
    for i, (label, res) in enumerate((("engine", v.real), ("simulator", v.sim))):
        t, u = _kv_series(res)
        fig.add_trace(go.Scatter(x=t, y=100 * u, name=label, mode="lines", line_shape="hv",
                                 line=dict(color=color(i), dash="solid" if i == 0 else "dash")))
    fig.update_layout(template=TEMPLATE, height=320, title=f"{v.name}: KV usage over time",
                      xaxis_title="time (s)", yaxis_title="KV blocks used (%)")
    return fig


_CSS = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "th{background:#f3f3f3}td:first-child{text-align:left}.bad{color:#b00}")


def _table_html(v: VariantValidation) -> str:
    rows = ["<table><tr><th>metric</th><th>engine</th><th>simulator</th><th>error</th></tr>"]
    for name, m in v.metrics.items():
        e = m["rel_error"]
        cls = ' class="bad"' if e is not None and abs(e) > 0.10 else ""

        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.4g}"

        rows.append(f"<tr><td>{html.escape(name)}</td><td>{fmt(m['real'])}</td><td>{fmt(m['sim'])}</td>"
                    f"<td{cls}>{html.escape(error_text(m['real'], m['sim'], e))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def build_page(val: Validation) -> str:
    """One offline HTML page: per variant the error table, the CDF overlay and the KV usage over time."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>servesim validation: {html.escape(val.scenario)}</title><style>{_CSS}</style></head><body>",
             f"<h1>Validation: {html.escape(val.scenario)}</h1>",
             f"<p>Engine: {html.escape(val.model)} on {html.escape(val.device)}; simulator: profile "
             f"{html.escape(val.profile)}. Latencies in seconds (table) and ms (figures); error = (sim - real) / "
             "real.</p>"]
    n = 0
    for v in val.variants:
        parts.append(f"<h2>{html.escape(v.name)} ({v.num_gpu_blocks} KV blocks)</h2>")
        parts.append(f"<p>{html.escape(v.schedule_line())}</p>")
        parts.append(_table_html(v))
        for fig in (fig_real_vs_sim_cdfs(v), fig_kv_over_time(v)):
            parts.append(pio.to_html(fig, include_plotlyjs=n == 0, full_html=False, div_id=f"fig-{n}",
                                     config={"displaylogo": False, "responsive": True}))
            n += 1
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_validation(out_dir: str | Path, val: Validation, *, runs: bool = True) -> Path:
    """DIR/validation.json and DIR/validation.html; with ``runs``, also the two run folders DIR/engine and
    DIR/sim (summary.json, requests.csv, steps.csv, report.html; engine/ also memory.csv, the samples its energy
    figures were read from, as ``servesim engine run`` writes it). Whole or not at all: each is written into a
    staging folder first and all are moved into place together, Ctrl-C held back meanwhile (they were written in
    place one after the other, and a Ctrl-C while the page or a run folder was built left a new validation.json
    beside an earlier run's page and engine/ and sim/); an earlier validation's four are replaced, other files
    in DIR are left alone."""
    import os
    import shutil
    import tempfile

    from sim.config.files import sigint_deferred
    from sim.output.run_folder import MEMORY_FILE, to_jsonable, write_run

    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".validation-", suffix=".partial", dir=out))
    try:
        (stage / "validation.json").write_text(json.dumps(to_jsonable(val.to_dict()), indent=2, allow_nan=False)
                                               + "\n")
        (stage / "validation.html").write_text(build_page(val))
        names = ["validation.json", "validation.html"]
        if runs:
            samples = [row for v in val.variants for row in v.memory]
            extra = None
            if samples:  # (sampled by the engine, so torch is there)
                from realengine.engine import memory_csv

                extra = {MEMORY_FILE: memory_csv(samples)}
            write_run(stage / "engine", [v.real for v in val.variants],
                      {v.name: v.real_summary for v in val.variants}, title=f"engine: {val.scenario}", extra=extra)
            write_run(stage / "sim", [v.sim for v in val.variants],
                      {v.name: v.sim_summary for v in val.variants}, title=f"simulator: {val.scenario}")
            names += ["engine", "sim"]
        earlier = stage / "earlier"
        earlier.mkdir()
        with sigint_deferred():
            for name in names:
                if (out / name).exists() or (out / name).is_symlink():
                    os.replace(out / name, earlier / name)
                os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not any(out.iterdir()):
            out.rmdir()  # made here for files that never came
    return out
