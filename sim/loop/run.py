"""Running a scenario: every variant (and sweep point) on the same seeded workload. Plain functions, shared by
the command line and the notebooks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.scenario import VariantConfig, apply_point, slos_of, sweep_points, variant_configs
from sim.config.schema import Scenario, ScenarioError
from sim.costs import online
from sim.costs.analytic import AnalyticCostModel
from sim.costs.energy import EnergyStore, cpu_device, energy_kept, measured_on_cpu, power_model_of
from sim.engines.base import engine_of
from sim.loop.autoscaler import AutoscalerConfig
from sim.loop.build import build
from sim.loop.results import result_of, seeded_global_rngs
from sim.loop.simulator import ClosedLoopPlan, Simulation, StalledError
from sim.metrics.decisions import REGRET_MAX_REQUESTS, DecisionTrace, resimulated_regret, trace_core, trace_simulation
from sim.metrics.decisions import summary as decisions_summary
from sim.metrics.records import RunResult
from sim.metrics.request_table import STREAM_MIN, RequestSink, TableStore, tables_kept
from sim.metrics.summary import summarize
from sim.output.progress import BarProgress, Progress
from sim.policies.gates import UserRouter
from sim.policies.user import PolicyError
from sim.serving.core import PlanError, ServingCore
from sim.serving.request import Request
from sim.serving.spec_decode import SpecDecoder, build_decoder, summary_inputs
from sim.workload.generator import GeneratedWorkload, Workload


@dataclass(slots=True)
class ScenarioRun:
    """What a scenario produced: one result and one summary per variant (and sweep point)."""

    scenario: Scenario
    results: list[RunResult] = field(default_factory=list)
    summaries: dict[str, dict] = field(default_factory=dict)
    sweep: list[dict[str, Any]] = field(default_factory=list)  # rows: params, variant, name
    # each result's energy as the summary computed it, for the run folder to read again (sim.costs.energy._kept)
    energy: EnergyStore = field(default_factory=dict, repr=False)
    # and its requests as the columns the summary read (sim.metrics.request_table.tables_kept), likewise
    tables: TableStore = field(default_factory=dict, repr=False)


def generate_workload(scenario: Scenario, workload: Workload | None = None) -> GeneratedWorkload:
    """The scenario's requests (or those of a variant's own ``workload``), drawn from one generator seeded with
    the scenario's seed."""
    rng = np.random.default_rng(scenario.seed)
    try:
        return (workload or scenario.workload).generate(rng)
    except FileNotFoundError as e:
        # the trace reader's own message already says "trace file not found: PATH"
        msg = str(e) if e.filename is None else f"file not found: {e.filename}"
        raise ScenarioError(f"workload: {msg}") from None
    except (ValueError, OSError) as e:
        raise ScenarioError(f"workload: {e}") from None


def _label(params: dict[str, Any]) -> str:
    return ",".join(f"{k.split('.')[-1]}={v}" for k, v in params.items())


def simulate_variant(
    cfg: VariantConfig,
    workload: GeneratedWorkload,
    *,
    name: str | None = None,
    keep_token_times: bool = False,
    fast_path: bool = True,
    progress: Callable[[int, float], None] | None = None,
    trace: DecisionTrace | None = None,
) -> tuple[RunResult, list[Request], ServingCore]:
    """Simulate one variant on a workload; returns its result, its requests and its core (a cluster's: the first
    replica's; the result covers every replica). A policy that breaks a rule or leaves work waiting forever
    raises ``PolicyError`` (a ``ScenarioError``) naming the variant and the policy. ``trace``: its decisions go
    there (sim.metrics.decisions; the fast path is then off, and a disaggregated run is not traced)."""
    if trace is not None:
        fast_path = False  # the decode fast path takes steps without asking the policy the trace wraps
    with policy_errors(cfg, name), seeded_global_rngs(cfg.seed):
        return _simulate_variant(cfg, workload, name=name, keep_token_times=keep_token_times, fast_path=fast_path,
                                 progress=progress, trace=trace)


