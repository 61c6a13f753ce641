"""The serving core: request queues, the KV manager and a policy, stepped by an executor.

Over 600 lines because ServingCore owns every state change of a step (admission, preemption, KV, completion).

An executor (the SimPy simulator, or the real engine on a wall clock) drives it with two calls per step::

    batch = core.schedule(now)          # ask the policy, check its plan, apply allocation; None: nothing to run
    ...execute the batch for some duration...
    core.complete(batch, end)            # advance the requests, sample tokens, finish, record the step

The core owns every state change, so both executors share one scheduler and differ only in timing.

Fast path (the simulator's; the real engine turns it off because it needs every request every step). Running
requests that decode join a ``DecodeGroup`` and are stepped in aggregate; a policy that knows the group plans
it with one flag (``Plan.decode_group``) instead of one entry per request. When nothing can change the
policy's answer (no arrival, no finish, no block shortage, no deadline; see ``sim.policies.base``) the core
repeats the last plan without asking (``plan_without_policy``), and ``fast_forward`` (``sim.serving.fast_path``) takes a
whole stretch of such steps at once. The results are identical to stepping one by one; the tests check it byte
for byte.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.costs.costmodel import CostModel, StepShape
from sim.engines.sched import graph_padding
from sim.metrics.gap_pool import merge_pooled
from sim.metrics.records import GapLog, StepLog
from sim.policies.base import Admission, Plan, Policy, View
from sim.serving import fast_path
from sim.serving.contiguous_allocator import ContiguousAllocator
from sim.serving.decode_group import DecodeGroup
from sim.serving.fast_path import STEADY_PLAN
from sim.serving.kv_manager import BlockError, KVManager, cdiv
from sim.serving.request import Outcome, Request, Status
from sim.serving.spec_decode import SpecDecoder
from sim.words import counted

# The enums' members as module constants: ``Status.RUNNING`` goes through the enum class's attribute look-up,
# about ten times a global's (230 against 22 ns, timeit), and the step reads several a request
_WAITING, _RUNNING, _SWAPPED, _FINISHED = Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.FINISHED
_COMPLETED, _REJECTED, _FAILED = Outcome.COMPLETED, Outcome.REJECTED, Outcome.FAILED


class StalledError(RuntimeError):
    """The run cannot end: requests never get an outcome, because the policy left work waiting while nothing else
    could happen (nothing running, no arrival or timer to come), or because it keeps the loop going without ever
    letting a request finish (``ServingCore.schedule``'s progress check)."""


# Asks of the policy between looks at whether the run moved on since the last look (a request arrived, was first
# scheduled, generated a token or ended, or more prompt tokens are computed than ever in the stretch); a
# policy under which none of that happens is stopped once the asks without it pass 4x the tokens its queues still
# need plus this many (each step computes a token at least, so a policy that keeps what it computes finishes a request
# well within that) and a stretch of _STALL_S simulated seconds has gone by: a policy looking every millisecond while
# it holds a partial batch until it fills or times out, or a request until a rate limit lets it in, is waiting on the
# clock, not stuck (one holding 5 short requests for a batch of 8 was stopped after 8,192 asks, 8.2 s). A policy
# that polls so often that the asks reach _STALL_ASKS first is stopped then (about 25 s of CPU). The clock's
# grace is for a policy that waits, which computes nothing: one whose steps computed more than 4x the tokens its
# queues still need plus _STALL_TOKENS in the stretch is taking back what it computes (a recompute after a
# preemption needs no more than those tokens before a token comes), and is stopped at the next look whatever the
# clock says. The real engine looks every ENGINE_LOOK_EVERY asks (a step there is a forward pass): a policy taking
# back the same request forever on the tiny CPU model was stopped after 90,112 asks and 3.6 minutes of wall time.
_PROGRESS_EVERY = 4096
ENGINE_LOOK_EVERY = 64
_STALL_S = 60.0
_STALL_ASKS = 1 << 20
_STALL_TOKENS = 64


class PlanError(RuntimeError):
    """A policy returned a plan that breaks the limits or the state machine: a bug in the policy."""

    at: float | None = None  # the time of the step it planned, which the run's error names (run.policy_errors)


@dataclass(slots=True)
class Batch:
    """One step: the plan being executed and the shape the executor prices or runs."""

    plan: Plan
    shape: StepShape
    start: float
    num_rows: int  # rows computed, padding included
    num_scheduled: int  # requests computing tokens (padding rows excluded)
    prefill_tokens: int
    decode_tokens: int
    padding_tokens: int
    swap_blocks: int
    num_preempted: int
    num_rejected: int
    group_size: int = 0  # decode-group members computing one token each (part of num_scheduled)
    group_blocks: int = 0  # blocks the group took for this step
    # KV moved by this step's swaps, as the block manager decided it: (request id, GPU blocks) copied out to CPU
    # before the blocks are reused, and (request id, GPU blocks) filled from CPU. The real engine copies these.
    swapped_out: list[tuple[int, list[int]]] | None = None
    swapped_in: list[tuple[int, list[int]]] | None = None
    # speculative decoding (sim.serving.spec_decode): request id -> draft tokens its row verifies this step
    drafts: dict[int, int] | None = None


@dataclass(slots=True)
class CoreStats:
    num_preemptions: int = 0
    num_swaps: int = 0
    num_rejected: int = 0
    num_failed: int = 0
    num_completed: int = 0


class ServingCore:
    def __init__(
        self,
        policy: Policy,
        kv: KVManager,
        *,
        fast_path: bool = True,
        keep_token_times: bool = False,
        record_plans: bool = False,
        replica: int = 0,
        spec: SpecDecoder | None = None,
        look_every: int = _PROGRESS_EVERY,
        stop_waiting: bool = True,
    ) -> None:
        self.policy = policy
        # speculative decoding: rows draft and verify several tokens a step, which the decode group's one token
        # per member cannot express, so the fast path is off
        self.spec = spec
        if spec is not None:
            fast_path = False
        self.kv = kv
        self.limits = policy.limits
        self.keep_token_times = keep_token_times
        self.replica = replica
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self.swapped: deque[Request] = deque()
        self.done: list[Request] = []  # requests with an outcome, in the order they got it
        self.busy_time = 0.0  # seconds of steps completed (an autoscaler's "GPU busy" reads its growth)
        self.flops_done = 0.0  # FLOPs of those steps (its "compute utilisation")
        self.last_end = 0.0  # end of the last step: a step that starts later follows an idle period
        self.steps = StepLog()
        self.gaps = GapLog()
        self.stats = CoreStats()
        # the progress check (schedule): asks so far, the ask of the next look, requests that arrived; at the last
        # look that moved on: what had happened then (_moved), the most prompt tokens computed since, its ask, time
        # and the tokens the steps had computed by then (_stuck_tokens; _tokens_run: all the steps' tokens so far)
        self._look_every = look_every
        # False: a policy that waits (plans nothing, asks to be woken) is never stopped here, only one that takes back
        # what it computes: serve's --stall-timeout fails the waiting requests and goes on serving, where this rule,
        # for a run that must end, stopped the whole server on the same 60 s (realengine/server.py)
        self._stop_waiting = stop_waiting
        self._asks, self._next_look, self._arrived = 0, look_every, 0
        self._moved: tuple[int, ...] = ()
        self._most_computed, self._stuck_since, self._stuck_since_t = 0, 0, 0.0
        self._tokens_run = self._stuck_tokens = 0
        self.kv_tokens = 0  # tokens held in GPU KV by running requests
        self.filled_blocks = 0  # sum over running requests of ceil(computed / block_size)
        self.plans: list[tuple[tuple[int, int], ...]] | None = [] if record_plans else None
        # optional callback(request), e.g. a closed-loop user sending its next request
        self.on_finish: Callable[[Request], object] | None = None
        # more callbacks(request), e.g. the real engine releasing its state
        self.finish_listeners: list[Callable[[Request], object]] = []
        # The policy's optional members, read once. Their defaults are the ones ``Policy`` declares; a policy that
        # implements the protocol without subclassing it may lack them.
        self.admission: Admission | None = getattr(policy, "admission", Policy.admission)
        # The decode group exists only for a policy that plans it (``uses_decode_group``) and with the fast path.
        self.group: DecodeGroup | None = None
        if fast_path and getattr(policy, "uses_decode_group", Policy.uses_decode_group):
            self.group = DecodeGroup(kv.block_size, kv.grows_on_decode, keep_token_times)
        # A group-aware policy that, with nothing waiting or swapped and every running request decoding,
        # schedules exactly the group: the core may then step without asking it.
        self.steady_ok = bool(getattr(policy, "decode_all_when_idle", Policy.decode_all_when_idle))
        # The policy's quick plan for a step with nothing swapped (``Policy.schedule_arrival``): the step after nearly
        # every arrival, and prefill-first's step after each prompt, which the general ``schedule`` costs some 8 us
        # to plan
        quick = getattr(policy, "schedule_arrival", None) if self.group is not None else None
        self.schedule_arrival = None if getattr(type(policy), "schedule_arrival", None) is Policy.schedule_arrival \
            else quick  # (the protocol's own says None every time: not worth a call)
        # A policy that declares its decision changes only with arrivals and finishes (``UserPolicy.may_repeat``,
        # from the public ``depends_on``): after it planned a step in which every running request decoded one token
        # and nothing else happened, the core may take such steps without asking until something changes.
        self.may_repeat = bool(getattr(policy, "may_repeat", False))
        self.all_decode = False  # the policy's last plan was such a step (reset by arrivals, finishes, asking)
        self._admit_seq = 0
        # vLLM 0.6 multi-step (sim/engines/sched.py): decode-only steps come in blocks of this many
        self.multi_step = int(getattr(policy, "num_scheduler_steps", 1))
        self.decode_run = 0  # consecutive decode-only steps just taken
        self.graph_sizes: tuple[int, ...] = tuple(getattr(policy, "cudagraph_capture_sizes", ()))
        self._dirty = True  # something the policy has not seen happened (arrival, finish, abort, join)
        # What the fast path (sim.serving.fast_path) reads and updates besides the queues and counters:
        self.repeatable: Plan | None = None  # a group-only plan the policy would give again
        self.policy_deadline: float | None = None  # the policy's wake time when it last planned
        self.overshot = False  # the last fast_forward took the step during which its horizon fell
        # running requests outside the decode group, in admission order (the same list as running without one)
        self.outside: list[Request] = [] if self.group is not None else self.running
        self._view = View(0.0, self.waiting, self.running, self.swapped, kv, self.limits, self.group, self.outside)
        self._view.ungroup = self.ungroup

    # ---- inputs ------------------------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> bool:
        """A request arrives. The policy's admission control may refuse it at once (too long for
        ``max_model_len``, larger than the whole KV cache, queue full): it then ends ``rejected``."""
        req.replica = self.replica
        self._arrived += 1
        if self.keep_token_times and req.token_times is None:
            req.token_times = []
        self._dirty = True
        admission = self.admission
        if admission is not None:
            self._view.now = now
            reason = admission.on_arrival(req, self._view)
            if reason is not None:
                self.stats.num_rejected += 1
                self._finish(req, now, _REJECTED, reason)
                return False
        req.status = _WAITING
        self.waiting.append(req)
        return True

    def abort(self, req: Request, now: float, reason: str, *, leak: bool = False) -> None:
        """End a request mid-flight with outcome ``failed`` (client disconnect, error). ``leak=True`` keeps its
        KV blocks allocated forever: the bug the failure-mode scenarios show. If a step is in flight, the
        request simply gets nothing more from it."""
        if req.status is _FINISHED:
            return
        self._dirty = True
        if req.status is _RUNNING:
            self._leave_running(req)
            if not leak:
                self._drop_kv(req)
            else:  # the blocks stay allocated; the tokens no longer count as useful
                self.kv_tokens -= req.num_computed_tokens
                self.filled_blocks -= cdiv(req.num_computed_tokens, self.kv.block_size)
        elif req.status is _SWAPPED:
            self.swapped.remove(req)
            self.kv.drop_swapped(req)
        else:
            self.waiting.remove(req)
        self._finish(req, now, _FAILED, reason)

    # ---- queries -----------------------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def wake_time(self, now: float) -> float | None:
        self._view.now = now
        return self.policy.wake_time(self._view)

    def itl_gaps(self, pooled: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap so far as (gap seconds, tokens that saw it) pairs: those ``complete`` recorded
        and those of the decode fast path's runs, which the step log holds (``StepLog.group_gaps``). ``pooled``:
        ``pooled_gaps`` of them, each kind pooled as it is read and the two merged (a long run's pairs are never
        all held at once)."""
        if pooled:
            return merge_pooled(*self.gaps.pooled(), *self.steps.group_gaps(pooled=True))
        gaps, counts = self.gaps.arrays()
        run_gaps, run_counts = self.steps.group_gaps()
        return np.concatenate([gaps, run_gaps]), np.concatenate([counts, run_counts])

    def view(self, now: float) -> View:
        """The policy's view, every request up to date (the decode group dissolved)."""
        self.ungroup()
        self._view.now = now
        return self._view

    def ungroup(self) -> None:
        """Bring every decode-group member up to date and out of the group."""
        if self.group is not None and self.group.members:
            self.group.dissolve()
            self.outside[:] = self.running
            self.repeatable = None

    # ---- the step ----------------------------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        self._asks += 1
        if self._asks >= self._next_look:
            self._look_for_progress(now)
        if not self.running and (self.waiting or self.swapped):
            self._reject_unservable(now)
        catch_up = False
        plan = self.plan_without_policy(now)
        if plan is None:
            self._view.now, self._view.decode_run = now, self.decode_run
            if self.schedule_arrival is not None and not self.swapped:
                plan = self.schedule_arrival(self._view)
            if plan is None:
                plan = self.policy.schedule(self._view)
            self._dirty = False
            self.policy_deadline = self.policy.wake_time(self._view) if self.group is not None else None
            only_group = plan.decode_group and not (plan.scheduled or plan.preempt or plan.swap_in or plan.reject)
            self.repeatable = plan if only_group else None
            self.all_decode = self.may_repeat and self._all_decode(plan)
            catch_up = self.may_repeat and not self.all_decode
        try:  # (costs nothing in the hot path until it catches)
            batch = self._apply(plan, now)
        except PlanError as e:
            e.at = now  # the step the refused plan was for
            raise
        if catch_up:
            # Nothing left waiting and every request brought up to its next token: from the next step on all of them
            # decode, which the policy (deciding only at arrivals and finishes) keeps doing.
            self.all_decode = batch is not None and self._catches_up_all(batch)
        return batch

    def _look_for_progress(self, now: float) -> None:
        """Stop a run whose policy keeps the loop going but never lets it move on: one that plans nothing while
        asking to be woken again (wake_time), or one that takes back what it planned (admits, then preempts, forever).
        Both ran until killed; a policy that plans nothing and asks nothing is caught when the run ends."""
        self._next_look = self._asks + self._look_every
        s = self.stats
        ended = (s.num_completed + s.num_rejected + s.num_failed, self._arrived)
        if ended != self._moved[:2] or not self.has_work:  # the usual case, told without walking the queues
            self._moved, self._most_computed, self._stuck_since, self._stuck_since_t = ended, -1, self._asks, now
            self._stuck_tokens = self._tokens_run
            return
        queued = [*self.waiting, *self.running, *self.swapped]
        # taking back what it planned computes the same tokens again: only more than ever before in the stretch counts
        computed = sum(r.num_computed_tokens for r in queued)
        moved = (*ended, sum(r.first_scheduled >= 0 for r in queued), sum(r.num_output_tokens for r in queued))
        if self._most_computed < 0:  # the first look at the queues in this stretch: what it measures from
            self._moved, self._most_computed = moved, computed
        elif moved != self._moved or computed > self._most_computed:
            self._moved, self._most_computed, self._stuck_since, self._stuck_since_t = moved, computed, self._asks, now
            self._stuck_tokens = self._tokens_run
            return
        left = sum(r.max_len - r.num_computed_tokens for r in queued)
        asks, thrown = self._asks - self._stuck_since, self._tokens_run - self._stuck_tokens
        waited = self._stop_waiting and asks > 4 * left + _PROGRESS_EVERY and \
            (now - self._stuck_since_t > _STALL_S or asks > _STALL_ASKS)
        if thrown > 4 * left + _STALL_TOKENS and not waited:
            raise StalledError(
                f"stalled at t={now:.6f} s: over the last {asks} asks of the policy its steps computed {thrown} tokens "
                "and it took them back (preempted them) before any request arrived, started, generated a token or "
                f"ended, with {counted(len(queued), 'request')} in its queues ({len(self.running)} running) needing "
                f"{counted(left, 'token')} (a policy that preempts what it admitted before it yields a token never "
                "lets a request finish)")
        if waited:
            raise StalledError(
                f"simulation stalled at t={now:.6f} s: no request arrived, started, generated a token or ended over "
                f"the last {asks} asks of the policy ({now - self._stuck_since_t:.1f} s), with "
                f"{counted(len(queued), 'request')} in its queues ({len(self.running)} running) needing "
                f"{counted(left, 'token')} (a policy that plans nothing but asks to be woken again, or takes back what "
                "it planned, never lets a request finish; a policy waiting on the clock for longer returns the time it "
                "waits for from wake_time(view), rather than asking again every few milliseconds)")

    def _catches_up_all(self, batch: Batch) -> bool:
        """Whether the step just applied leaves nobody waiting or swapped and computes every running request up
        to its next sampled token (prompts whole, nothing preempted or rejected)."""
        plan = batch.plan
        if self.waiting or self.swapped or plan.preempt or plan.reject or plan.padded_rows or plan.pad_to_longest:
            return False
        if batch.num_scheduled != len(self.running):
            return False
        return all(r.num_computed_tokens + n == r.prompt_len + r.num_output_tokens for r, n in plan.scheduled)

    def _all_decode(self, plan: Plan) -> bool:
        """Whether ``plan`` runs every running request for one decode token and does nothing else."""
        if plan.preempt or plan.swap_in or plan.reject or plan.padded_rows or plan.pad_to_longest:
            return False
        if len(plan.scheduled) + (len(self.group.members) if plan.decode_group and self.group else 0) \
                != len(self.running):
            return False
        return all(n == 1 and r.status is _RUNNING and r.num_remaining == 1 for r, n in plan.scheduled)

    def plan_without_policy(self, now: float) -> Plan | None:
        """The plan the policy is certain to give, when it need not be asked: only the decode group runs."""
        g = self.group
        if g is None or self._dirty:
            return None
        size = len(g.members)
        if not size or size != len(self.running):
            return None
        if now != g.prev_end or (self.policy_deadline is not None and now >= self.policy_deadline):
            return None  # the executor idled, or a deadline passed: let the policy look
        if g.grows and not self.kv.can_grow(len(g.buckets[g.steps % g.block_size])):  # the next step's blocks
            return None  # a block shortage: the policy decides whom to preempt
        if self.multi_step > 1 and not self.decode_run % self.multi_step and (self.waiting or self.swapped):
            return None  # a multi-step block ends: the policy may start a prompt
        if self.repeatable is not None:
            return self.repeatable
        if self.all_decode or (self.steady_ok and not self.waiting and not self.swapped):
            if size <= self.limits.max_num_seqs and size <= self.limits.max_num_batched_tokens:
                return STEADY_PLAN
        return None

    def complete(self, batch: Batch, end: float, flops: float = 0.0) -> list[Request]:
        """Advance the batch's requests to the end of the step; returns those that completed."""
        bs = self.kv.block_size
        finished: list[Request] = []
        g = self.group
        if batch.group_size:
            assert g is not None  # _apply checked it
            if batch.group_blocks:
                self.filled_blocks += batch.group_blocks
            size = len(g.members)
            self.kv_tokens += size
            self.gaps.add(end - g.prev_end, size)
            finished = g.advance(end)
        joiners: list[Request] = []
        gaps = self.gaps
        drafts, spec = batch.drafts, self.spec
        for r, n in batch.plan.scheduled:
            if r.status is not _RUNNING:
                continue  # aborted during the step
            if drafts and spec is not None and r.id in drafts:  # accepted drafts: output tokens with their KV
                n += spec.emit(r, drafts[r.id], end)
            c0 = r.num_computed_tokens
            c1 = c0 + n
            r.num_computed_tokens = c1
            self.kv_tokens += n
            self.filled_blocks += (-c0 // bs) - (-c1 // bs)  # blocks c1 tokens fill less those c0 filled
            if c1 == r.prompt_len + r.num_output_tokens:  # caught up: sample one token
                r.num_output_tokens += 1
                if r.first_token < 0:
                    r.first_token = end
                else:
                    gaps.add(end - r.last_token)
                r.last_token = end
                if r.token_times is not None:
                    r.token_times.append(end)
                if r.num_output_tokens == r.output_len:
                    finished.append(r)
                elif g is not None:
                    joiners.append(r)
        self._record(batch, end, flops)
        if finished:
            # Room was freed: a policy with requests waiting must look again. With nothing waiting, the steady
            # plan (the group decodes) is what it would say, so no need to ask.
            self.repeatable = None
            if self.waiting or self.swapped:  # a finish frees room for them: the policy decides (``depends_on``)
                self.all_decode = False
            if batch.group_size and batch.plan.scheduled:
                finished.sort(key=_admit_order)  # the order stepping one by one would finish them in
            for r in finished:
                self.retire(r, end)
        if joiners and g is not None and (not g.members or g.prev_end == end):
            g.prev_end = end
            outside = self.outside
            for r in joiners:
                g.join(r)
                outside.remove(r)
            self.repeatable = None
        return finished

    def retire(self, r: Request, end: float) -> None:
        """``r`` sampled its last token at ``end``: it leaves the running set, its KV is freed, it completes."""
        self._leave_running(r)
        self._drop_kv(r)
        self._finish(r, end, _COMPLETED, "")

    def fast_forward(
        self, now: float, horizon: float, cost: CostModel, *, finishes: bool = True, overshoot: bool = False,
        overshoot_finish: bool = True,
    ) -> tuple[list[float], float] | None:
        """Several decode-group steps at once, exactly as stepping would take them: see ``sim.serving.fast_path``."""
        return fast_path.fast_forward(self, now, horizon, cost, finishes=finishes, overshoot=overshoot,
                                      overshoot_finish=overshoot_finish)

    def _leave_running(self, r: Request) -> None:
        g = self.group
        if r.group_base >= 0:
            assert g is not None  # only a group has members
            g.leave(r)
        elif g is not None:
            self.outside.remove(r)
        self.running.remove(r)

    # ---- applying a plan ---------------------------------------------------------------------------------------
    def _apply(self, plan: Plan, now: float) -> Batch | None:
        kv = self.kv
        g = self.group
        for r, reason in plan.reject:
            if r.status is _WAITING:
                self.waiting.remove(r)
            elif r.status is _SWAPPED:
                self.swapped.remove(r)
                kv.drop_swapped(r)
            else:
                raise PlanError(f"policy rejected request {r.id}, which is {r.status.value}")
            self.stats.num_rejected += 1
            self._finish(r, now, _REJECTED, reason)
        swap_blocks = 0
        swapped_out: list[tuple[int, list[int]]] | None = None
        swapped_in: list[tuple[int, list[int]]] | None = None
        for r, mode in plan.preempt:
            if r.status is not _RUNNING:
                raise PlanError(f"policy preempted request {r.id}, which is {r.status.value}")
            self._leave_running(r)
            r.num_preemptions += 1
            if r.preempted_at is None:
                r.preempted_at, r.resumed_at = [], []
            r.preempted_at.append(now)
            self.stats.num_preemptions += 1
            self.kv_tokens -= r.num_computed_tokens
            self.filled_blocks -= cdiv(r.num_computed_tokens, kv.block_size)
            if mode == "swap":
                blocks = kv.block_table(r)
                try:
                    swap_blocks += kv.swap_out(r)
                except BlockError as e:  # a plan that swapped out without budget.swap_out (or no swap_space)
                    raise PlanError(f"plan swaps request {r.id} out past the free CPU swap space: {e}") from e
                swapped_out = (swapped_out or []) + [(r.id, blocks)]
                r.status = _SWAPPED
                self.swapped.append(r)
                self.stats.num_swaps += 1
            elif mode == "recompute":
                kv.free(r)
                r.num_computed_tokens = 0
                r.status = _WAITING
                self.waiting.appendleft(r)
            else:
                raise PlanError(f"unknown preemption mode {mode!r}")
        for r in plan.swap_in:
            if r.status is not _SWAPPED:
                raise PlanError(f"policy swapped in request {r.id}, which is {r.status.value}")
            self.swapped.remove(r)
            if r.resumed_at is not None:
                r.resumed_at.append(now)
            try:
                swap_blocks += kv.swap_in(r)
            except BlockError as e:  # a plan that swapped in without budget.swap_in
                raise PlanError(f"plan swaps request {r.id} in past the free KV: {e}") from e
            swapped_in = (swapped_in or []) + [(r.id, kv.block_table(r))]
            self._admit(r)
            self.kv_tokens += r.num_computed_tokens
            self.filled_blocks += cdiv(r.num_computed_tokens, kv.block_size)
        group_size = group_blocks = 0
        stepping: DecodeGroup | None = None  # the decode group when it takes this step
        if plan.decode_group:
            if g is None or not g.members:
                raise PlanError("plan schedules the decode group, but there is none")
            stepping = g
            group_size = len(g.members)
            crossing = g.crossing() if g.grows else ()
            if crossing:
                if not kv.can_grow(len(crossing)):
                    raise PlanError(f"plan grows the decode group past the free KV ({kv.num_free_blocks} free)")
                kv.grow(crossing)
                group_blocks = len(crossing)
            elif not g.grows:
                group_blocks = len(g.crossing())
        if not plan.scheduled and not group_size:
            if plan.swap_in:
                raise PlanError("policy swapped in requests but scheduled nothing")
            if not plan.preempt:
                return None
            # Only preemptions: the KV ran out under the running requests and the last one had to go too, which
            # only blocks lost to a leak make possible. The step moves (swap) or drops their KV, computing nothing.
        limits = self.limits
        total = decode = group_size
        prefill = 0
        max_n = 1 if group_size else 0
        kv_read = attn = (stepping.ctx + group_size) if stepping is not None else 0
        max_c = 0
        max_dec = (stepping.max_computed() + 1) if stepping is not None and group_size else 0  # longest decode row
        bs = kv.block_size
        clamped: list[tuple[Request, int]] = []
        for r, n in plan.scheduled:
            planned_n = n
            st = r.status
            if st is _WAITING:
                self.waiting.remove(r)
                self._admit(r)
                # a request that arrives holding KV computed elsewhere (a disaggregated decode: sim/loop/disagg) has
                # those tokens in the cache from its admission on; any other waiting request holds none here
                c_before = r.num_computed_tokens if r.first_scheduled >= 0 else 0
                try:
                    # prefix-cache hits the policy could not see (a request with the same prefix admitted
                    # earlier in this very plan) shorten the work, as in vLLM
                    if kv.allocate(r, n):
                        n = min(n, r.num_tokens - r.num_computed_tokens)
                except BlockError as e:
                    raise PlanError(f"plan admits request {r.id} past the free KV: {e}") from e
                if n != planned_n:
                    clamped.append((r, n))
                # prefix-cache hits count as computed tokens the request now holds
                self.kv_tokens += r.num_computed_tokens - c_before
                self.filled_blocks += (-c_before // bs) - (-r.num_computed_tokens // bs)  # cdiv(c1) - cdiv(c0)
                if r.first_scheduled < 0:
                    r.first_scheduled = now
                elif r.resumed_at is not None:  # back from a recompute preemption
                    r.resumed_at.append(now)
            elif st is _RUNNING:
                if r.group_base >= 0:
                    raise PlanError(f"plan schedules request {r.id} on its own, but it is in the decode group")
                try:
                    kv.allocate(r, n)
                except BlockError as e:
                    raise PlanError(f"plan grows request {r.id} past the free KV: {e}") from e
            else:
                back = " (a swapped request comes back with plan.swap_in(req, n), reserved by budget.swap_in(req) " \
                    "and budget.allocate(req, n))" if st.value == "swapped" else ""
                raise PlanError(f"plan schedules request {r.id}, which is {st.value}{back}")
            c = r.num_computed_tokens
            if n < 1 or c + n > r.prompt_len + r.num_output_tokens:
                raise PlanError(f"plan computes {n} tokens of request {r.id}, which has {r.num_remaining} left")
            total += n
            if n == 1:
                decode += 1
                if c >= max_dec:
                    max_dec = c + 1
            else:
                prefill += n
            kv_read += c + n
            attn += n * c + n * (n + 1) // 2
            if n > max_n:
                max_n = n
            if c > max_c:
                max_c = c
        spec_rows = spec_tokens = spec_ctx = 0
        drafts: dict[int, int] | None = None
        if self.spec is not None and decode and not plan.pad_to_longest:
            drafts, spec_rows, spec_tokens, spec_ctx, pairs = self.spec.propose(
                plan.scheduled, kv, limits.max_num_batched_tokens - total)
            # a verifying row computes 1 + k tokens: priced as a prefill chunk, not a one-token row
            total, kv_read, attn, decode = total + spec_tokens, kv_read + spec_tokens, attn + pairs, decode - spec_rows
        if clamped:  # the step computes what the requests really need
            fix = {id(r): n for r, n in clamped}
            plan.scheduled = [(r, fix.get(id(r), n)) for r, n in plan.scheduled]
        num_scheduled = len(plan.scheduled) + group_size
        if len(plan.scheduled) > 1 and len({id(r) for r, _ in plan.scheduled}) != len(plan.scheduled):
            raise PlanError("plan schedules a request twice")
        if num_scheduled > limits.max_num_seqs:
            raise PlanError(f"plan schedules {num_scheduled} requests > max_num_seqs {limits.max_num_seqs}")
        if total > limits.max_num_batched_tokens:
            raise PlanError(f"plan computes {total} tokens > max_num_batched_tokens {limits.max_num_batched_tokens}")
        rows = num_scheduled + plan.padded_rows
        gpad = graph_padding(self.graph_sizes, rows) if not prefill and not spec_rows and self.graph_sizes else 0
        rows += gpad  # CUDA-graph padding of a decode step (sim/engines/sched.py)
        if plan.pad_to_longest:  # every row is as long as the longest (padded tensors)
            if stepping is not None:
                max_c = max(max_c, stepping.max_computed())
            num_tokens = rows * max_n
            kv_read = rows * (max_c + max_n)
            attn = rows * (max_n * max_c + max_n * (max_n + 1) // 2)
        else:
            num_tokens = total + gpad
        decode_rows = rows if (plan.pad_to_longest and max_n == 1) else decode + gpad
        # positional, in field order (StepShape's and Batch's): one of each a step, and a call with a dozen keywords
        # costs about three times as much (some 1.3 us more each, measured)
        shape = StepShape(
            rows,  # num_seqs
            num_tokens,
            decode_rows,  # num_decode_seqs
            kv_read,  # kv_read_tokens
            attn,  # attn_pairs
            num_tokens - total,  # num_padding_tokens
            swap_blocks,
            now - self.last_end if now > self.last_end else 0.0,  # idle_before
            max_dec,  # max_decode_len
            spec_rows,  # num_spec_seqs
            spec_tokens,  # num_draft_tokens
            spec_ctx,  # spec_context_tokens
        )
        # prefix blocks this step's admissions loaded from the host tier (sim.serving.host_kv_tier); a KV manager
        # written
        # before KVManager declared ``host`` has none
        host = getattr(kv, "host", None)
        if host is not None:
            shape.host_load_time = host.take_pending()
        if self.plans is not None:  # canonical: sorted by request id, whoever planned it
            entries = [(r.id, n) for r, n in plan.scheduled]
            if stepping is not None:
                entries += [(i, 1) for i in stepping.members]
            self.plans.append(tuple(sorted(entries)))
        return Batch(
            plan,
            shape,
            now,  # start
            rows,  # num_rows
            num_scheduled,
            prefill,  # prefill_tokens
            decode + spec_rows + spec_tokens,  # decode_tokens: verifying rows' tokens are decode work
            num_tokens - total,  # padding_tokens
            swap_blocks,
            len(plan.preempt),  # num_preempted
            len(plan.reject),  # num_rejected
            group_size,
            group_blocks,
            swapped_out,
            swapped_in,
            drafts or None,  # drafts
        )

    def _reject_unservable(self, now: float) -> None:
        """With nothing running, no block will be freed: a request at the head of the queue that needs more blocks
        to finish than are free can never complete (it would preempt itself forever). Only blocks that no live
        request holds make this possible (a leak: ``abort(leak=True)``); a sound deployment never gets here,
        since max_model_len fits in the cache. Rejected, as vLLM refuses a prompt longer than its cache."""
        kv = self.kv
        for queue in (self.swapped, self.waiting):
            while queue:
                r = queue[0]
                if r.status is _SWAPPED:  # its swap-in takes back as many GPU blocks as it has on the CPU
                    computed, held = r.num_computed_tokens, kv.cpu_tables[r.id]
                else:
                    computed, held = max(r.num_computed_tokens, kv.num_cached_tokens(r)), 0
                need = held + kv.blocks_needed(r, max(1, r.prompt_len + r.output_len - 1 - computed))
                # contiguous KV places a reservation in one gap: free blocks scattered between leaked ranges
                # do not add up to room for it
                free = kv.largest_hole if isinstance(kv, ContiguousAllocator) else kv.num_free_blocks
                if need <= free:
                    break
                queue.remove(r)
                if r.status is _SWAPPED:
                    kv.drop_swapped(r)
                self.stats.num_rejected += 1
                self._finish(r, now, _REJECTED,
                             f"needs {need} more KV blocks to finish, {free} free"
                             f"{' in one gap' if isinstance(kv, ContiguousAllocator) else ''} and nothing running "
                             f"to free more ({kv.num_used_blocks} held by no live request: leaked)")

    def _admit(self, r: Request) -> None:
        r.status = _RUNNING
        self._admit_seq += 1
        r.admit_seq = self._admit_seq
        self.running.append(r)
        if self.group is not None:
            self.outside.append(r)

    def _record(self, batch: Batch, end: float, flops: float) -> None:
        self.busy_time += end - batch.start
        self._tokens_run += batch.prefill_tokens + batch.decode_tokens
        self.last_end = end
        self.flops_done += flops
        decode = (batch.decode_tokens or batch.group_size) and not batch.prefill_tokens
        self.decode_run = self.decode_run + 1 if decode else 0
        kv = self.kv
        used = kv.num_used_blocks
        self.steps.append(
            batch.start,
            end,
            batch.num_scheduled,
            batch.num_rows - batch.num_scheduled,
            batch.prefill_tokens,
            batch.decode_tokens,
            batch.padding_tokens,
            used,
            max(0, used - self.filled_blocks),
            self.kv_tokens,
            kv.num_blocks,
            len(self.running),
            len(self.waiting),
            len(self.swapped),
            batch.num_preempted,
            batch.num_rejected,
            batch.swap_blocks,
            flops,
        )

    def _drop_kv(self, r: Request) -> None:
        self.kv.free(r)
        self.kv_tokens -= r.num_computed_tokens
        self.filled_blocks += -r.num_computed_tokens // self.kv.block_size  # less cdiv(tokens, block_size)

    def _finish(self, r: Request, now: float, outcome: Outcome, reason: str) -> None:
        r.status = _FINISHED
        r.outcome = outcome
        r.reason = reason
        r.finish = now
        if outcome is _COMPLETED:
            self.stats.num_completed += 1
        elif outcome is _FAILED:
            self.stats.num_failed += 1
        self.done.append(r)
        if self.on_finish is not None:
            self.on_finish(r)
        for listener in self.finish_listeners:
            listener(r)


def _admit_order(r: Request) -> int:
    return r.admit_seq

