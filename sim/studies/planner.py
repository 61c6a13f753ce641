"""Capacity planning by simulation: the cheapest deployment that meets a scenario's SLOs at its load.

The space (the scenario's ``plan`` section, see ``PlanConfig``): GPU type x tensor-parallel degree x pipeline
stages x replicas (whole GPUs, at most ``max_gpus``) x weight dtype x KV dtype x ``max_num_seqs`` x chunked
prefill. Everything else (model, ``max_model_len``, block size, cost-model efficiencies, admission) comes from the
scenario.

Every point is first checked against analytic bounds; only the survivors are simulated, cheapest first.

- memory: the weights, vLLM's activation reserve and one ``max_model_len`` request's KV must fit per GPU (what
  ``sim.loop.build.build`` and vLLM refuse).
- latency: request i's TTFT is at least the step time of its whole prompt computed alone (chunks only add per-step
  costs, other requests only add work), and each of its TPOT gaps at least one decode step of it alone, which is
  bound by reading the weights (``bandwidth-bound decode``). TTFT_i >= bound_i for every i, and a percentile is
  monotone in every value, so when the percentile of the bounds exceeds an SLO the simulated one does too.
- throughput: the workload needs at least W seconds of busy GPU time, summed over replicas: the largest of (a)
  the whole work as one step (aggregates of the linear layers and attention), (b) its decode tokens at the
  largest possible decode batch (``max_num_seqs``, ``max_num_batched_tokens`` and the KV blocks the smallest
  prompts need cap it), (c) its tokens at ``max_num_batched_tokens`` per step. If W / replicas exceeds the span of
  the arrivals, the offered load is above what the replicas can serve: in steady state the queue grows without
  bound (utilisation above 1), so no latency SLO holds. This bound is the steady-state criterion; a finite run
  can end before its queue has grown far, which is why it is reported as "steady state". Open-loop arrivals only.

These hold for the analytic cost model (every step time non-decreasing in each shape field, per-step costs and
per-part maxima summed); the planner refuses a fitted profile, which describes one device only.

Search: survivors sorted by cost per hour; each cost level is simulated whole, and with ``stop_early`` the search
stops after the first level where a configuration meets the SLOs: any other is costlier, so it cannot be the
cheapest. Among equally cheap ones that meet the SLOs the planner prefers higher weight precision, then higher
KV precision (quality, which the simulator does not model), then the lowest tail latency relative to the SLOs;
equally cheap ones of lower precision than a configuration already meeting the SLOs are not simulated.

Price per token and the break-even volume are at the offered load, the output tokens the workload offers over its
arrival window (``OutputLoad``): the run's own throughput counts the drain after the last arrival, so it would make
them depend on ``num_requests``. A deployment that cannot keep up is marked saturated and priced at what it serves.
One that meets the SLOs is also simulated with a backlog (``plan_capacity.py``): when the offered request rate is
above what it completes there, a finite run ended before its queue grew, and it is missed as overloaded.
A run too short for the batch to fill understates TPOT (its batch is still growing): every candidate is simulated
on arrivals spanning ``STEADY_LIFETIMES`` lifetimes of a request meeting the SLOs (``_steady``), more requests drawn
from the workload's distributions (or its requests repeated) when the workload is shorter.

Replicas run in one simulation: a router sends each arrival to the replica with the fewest unfinished requests
(join the shortest queue, ties to the lowest index), as a load balancer in front of vLLM instances does.

This module holds the search and its simulations; the bounds are in ``plan_bounds.py``, what a plan reports
(candidates, evaluations, the result) in ``plan_result.py`` and its text in ``plan_text.py``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from sim.config.deployment import capped_clock
from sim.config.scenario import VariantConfig, slos_of
from sim.config.schema import (
    AnalyticCost,
    ContinuousPolicyConfig,
    Deployment,
    FittedCost,
    PagedKV,
    PlanConfig,
    Scenario,
    ScenarioError,
)
from sim.costs.costmodel import CostModel
from sim.engines.registry import resolve_policy
from sim.engines.sampling import with_sampling
from sim.hardware.dtypes import resolve_kv_dtype
from sim.hardware.gpu import GPU_PRESETS, GPUSpec, resolve_gpu
from sim.hardware.kv_budget import KVBudget, ModelDoesNotFitError
from sim.hardware.models import ModelSpec, check_tensor_parallel, resolve_model
from sim.loop.build import resolve_max_model_len, size_kv_cache
from sim.metrics.records import RunResult
from sim.metrics.summary import SLOs, summarize
from sim.policies.configs import PolicyConfigBase
from sim.serving.pipeline import check_pipeline, wrap_pipeline
from sim.studies.plan_bounds import WorkloadShape, latency_bounds, work_lower_bound
from sim.studies.plan_capacity import (
    STEADY_LIFETIMES,
    backlog_rate,
    backlog_workload,
    slo_lifetime,
    steady_workload,
)
from sim.studies.plan_result import (
    NAN,
    SLO_METRICS,
    Candidate,
    Evaluation,
    PlanResult,
    break_even,
    fewest_joules,
    latency_80_high,
    output_load,
    steady_joules_per_token,
)
from sim.studies.sweep import parallel_map
from sim.words import counted
from sim.workload.generator import GeneratedWorkload

# Searches at most where the choice's measured lifetime sizes the steady-state window (a TTFT SLO alone): plan-chat
# at 100 and 150 requests takes 3 and 2 (windows of 5.0, 7.7 s; 6.3 s)
MEASURED_ROUNDS = 4
MIN_RATE_REQUESTS = 20  # an open-loop workload with fewer has too few gaps (19: 23% standard error) for its rate
# Deployments a search may enumerate: each is priced and bounded, and kept, before the first simulation. plan-chat at
# plan.max_gpus 1024 holds 368,640 (19 s, 450 MB); at 100,000 it held 36 million and ran past 2 minutes, silent
MAX_PLAN_DEPLOYMENTS = 1_000_000


# ---- simulation -----------------------------------------------------------------------------------------------
def simulate_replicas(cfg: VariantConfig, workload: GeneratedWorkload, replicas: int = 1, *,
                      name: str | None = None) -> RunResult:
    """Simulate ``replicas`` copies of a variant behind a least-outstanding-requests router (``sim.loop.cluster``);
    one ``RunResult`` over every request and every replica's steps."""
    from sim.config.schema import ClusterConfig
    from sim.loop.run import simulate_variant

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if cfg.disaggregation is not None:  # a split of the replicas into pools (sim/loop/disagg/plan.py)
        return simulate_variant(cfg, workload, name=name)[0]
    fleet = dataclasses.replace(cfg, cluster=ClusterConfig(replicas=replicas, router="least_outstanding"))
    result, _, _ = simulate_variant(fleet, workload, name=name)
    return result


