"""Sweeps of many simulations: run in parallel, streamed to disk, resumable.

    servesim sweep SCENARIO.yaml --out DIR [--executor local|ray] [--workers N] [--address ADDR]

One run is one (sweep point, variant) of a scenario. Every run is seeded by the scenario and independent of the
others, so its row does not depend on which executor, worker or order ran it: a sweep on a Ray cluster writes
the same table as one on a laptop (the tests compare them). Each finished run is appended to ``DIR/sweep.csv``
at once (one row of scalar metrics, flushed), and an interrupted sweep resumes where it stopped: runs whose row is
already there are not redone. When every run is done the table is rewritten in run order and ``DIR/sweep.html``
shows it with one plot per metric against the swept parameter.

Memory stays flat however many runs: no row is kept once written (the resume check keeps the finished runs' keys,
the rewrite in run order keeps a file offset per row), at most a few runs per worker are in flight at once, and
the page's table holds the first ``HTML_TABLE_ROWS`` rows (its plots every run).

Executors: ``local`` (a process pool, one worker per core by default; ``workers=1`` runs in this process) and
``ray`` (tasks on an existing cluster, ``address``, or on a Ray instance started here). Ray is the optional
``ray`` extra.
"""

from __future__ import annotations

import csv
import hashlib
import html
import itertools
import json
import math
import os
import signal
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config.files import read_text_capped, write_atomically
from sim.config.scenario import apply_point, sweep_points, variant_configs
from sim.config.schema import Scenario, ScenarioError
from sim.loop.run import check_variants, generate_workload, simulate_variant, workload_key
from sim.policies.configs import user_code
from sim.words import counted

# The metrics a row keeps: summary keys, nested ones dotted (``ttft.p99``).
METRICS: tuple[str, ...] = (
    "num_requests", "num_completed", "num_rejected", "num_failed", "num_preemptions", "num_steps", "duration",
    "request_throughput", "output_throughput", "total_token_throughput", "goodput", "slo_attainment",
    *(f"{m}.{q}" for m in ("ttft", "tpot", "itl", "e2el", "queue") for q in ("mean", "p50", "p90", "p99")),
    "kv_usage.mean", "kv_usage.max", "kv_token_utilization", "busy_fraction", "mfu", "mean_batch_size",
    "cluster.replicas_mean", "cluster.replicas_max", "cluster.gpu_hours", "cluster.cost_usd",  # clusters only
    "energy.energy_j", "energy.j_per_output_token", "energy.mean_power_w",  # GPUs with power figures
    # (sim/costs/energy.py)
    "bottleneck",
)
_SECONDS = ("duration", "ttft.", "tpot.", "itl.", "e2el.", "queue.")


def column(metric: str) -> str:
    """sweep.csv's column for a metric: a time in seconds says so in its name (``ttft.p99_s``), as in
    requests.csv; rates are per second by their names (``output_throughput``: tokens/s). A class's figure
    (``classes.NAME.ttft.p99``, a name without dots) is named as the run's is."""
    if metric.startswith("classes."):
        _, name, rest = metric.split(".", 2)
        return f"classes.{name}.{column(rest)}"
    return f"{metric}_s" if metric.startswith(_SECONDS) else metric


PLOTTED = tuple(column(m) for m in ("output_throughput", "goodput", "ttft.p99", "tpot.p99", "e2el.p99",
                                      "kv_usage.mean"))
HTML_TABLE_ROWS = 2_000  # rows in sweep.html's table (a browser struggles past that; sweep.csv has every run)
IN_FLIGHT_PER_WORKER = 4  # jobs handed out per worker at once: enough to keep it busy, bounded however many jobs


@dataclass(frozen=True)
class SweepTask:
    """One run: everything a worker needs, picklable (a plain scenario dict, not the parsed objects)."""

    index: int  # position in the sweep's run order
    key: str  # stable name of the run: ``variant[param=value,...]``
    variant: str
    point: dict[str, Any]
    raw: dict[str, Any]  # the scenario as a dict (sweep section included; apply_point drops it)
    source: str
    # the summary keys its row keeps, METRICS first (a tournament adds fairness, the classes' figures and the
    # WORKLOAD digest)
    metrics: tuple[str, ...] = METRICS
    # the user classes it runs, cls -> a digest of their file (sim.policies.configs.user_code)
    code: tuple[tuple[str, str], ...] = ()


