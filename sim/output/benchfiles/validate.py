"""`servesim validate SCENARIO --against FILE...`: the simulator against a user's own benchmark results.

Per file (or per benchmark of a GuideLLM file): rebuild the workload the benchmark sent (per-request lengths where
recorded, else lengths drawn from the file's statistics; arrival times where recorded, else the request rate with
its burstiness as vLLM draws it, else the max concurrency as a closed loop), simulate it on the scenario's
deployment (one variant), and compare every metric the file holds with the same definition computed on the
simulated run (sim/output/benchfiles/stats.py). Error = (simulated - measured) / measured. Several files of one
deployment form a load sweep: the page draws measured and simulated curves against the load.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.limits import MAX_ARRIVAL_S
from sim.metrics.records import RunResult
from sim.output.benchfiles.common import BenchFileError, BenchRun, read_bench_json
from sim.output.benchfiles.genai_perf import is_genai_perf, read_genai_perf
from sim.output.benchfiles.guidellm import is_guidellm, read_guidellm
from sim.output.benchfiles.stats import guidellm_stats, run_stats
from sim.output.benchfiles.vllm_bench import read_vllm_bench
from sim.serving.request import RequestSpec
from sim.workload.generator import ClosedLoop, GeneratedWorkload

DEFAULT_NUM_REQUESTS = 200  # when a file gives neither per-request lengths nor a request count
_PCT = re.compile(r"^p(\d+(?:\.\d+)?)_")


def read_bench_files(paths: list[str | Path]) -> list[BenchRun]:
    """Every run of every file, the format detected from the content."""
    runs: list[BenchRun] = []
    seen: dict[Path, Path] = {}
    for path in paths:
        p = Path(path)
        # a file given twice (a.json and ./a.json, or two globs that overlap) was read twice: a fit weighted it
        # double, a validation compared it twice
        first = seen.setdefault(p.resolve(), p)
        if first is not p:
            raise BenchFileError(f"{p}: given twice" + (f" (also as {first})" if str(first) != str(p) else ""))
        data = read_bench_json(p)
        if is_guidellm(data):
            runs.extend(read_guidellm(p, data))
        elif is_genai_perf(data):
            runs.append(read_genai_perf(p, data))
        else:
            runs.append(read_vllm_bench(p, data))
    return runs


def _lengths(stats: dict[str, float], n: int, rng: np.random.Generator, cap: int) -> np.ndarray:
    mean, std = stats["avg"], stats.get("std", 0.0)
    lo, hi = max(1.0, stats.get("min", 1.0)), min(float(cap), stats.get("max", float(cap)))
    return np.clip(np.rint(rng.normal(mean, std, n) if std > 0 else np.full(n, mean)), lo, max(lo, hi)).astype(int)


def rebuild_workload(run: BenchRun, *, seed: int = 0, max_len: int = 1 << 20) -> tuple[GeneratedWorkload, list[str]]:
    """The requests the benchmark sent, and notes on what had to be assumed."""
    notes: list[str] = []
    rng = np.random.default_rng(seed)
    if run.input_lens:
        ins, outs = np.asarray(run.input_lens), np.asarray(run.output_lens)
    elif run.input_len_stats and run.output_len_stats:
        n = run.num_requests or DEFAULT_NUM_REQUESTS
        ins = _lengths(run.input_len_stats, n, rng, max_len)
        outs = _lengths(run.output_len_stats, n, rng, max_len)
        if run.format != "vllm-bench":
            notes.append(f"{run.source}: no per-request lengths; {n} requests drawn from the file's length "
                         "statistics")
        else:  # saved without --save-detailed: the means alone (vllm_bench._mean_lengths)
            notes.append(f"{run.source}: no per-request lengths (saved without --save-detailed); {n} requests of "
                         f"the mean lengths, {run.input_len_stats['avg']:.0f} prompt and "
                         f"{run.output_len_stats['avg']:.0f} output tokens")
    elif run.num_failed:  # the lengths were there, but vLLM's lists hold failed requests too
        raise BenchFileError(f"{run.source}: every one of its {run.num_failed} requests failed (a non-empty errors "
                             "entry or no output): no request to rebuild")
    else:
        # the reader's reasons (e.g. "ttfts: length 3 != input_lens' 5"): without them a file whose input_lens
        # are there reads as if it had none, and the field to fix goes unnamed
        why = "".join(f"; {s.removeprefix(f'{run.source}: ')}" for s in run.skipped)
        raise BenchFileError(f"{run.source}: no per-request lengths and no length statistics: cannot rebuild the "
                             f"workload{why}")
    keep = (ins >= 1) & (outs >= 1)
    ins, outs = ins[keep], outs[keep]
    n = int(ins.size)
    closed = None
    what = ""  # where the arrival times came from, for the message that refuses them
    if run.arrival_times_s is not None and len(run.arrival_times_s) == len(keep):
        times = np.asarray(run.arrival_times_s, dtype=np.float64)[keep]
        what = "start_times"
    elif run.ramp_up is not None:  # vLLM's get_request: request i at its own rate, no rescaling
        kind, lo, hi = run.ramp_up
        what = f"ramp_up_strategy {kind}"
        b = run.burstiness if run.burstiness is not None else 1.0
        progress = np.arange(n) / max(n - 1, 1)
        rates = lo + (hi - lo) * progress if kind == "linear" else lo * (hi / lo) ** progress
        times = np.cumsum(1.0 / rates if math.isinf(b) else rng.gamma(b, 1.0 / (rates * b)))
        notes.append(f"{run.source}: no arrival times; drawn on vLLM's {kind} ramp-up from {lo:g} to {hi:g} req/s, "
                     f"burstiness {b:g} (seed {seed})")
    elif run.request_rate is not None:
        what = f"request_rate {run.request_rate:g}"
        b = run.burstiness if run.burstiness is not None else 1.0
        if math.isinf(b):
            gaps = np.full(n, 1.0 / run.request_rate)
        else:
            gaps = rng.gamma(b, 1.0 / (run.request_rate * b), n)
        times = np.cumsum(gaps)
        if times[-1] > 0:  # vLLM rescales the draws so that n requests take exactly n / rate seconds
            times *= (n / run.request_rate) / times[-1]
        notes.append(f"{run.source}: no arrival times; drawn at {run.request_rate:g} req/s, burstiness {b:g} "
                     f"(seed {seed})")
        if run.max_concurrency is not None:  # saved start_times would be the sends after the client's wait
            notes.append(f"{run.source}: max_concurrency {run.max_concurrency} beside the request rate: vLLM's client "
                         f"held the requests past {run.max_concurrency} in flight, the simulation sends each at its "
                         "drawn time (the cap is not modelled)")
    elif run.max_concurrency is not None:
        times = np.zeros(n)
        closed = ClosedLoop(run.max_concurrency, np.zeros(n))
        notes.append(f"{run.source}: closed loop of {run.max_concurrency} concurrent requests, no think time")
    else:
        times = np.zeros(n)
        # a file without request_rate was said to have "request rate inf", which vllm bench serve writes itself
        said = "request_rate absent, taken as inf" if run.request_rate_absent else "request rate inf"
        notes.append(f"{run.source}: {said}: every request at t=0")
    last = float(times.max()) if n else 0.0
    if last > MAX_ARRIVAL_S:  # as the workload generator refuses it: there every step is rounded away (TTFT 0)
        raise BenchFileError(f"{run.source}: {what}: the last of {n} requests arrives at {last:.3g} s, past the "
                             f"{MAX_ARRIVAL_S:.0e} s a run may span (at that clock a step's milliseconds are lost to "
                             "rounding)")
    order = np.argsort(times, kind="stable")
    users = run.max_concurrency if closed is not None else None
    specs = tuple(
        RequestSpec(i, float(times[j]), int(ins[j]), int(outs[j]), (), 512, (i % users) if users else None)
        for i, j in enumerate(order.tolist())
    )
    return GeneratedWorkload(specs, closed), notes


# below this a measured figure is (almost) zero in any unit the tables hold (seconds, tokens/s, a fraction, a count):
# a std or a latency left at 1e-16 by rounding made the relative error read +1e16%, which says nothing
REL_ERROR_FLOOR = 1e-9


def relative_error(measured: float, simulated: float) -> float | None:
    """``(simulated - measured) / |measured|``; 0 when both are below ``REL_ERROR_FLOOR``; None when either is NaN
    or only the measured figure is below the floor (``error_text`` says why)."""
    if not (math.isfinite(measured) and math.isfinite(simulated)):
        return None
    if abs(measured) < REL_ERROR_FLOOR:
        return 0.0 if abs(simulated) < REL_ERROR_FLOOR else None
    return (simulated - measured) / abs(measured)


def error_reason(measured: float | None, simulated: float | None) -> str | None:
    """Why ``relative_error`` of these figures is None (what a JSON reader gets beside the null), else None."""
    no_sim = simulated is None or not math.isfinite(simulated)
    if measured is None or not math.isfinite(measured):
        return "no measured figure" + (" and no simulated one" if no_sim else "")
    if simulated is None or not math.isfinite(simulated):
        return "no simulated figure"
    if abs(measured) < REL_ERROR_FLOOR <= abs(simulated):
        return (f"measured ~0 (|x| < {REL_ERROR_FLOOR:g}) against simulated {simulated:.6g}: no meaningful relative "
                "error; compare the two figures")
    return None


def error_text(measured: float | None, simulated: float | None, error: float | None, scale: float = 1.0,
               unit: str = "") -> str:
    """The error cell: ``+4.2%``; where a measured figure below ``REL_ERROR_FLOOR`` left no relative error, the
    absolute difference instead (in the row's ``unit`` after ``scale``) and why."""
    if error is not None:
        return f"{error:+.1%}"
    if measured is not None and simulated is not None and math.isfinite(simulated) and \
            abs(measured) < REL_ERROR_FLOOR:
        return f"n/a (measured ~0, |x| < {REL_ERROR_FLOOR:g}: difference {(simulated - measured) * scale:+.3g}{unit})"
    return "n/a"


def simulated_metrics(result: RunResult, keys: list[str]) -> dict[str, float]:
    pct = sorted({float(m.group(1)) for k in keys if (m := _PCT.match(k))} | {99.0})
    out = run_stats(result, pct)
    if any("gl_" in k for k in keys):
        out.update(guidellm_stats(result, pct))
    return out


@dataclass
class FileValidation:
    source: str
    label: str | None
    format: str
    load: float | None
    load_kind: str  # "request_rate" | "max_concurrency" | ""
    # per metric: measured, simulated, error; interval_80 [low, high] and inside_80 where sim/metrics/intervals.py has
    # one
    metrics: dict[str, dict[str, Any]]
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    result: RunResult | None = None
    # how the requests arrived where the file gives no load (no request rate, no max_concurrency): "all at once",
    # the rate its start_times show, or vLLM's ramp-up (``arrivals_text``)
    arrivals: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.source, "benchmark": self.label, "format": self.format, "load": self.load,
                "load_kind": self.load_kind, "arrivals": self.arrivals or None, "metrics": self.metrics,
                "skipped": self.skipped, "notes": self.notes}