def _simulate_job(workload: GeneratedWorkload, job: tuple[VariantConfig, int, str]) -> tuple[RunResult | str, float]:
    """One planner simulation in a worker: its result (or the build error's message) and its wall seconds."""
    vcfg, replicas, name = job
    t0 = time.perf_counter()
    try:
        result: RunResult | str = simulate_replicas(vcfg, workload, replicas, name=name)
    except ScenarioError as e:
        result = str(e)
    return result, time.perf_counter() - t0


# ---- the search -----------------------------------------------------------------------------------------------
def _gpus_of(cfg: PlanConfig) -> list[tuple[str | dict[str, Any], GPUSpec]]:
    # by default every preset with a price (sim/hardware/presets/gpus.py's have none: a cost search cannot rank them)
    names: list[str | dict[str, Any]] = list(cfg.gpus) if cfg.gpus else \
        [n for n, g in GPU_PRESETS.items() if g.price_per_hour > 0]
    out: list[tuple[str | dict[str, Any], GPUSpec]] = []
    for g in names:
        try:
            spec = resolve_gpu(g)
        except (ValueError, TypeError) as e:
            raise ScenarioError(f"plan.gpus: {e}") from None
        if all(spec != seen for _, seen in out):  # a GPU listed twice is searched once, as every other axis's repeats
            out.append((g, spec))
    return out


def _meets(latency: dict[str, float], slos: SLOs) -> bool:
    for k in SLO_METRICS:
        limit = getattr(slos, k)
        if limit is not None and latency.get(k, NAN) > limit:  # NaN (no multi-token request for TPOT) passes
            return False
    return True


def _slo_ratio(e: Evaluation, slos: SLOs) -> float:
    """The tail latency relative to its SLO, the worst over the SLOs given (< 1: every SLO met)."""
    r = [e.latency.get(k, NAN) / getattr(slos, k) for k in SLO_METRICS if getattr(slos, k) is not None]
    r = [x for x in r if math.isfinite(x)]
    return max(r) if r else 0.0