@contextmanager
def policy_errors(cfg: VariantConfig, name: str | None = None, loop: str = "simulation") -> Iterator[None]:
    """A policy's failure inside a run of ``cfg`` as user input: a ``PolicyError`` (a ``ScenarioError``, so the
    command line prints one message and exits 2) naming the variant, where the run raised ``PolicyError`` (the
    user's code raised or planned past a rule), ``PlanError`` (the core refused a plan) or ``StalledError`` (work
    left waiting with nothing to come). The simulator and the real engine (``realengine.engine.run_engine``) run
    the same policies in the same loop, so they fail the same way; ``loop`` names the run in a stall's message
    (the loop's own says "simulation stalled", which read oddly on the engine: "engine run stalled")."""
    try:
        yield
    except PolicyError as e:
        raise PolicyError(f"variant {name or cfg.name!r}: {e}") from None
    except (PlanError, StalledError) as e:
        cls = getattr(cfg.policy, "cls", None)  # a user's class: its name, as PolicyError's own messages give it
        what = cls.rpartition(":")[2] if isinstance(cls, str) else getattr(cfg.policy, "type", "?")
        # a refused plan's step, as PolicyError's own messages give it (SimPy re-raises a copy, the original its cause)
        at = getattr(e, "at", None) if getattr(e, "at", None) is not None else getattr(e.__cause__, "at", None)
        when = f" at t={at:.6f} s" if at is not None else ""
        text = str(e).replace("simulation stalled", f"{loop} stalled", 1)
        raise PolicyError(f"variant {name or cfg.name!r}: policy {what}{when}: {text}") from None


def _simulate_variant(
    cfg: VariantConfig,
    workload: GeneratedWorkload,
    *,
    name: str | None,
    keep_token_times: bool,
    fast_path: bool,
    progress: Callable[[int, float], None] | None,
    trace: DecisionTrace | None = None,
) -> tuple[RunResult, list[Request], ServingCore]:
    serving = cfg.deployment.serving
    if serving is not None and (cfg.disaggregation is not None or cfg.cluster is not None):
        raise ScenarioError(f"variant {name or cfg.name!r}: deployment.serving models one server's front end; "
                            "a cluster or disaggregated pools behind one are not modelled yet")
    if cfg.disaggregation is not None:
        from sim.loop.disagg.pools import simulate_disaggregated

        return simulate_disaggregated(cfg, workload, name=name, keep_token_times=keep_token_times,
                                      fast_path=fast_path, progress=progress)
    if cfg.cluster is not None:
        return _simulate_cluster(cfg, workload, name=name, keep_token_times=keep_token_times, fast_path=fast_path,
                                 progress=progress, trace=trace)
    policy, kv, cost, built = build(cfg)
    core = ServingCore(policy, kv, fast_path=fast_path, keep_token_times=keep_token_times, spec=spec_decoder(cfg))
    fe = None if serving is None else online.frontend(serving, cfg.deployment.engine)
    if fe is not None:
        workload, sends = online.to_engine(workload, fe)
    closed = workload.closed_loop
    plan = None if closed is None else ClosedLoopPlan(closed.num_users, closed.think_times)
    if plan is not None and fe is not None:  # its users send as they hold replies, through the API server
        plan = ClosedLoopPlan(plan.num_users, plan.think_times, fe.to_client_s, fe.in_server_s)
    # a long run's finished requests leave memory as they finish (sim.metrics.request_table), unless something
    # reads them after the run: the front end's client times, the decision trace, kept token times
    dep = cfg.deployment
    # vLLM 0.6's asynchronous output processing, off with pipeline stages or speculation (verify_async_output_proc)
    late = engine_of(dep.engine).tokens_one_step_late(dep.engine) and dep.pipeline_parallel_size == 1 \
        and dep.speculative is None
    stream = len(workload.requests) > STREAM_MIN and fe is None and trace is None and not keep_token_times \
        and not late
    sim = Simulation(workload.requests, [(core, cost)], closed_loop=plan, progress=progress, fast_forward=fast_path,
                     failures=workload.failures, leak=cfg.deployment.leak_kv_on_failure,
                     sink=RequestSink() if stream else None)
    if trace is not None:
        trace_core(core, trace)
    sim.run()
    if late:
        tokens_one_step_late(sim.requests, core)
    if fe is not None:
        online.to_client(sim.requests, sends if closed is None else sim.client_sends, fe)
    budget = built.budget
    gpus = cfg.deployment.tensor_parallel_size * cfg.deployment.pipeline_parallel_size  # a replica's GPUs
    result = result_of(
        name or cfg.name,
        sim.requests if sim.sink is None else sim.sink,
        core,
        cost,
        config=cfg.to_dict(built.policy),
        weight_bytes=float(budget.weight_bytes * gpus),
        kv_bytes_per_block=float(budget.kv_bytes_per_block * gpus),
    )
    if core.spec is not None and cfg.deployment.speculative is not None:
        result.spec_decode = summary_inputs([core.spec], [cost], cfg.deployment.speculative)
    result.power = power_model_of(built.gpu, cost, gpus, cfg.deployment.power_limit_w)
    _say_cpu(result, cost)
    return result, sim.requests, core


