"""The run folder: summary.json, requests.csv, steps.csv and report.html, plus a terminal comparison table.

Every file of the folder is written to a temporary name in the same folder and moved into place with
``os.replace`` only once all of them are complete, so a crash never leaves a half-written file behind. The same
inputs give byte-identical files: floats are written with ``repr`` (shortest round-trip form) and nothing
depends on the clock or on random ids.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from operator import attrgetter
from pathlib import Path
from typing import IO, Any

import numpy as np

from sim.config.files import InterruptedAfterWrite, write_atomically
from sim.costs.energy import EnergyStore, energy_kept, kept_for
from sim.metrics.columns import (
    ABSENT_IF_NEGATIVE,
    CLASS_COLUMNS,
    REQUEST_COLUMNS,
    SLO_FIELDS,
    STEP_CHUNK_ROWS,
    STEP_CSV_COLUMNS,
    TIME_FIELDS,
    TIME_LIST_FIELDS,
)
from sim.metrics.records import CLASS_FIELDS, REQUEST_FIELDS, STEP_COLUMNS, RequestRecord, RunResult, has_classes
from sim.metrics.request_table import RequestTable, by_id, in_columns
from sim.metrics.step_columns import step_count
from sim.metrics.summary import summarize
from sim.output.table import format_table, table_cells

__all__ = [  # format_table and table_cells live in sim.output.table; they are named here too, where callers found them
    "format_table", "read_requests", "read_steps", "read_summary", "requests_csv", "steps_csv", "summary_json",
    "table_cells", "to_jsonable", "write_run",
]

SUMMARY_FILE = "summary.json"
REQUESTS_FILE = "requests.csv"
STEPS_FILE = "steps.csv"
BINNED_STEPS_FILE = "steps_binned.csv"  # long runs: steps per time bin (sim/metrics/steps_binned.py)
REPORT_FILE = "report.html"
# the engine's own files beside them (realengine/engine.py's write_engine_run), and servesim observe's
# (sim/loop/observe.py: what it saw of the server, the server's /metrics scraped, the live page)
MEMORY_FILE = "memory.csv"
TEXTS_FILE = "texts.jsonl"
OBSERVE_FILES = ("observe.json", "metrics.csv", "live.html")


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


# The unit of each summary key, written into summary.json beside the figures (whose keys keep their names, so
# older readers still work). Latency blocks (ttft, tpot, itl, e2el, queue) hold seconds in each statistic.
SUMMARY_UNITS: dict[str, str] = {
    "num_requests": "requests", "num_completed": "requests", "num_rejected": "requests", "num_failed": "requests",
    "num_preemptions": "preemptions", "num_steps": "steps", "num_replicas": "replicas", "duration": "s",
    "total_input_tokens": "tokens", "total_output_tokens": "tokens", "request_throughput": "requests/s",
    "output_throughput": "tokens/s", "total_token_throughput": "tokens/s", "goodput": "requests/s",
    "slo_attainment": "fraction", "slos": "s", "ttft": "s", "tpot": "s", "itl": "s", "e2el": "s", "queue": "s",
    "kv_usage": "fraction", "kv_token_utilization": "fraction", "busy_fraction": "fraction", "mfu": "fraction",
    "mean_batch_size": "requests", "padding_fraction": "fraction",
    "limits": "fraction (the shares and busy_mfu; others as limits.* say)", "limits.offered_rate": "requests/s",
    "limits.scheduled_rate": "requests/s", "limits.queue_start": "requests", "limits.queue_end": "requests",
    "limits.queue_growth": "requests/s",
    "limits.mean_running": "requests", "limits.slot_cap": "requests",
    "limits.waiting_batched_tokens": "tokens per step", "limits.token_cap": "tokens per step",
    "rejections": "requests (per reason)",
    "energy": "J (energy_j, idle_energy_j, j_per_request), W (mean_power_w, peak_step_power_w, idle_w, tdp_w, "
              "power_limit_w); null: not modelled",
    "energy.j_per_output_token": "J/token",
    "cluster.gpu_hours": "GPU hours", "cluster.cost_usd": "USD", "cluster.price_per_replica_hour": "USD/hour",
    "cluster.cost_per_million_output_tokens": "USD",
    "pipeline.stage_utilization": "fraction", "pipeline.bubble_fraction": "fraction",
    "pipeline.mean_micro_batches": "micro-batches", "pipeline.hop_seconds": "s",
    "host_kv.capacity_gib": "GiB per GPU", "host_kv.link_bandwidth": "B/s", "host_kv.loaded_bytes": "B",
    "host_kv.recompute_saved_tokens": "tokens", "host_kv.load_seconds": "s",
    "disaggregation.bytes_moved": "bytes", "disaggregation.gib_moved": "GiB", "disaggregation.transfer": "s",
    "disaggregation.link_wait": "s", "disaggregation.prefill_ttft": "s", "disaggregation.decode_queue": "s",
    "disaggregation.kv_link.bandwidth": "bytes/s per GPU", "disaggregation.kv_link.latency": "s",
    # the sections a run has only with request classes, tenants, an anomaly or speculative decoding
    "classes": "per class, as the run's keys (latencies s, rates per s, slo_attainment fraction, requests, tokens)",
    "tenants": "per tenant: ttft and e2el s, service fraction (output tokens served / demanded), requests, tokens",
    "fairness.jain_index": "index from 1 / num_tenants to 1 (1: equal service while backlogged and equal share served)",
    "fairness.served_share_jain_index": "index from 1 / num_tenants to 1 (1: equal share of demand served)",
    "fairness.backlogged_windows": "windows", "fairness.windows": "windows",
    "anomalies.inversions.tolerance": "s", "anomalies.inversions": "pairs of requests (count, by_priority, by_arrival)",
    "anomalies.head_of_line.per_replica": "mean_waiting requests (Little's law), max_wait s, requests",
    "anomalies.starvation": "s (longest_wait, per class too); request: its id",
    "anomalies.service_over_time.t": "s", "anomalies.service_over_time.output_tokens": "tokens",
    "spec_decode": "drafts and tokens (num_*), fractions (*_acceptance_rate, draft_time_share), tokens per step "
                   "(mean_acceptance_length)",
    "spec_decode.draft_seconds": "s",
}


def summary_json(summaries: dict, scenario: dict | None = None) -> str:
    doc = {"servesim_version": servesim_version(), "units": SUMMARY_UNITS, "scenario": scenario,
           "variants": summaries}
    return json.dumps(to_jsonable(doc), indent=2, allow_nan=False) + "\n"


def _join_times(times: tuple[float, ...]) -> str:
    return ";".join(repr(float(t)) for t in times)


def _split_times(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in text.split(";")) if text else ()


_ABSENT = [f in ABSENT_IF_NEGATIVE for f in REQUEST_FIELDS]
_LISTS = [f in TIME_LIST_FIELDS for f in REQUEST_FIELDS]
REQUEST_CHUNK_ROWS = 1 << 15  # requests.csv rows built and written at a time


def _request_text(name: str, recs: Sequence[RequestRecord], classes: bool) -> str:
    """requests.csv's rows of ``recs``: those ``_rows_text`` makes of their fields' columns."""
    wanted = REQUEST_FIELDS + (CLASS_FIELDS if classes else ())
    return _rows_text(name, {f: list(map(attrgetter(f), recs)) for f in wanted}, classes)


def _rows_text(name: str, cols: dict[str, list], classes: bool) -> str:
    """requests.csv's rows from each field's values (``cols``: field -> one value per request, as the records
    hold them), built column by column: the cells of ``REQUEST_FIELDS``, then those ``request_latencies`` and (with
    ``classes``) ``class_cells`` give, value for value. A RequestTable's columns come straight from its arrays
    (``fields_of``): making its records to read them back was a third of writing the file.

    The text is what csv.writer(lineterminator="\\n") writes of those rows, made faster: each row through one
    "%s,%s,..." format (a Python float's str is its repr, which csv writes for a float; an int's and a string's
    str, which it writes for them), the text cells quoted as csv quotes them, each distinct text once. Of 150,000
    requests of bench_million, the csv writer took 1.16 s CPU, the format 0.79 s (float formatting is most of both)."""
    n = len(cols["id"])
    out: list[list] = [_csv_cells([name] * n)]
    for f, gone, many in zip(REQUEST_FIELDS, _ABSENT, _LISTS, strict=True):
        col = cols[f]
        if many:
            col = [_join_times(v) if v else "" for v in col]
        elif gone:
            col = ["" if v < 0 else v for v in col]
        elif f in _TEXT_FIELDS:
            col = _csv_cells(col)
        out.append(col)
    # the latency columns, as request_latencies gives them (Python arithmetic: a trace's first arrival may be the
    # int 0, and csv writes the int as it came)
    done = [o == "completed" for o in cols["outcome"]]
    arrival, first, token, finish = cols["arrival"], cols["first_scheduled"], cols["first_token"], cols["finish"]
    out.append(["" if not c or s < 0 else s - a for c, s, a in zip(done, first, arrival, strict=True)])
    out.append([t - a if c else "" for c, t, a in zip(done, token, arrival, strict=True)])
    out.append([(e - t) / (k - 1) if c and k > 1 else ""
                for c, e, t, k in zip(done, finish, token, cols["output_tokens"], strict=True)])
    out.append([e - a if c else "" for c, e, a in zip(done, finish, arrival, strict=True)])
    if classes:
        out.extend((cols["priority"], _csv_cells(cols["tenant"]), _csv_cells(cols["slo_class"])))
        out.extend(["" if v < 0 else v for v in cols[f]] for f in SLO_FIELDS)
    return _csv_lines(out)


def _csv_lines(columns: list[list]) -> str:
    """The rows of ``columns`` as csv.writer(lineterminator="\\n") writes them, when every cell is an int, a
    Python float or a string already quoted (``_csv_cells``): each row through one "%s,%s,..." format."""
    fmt = ",".join(["%s"] * len(columns)) + "\n"
    return "".join(map(fmt.__mod__, zip(*columns, strict=True)))


_TEXT_FIELDS = frozenset(("outcome", "reason"))  # the text cells besides the variant name and the class names


def _quoted(text: str) -> str:
    """``text`` as the csv module writes it in a cell (quoted when it holds a comma, a quote or a line break)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow((text, text))  # two cells: a lone empty one is written ""
    return buf.getvalue()[: (len(buf.getvalue()) - 2) // 2]


def _csv_cells(col: list[str]) -> list[str]:
    """A text column's cells as csv writes them: the column itself when no value needs quoting."""
    quoted = {v: _quoted(v) for v in set(col)}
    if all(q == v for v, q in quoted.items()):
        return col
    return list(map(quoted.__getitem__, col))


def write_requests_csv(f: IO[str], results: list[RunResult], chunk: int = REQUEST_CHUNK_ROWS) -> None:
    """requests.csv streamed into ``f``, ``chunk`` requests at a time: one row per request (sorted by id within a
    variant), the variant name first; the class columns last when any variant has request classes. The text
    is never whole in memory (a million requests made a 200 MB string)."""
    classes = any(has_classes(res.requests) for res in results)
    csv.writer(f, lineterminator="\n").writerow(("variant",) + REQUEST_COLUMNS + (CLASS_COLUMNS if classes else ()))
    for res in results:
        recs = by_id(res.requests)  # result_of's are sorted already: a linear pass (a table's rows: in id order)
        for lo in range(0, len(recs), chunk):
            if isinstance(recs, RequestTable):
                f.write(_rows_text(res.name, recs.fields_of(lo, min(lo + chunk, len(recs))), classes))
            else:
                f.write(_request_text(res.name, recs[lo : lo + chunk], classes))


def requests_csv(results: list[RunResult]) -> str:
    """requests.csv's whole text (write_run streams it instead)."""
    buf = io.StringIO()
    write_requests_csv(buf, results)
    return buf.getvalue()


def write_steps_csv(f: IO[str], results: list[RunResult], chunk: int = STEP_CHUNK_ROWS) -> None:
    """steps.csv streamed into ``f`` in chunks of ``chunk`` rows, so that a run of millions of steps never holds
    its whole text (1 M requests made a 5 GB string). ``tolist`` gives Python ints and floats, whose str is what
    csv writes (a float's repr): the rows go through ``_csv_lines``' format instead of csv's writerows (bench_million's
    3,000 requests, 70,572 steps: 0.27-0.37 s CPU before, 0.20-0.31 after)."""
    csv.writer(f, lineterminator="\n").writerow(("variant",) + STEP_CSV_COLUMNS)
    for res in results:
        arrays: list[np.ndarray] = [np.asarray(res.steps[k], dtype=t) for k, t in STEP_COLUMNS.items()]
        n = len(arrays[0])
        name = _quoted(res.name)
        for lo in range(0, n, chunk):
            cols = [a[lo : lo + chunk].tolist() for a in arrays]
            f.write(_csv_lines([[name] * len(cols[0]), *cols]))


def steps_csv(results: list[RunResult]) -> str:
    """One row per step, the variant name first (the whole text; write_run streams it instead)."""
    buf = io.StringIO()
    write_steps_csv(buf, results)
    return buf.getvalue()


def write_run(
    out_dir: str | os.PathLike,
    results: list[RunResult],
    summaries: dict | None = None,
    *,
    scenario: dict | None = None,
    title: str | None = None,
    phase: Callable[[str], None] | None = None,
    steps: str = "auto",
    table_format: str = "csv",
    written: list[str] | None = None,
    extra: Mapping[str, str | Callable[[IO[str]], None]] | None = None,
    energy: EnergyStore | None = None,
) -> Path:
    """Write summary.json, requests.csv, steps.csv, report.html and per variant NAME.vllm-bench.json and
    NAME.metrics.prom (sim/output/benchfiles/exports.py) into out_dir (created if missing; of an earlier run's
    files there, those this run does not write are removed, other files are left alone). ``summaries`` maps
    variant name to ``summarize()``'s dict, computed when omitted. ``phase`` hears what is being written (the
    progress line). ``steps``: "full" writes steps.csv (one row per step), "binned"
    steps_binned.csv (per time bin, see sim/metrics/steps_binned.py), "auto" the full log up to FULL_STEPS_MAX steps and
    the binned table past it. ``table_format``: "parquet" writes requests.parquet and the steps table as .parquet
    instead of the CSVs (sim/output/parquet_out.py, needs pyarrow). ``written``, when given, receives the names of the
    files written, in order (the command's closing line lists them). ``extra``: more files (name -> text, or a
    function writing it), moved into place with the others (the engine's memory.csv and texts.jsonl). ``energy``:
    the runs' energy their summaries computed (``ScenarioRun.energy``), read again rather than computed. Returns
    the folder."""
    from sim.metrics.steps_binned import FULL_STEPS_MAX, write_binned_steps_csv

    if steps not in ("auto", "full", "binned"):
        raise ValueError(f"steps must be auto, full or binned, got {steps!r}")
    if steps == "auto":
        steps = "full" if sum(step_count(r.steps) for r in results) <= FULL_STEPS_MAX else "binned"
    from sim.output.report import build_report  # plotly is only needed here, not for the table or the CSVs

    out = Path(out_dir)
    if summaries is None:
        summaries = {r.name: summarize(r) for r in results}
    # the report and the exports read each run's requests as columns, about 20 times: a list of records is turned
    # into columns once, here (as summarize does), not by each reader (7 s of a 20,000-request run's 15 s, profiled)
    given = results
    results = [replace(r, requests=in_columns(r.requests)) for r in results]
    if energy:  # the energy the summaries computed, of the same runs
        energy = kept_for(energy, zip(given, results, strict=True))
    names = [r.name for r in results]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique, got {names}")
    steps_file, stale = (STEPS_FILE, BINNED_STEPS_FILE) if steps == "full" else (BINNED_STEPS_FILE, STEPS_FILE)
    from sim.output import parquet_out

    tables: dict[str, Any] = {
        REQUESTS_FILE: lambda f: write_requests_csv(f, results),
        steps_file: (lambda f: write_steps_csv(f, results)) if steps == "full"
        else (lambda f: write_binned_steps_csv(f, results)),
    }
    if table_format == "parquet":
        tables = parquet_out.parquet_files(results, steps)
    elif table_format != "csv":
        raise ValueError(f"table_format must be csv or parquet, got {table_format!r}")
    # an earlier run's other tables would pass for this run's
    stale_files = [stale, *parquet_out.STALE_FILES] if table_format == "csv" else \
        [REQUESTS_FILE, STEPS_FILE, BINNED_STEPS_FILE, *parquet_out.STALE_FILES]
    if phase is not None:
        phase(f"building {REPORT_FILE}")
    from sim.loop.disagg.output import transfer_files
    from sim.output.benchfiles.exports import export_files  # per variant: vllm-bench JSON and OpenMetrics text

    with energy_kept(energy):  # the report and the exports read each run's energy: computed once (or kept)
        html = build_report(results, summaries, title or "servesim: " + " vs ".join(names))
        exports = export_files(results, scenario, summaries)
    if phase is not None:
        phase(f"writing {out}/: {SUMMARY_FILE}, {', '.join(tables)}, {REPORT_FILE}")
    files = {
        SUMMARY_FILE: summary_json(summaries, scenario),
        **tables,
        REPORT_FILE: html,
        **exports,
        **transfer_files(results),  # disaggregated runs: one row per KV transfer
        **(extra or {}),
    }
    earlier = _earlier_run_files(out)
    # another table format's files are an earlier run's only in a run folder: elsewhere they are the user's own
    was_run_folder = (out / SUMMARY_FILE).is_file()
    created = not out.exists()  # made here, just before the files: Ctrl-C before then leaves no empty folder
    out.mkdir(parents=True, exist_ok=True)
    interrupted = None
    try:
        write_atomically(out, files)
    except InterruptedAfterWrite as e:
        interrupted = e  # every file is in place: finish the folder, then stop
    except BaseException:  # Ctrl-C or a full disk while the files were written: no empty run folder either
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty
        raise
    if written is not None:
        written.extend(files)
    for name in [*(stale_files if was_run_folder else []), *earlier]:
        if name not in files:
            (out / name).unlink(missing_ok=True)
    if interrupted is not None:
        raise interrupted
    return out


def _earlier_run_files(out: Path) -> list[str]:
    """Files an earlier run wrote into ``out`` beside its summary.json that name its variants (their exports) or its
    kind of run (transfers.csv, decisions.jsonl): left there, they would pass for the new run's. Files of its own
    naming only, so that what else a user keeps in the folder stays. (A traced run's decisions.jsonl is moved into
    place after this, so it is its own.)"""
    from sim.loop.disagg.output import TRANSFERS_FILE
    from sim.metrics.decisions import DECISIONS_FILE
    from sim.output.benchfiles.exports import export_names

    try:
        variants = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))["variants"]
        names = [str(n) for n in variants]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # no earlier run, or not one servesim wrote
        return []
    # an engine run's memory.csv and texts.jsonl too: a simulated run, or an engine run on random weights, into an
    # engine run's folder with real weights left its texts.jsonl, another run's requests and variants, beside it;
    # and an observed run's observe.json, metrics.csv and live.html, another server's figures
    return [*export_names(names), TRANSFERS_FILE, DECISIONS_FILE, MEMORY_FILE, TEXTS_FILE, *OBSERVE_FILES]