def check_plan(scenario: Scenario) -> tuple[PlanConfig, SLOs, ModelSpec, list[tuple[str | dict[str, Any], GPUSpec]]]:
    """What the planner needs from the scenario, or a ScenarioError saying what is missing: SLOs, the analytic
    cost model, a model and GPUs it can resolve. Returns (plan section, SLOs, model, [(GPU as given, spec)])."""
    cfg = scenario.plan or PlanConfig()
    slos = slos_of(scenario)
    if slos is None or slos.empty:
        raise ScenarioError("plan: the scenario has no slos to meet (give slos.ttft, slos.tpot or slos.e2el)")
    dep = scenario.deployment
    if isinstance(dep.cost_model, FittedCost):
        raise ScenarioError("plan: deployment.cost_model is a fitted profile, which describes one device; the "
                            "planner compares GPUs with the analytic cost model")
    if dep.speculative is not None:  # its candidates would be priced without the drafts: refuse, not mislead
        raise ScenarioError("plan: deployment.speculative: the planner does not search speculative decoding; "
                            "compare variants with and without it with `servesim run`")
    if dep.serving is not None:  # every candidate runs as replicas behind a router, which the online layer refuses
        raise ScenarioError("plan: deployment.serving: the planner simulates replicas behind a router, and the "
                            "online layer models one server's front end only (sim/costs/online.py); plan without "
                            "it, then `servesim run` the choice with it")
    try:
        model = resolve_model(dep.model)
    except (ValueError, OSError, KeyError) as e:
        raise ScenarioError(f"plan: deployment.model: {e}") from None
    try:  # no GPU changes it: left to the search, every candidate was "pruned by memory" and the SLOs blamed
        resolve_max_model_len(dep, model)
    except ScenarioError as e:
        raise ScenarioError(f"plan: {e}") from None
    gpus = _gpus_of(cfg)
    size = search_size(cfg, len(gpus))
    if size > MAX_PLAN_DEPLOYMENTS:
        raise ScenarioError(f"plan: the search space holds up to {size:,} deployments (plan.max_gpus {cfg.max_gpus}: "
                            f"every replica count up to it), more than the {MAX_PLAN_DEPLOYMENTS:,} a plan enumerates "
                            "before simulating; lower plan.max_gpus or list fewer gpus, tensor_parallel_sizes, "
                            "dtypes or max_num_seqs")
    return cfg, slos, model, gpus


def search_size(cfg: PlanConfig, num_gpus: int) -> int:
    """Deployments the plan section spans at most (a parallel split that does not fit the model is counted too):
    per GPU, tensor x pipeline split, weight dtype, KV dtype, max_num_seqs and chunking, every replica count up to
    ``max_gpus``, and with ``disaggregation`` every prefill/decode split of each count as well."""
    per = num_gpus * len(set(cfg.weight_dtypes)) * len(set(cfg.kv_dtypes)) * len(set(cfg.max_num_seqs)) * len(
        set(cfg.enable_chunked_prefill))
    lo = None if cfg.disaggregation is None else cfg.disaggregation.min_replicas_per_pool
    counts = 0
    for tp in set(cfg.tensor_parallel_sizes):
        for pp in set(cfg.pipeline_parallel_sizes):
            n = cfg.max_gpus // (tp * pp)
            counts += n
            if lo is not None and (m := n - 2 * lo + 1) > 0:  # r replicas split r - 2 lo + 1 ways
                counts += m * (m + 1) // 2
    return per * counts


