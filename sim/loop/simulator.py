"""The serving loop: SimPy processes for arrivals and for each replica's step loop, whatever executes the steps.

Each replica is a ``ServingCore`` plus an executor (``sim.loop.executor``). Its process asks the core for a batch,
hands it to the executor, waits the step's duration on the SimPy clock, and completes the batch; with nothing to
run it sleeps until a request arrives or the policy's wake time (a batch timeout, an admission deadline) comes.
Arrivals are open loop (the workload's arrival times), closed loop (each user sends its next request a think
time after its previous one ended) or a scripted source (calibration's requests arriving at step numbers).

The executor decides what a step's duration is: a cost model's prediction (``CostExecutor``: the simulator) or
the measured time of the step run on a real model (``realengine.executor.EngineExecutor``: the engine). The clock
is the environment's: ``simpy.Environment`` advances by the durations alone (the simulator, and the engine's
virtual clock), ``simpy.rt.RealtimeEnvironment(strict=False)`` keeps pace with the wall clock (the engine's
live runs). Routers, the autoscaler, closed loops and timed failures are therefore the same code for both.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.core import StopSimulation

from sim.costs.costmodel import CostModel
from sim.loop.executor import CostExecutor, Executor, as_executor
from sim.loop.results import gc_paused
from sim.metrics.request_table import RequestSink
from sim.policies.routers import Router, round_robin
from sim.serving import fast_path
from sim.serving.core import Batch, ServingCore, StalledError
from sim.serving.failures import FailurePlan
from sim.serving.request import Request, RequestSpec, Status
from sim.serving.spec_table import SpecTable
from sim.words import counted


@dataclass(frozen=True, slots=True)
class ClosedLoopPlan:
    """Closed-loop traffic: ``num_users`` users; user u sends the requests whose session_id is u, in id order,
    each ``think_times[id]`` seconds after its previous request ended (the first one at time 0).

    Behind an online front end (sim/costs/online.py), its two halves: ``reply_s``, from the engine's finish to
    the user holding the reply (the user sends ``think`` after that, never before); ``in_server_s(prompt_len)``,
    the API server's time on a request before the engine sees it, one request at a time in send order (the
    simulation then records each request's send time in ``client_sends``)."""

    num_users: int
    think_times: np.ndarray
    reply_s: float = 0.0
    in_server_s: Callable[[int], float] | None = None


