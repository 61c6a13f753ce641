"""Disaggregated serving in the simulator: a prefill pool and a decode pool, the KV moved between them.

A request's life, as vLLM's disaggregated prefill with the NIXL connector serves it (its proxy sends the request
to a prefill instance with ``max_tokens=1``, discards that answer, and streams the client's answer from a decode
instance that reads the prefill's KV blocks):

1. it arrives and a router of the prefill pool sends it to a prefill replica, which queues, schedules and
   computes its prompt like any request of one token of output (the prefill's own sampled token is dropped);
2. when that step ends, its prompt's KV (``sim.loop.disagg.kv_transfer``) leaves over the prefill replica's link,
   queued behind the transfers before it; the prefill replica frees its blocks at once (its copy is in flight:
   the simulator does not hold the sender's blocks until the read completes);
3. when the copy ends, a router of the decode pool sends it to a decode replica, where it waits until its
   policy admits it (bounded by the replica's free KV blocks and ``max_num_seqs``, like any waiting request)
   holding ``prompt_len - 1`` computed tokens: its first decode step computes the last prompt token over the
   received context and samples the first output token (vLLM's decode side recomputes that one token, the
   scheduler needing at least one token to compute: ``_update_waiting_for_remote_kv`` takes one off a full
   prompt), then it decodes to the end.

One difference from vLLM's order, kept on purpose: vLLM's decode scheduler first allocates the request's blocks,
then the connector pulls the KV into them (the request waits in ``WAITING_FOR_REMOTE_KVS``) while the prefill
instance holds its copy until the pull ends. Here the copy leaves as soon as the prefill ends and lands in the
link's buffer, and the decode admission comes after it; so a full decode pool delays the decode step, not the
copy, and the prefill replica's blocks are free for the next prompts at once. Both count the same parts in TTFT.

TTFT therefore counts what the client sees: prefill queue + prefill + transfer (queue and copy) + decode queue +
its first decode step. ``disaggregation.prefill_ttft`` gives DistServe's measure beside it (arrival to the end of
the prefill step: the first token as the prefill instance sampled it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from sim.config.scenario import VariantConfig
from sim.config.scenario_messages import format_validation
from sim.config.schema import Deployment, PolicyConfig, ScenarioError
from sim.costs.costmodel import CostModel
from sim.costs.energy import power_model_of
from sim.costs.pooled_power import WINDOW_KEYS, PooledPower, PoolPower
from sim.loop.build import Built, build
from sim.loop.disagg.config import DisaggConfig, PoolConfig
from sim.loop.disagg.kv_transfer import KVLink, kv_bytes
from sim.loop.executor import CostExecutor, Executor
from sim.loop.results import class_itl_gaps, gc_paused, pooled_gaps
from sim.loop.simulator import ClosedLoopPlan, Replica, Simulation
from sim.metrics.records import RequestRecord, RunResult
from sim.metrics.summary import latency_stats
from sim.metrics.sums import dot
from sim.metrics.verdict import token_cap
from sim.policies.routers import make_router
from sim.serving.core import ServingCore
from sim.serving.request import Outcome, Request, RequestSpec, Status
from sim.words import counted

POOLS = ("prefill", "decode")


def pool_variant(cfg: VariantConfig, role: str) -> VariantConfig:
    """The variant one replica of a pool runs: the variant's deployment with the pool's keys merged in, the
    pool's policy (or the variant's), no cluster and no disaggregation of its own."""
    d = cfg.disaggregation
    assert isinstance(d, DisaggConfig)
    pool: PoolConfig = getattr(d, role)
    dep = cfg.deployment.model_dump()
    dep.update(pool.deployment or {})
    where = f"variant {cfg.name!r}: disaggregation.{role}"
    try:
        deployment = Deployment.model_validate(dep)
    except ValidationError as e:
        raise ScenarioError(format_validation(e, f"{where}.deployment", model=Deployment)) from None
    policy = cfg.policy
    if pool.policy is not None:
        policy = TypeAdapter(PolicyConfig).validate_python(pool.policy)  # checked at load: cannot fail here
    return dataclasses.replace(cfg, name=f"{cfg.name}/{role}", deployment=deployment, policy=policy, cluster=None,
                               disaggregation=None)


def check_disaggregation(cfg: VariantConfig, workload: Any = None) -> dict[str, tuple[VariantConfig, Built]]:
    """Resolve both pools (a ScenarioError naming the field where one cannot run): {role: (variant, built)}.
    ``workload``: the variant's workload section, checked for what the pools do not model."""
    if workload is not None and getattr(workload, "failures", None) is not None:
        raise ScenarioError(f"variant {cfg.name!r}: disaggregation does not model workload.failures")
    if cfg.cluster is not None:
        raise ScenarioError(f"variant {cfg.name!r}: disaggregation and cluster exclude each other (each pool has "
                            "its own replicas and router)")
    if getattr(cfg.kv_cache, "enable_prefix_caching", False) or getattr(cfg.kv_cache, "type", "paged") != "paged":
        raise ScenarioError(f"variant {cfg.name!r}: disaggregation runs on paged KV without prefix caching")
    out = {}
    for role in POOLS:
        pcfg = pool_variant(cfg, role)
        # what the pools do not model yet is refused, not run as something else: the decode loop here does not
        # draft, and a pipelined pool's KV lives on several GPUs whose transfers are not priced
        if pcfg.deployment.speculative is not None:
            raise ScenarioError(f"disaggregation.{role}: deployment.speculative is not modelled with disaggregation")
        if pcfg.deployment.pipeline_parallel_size > 1:
            raise ScenarioError(f"disaggregation.{role}: deployment.pipeline_parallel_size > 1 is not modelled with "
                                "disaggregation")
        try:
            _, _, _, built = build(pcfg)
        except ScenarioError as e:
            raise ScenarioError(f"disaggregation.{role}: {e}") from None
        out[role] = (pcfg, built)
    (_, p), (_, dd) = out["prefill"], out["decode"]
    if p.model.name != dd.model.name or p.budget.kv_dtype != dd.budget.kv_dtype:
        raise ScenarioError(f"variant {cfg.name!r}: disaggregation: the decode pool reads the prefill pool's KV "
                            f"as it is: both must serve the same model in the same kv_dtype (prefill "
                            f"{p.model.name} {p.budget.kv_dtype}, decode {dd.model.name} {dd.budget.kv_dtype})")
    return out