def _unit(key: str) -> tuple[float, str]:
    """(factor, unit) a metric is printed in: latencies in ms as vLLM's files name them (``mean_ttft_ms``; the
    terminal read ``measured 0.0711552`` beside a file saying 71.16), rates in req/s or tok/s (a bare ``/s`` left
    requests and tokens apart only by the key's name)."""
    if key.endswith("throughput"):  # vLLM's own words: "Request throughput (req/s)", "Output token ... (tok/s)"
        return 1.0, " req/s" if key.startswith("request") else " tok/s"
    if key.endswith(("ttft", "tpot", "itl", "e2el")):
        return 1e3, " ms"
    return 1.0, ""


def figure(x: float) -> str:
    """A measured or simulated figure (after ``_unit``'s factor) with two decimals, as vLLM's bench serve prints
    them: the table read "measured 16.33 ms  simulated 5.33325 ms  80% interval 12.8745-48.9059", the file's two
    decimals beside six significant figures. Under 0.1 (0.0066 ms, 0.004 req/s) two significant figures instead,
    not 0.01 or 0.00."""
    return f"{x:.2g}" if 0 < abs(x) < 0.1 else f"{x:.2f}"


def _labelled(key: str) -> str:
    """``mean_ttft (ms)``: the key with the unit validation.html gives its figures in, as the terminal's table does
    (the page kept seconds beside a file and a table in ms)."""
    unit = _unit(key)[1].strip()
    return f"{key} ({unit})" if unit else key


