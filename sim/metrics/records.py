"""What a run leaves behind: per-request records, a columnar per-step log and the pooled inter-token gaps.

Both executors (the simulator and the real engine) fill these the same way, so any two runs compare field by
field. Steps and gaps are stored in columns of numpy chunks, because a long simulation makes millions of them.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.metrics import spill
from sim.metrics.gap_pool import GapPool
from sim.metrics.step_columns import Fields, StepColumns
from sim.serving.request import Outcome, Request, through_twin, unfrozen_twin

if TYPE_CHECKING:
    from sim.costs.energy import PowerModel
    from sim.costs.pooled_power import PooledPower


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request of a run. Times in seconds since the start of the run; -1 where it never happened (requests.csv
    writes those as empty cells and names each time column with its unit: ``arrival_s``...)."""

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
    # Seconds at which each preemption freed the request's GPU KV, and at which it held GPU KV again (recompute:
    # the step that scheduled it again; swap: its swap-in). resumed_at is one shorter when it ended preempted
    # (rejected or failed while waiting). requests.csv writes each as ';'-joined seconds.
    preempted_at: tuple[float, ...] = ()
    resumed_at: tuple[float, ...] = ()
    # The request's class (the workload's classes or a trace's columns); see sim.serving.request.RequestSpec.
    # requests.csv
    # writes these columns only when a run has classes (``CLASS_FIELDS``). SLOs in seconds; -1: no bound.
    priority: int = 0
    tenant: str = ""
    slo_class: str = ""
    ttft_slo: float = -1.0
    tpot_slo: float = -1.0

    @classmethod
    def from_request(cls, r: Request) -> RequestRecord:
        assert r.outcome is not None, f"request {r.id} has no outcome yet"
        spec = r.spec
        session = spec.session_id
        # positional, in field order: a run makes 10^5 records, and keywords cost a third more. Made
        # through the twin (``unfrozen_twin``): a frozen dataclass's __init__ costs nine times as much. A
        # subclass's own __init__ makes its records: the twin shares RequestRecord's layout, not the subclass's
        rec = (_Unfrozen if cls is RequestRecord else cls)(
            r.id,
            r.arrival,
            r.first_scheduled,
            r.first_token,
            r.finish,
            r.prompt_len,  # prompt_tokens
            r.num_output_tokens,  # output_tokens
            r.output_len,  # target_output_tokens
            r.num_preemptions,
            _OUTCOME_TEXT[r.outcome],
            r.reason,
            r.replica,
            -1 if session is None else session,
            _EMPTY if r.preempted_at is None else tuple(r.preempted_at),
            _EMPTY if r.resumed_at is None else tuple(r.resumed_at),
            spec.priority,
            spec.tenant,
            spec.slo_class,
            -1.0 if spec.ttft_slo is None else spec.ttft_slo,
            -1.0 if spec.tpot_slo is None else spec.tpot_slo,
        )
        if cls is RequestRecord:
            rec.__class__ = RequestRecord
        return rec

    @property
    def completed(self) -> bool:
        return self.outcome == _COMPLETED

    def kv_intervals(self, end: float) -> list[tuple[float, float]]:
        """The half-open spans [start, stop) in which the request held GPU KV (or its batch row): from its first
        scheduled step to ``end``, cut at each preemption and restarted at each resume. Empty if never scheduled."""
        if self.first_scheduled < 0:
            return []
        starts = [self.first_scheduled, *self.resumed_at]
        stops = [*self.preempted_at, end]
        return list(zip(starts, stops[: len(starts)], strict=True))


# a run makes a record of every request (10^7 in the longest): made through the twin (``unfrozen_twin``)
_Unfrozen = unfrozen_twin(RequestRecord)


def records_of_rows(rows: Iterable[tuple[Any, ...]]) -> list[RequestRecord]:
    """A ``RequestRecord`` of each row (every field, in order) through the twin (``unfrozen_twin``): for the values
    records held (a ``RequestTable``'s rows). RequestRecord's own ``__init__`` checks nothing either, but stores
    each field through ``object.__setattr__``: reading a 20,000-request table back took 0.069-0.080 s through
    it, 0.035-0.038 s through the twin (a cluster's summary reads its table so for the head-of-line figures)."""
    return through_twin(RequestRecord, _Unfrozen, rows)

