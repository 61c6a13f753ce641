"""The run folder's tables as Parquet (``servesim run --format parquet``), through pyarrow: an optional extra
(``pip install 'servesim[parquet]'``), imported only here and only when asked for.

The same tables as the CSVs, column for column (names and units alike: ``requests.parquet`` has
``REQUEST_COLUMNS`` after ``variant``, ``steps.parquet`` ``STEP_CSV_COLUMNS``, ``steps_binned.parquet``
``BINNED_COLUMNS``), typed instead of text: counts are int64, times float64, a time or session that never
happened is null (the CSVs' empty cell), the preemption and resume times are lists of float64. Steps are written
in row groups of ``STEP_CHUNK_ROWS`` rows, converted one group at a time, so memory stays bounded whatever the
run's length. The readers give back what ``read_requests`` and ``read_steps`` give for the CSVs.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from sim.metrics.columns import (
    ABSENT_IF_NEGATIVE,
    CLASS_COLUMNS,
    LATENCY_COLUMNS,
    REQUEST_COLUMNS,
    STEP_CHUNK_ROWS,
    STEP_CSV_COLUMNS,
    TIME_FIELDS,
    TIME_LIST_FIELDS,
    class_column_values,
    request_latencies,
)
from sim.metrics.records import CLASS_FIELDS, REQUEST_FIELDS, STEP_COLUMNS, RequestRecord, RunResult

REQUESTS_PARQUET = "requests.parquet"
STEPS_PARQUET = "steps.parquet"
BINNED_STEPS_PARQUET = "steps_binned.parquet"
STALE_FILES = (REQUESTS_PARQUET, STEPS_PARQUET, BINNED_STEPS_PARQUET)
FORMATS = ("csv", "parquet")
INSTALL_HINT = "pip install 'servesim[parquet]' (or pip install pyarrow)"


def pyarrow_missing() -> str | None:
    """None when pyarrow imports, else what to install (the CLI's error says it before the run starts)."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return f"--format parquet needs pyarrow: {INSTALL_HINT}"
    return None


def _pa() -> Any:
    import pyarrow

    return pyarrow


def _request_table(results: list[RunResult]) -> Any:

    pa = _pa()
    times = ("arrival", "first_scheduled", "first_token", "finish")
    names: list[str] = []
    values: dict[str, list] = {f: [] for f in REQUEST_FIELDS}
    lat: list[list] = [[] for _ in LATENCY_COLUMNS]
    for res in results:
        recs = sorted(res.requests, key=lambda r: r.id)
        names += [res.name] * len(recs)
        for f in REQUEST_FIELDS:
            values[f] += [getattr(r, f) for r in recs]
        for r in recs:
            for col, x in zip(lat, request_latencies(r), strict=True):
                col.append(None if x == "" else x)
    arrays = [pa.array(names, type=pa.string()).dictionary_encode()]
    for f in REQUEST_FIELDS:
        v: list = values[f]
        if f in ("preempted_at", "resumed_at"):
            arrays.append(pa.array([list(t) for t in v], type=pa.list_(pa.float64())))
        elif f in ("outcome", "reason"):
            arrays.append(pa.array(v, type=pa.string()))
        else:
            kind = pa.float64() if f in times else pa.int64()
            a = np.asarray(v, dtype=np.float64 if f in times else np.int64)
            mask = a < 0 if f in ABSENT_IF_NEGATIVE else None
            arrays.append(pa.array(a, type=kind, mask=mask))
    arrays += [pa.array(c, type=pa.float64()) for c in lat]
    classes = class_column_values(results) or {}  # requests.csv's class columns, when the run has them
    kinds = {"priority": pa.int64(), "tenant": pa.string(), "slo_class": pa.string()}
    arrays += [pa.array(v, type=kinds.get(c, pa.float64())) for c, v in classes.items()]
    return pa.Table.from_arrays(arrays, names=["variant", *REQUEST_COLUMNS, *classes])


def write_requests_parquet(f: IO[bytes], results: list[RunResult]) -> None:
    """requests.parquet into the binary file ``f``: one row per request (by id within a variant)."""
    import pyarrow.parquet as pq

    pq.write_table(_request_table(results), f)


def _steps_schema() -> Any:

    pa = _pa()
    fields = [pa.field("variant", pa.string())]
    for name, t in zip(STEP_CSV_COLUMNS, STEP_COLUMNS.values(), strict=True):
        fields.append(pa.field(name, pa.int64() if t is np.int64 else pa.float64()))
    return pa.schema(fields)


def write_steps_parquet(f: IO[bytes], results: list[RunResult], chunk: int | None = None) -> None:
    """steps.parquet into ``f``, one row group per ``chunk`` steps (``STEP_CHUNK_ROWS`` by default)."""
    import pyarrow.parquet as pq


    pa = _pa()
    chunk = chunk or STEP_CHUNK_ROWS
    schema = _steps_schema()
    with pq.ParquetWriter(f, schema) as w:
        for res in results:
            arrays: list[np.ndarray] = [np.asarray(res.steps[k], dtype=t) for k, t in STEP_COLUMNS.items()]
            n = len(arrays[0])
            for lo in range(0, n, chunk):
                cols = [a[lo : lo + chunk] for a in arrays]
                m = len(cols[0])
                batch = [pa.array([res.name] * m, type=pa.string())] + [pa.array(c) for c in cols]
                w.write_table(pa.Table.from_arrays(batch, schema=schema))


def write_binned_steps_parquet(f: IO[bytes], results: list[RunResult]) -> None:
    """steps_binned.parquet: the binned table (a few thousand rows at most), typed as steps_binned.csv reads."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from sim.metrics.steps_binned import write_binned_steps_csv

    text = io.StringIO()
    write_binned_steps_csv(text, results)
    pa = _pa()
    types = {"variant": pa.string(), "start_s": pa.float64(), "width_s": pa.float64(), "busy_s": pa.float64(),
             "mean_batch_size": pa.float64(), "flops": pa.float64()}
    header = text.getvalue().split("\n", 1)[0].split(",")
    opts = pcsv.ConvertOptions(column_types={c: types.get(c, pa.int64()) for c in header})
    table = pcsv.read_csv(io.BytesIO(text.getvalue().encode()), convert_options=opts)
    pq.write_table(table, f)


def _binary(writer):
    """A ``write_atomically`` value that writes bytes: it hands out the text file's binary buffer."""
    def write(f: IO[str]) -> None:
        f.flush()
        writer(f.buffer)  # type: ignore[attr-defined]
    return write


def parquet_files(results: list[RunResult], steps: str) -> dict[str, Any]:
    """The tables of a run folder in Parquet, as ``write_atomically`` values (``steps``: full or binned)."""
    out: dict[str, Any] = {REQUESTS_PARQUET: _binary(lambda f: write_requests_parquet(f, results))}
    if steps == "full":
        out[STEPS_PARQUET] = _binary(lambda f: write_steps_parquet(f, results))
    else:
        out[BINNED_STEPS_PARQUET] = _binary(lambda f: write_binned_steps_parquet(f, results))
    return out


def read_requests_parquet(path: str | os.PathLike) -> dict[str, list[RequestRecord]]:
    """requests.parquet back into records, grouped by variant (in file order), as ``read_requests`` does."""
    import pyarrow.parquet as pq


    cols = pq.read_table(Path(path)).to_pydict()
    n = len(cols["variant"])
    named = {f: cols[f"{f}_s" if f in TIME_FIELDS + TIME_LIST_FIELDS else f] for f in REQUEST_FIELDS}
    # the class columns, when the run had classes (an SLO column's null: no bound, -1 on the record)
    named |= {f: cols[c] for f, c in zip(CLASS_FIELDS, CLASS_COLUMNS, strict=True) if c in cols}
    out: dict[str, list[RequestRecord]] = {}
    for i in range(n):
        v: dict[str, Any] = {}
        for f, values in named.items():
            x = values[i]
            v[f] = tuple(x) if f in TIME_LIST_FIELDS else (-1 if x is None else x)
        out.setdefault(cols["variant"][i], []).append(RequestRecord(**v))
    return out


def read_steps_parquet(path: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """steps.parquet back into columns (STEP_COLUMNS names and dtypes), one dict per variant."""
    import pyarrow.parquet as pq


    table = pq.read_table(Path(path))
    variant = np.asarray(table.column("variant").to_pylist(), dtype=object)
    out: dict[str, dict[str, np.ndarray]] = {}
    for name in dict.fromkeys(variant.tolist()):
        rows = variant == name
        out[name] = {k: table.column(c).to_numpy()[rows].astype(t)
                     for (k, t), c in zip(STEP_COLUMNS.items(), STEP_CSV_COLUMNS, strict=True)}
    return out
