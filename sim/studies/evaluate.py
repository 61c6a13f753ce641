"""Scoring a scheduling policy for a search loop: ``servesim.evaluate(policy, scenario, seeds=...) -> Scores``.

A policy-search loop (an evolutionary search, an LLM proposing policies) calls this thousands of times, so:

- **the policy** is a ``servesim.Policy`` object, a class (built with ``args``), or Python source text that defines
  exactly one subclass of ``servesim.Policy`` (``servesim.QueuePolicy`` included). The text is compiled in a fresh
  namespace (``__name__`` ``servesim_policy``, the builtins, nothing else): it imports what it needs, and it may
  import anything this interpreter can (the standard library, numpy, ``servesim``). This is not a sandbox: the
  worker bounds the time and memory a policy takes, not what its code may touch.
- **the workload** of each (scenario, seed) is drawn once and kept in a :class:`WorkloadCache` keyed by the
  workload section's content, the folder relative paths start from, and the seed (a trace file is read once).
- **user code runs in a worker process** (POSIX; :mod:`sim.studies.eval_worker`) held to a CPU-time budget (an
  interval timer on the process's CPU time, with RLIMIT_CPU behind it for code that never returns to the
  interpreter; the parent kills a worker that blocks past a wall-clock guard) and a memory budget (RLIMIT_AS: the
  address space at the start plus ``memory_limit`` MiB). Source text runs in the kept worker, forked at the first
  call (it inherits the cached workloads without copying them) and reused by the calls after it, each given the
  caller's working directory and global random states as a fork made then would have; it is replaced after any
  failure. Each call compiles the text afresh, but what a policy changes in shared modules (servesim's, numpy's)
  stays in that worker for the calls after it. A policy object or class runs in a worker forked for the call,
  which sees it as the caller has it now. A fork per call costs the fork and the pages the child copies, a
  fifth of an evaluation on benchmarks/bench_evaluate.py (docs/benchmarks.md). The worker is the default because it
  alone bounds memory and survives a crash. ``isolate=False`` runs in this process instead (and where there is no
  fork): the time budget then holds only in the main thread, and memory is not bounded.
- **failures are scores**: a syntax error, a module or constructor that raises, an exception inside the policy, a
  plan that breaks a rule, a policy that leaves work waiting forever, the time or memory budget run out, or a
  worker that dies come back as ``Scores(ok=False, reason=..., error=...)`` with ``fitness`` minus infinity; they
  are never raised. Only a mistake in the call itself (a scenario that does not validate, an unknown weight key,
  a bad seed) raises ``ScenarioError``.

Nothing is written unless ``out`` names a folder: then ``scores.json`` and one run folder per seed.

The figures of each seed are those of ``servesim.run(scenario, policy=obj, seed=s)`` exactly (the very
summary); the scores are their means over the seeds. ``fitness`` is the tournament's (``servesim tournament``,
:mod:`sim.studies.tournament`): BLIS's weighted sum of metrics each mapped to [0, 1] (``weights`` and ``reference``, the
same keys and defaults: throughput, p99_ttft and p99_e2e weighing 1 each), per seed, then its mean over the seeds,
so that a policy found by a search scores the same in a tournament.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import json
import linecache
import math
import os
import signal
import threading
import time
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim.config.errors import ScenarioError, ServesimStop
from sim.config.files import output_folder
from sim.policies import api
from sim.policies.loader import fitted_args, unexpected_arg_hint
from sim.policies.user import reads, unpredicted_note
from sim.studies.eval_worker import KEPT, run_forked
from sim.workload.generator import GeneratedWorkload

# The metrics a Scores holds, each the mean over the seeds of one summary.json figure (times in seconds, rates
# per second). Fitness weights name these keys.
METRICS: dict[str, tuple[str, ...]] = {
    "goodput": ("goodput",),  # requests completed within every SLO per second; needs SLOs
    "slo_attainment": ("slo_attainment",),  # share of all requests completed within every SLO; needs SLOs
    "throughput": ("request_throughput",),  # completed requests per second
    "output_throughput": ("output_throughput",),  # output tokens per second
    "ttft_mean": ("ttft", "mean"),
    "ttft_p50": ("ttft", "p50"),
    "ttft_p99": ("ttft", "p99"),
    "tpot_mean": ("tpot", "mean"),
    "tpot_p50": ("tpot", "p50"),
    "tpot_p99": ("tpot", "p99"),
    "e2el_mean": ("e2el", "mean"),
    "e2el_p50": ("e2el", "p50"),
    "e2el_p99": ("e2el", "p99"),
    "num_completed": ("num_completed",),
    "num_rejected": ("num_rejected",),
    "num_preemptions": ("num_preemptions",),
    "jain_index": ("fairness", "jain_index"),  # Jain's index over tenants; NaN where requests name none
}
_NEEDS_SLOS = frozenset({"goodput", "slo_attainment"})

REASONS = ("syntax", "load", "exception", "bad_plan", "stall", "timeout", "memory", "crash")
SOURCE_NAME = "servesim_policy"  # the module name of policy source text
_SOURCE_FILE = "<policy source>"  # its file name in tracebacks


@dataclass(frozen=True, slots=True)
class Scores:
    """What :func:`evaluate` found: ``ok`` and the metrics (means over ``seeds``; see :data:`METRICS`), or
    ``ok=False`` with ``reason`` (one of :data:`REASONS`) and ``error`` (the message, with the policy's own frames
    of a traceback). ``fitness`` is the tournament's, minus infinity for a failure. ``summaries``
    holds each seed's full summary (summary.json's figures, as ``servesim.run`` gives them); ``cpu_seconds`` the
    CPU time the policy's runs took."""

    ok: bool
    fitness: float
    reason: str | None = None
    error: str | None = None
    seeds: tuple[int, ...] = ()
    goodput: float = math.nan
    slo_attainment: float = math.nan
    throughput: float = math.nan
    output_throughput: float = math.nan
    ttft_mean: float = math.nan
    ttft_p50: float = math.nan
    ttft_p99: float = math.nan
    tpot_mean: float = math.nan
    tpot_p50: float = math.nan
    tpot_p99: float = math.nan
    e2el_mean: float = math.nan
    e2el_p50: float = math.nan
    e2el_p99: float = math.nan
    num_completed: float = math.nan
    num_rejected: float = math.nan
    num_preemptions: float = math.nan
    jain_index: float = math.nan
    cpu_seconds: float = field(default=0.0, compare=False)  # timing, not a result: left out of ==
    summaries: tuple[dict, ...] = field(default=(), repr=False, compare=False)

    def metrics(self) -> dict[str, float]:
        """The metrics by :data:`METRICS` key."""
        return {k: getattr(self, k) for k in METRICS}

    def to_dict(self) -> dict[str, Any]:
        """Everything but the per-seed summaries, JSON-ready (NaN and infinity as None)."""
        d = asdict(self)
        del d["summaries"]
        d["seeds"] = list(self.seeds)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def failed(reason: str, error: str, seeds: Iterable[int] = (), cpu_seconds: float = 0.0) -> Scores:
    assert reason in REASONS
    return Scores(ok=False, fitness=-math.inf, reason=reason, error=error, seeds=tuple(seeds),
                  cpu_seconds=cpu_seconds)


