"""Readers for real LLM serving traces: the Azure 2023 CSVs and the Mooncake JSONL.

Standard library parsing, numpy arrays out. Three traces ship with the package (see
``sim/workload/data/traces/NOTICE.md``
for their sources and licences) and are named ``azure-code``, ``azure-conv`` and ``mooncake``; any other string is
a path whose extension picks the format (``.csv``: Azure, ``.jsonl``: Mooncake). A user's own CSV or JSONL with
other column names, or times in plain seconds, is read through a column mapping (:mod:`sim.workload.trace_columns`),
given
or guessed from common names.

Replay transforms, applied in this order by :func:`load_trace`:

1. window: keep requests whose time since the trace's first request lies in ``[start, end)`` (original seconds);
2. ``max_requests``: keep the first N of the window;
3. scale: arrivals (relative to the window's first request) are multiplied by ``time_scale / rate_scale``.
   ``time_scale`` stretches time (0.5 replays twice as fast), ``rate_scale`` multiplies the request rate (2.0 is
   twice the rate); they compose as one factor, so ``time_scale=0.5`` and ``rate_scale=2.0`` are the same thing and
   using both gives ``time_scale=0.5, rate_scale=2`` -> four times the rate;
4. ``repeat_to=N``: the (scaled) window is tiled back to back, each copy shifted by the window's span plus one mean
   gap, until exactly N requests exist (the last copy is cut; N below the window's size just cuts the window).

Lengths of 0 in a file are clamped to 1 (a request needs at least one prompt and one output token); negative or
non-integer lengths are errors. The shipped traces contain no zero lengths.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.workload.trace_columns import (
    CLASS_COLUMNS,
    ClassColumns,
    TraceColumns,
    parse_timestamp_ns,
    read_class_columns,
    read_mapped,
)

TRACE_DIR = Path(__file__).resolve().parent / "data" / "traces"

# Shipped traces by name.
TRACES: dict[str, str] = {
    "azure-code": "azure2023_code.csv",
    "azure-conv": "azure2023_conv.csv",
    "mooncake": "mooncake_conversation.jsonl",
}

MOONCAKE_BLOCK_SIZE = 512  # tokens named by one Mooncake hash id

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MAX_TRACE_LENGTH = 2**40  # tokens of one prompt or output (the workload's cap); longer is a corrupt file
MAX_TRACE_BYTES = 4 << 30  # a trace file is read whole


@dataclass(frozen=True, slots=True, eq=False)
class TraceData:
    """A trace ready to replay: one entry per request, sorted by arrival. Arrays are read-only."""

    arrival: np.ndarray  # float64 seconds since the first request of the window (the first is 0.0)
    prompt_len: np.ndarray  # int64 prompt tokens, >= 1
    output_len: np.ndarray  # int64 output tokens, >= 1
    hash_ids: list[tuple[int, ...]] | None = None  # Mooncake only: one id per 512-token prompt block
    source: str = ""  # file the requests came from
    hash_block_size: int = MOONCAKE_BLOCK_SIZE  # tokens named by one hash id
    classes: ClassColumns | None = None  # the file's priority, tenant and slo_class columns, if it has any
    timed: bool = True  # False: the file has no arrival-time column (every arrival is 0.0; lengths only)

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.arrival[-1] - self.arrival[0]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second: the inverse of the mean inter-arrival gap; inf when every arrival coincides."""
        n = len(self)
        if n < 2:
            return math.nan
        span = self.duration
        return (n - 1) / span if span > 0 else math.inf


def resolve_trace(name_or_path: str | os.PathLike[str]) -> Path:
    """Path of a shipped trace name, or the given path. Raises FileNotFoundError naming the path."""
    known = ", ".join(TRACES)
    if not os.fspath(name_or_path).strip():  # Path("") is ".": the error read "trace file not found: ."
        raise FileNotFoundError(f"trace path is empty ({os.fspath(name_or_path)!r}); name a trace file or a "
                                f"shipped trace ({known})")
    if isinstance(name_or_path, str) and name_or_path in TRACES:
        path = TRACE_DIR / TRACES[name_or_path]
    else:
        path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path} (shipped traces are named {known})")
    return path