def read_summary(path: str | os.PathLike) -> dict:
    """summary.json as a dict (null stays None); path is the file or the run folder."""
    p = Path(path)
    if p.is_dir():
        p = p / SUMMARY_FILE
    return json.loads(p.read_text(encoding="utf-8"))


_FIELD_TYPES: dict[str, Callable[[str], object]] = {"int": int, "float": float, "str": str,
                                                     "tuple[float, ...]": _split_times}


def read_requests(path: str | os.PathLike) -> dict[str, list[RequestRecord]]:
    """requests.csv back into records, grouped by variant (in file order). Reads today's columns and the older
    ones (time columns without the ``_s``, -1 for what never happened); the derived latency columns are
    recomputed from the times, not read."""
    p = Path(path)
    if p.is_dir():
        p = p / REQUESTS_FILE if (p / REQUESTS_FILE).exists() or not (p / "requests.parquet").exists() \
            else p / "requests.parquet"
    if p.suffix == ".parquet":
        from sim.output.parquet_out import read_requests_parquet

        return read_requests_parquet(p)

    conv = {f.name: _FIELD_TYPES[str(f.type)] for f in fields(RequestRecord)}
    field_of = {f"{f}_s": f for f in TIME_FIELDS + TIME_LIST_FIELDS + SLO_FIELDS}
    out: dict[str, list[RequestRecord]] = {}
    with open(p, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            variant = row.pop("variant")
            values: dict[str, Any] = {}
            for column, text in row.items():
                name = field_of.get(column, column)
                if name not in conv:  # a derived column
                    continue
                # each converted to its field's type; an empty cell is what never happened
                absent = name in ABSENT_IF_NEGATIVE or name in SLO_FIELDS
                values[name] = conv[name]("-1" if text == "" and absent else text)
            out.setdefault(variant, []).append(RequestRecord(**values))
    return out


def read_steps(path: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """steps.csv back into columns (STEP_COLUMNS names and dtypes), one dict per variant."""
    p = Path(path)
    if p.is_dir():
        p = p / STEPS_FILE if (p / STEPS_FILE).exists() or not (p / "steps.parquet").exists() else p / "steps.parquet"
    if p.suffix == ".parquet":
        from sim.output.parquet_out import read_steps_parquet

        return read_steps_parquet(p)
    rows: dict[str, list[list[str]]] = {}
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        if tuple(header) not in (("variant",) + STEP_CSV_COLUMNS, ("variant",) + tuple(STEP_COLUMNS)):
            raise ValueError(f"{p}: unexpected columns {header}")
        for row in reader:
            rows.setdefault(row[0], []).append(row[1:])
    out: dict[str, dict[str, np.ndarray]] = {}
    for variant, rs in rows.items():
        cols = list(zip(*rs, strict=True))
        out[variant] = {
            k: np.array([int(v) for v in cols[i]] if t is np.int64 else [float(v) for v in cols[i]], dtype=t)
            for i, (k, t) in enumerate(STEP_COLUMNS.items())
        }
    return out
