"""A long run's finished requests as columns: what ``RunResult.requests`` holds past ``STREAM_MIN`` requests.

A ``RequestRecord`` costs about 300 bytes (its slots and float objects), and the simulator's ``Request`` behind
it as much again; a run of millions of requests held both until its end. Here each finished request is recorded
as it finishes (``RequestSink.add``, fed by the simulation's finish callback) and moves into numpy columns
``CHUNK`` requests at a time, so that the request itself can leave memory: about 100 bytes a request remain.

``RequestTable`` is a sequence of ``RequestRecord`` in id order (what ``sim.loop.results.result_of`` gives a
shorter run), whose records are made again from the columns when read, a chunk at a time, equal field for field
to those the run would have kept (a time that was the Python int 0 reads back as that int, so every file is
byte-identical; ``tests/test_request_table.py`` compares every output of a run both ways). Readers that can,
read its columns instead (``column``, ``outcome_is``): the summary does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from functools import partial
from operator import attrgetter
from typing import overload

import numpy as np

from sim.metrics.records import RequestRecord, records_of_rows
from sim.serving.request import Request

# Runs with more requests than this keep their finished requests in a RequestTable; shorter ones keep the list of
# records they always had.
STREAM_MIN = 1 << 17
CHUNK = 1 << 15  # records kept as objects before they move into columns (and records made again at a time)
BLOCK = 1 << 16  # requests a block-wise reader (``latency_blocks``) holds at a time

_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
# numeric columns and their dtypes; the other fields are text (stored as codes) or tuples (stored sparsely)
_NUMERIC: dict[str, type] = {
    "id": np.int64, "arrival": np.float64, "first_scheduled": np.float64, "first_token": np.float64,
    "finish": np.float64, "prompt_tokens": np.int64, "output_tokens": np.int64, "target_output_tokens": np.int64,
    "num_preemptions": np.int64, "replica": np.int64, "session_id": np.int64, "priority": np.int64,
    "ttft_slo": np.float64, "tpot_slo": np.float64,
}  # fmt: skip
_FLOATS = tuple(k for k, t in _NUMERIC.items() if t is np.float64)
_TEXT = ("outcome", "reason", "tenant", "slo_class")
_TUPLES = ("preempted_at", "resumed_at")
assert set(_NUMERIC) | set(_TEXT) | set(_TUPLES) == set(_FIELDS)


class RequestTable(Sequence[RequestRecord]):
    """Finished requests in id order, as columns (see the module docstring). Made by ``RequestSink.table``."""

    def __init__(self, numeric: dict[str, np.ndarray], codes: dict[str, np.ndarray], names: dict[str, list[str]],
                 tuples: dict[str, dict[int, tuple[float, ...]]], ints: dict[str, set[int]]) -> None:
        self._numeric = numeric  # field -> column
        self._codes = codes  # text field -> int32 codes into names[field]
        self._names = names
        self._tuples = tuples  # tuple field -> {id: its non-empty tuple}
        self._ints = ints  # float field -> ids whose value was a Python int (a time of 0 at the very start)
        self._n = len(numeric["id"])

    def __len__(self) -> int:
        return self._n

    def column(self, name: str, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """A numeric field's column (its ``rows``: a slice or a boolean mask) in its dtype (int64 or float64;
        read-only use: it may be the table's own array, or one value seen n times). The rows are taken before the
        column is widened from its compact dtype, so a block of a long run's column costs a block, not the column."""
        return np.asarray(self._numeric[name][rows], dtype=_NUMERIC[name])

    def one_value(self, name: str) -> bool:
        """Whether every row of an integer field holds the same value (true of no rows), read from the
        compact column without widening it."""
        a = self._numeric[name]
        return _constant(a) or not len(a) or bool((a == a[0]).all())

    def in_id_order(self) -> bool:
        """Whether the ids increase row by row (a run's table always; ``as_table`` keeps a list's order)."""
        ids = self._numeric["id"]
        return bool(np.all(ids[1:] > ids[:-1]))

    def outcome_is(self, outcome: str, rows: slice = slice(None)) -> np.ndarray:
        """Which requests (of ``rows``) ended with ``outcome`` (completed, rejected, failed), as a boolean mask."""
        names = self._names["outcome"]
        return self._codes["outcome"][rows] == (names.index(outcome) if outcome in names else -1)

    def select(self, mask: np.ndarray) -> RequestTable:
        """The requests ``mask`` selects, in order, as a table of their own."""
        return RequestTable({k: _picked(v, mask) for k, v in self._numeric.items()},
                            {k: _picked(v, mask) for k, v in self._codes.items()}, self._names, self._tuples,
                            self._ints)

    def groups(self, name: str) -> dict[str, np.ndarray]:
        """A text field's distinct values, each with the mask of the requests that have it."""
        codes, names = self._codes[name], self._names[name]
        return {v: codes == c for c, v in enumerate(names)}

    def values(self, name: str, rows: slice = slice(None)) -> list:
        """A numeric field's values (of ``rows``) as Python numbers, as the records hold them (a time that was an
        int too)."""
        col = self._numeric[name][rows].tolist()
        ints = self._ints.get(name)
        if ints:
            for i in np.flatnonzero(np.isin(self._numeric["id"][rows], list(ints))).tolist():
                col[i] = int(col[i])
        return col

    def _value(self, name: str, i: int) -> float:
        v = self._numeric[name][i].item()
        return int(v) if int(self._numeric["id"][i]) in self._ints.get(name, ()) else v

    def least(self, name: str, default: float = 0.0) -> float:
        """``min(r.<name> for r in records)``, the same Python number (``default`` for no records)."""
        return self._value(name, int(np.argmin(self._numeric[name]))) if self._n else default

    def most(self, name: str, default: float = 0.0) -> float:
        """``max(r.<name> for r in records)``, likewise."""
        return self._value(name, int(np.argmax(self._numeric[name]))) if self._n else default

    def text(self, name: str) -> tuple[np.ndarray, list[str]]:
        """A text field (outcome, reason, tenant, slo_class) as (codes, names): row i's value is names[codes[i]]."""
        return np.asarray(self._codes[name], dtype=np.int32), self._names[name]

    def spans(self, name: str) -> dict[int, tuple[float, ...]]:
        """``preempted_at`` or ``resumed_at`` of the requests where it is not empty, by request id."""
        return self._tuples[name]

    def any_class(self) -> bool:
        """``has_classes`` from the columns."""
        n = self._numeric
        return bool((n["priority"] != 0).any() or (n["ttft_slo"] >= 0).any() or (n["tpot_slo"] >= 0).any()
                    or any(any(self._names[f]) for f in ("tenant", "slo_class")))

    def fields_of(self, lo: int, hi: int) -> dict[str, list]:
        """Rows lo..hi, field by field (every ``RequestRecord`` field): the values the records hold, as Python
        values (a time that was an int too), without making the records (requests.csv is written from these)."""
        cols: dict[str, list] = {}
        ids = self._numeric["id"][lo:hi].tolist()
        for f in _FIELDS:
            if f in self._numeric:
                col = self._numeric[f][lo:hi].tolist()
                ints = self._ints.get(f)
                if ints:
                    col = [int(v) if i in ints else v for i, v in zip(ids, col, strict=True)]
            elif f in self._codes:
                names = self._names[f]
                col = [names[c] for c in self._codes[f][lo:hi].tolist()]
            else:
                some = self._tuples[f]
                col = [some.get(i, ()) for i in ids] if some else [()] * len(ids)
            cols[f] = col
        return cols

    def _records(self, lo: int, hi: int) -> list[RequestRecord]:
        return records_of_rows(zip(*self.fields_of(lo, hi).values(), strict=True))

    @overload
    def __getitem__(self, i: int) -> RequestRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[RequestRecord]: ...

    def __getitem__(self, i: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(self._n)
            if step != 1:
                return self._records(0, self._n)[i]
            return self._records(lo, max(lo, hi))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("request index out of range")
        return self._records(i, i + 1)[0]

    def __iter__(self) -> Iterator[RequestRecord]:
        for lo in range(0, self._n, CHUNK):
            yield from self._records(lo, min(lo + CHUNK, self._n))


class RequestSink:
    """Receives each request as it finishes (``add``) and keeps it as columns (``RequestTable``)."""

    def __init__(self) -> None:
        self._pending: list[RequestRecord] = []
        self._chunks: list[dict[str, np.ndarray]] = []
        self._index: dict[str, dict[str, int]] = {f: {} for f in _TEXT}  # text field -> {value: code}
        self._tuples: dict[str, dict[int, tuple[float, ...]]] = {f: {} for f in _TUPLES}
        self._ints: dict[str, set[int]] = {f: set() for f in _FLOATS}
        self.count = 0  # requests received
        # called after each chunk moves into columns (the simulation forgets its finished requests there)
        self.on_flush: list[Callable[[], object]] = []

    def add(self, r: Request) -> None:
        self.add_record(RequestRecord.from_request(r))

    def add_record(self, rec: RequestRecord) -> None:
        self._pending.append(rec)
        self.count += 1
        if len(self._pending) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        """Move the records received into columns."""
        recs = self._pending
        if not recs:
            return
        self._pending = []
        chunk: dict[str, np.ndarray] = {}
        for f, dtype in _NUMERIC.items():
            values = list(map(attrgetter(f), recs))
            if f in self._ints:
                ints = [r.id for r, v in zip(recs, values, strict=True) if type(v) is int]
                self._ints[f].update(ints)
            chunk[f] = compact(np.array(values, dtype=dtype))
        for f in _TEXT:
            index = self._index[f]
            chunk[f] = compact(np.array([index.setdefault(v, len(index)) for v in map(attrgetter(f), recs)],
                                        dtype=np.int32))
        for f in _TUPLES:
            some = self._tuples[f]
            for r in recs:
                t = getattr(r, f)
                if t:
                    some[r.id] = t
        self._chunks.append(chunk)
        for listener in self.on_flush:
            listener()

    def table(self, *, sort: bool = True) -> RequestTable:
        """Every request received, in id order (``sort=False``: in the order received). The sink is left empty."""
        self.flush()
        chunks, self._chunks = self._chunks, []
        ids = np.concatenate([c["id"] for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
        order = None  # received in id order, or kept as received: no reordering
        rows = None  # where each chunk's requests go when the ids are 0..n-1: their ids
        if sort and not bool(np.all(ids[1:] > ids[:-1])):
            if _first_ids(ids):
                rows = [c["id"] for c in chunks]
            else:  # other ids: the rows in id order, by a stable sort
                order = np.argsort(ids, kind="stable")
        del ids
        gather = partial(_gather, chunks, order=order, rows=rows)
        numeric = {f: gather(f, dtype) for f, dtype in _NUMERIC.items()}
        codes = {f: gather(f, np.int32) for f in _TEXT}
        names = {f: list(self._index[f]) for f in _TEXT}
        ints = {f: s for f, s in self._ints.items() if s}
        return RequestTable(numeric, codes, names, self._tuples, ints)


def compact(a: np.ndarray) -> np.ndarray:
    """A column as it is kept (columns.py's 128 bytes a request, held to the end of a run of millions, were most of
    its memory): one value seen len(a) times (a zero-stride view) where every value is the same, bit for bit;
    integers in the narrowest of int8, int16 and int32 that holds them; otherwise as it is. Widened back to the
    column's dtype when read, the values are the same."""
    if not len(a):
        return a
    if a.dtype.kind == "i":  # first the dtype, so that a constant part of a column joins the others' dtype
        lo, hi = int(a.min()), int(a.max())
        for narrow in (np.int8, np.int16, np.int32):
            if np.iinfo(narrow).min <= lo and hi <= np.iinfo(narrow).max:
                a = a.astype(narrow)
                break
    bits = a.view(np.int64) if a.dtype == np.float64 else a  # -0.0 is not 0.0 here: both are written as they are
    if bool((bits == bits[0]).all()):
        return np.broadcast_to(a[:1].copy(), a.shape)
    return a


def _constant(a: np.ndarray) -> bool:
    return a.ndim == 1 and len(a) > 0 and a.strides[0] == 0


def _picked(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """a[rows] (a boolean mask), a constant column kept as one value."""
    return np.broadcast_to(a[:1], (int(np.count_nonzero(rows)),)) if _constant(a) else a[rows]


def _first_ids(ids: np.ndarray) -> bool:
    """Whether ``ids`` are 0..n-1, each once (a run's requests are): then request i goes to row i."""
    if not len(ids) or ids.min() != 0 or ids.max() != len(ids) - 1:
        return not len(ids)
    seen = np.zeros(len(ids), dtype=bool)
    seen[ids] = True
    return bool(seen.all())  # n ids in 0..n-1 that reach every value: each once


def _gather(chunks: list[dict[str, np.ndarray]], f: str, dtype: type, *, order: np.ndarray | None,
            rows: list[np.ndarray] | None) -> np.ndarray:
    """Field f of every chunk, kept compact (``compact``): each chunk's values placed at its ``rows`` (the column
    in id order, what ``order`` gives, without the joined column and its reordered copy: two values a request
    besides the column), else in ``order`` (None: as received)."""
    if not chunks:
        return np.zeros(0, dtype=dtype)
    parts = [c.pop(f) for c in chunks]  # each chunk's part is dropped once gathered
    first = parts[0]
    if all(_constant(p) and p[:1].tobytes() == first[:1].tobytes() and p.dtype == first.dtype for p in parts):
        return np.broadcast_to(first[:1], (sum(len(p) for p in parts),))
    kind = np.result_type(*parts)  # a constant part widens to the others' dtype
    if rows is not None:
        col = np.empty(sum(len(p) for p in parts), dtype=kind)
        for at, p in zip(rows, parts, strict=True):
            col[at] = p
        return col
    col = np.concatenate(parts, dtype=kind)
    return col if order is None else col[order]


def kv_spans(table: RequestTable, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``RequestRecord.kv_intervals(end[i])`` of every request i that was scheduled, request by request, as
    (row of the request, start, stop) arrays: one span for a request never preempted, one per run otherwise."""
    first = table.column("first_scheduled")
    ids = table.column("id")
    preempted, resumed = table.spans("preempted_at"), table.spans("resumed_at")
    rows = np.flatnonzero(first >= 0)
    counts = np.ones(len(rows), dtype=np.int64)
    some = np.flatnonzero(np.isin(ids[rows], np.fromiter(preempted, dtype=np.int64, count=len(preempted))))
    for j in some.tolist():
        counts[j] = 1 + len(resumed.get(int(ids[rows[j]]), ()))
    row = np.repeat(rows, counts)
    start, stop = first[row], end[row]
    at = np.cumsum(counts) - counts  # each request's first span
    for j in some.tolist():
        i = int(rows[j])
        rid = int(ids[i])
        starts = [first[i], *resumed.get(rid, ())]
        stops = [*preempted[rid], end[i]][: len(starts)]
        start[at[j] : at[j] + len(starts)] = starts
        stop[at[j] : at[j] + len(starts)] = stops
    return row, start, stop


def latency_blocks(table: RequestTable, block: int = BLOCK) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The completed requests' (TTFT, E2EL, output tokens), ``block`` requests of the table at a time, in its
    order: the same values, in the same order, as ``first_token[done] - arrival[done]`` and the others over whole
    columns, while holding a block's (a long run's whole columns are tens of bytes a request each)."""
    for lo in range(0, len(table), block):
        rows = slice(lo, min(lo + block, len(table)))
        done = table.outcome_is("completed", rows)
        arrival = table.column("arrival", rows)[done]
        yield (table.column("first_token", rows)[done] - arrival, table.column("finish", rows)[done] - arrival,
               table.column("output_tokens", rows)[done])


# Inside ``tables_kept``, the table made of each list of records (id of the list -> (the list, its length, the
# table)): a run's summary and its run folder read the same records as columns, and made them twice (0.09 s each
# of a 20,000-request run)
TableStore = dict[int, tuple[Sequence[RequestRecord], int, "RequestTable"]]
_kept_tables: TableStore | None = None


@contextmanager
def tables_kept(store: TableStore | None = None) -> Iterator[TableStore]:
    """Inside the block, ``as_table`` makes each list of records into a table once and keeps it in ``store`` (one an
    earlier block filled, such as ``ScenarioRun.tables``; default: the enclosing block's, or a new one)."""
    global _kept_tables
    outer = _kept_tables
    _kept_tables = store if store is not None else ({} if outer is None else outer)
    try:
        yield _kept_tables
    finally:
        _kept_tables = outer


def as_table(requests: Sequence[RequestRecord], *, keep: bool = False) -> RequestTable:
    """The records as a RequestTable, in their order (a table as it is): readers then read columns alike. ``keep``
    (a run's own records, not a list made to be read once): inside ``tables_kept``, the table made of the same list
    before (the same list object, as long as it was), or the one made now kept for the next reader."""
    if isinstance(requests, RequestTable):
        return requests
    kept = _kept_tables if keep else None
    if kept is not None:
        hit = kept.get(id(requests))
        if hit is not None and hit[0] is requests and hit[1] == len(requests):
            return hit[2]
    sink = RequestSink()
    for r in requests:
        sink.add_record(r)
    table = sink.table(sort=False)
    if kept is not None:
        kept[id(requests)] = (requests, len(requests), table)
    return table


def in_columns(requests: Sequence[RequestRecord]) -> Sequence[RequestRecord]:
    """The records as a RequestTable when they are in id order (a run's always are), so that many readers share one
    set of columns; otherwise as they are (a RequestTable is read as being in id order, see ``by_id``)."""
    table = as_table(requests, keep=True)
    ids = table.column("id")
    return table if bool(np.all(ids[1:] > ids[:-1])) else requests


def by_id(requests: Sequence[RequestRecord]) -> Sequence[RequestRecord]:
    """Records in id order: a RequestTable as it is (it is in id order, and sorting it would make every record
    at once), a list sorted."""
    return requests if isinstance(requests, RequestTable) else sorted(requests, key=attrgetter("id"))