def load_trace(
    name_or_path: str | os.PathLike[str],
    *,
    start: float = 0.0,
    end: float | None = None,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_requests: int | None = None,
    repeat_to: int | None = None,
    columns: TraceColumns | None = None,
) -> TraceData:
    """Load a trace and apply the replay transforms described in the module docstring.

    ``start``/``end`` are seconds of the original trace since its first request; the returned arrivals start at
    0.0 at the window's first request. Raises FileNotFoundError for a missing file, ValueError for a malformed
    row (naming the file and line), an unknown extension, bad arguments or an empty window.
    """
    if not (math.isfinite(start) and start >= 0):
        raise ValueError(f"start must be a finite number >= 0, got {start}")
    if end is not None and not end > start:
        raise ValueError(f"end must be greater than start ({start}), got {end}")
    for label, value in (("time_scale", time_scale), ("rate_scale", rate_scale)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a finite number > 0, got {value}")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    if repeat_to is not None and repeat_to < 1:
        raise ValueError(f"repeat_to must be >= 1, got {repeat_to}")

    path = resolve_trace(name_or_path)
    stat = path.stat()
    times, prompt, output, hash_ids, classes, timed = _read_cached(str(path), stat.st_mtime_ns, stat.st_size,
                                                                    columns)

    # 1-2. Window on the original clock, then the first max_requests of it.
    lo = int(np.searchsorted(times, start, side="left"))
    hi = len(times) if end is None else int(np.searchsorted(times, end, side="left"))
    if max_requests is not None:
        hi = min(hi, lo + max_requests)
    if hi <= lo:
        raise ValueError(f"{path}: no requests in the window [{start}, {end}) s")
    arrival = times[lo:hi] - times[lo]
    prompt, output = prompt[lo:hi], output[lo:hi]
    ids = None if hash_ids is None else list(hash_ids[lo:hi])
    if classes is not None:
        classes = classes.take(np.arange(lo, hi))

    # 3. One factor, so both scales act exactly as documented on every gap and on the span.
    factor = time_scale / rate_scale
    if factor != 1.0:
        arrival = arrival * factor

    # 4. Tiling.
    if repeat_to is not None:
        if classes is not None:  # each copy carries the window's classes, request for request
            classes = classes.take(np.arange(repeat_to) % len(arrival))
        arrival, prompt, output, ids = _tile(path, arrival, prompt, output, ids, repeat_to)

    return TraceData(
        arrival=_frozen(np.ascontiguousarray(arrival, dtype=np.float64)),
        prompt_len=_frozen(np.ascontiguousarray(prompt, dtype=np.int64)),
        output_len=_frozen(np.ascontiguousarray(output, dtype=np.int64)),
        hash_ids=ids,
        source=str(path),
        classes=classes,
        timed=timed,
    )


def _tile(
    path: Path,
    arrival: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    ids: list[tuple[int, ...]] | None,
    n: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, ...]] | None]:
    m = len(arrival)
    if n <= m:
        return arrival[:n], prompt[:n], output[:n], None if ids is None else ids[:n]
    if m < 2:
        raise ValueError(f"{path}: repeat_to needs a window of at least 2 requests (to measure a mean gap)")
    span = float(arrival[-1] - arrival[0])
    shift = span + span / (m - 1)  # the window's span plus one mean gap
    copies = -(-n // m)
    offsets = np.repeat(np.arange(copies, dtype=np.float64) * shift, m)[:n]
    arrival = np.tile(arrival, copies)[:n] + offsets
    prompt = np.tile(prompt, copies)[:n]
    output = np.tile(output, copies)[:n]
    if ids is not None:
        # Each copy is new traffic, not a replay of the same prompts: shift its ids past every id of the window
        # so that copies share no prefix with one another (sharing inside each copy is kept).
        stride = 1 + max((max(t) for t in ids if t), default=-1)
        tiled: list[tuple[int, ...]] = []
        for c in range(copies):
            base = c * stride
            chunk = ids if base == 0 else [tuple(h + base for h in t) for t in ids]
            tiled.extend(chunk[: n - len(tiled)])
        ids = tiled
    return arrival, prompt, output, ids


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# ---------------------------------------------------------------------------------------------------------------
# Parsing. Cached on (path, mtime, size) so that a workload sampled many times reads its file once; the arrays
# are read-only so the cache cannot be corrupted by a caller.

_Parsed = tuple[np.ndarray, np.ndarray, np.ndarray, "tuple[tuple[int, ...], ...] | None", ClassColumns | None, bool]


@lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int, columns: TraceColumns | None = None) -> _Parsed:
    if size > MAX_TRACE_BYTES:
        raise ValueError(f"{path}: {size / 2**30:.3g} GiB, larger than the {MAX_TRACE_BYTES >> 30} GiB a trace may be")
    try:
        return _read_parsed(path, columns)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: a JSON line nested too deeply") from None