def _label(point: dict[str, Any]) -> str:
    return ",".join(f"{k}={_value_text(v)}" for k, v in point.items())


def _value_text(v: Any) -> Any:
    """A swept value as run keys and sweep.csv show it: a mapping or list (a router such as {type: power_of_two})
    on one line as YAML flow, the way --sweep takes it back (Python's repr once showed {'type': 'power_of_two'});
    a scalar as it is."""
    if isinstance(v, (dict, list)):
        import yaml

        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=math.inf).strip()
    return v


def _one_line(v: Any) -> Any:
    """A text cell on one line: sweep.csv holds one row per line, which the rewrite in run order relies on."""
    return " ".join(v.splitlines()) if isinstance(v, str) else v


def plan_sweep(scenario: Scenario, raw: dict[str, Any] | None = None, *, source: str = "scenario",
               progress: Callable[[int, int], None] | None = None,
               metrics: tuple[str, ...] = METRICS) -> list[SweepTask]:
    """Every run of the scenario, checked: a point or variant that cannot be built fails here, before any run.
    ``progress(points checked, points)`` hears each point (checking 10,000 takes tens of seconds). ``metrics``:
    what each row keeps (METRICS first)."""
    raw = raw if raw is not None else scenario.model_dump(mode="json")
    tasks: list[SweepTask] = []
    points, built = sweep_points(scenario), set[str]()
    for i, point in enumerate(points):
        sc = apply_point(raw, point, source) if point else scenario
        try:  # each distinct variant built, as run builds it: an unknown GPU failed after the first runs were written
            cfgs = check_variants(sc, variant_configs(sc), built)
        except ScenarioError as e:
            raise ScenarioError(f"{source} at {point}: {e}" if point else str(e)) from None
        for cfg in cfgs:
            key = _one_line(f"{cfg.name}[{_label(point)}]" if point else cfg.name)
            code = tuple(sorted(user_code(cfg.policy, cfg.admission, cfg.cluster, cfg.disaggregation).items()))
            tasks.append(SweepTask(len(tasks), key, cfg.name, dict(point), raw, source, metrics, code))
        if progress is not None:
            progress(i + 1, len(points))
    return tasks


def columns_for(tasks: Sequence[SweepTask]) -> list[str]:
    params = []
    for t in tasks:
        for k in t.point:
            if k not in params:
                params.append(k)
    return ["index", "key", "variant", *params, *map(column, tasks[0].metrics if tasks else METRICS)]


def _params(cols: Sequence[str]) -> list[str]:
    """The swept parameters among a sweep.csv's columns: those between the variant and the first metric."""
    return list(cols[3 : cols.index(column(METRICS[0]))])


# ---- one run (in a worker) ---------------------------------------------------------------------------------------
_WORKLOADS: dict[str, Any] = {}  # per worker process: a workload drawn once serves every variant that shares it


def run_task(task: SweepTask) -> dict[str, Any]:
    """Simulate one run and return its row. Top-level, so that process pools and Ray can ship it."""
    from sim.config.scenario import slos_of
    from sim.metrics.summary import bottleneck, summarize

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
    row: dict[str, Any] = {"index": task.index, "key": task.key, "variant": task.variant,
                           **{k: _value_text(v) for k, v in task.point.items()}}
    for m in task.metrics:
        if m == "bottleneck":
            row[m] = bottleneck(summary)
        elif m == WORKLOAD:
            row[m] = workload_digest(result.requests)
        elif m.startswith("classes."):  # a class name holds no dot here (column() relies on it too)
            _, name, rest = m.split(".", 2)
            row[column(m)] = _at(summary.get("classes", {}).get(name), rest)
        else:
            row[column(m)] = _at(summary, m)
    return row


def _at(summary: Any, metric: str) -> Any:
    """A summary's value at a dotted key (``ttft.p99``); None where it has none."""
    v = summary
    for part in metric.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