def plan(scenario: Scenario, *, stop_early: bool | None = None, progress: bool = False,
         workload: GeneratedWorkload | None = None, executor: str = "local", workers: int | None = 1,
         address: str | None = None, lifetime: float | None = None, _round: int = 0,
         _start: float | None = None) -> PlanResult:
    """Search the scenario's deployment space (its ``plan`` section, defaults when absent) for the cheapest
    configuration whose simulated percentile of TTFT, TPOT and E2EL meet ``slos`` with every request completed.
    ``stop_early`` overrides ``plan.stop_early``. The simulations of one cost level run in parallel on
    ``executor`` ("local": a process pool of ``workers``, None: every core; "ray": a Ray cluster at ``address``);
    the result does not depend on it. ``lifetime`` (seconds) sizes the steady-state window where the SLOs bound
    none (TTFT alone); by default it is measured: the choice's mean E2EL, the search run again on arrivals spanning
    ``STEADY_LIFETIMES`` of it while they were shorter (a filling batch lengthens it: plan-chat's one L40S had
    5.0 s at 100 requests, 11.8 s at 2,000), ``MEASURED_ROUNDS`` searches at most. Raises ScenarioError for a
    scenario the planner cannot use."""
    from sim.loop.run import generate_workload

    start = time.perf_counter() if _start is None else _start  # a search run again counts the first one's time
    cfg, slos, model, gpus = check_plan(scenario)
    stop = cfg.stop_early if stop_early is None else stop_early
    if cfg.objective == "joules":  # a costlier deployment may draw fewer joules per token: every survivor is weighed
        stop = False
    dep = scenario.deployment
    notes: list[str] = []
    base_policy: PolicyConfigBase = scenario.policy
    if not {"max_num_seqs", "enable_chunked_prefill"} <= set(type(base_policy).model_fields):
        # every kind that has the two knobs is kept with its order (sjf, priority, lpm...); replacing it lost an
        # SJF scenario's shortest-first order and said its "static policy" was replaced
        base_policy = ContinuousPolicyConfig()
        notes.append(f"the scenario's {scenario.policy.type} policy is replaced by continuous batching (the planner "
                     "tunes max_num_seqs and chunked prefill, which it does not take)")
    if scenario.variants or scenario.sweep:
        notes.append("the scenario's variants and sweep are ignored: the planner starts from its top-level "
                     "deployment, kv_cache, policy and admission")
    if dep.num_gpu_blocks is not None:
        notes.append("deployment.num_gpu_blocks is ignored: the KV cache is sized for each GPU")
    wl = workload if workload is not None else generate_workload(scenario)
    if getattr(wl, "failures", None) is not None:
        notes.append("the workload's failures are left out: the plan is for a healthy server")
    shape = WorkloadShape.of(wl)
    if shape.span > 0 and len(wl) < MIN_RATE_REQUESTS:
        # the offered rate, (n - 1) / span, is what every bound and the overload probe compare against; from 4 gaps
        # (-n 5) it is off by half, and plan-chat chose 8 x A100 for a load one L40S pair carries
        raise ScenarioError(f"plan: {len(wl)} requests give {counted(len(wl) - 1, 'gap')} between arrivals, too few "
                            "to estimate "
                            f"the offered rate (standard error about 1/sqrt(gaps), "
                            f"{1 / math.sqrt(len(wl) - 1):.0%}); give at least {MIN_RATE_REQUESTS} requests "
                            f"(-n {MIN_RATE_REQUESTS}), a few hundred for a reliable plan")
    measured = (lifetime is None or _round > 0) and slo_lifetime(slos, float(shape.output.mean())) is None
    if shape.span > 0:
        wl, shape = _steady(scenario, wl, shape, slos, notes, given=workload is not None, lifetime=lifetime)
    prefix = isinstance(scenario.kv_cache, PagedKV) and scenario.kv_cache.enable_prefix_caching
    q = cfg.percentile
    if shape.span <= 0:
        notes.append("no offered rate (closed loop or all at once): the throughput bound is not applied")
    if cfg.disaggregation is not None and prefix:
        notes.append("plan.disaggregation is ignored: disaggregated pools run without prefix caching")

    evaluations: list[Evaluation] = []
    survivors: list[tuple[Evaluation, VariantConfig]] = []
    base = dep.model_dump()
    base["num_gpu_blocks"] = None
    latency_cache: dict[tuple, dict[str, float]] = {}
    left_out: dict[str, None] = {}  # why a split is not searched, each reason once (an empty space says them all)
    for gname, g in gpus:
        if g.price_per_hour <= 0:
            notes.append(f"{g.name} has no price_per_hour: left out")
            continue
        if dep.power_limit_w is not None:
            # one cap in watts for every GPU searched: a GPU whose board does not take it is left out, said so (its
            # candidates were counted as pruned by memory)
            try:
                capped_clock(g, dep.power_limit_w)
            except ScenarioError as e:
                notes.append(f"{e}: {g.name} left out")
                left_out[f"{e}"] = None
                continue
        splits = [(tp, pp) for pp in dict.fromkeys(cfg.pipeline_parallel_sizes)
                  for tp in dict.fromkeys(cfg.tensor_parallel_sizes)]
        for tp, pp in splits:
            try:
                check_tensor_parallel(model, tp)
                check_pipeline(model, pp)
            except ValueError as e:
                left_out[str(e)] = None
                continue
            if tp * pp > cfg.max_gpus:
                left_out[f"tp {tp} x pp {pp} is more than plan.max_gpus {cfg.max_gpus}"] = None
                continue
            for wd in dict.fromkeys(cfg.weight_dtypes):
                for kd in dict.fromkeys(resolve_kv_dtype(k, wd) for k in cfg.kv_dtypes):
                    for mns in dict.fromkeys(cfg.max_num_seqs):
                        for chunk in dict.fromkeys(cfg.enable_chunked_prefill):
                            per = _evaluate_replica_config(
                                scenario, model, base, base_policy, gname, g, tp, wd, kd, mns, chunk, cfg, slos, shape,
                                q, prefix, latency_cache, pp,
                            )
                            for ev, vcfg in per:
                                evaluations.append(ev)
                                if vcfg is not None:
                                    survivors.append((ev, vcfg))

    if not evaluations:  # nothing to search: "no deployment meets the SLOs" (exit 0) would blame the SLOs
        why = "; ".join(left_out) or "no GPU of plan.gpus has a price_per_hour"  # (each said in the notes)
        raise ScenarioError(f"plan: the search space holds no deployment of {model.name}: {why}")
    survivors.sort(key=lambda s: (round(s[0].candidate.cost_per_hour, 6), tuple(-x for x in s[0].candidate.precision),
                                  s[0].candidate.replicas, s[0].candidate.prefill_replicas,
                                  -s[0].candidate.max_num_seqs,
                                  not s[0].candidate.enable_chunked_prefill, s[0].candidate.gpu))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(survivors), desc=f"plan {scenario.name}", unit="sim", leave=False)
    chosen: Evaluation | None = None
    level_cost: float | None = None
    # Survivors of one cost level are simulated together (in parallel), then judged in the sorted order, so the
    # choice is the one a serial search makes; with stop_early nothing costlier than the choice is simulated.
    levels: dict[float, list[tuple[Evaluation, VariantConfig]]] = {}
    for ev, vcfg in survivors:
        levels.setdefault(round(ev.candidate.cost_per_hour, 6), []).append((ev, vcfg))
    for cost, group in levels.items():
        if chosen is not None and stop:
            for ev, _ in group:
                ev.status = "not simulated"
                ev.reason = f"costlier than the choice (${chosen.candidate.cost_per_hour:.2f}/h)"
            if bar is not None:
                bar.update(len(group))
            continue
        jobs = [(vcfg, ev.candidate.replicas, ev.candidate.label()) for ev, vcfg in group]
        results: list = [None] * len(group)
        for i, out in parallel_map(_simulate_job, jobs, shared=wl, executor=executor, workers=workers,
                                   address=address):
            results[i] = out
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"${group[i][0].candidate.cost_per_hour:.2f}/h", refresh=False)
        for (ev, vcfg), (result, seconds) in zip(group, results, strict=True):
            c = ev.candidate
            if chosen is not None and stop and c.precision < chosen.candidate.precision:
                ev.status = "not simulated"  # simulated already (in parallel), but a serial search skips it
                ev.reason = "as costly as the choice, with lower precision"
                continue
            if isinstance(result, str):  # build refused what the bounds let through: the memory check, reworded
                ev.status, ev.bound, ev.reason = "pruned", "memory", result
                continue
            s = summarize(result, slos)
            ev.sim_seconds = seconds
            ev.latency = {k: s[k][f"p{q}"] for k in SLO_METRICS}
            ev.output_throughput = s["output_throughput"]
            ev.load = output_load(result, s["output_throughput"])
            ev.total_input_tokens, ev.total_output_tokens = s["total_input_tokens"], s["total_output_tokens"]
            ev.num_completed, ev.num_requests = s["num_completed"], s["num_requests"]
            ev.j_per_output_token = steady_joules_per_token(
                result, ev.load, NAN if not s["energy"] else s["energy"]["j_per_output_token"])
            ev.mean_e2el = s["e2el"]["mean"]
            done = ev.num_completed == ev.num_requests
            ev.latency_80_high = latency_80_high(ev.latency)
            ok, ev.meets_80 = done and _meets(ev.latency, slos), done and _meets(ev.latency_80_high, slos)
            # a short run can end before an overload shows (sim/studies/plan_capacity.py), and an overloaded
            # deployment meets the SLOs with no confidence either: its queue grows past what the run shows. (The
            # 80% slow end of an over-predicted class is below the prediction, so meets_80 may hold alone.)
            if (ok or ev.meets_80) and shape.span > 0 and not _keeps_up(ev, vcfg, wl, shape):
                ok = ev.meets_80 = False
            ev.status = "met" if ok else "missed"
            if not ok and ev.num_completed < ev.num_requests:
                ev.reason = f"{counted(ev.num_requests - ev.num_completed, 'request')} not completed"
            if ok:
                better = chosen is None or (c.precision, -_slo_ratio(ev, slos)) > (
                    chosen.candidate.precision, -_slo_ratio(chosen, slos))
                if chosen is None or (cost == level_cost and better):
                    chosen, level_cost = ev, cost
    if bar is not None:
        bar.close()
    cheapest = chosen
    if cfg.objective == "joules":
        chosen = fewest_joules(evaluations, cheapest)
        if chosen is None and cheapest is not None:
            chosen = cheapest
            notes.append("plan.objective joules: no deployment meeting the SLOs has a power model (a GPU preset "
                         "without tdp_w and idle_w, sim/costs/energy.py): the cheapest is chosen")

    be = None
    if chosen is not None and cfg.api_price is not None and chosen.total_output_tokens > 0:
        be = break_even(chosen.candidate.cost_per_hour, cfg.api_price.input, cfg.api_price.output,
                        chosen.total_input_tokens, chosen.total_output_tokens, chosen.num_completed,
                        chosen.output_rate)
    if measured and shape.span > 0 and chosen is not None and math.isfinite(chosen.mean_e2el):
        # a TTFT SLO alone bounds no request's lifetime: the choice's own says whether its batch had filled
        if shape.span >= STEADY_LIFETIMES * chosen.mean_e2el:
            if _round == 0:  # (a longer search's window is said in its steady-state note)
                notes.append(f"steady state: no slos.tpot or slos.e2el bounds how long a request lasts; the choice's "
                             f"requests lasted {1000 * chosen.mean_e2el:,.0f} ms on average (mean E2EL), and the "
                             f"arrivals span {shape.span:,.1f} s, {shape.span / chosen.mean_e2el:.1f} of those "
                             f"lifetimes (at least {STEADY_LIFETIMES:g}): its batch had filled")
        elif _round + 1 < MEASURED_ROUNDS:
            return plan(scenario, stop_early=stop_early, progress=progress, workload=workload, executor=executor,
                        workers=workers, address=address, lifetime=max(chosen.mean_e2el, lifetime or 0.0),
                        _round=_round + 1, _start=start)
        else:
            notes.append(f"steady state: no slos.tpot or slos.e2el bounds how long a request lasts, and the choice's "
                         f"requests still lasted {1000 * chosen.mean_e2el:,.0f} ms on average (mean E2EL) after "
                         f"{MEASURED_ROUNDS} longer searches, more than a third of the {shape.span:,.1f} s of "
                         "arrivals: its batch may still have been filling; plan on a few thousand requests (-n)")
    if any(e.candidate.replicas > 1 for e in evaluations if e.simulated):
        notes.append("replicas are simulated together behind a router sending each request to the replica with "
                     "the fewest unfinished requests (sim/loop/cluster.py, least_outstanding)")
    return PlanResult(
        scenario=scenario.name,
        percentile=q,
        slos=slos.as_dict(),
        evaluations=evaluations,
        chosen=chosen,
        break_even=be,
        seconds=time.perf_counter() - start,
        notes=notes,
        objective=cfg.objective,
        cheapest=cheapest,
    )