def fitness_spec(weights: Mapping[str, float] | str | None, reference: Mapping[str, float] | None) -> Any:
    """The tournament's ``Fitness`` of ``weights`` (a mapping, or BLIS's ``"key:weight,key:weight"``; None: the
    defaults) and ``reference``. Raises ScenarioError naming a bad key or weight."""
    from sim.studies.tournament import Fitness

    if isinstance(weights, str):
        pairs: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in weights.split(","))):
            key, sep, value = part.partition(":")
            try:
                pairs[key.strip()] = float(value) if sep else math.nan
            except ValueError:
                pairs[key.strip()] = math.nan
            if not math.isfinite(pairs[key.strip()]):
                raise ScenarioError(f"weights: {part!r} is not 'key:weight' with a number")
        weights = pairs
    given: dict[str, Any] = {}
    if weights is not None:
        given["weights"] = weights
    if reference is not None:
        given["reference"] = reference
    try:
        return Fitness.model_validate(given)
    except ValidationError as e:
        # pydantic words a validator's ValueError "Value error, ...": the reason is what follows
        raise ScenarioError("fitness: " + "; ".join(f"{'.'.join(map(str, x['loc']))}: "
                                                    f"{x['msg'].removeprefix('Value error, ')}"
                                                    for x in e.errors())) from None