WORKLOAD = "workload"  # a row's digest of the requests its run simulated (see workload_digest)


def workload_digest(requests: Iterable[Any]) -> str:
    """A short digest of the requests a run simulated (id, arrival, prompt and target output tokens, class,
    priority, tenant), read from its request records: runs with equal digests served the very same requests."""
    h = hashlib.sha256()
    for r in sorted(requests, key=lambda r: r.id):
        h.update(f"{r.id},{r.arrival!r},{r.prompt_tokens},{r.target_output_tokens},{r.slo_class},{r.priority},"
                 f"{r.tenant}\n".encode())
    return h.hexdigest()[:16]


def _sweep_job(_shared: Any, task: SweepTask) -> dict[str, Any]:
    return run_task(task)


# ---- any independent jobs ----------------------------------------------------------------------------------------
_SHARED: Any = None  # per worker process: the value every job of a parallel_map shares (e.g. a workload)


def _init_shared(value: Any) -> None:
    global _SHARED
    _SHARED = value
    # Ctrl-C is the parent's: it reaches every process of the terminal's group, and each worker printed a
    # KeyboardInterrupt traceback of its own under the command's one line. parallel_map ends the workers itself
    # (a policy's watchdog still stops a call that never returns: sim/policies/watchdog.py handles SIGINT ignored)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call_shared(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_SHARED, item)


def parallel_problem(executor: str, address: str | None) -> str | None:
    """What is wrong with an executor and a Ray address (the CLI's --executor and --address), or None."""
    if executor not in ("local", "ray"):
        return f"--executor must be 'local' or 'ray', got {executor!r}"
    if address is not None and executor != "ray":  # the local pool would run without a word about it
        return (f"--address {address} names a Ray cluster, which only --executor ray uses; give --executor ray with "
                "it, or leave --address out to run here")
    return None


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
    top-level function. ``workers=1`` (or a single item) runs here, in order. At most ``IN_FLIGHT_PER_WORKER``
    jobs per worker are handed out at once, the next as one finishes, and a result is dropped once yielded: a
    10,000-job map once held a future, and then its result, for every job until the end."""
    why = parallel_problem(executor, address)
    if why is not None:
        raise ScenarioError(why)
    workers = workers or os.cpu_count() or 1
    if executor == "local" and (workers <= 1 or len(items) <= 1):
        for i, item in enumerate(items):
            yield i, fn(shared, item)
        return
    window = IN_FLIGHT_PER_WORKER * workers
    queue = enumerate(items)
    if executor == "local":
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=mp.get_context("spawn"),
                                    initializer=_init_shared, initargs=(shared,)) as pool:
            running: dict[cf.Future, int] = {}
            try:
                while True:
                    for i, item in itertools.islice(queue, window - len(running)):
                        running[pool.submit(_call_shared, fn, item)] = i
                    if not running:
                        return
                    done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                    for f in done:
                        yield running.pop(f), f.result()
            except BaseException:
                # a job under way went on to its end (the workers ignore Ctrl-C) before the pool's shutdown let the
                # command stop: its workers are ended now. Futures are not cancelled first: the broken pool sets an
                # error on every pending one, and on a cancelled one Python 3.11 prints an InvalidStateError traceback
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
                raise
    ray, started = _ray_init(workers, address)
    try:
        ref = ray.put(shared)
        remote = ray.remote(fn)
        pending: dict[Any, int] = {}
        while True:
            for i, item in itertools.islice(queue, window - len(pending)):
                pending[remote.remote(ref, item)] = i
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            for r in ready:
                yield pending.pop(r), ray.get(r)
    finally:
        if started:
            ray.shutdown()


def _ray_init(workers: int, address: str | None):
    try:
        import ray
    except ImportError:
        raise ScenarioError("--executor ray needs Ray: pip install 'servesim[ray]'") from None
    if ray.is_initialized():  # the caller's own Ray: its jobs run there, so an address elsewhere is not used
        here = ray.get_runtime_context().gcs_address
        if address and address not in (here, "auto"):  # auto: Ray's word for the cluster running here, this one
            warnings.warn(f"Ray is already initialized in this process (at {here}), so address {address!r} is not "
                          "used: the jobs run there; call ray.shutdown() first to run them at it", stacklevel=2)
        return ray, False
    kw: dict[str, Any] = {"address": address} if address else {"num_cpus": workers or None}
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    try:  # the workers import the project from the driver's source tree
        ray.init(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}}, **kw)
    except ConnectionError as e:  # an OSError, which the command took for --out's ("--out DIR: Could not find ...")
        where = f"--address {address}: no Ray cluster to join" if address else "--executor ray: Ray did not start"
        raise ScenarioError(f"{where} ({str(e).split('. ')[0]}); start one with `ray start --head`, or leave "
                            "--address out to start Ray here") from None
    return ray, True


# ---- the sweep ---------------------------------------------------------------------------------------------------
@dataclass
class SweepOutcome:
    out_dir: Path
    runs: int  # every (point, variant) of the sweep
    ran: int  # runs simulated by this call
    resumed: int  # runs found done in the folder

    @property
    def table(self) -> Path:
        return self.out_dir / "sweep.csv"

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every run's row, in run order, read from sweep.csv (not kept in memory by the sweep)."""
        return read_rows(self.table)


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


