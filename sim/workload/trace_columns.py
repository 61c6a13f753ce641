"""A user's own trace: CSV or JSONL with any column names, times in plain seconds (or ms, us, ns, or dates).

The Azure and Mooncake readers in :mod:`sim.workload.traces` know their files' exact layouts. A user's own log rarely
matches either, so a trace may name its columns: which one holds the arrival time (and in what unit), which the
prompt and output lengths. Without a mapping, a file whose columns are not Azure's or Mooncake's is read when it
uses one of the common names below (``arrival_s``, ``prompt_tokens``...), and refused otherwise with the names it
has, so the user sees what to map.

Any trace (a user's own, Azure's or Mooncake's layout) may also carry request classes in columns named exactly
``priority`` (an integer; lower is served sooner, vLLM's convention), ``tenant`` and ``slo_class`` (text). Each
is read when the file has it; an empty cell is the field's default (0 or no name).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import date

import numpy as np

TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}  # seconds per unit; or "datetime"

# Names looked for, in this order, when a file has no mapping and is neither Azure's nor Mooncake's layout; a
# name ending in _ms or _us is read in that unit.
COMMON_TIME = ("arrival_s", "arrival_time", "arrival", "timestamp_s", "timestamp", "time_s", "time", "arrival_ms",
               "timestamp_ms")
COMMON_PROMPT = ("prompt_len", "prompt_tokens", "input_len", "input_tokens", "input_length", "num_prefill_tokens",
                 "ContextTokens")
COMMON_OUTPUT = ("output_len", "output_tokens", "output_length", "num_decode_tokens", "GeneratedTokens")


CLASS_COLUMNS = ("priority", "tenant", "slo_class")  # optional request-class columns, read by these names


@dataclass(frozen=True, slots=True, eq=False)
class ClassColumns:
    """The request-class columns a trace carried, one entry per request (None: the file has no such column)."""

    priority: np.ndarray | None = None  # int64
    tenant: tuple[str, ...] | None = None
    slo_class: tuple[str, ...] | None = None

    def take(self, index: np.ndarray) -> ClassColumns:
        """The entries at ``index`` (a window, a sort order or a tiling), in that order."""
        idx = index.tolist()
        return ClassColumns(
            None if self.priority is None else self.priority[index],
            None if self.tenant is None else tuple(self.tenant[i] for i in idx),
            None if self.slo_class is None else tuple(self.slo_class[i] for i in idx),
        )


def read_class_columns(rows: list[tuple[int, dict]], names: list[str], path: str) -> ClassColumns | None:
    """The ``priority``, ``tenant`` and ``slo_class`` columns of rows read as (line, dict), those the file names
    (``names``: its header, or its first object's keys); None when it names none of them."""
    have = [c for c in CLASS_COLUMNS if c in names]
    if not have:
        return None
    priority: list[int] = []
    text: dict[str, list[str]] = {"tenant": [], "slo_class": []}
    for line, row in rows:
        if "priority" in have:
            priority.append(_priority(row.get("priority"), path, line))
        for c in ("tenant", "slo_class"):
            if c in have:
                text[c].append(_name(row.get(c), path, line, c))
    return ClassColumns(
        np.array(priority, dtype=np.int64) if "priority" in have else None,
        tuple(text["tenant"]) if "tenant" in have else None,
        tuple(text["slo_class"]) if "slo_class" in have else None,
    )


def _priority(value: object, path: str, line: int) -> int:
    value = _whole(value)
    if value is None or value == "":
        return 0
    if type(value) is int:  # exact type: a JSON true/false or 1.5 is not a priority
        parsed: int | None = value
    else:
        try:
            parsed = int(value) if isinstance(value, str) else None
        except ValueError:
            parsed = None
    if parsed is None or abs(parsed) > 2**62:
        raise ValueError(f"{path}:{line}: priority must be an integer, got {value!r}")
    return parsed


def _name(value: object, path: str, line: int, column: str) -> str:
    if value is None:
        return ""
    if type(value) is int:  # a JSON tenant id 7 names the tenant "7"
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{path}:{line}: {column} must be text, got {value!r}")
    return value.strip()


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """Which column holds what. ``time_unit``: s, ms, us, ns, or datetime (``YYYY-MM-DD HH:MM:SS[.f]``).
    ``timestamp`` None: a lengths-only file (every request at time 0; usable for lengths, not as arrivals)."""

    timestamp: str | None = "timestamp"
    prompt_len: str = "prompt_len"
    output_len: str = "output_len"
    time_unit: str = "s"

    def __post_init__(self) -> None:
        if self.time_unit not in TIME_UNITS and self.time_unit != "datetime":
            raise ValueError(f"time_unit must be one of {', '.join([*TIME_UNITS, 'datetime'])}, got {self.time_unit!r}")


def guess_columns(names: list[str]) -> TraceColumns | None:
    """The mapping a file with these column names most likely means, or None when no length column is known."""
    have = set(names)
    prompt = next((c for c in COMMON_PROMPT if c in have), None)
    output = next((c for c in COMMON_OUTPUT if c in have), None)
    if prompt is None or output is None:
        return None
    time = next((c for c in COMMON_TIME if c in have), None)
    unit = "ms" if time is not None and time.endswith("_ms") else "s"
    return TraceColumns(timestamp=time, prompt_len=prompt, output_len=output, time_unit=unit)


def _unguessed(names: list[str]) -> str:
    """Which length column a file without a mapping lacks: both, or exactly the one (with the names looked for)."""
    prompt = next((c for c in COMMON_PROMPT if c in names), None)
    output = next((c for c in COMMON_OUTPUT if c in names), None)
    if prompt is not None:
        return (f"columns {names} name the prompt lengths ({prompt}) but no output lengths (looked for "
                f"{', '.join(COMMON_OUTPUT)})")
    if output is not None:
        return (f"columns {names} name the output lengths ({output}) but no prompt lengths (looked for "
                f"{', '.join(COMMON_PROMPT)})")
    return f"columns {names} name no prompt and output lengths"


def read_rows(path: str, suffix: str) -> tuple[list[str], list[tuple[int, dict]]]:
    """The file's column names and its rows as (line, dict). JSONL: the union of the first object's keys."""
    rows: list[tuple[int, dict]] = []
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            names = [n.strip() for n in reader.fieldnames or []]
            reader.fieldnames = names
            for row in reader:
                if None in row:
                    raise ValueError(f"{path}:{reader.line_num}: more fields than the header's {len(names)}")
                rows.append((reader.line_num, row))
        return names, rows
    with open(path, encoding="utf-8-sig") as f:
        for line, text in enumerate(f.read().splitlines(), start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{line}: expected a JSON object, got {type(rec).__name__}")
            rows.append((line, rec))
    return (list(rows[0][1]) if rows else []), rows


def read_mapped(path: str, suffix: str, columns: TraceColumns | None, length
                ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, ClassColumns | None]:
    """Arrival seconds (relative to the earliest; None for a lengths-only file), prompt and output lengths of a
    file read through ``columns`` (guessed from the header when None), and its request-class columns if it has
    any. ``length(value, path, line, column)`` checks one length."""
    names, rows = read_rows(path, suffix)
    cols = columns if columns is not None else guess_columns(names)
    if cols is None:
        raise ValueError(f"{path}: {_unguessed(names)}; map them with the trace's columns: {{timestamp: ..., "
                         f"prompt_len: ..., output_len: ..., time_unit: s}} (or name them e.g. arrival_s, "
                         f"prompt_tokens, output_tokens)")
    wanted = [c for c in (cols.timestamp, cols.prompt_len, cols.output_len) if c is not None]
    if rows:
        missing = [c for c in wanted if c not in rows[0][1]]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(map(repr, missing))} (the file has {names})")
    times: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    days: dict[str, int] = {}
    for line, row in rows:
        try:
            p, o = row[cols.prompt_len], row[cols.output_len]
        except KeyError as e:
            raise ValueError(f"{path}:{line}: missing field {e.args[0]!r}") from None
        prompt.append(length(_whole(p), path, line, cols.prompt_len))
        output.append(length(_whole(o), path, line, cols.output_len))
        if cols.timestamp is not None:
            if cols.timestamp not in row:
                raise ValueError(f"{path}:{line}: missing field {cols.timestamp!r}")
            times.append(_seconds(row[cols.timestamp], cols.time_unit, days, path, line, cols.timestamp))
    if cols.timestamp is None:
        t = None
    else:
        t = np.array(times, dtype=np.float64)
        if len(t):
            t = t - t.min()
    return t, np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64), read_class_columns(rows, names, path)