@dataclasses.dataclass(slots=True)
class Transfer:
    """One request's trip between the pools."""

    prefill_end: float  # its prefill step ended (the KV is ready)
    start: float  # its copy left the link queue
    end: float  # its copy ended (it reaches the decode pool)
    nbytes: float
    prefill_replica: int


class DisaggSimulation(Simulation):
    """``Simulation`` over both pools' replicas (the prefill pool's first, indices 0..x-1; then the decode
    pool's, x..x+y-1), with the routing and the KV transfers between them. Every step runs on the clock (no
    replica takes steps ahead: a prefill ending anywhere sends a request to the decode pool)."""

    _single_replica = False

    def __init__(
        self,
        specs: Sequence[RequestSpec],
        prefill: Sequence[tuple[ServingCore, Executor | CostModel]],
        decode: Sequence[tuple[ServingCore, Executor | CostModel]],
        *,
        links: Sequence[KVLink],
        kv_bytes_per_token: float,
        prefill_router: str = "least_outstanding",
        decode_router: str = "least_outstanding",
        closed_loop: ClosedLoopPlan | None = None,
        progress: Callable[[int, float], None] | None = None,
        env=None,
        kv_mover: Callable[[Request], float] | None = None,
    ) -> None:
        """``kv_mover``: called with each request whose prefill ended (at that instant, before any other step
        runs) to move its KV for real; it returns the copy's measured seconds, which replace the link's model
        (realengine/disagg.py; a replay passes the measured seconds back)."""
        if len(links) != len(prefill):
            raise ValueError("one KV link per prefill replica")
        self.num_prefill = len(prefill)
        self.links = list(links)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.decode_router = make_router(decode_router)
        self.proxies: dict[int, Request] = {}  # id -> the request as the prefill pool serves it
        self.decoding: dict[int, Request] = {}  # id -> the request as the decode pool serves it
        self.transfers: dict[int, Transfer] = {}
        self.kv_mover = kv_mover
        self._arrivals_done = False
        self._in_flight = 0  # transfers under way
        super().__init__(specs, [*prefill, *decode], closed_loop=closed_loop, router=make_router(prefill_router),
                         progress=progress, fast_forward=False, env=env)

    @property
    def prefill_replicas(self) -> list[Replica]:
        return self.replicas[: self.num_prefill]

    @property
    def decode_replicas(self) -> list[Replica]:
        return self.replicas[self.num_prefill :]

    def _routable(self) -> list[Replica]:
        return self.prefill_replicas

    def _close(self) -> None:
        # the decode pool keeps taking requests until the last prefill has ended and its KV has arrived
        self._arrivals_done = True
        for rep in self.prefill_replicas:
            rep.closed = True
            rep.poke()
        self._maybe_close_decode()

    def _maybe_close_decode(self) -> None:
        if not self._arrivals_done or self._in_flight:
            return
        if any(r.outcome is None for r in self.proxies.values()):
            return
        for rep in self.decode_replicas:
            rep.closed = True
            rep.poke()

    def _dispatch(self, spec: RequestSpec) -> None:
        if self.halted is not None:
            return
        # the prefill instance is asked for one token (the proxy's max_tokens=1)
        req = Request(spec=dataclasses.replace(spec, output_len=1), arrival=self.env.now)
        self.requests.append(req)
        self.proxies[spec.id] = req
        serving = self._routable()
        serving[self.router(req, serving)].submit(req)

    def _on_finish(self, req: Request) -> None:
        if self.proxies.get(req.id) is req:
            if req.outcome is Outcome.COMPLETED:
                self._send_kv(req)
                return
            super()._on_finish(req)  # refused by the prefill pool: the request ends here
            self._maybe_close_decode()
            return
        super()._on_finish(req)

    def _send_kv(self, proxy: Request) -> None:
        link = self.links[proxy.replica]
        nbytes = kv_bytes(proxy.prompt_len, self.kv_bytes_per_token)
        start, end = link.send(proxy.finish, nbytes, None if self.kv_mover is None else self.kv_mover(proxy))
        self.transfers[proxy.id] = Transfer(proxy.finish, start, end, nbytes, proxy.replica)
        self._in_flight += 1
        self.env.process(self._arrive_at_decode(proxy, end))

    def _arrive_at_decode(self, proxy: Request, at: float):
        if at > self.env.now:
            yield self.env.timeout(at - self.env.now)
        if self.halted is not None:
            return
        spec = self.specs_by_id[proxy.id]
        # it holds the prompt's KV but the last token: the decode side computes that one and samples from it
        dec = Request(spec=spec, arrival=self.env.now)
        dec.num_computed_tokens = spec.prompt_len - 1
        self.decoding[spec.id] = dec
        pool = self.decode_replicas
        pool[self.decode_router(dec, pool)].submit(dec)
        self._in_flight -= 1
        self._maybe_close_decode()

    @property
    def specs_by_id(self) -> dict[int, RequestSpec]:
        m = getattr(self, "_specs_by_id", None)
        if m is None:
            m = self._specs_by_id = {s.id: s for s in self.specs}
        return m

    def run(self) -> None:
        super().run()
        stuck = [i for i, r in self.decoding.items() if r.outcome is None]
        if stuck and self.halted is None:
            raise RuntimeError(f"simulation stalled: {counted(len(stuck), 'request')} never finished decoding")

    def merged(self) -> list[Request]:
        """One request per spec as the client saw it: arrival and first scheduling from the prefill pool, the
        tokens and the end from the decode pool (or the prefill pool's outcome where it refused the request)."""
        out = []
        for rid, p in self.proxies.items():
            d = self.decoding.get(rid)
            m = Request(spec=self.specs_by_id[rid], arrival=p.arrival)
            m.first_scheduled = p.first_scheduled
            m.status = Status.FINISHED
            if d is None:
                m.finish, m.outcome, m.reason, m.replica = p.finish, p.outcome, p.reason, p.replica
                m.num_preemptions = p.num_preemptions
                m.preempted_at, m.resumed_at = p.preempted_at, p.resumed_at
            else:
                m.first_token, m.last_token, m.finish = d.first_token, d.last_token, d.finish
                m.num_output_tokens = d.num_output_tokens
                m.outcome, m.reason, m.replica = d.outcome, d.reason, d.replica
                m.num_preemptions = p.num_preemptions + d.num_preemptions
                if p.preempted_at or d.preempted_at:
                    m.preempted_at = [*(p.preempted_at or []), *(d.preempted_at or [])]
                    m.resumed_at = [*(p.resumed_at or []), *(d.resumed_at or [])]
                m.token_times = d.token_times
            out.append(m)
        return out