# ---- the workload cache ------------------------------------------------------------------------------------------

class WorkloadCache:
    """Generated workloads by (where relative paths start, workload section, seed), the least recently used
    dropped beyond ``maxsize``. ``generated`` counts the workloads drawn (not taken from the cache)."""

    def __init__(self, maxsize: int = 32) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"maxsize must be an integer >= 1, got {maxsize!r}")
        self.maxsize = maxsize
        self.generated = 0
        self._items: OrderedDict[tuple[str, str, int], GeneratedWorkload] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def values(self) -> list[GeneratedWorkload]:
        with self._lock:
            return list(self._items.values())

    def get(self, scenario: Any, seed: int, base: str) -> GeneratedWorkload:
        """The workload of ``scenario`` (a validated Scenario) drawn with ``seed``."""
        from sim.loop.run import generate_workload

        key = (base, scenario.workload.model_dump_json(), seed)
        with self._lock:
            wl = self._items.get(key)
            if wl is not None:
                self._items.move_to_end(key)
                return wl
        wl = generate_workload(scenario.model_copy(update={"seed": seed}))
        with self._lock:
            self.generated += 1
            self._items[key] = wl
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return wl


DEFAULT_CACHE = WorkloadCache()  # what evaluate() uses unless given a cache of its own


# ---- the policy ----------------------------------------------------------------------------------------------------

class _LoadError(Exception):
    """The policy could not be made: ``reason`` is "syntax" or "load"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def policy_from_source(text: str) -> type:
    """The one ``servesim.Policy`` subclass that ``text`` defines, compiled in a fresh namespace (see the module
    docstring). Raises ``_LoadError``."""
    lines = text.splitlines(keepends=True)
    try:
        code = compile(text, _SOURCE_FILE, "exec")
    except SyntaxError as e:
        where = f" (line {e.lineno})" if e.lineno else ""
        shown = f": {e.text.strip()}" if e.text and e.text.strip() else ""
        raise _LoadError("syntax", f"SyntaxError: {e.msg}{where}{shown}") from None
    # the traceback of an error in the text shows its lines, as for a file
    linecache.cache[_SOURCE_FILE] = (len(text), None, lines, _SOURCE_FILE)
    ns: dict[str, Any] = {"__name__": SOURCE_NAME, "__builtins__": builtins}
    try:
        exec(code, ns)
    except Exception as e:
        raise _LoadError("load", f"running the source raised {_user_error(e)}") from None
    found = [v for v in ns.values() if isinstance(v, type) and issubclass(v, api.Policy)
             and v.__module__ == SOURCE_NAME]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise _LoadError("load", f"the source must define exactly one servesim.Policy subclass, it defines "
                         f"{len(found)} ({names})")
    return found[0]


def _make_policy(policy: Any, args: Mapping[str, Any]) -> Any:
    """The policy object of ``policy`` (source text, a class or an object). Raises ``_LoadError``."""
    if isinstance(policy, str):
        policy = policy_from_source(policy)
    if isinstance(policy, type):
        try:
            args = fitted_args(policy, args)  # as a scenario's args are checked
        except ValueError as e:
            raise _LoadError("load", str(e)) from None
        try:
            policy = policy(**args)
        except Exception as e:
            raise _LoadError("load", f"constructing {policy.__name__}(**{dict(args)!r}) raised "
                             f"{_user_error(e)}{unexpected_arg_hint(policy, e)}") from None
    elif args:
        raise _LoadError("load", "args are for a class or source text, not an object")
    why = api.implements_policy(policy)
    if why is not None:
        # the hint for a class that is no policy (as sim/policies/configs.py); one whose schedule is not overridden,
        # or a hook of a wrong signature or name, subclasses it already
        hint = " (subclass servesim.Policy)" if why.startswith("has no ") else ""
        raise _LoadError("load", f"{type(policy).__name__} {why}{hint}")
    try:
        copy.deepcopy(policy)  # each seed runs a fresh copy; a policy that cannot be copied fails here, named
    except Exception as e:
        raise _LoadError("load", f"copying {type(policy).__name__} raised {_user_error(e)}") from None
    return policy


def _user_error(e: BaseException) -> str:
    """``Type: message`` and the frames of the policy's own code (servesim's frames above it left out)."""
    here = {__file__}
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename not in here]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(e), e)
    return "".join(lines).rstrip() if frames else "".join(lines[-1:]).rstrip()


def _policy_frames(e: BaseException) -> str:
    """The frames of ``e``'s traceback in the policy's code: servesim's own (the loop and the core between this
    call and the policy's), the libraries' and the import machinery's left out."""
    for _ in range(16):  # SimPy raises a copy, the original its cause; not on to an exception the policy was
        below = e.__cause__ or e.__context__  # handling (a KeyError's line was shown for `raise KeyboardInterrupt`)
        if not isinstance(below, KeyboardInterrupt):
            break
        e = below
    ours = str(Path(api.__file__).resolve().parents[1]) + os.sep  # the sim package
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(("<frozen", ours))
              and "site-packages" not in f.filename]
    return "".join(traceback.format_list(frames)).rstrip()