class Replica:
    """One serving instance (a GPU or a tensor-parallel group) in the simulation."""

    def __init__(
        self,
        env: simpy.Environment,
        core: ServingCore,
        executor: Executor | CostModel,
        index: int = 0,
        horizon: Callable[[], float] | None = None,
    ) -> None:
        self.env = env
        self.executor = as_executor(executor)
        # what prices or runs this replica's steps (clusters read its peak_flops)
        self.cost = self.executor
        # when the next event from outside this replica can happen (decode stretches are taken in one go
        # up to it); without it every step is its own SimPy event. Only a priced executor can look ahead.
        self.horizon = horizon if isinstance(self.executor, CostExecutor) else None
        self.finishes_are_silent = True  # a completion starts no outside event (False for closed loops)
        # the next outside event is an arrival that only joins the queue, which no one else reads meanwhile
        # (single replica: a router would read this replica's state at the arrival)
        self.overshoot = False
        # with overshoot, also into a step in which members finish (False: a router reads the running set)
        self.overshoot_finish = True
        self.core = core
        core.replica = index  # the core stamps its requests with it
        core.steps.replica = index  # and its steps
        self.index = index
        self._idle: simpy.Event | None = None
        self.closed = False  # no more arrivals will come
        # Requests of this replica that fail mid-flight: a heap of (time, id, request). A server notices a failure
        # between two steps, so each is taken at the first step boundary at or after its time (or at once when
        # the replica idles): the real engine's rule too.
        self.aborts: list[tuple[float, int, Request]] = []
        self.abort_reason = "cancelled by the client"
        self.leak = False  # the bug of the failure-mode scenarios: failed requests' KV blocks are never freed
        # per-request errors (FailurePlan.error_after): id -> output tokens after which the request fails
        self.errors: dict[int, int] = {}
        # checked at every step boundary; True: the run has been halted (see Simulation.halt) and the loop ends
        self.limit: Callable[[], bool] | None = None
        # called after every step this loop completes one by one (not the fast path's: a scripted source that
        # listens runs without it)
        self.step_listeners: list[Callable[[Replica], None]] = []
        self.process = env.process(self._loop())

    def submit(self, req: Request) -> None:
        req.replica = self.index
        self.core.add_request(req, self.env.now)
        self.poke()

    def poke(self) -> None:
        """Wake the step loop if it sleeps."""
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _take_aborts(self, now: float) -> None:
        aborts = self.aborts
        while aborts and aborts[0][0] <= now:
            req = heapq.heappop(aborts)[2]
            if req.outcome is None:  # not finished (or rejected) meanwhile
                self.core.abort(req, now, self.abort_reason, leak=self.leak)

    def _fail_in_step(self, batch: Batch, end: float, failure: str | None) -> None:
        """The step's failures, before it completes: an out-of-memory step fails every request in it (its blocks
        freed); otherwise the requests whose injected error is due fail and the others go on."""
        core = self.core
        if failure is not None:
            for r in batch_requests(batch, core):
                core.abort(r, end, f"out of memory: {failure}")
            return
        errors = self.errors
        for r, _ in batch.plan.scheduled:
            n = errors.get(r.id)
            if n is not None and r.num_output_tokens >= n and r.status is not Status.FINISHED:
                core.abort(r, end, f"injected error after {r.num_output_tokens} output tokens")

    def _loop(self):
        """The step loop. With a horizon (the time of the next event from outside), steps that end before it are
        applied at once, ahead of the SimPy clock, which then catches up in one timeout: nothing outside can
        happen before the horizon, so the results are those of stepping one by one (the tests compare them)."""
        env, core, ex = self.env, self.core, self.executor
        execute, step_flops = ex.execute, ex.step_flops
        priced = isinstance(ex, CostExecutor)
        fast = model = None
        if priced:  # the cost model called directly: what CostExecutor.execute does, without its extra call
            cost = ex.cost
            step_time, shape_flops = cost.step_time, cost.step_flops
            # and the fast path (what CostExecutor.fast_forward and ServingCore.fast_forward call, without them)
            fast, model = fast_path.fast_forward, ex._model
        measured = ex.cost is None  # its steps' clock starts when the loop resumes
        ahead = self.horizon is not None and self.finishes_are_silent
        while True:
            if measured:
                ex.resume()
            t = env.now
            if self.limit is not None and self.limit():
                return
            if self.aborts:
                self._take_aborts(t)
            taken: list[float] = []  # durations of the steps applied ahead of the clock
            inflight = None  # a step that an outside event falls in: it runs on the clock
            overshot = False
            batch = None
            while True:
                horizon = self.horizon() if self.horizon is not None else None
                # the core must ask its policy (as after every arrival): no stretch to take, no call down to learn it
                if fast is not None and horizon is not None and core.group is not None and core.group.members \
                        and core.plan_without_policy(t) is not None:
                    # no overshoot past a pending failure: it must be taken at the first step boundary after it
                    seg = fast(core, t, horizon, model, finishes=self.finishes_are_silent,
                               overshoot=self.overshoot and not self.aborts, overshoot_finish=self.overshoot_finish)
                    if seg is not None:
                        taken += seg[0]
                        t = seg[1]
                        if core.overshot:
                            overshot = True
                            break
                        if not ahead:
                            break
                        continue
                batch = core.schedule(t)
                if batch is None:
                    break
                if priced:
                    shape = batch.shape
                    duration = float(step_time(shape))
                    flops = float(shape_flops(shape))
                else:
                    duration = float(execute(batch))
                    flops = float(step_flops(batch))
                end = t + duration
                if ahead and end < horizon:
                    core.complete(batch, end, flops)
                    taken.append(duration)
                    t = end
                    continue
                inflight = (batch, duration, flops, ex.failure)
                break
            if taken:  # let the clock catch up, landing on exactly the float stepping one by one would
                delay = t - env.now
                if env.now + delay == t:
                    yield env.timeout(delay)
                else:
                    for d in taken:
                        yield env.timeout(d)
                if overshot:  # the last step's row must show the queue at its end, arrivals included
                    core.steps.set_last_waiting(len(core.waiting))
            if inflight is not None:
                batch, duration, flops, failure = inflight
                yield env.timeout(duration)
                if failure is not None or self.errors:
                    self._fail_in_step(batch, env.now, failure)
                core.complete(batch, env.now, flops)
                for listener in self.step_listeners:
                    listener(self)
                continue
            if overshot or taken:
                continue
            if self.closed and not core.has_work:
                return
            self._idle = env.event()
            wake = core.wake_time(env.now) if core.has_work else None
            if wake is not None and wake > env.now:
                yield env.any_of([self._idle, env.timeout(wake - env.now)])
            else:
                yield self._idle
            self._idle = None