def _interval_text(key: str, m: dict[str, Any]) -> str:
    if "interval_80" not in m:
        return ""
    f, unit = _unit(key)
    lo, hi = m["interval_80"]
    return (f"  80% interval {figure(lo * f)}-{figure(hi * f)}{unit}: measured "
            f"{'inside' if m['inside_80'] else 'outside'}")


@dataclass
class BenchValidation:
    scenario: str
    variant: str
    files: list[FileValidation]

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "variant": self.variant, "files": [f.to_dict() for f in self.files]}

    def table(self) -> str:
        lines = []
        for f in self.files:
            name = f.source + (f" {f.label}" if f.label else "")
            lines.append(f"{name} ({f.format}, {_load_text(f)}):")
            for k, m in f.metrics.items():
                x, unit = _unit(k)
                err = error_text(m["measured"], m["simulated"], m["error"], x, unit)
                lines.append(f"  {k:28s} measured {figure(m['measured'] * x)}{unit}  simulated "
                             f"{figure(m['simulated'] * x)}{unit}  error {err}"
                             + _interval_text(k, m))
            for s in f.skipped:
                lines.append(f"  skipped: {s}")
            for s in f.notes:
                lines.append(f"  note: {s}")
        return "\n".join(lines)


def _load_text(f: FileValidation) -> str:
    """The file's load with its kind and unit: ``load 4.0`` read as 4 req/s for a closed loop of 4 requests."""
    if f.load is None:  # "request rate inf" said nothing of a file that gives its own start_times or a ramp
        return f.arrivals or "all requests at once"
    if f.load_kind == "max_concurrency":
        return f"max_concurrency {f.load:g} (a closed loop)"
    return f"request rate {f.load:g} req/s" if f.load_kind == "request_rate" else f"load {f.load:g}"