# ---- running ------------------------------------------------------------------------------------------------------

class _TimeUp(ServesimStop):
    """The CPU-time budget ran out. A ServesimStop, so that nothing on the way (the policy adapter's wrappers
    among them, which catch every BaseException a user's code raises) turns it into a policy error."""


@contextmanager
def _cpu_budget(seconds: float) -> Iterator[None]:
    """Raise ``_TimeUp`` once this process has used ``seconds`` more CPU time (main thread only: elsewhere the
    budget is not enforced)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _TimeUp

    old = signal.signal(signal.SIGPROF, fire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def _classify(e: BaseException) -> tuple[str, str]:
    """(reason, message) of a run that raised ``e``: the exception and its context chain say what happened."""
    from sim.loop.simulator import StalledError
    from sim.policies.user import PolicyError
    from sim.serving.core import PlanError

    chain: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and len(chain) < 16:
        chain.append(x)
        x = x.__cause__ or x.__context__
    msg = str(e) if isinstance(e, PolicyError) else f"{type(e).__name__}: {e}"
    if any(isinstance(c, MemoryError) for c in chain):
        return "memory", msg
    if any(isinstance(c, StalledError) for c in chain):
        return "stall", msg
    if any(isinstance(c, PlanError) for c in chain):
        return "bad_plan", msg
    if isinstance(e, PolicyError):
        # the adapter's call_user raises PolicyError over the user's own exception (its context); a rule the
        # plan broke raises PolicyError with no exception under it
        user = any(not isinstance(c, PolicyError | ScenarioError) for c in chain[1:])
        return ("exception" if user else "bad_plan"), msg
    return "exception", msg + "\n" + _user_error(e)


def _run_seeds(policy: Any, args: Mapping[str, Any], raw: dict[str, Any], source: str,
               workloads: list[tuple[int, GeneratedWorkload]], out: str | None) -> list[dict]:
    """Each seed's summary (servesim.run's), in the process that runs the user's code. Raises on failure."""
    from sim.api import _quiet
    from sim.config.scenario import parse_scenario, slos_of, variant_configs
    from sim.loop.run import check_workload_fits_policy, simulate_variant
    from sim.metrics.summary import summarize

    obj = _make_policy(policy, args)
    section = dict(raw["policy"], cls=f"python:{type(obj).__qualname__}", instance=obj)
    try:
        sc = parse_scenario({**raw, "policy": section}, source=source, warn_units=False)
    except ScenarioError as e:  # the scenario validated with a stand-in policy: this is the policy's doing
        raise _LoadError("load", str(e)) from None
    (cfg,) = variant_configs(sc)
    slos = slos_of(sc)
    summaries = []
    with _quiet():
        for seed, wl in workloads:
            try:  # a VTC's tenant_weights naming a tenant the workload lacks, as servesim.run refuses it
                check_workload_fits_policy(sc, cfg, wl)
            except ScenarioError as e:
                raise _LoadError("load", str(e)) from None
            # the global generators start from this seed, as servesim.run(seed=seed) starts them
            result, _, _ = simulate_variant(dataclasses.replace(cfg, seed=seed), wl)
            summaries.append(summarize(result, slos))
            if out is not None:
                from sim.output.run_folder import write_run

                write_run(Path(out) / f"seed-{seed}", [result], {result.name: summaries[-1]},
                          scenario=sc.model_copy(update={"seed": seed}).model_dump(mode="json"),
                          title=f"servesim: {sc.name} (seed {seed})")
    return summaries