def _read_parsed(path: str, columns: TraceColumns | None = None) -> _Parsed:
    suffix = Path(path).suffix.lower()
    hash_ids = None
    mapped_times: np.ndarray | None = np.empty(0)
    if suffix not in (".csv", ".jsonl"):
        raise ValueError(f"{path}: unknown trace format {suffix!r} (expected .csv or .jsonl)")
    if columns is not None or not _known_layout(path, suffix):
        mapped_times, prompt, output, classes = read_mapped(path, suffix, columns, _length)
        times = np.zeros(len(prompt)) if mapped_times is None else mapped_times
    elif suffix == ".csv":
        times, prompt, output, classes = _read_azure(path)
    else:
        times, prompt, output, hash_ids, classes = _read_mooncake(path)
    if len(times) == 0:
        raise ValueError(f"{path}: the trace holds no requests")
    # Relative to the first request; stable sort if a file is out of order (the shipped ones are sorted).
    if np.any(times[1:] < times[:-1]):
        order = np.argsort(times, kind="stable")
        times, prompt, output = times[order], prompt[order], output[order]
        if hash_ids is not None:
            hash_ids = tuple(hash_ids[i] for i in order)
        if classes is not None:
            classes = classes.take(order)
    times = times - times[0]
    for a in (times, prompt, output) if classes is None or classes.priority is None else (
            times, prompt, output, classes.priority):
        a.setflags(write=False)
    return times, prompt, output, hash_ids, classes, mapped_times is not None