def arrivals_text(run: BenchRun, wl: GeneratedWorkload) -> str:
    """How a file without a load (no request rate, no max_concurrency) sent its requests: all at once (vLLM's
    request rate inf), on vLLM's ramp-up, or at the rate its start times show; "" for a file with a load."""
    if run.load is not None:
        return ""
    times = np.array([r.arrival for r in wl.requests])
    span = float(times.max() - times.min()) if times.size > 1 else 0.0
    if span <= 0:
        return "request rate inf: all requests at once"
    if run.ramp_up is not None and run.arrival_times_s is None:
        kind, lo, hi = run.ramp_up
        return f"{kind} ramp-up from {lo:g} to {hi:g} req/s"
    return f"{(times.size - 1) / span:.3g} req/s as its start times show, {times.size} requests over {span:.3g} s"


def refuse_other_model(runs: list[BenchRun], simulated: str | dict[str, Any], who: str,
                       how: str = "to simulate that model give --set deployment.model=") -> None:
    """A ``ScenarioError`` where a file's model id is a preset other than the one the variant simulates: a 70B
    benchmark was compared with an 8B simulation (errors of -66% read as the simulator's) under a note, and
    calibrate --from-bench fitted an 8B's knobs to it. An id that is no preset, or a model given as a config, is
    judged by ``_other_model`` (a note) only. ``who``: what simulates ``simulated`` ("variant cb"); ``how``: what
    gives the file's preset, which ends it."""
    from sim.config.schema import ScenarioError
    from sim.hardware.names import match_model

    mine = match_model(simulated) if isinstance(simulated, str) else None
    for run in runs:
        served = match_model(run.model) if mine and run.model else None
        if served is not None and served != mine:
            raise ScenarioError(f"{run.source}: the benchmark served {run.model} (the preset {served}), but {who} "
                                f"simulates {simulated}; {how}{served}")


