"""Deliberately broken user policies: each must end a run with exit 2 and one message naming what is wrong
(tests/test_policy_errors.py)."""

import os
import signal
import sys
import time

import servesim
from sim.policies.queue import FCFSPolicy

LIMIT = 4  # named as a class by mistake (tests/test_policy_errors.py)


class NoSchedule(servesim.Policy):
    pass


class NotAPolicy:
    def plan(self, view):
        return None


class Raises(FCFSPolicy):
    def schedule(self, view):
        if view.running:
            return self.helper(view)
        return super().schedule(view)

    def helper(self, view):
        return {}["no such key"]


class ReturnsNone(servesim.Policy):
    def schedule(self, view):
        return None


class ReturnsPlanClass(servesim.Policy):
    def schedule(self, view):
        return servesim.Plan


class TooMany(servesim.Policy):
    """Schedules every request, past max_num_seqs."""

    def schedule(self, view):
        plan = servesim.Plan()
        for r in view.running + view.waiting:
            plan.schedule(r, r.num_remaining)
        return plan


class Twice(servesim.Policy):
    def schedule(self, view):
        plan = servesim.Plan()
        if view.waiting:
            r = view.waiting[0]
            plan.schedule(r, 1)
            plan.schedule(r, 1)
        return plan


class Idle(servesim.Policy):
    """Never schedules anything: a livelock."""

    def schedule(self, view):
        return servesim.Plan()


class NeedsArgs(FCFSPolicy):
    def __init__(self, threshold: int) -> None:
        super().__init__()
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.threshold = threshold


class ClockReader(FCFSPolicy):
    """Declares arrivals and finishes, yet its decision reads the clock: it admits nothing during the first 0.2 s of
    every second. Check mode must catch the wrong declaration."""

    def schedule(self, view):
        if view.now % 1.0 < 0.2:
            plan = servesim.Plan()
            budget = view.kv.budget()
            for r in view.running:
                if budget.allocate(r, 1) and r.num_remaining == 1:
                    plan.schedule(r, 1)
            return plan
        return super().schedule(view)


class Fewest(servesim.Router):
    """The fewest outstanding requests, ties to the lowest index: the built-in least_outstanding, rewritten."""

    def route(self, request, replicas):
        return min(replicas, key=lambda r: (r.num_outstanding, r.index)).index


class OutOfRange(servesim.Router):
    def route(self, request, replicas):
        return len(replicas)


class ShortOnly(servesim.Admission):
    def __init__(self, limit: int = 100) -> None:
        self.limit = limit

    def admit(self, request, state):
        return None if request.prompt_len <= self.limit else f"prompt over {self.limit} tokens"


class TurnsAwayWithEmptyReason(servesim.Admission):
    """admit() returning "" to mean "accept": every request was refused, with an empty reason, and exit 0."""

    def admit(self, request, state):
        return "" if request.prompt_len <= 100 else "long"


class TakesBackWhatItPlans(servesim.Policy):
    """Admits a token of the first waiting request, then preempts it at the next ask, forever: the run never ended."""

    def schedule(self, view):
        plan = servesim.Plan()
        budget = view.kv.budget()
        for r in view.running:
            budget.release(r)
            plan.preempt(r)
        if not view.running:
            for r in view.waiting[:1]:
                if budget.allocate(r, 1):
                    plan.schedule(r, 1)
        return plan


class WakesForever(servesim.Policy):
    """Plans nothing but asks to be woken 10 ms later, every time: the run never ended."""

    def schedule(self, view):
        return servesim.Plan()

    def wake_time(self, view):
        return view.now + 0.01


class ReservesById(servesim.Policy):
    """Hands the budget a request's id, not its view: the public API refuses it."""

    def schedule(self, view):
        budget = view.kv.budget()
        for r in view.waiting[:1]:
            budget.allocate(r.id, 1)
        return servesim.Plan()


class Spins(FCFSPolicy):
    """Never returns: a loop whose exit condition is wrong."""

    def schedule(self, view):
        while view.now >= 0:
            pass


class Sleeps(FCFSPolicy):
    """Never returns: waits on something that never comes."""

    def schedule(self, view):
        time.sleep(3600)


class PressesCtrlC(FCFSPolicy):
    """Ctrl-C arrives while the policy runs: the SIGINT a terminal sends."""

    def schedule(self, view):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)


