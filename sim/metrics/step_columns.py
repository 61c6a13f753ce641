"""The step log's columns, read from its compact runs on demand instead of held as one array per column.

A long run makes millions of steps (2 M for 100,000 Azure conversation requests, 20 M for a million). Held as
19 expanded columns that is 152 bytes a step (3 GB at a million requests), while the step log's runs hold 28
bytes a step plus 64 per run, its counts as int32 (``sim.metrics.records.StepLog``). ``StepColumns`` is a
read-only mapping that expands a column when it is read, from the runs, and keeps only the two last read and the
steps' start and duration (and those only up to 2^20 steps): memory follows the compact log, and each reader
(summary, steps table, report) pays a transient column at a time. The values are exactly those the
eager expansion gave (same arithmetic), so every output stays byte-identical.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

import numpy as np


class Fields(Protocol):
    """A chunk's values by field: a structured array, or one spilled to a file (``sim.metrics.spill``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, name: str, /) -> np.ndarray: ...

_RECENT = 2  # expanded columns kept (see StepColumns._recent)
_RECENT_MAX_ROWS = 1 << 20  # and only up to this many steps (8 MB a column)
# kept besides the recent ones, up to _RECENT_MAX_ROWS: nearly every reader (summary, report windows, exports)
# reads the steps' times, and a start (a cumulative placement of the runs' starts) is the costliest column to
# expand, a duration one more; in turn with the others they were expanded again some 15 times per run folder
_KEPT = frozenset({"start", "duration"})


