"""A run's records gathered into a ``RunResult``: the one place both executors (the cost model's and the real
engine's) turn a serving core's requests and step log into results, so that their outputs cannot drift."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Protocol

import numpy as np

from sim.metrics.gap_pool import pooled_gaps
from sim.metrics.records import RequestRecord, RunResult
from sim.metrics.request_table import RequestSink
from sim.metrics.summary import NO_CLASS
from sim.serving.core import ServingCore
from sim.serving.pipeline import PipelineCostModel
from sim.serving.request import Outcome, Request


class HasPeakFlops(Protocol):
    @property
    def peak_flops(self) -> float:
        """FLOP/s the model-FLOPs utilisation is measured against (0: not reported)."""
        ...


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector. A run allocates millions of small objects and creates almost no
    reference cycles; the collector's full passes over them would cost a quarter of the run time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def seeded_global_rngs(seed: int) -> Iterator[None]:
    """Python's and numpy's global generators seeded from the scenario's seed for a run, and put back after: a
    user's router drawing with random.sample (power of two choices written the obvious way) read TTFT mean 70.2 ms,
    then 62.8 ms, from the same command twice, and identical variants differed. servesim itself never draws from
    them (one seeded numpy Generator per run)."""
    py, nps = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(nps)


def class_itl_gaps(requests: Sequence[Request]) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """Each request class's pooled inter-token gaps, over its completed requests, from their token times: the
    core pools every request's gaps together, so only kept token times (``keep_token_times``) give a class's ITL
    percentiles. None when no request kept its token times or none carries a class."""
    spec_fields = ((r.spec.priority, r.spec.tenant, r.spec.slo_class, r.spec.ttft_slo, r.spec.tpot_slo)
                   for r in requests)
    if not any(r.token_times is not None for r in requests) or not any(
            p or t or c or a is not None or b is not None for p, t, c, a, b in spec_fields):
        return None
    per_class: dict[str, list[np.ndarray]] = {}
    for r in sorted(requests, key=attrgetter("id")):
        if r.outcome == Outcome.COMPLETED and r.token_times is not None:
            per_class.setdefault(r.spec.slo_class or NO_CLASS, []).append(np.diff(r.token_times))
    return {name: pooled_gaps(np.concatenate(g), np.ones(sum(len(x) for x in g), dtype=np.int64))
            for name, g in per_class.items()}


def result_of(
    name: str,
    requests: Sequence[Request] | RequestSink,
    core: ServingCore,
    cost: HasPeakFlops,
    *,
    config: dict | None = None,
    weight_bytes: float = 0.0,
    kv_bytes_per_block: float = 0.0,
    pool_gaps: bool = True,
) -> RunResult:
    """Gather one replica's records into a ``RunResult``. ``cost``: its cost model or executor (only its
    ``peak_flops`` is read). ``requests``: the run's requests, or the sink they went to as they finished (a
    long run's: the result then holds a ``RequestTable``). ``pool_gaps=False``: the inter-token gaps as recorded,
    not pooled (a cluster pools its replicas' together once)."""
    records: Sequence[RequestRecord]
    if isinstance(requests, RequestSink):  # a long run's: its requests left memory as they finished
        records = table = requests.table()
        start, end = table.least("arrival"), table.most("finish")
        class_itl = None  # no token times kept (sim.loop.run streams only then)
    else:
        with gc_paused():  # 10^5 new records, on a heap of millions of objects
            records = [RequestRecord.from_request(r) for r in sorted(requests, key=attrgetter("id"))]
        start = min((r.arrival for r in records), default=0.0)
        end = max((r.finish for r in records), default=0.0)
        class_itl = class_itl_gaps(requests)
    uniq, counts = core.itl_gaps(pooled=pool_gaps)
    steps = core.steps.columns()
    host = getattr(core.kv, "host", None)  # the prefix cache's host tier, if the KV manager has one
    return RunResult(
        name=name,
        requests=records,
        steps=steps,
        itl_gaps=uniq,
        itl_counts=counts,
        duration=max(end - start, 0.0),
        peak_flops=float(cost.peak_flops),
        kv_capacity_blocks=core.kv.num_blocks,
        block_size=core.kv.block_size,
        weight_bytes=weight_bytes,
        kv_bytes_per_block=kv_bytes_per_block,
        config=config,
        host_kv=None if host is None else host.summary(core.kv.block_size),
        pipeline=cost.summary(steps) if isinstance(cost, PipelineCostModel) else None,
        class_itl=class_itl,
        token_budget=core.limits.max_num_batched_tokens,
        policy_seconds=getattr(core.policy, "seconds", 0.0),
        policy_asks=getattr(core.policy, "asks", 0),
    )


SLOW_POLICY_SHARE = 0.25  # the policy's own time, as a share of the steps' time, past which a run says so
SLOW_POLICY_ASK_S = 1e-3  # ... when an ask takes this long too: a CPU engine's 1.5 ms steps dwarf no Python policy


def slow_policy_note(result: RunResult) -> str | None:
    """The line saying that the policy's own schedule calls took a large share of the time its steps took, or None.
    Neither the simulator nor the engine puts that time on its clock (the engine's is the step's), while a real
    server's scheduler runs between its steps: a policy taking 20 ms per ask looked as fast as FCFS on both."""
    busy = float(np.sum(result.steps["duration"]))
    s, asks = result.policy_seconds, result.policy_asks
    if not asks or busy <= 0 or s < SLOW_POLICY_ASK_S * asks or not s > SLOW_POLICY_SHARE * busy:
        return None
    return (f"{result.name}: the policy's own schedule calls took {s:.2f} s over {asks:,} asks "
            f"({s / asks * 1e3:.1f} ms each), {s / busy:.0%} of the {busy:.2f} s its steps took; no clock here counts "
            "that time (the simulator's and the engine's are the steps'), while a real server's scheduler runs "
            "between its steps: make schedule cheaper, or declare depends_on so that it is asked less")