def _other_model(served: str | None, simulated: str | dict[str, Any]) -> bool:
    """Whether a file's model id (``meta-llama/Llama-3.1-70B``) cannot be the scenario's preset (``llama-3.1-8b``):
    the preset's letters and digits are not in the id's last part. A model given as a config, or a file without
    a model id, is not judged."""
    if not served or not isinstance(simulated, str):
        return False

    def key(s: str) -> str:
        return re.sub(r"[^a-z0-9]", "", s.lower())

    return key(simulated) not in key(served.rsplit("/", 1)[-1])


def not_completed(result: RunResult) -> tuple[int, int, str]:
    """(requests, completed, why the others were not: "reason (count); ...") of a run of a benchmark's workload.
    A request the benchmark served but the simulated variant rejects (a max_model_len below its length) leaves
    the simulated metrics over the others only, and over none they read 0."""
    from sim.metrics.request_table import as_table
    from sim.metrics.verdict import rejection_reasons

    table = as_table(result.requests)
    n, done = len(table), int(np.count_nonzero(table.outcome_is("completed")))
    if done == n:
        return n, done, ""
    why = "; ".join(f"{text} ({count})" for text, count in rejection_reasons(result.requests).items())
    return n, done, why


def _note_rejected(source: str, variant: str, result: RunResult, notes: list[str]) -> None:
    """Say which of the benchmark's requests the simulated variant did not complete (``not_completed``); none
    completed is an error."""
    from sim.config.schema import ScenarioError

    n, done, why = not_completed(result)
    if done == n:
        return
    if done == 0:
        raise ScenarioError(f"{source}: the simulated variant {variant} completed none of the benchmark's {n} "
                            f"requests ({why}): nothing to compare")
    notes.append(f"{source}: the simulated variant {variant} rejected {n - done} of the benchmark's {n} requests, "
                 f"which the benchmark served ({why}): its metrics are over the {done} it completed")


def chosen_variants(cfgs: list, name: str | None) -> list:
    """The variant configs, or only the one named ``name`` (validate's --variant); an unknown name is a
    ``ScenarioError`` naming the scenario's variants."""
    from sim.config.schema import ScenarioError

    if name is None:
        return cfgs
    mine = [c for c in cfgs if c.name == name]
    if not mine:
        raise ScenarioError(f"--variant {name}: no such variant (the scenario has {', '.join(c.name for c in cfgs)})")
    return mine


