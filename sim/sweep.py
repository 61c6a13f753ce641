"""Sweeps of many simulations: run in parallel, streamed to disk, resumable.

    servesim sweep SCENARIO.yaml --out DIR [--executor local|ray] [--workers N] [--address ADDR]

One run is one (sweep point, variant) of a scenario. Every run is seeded by the scenario and independent of the
others, so its row does not depend on which executor, worker or order ran it: a sweep on a Ray cluster writes
the same table as one on a laptop (the tests compare them). Each finished run is appended to ``DIR/sweep.csv``
at once (one row of scalar metrics, flushed), so thousands of runs never sit in memory, and an interrupted
sweep resumes where it stopped: runs whose row is already there are not redone. When every run is done the
table is rewritten in run order and ``DIR/sweep.html`` shows it with one plot per metric against the swept
parameter.

Executors: ``local`` (a process pool, one worker per core by default; ``workers=1`` runs in this process) and
``ray`` (tasks on an existing cluster, ``address``, or on a Ray instance started here). Ray is the optional
``ray`` extra.
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.scenario import apply_point, sweep_points, variant_configs
from sim.schema import Scenario, ScenarioError

# The metrics a row keeps: summary keys, nested ones dotted (``ttft.p99``).
METRICS: tuple[str, ...] = (
    "num_requests", "num_completed", "num_rejected", "num_failed", "num_preemptions", "num_steps", "duration",
    "request_throughput", "output_throughput", "total_token_throughput", "goodput", "slo_attainment",
    *(f"{m}.{q}" for m in ("ttft", "tpot", "itl", "e2el", "queue") for q in ("mean", "p50", "p90", "p99")),
    "kv_usage.mean", "kv_usage.max", "kv_token_utilization", "busy_fraction", "mfu", "mean_batch_size",
    "cluster.replicas_mean", "cluster.replicas_max", "cluster.gpu_hours", "cluster.cost_usd",  # clusters only
    "bottleneck",
)
_SECONDS = ("duration", "ttft.", "tpot.", "itl.", "e2el.", "queue.")


def column(metric: str) -> str:
    """sweep.csv's column for a metric: a time in seconds says so in its name (``ttft.p99_s``), as in
    requests.csv; rates are per second by their names (``output_throughput``: tokens/s)."""
    return f"{metric}_s" if metric.startswith(_SECONDS) else metric


PLOTTED = tuple(column(m) for m in ("output_throughput", "goodput", "ttft.p99", "tpot.p99", "e2el.p99",
                                      "kv_usage.mean"))


@dataclass(frozen=True)
class SweepTask:
    """One run: everything a worker needs, picklable (a plain scenario dict, not the parsed objects)."""

    index: int  # position in the sweep's run order
    key: str  # stable name of the run: ``variant[param=value,...]``
    variant: str
    point: dict[str, Any]
    raw: dict[str, Any]  # the scenario as a dict (sweep section included; apply_point drops it)
    source: str


def _label(point: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def plan_sweep(scenario: Scenario, raw: dict[str, Any] | None = None, *, source: str = "scenario") -> list[SweepTask]:
    """Every run of the scenario, checked: a point or variant that cannot be built fails here, before any run."""
    raw = raw if raw is not None else scenario.model_dump(mode="json")
    tasks: list[SweepTask] = []
    for point in sweep_points(scenario):
        sc = apply_point(raw, point, source) if point else scenario
        try:
            cfgs = variant_configs(sc)
        except ScenarioError as e:
            raise ScenarioError(f"{source} at {point}: {e}" if point else str(e)) from None
        for cfg in cfgs:
            key = f"{cfg.name}[{_label(point)}]" if point else cfg.name
            tasks.append(SweepTask(len(tasks), key, cfg.name, dict(point), raw, source))
    return tasks


def columns_for(tasks: Sequence[SweepTask]) -> list[str]:
    params = []
    for t in tasks:
        for k in t.point:
            if k not in params:
                params.append(k)
    return ["index", "key", "variant", *params, *map(column, METRICS)]


# ---- one run (in a worker) ---------------------------------------------------------------------------------------
_WORKLOADS: dict[str, Any] = {}  # per worker process: a workload drawn once serves every variant that shares it


def run_task(task: SweepTask) -> dict[str, Any]:
    """Simulate one run and return its row. Top-level, so that process pools and Ray can ship it."""
    from sim.metrics import bottleneck, summarize
    from sim.run import generate_workload, simulate_variant, workload_key
    from sim.scenario import slos_of

    sc = apply_point(task.raw, task.point, task.source)  # the empty point: the scenario itself
    cfg = next(c for c in variant_configs(sc) if c.name == task.variant)
    wkey = workload_key(sc, cfg) + f"|{sc.seed}"
    wl = _WORKLOADS.get(wkey)
    if wl is None:
        if len(_WORKLOADS) > 8:  # a worker may see many points; keep the few most recent workloads
            _WORKLOADS.pop(next(iter(_WORKLOADS)))
        wl = _WORKLOADS[wkey] = generate_workload(sc, cfg.workload)
    result, _, _ = simulate_variant(cfg, wl, name=task.key)
    summary = summarize(result, slos_of(sc))
    row: dict[str, Any] = {"index": task.index, "key": task.key, "variant": task.variant, **task.point}
    for m in METRICS:
        if m == "bottleneck":
            row[m] = bottleneck(summary)
            continue
        head, _, sub = m.partition(".")
        v = summary.get(head)
        if sub:
            v = v.get(sub) if isinstance(v, dict) else None
        row[column(m)] = v
    return row


def _sweep_job(_shared: Any, task: SweepTask) -> dict[str, Any]:
    return run_task(task)


# ---- any independent jobs ----------------------------------------------------------------------------------------
_SHARED: Any = None  # per worker process: the value every job of a parallel_map shares (e.g. a workload)


def _init_shared(value: Any) -> None:
    global _SHARED
    _SHARED = value


def _call_shared(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_SHARED, item)


def parallel_map(
    fn: Callable[[Any, Any], Any],
    items: Sequence[Any],
    *,
    shared: Any = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
) -> Iterator[tuple[int, Any]]:
    """``fn(shared, item)`` for every item, in parallel; yields ``(index, result)`` as jobs finish. ``shared`` is
    shipped once per worker (local) or once to the object store (Ray), not once per job. ``fn`` must be a
    top-level function. ``workers=1`` (or a single item) runs here, in order."""
    workers = workers or os.cpu_count() or 1
    if executor == "local" and (workers <= 1 or len(items) <= 1):
        for i, item in enumerate(items):
            yield i, fn(shared, item)
        return
    if executor == "local":
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=mp.get_context("spawn"),
                                    initializer=_init_shared, initargs=(shared,)) as pool:
            futures = {pool.submit(_call_shared, fn, item): i for i, item in enumerate(items)}
            try:
                for f in cf.as_completed(futures):
                    yield futures[f], f.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        return
    if executor != "ray":
        raise ScenarioError(f"--executor must be 'local' or 'ray', got {executor!r}")
    ray, started = _ray_init(workers, address)
    try:
        ref = ray.put(shared)
        remote = ray.remote(fn)
        pending = {remote.remote(ref, item): i for i, item in enumerate(items)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for r in done:
                yield pending.pop(r), ray.get(r)
    finally:
        if started:
            ray.shutdown()


def _ray_init(workers: int, address: str | None):
    try:
        import ray
    except ImportError:
        raise ScenarioError("--executor ray needs Ray: pip install 'servesim[ray]'") from None
    if ray.is_initialized():
        return ray, False
    kw: dict[str, Any] = {"address": address} if address else {"num_cpus": workers or None}
    # the workers import the project from the driver's source tree
    kw["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [
        str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))}}
    ray.init(include_dashboard=False, log_to_driver=False, **kw)
    return ray, True


# ---- the sweep ---------------------------------------------------------------------------------------------------
@dataclass
class SweepOutcome:
    out_dir: Path
    rows: list[dict[str, Any]]  # every run, in run order
    ran: int  # runs simulated by this call
    resumed: int  # runs found done in the folder


def _fingerprint(tasks: Sequence[SweepTask]) -> str:
    text = json.dumps([tasks[0].raw if tasks else {}, [t.key for t in tasks]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _parse(v: str) -> Any:
    if v == "":
        return None
    try:
        x = float(v)
    except ValueError:
        return v
    return int(x) if x.is_integer() and "." not in v and "e" not in v.lower() else x


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a sweep.csv, numbers parsed (empty cells: None)."""
    with open(path, newline="") as f:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


