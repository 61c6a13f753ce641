"""Power and energy of a run: watts per step, joules per run, per request and per output token.

Computed after the run from its step columns (vectorised), never in the simulator's loop. One GPU's power in a
step is its static (idle) power plus a dynamic part that grows with how busy its arithmetic units and its memory
are, capped by the board's power limit (``clock``: the SM clock's share under that limit, 1 uncapped)::

    P = min(limit, idle + (tdp - idle) * min(1, compute_share * clock^3 + MEMORY_POWER_SHARE * memory_share))

``compute_share`` and ``memory_share`` are the seconds of the step the roofline cost model
(``AnalyticCostModel.busy_times``) keeps the tensor cores and HBM busy, over the step's duration. A replica's
power is its GPUs' (tensor x pipeline parallel) times that. Between steps a GPU draws its idle power: the run's
energy is the integral of power over its steps and its idle gaps.

Why these shapes:
- a compute-bound step runs at the board's limit: GEMMs on H100/H200 throttle at their power limit, which is what
  makes a power cap slow them (the cap, ``clock_share``, below);
- a memory-bound step draws most of it too: streaming HBM keeps every SM issuing loads and moves each byte through
  L2 and the on-chip crossbar, and moving data costs more energy than the arithmetic on it. ML.ENERGY's published
  v3.0 data (benchmarks/data/energy-published.csv) shows it: Llama-3.1-8B decoding at batch 8 on an H100 (a 7.3 ms
  token interval, about two thirds of it streaming the weights) draws 486 W of 700, Qwen3-32B at batch 8 on a B200
  860 W of 1,000; the Serial Alice benchmark saw 267-680 W on H100s from batch 1 to 128. ``MEMORY_POWER_SHARE``
  puts a step streaming HBM the whole step at 75% of the dynamic range (70 + 0.75 x 630 = 543 W on the H100):
  the one constant fitted, to ML.ENERGY v3.0's published mean power (not its joules) of 174 configurations, median
  |power error| 9.3%, 9.3% leaving each model out of the fit and 16.7% leaving each GPU out (0.70 fitted on H100
  alone, 0.95 on B200 alone). Ma et al. ("The Illusion of Power Capping in LLM Decode", arXiv 2605.11999, 2026)
  saw decode on an H200 draw only 137-300 W, which this puts too high; the two larger sources agree with it;
- a cost model without a roofline (a fitted profile) gets its compute share from the step's model FLOPs at the
  default compute efficiency and counts the rest of the step as memory traffic;
- a pipeline's GPUs are busy only for their stage's share of each micro-batch (``m x work / pp`` of a round,
  sim/serving/pipeline.py): the rest of the round, the bubble, each waits for the others at static power. Around
  the analytic model a stage's compute and memory shares are the roofline's of one micro-batch, times ``m / pp``
  (the stages' mean: the power of uneven stages is taken at their mean share); around a profile, the stage's busy
  time less its compute is its memory traffic.

Energy is attributed to requests by their tokens: a step's energy is split evenly over the tokens it computed
(prefill and decode; padding's share goes to the real tokens), and a request gets the share of each step in its
prefill window (its first scheduled step to its first token, in proportion to its prompt tokens) and one token's
share of each step in its decode window (first token to finish). Preemptions are not subtracted from the windows,
and idle energy belongs to no step, so the shares are scaled to sum to the run's energy (idle included): the
energy it took to serve the requests, split by the work each caused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.costs.analytic import DEFAULT_COMPUTE_EFFICIENCY, AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.costs.fitted import FittedCostModel
from sim.metrics import spill
from sim.metrics.block_sums import PairwiseSum
from sim.metrics.request_table import RequestTable, as_table
from sim.metrics.step_columns import StepColumns, continues_ascending, step_blocks, step_count
from sim.serving.pipeline import PipelineCostModel

if TYPE_CHECKING:
    from sim.costs.pooled_power import PooledPower
    from sim.hardware.gpu import GPUSpec
    from sim.metrics.records import RunResult

# Of the dynamic power range (tdp - idle), what a step that keeps HBM busy all its duration draws (see above).
MEMORY_POWER_SHARE = 0.75


def clock_share(idle_w: float, tdp_w: float, limit_w: float) -> float:
    """The SM clock, as a share of its full rate, at which a compute-bound step fits under a power cap of
    ``limit_w``: dynamic power goes as C V^2 f and the voltage scales with the clock in the DVFS range, so as f^3;
    at full clock a compute-bound step draws ``tdp_w``. 1.0 without a cap (or a cap at or above the TDP).
    That a cap lowers the SM clock and with it DGEMM throughput, while a memory-bound kernel keeps its speed, is
    what "Architectural and Power-Capping Trade-offs in NVIDIA H100 and H200 GPUs" (arXiv 2604.11391) measured for
    caps from 200 to 700 W, and Ma et al. (2026, above) for decode: HBM keeps its clock."""
    if limit_w >= tdp_w or tdp_w <= idle_w:
        return 1.0
    return float(((limit_w - idle_w) / (tdp_w - idle_w)) ** (1.0 / 3.0))


@dataclass(frozen=True, slots=True, eq=False)
class PowerModel:
    """One replica's power figures. ``roofline``: its analytic cost model, whose busy times give each step's
    compute and memory shares; None: the shares come from the step's FLOPs (see the module docstring)."""

    idle_w: float  # per GPU, static power
    tdp_w: float  # per GPU, what a compute-bound step draws at full clock
    limit_w: float  # per GPU, the board's power limit (deployment.power_limit_w, else tdp_w)
    gpus: int = 1  # GPUs of one replica (tensor x pipeline parallel), each drawing the same
    roofline: AnalyticCostModel | None = None
    peak_flops: float = 0.0  # FLOP/s of the replica's GPUs (the fallback's compute share)
    pipeline: PipelineCostModel | None = None  # the replica's stages, whose bubbles draw static power only

    def power(self, compute_share: np.ndarray, memory_share: np.ndarray) -> np.ndarray:
        """Watts of the replica in steps with these busy shares (each in [0, 1])."""
        # the arithmetic at a capped clock r draws r^3 of its full dynamic power (see clock_share): the roofline
        # was built at that clock, so its compute share is of the slower time
        clock = 1.0 if self.roofline is None else self.roofline.compute_clock
        dyn = (self.tdp_w - self.idle_w) * np.minimum(1.0, compute_share * clock**3
                                                      + MEMORY_POWER_SHARE * memory_share)
        return self.gpus * np.minimum(self.idle_w + dyn, self.limit_w)

    def step_power(self, steps: Any) -> np.ndarray:
        """W of the replica in each of ``steps`` (a whole array)."""
        return self.power(*busy_shares(self, steps))

    def for_replica(self, replica: int) -> PowerModel:
        """The power model of replica ``replica``'s GPUs: this one (a disaggregated run's pools differ,
        sim/costs/pooled_power.py)."""
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"gpus_per_replica": self.gpus, "idle_w": self.idle_w, "tdp_w": self.tdp_w,
                "power_limit_w": self.limit_w, "busy_from": "roofline" if self.roofline is not None else "flops"}


