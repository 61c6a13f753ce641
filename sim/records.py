"""What a run leaves behind: per-request records, a columnar per-step log and the pooled inter-token gaps.

Both executors (the simulator and the real engine) fill these the same way, so any two runs compare field by
field. Steps and gaps are stored in columns of numpy chunks, because a long simulation makes millions of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from sim.request import Outcome, Request


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One row of requests.csv. Times in seconds since the start of the run; -1 where it never happened."""

    id: int
    arrival: float
    first_scheduled: float  # first step that computed any of its tokens
    first_token: float  # end of the step that sampled its first output token
    finish: float  # when it completed, was rejected or failed
    prompt_tokens: int
    output_tokens: int  # tokens actually generated (equals the target for completed requests)
    target_output_tokens: int
    num_preemptions: int
    outcome: str  # completed | rejected | failed
    reason: str  # why it was rejected or failed, else ""
    replica: int
    session_id: int  # -1 when the workload has no sessions

    @classmethod
    def from_request(cls, r: Request) -> "RequestRecord":
        assert r.outcome is not None, f"request {r.id} has no outcome yet"
        return cls(
            id=r.id,
            arrival=r.arrival,
            first_scheduled=r.first_scheduled,
            first_token=r.first_token,
            finish=r.finish,
            prompt_tokens=r.prompt_len,
            output_tokens=r.num_output_tokens,
            target_output_tokens=r.output_len,
            num_preemptions=r.num_preemptions,
            outcome=_OUTCOME_TEXT[r.outcome],
            reason=r.reason,
            replica=r.replica,
            session_id=-1 if r.spec.session_id is None else r.spec.session_id,
        )

    @property
    def completed(self) -> bool:
        return self.outcome == Outcome.COMPLETED.value


_OUTCOME_TEXT = {o: o.value for o in Outcome}  # Enum.value is a slow property; a run makes 10^5 records

REQUEST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))

# Columns of steps.csv, with their dtypes. One row per step (idle time has no rows; it is the gap between them).
STEP_COLUMNS: dict[str, type] = {
    "start": np.float64,  # seconds
    "duration": np.float64,  # seconds (predicted by the cost model, or measured by the engine)
    "batch_size": np.int64,  # requests computing tokens this step (padding rows excluded)
    "padded_rows": np.int64,  # rows computed for nobody (static batching keeps finished rows in the batch)
    "prefill_tokens": np.int64,  # tokens of requests still catching up (prompt, chunk, recompute)
    "decode_tokens": np.int64,  # requests computing exactly one token
    "padding_tokens": np.int64,  # wasted token computations
    "kv_blocks_used": np.int64,  # GPU KV blocks allocated to requests after the step's allocation (not free)
    "kv_blocks_reserved": np.int64,  # of kv_blocks_used, blocks holding no token yet (reservation's waste)
    "kv_tokens": np.int64,  # tokens actually stored in GPU KV
    "kv_capacity_blocks": np.int64,
    "num_running": np.int64,
    "num_waiting": np.int64,  # queue length
    "num_swapped": np.int64,
    "num_preempted": np.int64,  # preemptions decided for this step
    "num_rejected": np.int64,  # rejections decided for this step
    "swap_blocks": np.int64,  # blocks copied between GPU and CPU this step
    "flops": np.float64,  # useful FLOPs of the step (padding excluded)
}


_CHUNK = 1 << 16  # rows kept as Python objects before they move into numpy columns


_WAITING = list(STEP_COLUMNS).index("num_waiting")
_NCOL = len(STEP_COLUMNS)


