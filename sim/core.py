"""The serving core: request queues, the KV manager and a policy, stepped by an executor.

An executor (the SimPy simulator, or the real engine on a wall clock) drives it with two calls per step::

    batch = core.schedule(now)          # ask the policy, check its plan, apply allocation; None: nothing to run
    ...execute the batch for some duration...
    core.complete(batch, end)            # advance the requests, sample tokens, finish, record the step

The core owns every state change, so both executors share one scheduler and differ only in timing.

Decode fast path. Long stretches of serving are pure decode: the same requests each compute one token per
step, and the policy's answer cannot change until something happens (an arrival, a finish, a block shortage,
a deadline; see ``sim.policies.base``). In such a stretch the core stops asking the policy and stops touching
every request every step: it advances shared counters, allocates the blocks of exactly those requests that
cross a block boundary, and brings the requests up to date when the stretch ends. The results are identical
to stepping one by one (a test checks it, byte for byte); the real engine turns this off because it needs
every request's state every step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.block_manager import BlockError, KVManager, cdiv
from sim.costmodel import StepShape
from sim.policies.base import Plan, Policy, View
from sim.records import GapLog, StepLog
from sim.request import Outcome, Request, Status


class PlanError(RuntimeError):
    """A policy returned a plan that breaks the limits or the state machine: a bug in the policy."""


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
    fast: bool = False  # a decode fast-path step (requests' own counters are not current during it)


@dataclass(slots=True)
class _DecodeRun:
    """A stretch of fast-path decode steps. Members' own counters stay as they were at the start (``c0``)
    until they leave the stretch; ``steps`` says how far they really are."""

    reqs: list[Request]  # members, in running order
    steps: int  # fast steps done so far
    stop_at: int  # last fast step allowed (a padded batch stops before its first finish)
    finish_at: dict[int, list[Request]]  # fast step -> members that sample their last token in it
    crossers: dict[int, list[Request]]  # fast step -> members that need a new KV block in it
    rows: int  # rows of each step's shape (padding included)
    kv_read: int  # attended tokens of the last step (for one-token rows this is also the causal pair count)
    deadline: float | None  # the policy's wake time: no fast step may start at or after it
    prev_end: float
    plan: Plan  # the plan being repeated
    ends: list[float] | None = None  # step ends, when per-token timestamps are kept


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
    ) -> None:
        self.policy = policy
        self.kv = kv
        self.limits = policy.limits
        self.fast_path = fast_path and getattr(policy, "fast_path", True)
        self.keep_token_times = keep_token_times
        self.replica = replica
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.done: list[Request] = []  # requests with an outcome, in the order they got it
        self.steps = StepLog()
        self.gaps = GapLog()
        self.stats = CoreStats()
        self.kv_tokens = 0  # tokens held in GPU KV by running requests
        self.filled_blocks = 0  # sum over running requests of ceil(computed / block_size)
        self.plans: list[tuple[tuple[int, int], ...]] | None = [] if record_plans else None
        self.on_finish = None  # optional callback(request), e.g. a closed-loop user sending its next request
        self._run: _DecodeRun | None = None
        self._dirty = True  # something outside the decode stretch happened (arrival, abort)
        self._view = View(0.0, self.waiting, self.running, self.swapped, kv, self.limits)
        # A policy that, with nothing waiting or swapped and every running request decoding, schedules every
        # running request for one token: the core may then continue decode stretches past finishes.
        self._decode_all_when_idle = bool(getattr(policy, "decode_all_when_idle", False))

    # ---- inputs ------------------------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> bool:
        """A request arrives. The policy's admission control may refuse it at once (too long for
        ``max_model_len``, larger than the whole KV cache, queue full): it then ends ``rejected``."""
        req.replica = self.replica
        if self.keep_token_times and req.token_times is None:
            req.token_times = []
        self._dirty = True
        admission = getattr(self.policy, "admission", None)
        if admission is not None:
            self._view.now = now
            reason = admission.on_arrival(req, self._view)
            if reason is not None:
                self.stats.num_rejected += 1
                self._finish(req, now, Outcome.REJECTED, reason)
                return False
        req.status = Status.WAITING
        self.waiting.append(req)
        return True

    def abort(self, req: Request, now: float, reason: str, *, leak: bool = False) -> None:
        """End a request mid-flight with outcome ``failed`` (client disconnect, error). ``leak=True`` keeps its
        KV blocks allocated forever: the bug the failure-mode scenarios show."""
        if req.status is Status.FINISHED:
            return
        self._sync_run()
        self._dirty = True
        if req.status is Status.RUNNING:
            self.running.remove(req)
            if not leak:
                self._drop_kv(req)
            else:  # the blocks stay allocated; the tokens no longer count as useful
                self.kv_tokens -= req.num_computed_tokens
                self.filled_blocks -= cdiv(req.num_computed_tokens, self.kv.block_size)
        elif req.status is Status.SWAPPED:
            self.swapped.remove(req)
            self.kv.drop_swapped(req)
        else:
            self.waiting.remove(req)
        self._finish(req, now, Outcome.FAILED, reason)

    # ---- queries -----------------------------------------------------------------------------------------------
    @property
    def in_decode_run(self) -> bool:
        return self._run is not None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def wake_time(self, now: float) -> float | None:
        self._view.now = now
        return self.policy.wake_time(self._view)

    def view(self, now: float) -> View:
        self._sync_run()
        self._view.now = now
        return self._view

    # ---- the step ----------------------------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        run = self._run
        if run is not None:
            batch = self._fast_step(run, now)
            if batch is not None:
                return batch
            self._sync_run()
        self._view.now = now
        plan = self.policy.schedule(self._view)
        self._dirty = False
        return self._apply(plan, now)

    def complete(self, batch: Batch, end: float, flops: float = 0.0) -> list[Request]:
        """Advance the batch's requests to the end of the step; returns those that completed."""
        if batch.fast:
            return self._complete_fast(batch, end, flops)
        bs = self.kv.block_size
        finished: list[Request] = []
        gaps = self.gaps
        for r, n in batch.plan.scheduled:
            if r.status is not Status.RUNNING:
                continue  # aborted during the step
            c0 = r.num_computed_tokens
            c1 = c0 + n
            r.num_computed_tokens = c1
            self.kv_tokens += n
            self.filled_blocks += cdiv(c1, bs) - cdiv(c0, bs)
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
        self._record(batch, end, flops)
        for r in finished:
            self.running.remove(r)
            self._drop_kv(r)
            self._finish(r, end, Outcome.COMPLETED, "")
        if finished:
            self._dirty = True
        if self.fast_path and self.running:
            self._maybe_start_run(batch, end)
        return finished

    # ---- applying a plan ---------------------------------------------------------------------------------------
    def _apply(self, plan: Plan, now: float) -> Batch | None:
        kv = self.kv
        for r, reason in plan.reject:
            if r.status is Status.WAITING:
                self.waiting.remove(r)
            elif r.status is Status.SWAPPED:
                self.swapped.remove(r)
                kv.drop_swapped(r)
            else:
                raise PlanError(f"policy rejected request {r.id}, which is {r.status.value}")
            self.stats.num_rejected += 1
            self._finish(r, now, Outcome.REJECTED, reason)
        swap_blocks = 0
        for r, mode in plan.preempt:
            if r.status is not Status.RUNNING:
                raise PlanError(f"policy preempted request {r.id}, which is {r.status.value}")
            self.running.remove(r)
            r.num_preemptions += 1
            self.stats.num_preemptions += 1
            self.kv_tokens -= r.num_computed_tokens
            self.filled_blocks -= cdiv(r.num_computed_tokens, kv.block_size)
            if mode == "swap":
                swap_blocks += kv.swap_out(r)
                r.status = Status.SWAPPED
                self.swapped.append(r)
                self.stats.num_swaps += 1
            elif mode == "recompute":
                kv.free(r)
                r.num_computed_tokens = 0
                r.status = Status.WAITING
                self.waiting.appendleft(r)
            else:
                raise PlanError(f"unknown preemption mode {mode!r}")
        for r in plan.swap_in:
            if r.status is not Status.SWAPPED:
                raise PlanError(f"policy swapped in request {r.id}, which is {r.status.value}")
            self.swapped.remove(r)
            swap_blocks += kv.swap_in(r)
            r.status = Status.RUNNING
            self.running.append(r)
            self.kv_tokens += r.num_computed_tokens
            self.filled_blocks += cdiv(r.num_computed_tokens, kv.block_size)
        if not plan.scheduled:
            if plan.preempt or plan.swap_in:
                raise PlanError("policy preempted or swapped in requests but scheduled nothing")
            return None
        limits = self.limits
        if len(plan.scheduled) > limits.max_num_seqs:
            raise PlanError(f"plan schedules {len(plan.scheduled)} requests > max_num_seqs {limits.max_num_seqs}")
        total = 0
        seen: set[int] = set()
        prefill = decode = 0
        max_n = max_c = 0
        kv_read = attn = 0
        bs = kv.block_size
        for r, n in plan.scheduled:
            if r.id in seen:
                raise PlanError(f"plan schedules request {r.id} twice")
            seen.add(r.id)
            if r.status is Status.WAITING:
                self.waiting.remove(r)
                r.status = Status.RUNNING
                self.running.append(r)
                c_before = r.num_computed_tokens
                try:
                    kv.allocate(r, n)
                except BlockError as e:
                    raise PlanError(f"plan admits request {r.id} past the free KV: {e}") from e
                # prefix-cache hits count as computed tokens the request now holds
                self.kv_tokens += r.num_computed_tokens - c_before
                self.filled_blocks += cdiv(r.num_computed_tokens, bs) - cdiv(c_before, bs)
                if r.first_scheduled < 0:
                    r.first_scheduled = now
            elif r.status is Status.RUNNING:
                try:
                    kv.allocate(r, n)
                except BlockError as e:
                    raise PlanError(f"plan grows request {r.id} past the free KV: {e}") from e
            else:
                raise PlanError(f"plan schedules request {r.id}, which is {r.status.value}")
            c = r.num_computed_tokens
            if n < 1 or c + n > r.prompt_len + r.num_output_tokens:
                raise PlanError(f"plan computes {n} tokens of request {r.id}, which has {r.num_remaining} left")
            total += n
            if n == 1:
                decode += 1
            else:
                prefill += n
            kv_read += c + n
            attn += n * c + n * (n + 1) // 2
            if n > max_n:
                max_n = n
            if c > max_c:
                max_c = c
        if total > limits.max_num_batched_tokens:
            raise PlanError(f"plan computes {total} tokens > max_num_batched_tokens {limits.max_num_batched_tokens}")
        rows = len(plan.scheduled) + plan.padded_rows
        if plan.pad_to_longest:  # every row is as long as the longest (padded tensors)
            num_tokens = rows * max_n
            kv_read = rows * (max_c + max_n)
            attn = rows * (max_n * max_c + max_n * (max_n + 1) // 2)
        else:
            num_tokens = total
        decode_rows = rows if (plan.pad_to_longest and max_n == 1) else decode
        shape = StepShape(
            num_seqs=rows,
            num_tokens=num_tokens,
            num_decode_seqs=decode_rows,
            kv_read_tokens=kv_read,
            attn_pairs=attn,
            num_padding_tokens=num_tokens - total,
            swap_blocks=swap_blocks,
        )
        if self.plans is not None:
            self.plans.append(tuple((r.id, n) for r, n in plan.scheduled))
        return Batch(
            plan=plan,
            shape=shape,
            start=now,
            num_rows=rows,
            num_scheduled=len(plan.scheduled),
            prefill_tokens=prefill,
            decode_tokens=decode,
            padding_tokens=num_tokens - total,
            swap_blocks=swap_blocks,
            num_preempted=len(plan.preempt),
            num_rejected=len(plan.reject),
        )

    def _record(self, batch: Batch, end: float, flops: float) -> None:
        kv = self.kv
        used = kv.num_used_blocks
        self.steps.append(
            batch.start,
            end - batch.start,
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
        self.filled_blocks -= cdiv(r.num_computed_tokens, self.kv.block_size)

    def _finish(self, r: Request, now: float, outcome: Outcome, reason: str) -> None:
        r.status = Status.FINISHED
        r.outcome = outcome
        r.reason = reason
        r.finish = now
        if outcome is Outcome.COMPLETED:
            self.stats.num_completed += 1
        elif outcome is Outcome.FAILED:
            self.stats.num_failed += 1
        self.done.append(r)
        if self.on_finish is not None:
            self.on_finish(r)

    # ---- decode fast path --------------------------------------------------------------------------------------
    def _maybe_start_run(self, batch: Batch, end: float) -> None:
        """After a normal step: start a decode stretch if the next steps are certain to be pure decode."""
        plan = batch.plan
        running = self.running
        repeat = not self._dirty and plan.is_decode_only and len(plan.scheduled) == len(running)
        steady = (
            self._decode_all_when_idle
            and not self.waiting
            and not self.swapped
            and len(running) <= self.limits.max_num_seqs
            and len(running) <= self.limits.max_num_batched_tokens
        )
        if not (repeat or steady):
            return
        for r in running:  # every member must have sampled in this very step (equal inter-token gaps)
            if r.last_token != end or r.num_computed_tokens != r.prompt_len + r.num_output_tokens - 1:
                return
        if not repeat:  # the policy was not asked, but would plan exactly this
            plan = Plan(scheduled=[(r, 1) for r in running])
        padded = plan.pad_to_longest
        rows = len(running) + plan.padded_rows
        bs = self.kv.block_size
        finish_at: dict[int, list[Request]] = {}
        crossers: dict[int, list[Request]] = {}
        max_c = kv_read = 0
        first_finish = 1 << 62
        for r in running:
            c0 = r.num_computed_tokens
            kv_read += c0
            if c0 > max_c:
                max_c = c0
            f = r.output_len - r.num_output_tokens  # the fast step that samples its last token
            finish_at.setdefault(f, []).append(r)
            if f < first_finish:
                first_finish = f
            # fast step j computes token c0 + j - 1 (0-based); it opens a new block when that is a multiple of bs
            j = (-c0) % bs + 1
            while j <= f:
                crossers.setdefault(j, []).append(r)
                j += bs
        stop_at = first_finish - 1 if padded else 1 << 62
        if stop_at < 1:
            return
        self._view.now = end
        self._dirty = False
        self._run = _DecodeRun(
            reqs=list(running),
            steps=0,
            stop_at=stop_at,
            finish_at=finish_at,
            crossers=crossers,
            rows=rows,
            kv_read=rows * max_c if padded else kv_read,
            deadline=self.policy.wake_time(self._view),
            prev_end=end,
            plan=plan,
            ends=[] if self.keep_token_times else None,
        )

    def _fast_step(self, run: _DecodeRun, now: float) -> Batch | None:
        j = run.steps + 1
        if self._dirty or j > run.stop_at or (run.deadline is not None and now >= run.deadline):
            return None
        if now != run.prev_end:
            return None  # the executor idled between steps: let the policy look again
        crossing = run.crossers.get(j)
        if crossing:
            kv = self.kv
            if not kv.can_grow(len(crossing)):
                return None  # a block shortage: the policy decides whom to preempt
            for r in crossing:
                kv.grow_one(r)
        run.kv_read += run.rows
        b = len(run.reqs)
        rows = run.rows
        shape = StepShape(
            num_seqs=rows,
            num_tokens=rows,
            num_decode_seqs=rows,
            kv_read_tokens=run.kv_read,
            attn_pairs=run.kv_read,
            num_padding_tokens=rows - b,
            swap_blocks=0,
        )
        if self.plans is not None:
            self.plans.append(tuple((r.id, 1) for r in run.reqs))
        return Batch(
            plan=run.plan,
            shape=shape,
            start=now,
            num_rows=rows,
            num_scheduled=b,
            prefill_tokens=0,
            decode_tokens=b,
            padding_tokens=rows - b,
            swap_blocks=0,
            num_preempted=0,
            num_rejected=0,
            fast=True,
        )

    def _complete_fast(self, batch: Batch, end: float, flops: float) -> list[Request]:
        run = self._run
        assert run is not None
        j = run.steps = run.steps + 1
        b = len(run.reqs)
        self.kv_tokens += b
        crossing = run.crossers.pop(j, None)
        if crossing:
            self.filled_blocks += len(crossing)
        self.gaps.add(end - run.prev_end, b)
        run.prev_end = end
        if run.ends is not None:
            run.ends.append(end)
        self._record(batch, end, flops)
        finishing = run.finish_at.pop(j, None)
        if not finishing:
            return []
        for r in finishing:  # leave the stretch: bring the request up to date, then finish it
            self._catch_up(r, run, j)
            run.reqs.remove(r)
            self.running.remove(r)
            run.rows -= 1
            run.kv_read -= r.num_computed_tokens
            self._drop_kv(r)
            self._finish(r, end, Outcome.COMPLETED, "")
        if not (self._decode_all_when_idle and run.reqs and not self.waiting and not self.swapped):
            self._sync_run()  # the policy may now admit someone into the freed room
            self._dirty = True
        return finishing

    def fast_forward(
        self, now: float, horizon: float, cost, *, finishes: bool = True
    ) -> tuple[list[float], float] | None:
        """Take several steps of the decode stretch at once: price them with one vectorised cost-model call,
        then apply them one by one through the same code as single fast steps (so the records are identical
        by construction). Stops before any step that would end at or after ``horizon`` (the next event from
        outside, such as an arrival) or start at or after the policy's deadline. ``finishes=False`` also stops
        before a step in which a request completes (when a completion can start an outside event, such as a
        closed-loop user's next request). Returns (step durations, end of the last step), or None."""
        run = self._run
        if run is None or self._dirty or now != run.prev_end or now >= horizon:
            return None
        if run.deadline is not None and now >= run.deadline:
            return None
        j0 = run.steps
        # finishes end the stretch unless the policy keeps decoding everyone with nothing waiting
        keep_going = finishes and self._decode_all_when_idle and not self.waiting and not self.swapped
        first_finish = min(run.finish_at, default=1 << 62)
        last = min(run.stop_at, j0 + _MAX_SEGMENT)
        if not keep_going:
            last = min(last, first_finish - 1)
        if horizon != float("inf") and self.steps:
            # a guess at how many steps fit before the horizon; more are taken next time if it was short
            last_duration = max(float(self.steps.last_duration), 1e-9)
            last = min(last, j0 + int((horizon - now) / last_duration) + 2)
        k = last - j0
        if k < 2:
            return None
        # predict each step's rows and attended tokens, members leaving after their finishing step
        rows_l = [0] * k
        read_l = [0] * k
        rows, kv_read = run.rows, run.kv_read
        for i in range(k):
            j = j0 + 1 + i
            kv_read += rows
            rows_l[i] = rows
            read_l[i] = kv_read
            leaving = run.finish_at.get(j)
            if leaving:
                rows -= len(leaving)
                kv_read -= sum(r.num_computed_tokens + j for r in leaving)
        rows_a = np.asarray(rows_l, dtype=np.int64)
        read_a = np.asarray(read_l, dtype=np.int64)
        shape = StepShape(
            num_seqs=rows_a,
            num_tokens=rows_a,
            num_decode_seqs=rows_a,
            kv_read_tokens=read_a,
            attn_pairs=read_a,
            num_padding_tokens=np.full(k, run.rows - len(run.reqs), dtype=np.int64),
            swap_blocks=np.zeros(k, dtype=np.int64),
        )
        durations = np.asarray(cost.step_time(shape), dtype=np.float64).tolist()
        flops = np.asarray(cost.step_flops(shape), dtype=np.float64).tolist()
        taken: list[float] = []
        t = now
        for i in range(k):
            end = t + durations[i]
            if end >= horizon or (run.deadline is not None and t >= run.deadline):
                break
            batch = self._fast_step(run, t)
            if batch is None:
                break  # a block shortage: the policy must decide
            if batch.shape.kv_read_tokens != read_l[i] or batch.num_rows != rows_l[i]:
                raise AssertionError("decode fast-forward predicted a different step shape")
            self._complete_fast(batch, end, flops[i])
            taken.append(durations[i])
            t = end
            if self._run is not run:
                break  # a finish ended the stretch
        if not taken:
            return None
        return taken, t

    @staticmethod
    def _catch_up(r: Request, run: _DecodeRun, k: int) -> None:
        r.num_computed_tokens += k
        r.num_output_tokens += k
        r.last_token = run.prev_end
        if r.token_times is not None and run.ends is not None:
            r.token_times.extend(run.ends)

    def _sync_run(self) -> None:
        """Bring every member of the decode stretch up to date and leave the fast path."""
        run = self._run
        if run is None:
            return
        self._run = None
        if run.steps:
            for r in run.reqs:
                self._catch_up(r, run, run.steps)


_MAX_SEGMENT = 4096  # fast-forward at most this many steps at once (bounds the arrays it builds)
