"""Continuous batching written only against the public policy API, with one hook per decision.

``QueuePolicy`` schedules as vLLM v1 does: the running requests first (decodes and unfinished prompt chunks, in
admission order), then, if nobody had to be preempted, the swapped requests and then the waiting ones, while
``max_num_seqs``, ``max_num_batched_tokens`` and the free KV blocks allow. With ``enable_chunked_prefill`` prompts
are cut to fill the step's token budget; without it a prompt runs whole beside the decodes or waits (vLLM v1 with
chunked prefill off; v0 ran whole prompts in steps of their own).

A subclass changes one rule by overriding one hook:

- ``rank(req)``: the order of the waiting queue, lower first (None, the default: first come first served, with
  requests preempted by recompute at the front, as vLLM keeps its queue). When ``rank`` is given, the preemption
  victim is the running request of the largest rank (vLLM's priority scheduler), else the latest admitted;
- ``preempt_for_waiting``: a waiting request that finds no free KV or no free slot preempts running requests of a
  larger rank (vLLM's priority policy: a higher-priority arrival displaces lower-priority work);
- ``refuse(req, view)``: a reason to reject a waiting request for good, or None (an SLO-aware admission rule);
  asked of every waiting request whenever the policy plans, before anyone is admitted.

Every order is total and deterministic: ranks end with the arrival time and the request id, sorts are stable.
A victim that was already planned this step leaves the plan and gives its tokens back (the case that crashed vLLM,
#23347). ``sim.policies.fcfs``, ``priority``, ``sjf`` and ``edf`` are subclasses of a few lines each.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from sim.policies.api import Budget, Plan, Policy, PolicyView, RequestView

# a rank as its error shows it: reprlib's defaults cut a key past 30 characters, so a dataclass key's NaN fell in
# the cut ("Key(priority=...al=0.25, id=7)") as did most of a tenant's name; still bounded (a rank of a million
# items) and safe where the user's __repr__ raises
_RANK = reprlib.Repr()  # Python 3.11 takes no keyword arguments here
_RANK.maxstring, _RANK.maxother, _RANK.maxtuple, _RANK.maxlist = 120, 200, 12, 12


class QueuePolicy(Policy):
    """Continuous batching with one hook per decision (``rank``, ``preempt_for_waiting``, ``refuse``): subclass it
    to change one rule; the module docstring says what each hook decides."""

    # Nothing in these rules reads the clock or how far a running request got, so the decision can change only
    # when a request arrives or finishes (or KV runs short, when the core always asks).
    depends_on = frozenset({"arrivals", "finishes"})
    preempt_for_waiting = False
    # the constructor's defaults, here too: a subclass whose __init__ forgets super().__init__() (Python does not
    # insist) failed at its first step with AttributeError: no attribute 'enable_chunked_prefill'
    enable_chunked_prefill = True
    preemption_mode = "recompute"
    _hook_signatures = (*Policy._hook_signatures, ("rank", ("req",)), ("refuse", ("req", "view")))

    def __init__(self, enable_chunked_prefill: bool = True, preemption_mode: str = "recompute") -> None:
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {preemption_mode!r}")
        if not isinstance(enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be true or false, got {enable_chunked_prefill!r}")
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption_mode = preemption_mode

    # ---- the hooks ----------------------------------------------------------------------------------------------
    def rank(self, req: RequestView) -> Any:
        """Sort key of a request, lower served sooner and preempted later; None: first come first served."""
        return None

    def refuse(self, req: RequestView, view: PolicyView) -> str | None:
        """Why a waiting request is rejected now, or None to keep it."""
        return None

    # ---- the step -----------------------------------------------------------------------------------------------
    def schedule(self, view: PolicyView) -> Plan:
        plan = Plan()
        budget = view.kv.budget()
        tokens = view.limits.max_num_batched_tokens
        out: set[int] = set()  # ids preempted this step
        waiting = view.waiting
        if type(self).refuse is not QueuePolicy.refuse:  # every waiting request is asked, each step it waits
            kept = []
            for r in waiting:
                reason = self.refuse(r, view)
                if reason is None:
                    kept.append(r)
                else:
                    plan.reject(r, reason)
            waiting = tuple(kept)
        tokens = self._running(view, plan, budget, tokens, out)
        if plan.preempted:
            return plan  # as vLLM: no admissions in a step that had to preempt
        tokens = self._swapped(view, plan, budget, tokens)
        if len(plan.swapped_in) == len(view.swapped):
            self._waiting(view, waiting, plan, budget, tokens, out)
        return plan

    def _running(self, view: PolicyView, plan: Plan, budget: Budget, tokens: int, out: set[int]) -> int:
        running = view.running
        # The running requests that decode, as most do at any ask, take their token in one call; the generic loop
        # goes on from the first that did not (a prompt chunk, or no room: its preemption below).
        k = budget.allocate_decodes(running if tokens >= len(running) else running[:max(tokens, 0)])
        if k:
            plan.schedule_each(running[:k], 1)
            tokens -= k
        chunked = self.enable_chunked_prefill
        allocate, schedule = budget.allocate, plan.schedule
        for r in running[k:] if k else running:
            if out and r.id in out:
                continue  # preempted to make room for an earlier request
            n = r.num_remaining
            if n > tokens:
                if not chunked:
                    continue
                n = tokens
            if n <= 0:
                break
            if allocate(r, n):
                schedule(r, n)
                tokens -= n
                continue
            while True:
                victim = self._victim(running, out)
                tokens += self._preempt(victim, plan, budget, out)
                if victim is r:
                    break
                if allocate(r, n):
                    schedule(r, n)
                    tokens -= n
                    break
        return tokens

    def _victim(self, running: tuple[RequestView, ...], out: set[int]) -> RequestView:
        left = [r for r in running if r.id not in out]
        if self._first_come(left):
            return left[-1]  # the latest admitted
        keys = self._ranks(left)
        try:
            return left[max(range(len(left)), key=keys.__getitem__)]
        except TypeError as e:
            raise self._unorderable(left, e) from None

    def _first_come(self, reqs: list[RequestView]) -> bool:
        """Whether ``reqs`` keep first come first served: every rank None. A None for the first beside a key for
        another (a branch of rank without its ``return``) is refused: the head's None alone once made the whole
        step first come first served, without a word."""
        if self.rank(reqs[0]) is not None:
            return False
        if type(self).rank is not QueuePolicy.rank:
            for r in reqs[1:]:
                k = self.rank(r)
                if k is not None:
                    raise TypeError(f"rank(req) gave None for request {reqs[0].id} and {_RANK.repr(k)} for request "
                                    f"{r.id}, which do not compare (None keeps first come first served only when every "
                                    "request gets it): give every request a key of one shape, ending with its "
                                    "arrival and id")
        return True

    def _ranks(self, reqs: list[RequestView]) -> list[Any]:
        """The ranks of ``reqs``; a NaN in one (a float, or a field of a tuple, a named tuple or a dataclass) is
        refused: every comparison with NaN is false, so the sort would leave the queue in an arbitrary order and the
        run would say nothing. (A named tuple's or an ordered dataclass's NaN passed: their ``k != k`` compares
        fields by identity first, and a NaN is itself.)"""
        keys = [self.rank(r) for r in reqs]
        for k, r in zip(keys, reqs, strict=True):
            fields = k if isinstance(k, tuple) else \
                [getattr(k, f.name) for f in dataclasses.fields(k)] if dataclasses.is_dataclass(k) else ()
            try:
                bad = k != k or any(x != x for x in fields)
            except ValueError as e:  # a numpy array: Python's message named neither rank nor a request
                raise TypeError(f"rank(req) gave {_RANK.repr(k)} for request {r.id}, whose comparisons have no "
                                f"truth value ({e}): give every request a key of one shape (a tuple, not an array), "
                                "ending with its arrival and id") from None
            if bad:
                raise ValueError(f"rank(req) gave {_RANK.repr(k)} for request {r.id}: NaN does not order (every "
                                 "comparison with it is false), so the queue's order would be arbitrary: give every "
                                 "request a key without NaN")
        return keys

    def _preempt(self, victim: RequestView, plan: Plan, budget: Budget, out: set[int]) -> int:
        """Preempt ``victim``; returns the tokens it had been planned this step (given back)."""
        given_back = plan.unschedule(victim)
        if self.preemption_mode == "swap" and budget.can_swap_out(victim):
            budget.swap_out(victim)
            plan.preempt(victim, "swap")
        else:
            budget.release(victim)
            plan.preempt(victim, "recompute")
        out.add(victim.id)
        return given_back

    def _swapped(self, view: PolicyView, plan: Plan, budget: Budget, tokens: int) -> int:
        for r in view.swapped:
            n = r.num_remaining
            if self.enable_chunked_prefill:
                n = min(n, tokens)
            if len(plan.scheduled) >= view.limits.max_num_seqs or n > tokens or n < 1:
                break
            if not budget.swap_in(r):
                break
            if not budget.allocate(r, n):
                budget.release(r)
                break
            plan.swap_in(r, n)
            tokens -= n
        return tokens

    def _waiting(self, view: PolicyView, waiting: tuple[RequestView, ...], plan: Plan, budget: Budget, tokens: int,
                 out: set[int]) -> None:
        lim = view.limits
        queue = self._in_order(view, waiting)
        num_seqs = len(view.running) - len(plan.preempted) + len(plan.swapped_in)
        admitted = 0
        for r in queue:
            if tokens <= 0:
                break
            n = r.num_tokens - max(r.num_computed_tokens, view.kv.num_cached_tokens(r))
            if self.enable_chunked_prefill:
                n = min(n, tokens)
            elif n > tokens:
                break
            while num_seqs >= lim.max_num_seqs or not budget.allocate(r, n):
                # Displace only before anyone was admitted this step: the core frees the victims' KV before it
                # places the admitted requests, so a later preemption would reorder where they land (contiguous KV)
                freed = self._displace(view, r, plan, budget, out) if not admitted and not plan.swapped_in else None
                if freed is None:
                    return
                tokens += freed
                num_seqs -= 1
            plan.schedule(r, n)
            tokens -= n
            num_seqs += 1
            admitted += 1

    def _in_order(self, view: PolicyView, waiting: tuple[RequestView, ...]) -> Iterable[RequestView]:
        """The waiting requests in the order they are admitted: by ``rank``, stable. The admission loop stops at
        the first that does not fit, so a subclass that can produce the order lazily (VTC) overrides this to pay
        only for the requests it reaches."""
        queue = list(waiting)
        if len(queue) > 1 and not self._first_come(queue):  # one request: nothing to order (the common ask)
            keys = self._ranks(queue)
            try:  # stable: equal ranks keep the queue's order
                queue = [r for _, r in sorted(zip(keys, queue, strict=True), key=itemgetter(0))]
            except TypeError as e:
                raise self._unorderable(queue, e) from None
        return queue

    def _displace(self, view: PolicyView, r: RequestView, plan: Plan, budget: Budget, out: set[int]) -> int | None:
        """Preempt the worst-ranked running request if ``r`` outranks it (``preempt_for_waiting``); returns the
        tokens it gave back, None when nobody may be displaced."""
        if not self.preempt_for_waiting:
            return None
        left = [x for x in view.running if x.id not in out]
        if not left:
            return None
        keys = self._ranks([*left, r])
        try:
            worst = max(range(len(left)), key=keys.__getitem__)
            if not keys[worst] > keys[-1]:
                return None
        except TypeError as e:
            raise self._unorderable([*left, r], e) from None
        victim = left[worst]
        return self._preempt(victim, plan, budget, out)

    def _unorderable(self, reqs: list[RequestView], error: TypeError) -> TypeError:
        """The error for ranks of ``reqs`` that do not compare (``None`` beside a tuple, a str beside a number),
        naming two requests and their ranks: Python's own message names only the types. A rank that raises
        TypeError itself raises it here again, from the user's own line."""
        ranks = [(self.rank(r), r.id) for r in reqs]
        for i, (a, ia) in enumerate(ranks[:200]):  # an error path: a bounded search for one pair
            for b, ib in ranks[i + 1:]:
                try:
                    a < b  # noqa: B015 (the comparison is the check)
                except TypeError:
                    return TypeError(f"rank(req) gave {_RANK.repr(a)} for request {ia} and {_RANK.repr(b)} for "
                                     f"request {ib}, which do not compare ({error}): give every request a key of one "
                                     "shape, ending with its arrival and id")
        return error


class FCFSPolicy(QueuePolicy):
    """First come, first served: vLLM's default ``--scheduling-policy fcfs``. The same schedule as the built-in
    continuous policy with the same chunking (the tests compare them step by step)."""