class StepColumns(Mapping[str, np.ndarray]):
    """``STEP_COLUMNS`` -> array, expanded from the step log's chunks when read.

    ``chunks``: (per-step values, per-run values) pairs, structured arrays with a field per name of ``varying``
    and of ``constant`` (``sim.metrics.records._packed``); a run never spans two chunks (the log moves steps into
    chunks between runs only)."""

    __slots__ = ("_chunks", "_columns", "_varying", "_constant", "_replica", "_len", "_recent", "_kept")

    def __init__(
        self,
        chunks: list[tuple[Fields, Fields]],
        columns: dict[str, type],
        varying: tuple[str, ...],
        constant: tuple[str, ...],
        replica: int,
    ) -> None:
        self._chunks = chunks
        self._columns = columns
        self._varying = {k: i for i, k in enumerate(varying)}
        self._constant = {k: i for i, k in enumerate(constant)}
        self._replica = replica
        self._len = sum(len(c[0]) for c in chunks)
        # the last columns read, kept: a reader that indexes two columns row by row in a loop would otherwise
        # expand them again for every row (two columns is the memory this costs)
        self._recent: dict[str, np.ndarray] = {}
        self._kept: dict[str, np.ndarray] = {}  # the _KEPT columns once read (short runs only)

    def __len__(self) -> int:
        return len(self._columns)

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __contains__(self, key: object) -> bool:
        return key in self._columns

    @property
    def replica(self) -> int:
        """The replica whose steps these are (every value of the ``replica`` column)."""
        return self._replica

    @property
    def num_steps(self) -> int:
        return self._len

    def _parts(self) -> Iterator[tuple[Fields, Fields, np.ndarray]]:
        """Each chunk's (per-step values, per-run values, steps per run), read when reached: a spilled chunk
        (``sim.metrics.spill``) reads its fields from the file, one at a time, as they are asked for."""
        for steps, runs in self._chunks:
            yield steps, runs, runs["num_steps"].astype(np.int64)

    def _start(self, steps: Fields, runs: Fields, n: np.ndarray) -> np.ndarray:
        end = steps["end"]
        start = np.empty(len(end), dtype=np.float64)
        start[1:] = end[:-1]
        start[np.cumsum(n) - n] = runs["start"]  # the first step of each run
        return start

    def _chunk_column(self, key: str, steps: Fields, runs: Fields, n: np.ndarray) -> np.ndarray:
        t = self._columns[key]
        if key == "start":
            return self._start(steps, runs, n)
        if key == "duration":  # as the executors compute it: end - start
            return steps["end"] - self._start(steps, runs, n)
        if key == "replica":
            return np.full(len(steps), self._replica, dtype=np.int64)
        if key in self._varying:
            return steps[key].astype(t)
        return np.repeat(runs[key].astype(t), n)

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._columns:
            raise KeyError(key)
        hit = self._recent.get(key)
        if hit is None:
            hit = self._kept.get(key)
        if hit is not None:
            return hit
        parts = [self._chunk_column(key, s, r, n) for s, r, n in self._parts()]
        if not parts:
            return np.zeros(0, dtype=self._columns[key])
        col = parts[0] if len(parts) == 1 else np.concatenate(parts)
        col.flags.writeable = False  # shared by the readers that hit the cache
        if len(col) > _RECENT_MAX_ROWS:  # a long run's column is 160 MB at 20 M steps: not kept
            return col
        if key in _KEPT:
            self._kept[key] = col
            return col
        if len(self._recent) >= _RECENT:
            del self._recent[next(iter(self._recent))]
        self._recent[key] = col
        return col

    def group_gap_parts(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Chunk by chunk, the durations and batch sizes of the steps of the decode fast path's runs (a run's
        ``group_gaps`` flag): the inter-token gaps they stand for (``StepLog.group_gaps``)."""
        for steps, runs, n in self._parts():
            mine = np.repeat(runs["group_gaps"] > 0, n)
            yield (self._chunk_column("duration", steps, runs, n)[mine],
                   self._chunk_column("batch_size", steps, runs, n)[mine])


def step_count(steps: Mapping[str, np.ndarray]) -> int:
    """How many steps a log holds, without expanding a column of a ``StepColumns`` (8 bytes a step: counting a
    long run's steps by its whole start column, twice while its chunks were joined, was the write phase's
    largest array)."""
    return steps.num_steps if isinstance(steps, StepColumns) else len(steps["start"])


BLOCK_ROWS = 1 << 16  # steps per block of step_blocks (512 kB a float64 column)


def continues_ascending(x: np.ndarray, after: float | None) -> bool:
    """Whether a block ``x`` of a column read a block at a time never decreases, starting at or after ``after``
    (the block before's last value; None: no block before, nothing to compare): the check every block-wise reader
    makes before it relies on the steps being in order (NaN anywhere reads as out of order)."""
    return (after is None or bool(x[0] >= after)) and bool(np.all(x[1:] >= x[:-1]))


def step_blocks(steps: Mapping[str, np.ndarray], keys: tuple[str, ...], rows: int = BLOCK_ROWS
                ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``(first row, {key: that block's values})`` for consecutive blocks of ``rows`` steps (the last shorter), so
    that elementwise arithmetic over a long run's steps holds a block of each column rather than whole columns (a
    column is 160 MB at 20 M steps). A ``StepColumns`` expands only the chunks under each block. The values are
    those of the whole columns, and elementwise numpy arithmetic gives each element the same result in a block."""
    keys = tuple(dict.fromkeys(keys))  # a key asked for twice is read once
    if not isinstance(steps, StepColumns):
        cols = {k: np.asarray(steps[k]) for k in keys}
        n = len(cols[keys[0]]) if keys else 0
        for lo in range(0, n, rows):
            yield lo, {k: v[lo : lo + rows] for k, v in cols.items()}
        return
    pending: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    # a short run's start and duration, kept once read (``_KEPT``), are cut from the kept columns: nearly every
    # block reader asks for one, and each chunk's starts are a scatter of its runs' starts (270 chunks of them in
    # bench_vidur's run folder). Copies: a reader may change its block in place.
    kept = {k: steps[k] for k in keys if k in _KEPT and steps.num_steps <= _RECENT_MAX_ROWS}
    held = lo = at = 0
    for st, ru, per_run in steps._parts():
        for k in keys:
            pending[k].append(kept[k][at : at + len(st)].copy() if k in kept
                              else steps._chunk_column(k, st, ru, per_run))
        at += len(st)
        held += len(st)
        while held >= rows or (held and st is steps._chunks[-1][0]):
            whole = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in pending.items()}
            take = min(rows, held)
            yield lo, {k: v[:take] for k, v in whole.items()}
            pending = {k: [v[take:].copy()] for k, v in whole.items()}  # a copy: the block's arrays are freed
            held -= take
            lo += take

