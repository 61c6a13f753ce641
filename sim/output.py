"""The run folder: summary.json, requests.csv, steps.csv and report.html, plus a terminal comparison table.

Every file of the folder is written to a temporary name in the same folder and moved into place with
``os.replace`` only once all of them are complete, so a crash never leaves a half-written file behind. The same
inputs give byte-identical files: floats are written with ``repr`` (shortest round-trip form) and nothing
depends on the clock or on random ids.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import numpy as np

from sim.metrics import summarize
from sim.records import REQUEST_FIELDS, STEP_COLUMNS, RequestRecord, RunResult

SUMMARY_FILE = "summary.json"
REQUESTS_FILE = "requests.csv"
STEPS_FILE = "steps.csv"
REPORT_FILE = "report.html"


def servesim_version() -> str:
    """The version of the package this code belongs to (``sim.__version__``)."""
    import sim

    return str(getattr(sim, "__version__", "0+unknown"))


def to_jsonable(x):
    """A copy of x that ``json.dumps(allow_nan=False)`` accepts: NaN and infinities become None, numpy scalars
    and arrays become Python numbers and lists, paths become strings."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [to_jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    raise TypeError(f"cannot write {type(x).__name__} to JSON: {x!r}")


def summary_json(summaries: dict, scenario: dict | None = None) -> str:
    doc = {"servesim_version": servesim_version(), "scenario": scenario, "variants": summaries}
    return json.dumps(to_jsonable(doc), indent=2, allow_nan=False) + "\n"


def requests_csv(results: list[RunResult]) -> str:
    """One row per request (sorted by id within a variant), the variant name first."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("variant",) + REQUEST_FIELDS)
    for res in results:
        for r in sorted(res.requests, key=lambda r: r.id):
            w.writerow([res.name] + [getattr(r, f) for f in REQUEST_FIELDS])
    return buf.getvalue()


def steps_csv(results: list[RunResult]) -> str:
    """One row per step, the variant name first. ``tolist`` gives Python floats, which csv writes with repr."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("variant",) + tuple(STEP_COLUMNS))
    for res in results:
        cols = [np.asarray(res.steps[k], dtype=t).tolist() for k, t in STEP_COLUMNS.items()]
        n = len(cols[0])
        w.writerows(zip([res.name] * n, *cols))
    return buf.getvalue()