def _steady(scenario: Scenario, wl: GeneratedWorkload, shape: WorkloadShape, slos: SLOs, notes: list[str], *,
            given: bool, lifetime: float | None) -> tuple[GeneratedWorkload, WorkloadShape]:
    """The workload every candidate is simulated on: arrivals spanning ``STEADY_LIFETIMES`` lifetimes of a request
    meeting the SLOs, so that the batch of a deployment that meets them has filled before it is judged. A short run
    judged a deployment while its batch was still filling: plan-chat at 150 requests (10 s of arrivals) chose one
    L40S at p99 TPOT 24.5 ms, 43.7 ms at 2,000 requests (SLO 30 ms). More requests are drawn from the scenario's
    own distributions (a fresh sample: a few requests repeated keep their light tail); a trace or a workload passed
    in is repeated (``plan_capacity.steady_workload``). ``lifetime``, measured, stands in where the SLOs bound none
    (``plan`` measures it when None)."""
    from sim.loop.run import generate_workload
    from sim.workload.arrivals import TraceArrival

    bound = slo_lifetime(slos, float(shape.output.mean()))
    if bound is None and lifetime is None:
        return wl, shape  # measured from the choice (plan)
    lifetime = bound if bound is not None else lifetime
    assert lifetime is not None
    window = STEADY_LIFETIMES * lifetime
    if shape.span >= window:
        return wl, shape
    steady, new = wl, shape
    repeat = given or isinstance(scenario.workload.arrival, TraceArrival)
    if repeat:
        steady = steady_workload(wl, window)
        new = WorkloadShape.of(steady)
    else:
        n = len(wl)
        for _ in range(4):  # a longer draw, cut after the first arrival past the window (a prefix of the process)
            n = math.ceil(window / new.span * (n - 1) * 1.5) + 1
            steady = generate_workload(scenario, scenario.workload.model_copy(update={"num_requests": n}))
            new = WorkloadShape.of(steady)
            if new.span >= window:
                break
        t0 = steady.requests[0].arrival
        keep = next((i + 1 for i, r in enumerate(steady.requests) if r.arrival - t0 >= window), len(steady))
        steady = dataclasses.replace(steady, requests=tuple(steady.requests[:keep]), failures=None)
        new = WorkloadShape.of(steady)
    how = "the workload's requests repeated" if repeat else "drawn from the workload's distributions"
    what = ("a request meeting the SLOs (TTFT + mean output x TPOT, or E2EL" if bound is not None else
            "a request of the choice on a shorter run (its mean E2EL: no slos.tpot or slos.e2el bounds it")
    notes.append(f"steady state: the SLOs are judged on {len(steady):,} requests, not {len(wl):,} ({how}): their "
                 f"arrivals span {STEADY_LIFETIMES:g} lifetimes of {what}: {1000 * lifetime:,.0f} ms), so that each "
                 "deployment's batch has filled")
    return steady, new