def validate_against(scenario_path: str | Path, files: list[str | Path], *, variant: str | None = None,
                     overrides: dict[str, Any] | None = None, seed: int | None = None,
                     profile: str | Path | None = None) -> BenchValidation:
    """``profile``: a calibration profile whose step times the variant runs on (its ``deployment.cost_model``
    replaced by ``{type: fitted, profile}``), as ``servesim validate --profile`` gives it."""
    import dataclasses

    from sim.config.deployment import FittedCost
    from sim.config.scenario import load_scenario, variant_configs
    from sim.loop.run import simulate_variant
    from sim.metrics.intervals import bench_interval, no_interval_reason

    sc, _ = load_scenario(scenario_path, overrides)
    cfg = chosen_variants(variant_configs(sc), variant)[0]
    assumed = []
    if sc.sweep:
        assumed.append("the scenario's sweep is ignored: the variant is simulated as written (servesim sweep runs "
                       "the points)")
    if profile is not None:
        cost = FittedCost(profile=str(profile))  # a profile that cannot be read is refused as the variant is built
        cfg = dataclasses.replace(cfg, deployment=cfg.deployment.model_copy(update={"cost_model": cost}))
        assumed.append(f"step times from the profile {profile} (deployment.cost_model of variant {cfg.name} replaced)")
    runs = read_bench_files(list(files))
    refuse_other_model(runs, cfg.deployment.model, f"variant {cfg.name}")
    out: list[FileValidation] = []
    for run in runs:
        wl, notes = rebuild_workload(run, seed=sc.seed if seed is None else seed,
                                     max_len=int(cfg.deployment.max_model_len or (1 << 20)))
        if _other_model(run.model, cfg.deployment.model):
            notes.append(f"{run.source}: the benchmark served {run.model}, the variant simulates "
                         f"{cfg.deployment.model}; check that they are the same model")
        result, _, _ = simulate_variant(cfg, wl, name=cfg.name)
        _note_rejected(run.source, cfg.name, result, notes)
        notes += assumed
        no_interval = no_interval_reason(result.config)
        if no_interval:
            notes.append(f"no 80% intervals: {no_interval}")
        sim = simulated_metrics(result, list(run.aggregates))
        metrics: dict[str, dict[str, Any]] = {}
        skipped = list(run.skipped)
        for key, measured in run.aggregates.items():
            if key not in sim:
                skipped.append(f"{run.source}: {key}: no simulated counterpart")
                continue
            metrics[key] = {"measured": measured, "simulated": sim[key], "error": relative_error(measured, sim[key])}
            if metrics[key]["error"] is None:  # a null says why (a reader of validation.json saw a bare null)
                metrics[key]["error_reason"] = error_reason(measured, sim[key])
            # sim/metrics/intervals.py: TPOT, ITL, throughputs
            if not no_interval and (iv := bench_interval(key, sim[key])) is not None:
                metrics[key] |= {"interval_80": iv, "inside_80": iv[0] <= measured <= iv[1]}
        kind = "request_rate" if run.request_rate is not None else "max_concurrency" if run.max_concurrency else ""
        out.append(FileValidation(run.source, run.label, run.format, run.load, kind, metrics, skipped, notes, result,
                                  arrivals_text(run, wl)))
    return BenchValidation(sc.name, cfg.name, out)


_CSS = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "th{background:#f3f3f3}td:first-child{text-align:left}.bad{color:#b00}")