def _attempt(policy: Any, args: Mapping[str, Any], raw: dict[str, Any], source: str,
             workloads: list[tuple[int, GeneratedWorkload]], out: str | None, time_limit: float,
             worker: bool = False) -> tuple[list[dict] | None, str | None, str | None, float]:
    """(summaries, reason, error, CPU seconds): the run, its failure caught and named. ``worker``: this is a
    worker process, where a KeyboardInterrupt is the policy's own (a Ctrl-C reaches the caller too, and ends
    its call there)."""
    c0 = time.process_time()
    try:
        with _cpu_budget(time_limit):
            summaries = _run_seeds(policy, args, raw, source, workloads, out)
        return summaries, None, None, time.process_time() - c0
    except _TimeUp:
        return None, "timeout", f"the policy's runs took more than the {time_limit:g} s CPU-time budget", \
            time.process_time() - c0
    except _LoadError as e:
        return None, e.reason, str(e), time.process_time() - c0
    except MemoryError:
        return None, "memory", "out of memory (the memory budget)", time.process_time() - c0
    except SystemExit as e:  # sys.exit() in the policy's code
        return None, "exception", f"the policy called sys.exit({e.code!r})", time.process_time() - c0
    except KeyboardInterrupt as e:
        if not worker:
            raise  # Ctrl-C in the caller's own process
        # the worker died of it and the caller read 'crash: exited with status 1 and no result'
        return None, "exception", f"the policy raised KeyboardInterrupt\n{_policy_frames(e)}".rstrip(), \
            time.process_time() - c0
    except Exception as e:
        reason, msg = _classify(e)
        return None, reason, msg, time.process_time() - c0


def _registries() -> tuple[int, ...]:
    """The sizes of what a run reads from registries filled at run time (GPUs, engines, plugins' metrics): they
    only grow, so a kept worker forked before a registration is seen to be stale."""
    from sim.engines.base import engines
    from sim.hardware.gpu import _GPU_ALIASES, GPU_PRESETS
    from sim.metrics.registry import plugin_metrics

    return len(GPU_PRESETS), len(_GPU_ALIASES), len(engines()), len(plugin_metrics())


def _job(payload: tuple[Any, ...], wls: list[GeneratedWorkload]
         ) -> tuple[list[dict] | None, str | None, str | None, float]:
    """``_attempt`` as the kept worker runs it: the workloads come by identity (see sim.studies.eval_worker)."""
    policy, args, raw, source, seeds, out, time_limit = payload
    return _attempt(policy, args, raw, source, list(zip(seeds, wls, strict=True)), out, time_limit, worker=True)