def tokens_one_step_late(requests: list[Request], core: ServingCore) -> None:
    """Each token as it leaves an engine that processes a step's outputs under the next step
    (``Engine.tokens_one_step_late``): at the end of the step that started when the token's step ended, or when it
    was sampled where none did (the engine drains its outputs when it has nothing to run). A closed loop's next
    request was sent on the engine's own finish (not moved: one step of a run of many)."""
    cols = core.steps.columns()
    start = np.asarray(cols["start"], dtype=float)
    if not len(start):
        return
    order = np.argsort(start, kind="stable")
    start = start[order]
    end = start + np.asarray(cols["duration"], dtype=float)[order]

    def late(t: Any) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        i = np.minimum(np.searchsorted(start, t - 1e-9), len(start) - 1)
        return np.where((t >= 0) & (np.abs(start[i] - t) <= 1e-9), end[i], t)

    for r in requests:
        r.first_token, r.last_token, r.finish = (float(x) for x in late([r.first_token, r.last_token, r.finish]))
        if r.token_times:
            r.token_times = [float(x) for x in late(r.token_times)]


def _say_cpu(result: RunResult, cost: Any) -> None:
    """A run on a CPU profile says so in its summary (``device: cpu``): its table and verdict read "GPU busy" and
    "GPU-bound" for steps a CPU timed, and its report drew the scenario's GPU memory over them."""
    if measured_on_cpu(cost):
        result.summary_sections = {**(result.summary_sections or {}), "device": cpu_device}


def spec_decoder(cfg: VariantConfig) -> SpecDecoder | None:
    """The variant's speculative decoder (a fresh acceptance stream per replica), None without speculation."""
    spec = cfg.deployment.speculative
    if spec is None:
        return None
    try:
        return build_decoder(spec)
    except ValueError as e:
        raise ScenarioError(f"variant {cfg.name!r}: deployment.speculative: {e}") from None


def autoscaler_of(cfg: VariantConfig) -> AutoscalerConfig | None:
    """The variant's cluster autoscaler, if it has one (both executors' clusters build it here)."""
    cl = cfg.cluster
    if cl is None or cl.autoscaler is None:
        return None
    a = cl.autoscaler
    try:
        return AutoscalerConfig(a.signal, a.scale_up, a.scale_down, a.interval, a.cooldown, a.provisioning_delay,
                                a.min_replicas, a.max_replicas)
    except ValueError as e:
        raise ScenarioError(f"variant {cfg.name!r}: cluster: {e}") from None


def _simulate_cluster(cfg, workload, *, name, keep_token_times, fast_path, progress, trace=None):
    from sim.loop.cluster import cluster_result

    sim, costs, built = _cluster_simulation(cfg, workload, keep_token_times=keep_token_times, fast_path=fast_path,
                                            progress=progress)
    if trace is not None:
        trace_simulation(sim, trace, sim.router_name)
    sim.run()
    if trace is not None:
        trace.regret_rows = None
        if (len(trace.routes) <= REGRET_MAX_REQUESTS and cfg.cluster.autoscaler is None
                and workload.failures is None):
            def rerun(router):
                again, _, _ = _cluster_simulation(cfg, workload, keep_token_times=False, fast_path=False,
                                                  progress=None)
                again.router = router
                again.run()
                return again.requests

            trace.regret_rows = resimulated_regret(rerun, trace.routes, trace.k)
            for row in trace.regret_rows:
                trace.write("regret", row)
    tp = cfg.deployment.tensor_parallel_size * cfg.deployment.pipeline_parallel_size  # a replica's GPUs
    budget = built.budget
    result = cluster_result(name or cfg.name, sim, costs, price_per_hour=built.gpu.price_per_hour * tp,
                            config=cfg.to_dict(built.policy), weight_bytes=float(budget.weight_bytes * tp),
                            kv_bytes_per_block=float(budget.kv_bytes_per_block * tp))
    if cfg.deployment.speculative is not None:
        result.spec_decode = summary_inputs([r.core.spec for r in sim.replicas if r.core.spec is not None], costs,
                                            cfg.deployment.speculative)
    result.power = power_model_of(built.gpu, costs[0], tp, cfg.deployment.power_limit_w)
    _say_cpu(result, costs[0])
    return result, sim.requests, sim.replicas[0].core