class RaisesKeyboardInterrupt(FCFSPolicy):
    """Raises KeyboardInterrupt itself (no Ctrl-C was pressed): it read 'interrupted while simulating', exit 130."""

    def schedule(self, view):
        raise KeyboardInterrupt


class SpinsRouting(servesim.Router):
    """Never returns: a router's loop whose exit condition is wrong."""

    def route(self, request, replicas):
        while request.prompt_len > 0:
            pass


class SleepsAdmitting(servesim.Admission):
    """Never returns: an admission rule waiting on something that never comes."""

    def admit(self, request, state):
        time.sleep(3600)


class SysExits(FCFSPolicy):
    """Calls sys.exit(0) in the middle of a run: servesim ended with status 0, no message and no run folder."""

    def schedule(self, view):
        if view.running:
            sys.exit(0)
        return super().schedule(view)


class SysExitsInInit(FCFSPolicy):
    def __init__(self, **kwargs) -> None:
        raise SystemExit(3)


class RaisesInDescribe(FCFSPolicy):
    def describe(self):
        raise RuntimeError("describe broke")


class PrintsItsDescription(FCFSPolicy):
    """describe() that prints its line and returns None: the run showed 'policy None: asked ...', exit 0."""

    def describe(self):
        print("FCFS, printed")


class UnprintableError(FCFSPolicy):
    def schedule(self, view):
        raise _Unprintable()


class _Unprintable(Exception):
    def __str__(self):
        raise ValueError("no message")


class SleepsInInit(FCFSPolicy):
    """A constructor that never returns: it ran at validation, before any watch, and the run hung."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        time.sleep(3600)


class RanksUnlike(servesim.QueuePolicy):
    """Ranks of two shapes: None for odd ids (meant as 'no preference'), a tuple for the others."""

    def rank(self, req):
        return None if req.id % 2 else (req.arrival, req.id)


class ForgetsAReturn(servesim.QueuePolicy):
    """A rank meant to put the last request ahead, whose other branch lacks its `return` (None): the waiting head's
    None made the step first come first served, so the run ended with exit 0 and the order it was written for
    silently never happened."""

    def rank(self, req):
        if req.id == 19:
            return (0, req.arrival, req.id)
        (1, req.arrival, req.id)  # the missing `return` is the mistake


class RanksNaN(servesim.QueuePolicy):
    """A rank read from a field that is sometimes missing (NaN): every comparison with NaN is false, and the queue
    was left in whatever order the sort made of it, without a word."""

    def rank(self, req):
        return (float("nan") if req.id == 3 else req.prompt_len, req.id)


class RanksByArray(servesim.QueuePolicy):
    """A rank built with numpy: an array's comparison has no truth value, and numpy's ValueError named neither
    rank nor a request."""

    def rank(self, req):
        import numpy as np

        return np.array([req.prompt_len, req.id])


class PreemptsWithoutRank(servesim.QueuePolicy):
    """preempt_for_waiting on first come first served: no ranks to compare, and the first displacement raised
    TypeError mid-run about None ranks the user never wrote."""

    preempt_for_waiting = True


class RefusesWithEmptyReason(servesim.QueuePolicy):
    """refuse() returning "" to mean "keep it": every request was rejected, with an empty reason, and exit 0."""

    def refuse(self, req, view):
        return "" if req.prompt_len <= 100 else None


class RefusesWithTrue(servesim.QueuePolicy):
    """refuse() answering a yes/no question: True was recorded as the reason 'True' and every request rejected."""

    def refuse(self, req, view):
        return req.prompt_len > 100


class TripleByHand(FCFSPolicy):
    """Adds to the plan's list by hand, three values where the plan holds pairs: a traceback from the core, exit 1."""

    def schedule(self, view):
        plan = super().schedule(view)
        if view.waiting:
            plan.scheduled.append((view.waiting[-1], 1, "first"))
        return plan


class RejectsByHand(FCFSPolicy):
    def schedule(self, view):
        plan = super().schedule(view)
        plan.rejected = None
        return plan


class TakesNoView(FCFSPolicy):
    """schedule without its view: failed only at the first call, mid-run, with Python's TypeError."""

    def schedule(self):
        return servesim.Plan()


class RanksWithView(servesim.QueuePolicy):
    def rank(self, req, view):
        return (req.arrival, req.id)


class RoutesWithoutReplicas(servesim.Router):
    def route(self, request):
        return 0