def parse_timestamp_ns(s: str, days: dict[str, int], path: str, line: int, column: str = "TIMESTAMP") -> int:
    """``YYYY-MM-DD HH:MM:SS[.fffffff]`` (space or ``T``; any number of fractional digits) to integer ns.

    The Azure reader's (:mod:`sim.workload.traces`) and a mapped column's in unit ``datetime``. Parsed by hand: exact
    (no
    float rounding of the 7 fractional digits) and independent of what ``datetime.fromisoformat`` accepts on a given
    Python version.
    """
    s = s.strip()
    try:
        if len(s) < 19 or s[4] != "-" or s[7] != "-" or s[10] not in " T" or s[13] != ":" or s[16] != ":":
            raise ValueError
        day = days.get(s[:10])
        if day is None:
            ymd = s[0:4], s[5:7], s[8:10]
            if not all(x.isascii() and x.isdigit() for x in ymd):
                raise ValueError
            day = days[s[:10]] = date(*map(int, ymd)).toordinal()
        hh, mm, ss = s[11:13], s[14:16], s[17:19]
        if not all(x.isascii() and x.isdigit() for x in (hh, mm, ss)):
            raise ValueError
        h, m, sec = int(hh), int(mm), int(ss)
        if h > 23 or m > 59 or sec > 60:
            raise ValueError
        ns = 0
        if len(s) > 19:
            frac = s[20:]
            if s[19] != "." or not frac or not (frac.isascii() and frac.isdigit()):
                raise ValueError
            ns = int((frac + "000000000")[:9])  # digits past nanoseconds are dropped
    except ValueError:
        raise ValueError(f"{path}:{line}: bad {column} {s!r} (expected YYYY-MM-DD HH:MM:SS.fffffff, without a time "
                         "zone)") from None
    return ((day * 86400 + h * 3600 + m * 60 + sec) * 1_000_000_000) + ns


def _whole(value: object) -> object:
    """A CSV cell "12" or a JSON 12 as given; a JSON 12.0 as 12 (a float that is a whole number)."""
    if type(value) is float and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return value.strip()
    return value


def _seconds(value: object, unit: str, days: dict[str, int], path: str, line: int, column: str) -> float:
    if unit == "datetime":
        if not isinstance(value, str):
            raise ValueError(f"{path}:{line}: {column} must be a date and time, got {value!r}")
        return parse_timestamp_ns(value, days, path, line, column) / 1e9
    if isinstance(value, bool):
        value = None
    try:
        x = float(value) if isinstance(value, (int, float, str)) else math.nan
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or abs(x) > 2**53:
        raise ValueError(f"{path}:{line}: {column} must be a number of {unit}, got {value!r}")
    return x * TIME_UNITS[unit]
