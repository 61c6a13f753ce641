"""A cluster: many replicas behind a router, optionally grown and shrunk by an autoscaler.

Each replica is its own serving core (policy, KV memory) and cost model, built from the variant exactly as a
single-replica run builds its one; a router (``sim.policies.routers``) sends each arriving request to one of the
replicas that take traffic; the autoscaler (``sim.loop.autoscaler``) provisions and drains whole replicas. The
result is one ``RunResult`` over every request and step of the fleet, plus ``RunResult.cluster``: the
replica count over time, GPU-hours and cost, and a line per replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np

from sim.costs.costmodel import CostModel
from sim.loop.autoscaler import AutoscalerConfig, ReplicaLife, ScalingLog
from sim.loop.cluster_fast import KEYS, BoundedRouter, Calendar, ParkingReplica, TimelineRouter, replica_figures
from sim.loop.executor import CostExecutor, Executor, as_executor
from sim.loop.results import HasPeakFlops, class_itl_gaps, gc_paused, pooled_gaps, result_of
from sim.loop.simulator import ClosedLoopPlan, Replica, Simulation
from sim.metrics.records import RunResult
from sim.policies.routers import kv_pressure, make_router, outstanding
from sim.serving.core import ServingCore
from sim.serving.host_kv_tier import merge_summaries
from sim.serving.pipeline import PipelineCostModel
from sim.serving.request import Request

# routers that read only the running, waiting and swapped sets and the used blocks (prefix_affinity reads the
# prefix cache, which a finish changes)
OVERSHOOT_ROUTERS = ("round_robin", "least_outstanding", "least_kv")
LOOKAHEAD = 32  # decode steps priced past the next arrival (see DecodeGroup.lookahead)
SCAN_MAX = 32  # replicas up to which a parking fleet's router scans them all (past it: BoundedRouter)


class ClusterSimulation(Simulation):
    """``Simulation`` with a router over the serving replicas and an optional autoscaler."""

    def __init__(
        self,
        specs,
        make_replica: Callable[[], tuple[ServingCore, Executor | CostModel]],
        *,
        replicas: int,
        router: Any = "round_robin",  # a built-in router's name, or a RouterConfig (sim.policies.configs)
        autoscaler: AutoscalerConfig | None = None,
        closed_loop: ClosedLoopPlan | None = None,
        progress: Callable[[int, float], None] | None = None,
        fast_forward: bool = True,
        failures=None,
        leak: bool = False,
    ) -> None:
        if autoscaler is not None and not autoscaler.min_replicas <= replicas <= autoscaler.max_replicas:
            raise ValueError(f"cluster: {replicas} replicas at the start, outside the autoscaler's "
                             f"[{autoscaler.min_replicas}, {autoscaler.max_replicas}]")
        self.make_replica = make_replica
        # a user's router is recorded by its class's name, a built-in one on the public API by its type (the
        # config is in the run's recorded cluster section)
        self.router_name = router if isinstance(router, str) else \
            f"custom {router.cls}" if router.type == "custom" else router.type
        self.autoscaler = autoscaler
        self._next_tick = float("inf")
        self._arrivals_done = False
        self._indexed: BoundedRouter | None = None
        pairs = [make_replica() for _ in range(replicas)]
        # Replicas that park through steady decode stretches (sim.loop.cluster_fast.ParkingReplica): open loop, no
        # autoscaler or failures, steps priced by a cost model, a router that reads no prefix cache.
        self._parking = (autoscaler is None and failures is None and closed_loop is None and fast_forward
                         and router in OVERSHOOT_ROUTERS
                         and all(isinstance(as_executor(c), CostExecutor) for _, c in pairs))
        calendar = Calendar() if self._parking else None
        if self._parking:
            self.replica_class = ParkingReplica
        super().__init__(specs, pairs, closed_loop=closed_loop,
                         router=make_router(router), progress=progress, fast_forward=fast_forward,
                         failures=failures, leak=leak,
                         # a Calendar stands in for the part of simpy.Environment that a parking fleet uses
                         env=cast(Any, calendar))
        self.serving: list[Replica] = list(self.replicas)
        self.log = ScalingLog(lives=[ReplicaLife(i, 0.0, 0.0) for i in range(replicas)])
        self._awaiting_first: list[Request] = []  # for the ttft signal: dispatched, no first token yet
        self._busy_seen = [0.0] * replicas  # each replica's busy_time and flops_done at the last tick
        self._flops_seen = [0.0] * replicas
        if autoscaler is not None:
            self._next_tick = autoscaler.interval
            self.env.process(self._autoscale())
        elif router in OVERSHOOT_ROUTERS and failures is None:
            # The router reads a replica at an arrival as it stands in the middle of its step: the step's blocks
            # taken, its finishes not yet done. A decode step without finishes is therefore taken whole before the
            # arrival, as a lone replica does (no autoscaler tick may fall in it: it reads busy time and FLOPs).
            for rep in self.replicas:
                rep.overshoot = True
                rep.overshoot_finish = False
                if rep.core.group is not None:
                    # a replica is read at every arrival: a few steps per call, the rest priced ahead and kept
                    rep.core.group.lookahead = LOOKAHEAD
        if calendar is not None:
            for rep in self.replicas:
                # without autoscaler ticks, failures or closed loops, the next event from outside is the next
                # arrival: read it directly (this is asked at every step the replicas take)
                rep.horizon = self._arrival_horizon
                # and no replica drains: a finish needs no check of the replica's life (_on_finish)
                rep.core.on_finish = super()._on_finish
        if calendar is not None and router in KEYS:
            # a parked replica's state is read from its timeline: a scan of the fleet, or past SCAN_MAX replicas
            # a heap of lower bounds that reads only the replicas that could be the least loaded
            if len(self.replicas) <= SCAN_MAX:
                self.router = TimelineRouter(router, calendar)
            else:
                self.router = self._indexed = BoundedRouter(router, calendar, self.replicas)
                for rep in self.replicas:
                    assert isinstance(rep, ParkingReplica)
                    rep.on_yield = self._indexed.update

    # ---- hooks of Simulation -------------------------------------------------------------------------------
    _single_replica = False

    def _routable(self) -> list[Replica]:
        return self.serving

    def _arrival_horizon(self) -> float:
        return self._next_arrival

    def _horizon(self) -> float:
        # an autoscaler tick reads every replica's state: no replica may run past it
        return min(super()._horizon(), self._next_tick)

    def _dispatch(self, spec) -> None:
        super()._dispatch(spec)
        if self._indexed is not None and self.halted is None:
            self._indexed.update(self.replicas[self.requests[-1].replica])  # its queue grew
        if self.autoscaler is not None and self.autoscaler.signal == "ttft":
            self._awaiting_first.append(self.requests[-1])

    def _close(self) -> None:
        self._arrivals_done = True
        super()._close()

    def _on_finish(self, req: Request) -> None:
        super()._on_finish(req)
        life = self.log.lives[req.replica]
        if life.draining < float("inf") and not self.replicas[req.replica].core.has_work:
            life.released = req.finish

    # ---- the autoscaler ------------------------------------------------------------------------------------
    def _signal(self, now: float, interval: float) -> float:
        cfg = self.autoscaler
        assert cfg is not None, "the signal is read only by the autoscaler's own process"
        reps = self.serving
        if cfg.signal == "busy":
            vals = [min(1.0, (rep.core.busy_time - self._busy_seen[rep.index]) / interval) for rep in reps]
            return float(np.mean(vals)) if vals else 0.0
        if cfg.signal == "compute":
            vals = [(rep.core.flops_done - self._flops_seen[rep.index]) / (interval * rep.cost.peak_flops)
                    for rep in reps]
            return float(np.mean(vals)) if vals else 0.0
        if cfg.signal == "kv_usage":
            return float(np.mean([kv_pressure(rep.core) for rep in reps])) if reps else 0.0
        if cfg.signal == "queue":
            return float(np.mean([len(rep.core.waiting) for rep in reps])) if reps else 0.0
        # ttft: mean over the requests that got their first token in the last interval; with none, the age of
        # the oldest one still waiting (a stalled fleet must not read as an idle one)
        recent, still = [], []
        for r in self._awaiting_first:
            if r.first_token >= 0:
                if r.first_token > now - interval:
                    recent.append(r.first_token - r.arrival)
            elif r.outcome is None:
                still.append(r)
        self._awaiting_first = still
        if recent:
            return float(np.mean(recent))
        return max((now - r.arrival for r in still), default=0.0)

    def _autoscale(self):
        cfg = self.autoscaler
        env = self.env
        last_action = -float("inf")
        while True:
            yield env.timeout(cfg.interval)
            now = env.now
            self._next_tick = now + cfg.interval
            if self._arrivals_done and not any(rep.core.has_work for rep in self.replicas):
                self._next_tick = float("inf")
                return
            signal = self._signal(now, cfg.interval)
            for rep in self.replicas:
                self._busy_seen[rep.index] = rep.core.busy_time
                self._flops_seen[rep.index] = rep.core.flops_done
            paid = [life for life in self.log.lives if life.released == float("inf")]
            active = [life for life in paid if life.draining == float("inf")]
            if now - last_action >= cfg.cooldown:
                if signal > cfg.scale_up and len(active) < cfg.max_replicas and not self._arrivals_done:
                    self._provision(now, cfg.provisioning_delay)
                    last_action = now
                elif signal < cfg.scale_down and len(self.serving) > cfg.min_replicas:
                    self._drain(now)
                    last_action = now
            log = self.log
            log.times.append(now)
            log.signal.append(signal)
            log.serving.append(len(self.serving))
            log.total.append(sum(1 for life in log.lives if life.released == float("inf")))

    def _provision(self, now: float, delay: float) -> None:
        rep = self._add_replica(*self.make_replica())
        index = rep.index
        rep.closed = self._arrivals_done
        self._busy_seen.append(0.0)
        self._flops_seen.append(0.0)
        self.log.lives.append(ReplicaLife(index, now, now + delay))
        self.log.actions.append((now, "up", index))
        self.env.process(self._ready_after(rep, delay))

    def _ready_after(self, rep: Replica, delay: float):
        if delay > 0:
            yield self.env.timeout(delay)
        self.serving.append(rep)

    def _drain(self, now: float) -> None:
        # the least loaded, newest first among equals: it empties soonest
        rep = min(self.serving, key=lambda r: (outstanding(r.core), -r.index))
        self.serving.remove(rep)
        life = self.log.lives[rep.index]
        life.draining = now
        if not rep.core.has_work:
            life.released = now
        self.log.actions.append((now, "down", rep.index))


class MergedSteps(Mapping[str, np.ndarray]):
    """The fleet's step log: the replicas' step columns as one log, in the order of the steps' starts (stable:
    replica by replica among equal starts), each column merged when it is first read, then kept. Merged up
    front, all 19 columns were new memory as the run ended (2.1 M steps at 256 replicas, 100,000 requests: 16 MB
    a column), while a summary reads 13 and a sweep keeps only summaries; until a column is read the replicas'
    logs stay compact (``StepColumns``)."""

    __slots__ = ("_parts", "_order", "_merged")

    def __init__(self, parts: Sequence[Mapping[str, np.ndarray]]) -> None:
        self._parts = list(parts)
        self._order: np.ndarray | None = None
        self._merged: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._parts[0])

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts[0])

    def __contains__(self, key: object) -> bool:
        return key in self._parts[0]

    def __getitem__(self, key: str) -> np.ndarray:
        col = self._merged.get(key)
        if col is None:
            if key not in self._parts[0]:
                raise KeyError(key)
            if self._order is None:
                self._order = np.argsort(np.concatenate([p["start"] for p in self._parts]), kind="stable")
            col = self._merged[key] = np.take(np.concatenate([p[key] for p in self._parts]), self._order)
        return col


def cluster_result(
    name: str,
    sim: ClusterSimulation,
    costs: Sequence[HasPeakFlops],
    *,
    price_per_hour: float,
    config: dict | None = None,
    weight_bytes: float = 0.0,
    kv_bytes_per_block: float = 0.0,
    slos=None,
) -> RunResult:
    """One RunResult over the whole fleet (every request, every replica's steps), with ``cluster`` filled in.
    ``price_per_hour``: one replica's price (the GPU's times the tensor-parallel size)."""
    parts = []
    by_replica: dict[int, list[Request]] = {}
    for r in sim.requests:
        by_replica.setdefault(r.replica, []).append(r)
    # one pause over every replica's records: a pause per replica (result_of's) ended in a collection each,
    # 256 of them 0.2 s of a 256-replica run
    with gc_paused():
        for rep, cost in zip(sim.replicas, costs, strict=True):
            # each replica's gaps as recorded: pooling is exact, so pooling them all once below gives what
            # pooling each replica's first did, without a sort per replica
            parts.append(result_of(f"{name}/replica-{rep.index}", by_replica.get(rep.index, []), rep.core, cost,
                                   config=config, weight_bytes=weight_bytes, kv_bytes_per_block=kv_bytes_per_block,
                                   pool_gaps=False))
        records = sorted((rec for p in parts for rec in p.requests), key=lambda rec: rec.id)
    steps = MergedSteps([p.steps for p in parts])
    uniq, counts = pooled_gaps(np.concatenate([p.itl_gaps for p in parts]),
                               np.concatenate([p.itl_counts for p in parts]))
    start = min((r.arrival for r in records), default=0.0)
    end = max((r.finish for r in records), default=0.0)
    log = sim.log
    # over the run's window, first arrival to last finish, as its duration and a disaggregated run's replica time:
    # counted from t=0 it made a fixed 4-replica cluster's mean 4.02 replicas, above its maximum of 4
    replica_seconds = log.replica_seconds(end, start)
    per_replica = []
    for p, life in zip(parts, log.lives, strict=True):
        figures = replica_figures(p) if p.requests else None
        per_replica.append({
            "replica": life.index, "provisioned": life.provisioned, "ready": life.ready,
            "draining": None if life.draining == float("inf") else life.draining,
            "released": None if life.released == float("inf") else life.released,
            "requests": len(p.requests),
            "output_throughput": None if figures is None else figures[0],
            "kv_usage_mean": None if figures is None else figures[1],
            "busy_seconds": float(np.sum(p.steps["duration"])),
        })
    # the replica count as a step function: +1 at each provisioning, -1 at each release
    events = sorted([(life.provisioned, 1) for life in log.lives]
                    + [(life.released, -1) for life in log.lives if life.released < float("inf")])
    t_paid, n_paid, n = [0.0], [0], 0
    for t, d in events:
        n += d
        t_paid.append(t)
        n_paid.append(n)
    cluster: dict[str, Any] = {
        "router": getattr(sim, "router_name", None),
        "replicas_start": sum(1 for life in log.lives if life.provisioned == 0.0),
        "replicas_max": max(n_paid),
        "replica_seconds": replica_seconds,
        # a sum of per-replica windows over the run's window, rounded: capped at the maximum it cannot exceed (three
        # replicas serving the whole run read 3.0000000000000004, above replicas_max 3)
        "replicas_mean": min(replica_seconds / (end - start), max(n_paid)) if end > start
        else float(len(sim.replicas)),
        "gpu_hours": replica_seconds / 3600.0,
        "cost_usd": replica_seconds / 3600.0 * price_per_hour,
        "price_per_replica_hour": price_per_hour,
        "replicas_over_time": {"t": t_paid, "n": n_paid},
        "autoscaler": None if sim.autoscaler is None else {
            "signal": sim.autoscaler.signal, "times": log.times, "values": log.signal, "serving": log.serving,
            "actions": [list(a) for a in log.actions]},
        "per_replica": per_replica,
    }
    first = parts[0]
    return RunResult(
        name=name, requests=records, steps=steps, itl_gaps=uniq, itl_counts=counts,
        duration=max(end - start, 0.0), peak_flops=first.peak_flops, kv_capacity_blocks=first.kv_capacity_blocks,
        block_size=first.block_size, weight_bytes=weight_bytes, kv_bytes_per_block=kv_bytes_per_block,
        config=config, cluster=cluster, class_itl=class_itl_gaps(sim.requests),
        host_kv=merge_summaries([p.host_kv for p in parts if p.host_kv]),
        pipeline=costs[0].summary(steps) if isinstance(costs[0], PipelineCostModel) else None,
        token_budget=first.token_budget,
        policy_seconds=sum(p.policy_seconds for p in parts), policy_asks=sum(p.policy_asks for p in parts),
    )