def iter_rows(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The rows of a sweep.csv one at a time, numbers parsed (empty cells: None)."""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            yield {k: _parse(v) for k, v in row.items()}


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a sweep.csv, numbers parsed (empty cells: None)."""
    return list(iter_rows(path))


def _finished_keys(table: Path) -> set[str]:
    """The keys of the runs already in a sweep.csv (only the keys: a resumed sweep does not hold its rows)."""
    with open(table, newline="") as f:
        return {row["key"] for row in csv.DictReader(f)}


def _rewrite_in_run_order(table: Path) -> None:
    """sweep.csv's rows sorted by run index, through one file offset per row (each row is one line, index first),
    so a 100,000-run table is never read into memory whole."""
    order: list[tuple[int, int]] = []
    with open(table, "rb") as f:
        header = f.readline()
        while True:
            pos = f.tell()
            line = f.readline()
            if not line:
                break
            order.append((int(line.split(b",", 1)[0]), pos))
        order.sort()
        tmp = table.with_suffix(".csv.tmp")
        with open(tmp, "wb") as out:
            out.write(header)
            for _, pos in order:
                f.seek(pos)
                out.write(f.readline())
    tmp.replace(table)


def _earlier_meta(path: Path) -> dict[str, Any]:
    """The sweep.json beside an earlier sweep.csv ({} where there is none). One that is not a sweep's record (cut
    short, or another file of that name) is a ScenarioError: it ended in a JSONDecodeError or AttributeError
    traceback, and without it the rows of sweep.csv cannot be matched to this sweep."""
    if not path.exists():
        return {}
    try:
        old = json.loads(read_text_capped(path, 64 << 20, "a sweep's sweep.json"))
    except (OSError, ValueError, RecursionError):
        old = None
    if not isinstance(old, dict):
        raise ScenarioError(f"{path}: not a sweep's record (unreadable or cut short), so the rows of its sweep.csv "
                            "cannot be matched to this sweep; --fresh to start over, or another --out")
    return old


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
    checking: Callable[[int, int], None] | None = None,
    metrics: tuple[str, ...] = METRICS,
) -> SweepOutcome:
    """Run every (point, variant) of the scenario not already in ``out_dir``, appending rows as they finish.
    ``checking(points, total)`` hears the points being checked before any run; ``progress(runs done, total)``
    hears the runs done, the resumed ones first. ``metrics``: what each row keeps (METRICS first)."""
    why = parallel_problem(executor, address)
    if why is not None:
        raise ScenarioError(why)
    tasks = plan_sweep(scenario, raw, source=source, progress=checking, metrics=metrics)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    table, meta_path = out / "sweep.csv", out / "sweep.json"
    cols = columns_for(tasks)
    code = dict(kv for t in tasks for kv in t.code)
    meta = {"scenario": scenario.name, "fingerprint": _fingerprint(tasks), "runs": len(tasks), "columns": cols,
            "code": code}
    done: set[str] = set()
    if fresh:
        table.unlink(missing_ok=True)
    elif table.exists():
        old = _earlier_meta(meta_path)
        if old.get("fingerprint") != meta["fingerprint"]:
            raise ScenarioError(f"{out} holds a sweep of another scenario (or other runs); use another --out, or "
                                "--fresh to start over")
        if old.get("columns") != cols:
            raise ScenarioError(f"{out}/sweep.csv has other columns (written by another servesim version); use "
                                "another --out, or --fresh to start over")
        done = _finished_keys(table)
        # a finished run of a class edited since: its row is the old code's, beside new rows of the new code (a
        # class that finished no run, one that raised and was fixed, is simply run)
        was = old.get("code", {})
        edited = sorted({c for t in tasks if t.key in done for c, d in t.code if was.get(c, d) != d})
        if edited:
            raise ScenarioError(f"{out} holds runs of an earlier version of {', '.join(edited)} (edited since); "
                                "--fresh to run them again, or another --out")
    write_atomically(out, {meta_path.name: json.dumps(meta, indent=2) + "\n"})  # never cut short: see _earlier_meta
    todo = [t for t in tasks if t.key not in done]
    resumed = len(tasks) - len(todo)
    del tasks, done  # the tasks to run are all that is needed from here
    if progress is not None:
        progress(resumed, resumed + len(todo))
    workers = workers or os.cpu_count() or 1
    new_file = not table.exists() or table.stat().st_size == 0
    with open(table, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        if new_file:
            w.writeheader()
            f.flush()
        finished = resumed
        for _, row in parallel_map(_sweep_job, todo, executor=executor, workers=workers, address=address):
            w.writerow({k: _one_line(v) for k, v in row.items()})
            f.flush()  # a finished run survives an interruption
            finished += 1
            if progress is not None:
                progress(finished, resumed + len(todo))
    _rewrite_in_run_order(table)
    write_sweep_html(out / "sweep.html", scenario.name, iter_rows(table), cols)
    return SweepOutcome(out, runs=resumed + len(todo), ran=len(todo), resumed=resumed)


# ---- the terminal table ------------------------------------------------------------------------------------------
# (summary key, the run table's label) for the sweep's table: the headline figures of each run
TABLE_METRICS: tuple[str, ...] = ("ttft.p99", "tpot.p99", "e2el.p99", "output_throughput", "goodput",
                                  "slo_attainment", "kv_usage.max", "num_completed")
TABLE_RUNS = 50  # rows printed; a bigger sweep's table says how many more sweep.csv holds


def format_sweep_table(table: str | os.PathLike, *, limit: int = TABLE_RUNS) -> str:
    """One row per run (variant, swept values, the headline metrics and what limits it), formatted as the run
    table formats them; the first ``limit`` runs, then a line counting the rest."""
    from sim.output.table import format_cells, table_rows

    spec = {key: (label, fmt) for label, key, fmt in table_rows()}
    rows = iter_rows(table)
    first = list(itertools.islice(rows, limit))
    more = sum(1 for _ in rows)
    if not first:
        return "no runs\n"
    cols = list(first[0])
    params = _params(cols)
    header = ["variant", *params, *(spec[m][0] for m in TABLE_METRICS), "limit"]
    cells = []
    for r in first:
        line = [str(r["variant"]), *(_fmt(r.get(p)) for p in params)]
        for m in TABLE_METRICS:
            v = r.get(column(m))
            line.append(spec[m][1](float(v)) if isinstance(v, (int, float)) and math.isfinite(v) else "-")
        line.append(str(r.get("bottleneck") or "").partition(":")[0] or "-")
        cells.append(line)
    text = format_cells(header, cells)
    if more:
        text += f"... and {more:,} more runs in {table}\n"
    return text


# ---- the page ----------------------------------------------------------------------------------------------------
def _fmt(v: Any, places: int | None = None) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{places}f}" if places is not None else f"{v:.4g}"
    return str(v)