# ---- the call ------------------------------------------------------------------------------------------------------

def _prepare(scenario: str | os.PathLike | Mapping[str, Any], num_requests: int | None,
             set: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any], str, str]:
    """(validated scenario, raw dict, source, base folder) with a stand-in policy where the user's will go, so that
    everything but the policy is checked here, before any user code runs."""
    from sim.api import _overrides, scenario_with
    from sim.policies.queue import QueuePolicy

    overrides: dict[str, Any] = {"policy": {"type": "custom", "cls": "python:QueuePolicy", "instance": QueuePolicy()}}
    overrides.update(_overrides(num_requests, None, set))
    sc, raw, source = scenario_with(scenario, overrides)
    # where a dict's relative paths start (a file's are made absolute as it is read)
    base = os.getcwd() if isinstance(scenario, Mapping) else str(Path(source).resolve().parent)
    if sc.variants or sc.sweep:
        raise ScenarioError(f"{source}: evaluate scores one policy on one deployment: leave out variants and "
                            "sweep (a tournament compares several)")
    return sc, raw, source, base


def _seeds(seeds: int | Iterable[int]) -> tuple[int, ...]:
    # a float or other non-iterable gave "TypeError: 'float' object is not iterable"
    items = (seeds,) if isinstance(seeds, int) else tuple(seeds) if isinstance(seeds, Iterable) else ()
    if not items or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in items):
        raise ScenarioError(f"seeds must be an integer >= 0 or a non-empty list of them, got {seeds!r}")
    if len(set(items)) != len(items):
        raise ScenarioError(f"seeds must be distinct, got {list(items)}")
    return items