def _write_atomically(out_dir: Path, contents: dict[str, str]) -> None:
    """Write every file under a temporary name, then move them all into place."""
    temps: dict[str, str] = {}
    umask = os.umask(0)
    os.umask(umask)
    try:
        for name, text in contents.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
            temps[name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        for name, tmp in temps.items():
            os.replace(tmp, out_dir / name)
    finally:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_run(
    out_dir: str | os.PathLike,
    results: list[RunResult],
    summaries: dict | None = None,
    *,
    scenario: dict | None = None,
    title: str | None = None,
) -> Path:
    """Write summary.json, requests.csv, steps.csv and report.html into out_dir (created if missing; other files
    in it are left alone). ``summaries`` maps variant name to ``summarize()``'s dict, computed when omitted.
    Returns the folder."""
    from sim.report import build_report  # plotly is only needed here, not for the table or the CSVs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if summaries is None:
        summaries = {r.name: summarize(r) for r in results}
    names = [r.name for r in results]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique, got {names}")
    html = build_report(results, summaries, title or "servesim: " + " vs ".join(names))
    _write_atomically(
        out,
        {
            SUMMARY_FILE: summary_json(summaries, scenario),
            REQUESTS_FILE: requests_csv(results),
            STEPS_FILE: steps_csv(results),
            REPORT_FILE: html,
        },
    )
    return out


def read_summary(path: str | os.PathLike) -> dict:
    """summary.json as a dict (null stays None); path is the file or the run folder."""
    p = Path(path)
    if p.is_dir():
        p = p / SUMMARY_FILE
    return json.loads(p.read_text(encoding="utf-8"))


_FIELD_TYPES: dict[str, Callable[[str], object]] = {"int": int, "float": float, "str": str}


def read_requests(path: str | os.PathLike) -> dict[str, list[RequestRecord]]:
    """requests.csv back into records, grouped by variant (in file order)."""
    p = Path(path)
    if p.is_dir():
        p = p / REQUESTS_FILE

    conv = {f.name: _FIELD_TYPES[str(f.type)] for f in fields(RequestRecord)}
    out: dict[str, list[RequestRecord]] = {}
    with open(p, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            variant = row.pop("variant")
            out.setdefault(variant, []).append(RequestRecord(**{k: conv[k](v) for k, v in row.items()}))
    return out


def read_steps(path: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """steps.csv back into columns (STEP_COLUMNS dtypes), one dict per variant."""
    p = Path(path)
    if p.is_dir():
        p = p / STEPS_FILE
    rows: dict[str, list[list[str]]] = {}
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        if tuple(header) != ("variant",) + tuple(STEP_COLUMNS):
            raise ValueError(f"{p}: unexpected columns {header}")
        for row in reader:
            rows.setdefault(row[0], []).append(row[1:])
    out = {}
    for variant, rs in rows.items():
        cols = list(zip(*rs))
        out[variant] = {
            k: np.array([int(v) for v in cols[i]] if t is np.int64 else [float(v) for v in cols[i]], dtype=t)
            for i, (k, t) in enumerate(STEP_COLUMNS.items())
        }
    return out


# --- the comparison table (terminal and report) ---------------------------------------------------------------


def _get(summary: dict, key: str) -> float:
    v: object = summary
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            return math.nan
        v = v[part]
    return math.nan if v is None else float(v)  # type: ignore[arg-type]


def _ms(x: float) -> str:
    return f"{1e3 * x:.1f}"


def _s(x: float) -> str:
    return f"{x:.2f}"


def _rate(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 100 else f"{x:.0f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _int(x: float) -> str:
    return f"{x:.0f}"


# (label, summary key with dots for nesting, formatter)
TABLE_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("TTFT mean (ms)", "ttft.mean", _ms),
    ("TTFT p50 (ms)", "ttft.p50", _ms),
    ("TTFT p99 (ms)", "ttft.p99", _ms),
    ("TPOT mean (ms)", "tpot.mean", _ms),
    ("TPOT p50 (ms)", "tpot.p50", _ms),
    ("TPOT p99 (ms)", "tpot.p99", _ms),
    ("ITL p50 (ms)", "itl.p50", _ms),
    ("ITL p99 (ms)", "itl.p99", _ms),
    ("E2EL p50 (s)", "e2el.p50", _s),
    ("E2EL p99 (s)", "e2el.p99", _s),
    ("queue p99 (s)", "queue.p99", _s),
    ("output tok/s", "output_throughput", _rate),
    ("total tok/s", "total_token_throughput", _rate),
    ("req/s", "request_throughput", _rate),
    ("goodput (req/s)", "goodput", _rate),
    ("SLO attainment", "slo_attainment", _pct),
    ("KV usage mean", "kv_usage.mean", _pct),
    ("KV usage max", "kv_usage.max", _pct),
    ("KV token util", "kv_token_utilization", _pct),
    ("GPU busy", "busy_fraction", _pct),
    ("MFU", "mfu", _pct),
    ("mean batch", "mean_batch_size", _s),
    ("preemptions", "num_preemptions", _int),
    ("rejected", "num_rejected", _int),
    ("completed", "num_completed", _int),
    ("requests", "num_requests", _int),
)
# shown when a run is a cluster (summary["cluster"])
CLUSTER_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("replicas mean", "cluster.replicas_mean", _s),
    ("replicas max", "cluster.replicas_max", _int),
    ("GPU-hours", "cluster.gpu_hours", _s),
    ("cost ($)", "cluster.cost_usd", _s),
)


def table_cells(summaries: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of strings: one row per TABLE_ROWS entry, one column per variant, plus a ratio column
    (last variant over the first) when exactly two variants are compared. Undefined values show as "-"."""
    names = list(summaries)
    header = ["metric"] + names
    two = len(names) == 2
    if two:
        header.append("×")
    rows = []
    cluster = any("cluster" in summaries[n] for n in names)
    for label, key, fmt in TABLE_ROWS + (CLUSTER_ROWS if cluster else ()):
        vals = [_get(summaries[n], key) for n in names]
        row = [label] + [fmt(v) if math.isfinite(v) else "-" for v in vals]
        if two:
            a, b = vals
            row.append(f"{b / a:.2f}" if math.isfinite(a) and math.isfinite(b) and a != 0 else "-")
        rows.append(row)
    return header, rows


def format_table(summaries: dict) -> str:
    """A fixed-width comparison table for the terminal: metric names left, numbers right-aligned."""
    header, rows = table_cells(summaries)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