def _keeps_up(ev: Evaluation, vcfg: VariantConfig, wl: GeneratedWorkload, shape: WorkloadShape) -> bool:
    """Whether the deployment serves the offered request rate with a backlog (``ev.max_request_rate``); if not,
    the reason is put on ``ev``."""
    c = ev.candidate
    result, seconds = _simulate_job(backlog_workload(wl, c.max_num_seqs * c.replicas), (vcfg, c.replicas, c.label()))
    ev.sim_seconds += seconds
    if isinstance(result, str):
        return True  # the run above built the same deployment: not reached
    ev.max_request_rate = backlog_rate(result)
    offered = (len(wl.requests) - 1) / shape.span
    if not offered > ev.max_request_rate:
        return True
    ev.reason = (f"overloaded: serves at most {ev.max_request_rate:.3g} req/s with a backlog, {offered:.3g} arrive "
                 f"(utilisation {offered / ev.max_request_rate:.2f}); its queue grows without bound, past what "
                 f"{len(wl.requests)} requests show")
    return False


def _resolve(vcfg: VariantConfig, model: ModelSpec, gpu: GPUSpec) -> tuple[CostModel, KVBudget, int]:
    """The cost model, KV budget and token limit one replica of ``vcfg`` gets, from the very builders
    ``sim.loop.build.build`` uses, without building the KV block manager (the bounds need only its size). Raises
    ScenarioError (a ValueError) where ``build`` refuses the deployment."""
    dep, pol = vcfg.deployment, vcfg.policy
    assert isinstance(dep.cost_model, AnalyticCost)  # check_plan refuses the others
    max_model_len = resolve_max_model_len(dep, model)
    limits = resolve_policy(pol, dep, model, gpu, max_model_len).limits(max_model_len)
    budget = size_kv_cache(dep, model, gpu, limits)
    cost = wrap_pipeline(with_sampling(dep.cost_model.build(model, gpu, dep), dep.engine, vcfg.sampling), model, gpu,
                         pipeline_parallel_size=dep.pipeline_parallel_size, link=dep.pipeline_link,
                         weight_dtype=dep.weight_dtype)
    return cost, budget, limits.max_num_batched_tokens