def _decimals(values: list[Any]) -> int | None:
    """Decimal places for a column of sweep.html's table: 4 significant digits of its largest value, the same for
    every row, so the column's points line up (each value at 4 significant digits read 1, 0.2, 0.004046 and 1.237
    in one column); None for a column without a float."""
    top = max((abs(v) for v in values if isinstance(v, float) and math.isfinite(v)), default=None)
    if top is None:
        return None
    # the exponent of the largest as shown, rounded to 4 significant digits: 9.9996 shows as 10.00, not 10.000
    return 3 if top == 0 else min(8, max(0, 3 - math.floor(math.log10(float(f"{top:.3e}")))))


TEXT_CELL = 40  # characters past which a cell is prose (a verdict), cut to one line in sweep.html's table


def _cell(text: str) -> str:
    """One table cell; a long text left-aligned, cut to one line, whole in its tooltip."""
    if len(text) <= TEXT_CELL:
        return f"<td>{html.escape(text)}</td>"
    return f'<td class="text" title="{html.escape(text)}">{html.escape(text)}</td>'


def write_sweep_html(path: Path, title: str, rows: Iterable[dict[str, Any]], cols: list[str]) -> Path:
    """One table and one plot per metric: the metric against the first swept parameter, a line per variant.
    ``rows`` is read once (a stream from sweep.csv): the plots keep their points, the table its first
    ``HTML_TABLE_ROWS`` rows."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    params = _params(cols)
    # one line per variant and per value of the other parameters: (x, y per plotted metric) points
    groups: dict[str, list[tuple[Any, list[Any]]]] = {}
    kept: list[dict[str, Any]] = []
    n = 0
    for r in rows:
        n += 1
        if params:
            rest = ",".join(f"{p}={r.get(p)}" for p in params[1:])
            groups.setdefault(r["variant"] + (f" [{rest}]" if rest else ""), []).append(
                (r.get(params[0]), [r.get(m) for m in PLOTTED]))
        if n <= HTML_TABLE_ROWS:
            kept.append(r)
    places = {c: _decimals([r.get(c) for r in kept]) for c in cols if c not in params}
    body = ["<tr>" + "".join(_cell(_fmt(r.get(c), places.get(c))) for c in cols) + "</tr>" for r in kept]
    shown = f" The table shows the first {HTML_TABLE_ROWS:,}; sweep.csv has them all." if n > HTML_TABLE_ROWS else ""
    parts = [f"<h1>servesim sweep: {html.escape(title)}</h1>", f"<p>{counted(n, 'run')}.{shown}</p>"]
    if groups:
        x_name = params[0]
        fig = make_subplots(rows=math.ceil(len(PLOTTED) / 2), cols=2, subplot_titles=PLOTTED)
        for gi, (name, pts) in enumerate(groups.items()):
            for mi in range(len(PLOTTED)):
                xy = [(x, ys[mi]) for x, ys in pts if isinstance(ys[mi], (int, float))]
                fig.add_trace(go.Scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], name=name, legendgroup=name,
                                         showlegend=mi == 0, mode="lines+markers",
                                         line={"color": f"hsl({(gi * 67) % 360},60%,45%)"}),
                              row=mi // 2 + 1, col=mi % 2 + 1)
                fig.update_xaxes(title_text=x_name, row=mi // 2 + 1, col=mi % 2 + 1)
        fig.update_layout(height=320 * math.ceil(len(PLOTTED) / 2), margin={"t": 40})
        parts.append(fig.to_html(full_html=False, include_plotlyjs=True))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    parts.append(f'<table class="sweep"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    # one line a row: the bottleneck column's 180-character verdicts wrapped in their cell and made every row
    # about 10 lines tall; a long text is cut to its column's width, whole in its tooltip
    style = ("body{font-family:sans-serif;margin:1.5em} table.sweep{border-collapse:collapse;font-size:12px}"
             "table.sweep td,table.sweep th{border:1px solid #ccc;padding:2px 5px;text-align:right;"
             "white-space:nowrap} table.sweep td.text{text-align:left;max-width:28em;overflow:hidden;"
             "text-overflow:ellipsis}")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} sweep</title>"
                    f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
    return path
