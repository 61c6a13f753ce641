"""Static (naive) batching: the baseline that continuous batching replaced.

Wait until ``batch_size`` requests are queued or the oldest has waited ``max_wait`` seconds, then run that batch
to completion: one padded prefill (every prompt padded to the longest), then decode steps until the longest
output is done. Finished requests keep their rows as padding, so every step costs the whole padded batch, and
nothing new is admitted until the whole batch is done. This is what the seed documents mean by "the GPU sits
mostly idle waiting for the longest request in the batch".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sim.policies.base import Admission, Limits, Plan, Policy, View, plan_group, preempt_for, swap_back


@dataclass(slots=True)
class StaticPolicy(Policy):
    batch_size: int = 8  # requests per batch
    max_wait: float = 1.0  # seconds the oldest queued request waits for a full batch
    limits: Limits = field(default_factory=lambda: Limits(max_num_batched_tokens=1 << 30))
    preemption_mode: str = "recompute"  # only when the KV manager is paged and runs out mid-batch
    admission: Admission = field(default_factory=Admission)
    _rows: int = 0  # rows of the batch in flight (finished requests stay as padding rows)
    uses_decode_group: ClassVar[bool] = True  # plans the core's decode group as a whole (sim.serving.decode_group)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_wait < 0:
            raise ValueError(f"max_wait must be >= 0, got {self.max_wait}")
        if self.batch_size > self.limits.max_num_seqs:
            raise ValueError(f"batch_size {self.batch_size} exceeds max_num_seqs {self.limits.max_num_seqs}")

    def wake_time(self, view: View) -> float | None:
        deadline = self.admission.deadline(view.waiting)
        times = [] if deadline is None else [deadline]
        if not view.running and view.waiting:
            times.append(view.waiting[0].arrival + self.max_wait)
        return min(times) if times else None

    def schedule(self, view: View) -> Plan:
        plan = self._schedule(view)
        if plan.decode_group and plan.preempt:
            view.ungroup()  # victims are chosen in admission order, which the group hides
            plan = self._schedule(view)
        return plan

    def _schedule(self, view: View) -> Plan:
        plan = Plan(reject=self.admission.rejections(view), pad_to_longest=True)
        budget = view.budget()
        if view.running or view.swapped:  # the batch in flight runs to completion
            taken: set[int] = set()
            candidates, _ = plan_group(view, plan, budget, 1 << 62)
            for r in candidates:
                if r.id in taken:
                    continue
                n = r.num_remaining
                if preempt_for(r, n, view.running, budget, plan, self.preemption_mode, taken):
                    taken.add(r.id)
                    plan.scheduled.append((r, n))
            if not plan.preempt:  # members of the batch swapped out come back as room allows
                for r in view.swapped:
                    if not swap_back(r, r.num_remaining, budget, plan):
                        break
            group = view.group.size if plan.decode_group and view.group is not None else 0
            plan.padded_rows = max(0, self._rows - len(plan.scheduled) - group)
            return plan
        rejected = {r.id for r, _ in plan.reject}
        queued = [r for r in view.waiting if r.id not in rejected]
        if not queued:
            return plan
        full = len(queued) >= self.batch_size
        if not full and view.now < queued[0].arrival + self.max_wait:
            return plan  # keep waiting for a full batch
        for r in queued[: self.batch_size]:
            n = r.num_tokens - max(r.num_computed_tokens, view.kv.num_cached_tokens(r))
            if not budget.allocate(r, n):
                break
            plan.scheduled.append((r, n))
        self._rows = len(plan.scheduled)
        return plan