def _cluster_simulation(cfg, workload, *, keep_token_times, fast_path, progress):
    """The variant's cluster, built and not run, with its cost models and the last replica's build."""
    from sim.loop.cluster import ClusterSimulation

    cl = cfg.cluster
    costs = []
    built = None

    def make_replica():
        nonlocal built
        policy, kv, cost, built = build(cfg)  # every replica its own policy and KV memory
        if costs and type(cost) is AnalyticCostModel and cost == costs[0]:
            # and one roofline for the fleet: it holds nothing but its constants and the decode terms it keeps per
            # row count, which a replica then finds priced by the others (256 replicas, 20,000 requests: 3.52-3.62
            # s CPU against 3.64-3.73, three runs each alternating); a model with a replica's own state (measured
            # durations, speculation, pipeline stages) stays the replica's
            cost = costs[0]
        costs.append(cost)
        return ServingCore(policy, kv, fast_path=fast_path, keep_token_times=keep_token_times,
                           spec=spec_decoder(cfg)), cost

    auto = autoscaler_of(cfg)
    closed = workload.closed_loop
    plan = None if closed is None else ClosedLoopPlan(closed.num_users, closed.think_times)
    try:
        sim = ClusterSimulation(workload.requests, make_replica, replicas=cl.replicas, router=cl.router,
                                autoscaler=auto, closed_loop=plan, progress=progress, fast_forward=fast_path,
                                failures=workload.failures, leak=cfg.deployment.leak_kv_on_failure)
    except ValueError as e:
        raise ScenarioError(f"variant {cfg.name!r}: {e}") from None
    if isinstance(sim.router, UserRouter):  # its request views' deadlines, as the replicas' policies see them
        sim.router.ttft_slo = cfg.ttft_slo
    return sim, costs, built


def check_workload_fits_policy(sc: Scenario, cfg: VariantConfig, workload: GeneratedWorkload) -> None:
    """Refuse a policy whose parameters name what the workload lacks (VTC's tenant_weights a tenant that no class
    declares and no request has), which only the drawn requests can tell for a trace's tenant column."""
    classes = (cfg.workload or sc.workload).classes or []
    policies = [("", cfg.policy)]
    if cfg.disaggregation is not None:  # a pool's own policy (a VTC of the decode pool went unchecked)
        from sim.loop.disagg.pools import POOLS, pool_variant

        policies += [(f"disaggregation.{role}.", pool_variant(cfg, role).policy) for role in POOLS
                     if getattr(cfg.disaggregation, role).policy is not None]
    for where, policy in policies:
        check = getattr(policy, "check_tenants", None)
        why = check(workload.requests, [c.tenant for c in classes]) if check is not None else None
        if why is not None:
            raise ScenarioError(f"variant {cfg.name!r}: {where}{why}")


def workload_key(sc: Scenario, cfg: VariantConfig) -> str:
    """What identifies a drawn workload: variants with equal keys replay the very same requests."""
    return (cfg.workload or sc.workload).model_dump_json()


@dataclass(slots=True)
class PreparedScenario:
    """A scenario with every variant (at every sweep point) resolved and every workload generated: what is left
    can only fail on a bug, not on the input."""

    scenario: Scenario
    plans: list[tuple[dict[str, Any], Scenario, list[VariantConfig]]]  # (sweep point, scenario there, variants)
    workloads: dict[str, GeneratedWorkload]  # by the workload section's JSON

    @property
    def num_runs(self) -> int:
        return sum(len(cfgs) for _, _, cfgs in self.plans)

    @property
    def num_requests(self) -> int:
        """Requests simulated over every run (what the progress bar counts)."""
        return sum(len(cfgs) * len(self.workloads[sc.workload.model_dump_json()].requests)
                   for _, sc, cfgs in self.plans)


def check_variants(sc: Scenario, cfgs: list[VariantConfig], built: set[str] | None = None) -> list[VariantConfig]:
    """Build each variant (and check a disaggregated one's pools), so that what the schema lets through but no
    GPU runs (an unknown GPU or model, a model that does not fit) fails here, before anything is simulated.
    ``built``: the configurations (without name and sweep point) already built, each checked once (a
    disaggregated one with its workload, which the pools' check reads: a sweep of workload.failures)."""
    for cfg in cfgs:
        wl = (cfg.workload or sc.workload) if cfg.disaggregation is not None else None
        key = repr((dataclasses.replace(cfg, name="", params={}), wl)) if built is not None else ""
        if key in (built or ()):
            continue
        build(cfg)
        if cfg.disaggregation is not None:
            from sim.loop.disagg.pools import check_disaggregation

            check_disaggregation(cfg, wl)
        if built is not None:
            built.add(key)
    return cfgs