def _evaluate_replica_config(
    scenario: Scenario, model: ModelSpec, base: dict[str, Any], base_policy: PolicyConfigBase,
    gname: str | dict[str, Any], g: GPUSpec, tp: int, wd: str, kd: str, mns: int, chunk: bool, cfg: PlanConfig,
    slos: SLOs, shape: WorkloadShape, q: int, prefix: bool, latency_cache: dict[tuple, dict[str, float]],
    pp: int = 1,
) -> list[tuple[Evaluation, VariantConfig | None]]:
    """Every replica count of one per-replica configuration: pruned ones with their reason, survivors with the
    variant that simulates them."""
    counts = range(1, cfg.max_gpus // (tp * pp) + 1)

    def cand(r: int) -> Candidate:
        return Candidate(g.name, tp, r, wd, kd, mns, chunk, g.price_per_hour, pp)

    def pruned(bound: str, reason: str, **kw: Any) -> list[tuple[Evaluation, VariantConfig | None]]:
        return [(Evaluation(cand(r), status="pruned", bound=bound, reason=reason, **kw), None) for r in counts]

    dep = Deployment.model_validate({**base, "gpu": gname, "tensor_parallel_size": tp, "weight_dtype": wd,
                                     "kv_dtype": kd, "pipeline_parallel_size": pp})
    pol = base_policy.model_copy(update={"max_num_seqs": mns, "enable_chunked_prefill": chunk})
    # the SLO planned for is the deadline an EDF policy or an admission rule sees, as a run's variant takes slos.ttft
    vcfg = VariantConfig(name="plan", deployment=dep, kv_cache=scenario.kv_cache, policy=pol,
                         admission=scenario.admission, params={}, sampling=scenario.workload.sampling,
                         ttft_slo=slos.ttft, seed=scenario.seed)
    try:
        cost, budget, max_num_batched_tokens = _resolve(vcfg, model, g)
    except (ModelDoesNotFitError, ValueError) as e:
        return pruned("memory", str(e))
    key = (g.name, tp, wd, kd, pp)
    if key not in latency_cache:
        latency_cache[key] = latency_bounds(cost, shape, q, prefix_caching=prefix)
    lb = latency_cache[key]
    for k in SLO_METRICS:
        limit = getattr(slos, k)
        if limit is not None and lb[k] > limit:
            return pruned(k, f"p{q} {k.upper()} >= {lb[k]:.4g} s even alone on the GPU > SLO {limit:g} s",
                          lower_bounds=dict(lb))
    out: list[tuple[Evaluation, VariantConfig | None]] = []
    work = NAN
    if shape.span > 0:
        work = work_lower_bound(cost, shape, max_num_seqs=mns, max_num_batched_tokens=max_num_batched_tokens,
                                num_gpu_blocks=budget.num_gpu_blocks, block_size=budget.block_size,
                                prefix_caching=prefix)
    for r in counts:
        util = work / (r * shape.span) if shape.span > 0 else NAN
        ev = Evaluation(cand(r), lower_bounds=dict(lb), utilization_bound=util)
        if util > 1.0:
            need = math.ceil(work / shape.span)
            ev.status, ev.bound = "pruned", "throughput"
            ev.reason = (f"needs >= {work:.1f} s of GPU time for {shape.span:.1f} s of arrivals: utilisation >= "
                         f"{util:.2f} on {r} replica(s), >= {need} replicas to keep up")
            out.append((ev, None))
        else:
            out.append((ev, vcfg))
    if cfg.disaggregation is not None and not prefix:
        from sim.loop.disagg.plan import split_candidates

        out += [split for ev, v in list(out) for split in split_candidates(ev, v, cfg.disaggregation)]
    if not any(v is not None for _, v in out) and shape.span > 0:
        need = math.ceil(work / shape.span)
        if need * tp * pp > cfg.max_gpus:
            for ev, _ in out:
                ev.bound = "max_gpus" if ev.bound == "throughput" else ev.bound
                ev.reason += f" ({need * tp * pp} GPUs > plan.max_gpus {cfg.max_gpus})"
    return out