def _known_layout(path: str, suffix: str) -> bool:
    """Whether the file is Azure's CSV (its header names Azure's columns) or Mooncake's JSONL (its first object
    has Mooncake's keys); an empty or unreadable first line is left to those readers to report."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        first = next((line for line in f if line.strip()), "")
    if suffix == ".csv":
        names = {h.strip() for h in next(csv.reader([first]), [])}
        return not names or set(_AZURE_COLUMNS) <= names
    try:
        rec = json.loads(first) if first else None
    except ValueError:
        return True
    return not isinstance(rec, dict) or {"timestamp", "input_length", "output_length"} <= set(rec)


def _length(text: str | int, path: str, line: int, column: str) -> int:
    parsed: int | None
    if type(text) is int:  # exact type: a JSON true/false or 12.5 is not a length
        parsed = text
    else:
        try:
            parsed = int(text) if isinstance(text, str) else None
        except ValueError:
            parsed = None
    if parsed is None:
        raise ValueError(f"{path}:{line}: {column} must be an integer, got {text!r}")
    value = parsed
    if value < 0:
        raise ValueError(f"{path}:{line}: {column} must be >= 0, got {value}")
    if value > MAX_TRACE_LENGTH:
        raise ValueError(f"{path}:{line}: {column} must be at most {MAX_TRACE_LENGTH} tokens, got {value}")
    return value if value > 0 else 1  # clamp 0 -> 1: a request needs at least one token of each


def _read_azure(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, ClassColumns | None]:
    """Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with a header row (and optionally
    request-class columns, see :mod:`sim.workload.trace_columns`).

    A vectorised fast path handles well-formed files; anything it does not accept (a bad row, quoting, another
    column order, extra columns, blank lines) is re-read row by row, which either parses it or names the
    offending line.
    """
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: Excel writes a byte-order mark
        text = f.read()
    try:
        return (*_read_azure_fast(text), None)
    except (ValueError, IndexError, UnicodeEncodeError, OverflowError):  # OverflowError: a length past int64
        return _read_azure_rows(path)


def _read_azure_fast(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lines = text.splitlines()
    if not lines or [h.strip() for h in lines[0].split(",")] != list(_AZURE_COLUMNS):
        raise ValueError("not the plain layout")
    rows = [line.split(",") for line in lines[1:]]
    if not rows:
        return np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
    if any(len(r) != 3 for r in rows):
        raise ValueError("ragged rows")
    stamps, context, generated = zip(*rows, strict=True)
    prompt = np.array(list(map(int, context)), dtype=np.int64)
    output = np.array(list(map(int, generated)), dtype=np.int64)
    if prompt.min() < 0 or output.min() < 0 or max(prompt.max(), output.max()) > MAX_TRACE_LENGTH:
        raise ValueError("length out of range")  # the row-by-row reader names the line
    return _timestamps_ns_fast(stamps), np.maximum(prompt, 1), np.maximum(output, 1)


def _timestamps_ns_fast(stamps: tuple[str, ...]) -> np.ndarray:
    """Fixed-width ``YYYY-MM-DD HH:MM:SS[.f...]`` strings to seconds since the earliest, exactly, with numpy."""
    width = len(stamps[0])
    if width < 19 or width == 20 or any(len(x) != width for x in stamps):
        raise ValueError("timestamps of varying width")
    c = np.frombuffer("".join(stamps).encode("ascii"), dtype=np.uint8).reshape(len(stamps), width)
    seps = {4: b"-", 7: b"-", 13: b":", 16: b":", 19: b"."}
    if any(np.any(c[:, k] != ord(v)) for k, v in seps.items() if k < width):
        raise ValueError("separators")
    if np.any((c[:, 10] != ord(" ")) & (c[:, 10] != ord("T"))):
        raise ValueError("separators")
    d = c.astype(np.int64) - ord("0")
    digit_cols = [k for k in range(width) if k not in seps and k != 10]
    if np.any((d[:, digit_cols] < 0) | (d[:, digit_cols] > 9)):
        raise ValueError("digits")

    def number(a: int, b: int) -> np.ndarray:
        out = np.zeros(len(d), dtype=np.int64)
        for k in range(a, b):
            out = out * 10 + d[:, k]
        return out

    hour, minute, second = number(11, 13), number(14, 16), number(17, 19)
    if hour.max() > 23 or minute.max() > 59 or second.max() > 60:
        raise ValueError("time of day")
    ymd = number(0, 4) * 10000 + number(5, 7) * 100 + number(8, 10)
    keys, which = np.unique(ymd, return_inverse=True)
    ordinals = np.array([date(k // 10000, k // 100 % 100, k % 100).toordinal() for k in keys.tolist()])
    day = (ordinals - ordinals.min())[which]
    ns = np.zeros(len(d), dtype=np.int64)
    for j, k in enumerate(range(20, min(width, 29))):  # digits past nanoseconds are dropped
        ns += d[:, k] * 10 ** (8 - j)
    # Integer ns (exact); relative values fit float64 exactly for any span under 104 days.
    total = (day * 86400 + hour * 3600 + minute * 60 + second) * 1_000_000_000 + ns
    return (total - total.min()) / 1e9


def _read_azure_rows(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, ClassColumns | None]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file (expected the header {','.join(_AZURE_COLUMNS)})")
        names = [h.strip() for h in header]
        try:
            it, ip, io = (names.index(c) for c in _AZURE_COLUMNS)
        except ValueError:
            raise ValueError(
                f"{path}:1: header must name the columns {', '.join(_AZURE_COLUMNS)}, got {header}"
            ) from None
        width = len(names)
        days: dict[str, int] = {}
        ticks: list[int] = []
        prompt: list[int] = []
        output: list[int] = []
        extra = [(c, names.index(c)) for c in CLASS_COLUMNS if c in names]
        rows: list[tuple[int, dict]] = []  # (line, the class cells) when the file has class columns
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) != width:
                raise ValueError(f"{path}:{line}: expected {width} fields, got {len(row)}: {row}")
            ticks.append(parse_timestamp_ns(row[it], days, path, line))
            prompt.append(_length(row[ip], path, line, "ContextTokens"))
            output.append(_length(row[io], path, line, "GeneratedTokens"))
            if extra:
                rows.append((line, {c: row[k] for c, k in extra}))
    classes = read_class_columns(rows, names, path)
    if not ticks:
        return np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64), classes
    t0 = min(ticks)
    times = np.array([t - t0 for t in ticks], dtype=np.int64) / 1e9
    return times, np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64), classes


def _read_mooncake(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[tuple[int, ...], ...],
                                       ClassColumns | None]:
    """Mooncake trace: one JSON object per line with timestamp (ms), input_length, output_length, hash_ids.

    The lines are decoded in one ``json.loads`` call; if that fails they are decoded one by one to name the line.
    """
    with open(path, encoding="utf-8-sig") as f:
        lines = [(n, t) for n, t in enumerate(f.read().splitlines(), start=1) if t.strip()]
    try:
        records = json.loads("[" + ",".join(t for _, t in lines) + "]")
        if len(records) != len(lines):  # a line holding two values separated by a comma
            raise ValueError
    except ValueError:
        records = []
        for line, text in lines:
            try:
                records.append(json.loads(text))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line}: not valid JSON ({e.msg})") from None
    stamps: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hash_ids: list[tuple[int, ...]] = []
    rows: list[tuple[int, dict]] = []
    for (line, _), rec in zip(lines, records, strict=True):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{line}: expected a JSON object, got {type(rec).__name__}")
        try:
            ts, ilen, olen = rec["timestamp"], rec["input_length"], rec["output_length"]
        except KeyError as e:
            raise ValueError(f"{path}:{line}: missing field {e.args[0]!r}") from None
        ids = rec.get("hash_ids", [])
        if type(ts) not in (int, float) or not math.isfinite(ts) or abs(ts) > 2**53:
            raise ValueError(f"{path}:{line}: timestamp must be a number of milliseconds, got {ts!r}")
        if type(ids) is not list or not set(map(type, ids)) <= {int}:
            raise ValueError(f"{path}:{line}: hash_ids must be a list of integers")
        stamps.append(ts)
        prompt.append(_length(ilen, path, line, "input_length"))
        output.append(_length(olen, path, line, "output_length"))
        hash_ids.append(tuple(ids))
        rows.append((line, rec))
    names = [c for c in CLASS_COLUMNS if any(c in rec for _, rec in rows)]  # keys of any line, not just the first
    # Integer milliseconds are exact in float64; subtract before dividing so arrivals are exact to the ms.
    ms = np.array(stamps, dtype=np.float64)
    times = (ms - ms.min()) / 1000.0 if len(ms) else ms
    return (times, np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64), tuple(hash_ids),
            read_class_columns(rows, names, path))