def _sweep_figure(val: BenchValidation):
    """Measured and simulated curves against the load, one panel per metric every file has."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sim.output.report import TEMPLATE

    pts = sorted((f for f in val.files if f.load is not None), key=lambda f: f.load or 0.0)
    keys = [k for k in pts[0].metrics if all(k in f.metrics for f in pts)] if pts else []
    keys = [k for k in keys if k.startswith(("mean_", "median_", "p99_")) or "throughput" in k][:12]
    if len(pts) < 2 or not keys:
        return None
    cols = 3
    rows = math.ceil(len(keys) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[_labelled(k) for k in keys])
    x = [f.load for f in pts]
    for i, k in enumerate(keys):
        r, c = i // cols + 1, i % cols + 1
        scale = _unit(k)[0]
        for what, color in (("measured", "#1f77b4"), ("simulated", "#d62728")):
            fig.add_trace(go.Scatter(x=x, y=[f.metrics[k][what] * scale for f in pts], mode="lines+markers", name=what,
                                     line=dict(color=color), showlegend=i == 0, legendgroup=what), row=r, col=c)
    # the load on each column's lowest panel (above another panel a title would meet that panel's name)
    axis = {"request_rate": "request rate (req/s)", "max_concurrency": "max_concurrency (requests, a closed loop)"}
    for i in range(len(keys)):
        if i + cols >= len(keys):
            fig.update_xaxes(title_text=axis.get(pts[0].load_kind, "load"), row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(template=TEMPLATE, height=300 * rows, title=f"Load sweep ({pts[0].load_kind or 'load'})")
    return fig


def build_page(val: BenchValidation) -> str:
    import plotly.io as pio

    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>servesim validation: {html.escape(val.scenario)}</title><style>{_CSS}</style></head><body>",
             f"<h1>Validation against benchmark files: {html.escape(val.scenario)}</h1>",
             f"<p>Simulated variant: {html.escape(val.variant)}. Latencies in ms, as vLLM's files and the terminal "
             "give them (validation.json keeps seconds); error = (simulated - measured) / measured.</p>"]
    fig = _sweep_figure(val)
    if fig is not None:
        parts.append(pio.to_html(fig, include_plotlyjs=True, full_html=False, div_id="fig-sweep",
                                 config={"displaylogo": False, "responsive": True}))
    for f in val.files:
        title = html.escape(f.source + (f" {f.label}" if f.label else ""))
        parts.append(f"<h2>{title}</h2><p>{html.escape(f.format)}, {html.escape(_load_text(f))}"
                     f"</p><table><tr><th>metric</th><th>measured</th><th>simulated</th><th>error</th>"
                     "<th>80% interval</th></tr>")
        for k, m in f.metrics.items():
            e = m["error"]
            x, unit = _unit(k)
            bad = ' class="bad"' if e is not None and abs(e) > 0.1 else ""
            iv = ""
            if "interval_80" in m:
                lo, hi = m["interval_80"]
                outside = "" if m["inside_80"] else ' class="bad"'
                iv = f"<span{outside}>{figure(lo * x)}-{figure(hi * x)}</span>"
            parts.append(f"<tr><td>{html.escape(_labelled(k))}</td><td>{figure(m['measured'] * x)}</td>"
                         f"<td>{figure(m['simulated'] * x)}</td><td{bad}>"
                         f"{html.escape(error_text(m['measured'], m['simulated'], e, x, unit))}</td><td>{iv}</td></tr>")
        parts.append("</table>")
        for title_, items in (("Skipped", f.skipped), ("Assumed", f.notes)):
            if items:
                parts.append(f"<p>{title_}:</p><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in items) +
                             "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_bench_validation(out_dir: str | Path, val: BenchValidation) -> Path:
    """DIR/validation.json and DIR/validation.html, written whole. Over an engine validation (validate --profile)
    its engine/ and sim/ run folders go too: they stayed beside the new page, another run's replays passing for
    this one's."""
    import shutil

    from sim.config.files import sigint_deferred, write_atomically
    from sim.output.run_folder import to_jsonable

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    earlier = _engine_validation_runs(out)
    write_atomically(out, {"validation.json": json.dumps(to_jsonable(val.to_dict()), indent=1, allow_nan=False),
                           "validation.html": build_page(val)})
    with sigint_deferred():
        for folder in earlier:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def _engine_validation_runs(out: Path) -> list[Path]:
    """The engine/ and sim/ run folders of an engine validation (calibration/validate.py) in ``out``: those its
    validation.json (one with a ``profile``) wrote beside it, each holding a summary.json."""
    try:
        doc = read_bench_json(out / "validation.json")
    except BenchFileError:  # none there, or not one servesim wrote
        return []
    if not (isinstance(doc, dict) and "profile" in doc and "files" not in doc):
        return []
    return [out / name for name in ("engine", "sim") if (out / name / "summary.json").is_file()]