def measured_on_cpu(cost: Any) -> bool:
    """Whether ``cost`` times its steps from a profile measured on a CPU (`servesim calibrate --device cpu`), also
    as a speculative decoder's target or a pipeline's inner model."""
    inner = getattr(cost, "target", cost)
    inner = inner.inner if isinstance(inner, PipelineCostModel) else inner
    return isinstance(inner, FittedCostModel) and inner.device.lower().startswith("cpu")


def cpu_device(_result: Any) -> str:
    """The summary's ``device`` of a run whose steps a CPU profile timed (a RunResult.summary_sections entry: a
    module-level function, so the result still pickles): the table, verdict and report then say CPU, as for an
    engine run on a CPU."""
    return "cpu"


def power_model_of(gpu: GPUSpec, cost: Any, gpus: int, limit_w: float | None) -> PowerModel | None:
    """A replica's power model: ``gpu``'s figures, ``gpus`` of them, capped at ``limit_w`` (None: the TDP), busy
    shares from ``cost``'s roofline when it is the analytic model (or a speculative decoder's target); None when the
    GPU has no power figures, or ``cost`` is a profile measured on a CPU."""
    if gpu.tdp_w <= 0:
        return None
    inner = getattr(cost, "target", cost)  # sim.serving.spec_decode.SpecDecodeCost: the target's roofline
    pipeline = inner if isinstance(inner, PipelineCostModel) else None
    if pipeline is not None:
        inner = pipeline.inner  # the whole model on one stage group: a micro-batch's roofline
    if measured_on_cpu(cost):
        return None  # steps measured on a CPU (`servesim calibrate --device cpu`): no GPU drew power for them
    roofline = inner if isinstance(inner, AnalyticCostModel) else None
    return PowerModel(gpu.idle_w, gpu.tdp_w, gpu.tdp_w if limit_w is None else min(limit_w, gpu.tdp_w), gpus,
                      roofline, float(cost.peak_flops), pipeline)