def simulate_disaggregated(
    cfg: VariantConfig,
    workload,
    *,
    name: str | None = None,
    keep_token_times: bool = False,
    fast_path: bool = True,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[RunResult, list[Request], ServingCore]:
    """Simulate a disaggregated variant (``sim.loop.run.simulate_variant`` calls this for one)."""
    d = cfg.disaggregation
    assert isinstance(d, DisaggConfig)
    if workload.failures is not None:
        raise ScenarioError(f"variant {cfg.name!r}: disaggregation does not model workload failures")
    pools = check_disaggregation(cfg)
    cores: dict[str, list[tuple[ServingCore, CostModel]]] = {}
    for role in POOLS:
        pcfg, _ = pools[role]
        n = getattr(d, role).replicas
        cores[role] = []
        for _ in range(n):
            policy, kv, cost, _ = build(pcfg)
            cores[role].append((ServingCore(policy, kv, fast_path=fast_path, keep_token_times=keep_token_times),
                                cost))
    pb = pools["prefill"][1]
    ptp = pools["prefill"][0].deployment.tensor_parallel_size
    links = [KVLink(d.kv_link.bandwidth, d.kv_link.latency, ptp) for _ in cores["prefill"]]
    closed = workload.closed_loop
    plan = None if closed is None else ClosedLoopPlan(closed.num_users, closed.think_times)
    sim = DisaggSimulation(workload.requests, cores["prefill"], cores["decode"], links=links,
                           kv_bytes_per_token=float(pb.budget.bytes_per_token * ptp),
                           prefill_router=d.prefill.router, decode_router=d.decode.router, closed_loop=plan,
                           progress=progress)
    sim.run()
    # recorded with the decode pool's policy as its engine resolved it: the slots that bound the run's concurrency
    result = disagg_result(name or cfg.name, sim, pools, d, config=cfg.to_dict(pools["decode"][1].policy))
    return result, sim.merged(), sim.replicas[0].core


def disagg_result(name: str, sim: DisaggSimulation, pools: dict[str, tuple[VariantConfig, Built]],
                  d: DisaggConfig, *, config: dict | None = None) -> RunResult:
    """One RunResult over both pools: every request as the client saw it, every replica's steps, the fleet's
    cost (``cluster``) and the transfers and pools (``disaggregation``)."""
    merged = sim.merged()
    with gc_paused():
        records = [RequestRecord.from_request(r) for r in sorted(merged, key=lambda r: r.id)]
    cols = [rep.core.steps.columns() for rep in sim.replicas]
    steps = {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
    order = np.argsort(steps["start"], kind="stable")
    steps = {k: v[order] for k, v in steps.items()}
    gaps = [rep.core.itl_gaps() for rep in sim.replicas]
    uniq, counts = pooled_gaps(np.concatenate([g for g, _ in gaps]), np.concatenate([c for _, c in gaps]))
    start = min((r.arrival for r in records), default=0.0)
    end = max((r.finish for r in records), default=0.0)
    duration = max(end - start, 0.0)
    role_of = ["prefill"] * sim.num_prefill + ["decode"] * (len(sim.replicas) - sim.num_prefill)
    tps = {role: pools[role][0].deployment.tensor_parallel_size for role in POOLS}
    prices = {role: pools[role][1].gpu.price_per_hour * tps[role] for role in POOLS}
    n_rep = len(sim.replicas)
    replica_seconds = duration * n_rep
    cost_usd = sum(duration / 3600.0 * prices[role] for role in role_of)
    per_replica = []
    for rep, role in zip(sim.replicas, role_of, strict=True):
        busy = float(rep.core.busy_time)
        per_replica.append({"replica": rep.index, "pool": role, "provisioned": 0.0, "ready": 0.0, "draining": None,
                            "released": None, "requests": sum(1 for r in rep.core.done),
                            "output_throughput": None, "kv_usage_mean": None, "busy_seconds": busy})
    cluster: dict[str, Any] = {
        "router": f"{d.prefill.router} / {d.decode.router}",
        "replicas_start": n_rep, "replicas_max": n_rep, "replica_seconds": replica_seconds,
        "replicas_mean": float(n_rep),
        # real GPU-hours: a pool's replica is tensor_parallel_size GPUs
        "gpu_hours": sum(duration / 3600.0 * tps[role] for role in role_of),
        "cost_usd": cost_usd,
        "price_per_replica_hour": cost_usd / (replica_seconds / 3600.0) if replica_seconds > 0 else 0.0,
        "replicas_over_time": {"t": [0.0], "n": [n_rep]},
        "autoscaler": None,
        "per_replica": per_replica,
    }
    ids = sorted(sim.transfers)
    tr = [sim.transfers[i] for i in ids]
    proxies = sim.proxies
    decoding = sim.decoding
    pool_info = {}
    for role in POOLS:
        pcfg, built = pools[role]
        pool_info[role] = {
            "replicas": getattr(d, role).replicas, "gpu": built.gpu.name, "tensor_parallel_size": tps[role],
            "router": getattr(d, role).router, "indices": [i for i, r in enumerate(role_of) if r == role],
            "kv_capacity_blocks": int(built.budget.num_gpu_blocks), "price_per_replica_hour": prices[role],
            # the pool's own roof: the verdict judges each pool's steps against its GPU (sim/metrics/verdict.py)
            "peak_flops": float(np.mean([rep.cost.peak_flops for rep, r in zip(sim.replicas, role_of, strict=True)
                                         if r == role])),
            # the pool's own budget (the verdict's)
            "token_cap": token_cap(pcfg.to_dict(built.policy), built.limits.max_num_batched_tokens),
        }
    disagg = {
        "ratio": d.ratio,
        "kv_link": {"kind": d.kv_link.kind, "bandwidth": d.kv_link.bandwidth, "latency": d.kv_link.latency},
        "pools": pool_info,
        # per transferred request, in id order (numpy arrays: the report draws them)
        "id": np.array(ids, dtype=np.int64),
        "transfer_bytes": np.array([t.nbytes for t in tr], dtype=np.float64),
        "prefill_end": np.array([t.prefill_end for t in tr], dtype=np.float64),
        "transfer_start": np.array([t.start for t in tr], dtype=np.float64),
        "transfer_end": np.array([t.end for t in tr], dtype=np.float64),
        "arrival": np.array([proxies[i].arrival for i in ids], dtype=np.float64),
        "prefill_replica": np.array([t.prefill_replica for t in tr], dtype=np.int64),
        "decode_replica": np.array([decoding[i].replica if i in decoding else -1 for i in ids], dtype=np.int64),
        "decode_admitted": np.array([decoding[i].first_scheduled if i in decoding else -1.0 for i in ids],
                                    dtype=np.float64),
        "link_busy_seconds": [link.busy_time for link in sim.links],
    }
    first = sim.replicas[0]
    peak = float(np.mean([rep.cost.peak_flops for rep in sim.replicas]))
    db = pools["decode"][1].budget
    dtp = tps["decode"]
    return RunResult(
        name=name, requests=records, steps=steps, itl_gaps=uniq, itl_counts=counts, duration=duration,
        peak_flops=peak, kv_capacity_blocks=first.core.kv.num_blocks, block_size=first.core.kv.block_size,
        weight_bytes=float(db.weight_bytes * dtp), kv_bytes_per_block=float(db.kv_bytes_per_block * dtp),
        config=config, cluster=cluster, disaggregation=disagg, class_itl=class_itl_gaps(merged),
        summary_sections={"disaggregation": disagg_summary},  # the transfers and each pool's use
        token_budget=pools["decode"][1].limits.max_num_batched_tokens,
        power=pooled_power(sim, pools, role_of, records, disagg),
    )


def pooled_power(sim: DisaggSimulation, pools: dict[str, tuple[VariantConfig, Built]], role_of: list[str],
                 records: list[RequestRecord], disagg: dict[str, Any]) -> PooledPower | None:
    """Each pool's GPUs' power model and where each request worked in the pool (sim/costs/pooled_power.py); None
    when a pool's GPU has no power figures (or its steps were measured on a CPU)."""
    ids = np.array([r.id for r in records], dtype=np.int64)
    rec = {k: np.array([getattr(r, k) for r in records], dtype=np.float64) for k in WINDOW_KEYS}
    at = np.searchsorted(ids, disagg["id"])  # each transferred request's row
    prefill = dict(rec)  # a request refused on the prefill pool is there as the client saw it
    prefill["first_token"], prefill["finish"] = rec["first_token"].copy(), rec["finish"].copy()
    prefill["replica"] = rec["replica"].copy()
    prefill["replica"][at] = disagg["prefill_replica"]
    prefill["first_token"][at] = prefill["finish"][at] = disagg["prefill_end"]  # its prompt, up to its KV's copy
    decode = {k: np.full(len(records), -1.0) for k in WINDOW_KEYS}  # from admission there to its finish
    decode["replica"][at] = disagg["decode_replica"]
    decode["first_scheduled"][at] = decode["first_token"][at] = disagg["decode_admitted"]
    decode["finish"][at] = rec["finish"][at]
    out = []
    for role, windows in (("prefill", prefill), ("decode", decode)):
        pcfg, built = pools[role]
        mine = [rep for rep, r in zip(sim.replicas, role_of, strict=True) if r == role]
        dep = pcfg.deployment
        ex = mine[0].executor
        pm = None if not isinstance(ex, CostExecutor) or ex.cost is None else power_model_of(
            built.gpu, ex.cost, dep.tensor_parallel_size * dep.pipeline_parallel_size, dep.power_limit_w)
        if pm is None:
            return None
        out.append(PoolPower(role, tuple(rep.index for rep in mine), pm, windows))
    return PooledPower(tuple(out))


def disagg_summary(result: RunResult) -> dict[str, Any]:
    """The ``disaggregation`` block of a summary: the split, the link, the transfers and each pool's use."""
    d = result.disaggregation
    assert d is not None
    duration = result.duration
    s = result.steps
    rep = np.asarray(s["replica"])
    dur = np.asarray(s["duration"], dtype=np.float64)
    pools = {}
    for role, info in d["pools"].items():
        mask = np.isin(rep, info["indices"])
        busy = float(dur[mask].sum())
        cap = np.asarray(s["kv_capacity_blocks"], dtype=np.float64)[mask]
        used = np.asarray(s["kv_blocks_used"], dtype=np.float64)[mask]
        w = dur[mask]
        kv_mean = float(dot(used / np.maximum(cap, 1), w) / w.sum()) if w.sum() > 0 else float("nan")
        bsz = np.asarray(s["batch_size"], dtype=np.float64)[mask]
        flops, peak = float(np.asarray(s["flops"], dtype=np.float64)[mask].sum()), info.get("peak_flops", 0.0)
        waited = np.asarray(s["num_waiting"])[mask] > 0
        tokens = (np.asarray(s["prefill_tokens"], dtype=np.float64) + np.asarray(s["decode_tokens"]))[mask][waited]
        wait_busy = float(w[waited].sum())
        pools[role] = {
            "replicas": info["replicas"], "gpu": info["gpu"], "tensor_parallel_size": info["tensor_parallel_size"],
            "busy_fraction": busy / (duration * info["replicas"]) if duration > 0 else float("nan"),
            "mean_batch_size": float(dot(bsz, w) / w.sum()) if w.sum() > 0 else float("nan"),
            "kv_usage_mean": kv_mean,
            "busy_mfu": flops / (busy * peak) if busy > 0 and peak > 0 else float("nan"),  # MFU while computing
            "num_steps": int(mask.sum()),
            # the pool's token budget against its steps while requests waited (sim/metrics/verdict.py's limits)
            "waiting_share": wait_busy / busy if busy > 0 else float("nan"),
            "waiting_batched_tokens": float(dot(tokens, w[waited]) / wait_busy) if wait_busy > 0 else float("nan"),
            "token_cap": info.get("token_cap", float("nan")),
        }
    transfer = d["transfer_end"] - d["prefill_end"]
    admitted = d["decode_admitted"]
    ok = admitted >= 0
    links = d["link_busy_seconds"]
    return {
        "ratio": d["ratio"],
        "kv_link": dict(d["kv_link"]),
        "num_transfers": int(transfer.size),
        "bytes_moved": float(d["transfer_bytes"].sum()),
        "gib_moved": float(d["transfer_bytes"].sum()) / 2**30,
        "transfer": latency_stats(transfer),  # prefill end -> KV at the decode pool (link queue + copy)
        "link_wait": latency_stats(d["transfer_start"] - d["prefill_end"]),
        "prefill_ttft": latency_stats(d["prefill_end"] - d["arrival"]),  # DistServe's TTFT
        "decode_queue": latency_stats(admitted[ok] - d["transfer_end"][ok]),
        "link_busy_fraction": float(np.mean(links)) / duration if duration > 0 and links else float("nan"),
        "pools": pools,
    }