_EMPTY: tuple[float, ...] = ()
_OUTCOME_TEXT = {o: o.value for o in Outcome}  # Enum.value is a slow property; a run makes 10^5 records
_COMPLETED = Outcome.COMPLETED.value  # (the report asks ``completed`` several times of every record)

# A request's class fields; a run without classes leaves them at their defaults and its files without them.
CLASS_FIELDS: tuple[str, ...] = ("priority", "tenant", "slo_class", "ttft_slo", "tpot_slo")
REQUEST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord) if f.name not in CLASS_FIELDS)


NO_CLASS = "(no class)"  # the key of requests without a class name, in a run where others have one


def has_classes(records: Sequence[RequestRecord]) -> bool:
    """Whether any request of a run carries a class: a priority, tenant, class name or SLO of its own."""
    from_columns = getattr(records, "any_class", None)  # a RequestTable reads its columns
    if from_columns is not None:
        return bool(from_columns())
    return any(r.priority or r.tenant or r.slo_class or r.ttft_slo >= 0 or r.tpot_slo >= 0 for r in records)

# Columns of steps.csv, with their dtypes. One row per step (idle time has no rows; it is the gap between them).
STEP_COLUMNS: dict[str, type] = {
    "replica": np.int64,  # the replica that ran the step (0 without a cluster); per-replica views filter on it
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


_CHUNK = 1 << 16  # steps kept in the flat buffers before they move into numpy columns

# Most steps come from the decode fast path, in runs of consecutive steps that differ only in their timing, KV
# blocks, KV tokens and FLOPs. So the step log keeps, per step, only those values (``STEP_VARYING``), and per run
# the columns that stay constant over it (``RUN_CONSTANT``): a fifth of the Python objects per step, which counts
# at millions of steps. A run's first step starts at the run's ``start``, each later one when the step before it
# ended. A run of the decode fast path (``group_gaps``) also stands for its members' inter-token gaps: each of
# its steps is one gap, its duration, for each of its ``batch_size`` requests.
STEP_VARYING: tuple[str, ...] = ("end", "kv_blocks_used", "kv_blocks_reserved", "kv_tokens", "flops")
RUN_CONSTANT: tuple[str, ...] = (
    "num_steps", "start", "batch_size", "padded_rows", "prefill_tokens", "decode_tokens", "padding_tokens",
    "kv_capacity_blocks", "num_running", "num_waiting", "num_swapped", "num_preempted", "num_rejected",
    "swap_blocks", "group_gaps",
)  # fmt: skip
_NV = len(STEP_VARYING)
_NR = len(RUN_CONSTANT)
_RUN_WAITING = RUN_CONSTANT.index("num_waiting")


class _Packers(dict[int, Callable[..., bytes]]):
    """``packers[k]``: packs ``k`` numbers into the bytes of as many float64s (``FLOAT_PACKERS``) or int64s
    (``INT_PACKERS``), for ``array.frombytes``. ``array.extend`` parses a format string for each value it converts;
    a ``struct`` packer converts them alike (``PyFloat_AsDouble``, ``PyLong_AsLongLong``: the same numbers) two to
    three times faster. Made once per count."""

    def __init__(self, code: str) -> None:
        super().__init__()
        self.code = code

    def __missing__(self, k: int) -> Callable[..., bytes]:
        pack = self[k] = struct.Struct(f"{k}{self.code}").pack
        return pack


FLOAT_PACKERS = _Packers("d")
INT_PACKERS = _Packers("q")
PACK_STRETCH = INT_PACKERS[6]  # a stretch's six numbers (``StepLog.stretches``)
PACK_RUN = FLOAT_PACKERS[_NR]  # a run's constant values (``RUN_CONSTANT``; counts are far below 2**53: exact)


# Columns held as int32 in the step log's chunks when every value of a chunk is an integer that fits: counts of
# blocks, tokens, requests and steps. The others (times, FLOPs, and any column whose values do not fit) stay
# float64, so every value reads back exactly as it was logged.
_INT_COLUMNS = frozenset(k for k, t in STEP_COLUMNS.items() if t is np.int64) | {"num_steps", "group_gaps"}
_INT32 = np.iinfo(np.int32)


def _packed(cols: Sequence[np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """The columns ``cols`` (int64 or float64, one per name) as one structured array, an integer column as int32
    where it can be (``_INT_COLUMNS``), else float64: 28 bytes a step instead of 40, and 64 a run instead of 120."""
    kinds = []
    for col, name in zip(cols, names, strict=True):
        fits = name in _INT_COLUMNS and (col.dtype.kind == "i" or bool(np.all(col == np.trunc(col)))) and (
            not col.size or (_INT32.min <= col.min() and col.max() <= _INT32.max))
        kinds.append((name, np.int32 if fits else np.float64))
    out = np.empty(len(cols[0]), dtype=kinds)
    for col, name in zip(cols, names, strict=True):
        out[name] = col
    return out


class StepLog:
    """Columnar per-step log, stored as runs of steps (see ``STEP_VARYING``). Steps' varying values are kept a
    stretch of steps at a time (``ends``, ``flops``, ``need``, ``stretches``), and after a run's steps its
    constant values go into the flat list ``per_run``. They move into numpy arrays in blocks, between runs (the
    stretches' KV values computed there with numpy for the whole block), and the runs expand into rows when the
    columns are read."""

    def __init__(self) -> None:
        # Step by step (arrays: each value converted as it is appended, while in cache; a list's float objects,
        # read back in one pass at the block's end, cost three times as much there), its end and FLOPs, and the
        # blocks filled since its stretch began (``need``). A stretch of k
        # steps, flat in ``stretches``: (k, used, filled, kv_tokens, m, grows): before its first step ``used``
        # blocks were in use, ``filled`` held tokens and ``kv_tokens`` tokens were held; after its step j (1..k),
        # ``need`` more blocks are filled, as many more in use when it ``grows`` (paged KV; a reservation fills the
        # blocks it holds), and ``kv_tokens + m * j`` tokens are held. The decode fast path appends a stretch with
        # four packed runs of numbers, where packing five values a step (an interleaved
        # float64 array before) cost it some 0.5 us a step
        self.ends = array("d")
        self.flops = array("d")
        self.need = array("q")
        self.stretches = array("q")
        self.per_run = array("d")  # packed as appended (``PACK_RUN``), as the steps' values are
        # (per-step values, per-run values), structured arrays with a field per column (``_packed``), or past
        # spill.SPILL_MIN steps the same written to a file (spill.SpilledFields, which reads like them)
        self._chunks: list[tuple[Fields, Fields]] = []
        self._spill: spill.SpillFile | None = None
        self._num_spilled = 0  # chunks in the file (the first ones)
        self._num_flushed = 0  # steps in _chunks
        self._columns: StepColumns | None = None  # the columns' view of _chunks, once asked for
        # constant over a log (one core per replica), so it costs nothing per step; set by sim.loop.simulator.Replica
        self.replica = 0

    def append(
        self,
        start: float,
        end: float,
        batch_size: int,
        padded_rows: int,
        prefill_tokens: int,
        decode_tokens: int,
        padding_tokens: int,
        kv_blocks_used: int,
        kv_blocks_reserved: int,
        kv_tokens: int,
        kv_capacity_blocks: int,
        num_running: int,
        num_waiting: int,
        num_swapped: int,
        num_preempted: int,
        num_rejected: int,
        swap_blocks: int,
        flops: float,
    ) -> None:
        """Append one step (a run of one)."""
        self.ends.append(end)
        self.flops.append(flops)
        self.need.append(0)
        self.stretches.frombytes(PACK_STRETCH(1, kv_blocks_used, kv_blocks_used - kv_blocks_reserved, kv_tokens, 0, 0))
        self.per_run.frombytes(PACK_RUN(
            1, start, batch_size, padded_rows, prefill_tokens, decode_tokens, padding_tokens, kv_capacity_blocks,
            num_running, num_waiting, num_swapped, num_preempted, num_rejected, swap_blocks, 0
        ))  # fmt: skip
        if len(self.ends) >= _CHUNK:  # compact(), without a call per step
            self._flush()

    def end_decode_run(
        self,
        num_steps: int,
        start: float,
        batch_size: int,
        kv_capacity_blocks: int,
        num_running: int,
        num_waiting: int,
        num_swapped: int,
        padded_rows: int = 0,
    ) -> None:
        """Close a run of the decode fast path: the last ``num_steps`` steps appended, the first
        starting at ``start``, in each of which the ``batch_size`` members of the decode group compute one token
        and sample it (no prefill, preemption, rejection or swap; ``padded_rows`` rows of CUDA-graph padding)."""
        self.per_run.frombytes(PACK_RUN(
            num_steps, start, batch_size, padded_rows, 0, batch_size, padded_rows, kv_capacity_blocks, num_running,
            num_waiting, num_swapped, 0, 0, 0, 1
        ))  # fmt: skip

    def compact(self) -> None:
        """Move appended steps into packed numpy chunks once there are many (the runs' list holds a Python object
        a value, 24 bytes or more plus its slot; a long run would otherwise hold gigabytes of them). Only between
        runs."""
        if len(self.ends) >= _CHUNK:
            self._flush()

    def set_last_waiting(self, num_waiting: int) -> None:
        """Correct the queue length of the last step appended (see ``ServingCore.fast_forward``)."""
        runs = self.per_run
        i = len(runs) - _NR  # the last run
        if runs[i + _RUN_WAITING] == num_waiting:
            return
        if runs[i] > 1:  # split the last step off its run: it starts when the step before it ended
            last = runs[i:]
            runs[i] -= 1
            last[0] = 1
            last[1] = self.ends[-2]
            runs += last
        runs[-_NR + _RUN_WAITING] = num_waiting

    def _flush(self) -> None:
        if not self.per_run:
            return
        # the runs stay compact until the columns are asked for; packed a column after another (a column of the
        # rows' array is strided)
        steps = self._step_values()
        runs = np.frombuffer(self.per_run, dtype=np.float64).reshape(-1, _NR).T.copy()
        self.ends, self.flops, self.need, self.stretches = array("d"), array("d"), array("q"), array("q")
        self.per_run = array("d")
        self._chunks.append((_packed(steps, STEP_VARYING), _packed(list(runs), RUN_CONSTANT)))
        self._num_flushed += len(steps[0])
        self._columns = None
        if self._num_flushed > spill.SPILL_MIN:  # a long run: its chunks leave memory for a file
            if self._spill is None:
                self._spill = spill.SpillFile()
            for i in range(self._num_spilled, len(self._chunks)):
                st, ru = self._chunks[i]
                assert isinstance(st, np.ndarray) and isinstance(ru, np.ndarray)
                self._chunks[i] = (spill.SpilledFields(self._spill, st), spill.SpilledFields(self._spill, ru))
            self._num_spilled = len(self._chunks)

    def _step_values(self) -> list[np.ndarray]:
        """The steps appended since the last block, a column of each of ``STEP_VARYING`` (times and FLOPs float64,
        counts int64). Blocks in use: ``used + need`` (``used`` without growth); reserved: what of them holds no
        token yet, ``max(0, in use - (filled + need))``: the integers the fast path's arithmetic gave step by
        step."""
        n = len(self.ends)
        need = np.frombuffer(self.need, dtype=np.int64)
        info = np.frombuffer(self.stretches, dtype=np.int64).reshape(-1, 6)
        k = info[:, 0]
        of = np.repeat(np.arange(len(k)), k)  # each step's stretch
        used, filled, kv, m, grows = (info[of, c] for c in range(1, 6))
        j = np.arange(1, n + 1) - (np.cumsum(k) - k)[of]  # each step's place in its stretch, from 1
        used = used + need * grows
        # views of the arrays, which _flush replaces before it packs them (an array exporting its buffer cannot grow)
        return [np.frombuffer(self.ends, dtype=np.float64), used, np.maximum(used - (filled + need), 0), kv + m * j,
                np.frombuffer(self.flops, dtype=np.float64)]

    def columns(self) -> StepColumns:
        """All steps so far, one array per column, each expanded from the runs when read (see
        ``sim.metrics.step_columns``: the log never holds all its rows at once)."""
        self._flush()
        if self._columns is None:
            self._columns = StepColumns(list(self._chunks), STEP_COLUMNS, STEP_VARYING, RUN_CONSTANT, self.replica)
        return self._columns

    def group_gaps(self, pooled: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The inter-token gaps that the decode fast path's runs stand for, as (gap seconds, tokens that saw it)
        pairs: one per step, its duration, seen by each of its batch (``pooled``: in the canonical pooled form)."""
        pool = GapPool()  # a chunk of steps at a time, pooled as they grow (not two whole columns)
        for gaps, counts in self.columns().group_gap_parts():
            pool.add(gaps, counts)
        return pool.pooled() if pooled else pool.arrays()

    def __len__(self) -> int:
        return len(self.ends) + self._num_flushed

    def __bool__(self) -> bool:
        return bool(self.ends or self._chunks)


class GapLog:
    """Pooled inter-token latencies (ITL) as (gap seconds, count) pairs: a step of the decode group adds its gap
    once with weight equal to the group, instead of one float per token. (The decode fast path's runs leave theirs
    in the step log: see ``StepLog.group_gaps``.)"""

    def __init__(self) -> None:
        self._gaps: list[float] = []
        self._counts: list[int] = []
        self._pool = GapPool()  # the pairs moved out of the lists, pooled once a long run has many

    def add(self, gap: float, count: int = 1) -> None:
        self._gaps.append(gap)
        self._counts.append(count)
        if len(self._gaps) >= _CHUNK:
            self.compact()

    def compact(self, force: bool = False) -> None:
        """Move the recorded gaps into numpy chunks once there are many (see ``StepLog.compact``)."""
        if len(self._gaps) >= _CHUNK or (force and self._gaps):
            self._pool.add(np.asarray(self._gaps, dtype=np.float64), np.asarray(self._counts, dtype=np.int64))
            self._gaps = []
            self._counts = []

    def extend(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        self._pool.add(gaps, counts)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(gaps, counts), in the order they were recorded (pooled in part past ``gap_pool.POOL_MIN`` pairs)."""
        self.compact(force=True)
        return self._pool.arrays()

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """``pooled_gaps(*self.arrays())``, pooled in place (``GapPool.pooled``)."""
        self.compact(force=True)
        return self._pool.pooled()


@dataclass(slots=True)
class RunResult:
    """Everything one variant's run produced."""

    name: str
    # in id order; past sim.metrics.request_table.STREAM_MIN requests a RequestTable (columns) instead of a list
    requests: Sequence[RequestRecord]
    steps: Mapping[str, np.ndarray]  # STEP_COLUMNS -> array (the step log's StepColumns, or a dict)
    itl_gaps: np.ndarray  # pooled inter-token gaps (seconds)
    itl_counts: np.ndarray  # how many tokens saw each gap
    duration: float  # seconds from the first arrival to the last completion or rejection
    peak_flops: float  # device peak FLOP/s for MFU
    kv_capacity_blocks: int
    block_size: int
    weight_bytes: float = 0.0  # for the memory picture in the report
    kv_bytes_per_block: float = 0.0
    config: dict | None = None  # the resolved variant configuration, recorded with the results
    cluster: dict | None = None  # several replicas: replica count over time, GPU-hours, cost (sim/loop/cluster.py)
    spec_decode: dict | None = None  # speculative decoding's counters (sim.serving.spec_decode.summary_inputs)
    pipeline: dict | None = None  # pipeline stages: utilisation, bubble fraction (sim/serving/pipeline.py)
    host_kv: dict | None = None  # prefix cache host tier: hits, bytes loaded, recompute saved
    # (sim/serving/host_kv_tier.py)
    disaggregation: dict | None = None  # prefill/decode pools: transfers and pools (sim/loop/disagg/pools.py)
    # per request class, the pooled inter-token gaps of its completed requests as (gaps, counts); only when the
    # run kept token times and has classes (sim.loop.results.class_itl_gaps)
    class_itl: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    # summary blocks other layers contribute, key -> function of this result, appended after the built-in ones in
    # this order (sim.metrics.summary.summarize): the metrics layer need not know them. Module-level functions, so that
    # a result still pickles (sweeps). Prefill/decode pools add "disaggregation" (sim/loop/disagg/pools.py).
    summary_sections: dict[str, Callable[[RunResult], Any]] | None = None
    # the replica's power figures (sim/costs/energy.py, power_model_of); None: not modelled (a GPU without them, a
    # calibration profile measured on a CPU, an engine's run); a disaggregated run's: each pool's (PooledPower)
    power: PowerModel | PooledPower | None = None
    # max_num_batched_tokens as the replica's core applied it (the decode pool's in a disaggregated run): ``config``
    # records the policy section as written, None where servesim's own default applies (8,192, or max_model_len)
    token_budget: int | None = None
    # the wall time of the policy's own schedule calls and how many there were (sim.policies.user.UserPolicy): on
    # no clock, simulated or the engine's (sim.loop.results.slow_policy_note); not compared, it is measured
    policy_seconds: float = field(default=0.0, compare=False)
    policy_asks: int = field(default=0, compare=False)