class StepLog:
    """Columnar per-step log. Rows are appended as flat runs of values into one Python list (the cheapest thing
    Python can do per step) and move into numpy columns in blocks."""

    def __init__(self) -> None:
        self._flat: list[float] = []  # rows of _NCOL values, back to back
        self._chunks: list[dict[str, np.ndarray]] = []

    def append(self, *row: float) -> None:
        """Append one step; values in STEP_COLUMNS order."""
        self._flat.extend(row)
        if len(self._flat) >= _CHUNK * _NCOL:
            self._flush()

    def compact(self) -> None:
        """Move appended rows into numpy columns once there are many (a Python float costs 24 bytes plus its
        list slot; a long run would otherwise hold gigabytes of them)."""
        if len(self._flat) >= _CHUNK * _NCOL:
            self._flush()

    def extend(self, **cols: np.ndarray) -> None:
        """Append many steps; one array (or scalar, broadcast) per column in STEP_COLUMNS."""
        self._flush()
        n = len(cols["start"])
        self._chunks.append(
            {k: np.broadcast_to(np.asarray(cols[k], dtype=t), (n,)).copy() for k, t in STEP_COLUMNS.items()}
        )

    def set_last_waiting(self, num_waiting: int) -> None:
        """Correct the queue length of the last step appended (see ``ServingCore.fast_forward``)."""
        self._flat[_WAITING - _NCOL] = num_waiting

    @property
    def last_duration(self) -> float:
        if self._flat:
            return self._flat[1 - _NCOL]
        return float(self._chunks[-1]["duration"][-1]) if self._chunks else 0.0

    def _flush(self) -> None:
        flat = self._flat
        if flat:
            # one C-level conversion of the whole block (counts are far below 2**53, so float64 holds them exactly)
            m = np.fromiter(flat, dtype=np.float64, count=len(flat)).reshape(-1, _NCOL)
            self._chunks.append({k: m[:, i].astype(t) for i, (k, t) in enumerate(STEP_COLUMNS.items())})
            self._flat = []

    def columns(self) -> dict[str, np.ndarray]:
        """All steps so far, one array per column."""
        self._flush()
        if not self._chunks:
            return {k: np.zeros(0, dtype=t) for k, t in STEP_COLUMNS.items()}
        if len(self._chunks) > 1:
            self._chunks = [{k: np.concatenate([c[k] for c in self._chunks]) for k in STEP_COLUMNS}]
        return self._chunks[0]

    def __len__(self) -> int:
        return len(self._flat) // _NCOL + sum(len(c["start"]) for c in self._chunks)

    def __bool__(self) -> bool:
        return bool(self._flat or self._chunks)


class GapLog:
    """Pooled inter-token latencies (ITL) as (gap seconds, count) pairs: a decode run of k steps adds each step's
    duration once with weight equal to the batch, instead of one float per token."""

    def __init__(self) -> None:
        self._gaps: list[float] = []
        self._counts: list[int] = []
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, gap: float, count: int = 1) -> None:
        self._gaps.append(gap)
        self._counts.append(count)
        if len(self._gaps) >= _CHUNK:
            self.compact()

    def compact(self, force: bool = False) -> None:
        """Move the recorded gaps into numpy chunks once there are many (see ``StepLog.compact``)."""
        if len(self._gaps) >= _CHUNK or (force and self._gaps):
            self._chunks.append((np.asarray(self._gaps, dtype=np.float64), np.asarray(self._counts, dtype=np.int64)))
            self._gaps = []
            self._counts = []

    def extend(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        self._chunks.append((np.asarray(gaps, dtype=np.float64), np.asarray(counts, dtype=np.int64)))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(gaps, counts), in the order they were recorded."""
        self.compact(force=True)
        parts = [(np.zeros(0), np.zeros(0, dtype=np.int64))] + self._chunks
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


@dataclass(slots=True)
class RunResult:
    """Everything one variant's run produced."""

    name: str
    requests: list[RequestRecord]
    steps: dict[str, np.ndarray]  # STEP_COLUMNS -> array
    itl_gaps: np.ndarray  # pooled inter-token gaps (seconds)
    itl_counts: np.ndarray  # how many tokens saw each gap
    duration: float  # seconds from the first arrival to the last completion or rejection
    peak_flops: float  # device peak FLOP/s for MFU
    kv_capacity_blocks: int
    block_size: int
    weight_bytes: float = 0.0  # for the memory picture in the report
    kv_bytes_per_block: float = 0.0
    config: dict | None = None  # the resolved variant configuration, recorded with the results