def run_sweep(
    scenario: Scenario,
    raw: dict[str, Any] | None,
    out_dir: str | os.PathLike,
    *,
    source: str = "scenario",
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    fresh: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SweepOutcome:
    """Run every (point, variant) of the scenario not already in ``out_dir``, appending rows as they finish."""
    if executor not in ("local", "ray"):
        raise ScenarioError(f"--executor must be 'local' or 'ray', got {executor!r}")
    tasks = plan_sweep(scenario, raw, source=source)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    table, meta_path = out / "sweep.csv", out / "sweep.json"
    cols = columns_for(tasks)
    meta = {"scenario": scenario.name, "fingerprint": _fingerprint(tasks), "runs": len(tasks), "columns": cols}
    done: dict[str, dict[str, Any]] = {}
    if fresh:
        table.unlink(missing_ok=True)
    elif table.exists():
        old = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if old.get("fingerprint") != meta["fingerprint"]:
            raise ScenarioError(f"{out} holds a sweep of another scenario (or other runs); use another --out, or "
                                "--fresh to start over")
        if old.get("columns") != cols:
            raise ScenarioError(f"{out}/sweep.csv has other columns (written by another servesim version); use "
                                "another --out, or --fresh to start over")
        done = {r["key"]: r for r in read_rows(table)}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    todo = [t for t in tasks if t.key not in done]
    workers = workers or os.cpu_count() or 1
    new_file = not table.exists() or table.stat().st_size == 0
    with open(table, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        if new_file:
            w.writeheader()
            f.flush()
        for _, row in parallel_map(_sweep_job, todo, executor=executor, workers=workers, address=address):
            w.writerow(row)
            f.flush()  # a finished run survives an interruption
            done[row["key"]] = row
            if progress is not None:
                progress(len(done), len(tasks))
    rows = sorted((read_rows(table)), key=lambda r: r["index"])
    tmp = table.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:  # the final table, in run order, replaces the streamed one whole
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(table)
    write_sweep_html(out / "sweep.html", scenario.name, rows, cols)
    return SweepOutcome(out, rows, ran=len(todo), resumed=len(tasks) - len(todo))


# ---- the page ----------------------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def write_sweep_html(path: Path, title: str, rows: list[dict[str, Any]], cols: list[str]) -> Path:
    """One table and one plot per metric: the metric against the first swept parameter, a line per variant."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    params = cols[3 : len(cols) - len(METRICS)]
    parts = [f"<h1>servesim sweep: {html.escape(title)}</h1>", f"<p>{len(rows)} runs.</p>"]
    if params and rows:
        x_name = params[0]
        fig = make_subplots(rows=math.ceil(len(PLOTTED) / 2), cols=2, subplot_titles=PLOTTED)
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:  # one line per variant and per value of the other parameters
            rest = ",".join(f"{p}={r.get(p)}" for p in params[1:])
            groups.setdefault(r["variant"] + (f" [{rest}]" if rest else ""), []).append(r)
        for gi, (name, rs) in enumerate(groups.items()):
            for mi, m in enumerate(PLOTTED):
                pts = [(r[x_name], r[m]) for r in rs if isinstance(r.get(m), (int, float))]
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=name, legendgroup=name,
                                         showlegend=mi == 0, mode="lines+markers",
                                         line={"color": f"hsl({(gi * 67) % 360},60%,45%)"}),
                              row=mi // 2 + 1, col=mi % 2 + 1)
                fig.update_xaxes(title_text=x_name, row=mi // 2 + 1, col=mi % 2 + 1)
        fig.update_layout(height=320 * math.ceil(len(PLOTTED) / 2), margin={"t": 40})
        parts.append(fig.to_html(full_html=False, include_plotlyjs=True))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    parts.append(f'<table class="sweep"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
    style = ("body{font-family:sans-serif;margin:1.5em} table.sweep{border-collapse:collapse;font-size:12px}"
             "table.sweep td,table.sweep th{border:1px solid #ccc;padding:2px 5px;text-align:right}")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} sweep</title>"
                    f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
    return path