def prepare_scenario(
    scenario: Scenario, raw: dict[str, Any] | None = None, *, source: str = "scenario"
) -> PreparedScenario:
    """Resolve every variant at every sweep point and generate the workloads, so that bad input fails here with a
    ScenarioError before anything is simulated."""
    points = sweep_points(scenario)
    if scenario.sweep and raw is None:
        raw = scenario.model_dump(mode="json")
    plans: list[tuple[dict[str, Any], Scenario, list[VariantConfig]]] = []
    workloads: dict[str, GeneratedWorkload] = {}
    for point in points:
        if point:
            assert raw is not None  # a sweep point comes from a sweep, whose raw dict is set above
        sc = apply_point(raw, point, source) if point and raw is not None else scenario
        where = source if not point else f"{source} at {point}"
        try:
            cfgs = check_variants(sc, variant_configs(sc))
            for cfg in cfgs:
                key = workload_key(sc, cfg)
                if key not in workloads:
                    workloads[key] = generate_workload(sc, cfg.workload)
                check_workload_fits_policy(sc, cfg, workloads[key])
        except ScenarioError as e:
            raise ScenarioError(f"{where}: {e}") from None
        plans.append((point, sc, [dataclasses.replace(c, params=point) for c in cfgs]))
    return PreparedScenario(scenario, plans, workloads)


def run_scenario(
    scenario: Scenario | PreparedScenario,
    raw: dict[str, Any] | None = None,
    *,
    source: str = "scenario",
    progress: bool | Progress = False,
    trace: DecisionTrace | None = None,
) -> ScenarioRun:
    """Run every variant of the scenario (at every sweep point) on the same workload. Accepts a scenario or what
    :func:`prepare_scenario` made of it. ``progress``: True for a bar on stderr counting simulated requests of all
    runs, or a :class:`~sim.output.progress.Progress` to report to (the caller then closes it). ``trace``: every run's
    decisions go there, and each summary gets a ``decisions`` block (sim.metrics.decisions)."""
    prepared = scenario if isinstance(scenario, PreparedScenario) else prepare_scenario(scenario, raw, source=source)
    out = ScenarioRun(prepared.scenario)
    sink: Progress | None = None
    if progress is True:
        sink = BarProgress(prepared.num_requests, prepared.scenario.name)
    elif progress is not False:
        sink = progress
    for point, sc, cfgs in prepared.plans:
        for cfg in cfgs:
            wl = prepared.workloads[workload_key(sc, cfg)]
            name = cfg.name if not point else f"{cfg.name}[{_label(point)}]"
            if sink is not None:
                sink.begin(name, len(wl.requests))
            if trace is not None:
                trace.begin(name)
            result, _, _ = simulate_variant(cfg, wl, name=name, keep_token_times=sc.keep_token_times,
                                            progress=None if sink is None else sink.advance, trace=trace)
            if sink is not None:
                sink.end()
            if result.config is not None:  # the workload it replayed (a sweep point's, the defaults' or its own):
                # its exports name this run's arrival rate, not the scenario file's
                result.config["workload"] = (cfg.workload or sc.workload).model_dump(mode="json")
            out.results.append(result)
            with energy_kept(out.energy), tables_kept(out.tables):
                out.summaries[name] = summarize(result, slos_of(sc))
            if trace is not None:
                out.summaries[name]["decisions"] = decisions_summary(trace, trace.regret_rows, trace.k)
            if point:
                out.sweep.append({"name": name, "variant": cfg.name, **point})
    if progress is True and sink is not None:
        sink.close()
    return out


def write_scenario_run(run: ScenarioRun, out_dir: str | Path, raw: dict[str, Any] | None = None, *,
                       progress: Progress | None = None, steps: str = "auto", table_format: str = "csv",
                       written: list[str] | None = None) -> Path:
    from sim.output.run_folder import write_run

    scenario = run.scenario.model_dump(mode="json")
    if run.sweep:
        scenario["sweep_points"] = run.sweep
    with tables_kept(run.tables):  # the requests as the columns the summaries read, not made again
        return write_run(out_dir, run.results, run.summaries, scenario=scenario,
                         title=f"servesim: {run.scenario.name}", phase=None if progress is None else progress.phase,
                         steps=steps, table_format=table_format, written=written, energy=run.energy)