_BUSY_COLUMNS = ("duration", "flops", "prefill_tokens", "padding_tokens", "decode_tokens", "batch_size", "padded_rows",
                 "kv_tokens")


def busy_shares(pm: PowerModel, steps: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each step's compute and memory busy shares from the step columns. The roofline needs each step's query-key
    pairs and KV reads, which the step log does not keep: the pairs are what the step's recorded FLOPs leave after
    the linear layers and the LM head (exact), the KV reads equal the pairs in a step of decodes only (a decode
    row attends its context plus itself) and are taken as the GPU's stored KV tokens in a step with prefill.
    Computed a block of steps at a time (``step_blocks``): a dozen temporaries of a long run's whole columns were
    most of the memory its summary took."""
    n = step_count(steps)
    c, m = np.zeros(n), np.zeros(n)
    for lo, block in step_blocks(steps, _BUSY_COLUMNS):
        bc, bm = _busy_block(pm, {k: np.asarray(v, dtype=np.float64) for k, v in block.items()})
        c[lo : lo + len(bc)] = bc
        m[lo : lo + len(bm)] = bm
    return c, m


def power_blocks(pm: PowerModel, steps: Any, rows: int | None = None, extra: tuple[str, ...] = ()
                  ) -> Iterator[tuple[int, dict[str, np.ndarray], np.ndarray]]:
    """``(first row, the block's duration and ``extra`` as float64, each step's power in W)`` a block of steps
    at a time: the very values of ``pm.power(*busy_shares(pm, steps))`` (elementwise arithmetic). Inside
    ``energy_kept``, a long run whose energy was computed reads its power back from the file ``_run_energy`` wrote
    (``SpilledPower``) instead of making it again from the eight busy columns."""
    kept = _spilled_power(pm, steps)
    if kept is None:
        yield from _made_power_blocks(pm, steps, rows, extra)
        return
    keys = ("duration", *extra)
    for lo, block in step_blocks(steps, keys) if rows is None else step_blocks(steps, keys, rows):
        b = {k: np.asarray(v, dtype=np.float64) for k, v in block.items()}
        yield lo, b, kept.rows(lo, len(b["duration"]))


class SpilledPower:
    """A long run's step power (W), as ``_run_energy`` made it block after block, in a temporary file of its own
    (8 bytes a step on disk): the write phase's readers (the report's power chart, the metrics export's running
    sums) read rows of it back, bit for bit, instead of making it again from eight step columns (a third of
    ``power_over_time`` at 100,000 requests). Pickled (a sweep's worker sends its results back) it becomes None,
    and readers make the power again."""

    __slots__ = ("_file", "num_steps")

    def __init__(self) -> None:
        self._file = spill.SpillFile()
        self.num_steps = 0

    def add(self, power: np.ndarray) -> None:
        """Append the next block's power (float64)."""
        self._file.write(np.asarray(power, dtype=np.float64))
        self.num_steps += len(power)

    def rows(self, lo: int, n: int) -> np.ndarray:
        """The power of steps lo..lo+n."""
        return self._file.read(8 * lo, np.dtype(np.float64), n)

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return type(None), ()


def _spilled_power(pm: PowerModel, steps: Any) -> SpilledPower | None:
    """The power ``_run_energy`` wrote of these very steps under this very power model, kept (``energy_kept``)."""
    for _, e in (_kept or {}).values():
        if e is not None and e.power_spill is not None and e.steps is steps and e.power_model is pm \
                and e.power_spill.num_steps == step_count(steps):
            return e.power_spill
    return None


def _made_power_blocks(pm: PowerModel, steps: Any, rows: int | None = None, extra: tuple[str, ...] = ()
                       ) -> Iterator[tuple[int, dict[str, np.ndarray], np.ndarray]]:
    """``power_blocks`` made from the steps' busy columns (the block holds them too)."""
    keys = _BUSY_COLUMNS + extra
    blocks = step_blocks(steps, keys) if rows is None else step_blocks(steps, keys, rows)
    for lo, block in blocks:
        b = {k: np.asarray(v, dtype=np.float64) for k, v in block.items()}
        yield lo, b, pm.power(*_busy_block(pm, b))


def _busy_block(pm: PowerModel, steps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    dur = steps["duration"]
    flops = steps["flops"]
    if pm.roofline is not None:
        f_tok, f_row, f_pair = pm.roofline.flops_per_unit
        prefill = steps["prefill_tokens"]
        pad = steps["padding_tokens"]
        tok = prefill + steps["decode_tokens"] + pad
        rows = steps["batch_size"] + steps["padded_rows"]
        pairs = np.maximum(flops - (tok - pad) * f_tok - rows * f_row, 0.0) / f_pair if f_pair > 0 else tok * 0.0
        kv_read = np.where(prefill > 0, steps["kv_tokens"], pairs)
        if pm.pipeline is None:
            compute, memory = pm.roofline.busy_times(StepShape(rows, tok, steps["decode_tokens"], kv_read, pairs))
        else:  # m micro-batches of the step's rows through pp stages: each stage computes m / pp of one's roofline
            pp = pm.pipeline.pipeline_parallel_size
            m = np.clip(rows, 1, pp)
            compute, memory = pm.roofline.busy_times(StepShape(rows / m, tok / m, steps["decode_tokens"] / m,
                                                               kv_read / m, pairs / m))
            compute, memory = compute * m / pp, memory * m / pp
    else:
        rate = pm.peak_flops * DEFAULT_COMPUTE_EFFICIENCY
        compute = flops / rate if rate > 0 else flops * 0.0
        busy = dur if pm.pipeline is None else pm.pipeline.stage_busy(
            steps["batch_size"] + steps["padded_rows"],
            steps["prefill_tokens"] + steps["decode_tokens"] + steps["padding_tokens"], dur)
        memory = np.maximum(busy - compute, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(dur > 0, np.minimum(compute / dur, 1.0), 0.0)
        m = np.where(dur > 0, np.minimum(memory / dur, 1.0), 0.0)
    return c, m


@dataclass(frozen=True, slots=True, eq=False)
class RunEnergy:
    """A run's energy: in all, idle, and per request (in ``RunResult.requests``' order). Per step only on demand
    (``step_power_w``, ``step_energy_j``): two whole arrays of a long run's steps (16 bytes a step) were kept for
    as long as its folder was written."""

    power_model: PowerModel | PooledPower
    steps: Any  # the run's step columns
    idle_energy_j: float  # J drawn between steps (every replica that was up, at idle power)
    up_seconds: float  # replica-seconds the fleet was up
    request_energy_j: np.ndarray  # J attributed to each request (they sum to energy_j)
    busy_energy_j: float  # J of the steps: the sum of step_energy()
    peak_step_power_w: float  # the most step_power() (NaN: no steps)
    power_spill: SpilledPower | None = None  # a long run's step power, in a file (see ``power_blocks``)

    @property
    def energy_j(self) -> float:
        return self.busy_energy_j + self.idle_energy_j

    @property
    def step_power_w(self) -> np.ndarray:
        """W of the replica that ran each step, a whole array computed on each read (read it once)."""
        return self.power_model.step_power(self.steps)

    @property
    def step_energy_j(self) -> np.ndarray:
        """J of each step, likewise computed on each read."""
        return self.step_power_w * np.asarray(self.steps["duration"], dtype=np.float64)


def up_seconds(result: RunResult) -> float:
    """Replica-seconds the fleet was up (summarize's: an autoscaled cluster's replicas come and go)."""
    if result.cluster:
        return float(result.cluster["replica_seconds"])
    return float(result.duration)


# A run's summary reads its energy, and writing its folder four times more (the report's two charts and both
# exports); each reading is a pass over every step and request: a fifth of the folder's time. Inside
# ``energy_kept`` a result's energy is computed once, and kept for as long as the result holds the very steps,
# requests and power model it was computed from; outside, nothing is kept (a long run's step arrays are hundreds
# of MB). A scenario's run keeps its store from its summaries to its folder (``ScenarioRun.energy``: 8 bytes a
# request, the per-request energy).
EnergyStore = dict[int, tuple[tuple[object, ...], "RunEnergy | None"]]
_kept: EnergyStore | None = None


@contextmanager
def energy_kept(store: EnergyStore | None = None) -> Iterator[None]:
    """Compute each run's energy once inside the block (see ``_kept``), into ``store`` when given (one an earlier
    block filled), else the enclosing block's or a new one."""
    global _kept
    outer = _kept
    _kept = store if store is not None else ({} if outer is None else outer)
    try:
        yield
    finally:
        _kept = outer


def kept_for(store: EnergyStore, pairs: Iterator[tuple[RunResult, RunResult]]) -> EnergyStore:
    """A store with the energy ``store`` keeps of each first result of ``pairs`` kept for the second too: a copy
    of it with the same steps and power model and the same requests in another form (a list of records as
    columns, as the run folder reads them)."""
    out = dict(store)
    for old, new in pairs:
        hit = store.get(id(old))
        if hit is not None and all(a is b for a, b in zip(hit[0][:4], (old, old.steps, old.requests, old.power),
                                                           strict=True)) \
                and new.steps is old.steps and new.power is old.power and len(new.requests) == len(old.requests):
            out[id(new)] = ((new, new.steps, new.requests, new.power, hit[0][4]), hit[1])
    return out


def run_energy(result: RunResult, up: float | None = None, kept_as: RunResult | None = None) -> RunEnergy | None:
    """The run's energy, None when it has no power model (``RunResult.power`` says when).
    ``up``: replica-seconds the fleet was up (default ``up_seconds``). ``kept_as``: the result to keep it for
    (inside ``energy_kept``), one with the same steps, power model and requests in another form (default
    ``result``)."""
    up = up_seconds(result) if up is None else up
    if _kept is None:
        return _run_energy(result, up)
    key = result if kept_as is None else kept_as
    inputs = (key, key.steps, key.requests, key.power)
    hit = _kept.get(id(key))
    if hit is not None and all(a is b for a, b in zip(hit[0][:4], inputs, strict=True)) and hit[0][4] == up:
        return hit[1]
    e = _run_energy(result, up)
    _kept[id(key)] = ((*inputs, up), e)  # the result itself too: its id is not reused while kept
    return e


def _run_energy(result: RunResult, up: float) -> RunEnergy | None:
    pm = result.power
    if pm is None:
        return None
    if not isinstance(pm, PowerModel):  # a disaggregated run's pools
        return pm.run_energy(result, up)
    s = result.steps
    n = step_count(s)
    busy_s, busy_j = PairwiseSum(n), PairwiseSum(n)  # float(dur.sum()), float(energy.sum()) to the bit
    peak = -np.inf
    # a run this short keeps each block's energy for the attribution's three passes (the same blocks, the same
    # products) instead of making its step blocks and power three times again
    kept: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = \
        [] if isinstance(s, StepColumns) and n <= KEEP_ENERGY_ROWS else None
    # a longer run's: each block's energy alone, written to a temporary file and read back by each pass (8 bytes a
    # step on disk, a block in memory), instead of its steps' power made again from eight columns for each pass
    # (two thirds of run_energy at 100,000 requests)
    spilled = spill.SpillFile() if kept is None and isinstance(s, StepColumns) and n else None
    power_spill = SpilledPower() if spilled is not None else None  # the power too, for the write phase's readers
    at: list[int] = []
    for lo, block, power in _made_power_blocks(pm, s, ATTRIBUTE_ROWS, () if kept is None else ("start",)):
        energy = power * block["duration"]
        busy_s.add(block["duration"])
        busy_j.add(energy)
        if kept is not None:
            kept.append((lo, block["start"], block["prefill_tokens"], block["decode_tokens"], energy))
        elif spilled is not None and power_spill is not None:
            at.append(spilled.write(energy))
            power_spill.add(power)
        if len(power):
            peak = float(np.max([peak, power.max()]))  # NaN propagates, as in a whole column's max
    idle = max(up - busy_s.value(), 0.0) * pm.idle_w * pm.gpus
    total = busy_j.value() + idle
    recs = as_table(result.requests)
    per_request = None
    if isinstance(s, StepColumns) and len(recs) and n:  # a log's own columns: each block's energy as it is read
        if kept is not None:
            blocks = partial(iter, kept)
        else:
            assert spilled is not None
            file = spilled
            blocks = partial(_energy_of, lambda k, lo, m: file.read(at[k], np.dtype(np.float64), m), s)
        per_request = _attribute_in_blocks(recs, blocks, total)
    if per_request is None:
        per_request = attribute(result, pm.power(*busy_shares(pm, s)) * np.asarray(s["duration"], dtype=np.float64),
                                total)
    return RunEnergy(pm, s, idle, up, per_request, busy_j.value(), peak if n else float("nan"), power_spill)


def attribute(result: RunResult, step_energy: np.ndarray, total: float) -> np.ndarray:
    """Each request's share of ``total`` by the tokens it had computed in each step (see the module docstring)."""
    recs = as_table(result.requests)  # read as columns
    out = np.zeros(len(recs))
    if not len(recs) or not len(step_energy):
        return out
    s = result.steps
    if isinstance(s, StepColumns):  # a log's own columns: read a block at a time
        blocks = _attribute_in_blocks(recs, partial(_energy_of, lambda k, lo, m: step_energy[lo : lo + m], s), total)
        if blocks is not None:
            return blocks
    start = np.asarray(s["start"], dtype=np.float64)
    replica = np.asarray(s["replica"], dtype=np.int64)
    prefill = np.asarray(s["prefill_tokens"], dtype=np.float64)
    tok = prefill + np.asarray(s["decode_tokens"], dtype=np.float64)
    per_tok = np.divide(step_energy, tok, out=np.zeros_like(step_energy), where=tok > 0)
    del tok
    req_rep, first_sched, first_tok, finish = (recs.column(k) for k in ("replica", "first_scheduled", "first_token",
                                                                         "finish"))
    prompt = recs.column("prompt_tokens").astype(np.float64)
    replicas = np.unique(replica)
    fleet = len(replicas) > 1
    if fleet:
        # the steps and the requests put in replica order once (stable: each replica's keep their order), each
        # replica's then a slice: a mask of every step and every request per replica made this quadratic in the
        # fleet (256 replicas, 20,000 requests: 0.39 s of a 0.94 s summary)
        s_order = np.argsort(replica, kind="stable")
        s_cut = np.searchsorted(replica[s_order], replicas, side="right")
        live = np.flatnonzero(first_sched >= 0)
        r_order = live[np.argsort(req_rep[live], kind="stable")]
        r_keys = req_rep[r_order]
        r_lo, r_hi = (np.searchsorted(r_keys, replicas, side=side) for side in ("left", "right"))
    for j, rep in enumerate(replicas):
        # one replica's steps in start order; a single replica's log is that already, and its columns are then
        # used as they are (a long run's masked and sorted copies were most of the memory this took)
        if fleet:
            sel = s_order[s_cut[j - 1] if j else 0 : s_cut[j]]
            st, pt, pf = start[sel], per_tok[sel], prefill[sel]
            mine = r_order[r_lo[j] : r_hi[j]]  # its requests that were scheduled, in index order
        else:
            st, pt, pf = start, per_tok, prefill
            mine = np.flatnonzero((req_rep == rep) & (first_sched >= 0))
        if not bool(np.all(st[1:] >= st[:-1])):
            order = np.argsort(st, kind="stable")
            st, pt, pf = st[order], pt[order], pf[order]
        c_dec, c_pre_e, c_pre_n = (_cumsum0(x) for x in (pt, pt * pf, pf))
        fs, ft, fin = first_sched[mine], first_tok[mine], finish[mine]
        ft = np.where(ft >= 0, ft, fin)  # no first token (failed or rejected while prefilling): prefill to its end
        i0, i1, i2 = (np.searchsorted(st, x, side="left") for x in (fs, ft, fin))
        pre_n = c_pre_n[i1] - c_pre_n[i0]
        pre_e = np.divide((c_pre_e[i1] - c_pre_e[i0]) * prompt[mine], pre_n, out=np.zeros(len(fs)),
                          where=pre_n > 0)
        out[mine] = pre_e + (c_dec[i2] - c_dec[i1])
    raw = float(out.sum())
    if raw > 0:
        out *= total / raw
    return out


ATTRIBUTE_ROWS = 1 << 16  # steps per block of _attribute_in_blocks (its temporaries: half a MB each)
# runs of at most this many steps keep their steps' energy blocks (start, prefill and decode tokens, J: 32 MB at
# most) through the attribution's passes; longer ones write each block's energy to a temporary file and read it
# back in each pass (their memory stays a block)
KEEP_ENERGY_ROWS = 1 << 20


_Blocks = Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # (first row, start, prefill, decode
# tokens, J)


def _energy_of(energy: Callable[[int, int, int], np.ndarray], steps: StepColumns) -> _Blocks:
    """The steps in blocks of ``ATTRIBUTE_ROWS`` with their energy: ``energy(k, lo, n)``, block k's, its ``n`` steps
    from row ``lo`` (a slice of a whole array; a read of what ``_run_energy`` wrote to a file)."""
    blocks = step_blocks(steps, ("start", "prefill_tokens", "decode_tokens"), ATTRIBUTE_ROWS)
    for k, (lo, block) in enumerate(blocks):
        pf = np.asarray(block["prefill_tokens"], dtype=np.float64)
        yield (lo, np.asarray(block["start"], dtype=np.float64), pf,
               np.asarray(block["decode_tokens"], dtype=np.float64), energy(k, lo, len(pf)))


def _attribute_in_blocks(recs: RequestTable, blocks: Callable[[], _Blocks], total: float) -> np.ndarray | None:
    """``attribute`` for one replica's steps in start order (a log's own), holding a block of steps at a time
    instead of a dozen whole columns (72 bytes a step, 1.4 GB at a million requests): the three running sums are
    read only where the requests look them up, each continued from the block before exactly as ``np.cumsum``
    runs (a running sum is sequential, so starting a block from the previous sum changes no digit). The steps are
    read three times, once for each request's first step, first token and finish, so that only a few values a
    request are held at once (all three lookups at once held some 270 bytes a request). None when the steps are
    not in start order (then ``attribute`` sorts them)."""
    first_sched, first_tok, finish = (recs.column(k) for k in ("first_scheduled", "first_token", "finish"))
    mine = first_sched >= 0
    every = bool(mine.all())  # then the columns are read as they are, not copied
    fs = first_sched if every else first_sched[mine]
    got = _sums_at(fs, blocks(), [(_PRE_N, None), (_PRE_E, None)])  # attribute's c_pre_n[i0], c_pre_e[i0]
    if got is None:
        return None
    pre_n, pre_e_sum = got
    ft = first_tok if every else first_tok[mine]
    fin = finish if every else finish[mine]
    ft = np.where(ft >= 0, ft, fin)  # no first token (failed or rejected while prefilling): prefill to its end
    # c_pre_n[i1] - c_pre_n[i0], c_pre_e[i1] - c_pre_e[i0], c_dec[i1]
    got = _sums_at(ft, blocks(), [(_PRE_N, pre_n), (_PRE_E, pre_e_sum), (_DEC, None)])
    assert got is not None  # the same steps, in the same order
    dec = got[2]
    del ft, got
    # the prefill sums are complete: each request's prefill energy, before the third pass (three values a request
    # held through it, and the result's array from the start, were its peak: 56 bytes a request)
    prompt = recs.column("prompt_tokens", mine).astype(np.float64)
    pre_e = np.divide(pre_e_sum * prompt, pre_n, out=np.zeros(len(prompt)), where=pre_n > 0)
    del pre_e_sum, prompt, pre_n
    got = _sums_at(fin, blocks(), [(_DEC, dec)])  # c_dec[i2] - c_dec[i1]
    assert got is not None
    out = np.zeros(len(recs))
    out[mine] = pre_e + dec
    raw = float(out.sum())
    if raw > 0:
        out *= total / raw
    return out


_DEC, _PRE_E, _PRE_N = 0, 1, 2  # attribute's running sums: of each step's energy a token, of it x prefill tokens,
# of prefill tokens


def _sums_at(x: np.ndarray, blocks: _Blocks, want: list[tuple[int, np.ndarray | None]]) -> list[np.ndarray] | None:
    """For each time x, running sums (``want``: which, _DEC, _PRE_E or _PRE_N) of the steps before
    ``np.searchsorted(start, x, side="left")``, the steps read a block at a time: a time after the first start of
    block k and at most the first of block k + 1 has the steps before block k and its place in block k before it.
    A sum wanted with an array (aligned with x) is written into it as ``sum - array``; the others into new
    arrays. None when the starts are out of order."""
    order = np.argsort(x, kind="stable")
    q = x[order]
    outs = [np.empty(len(x)) if base is None else base for _, base in want]
    carry = np.zeros(3)
    done = 0  # times placed, in sorted order

    def place(st: np.ndarray, runs: list[np.ndarray], upper: float | None) -> None:
        nonlocal done
        b = len(q) if upper is None else int(np.searchsorted(q, upper, side="right"))
        at = np.searchsorted(st, q[done:b], side="left")  # row in the block; its running sums: runs[.][at]
        rows = order[done:b]
        for (j, base), o in zip(want, outs, strict=True):
            o[rows] = runs[j][at] if base is None else runs[j][at] - base[rows]
        done = b

    prev: tuple[np.ndarray, list[np.ndarray]] | None = None
    for _lo, st, pf, dec, e in blocks:
        if not continues_ascending(st, None if prev is None else prev[0][-1]):
            return None
        if prev is not None:
            place(prev[0], prev[1], float(st[0]))
        tok = pf + dec
        pt = np.divide(e, tok, out=np.zeros_like(e), where=tok > 0)
        runs = []
        for j, v in enumerate((pt, pt * pf, pf)):  # _DEC, _PRE_E, _PRE_N
            run = np.cumsum(np.concatenate(([carry[j]], v)))  # the running sum before each row, and after the last
            runs.append(run)
            carry[j] = run[-1]
        prev = (st, runs)
    if prev is not None:
        place(prev[0], prev[1], None)
    return outs


def _cumsum0(x: np.ndarray) -> np.ndarray:
    """``np.concatenate(([0.0], np.cumsum(x)))`` without the temporary cumsum."""
    out = np.empty(len(x) + 1)
    out[0] = 0.0
    np.cumsum(x, out=out[1:])
    return out


def energy_summary(result: RunResult, total_output_tokens: int, duration: float, up: float,
                   of: RunResult | None = None) -> dict[str, Any] | None:
    """summary.json's ``energy`` section (None: not modelled, see ``run_energy``); ``up`` replica-seconds. ``of``:
    the result to keep the energy for (``run_energy``'s ``kept_as``)."""
    e = run_energy(result, up, of)
    if e is None:
        return None
    assert result.power is not None
    done = as_table(result.requests).outcome_is("completed")
    per_req = e.request_energy_j[done]
    total = e.energy_j
    return {
        "energy_j": total,
        "idle_energy_j": e.idle_energy_j,
        "mean_power_w": total / duration if duration > 0 else float("nan"),
        "peak_step_power_w": e.peak_step_power_w,
        "j_per_output_token": total / total_output_tokens if total_output_tokens else float("nan"),
        "j_per_request": {
            "mean": float(per_req.mean()) if len(per_req) else float("nan"),
            "median": float(np.median(per_req)) if len(per_req) else float("nan"),
            "p99": float(np.percentile(per_req, 99)) if len(per_req) else float("nan"),
        },
        **result.power.to_dict(),
    }