def evaluate(
    policy: Any,
    scenario: str | os.PathLike | Mapping[str, Any],
    *,
    seeds: int | Iterable[int] = (0,),
    args: Mapping[str, Any] | None = None,
    num_requests: int | None = None,
    set: Mapping[str, Any] | None = None,
    weights: Mapping[str, float] | str | None = None,
    reference: Mapping[str, float] | None = None,
    time_limit: float = 60.0,
    memory_limit: int = 2048,
    isolate: bool | None = None,
    cache: WorkloadCache | None = None,
    out: str | os.PathLike | None = None,
) -> Scores:
    """Score ``policy`` on ``scenario`` over ``seeds``; see the module docstring.

    ``policy``: a ``servesim.Policy`` object, a class (constructed with ``args``) or source text defining one
    subclass (``args`` likewise). ``scenario``: a YAML file's path or a dict, without variants or sweep; the
    policy becomes its policy section as in ``servesim.run(scenario, policy=obj)`` (limits by ``set``, e.g.
    ``{"policy.max_num_seqs": 16}``). ``num_requests`` and ``set`` as in ``servesim.run``. ``weights`` and
    ``reference``: the fitness, as a tournament spec's ``fitness:`` (sim/studies/tournament.py; weights may also be
    BLIS's ``"key:weight,..."``). ``time_limit``: CPU seconds for all the seeds together; ``memory_limit``: MiB
    the worker may add to the address space it starts with. ``isolate``: run in a forked worker (default where
    the platform forks). ``cache``: the workloads (:data:`DEFAULT_CACHE`).
    ``out``: a folder for scores.json and one run folder per seed; nothing is written without it.
    """
    seed_list = _seeds(seeds)
    out_dir = None if out is None else os.fspath(output_folder(out, "out"))
    fit = fitness_spec(weights, reference)
    if args is not None and not isinstance(args, Mapping):
        raise ScenarioError(f"args must be a mapping of keyword arguments, got {type(args).__name__}")
    for name, value, lo in (("time_limit", time_limit, 0), ("memory_limit", memory_limit, 1)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > lo or not math.isfinite(value):
            raise ScenarioError(f"{name} must be a number > {lo}, got {value!r}")
    if isolate is not None and not isinstance(isolate, bool):  # isolate="no" is truthy: it forked a worker
        raise ScenarioError(f"isolate must be True, False or None (the platform's default), got {isolate!r}")
    if cache is not None and not isinstance(cache, WorkloadCache):
        raise ScenarioError(f"cache must be a servesim.WorkloadCache (or None: the default one), got "
                            f"{type(cache).__name__}")
    if isolate is None:
        isolate = hasattr(os, "fork")
    elif isolate and not hasattr(os, "fork"):
        raise ScenarioError("isolate=True needs os.fork, which this platform lacks; pass isolate=False")
    sc, raw, source, base = _prepare(scenario, num_requests, set)
    cls = policy if isinstance(policy, type | str) else type(policy)
    if getattr(sc.policy, "predictor", None) is None and reads(cls, "predicted_output_len"):
        # read from the code, not run: the policy's code runs in the worker, whose notes would be lost
        warnings.warn(unpredicted_note(None if isinstance(cls, str) else cls.__name__), UserWarning, stacklevel=2)
    store = DEFAULT_CACHE if cache is None else cache
    workloads = [(s, store.get(sc, s, base)) for s in seed_list]
    needs = sorted(_NEEDS_SLOS & {k for k, v in fit.weights.items() if v})
    if needs:
        from sim.config.scenario import slos_of

        if slos_of(sc) is None and not any(r.ttft_slo is not None or r.tpot_slo is not None
                                           for _, wl in workloads for r in wl.requests):
            raise ScenarioError(f"weights use {', '.join(needs)}, which needs SLOs: give "
                                "the scenario slos: {ttft: ..., tpot: ...} (or its classes theirs), or other weights")
    kwargs = dict(args or {})

    def work(worker: bool = True) -> tuple[list[dict] | None, str | None, str | None, float]:
        return _attempt(policy, kwargs, raw, source, workloads, out_dir, float(time_limit), worker)

    if isolate:
        got = None
        if isinstance(policy, str):  # the whole policy travels in the job: the kept worker can run it
            got = KEPT.run(_job, (policy, kwargs, raw, source, seed_list, out_dir, float(time_limit)),
                           [wl for _, wl in workloads], store.values(), float(time_limit), int(memory_limit),
                           keep=lambda done: done[0] is not None, stamp=_registries())
        value, reason, error = got if got is not None else run_forked(work, float(time_limit), int(memory_limit))
        done = (None, reason, error, 0.0) if value is None else value
    else:
        done = work(worker=False)
    scores = _scores(done, seed_list, fit)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "scores.json").write_text(json.dumps(scores.to_dict(), indent=2) + "\n")
    return scores


def _scores(done: tuple[list[dict] | None, str | None, str | None, float], seeds: tuple[int, ...],
            fit: Any) -> Scores:
    summaries, reason, error, cpu = done
    if summaries is None:
        return failed(reason or "crash", error or "", seeds, cpu)
    means: dict[str, Any] = {}
    for key, path in METRICS.items():
        values = []
        for s in summaries:
            v: Any = s
            for part in path:
                v = v.get(part) if isinstance(v, dict) else None  # fairness only where requests name tenants
            values.append(math.nan if v is None else float(v))
        means[key] = math.fsum(values) / len(values)
    return Scores(**means, ok=True, fitness=math.fsum(map(fitness_of, summaries, [fit] * len(summaries))) / len(
        summaries), seeds=seeds, cpu_seconds=cpu, summaries=tuple(summaries))


def fitness_of(summary: dict, fit: Any) -> float:
    """One run's fitness, the tournament's (``sim.studies.tournament.fitness_of``), from its summary."""
    from sim.studies.tournament import FITNESS_KEYS
    from sim.studies.tournament import fitness_of as of_row

    row = {}
    for k in fit.weights:
        col = FITNESS_KEYS[k][0]
        v: Any = summary
        for part in col.removesuffix("_s").split("."):  # sweep.csv names a time's column with _s
            v = v.get(part) if isinstance(v, dict) else None
        row[col] = v
    return float(of_row(row, fit))