class SwapsOutUnreserved(FCFSPolicy):
    """Swaps a running request out whenever requests wait, without budget.swap_out: past the CPU swap space."""

    def schedule(self, view):
        if view.running and view.waiting:
            plan = servesim.Plan()
            plan.preempt(view.running[0], mode="swap")
            return plan
        return super().schedule(view)


class SwapsInUnreserved(FCFSPolicy):
    """Swaps every swapped request back in at once, without budget.swap_in: past the free GPU blocks."""

    def __init__(self, **kwargs) -> None:
        super().__init__(preemption_mode="swap", **kwargs)

    def schedule(self, view):
        if view.swapped:
            plan = servesim.Plan()
            for r in view.swapped:
                plan.swap_in(r, r.num_remaining)
            return plan
        return super().schedule(view)


class RejectsTwice(FCFSPolicy):
    def schedule(self, view):
        if view.waiting:
            plan = servesim.Plan()
            plan.reject(view.waiting[0], "first")
            plan.reject(view.waiting[0], "second")
            return plan
        return super().schedule(view)


class PreemptsTwice(FCFSPolicy):
    def schedule(self, view):
        if view.running and view.waiting:
            plan = servesim.Plan()
            view.kv.budget().release(view.running[0])
            plan.preempt(view.running[0])
            plan.preempt(view.running[0])
            return plan
        return super().schedule(view)


class _Abort(BaseException):
    """A user's own exception on BaseException (as some libraries define theirs): not an Exception."""


class RaisesBaseException(FCFSPolicy):
    def schedule(self, view):
        if view.running:
            raise _Abort("gave up")
        return super().schedule(view)


class RaisesGeneratorExitInInit(FCFSPolicy):
    def __init__(self, **kwargs) -> None:
        raise GeneratorExit("closed")


class ScheduleIsAsync(FCFSPolicy):
    async def schedule(self, view):
        return super().schedule(view)


class SignSlip(FCFSPolicy):
    """Asks the budget for -5 tokens (a sign slip): the budget took it and the run went on."""

    def schedule(self, view):
        if view.waiting:
            view.kv.budget().allocate(view.waiting[0], -5)
        return super().schedule(view)


class SlowToPlan(FCFSPolicy):
    """5 ms of work per ask, asked every step: its steps on an L4 take a few ms, and neither the simulator nor
    the engine puts the policy's own time on its clock, so it looked as fast as FCFS without a word."""

    depends_on = frozenset({"every_step"})

    def schedule(self, view):
        time.sleep(0.005)
        return super().schedule(view)


class NeverPreempts(servesim.Policy):
    """Running requests first, then waiting ones while their prompt fits; nobody is ever preempted: once the
    running requests fill the KV cache none gets its next token, and the stall named no cause but "a policy never
    schedules them?"."""

    def schedule(self, view):
        plan = servesim.Plan()
        budget = view.kv.budget()
        for r in view.running:
            if budget.allocate(r, 1 if not r.is_prefill else r.num_remaining):
                plan.schedule(r, 1 if not r.is_prefill else r.num_remaining)
        slots = view.limits.max_num_seqs - len(view.running)
        for r in view.waiting[:max(slots, 0)]:
            if budget.allocate(r, r.num_remaining):
                plan.schedule(r, r.num_remaining)
        return plan


class WakesAtNaN(servesim.QueuePolicy):
    """wake_time from a mean over no request (NaN): read as no wake-up at all, without a word."""

    def wake_time(self, view):
        return sum(r.deadline for r in view.swapped) / max(len(view.swapped), 1) * float("nan")


class WakesAtText(servesim.QueuePolicy):
    """wake_time returning the time as text: "0.5" was read as 0.5 s."""

    def wake_time(self, view):
        return f"{view.now + 0.5}"


class RanksByVllmName(servesim.QueuePolicy):
    """vLLM's Request calls it arrival_time; the view, arrival."""

    def rank(self, req):
        return (req.arrival_time, req.id)


class SchedulesSwapped(servesim.Policy):
    """Swaps the latest running request out, then plans it with plan.schedule, not plan.swap_in."""

    def schedule(self, view):
        plan = servesim.Plan()
        budget = view.kv.budget()
        if view.swapped:
            plan.schedule(view.swapped[0], 1)
            return plan
        if len(view.running) >= 2:
            budget.swap_out(view.running[-1])
            plan.preempt(view.running[-1], mode="swap")
        for r in view.running[:-1] if plan.preempted else view.running:
            if budget.allocate(r, 1):
                plan.schedule(r, 1)
        for r in view.waiting[:1]:
            if not plan.preempted and budget.allocate(r, r.num_remaining):
                plan.schedule(r, r.num_remaining)
        return plan