def batch_requests(batch: Batch, core: ServingCore) -> list[Request]:
    """The requests a step works for: those it computes tokens for (the decode group's members too, when the
    step ran the group) and those it swaps back in."""
    seen = {r.id: r for r, _ in batch.plan.scheduled}
    if batch.group_size and core.group is not None:
        for r in list(core.group.members.values()):
            seen.setdefault(r.id, r)
    for r in batch.plan.swap_in:
        seen.setdefault(r.id, r)
    return list(seen.values())


ArrivalSource = Callable[["Simulation"], Generator[simpy.Event, object, None]]


class Simulation:
    """Wire a workload to replicas and run it to the end (every request completed, rejected or failed).

    ``cores_and_costs``: one (core, executor) pair per replica; a cost model is taken as a ``CostExecutor``.
    ``env``: the clock (default ``simpy.Environment``: simulated time; a ``simpy.rt.RealtimeEnvironment`` keeps
    pace with the wall clock). ``limit``: asked at every step boundary; a reason (a string) halts the run there
    (``halt``). ``arrivals``: a process of its own instead of the open or closed loop (it sends with ``send``
    and ends with ``close_arrivals``). ``failures``: cancellations (timed), per-request errors (token-indexed:
    these are checked step by step, so they turn the fast path off).
    """

    def __init__(
        self,
        specs: Sequence[RequestSpec],
        cores_and_costs: Sequence[tuple[ServingCore, Executor | CostModel]],
        *,
        closed_loop: ClosedLoopPlan | None = None,
        router: Router | None = None,
        progress: Callable[[int, float], None] | None = None,  # (requests finished, simulated now)
        fast_forward: bool = True,
        failures: FailurePlan | None = None,
        leak: bool = False,
        env: simpy.Environment | None = None,
        limit: Callable[[], str | None] | None = None,
        arrivals: ArrivalSource | None = None,
        sink: RequestSink | None = None,
    ) -> None:
        self.env = env if env is not None else simpy.Environment()
        # finished requests go there (a long run's, as columns) and leave memory: ``requests`` stays empty
        self.sink = sink
        self._sent = 0  # requests dispatched
        if sink is not None:
            sink.on_flush.append(self._forget_done)
        self._limit = limit
        self.halted: str | None = None  # the reason the run was halted, if it was
        self._errors = dict(failures.error_after) if failures is not None else {}
        if self._errors:
            fast_forward = False  # a per-request error is checked at the end of every step
        # a long workload's SpecTable stays columns: each spec is made as it is sent (sim/serving/spec_table.py)
        self.specs = specs if isinstance(specs, SpecTable) else list(specs)
        self._next_arrival = float("inf")
        self._timers: list[float] = []  # pending closed-loop sends and API server hand-overs (a heap of times)
        self.client_sends: dict[int, float] = {}  # request id -> its user's send (closed loop behind a front end)
        self._server_free = 0.0  # when the closed loop's API server is done with the requests sent so far
        self.router = router or round_robin()
        self.closed_loop = closed_loop
        self.progress = progress
        self.requests: list[Request] = []
        self._finished = 0
        self._fast_forward = fast_forward
        self._failures = failures
        self._leak = leak
        self._fail_after = failures.cancel_after if failures is not None else {}
        self.replicas: list[Replica] = []
        for core, cost in cores_and_costs:
            self._add_replica(core, cost)
        if len(self.replicas) == 1 and self._single_replica:
            # the next outside event is an arrival that only joins the queue, which no router reads
            self.replicas[0].overshoot = True
        if arrivals is not None:
            self.env.process(arrivals(self))
        elif closed_loop is None:
            self.env.process(self._open_loop())
        else:
            # only the users that have a request are started: a user past the last session id would only end
            # at t=0, and a process per user made 10^7 users with 20 requests take minutes and 7.4 GB
            users = min(closed_loop.num_users, 1 + max((s.session_id or 0 for s in self.specs), default=0))
            self._user_queues: list[list[RequestSpec]] = [[] for _ in range(users)]
            for s in sorted(self.specs, key=lambda s: s.id):
                self._user_queues[s.session_id or 0].append(s)
            self._user_pos = [0] * users
            self._pending_users = users
            for u in range(users):
                heapq.heappush(self._timers, 0.0)
                self.env.process(self._user_send(u, 0.0))

    # A cluster (sim/loop/cluster.py) sets this False: its routers and autoscaler read replicas at outside events,
    # so no replica may take a step past one, even while it is the only replica.
    _single_replica = True
    replica_class: type[Replica] = Replica  # a cluster may run its replicas' loops its own way (sim.loop.cluster_fast)

    def _add_replica(self, core: ServingCore, cost: Executor | CostModel) -> Replica:
        """A new replica wired to this simulation (its step loop starts at the current time)."""
        rep = self.replica_class(self.env, core, cost, len(self.replicas),
                                 self._horizon if self._fast_forward else None)
        rep.leak = self._leak
        if self._errors and core.group is not None:
            # the decode group advances its members in aggregate: their token counts are not at hand per step
            raise ValueError("per-request errors (failures.error_after) are checked request by request: "
                             "build the core with fast_path=False")
        rep.errors = self._errors
        if self._limit is not None:
            rep.limit = self._check_limit
        if self._failures is not None:
            rep.abort_reason = self._failures.cancel_reason
        core.on_finish = self._on_finish
        rep.finishes_are_silent = self.closed_loop is None
        self.replicas.append(rep)
        return rep

    def send(self, spec: RequestSpec) -> None:
        """An arrival source's request arrives now (routed to a replica)."""
        self._dispatch(spec)

    def close_arrivals(self) -> None:
        """An arrival source has sent its last request."""
        self._close()

    def _check_limit(self) -> bool:
        if self.halted is None:
            reason = self._limit() if self._limit is not None else None
            if reason is not None:
                self.halt(reason)
        return self.halted is not None

    def halt(self, reason: str) -> None:
        """End the run now: every request in flight on every replica fails with ``reason`` (its blocks freed),
        requests not sent yet are dropped, and ``run`` returns once the current instant's events are done."""
        if self.halted is not None:
            return
        self.halted = reason
        now = self.env.now
        for rep in self.replicas:
            core = rep.core
            for r in list(core.waiting) + list(core.running) + list(core.swapped):
                core.abort(r, now, reason)
        stop = self.env.event()
        stop.callbacks.append(StopSimulation.callback)  # what env.run(until=...) does: run() returns there
        stop.succeed()

    def _dispatch(self, spec: RequestSpec) -> None:
        if self.halted is not None:
            return  # the run has ended: nothing more is sent
        req = Request(spec, self.env.now)  # (spec, arrival)
        self._sent += 1
        if self.sink is None:
            self.requests.append(req)
        serving = self._routable()
        rep = serving[self.router(req, serving)]
        delay = self._fail_after.get(req.id)
        if delay is not None:  # on the heap before the replica runs: its horizon must see it at once
            heapq.heappush(rep.aborts, (self.env.now + delay, req.id, req))
            self.env.process(self._wake_at(rep, delay))
        rep.submit(req)

    def _routable(self) -> list[Replica]:
        """The replicas a router may choose from (a cluster leaves out provisioning and draining ones)."""
        return self.replicas

    def _wake_at(self, rep: Replica, delay: float):
        yield self.env.timeout(delay)
        rep.poke()  # an idle replica takes the failure now; a busy one at the end of its step

    def _close(self) -> None:
        for rep in self.replicas:
            rep.closed = True
            rep.poke()

    def _horizon(self) -> float:
        """The earliest time at which something from outside can reach a replica."""
        if self.closed_loop is not None:
            if len(self.replicas) > 1:
                return self.env.now  # another replica's finish can start a send at any time
            nxt = self._timers[0] if self._timers else float("inf")
        else:
            nxt = self._next_arrival
        if self._fail_after:
            for rep in self.replicas:
                if rep.aborts and rep.aborts[0][0] < nxt:
                    nxt = rep.aborts[0][0]
        return nxt

    def _open_loop(self):
        env = self.env
        # a SpecTable is in (arrival, id) order already (ids follow arrival), and sorting it would make every spec
        ordered = iter(self.specs if isinstance(self.specs, SpecTable)
                       else sorted(self.specs, key=lambda s: (s.arrival, s.id)))
        spec = next(ordered, None)
        while spec is not None:
            self._next_arrival = spec.arrival
            if spec.arrival > env.now:
                yield env.timeout(spec.arrival - env.now)
            following = next(ordered, None)
            self._next_arrival = following.arrival if following is not None else float("inf")
            self._dispatch(spec)
            spec = following
        self._next_arrival = float("inf")
        self._close()

    def _user_send(self, user: int, delay: float):
        # the caller has already put now + delay on the timer heap (the horizon must see it at once, before
        # this process first runs)
        if delay > 0:
            yield self.env.timeout(delay)
        heapq.heappop(self._timers)
        queue = self._user_queues[user]
        pos = self._user_pos[user]
        if pos >= len(queue):
            self._pending_users -= 1
            if self._pending_users == 0:
                self._close()
            return
        self._user_pos[user] = pos + 1
        spec = queue[pos]
        in_server = self.closed_loop.in_server_s if self.closed_loop is not None else None
        if in_server is None:
            self._dispatch(spec)
            return
        # the API server takes the requests one at a time in the order they were sent (the open loop's rule,
        # sim/costs/online.py's to_engine); this process runs at the send, so the sends come in time order
        now = self.env.now
        self.client_sends[spec.id] = now
        delay = max(now, self._server_free) + in_server(spec.prompt_len) - now
        self._server_free = at = now + delay  # the float SimPy's clock will read at the hand-over
        heapq.heappush(self._timers, at)  # the horizon sees it before the replica runs on
        self.env.process(self._to_engine(spec, delay))

    def _to_engine(self, spec: RequestSpec, delay: float):
        yield self.env.timeout(delay)
        heapq.heappop(self._timers)
        self._dispatch(spec)

    def _forget_done(self) -> None:
        """The sink holds the finished requests now: the cores need not (``ServingCore.done``)."""
        for rep in self.replicas:
            rep.core.done.clear()

    def _on_finish(self, req: Request) -> None:
        self._finished += 1
        if self.sink is not None:
            self.sink.add(req)
        if self.progress is not None:
            self.progress(1, req.finish)  # (the fast path runs ahead of env.now)
        if self.closed_loop is not None:
            user = req.spec.session_id or 0
            # the user holds the reply reply_s after the engine's finish, and thinks from there
            wait = self.closed_loop.reply_s + float(self.closed_loop.think_times[req.id])
            heapq.heappush(self._timers, self.env.now + wait)
            self.env.process(self._user_send(user, wait))

    def run(self) -> None:
        with gc_paused():
            self.env.run()
        if self.halted is not None:
            return  # requests in flight failed; unsent ones were dropped
        if self.sink is None:  # the requests are at hand
            unfinished = sum(1 for r in self.requests if r.outcome is None)
            sent = len(self.requests)
        else:  # they left as they finished: count them
            unfinished, sent = self._sent - self._finished, self._sent
        if unfinished or sent != len(self.specs):
            it = "it" if unfinished + len(self.specs) - sent == 1 else "them"  # one request stalled: "them" said
            raise StalledError(
                f"simulation stalled: {counted(unfinished, 'request')} without outcome, "
                f"{len(self.specs) - sent} never sent (a policy never schedules {it}?){self._too_long_to_run()}"
                f"{self._kv_full()}"
            )

    def _kv_full(self) -> str:
        """Why a stalled run's running requests never finished: none has a free block for its next token, so a
        policy that preempts nobody waits for blocks no request will give back."""
        for rep in self.replicas:
            kv, running = rep.core.kv, rep.core.running
            if running and all(kv.blocks_needed(r, 1) > kv.num_free_blocks for r in running):
                return (f"; {counted(len(running), 'running request')} {'holds' if len(running) == 1 else 'hold'} "
                        f"{kv.num_used_blocks} of {kv.num_blocks} KV blocks and none has a free block for its next "
                        "token: a policy that never preempts (plan.preempt) stops when the KV cache fills")
        return ""

    def _too_long_to_run(self) -> str:
        """Why a stalled run's waiting requests may never have been scheduled: prompts longer than the step's token
        budget, which a policy that does not chunk prompts can never run whole (a custom QueuePolicy with chunking
        off keeps the budget a chunking policy gets, 8192 tokens, and skipped such a prompt, silently)."""
        for rep in self.replicas:
            limit = rep.core.limits.max_num_batched_tokens
            long = [r for r in rep.core.waiting if r.prompt_len - r.num_computed_tokens > limit]
            if long:
                have, them = ("has", "it") if len(long) == 1 else ("have", "them")
                return (f"; {counted(len(long), 'waiting request')} {have} more prompt tokens left than "
                        "max_num_batched_tokens "
                        f"({limit}): a policy that does not chunk prompts never fits {them} in a step (raise "
                        f"max_num_batched_tokens, or chunk {them})")
        return ""
