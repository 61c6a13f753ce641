"""Continuous (iteration-level) batching, as vLLM schedules it.

Every step, running requests keep their places and waiting requests are admitted into free sequence slots
while the token budget and the KV blocks allow. Three flavours:

- ``enable_chunked_prefill``: running requests first (decodes and unfinished prompt chunks), then new
  prompts cut into chunks to fill the rest of the ``max_num_batched_tokens`` budget (vLLM v1's scheduler);
- ``prefill_first`` without chunking: a step either admits whole prompts, or decodes everything running
  (vLLM v0's default; decodes stall while prompts are computed);
- ``mixed`` without chunking: decodes plus whole prompts that fit the remaining budget in one step.

Engine behaviours set by sim/engines/sched.py: ``prefill_priority`` (SGLang: a step of prompt chunks whenever one
can start, else decodes), ``num_scheduler_steps`` (vLLM 0.6 multi-step: no prompt starts inside a block of that
many decode steps) and ``cudagraph_capture_sizes`` (read by the core, which pads decode steps to them).

With ``no_evict`` (TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler) a waiting request is admitted only
when the blocks of its whole prompt + output fit beside what every running and swapped request may still grow
to, so no running request ever runs out of blocks. Otherwise (MAX_UTILIZATION, vLLM, SGLang) requests are
admitted while blocks are free now. When a running request cannot get a block, the latest-admitted running
request is preempted, by recompute (its KV is dropped and rebuilt later) or by swap (its KV is copied to CPU
memory), as vLLM does.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import ClassVar

from sim.policies.base import Admission, Limits, Plan, Policy, View, plan_group, preempt_for, swap_back
from sim.serving.kv_manager import KVBudget
from sim.serving.request import Request

_NONE: frozenset[int] = frozenset()  # no request rejected (schedule_arrival's case)


@dataclass(slots=True)
class ContinuousPolicy(Policy):
    # With nothing waiting or swapped and every running request decoding, every running request gets one
    # token: the core may skip asking (see sim.serving.core's decode fast path).
    decode_all_when_idle: ClassVar[bool] = True
    uses_decode_group: ClassVar[bool] = True  # plans the core's decode group as a whole (sim.serving.decode_group)

    limits: Limits = field(default_factory=Limits)
    enable_chunked_prefill: bool = False
    prefill_mode: str = "prefill_first"  # without chunking: "prefill_first" or "mixed"
    preemption_mode: str = "recompute"  # "recompute" or "swap"
    admission: Admission = field(default_factory=Admission)
    no_evict: bool = False  # admit only what is guaranteed to finish without preemption (see the module doc)
    # vLLM 0.6's --num-scheduler-steps (sim/engines/sched.py): decodes run in blocks of this many steps, and no
    # prompt (nor swap-in) starts inside a block; chunked prefill off
    num_scheduler_steps: int = 1
    # SGLang's scheduler (sim/engines/sched.py): a step of prompts (chunks) whenever one can run, decodes only
    # when none can, never both in one step
    prefill_priority: bool = False
    # decode batch sizes the executor has CUDA graphs for (sim/engines/sched.py): a decode-only step is priced as
    # the next size up; (): unpadded. Read by the core, not by the plan.
    cudagraph_capture_sizes: tuple[int, ...] = ()
    # vLLM V0's admission (sim/engines/sched.py): a waiting request starts only when the blocks of all the tokens
    # it must compute (a recomputed request's outputs too) are free beside this share of the blocks, and takes
    # them all in the step it starts (V0 allocates them then; later chunks here take theirs as they run); None: it
    # takes blocks as its chunks need them (V1), so a request preempted for lack of blocks comes back as soon as
    # its first chunk fits, and being the latest admitted, is the first preempted again
    whole_prompt_watermark: float | None = None

    def __post_init__(self) -> None:
        if self.prefill_mode not in ("prefill_first", "mixed"):
            raise ValueError(f"prefill_mode must be 'prefill_first' or 'mixed', got {self.prefill_mode!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.num_scheduler_steps < 1:
            raise ValueError(f"num_scheduler_steps must be >= 1, got {self.num_scheduler_steps}")
        if self.num_scheduler_steps > 1 and self.enable_chunked_prefill:
            raise ValueError("num_scheduler_steps > 1 is modelled with chunked prefill off (vLLM 0.6's multi-step "
                             "decode blocks): set enable_chunked_prefill: false")
        lim = self.limits
        # the longest prefill a step may take: a whole sequence, recomputed after a preemption; without
        # preemption (no_evict) the longest prompt, where the engine bounds prompts apart (TGI)
        longest = lim.max_prompt_len if self.no_evict and lim.max_prompt_len is not None else lim.max_model_len
        if not self.enable_chunked_prefill and longest > lim.max_num_batched_tokens:
            # as vLLM (and TGI's launcher) refuse at start: a prompt longer than one step's budget could never run
            name = "max_model_len" if longest == lim.max_model_len else "max_prompt_len"
            raise ValueError(
                f"{name} {longest} exceeds max_num_batched_tokens {lim.max_num_batched_tokens}: "
                f"raise max_num_batched_tokens, lower {name}, or set enable_chunked_prefill"
            )

    def wake_time(self, view: View) -> float | None:
        return self.admission.deadline(view.waiting)

    def schedule(self, view: View) -> Plan:
        plan = self._schedule(view)
        if plan.decode_group and plan.preempt:
            # Preemption picks victims in admission order, which the group's members hide: look one by one.
            view.ungroup()
            plan = self._schedule(view)
        return plan

    def schedule_arrival(self, view: View) -> Plan | None:
        """``schedule(view)``'s plan, without its general machinery, for the steps the core asks about (nothing
        swapped; see ``Policy.schedule_arrival``): the decode group and the requests outside it, then the waiting
        prompts or their chunks (chunked prefill, mixed); the waiting prompts if any can start, else the group and
        the others (prefill-first). None where the general path decides: another configuration (multi-step
        blocks, SGLang's prompts first, no_evict), a subclass, a rejection due, a group that no longer fits (its
        growth is planned request by request, preempting) or a running request that needs a preemption. The tests
        compare runs with and without it."""
        if type(self) is not ContinuousPolicy or self.num_scheduler_steps != 1 or self.prefill_priority \
                or self.no_evict or (self.admission.max_queue_delay is not None and self.admission.rejections(view)):
            return None
        if view.group is None or view.swapped:
            return None
        tokens = self.limits.max_num_batched_tokens
        budget = view.budget()
        plan = Plan()
        if not (self.enable_chunked_prefill or self.prefill_mode == "mixed"):
            # prefill-first (_schedule): a step of new prompts if any can start, else the running requests'
            if view.waiting:
                self._schedule_waiting(view, plan, budget, tokens, _NONE)
                if plan.scheduled:
                    return plan
            return plan if self._running_quick(view, plan, budget, tokens) >= 0 else None
        tokens = self._running_quick(view, plan, budget, tokens)
        if tokens < 0:
            return None
        if view.waiting:
            self._schedule_waiting(view, plan, budget, tokens, _NONE)
        return plan

    def _running_quick(self, view: View, plan: Plan, budget: KVBudget, tokens: int) -> int:
        """``_schedule_running`` where it preempts nobody: the decode group, then each running request outside it;
        returns the tokens left, or -1 where it would dissolve the group or preempt (nothing planned then counts:
        the general path plans anew)."""
        g = view.group
        assert g is not None and view.outside is not None  # schedule_arrival's case
        if g.members:  # plan_group
            if g.size > tokens or not budget.take(g.next_blocks):
                return -1
            plan.decode_group = True
            tokens -= g.size
        chunked = self.enable_chunked_prefill
        for r in view.outside:
            n = r.num_remaining
            if chunked:
                n = min(n, tokens)
            elif n > tokens:
                continue
            if n <= 0:
                break
            if not budget.allocate(r, n):  # preempt_for would preempt
                return -1
            plan.scheduled.append((r, n))
            tokens -= n
        return tokens

    def _schedule(self, view: View) -> Plan:
        plan = Plan(reject=self.admission.rejections(view))
        rejected = {r.id for r, _ in plan.reject}
        budget = view.budget()
        n = self.num_scheduler_steps
        if n > 1 and view.decode_run % n and view.running:  # inside a block of decode steps: decodes only
            self._schedule_running(view, plan, budget, self.limits.max_num_batched_tokens)
            return plan
        if self.prefill_priority:
            self._schedule_prompts(view, plan, budget, rejected)
            if plan.scheduled:
                return plan
        elif self.enable_chunked_prefill or self.prefill_mode == "mixed":
            tokens = self._schedule_running(view, plan, budget, self.limits.max_num_batched_tokens)
            if not plan.preempt:
                tokens = self._schedule_swapped(view, plan, budget, tokens)
                if not view.swapped or len(plan.swap_in) == len(view.swapped):
                    self._schedule_waiting(view, plan, budget, tokens, rejected)
            return plan
        # prefill-first: a step of new prompts if any can start, else a step of decodes
        if not view.swapped and not self.prefill_priority:  # (SGLang's prompts step was tried above)
            self._schedule_waiting(view, plan, budget, self.limits.max_num_batched_tokens, rejected)
            if plan.scheduled:
                return plan
        tokens = self._schedule_running(view, plan, budget, self.limits.max_num_batched_tokens)
        if not plan.preempt:
            self._schedule_swapped(view, plan, budget, tokens)
        return plan

    def _schedule_prompts(self, view: View, plan: Plan, budget: KVBudget, rejected: set[int]) -> None:
        """SGLang's prefill batch: the running request whose prompt is part-computed continues its chunk, then
        waiting prompts fill the step's budget while blocks are free (nobody is preempted for a prompt)."""
        tokens = self.limits.max_num_batched_tokens
        for r in view.outside if view.outside is not None else view.running:
            if r.num_remaining > 1 and tokens > 0:  # mid-prompt (a decoding request has one token left)
                n = min(r.num_remaining, tokens)
                if not budget.allocate(r, n):
                    return
                plan.scheduled.append((r, n))
                tokens -= n
        if not view.swapped and tokens > 0:
            self._schedule_waiting(view, plan, budget, tokens, rejected)

    def _schedule_running(self, view: View, plan: Plan, budget: KVBudget, tokens: int) -> int:
        taken: set[int] = set()
        chunked = self.enable_chunked_prefill
        candidates, tokens = plan_group(view, plan, budget, tokens)
        for r in candidates:
            if r.id in taken:
                continue  # preempted to make room for an earlier request
            n = r.num_remaining
            if chunked:
                n = min(n, tokens)
            elif n > tokens:
                continue
            if n <= 0:
                break
            if not preempt_for(r, n, view.running, budget, plan, self.preemption_mode, taken):
                continue
            taken.add(r.id)
            plan.scheduled.append((r, n))
            tokens -= n
        return tokens

    def _schedule_swapped(self, view: View, plan: Plan, budget: KVBudget, tokens: int) -> int:
        group = view.group.size if plan.decode_group and view.group is not None else 0
        for r in view.swapped:
            n = r.num_remaining
            if self.enable_chunked_prefill:
                n = min(n, tokens)  # a request swapped out mid-prompt resumes chunk by chunk
            if len(plan.scheduled) + group >= self.limits.max_num_seqs or n > tokens or n < 1:
                break
            if not swap_back(r, n, budget, plan):
                break
            tokens -= n
        return tokens

    def _schedule_waiting(self, view: View, plan: Plan, budget: KVBudget, tokens: int,
                          rejected: AbstractSet[int]) -> int:
        num_seqs = len(view.running) - len(plan.preempt) + len(plan.swap_in)
        if not (self.enable_chunked_prefill or self.prefill_mode == "mixed"):
            num_seqs = len(view.running)  # prefill-first: the running requests still hold their slots
        headroom = self._headroom(view) if self.no_evict else 0
        for r in view.waiting:
            if r.id in rejected:
                continue
            if num_seqs >= self.limits.max_num_seqs or tokens <= 0:
                break
            if self.no_evict:
                need = -(-r.max_len // view.kv.block_size)
                if need > headroom:
                    break
                headroom -= need
            whole = r.num_tokens - max(r.num_computed_tokens, view.kv.num_cached_tokens(r))
            n = min(whole, tokens) if self.enable_chunked_prefill else whole
            if n > tokens:
                break
            free, wm = budget.free, self.whole_prompt_watermark
            if wm is not None and free - self._prompt_blocks(r, whole, view) < int(wm * view.kv.num_blocks):
                break  # V0: LATER, its whole prompt does not fit beside the watermark
            if not budget.allocate(r, n):
                break
            if wm is not None:  # the rest of its prompt's blocks are its own from admission
                budget.take(max(0, self._prompt_blocks(r, whole, view) - (free - budget.free)))
            plan.scheduled.append((r, n))
            tokens -= n
            num_seqs += 1
        return tokens

    @staticmethod
    def _prompt_blocks(r: Request, whole: int, view: View) -> int:
        """The blocks a waiting request's ``whole`` prompt (the tokens it must compute) takes beyond the full blocks
        it finds cached."""
        bs = view.kv.block_size
        return -(-r.num_tokens // bs) - (r.num_tokens - whole) // bs

    @staticmethod
    def _headroom(view: View) -> int:
        """Blocks not promised to a running or swapped request's whole prompt + output. It depends only on who
        runs, not on how far they got (blocks held + blocks still to come = blocks of the whole request), so the
        core's decode fast path may skip asking while nobody arrives or finishes."""
        bs = view.kv.block_size
        promised = sum(-(-r.max_len // bs) for r in view.running) + sum(-(-r.max_len // bs) for r in view.swapped)
        return view.kv.num_blocks - promised