class RanksUnderAMisspelledName(servesim.QueuePolicy):
    """rank written rnak: it ran as plain first come first served, exit 0."""

    def rnak(self, req):
        return (req.prompt_len, req.arrival, req.id)


class WithMisspelledDependsOn(servesim.QueuePolicy):
    """Reads the clock, and meant to say so: QueuePolicy's own depends_on stayed, silently."""

    depend_on = frozenset({"every_step"})

    def rank(self, req):
        return (req.arrival, req.id)


class RoutesUnderAMisspelledName(servesim.Router):
    def rout(self, request, replicas):
        return 0


class TagsTheView(servesim.QueuePolicy):
    """Notes something on the view: Python 3.11 said "TypeError: super(type, obj): obj must be an instance or subtype
    of type" (a frozen slots dataclass's own __setattr__), naming neither the view nor the mistake."""

    def schedule(self, view):
        view.note = "seen"
        return super().schedule(view)


class ReadsKVFreeBlocks(servesim.QueuePolicy):
    """view.kv.free_blocks for num_free_blocks: Python's own traceback says "Did you mean", servesim's line did not."""

    def schedule(self, view):
        if view.kv.free_blocks < 1:
            return servesim.Plan()
        return super().schedule(view)


class RejectsWithNoReason(servesim.Policy):
    """plan.reject(req, None) in a policy of its own: told what QueuePolicy.refuse returns, a hook it does not have."""

    def schedule(self, view):
        plan = servesim.Plan()
        for r in view.waiting:
            plan.reject(r, None)
        return plan


class ShortAheadForwardsArgs(servesim.QueuePolicy):
    """docs/write-a-policy.md's ShortAhead: its **kwargs go to QueuePolicy, whose name Python's error gave for a typo."""

    def __init__(self, short: int = 512, **kwargs) -> None:
        super().__init__(**kwargs)
        self.short = short

    def rank(self, req):
        return (req.prompt_len > self.short, req.arrival, req.id)


class _NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class SchedulesAnUnprintable(servesim.QueuePolicy):
    """Plans an object of its own whose __repr__ raises: servesim's message raised in turn, a traceback and exit 1."""

    def schedule(self, view):
        plan = super().schedule(view)
        plan.schedule(_NoRepr(), 1)
        return plan


class RanksUnprintable(servesim.QueuePolicy):
    """Ranks that do not compare, holding an object of its own whose __repr__ raises: the message about them raised."""

    def rank(self, req):
        return (_NoRepr(), req.id)


class RanksNoneThenUnprintable(servesim.QueuePolicy):
    """None for the waiting head, an unprintable key for the others: the message about them raised."""

    def rank(self, req):
        return None if req.id % 2 else _NoRepr()


class PreemptsWithAnUnprintableMode(servesim.QueuePolicy):
    def schedule(self, view):
        plan = super().schedule(view)
        if view.running:
            plan.preempt(view.running[0], _NoRepr())
        return plan


class SchedulesUnprintableTokens(servesim.Policy):
    def schedule(self, view):
        plan = servesim.Plan()
        if view.waiting:
            plan.schedule(view.waiting[0], _NoRepr())
        return plan


class DescribesWithAnUnprintable(FCFSPolicy):
    def describe(self):
        return _NoRepr()


class RoutesToAnUnprintable(servesim.Router):
    """route() returning an object of its own whose __repr__ raises: the message about it raised, a traceback."""

    def route(self, request, replicas):
        return _NoRepr()


class AdmitsWithAnUnprintable(servesim.Admission):
    """admit() returning an object of its own whose __repr__ raises: the message about it raised, a traceback."""

    def admit(self, request, state):
        return _NoRepr()


class SchedulesTheView(servesim.Policy):
    """plan.schedule(view, 1): the message held the whole view's repr, every request in it."""

    def schedule(self, view):
        plan = servesim.Plan()
        plan.schedule(view, 1)
        return plan


class RoutesNowhere(servesim.Router):
    """A Router subclass without route(): it was told to '(subclass servesim.Router)', which it does."""
