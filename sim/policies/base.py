"""The narrow waist between the serving core and the scheduling policies.

A policy looks at a read-only ``View`` of the core and returns a ``Plan``: which requests compute how many
tokens this step, which are preempted (by recompute or by swap), which come back from swap, and which are
rejected. It never mutates anything; the core checks the plan against the limits and the free blocks and
applies it. No policy knows whether the simulator or the real engine executes the step.

A policy's decision may change only when the waiting, running or swapped sets change, a request finishes,
a block allocation would fail, the time its ``wake_time`` names has passed, or (``num_scheduler_steps`` > 1)
a block of that many decode steps ends. The core relies on this to run
long stretches of pure decode steps without asking the policy each step (the decode fast path).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from sim.serving.decode_group import DecodeGroup
from sim.serving.kv_manager import KVBudget, KVManager
from sim.serving.request import Request

_T = TypeVar("_T", bound=type)


def read_only(cls: _T) -> _T:
    """A frozen ``slots`` dataclass a policy is given, whose assignments say so: Python 3.11's own ``__setattr__``
    for such a class raised "TypeError: super(type, obj): obj must be an instance or subtype of type" for a name
    that is not a field (``view.note = ...`` in a user's policy), naming neither the class nor the mistake."""

    def refuse(self: Any, name: str, value: Any = None) -> None:
        raise FrozenInstanceError(f"cannot change {name!r}: {type(self).__name__} is read-only (what the core shows "
                                  f"as of this step); keep state of your own on your object (self.{name} = ...)")

    cls.__setattr__ = refuse  # type: ignore[method-assign]
    cls.__delattr__ = refuse  # type: ignore[method-assign,assignment]
    return cls


@read_only
@dataclass(frozen=True, slots=True)
class Limits:
    """Per-step limits, with vLLM's names."""

    max_num_seqs: int = 256  # requests in one step at most
    max_num_batched_tokens: int = 8192  # tokens computed in one step at most (padding excluded)
    max_model_len: int = 8192  # prompt plus output tokens a request may hold
    # longest prompt accepted, where the engine limits it apart from max_model_len (TGI's --max-input-tokens under
    # its --max-total-tokens); None: max_model_len
    max_prompt_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_len is not None and not 1 <= self.max_prompt_len < self.max_model_len:
            raise ValueError(f"max_prompt_len must be >= 1 and < max_model_len {self.max_model_len}, got "
                             f"{self.max_prompt_len}")


@dataclass(frozen=True, slots=True)
class Admission:
    """Admission control: who is refused instead of queued forever. Rejections are counted, never dropped."""

    max_queue_len: int | None = None  # reject arrivals beyond this many waiting requests
    max_queue_delay: float | None = None  # seconds; reject a request still waiting (never run) after this long
    # a user's or built-in rule on the public API (sim.policies.gates.UserAdmission), asked after the checks above
    rule: Any = None

    def deadline(self, waiting: deque[Request]) -> float | None:
        """When the oldest never-scheduled request will have waited too long."""
        if self.max_queue_delay is None:
            return None
        for r in waiting:
            if r.first_scheduled < 0:
                return r.arrival + self.max_queue_delay
        return None

    def on_arrival(self, req: Request, view: View) -> str | None:
        """Why a newly arrived request is refused at once (as an API server answers an error), or None."""
        kv, limits = view.kv, view.limits
        if req.max_len > limits.max_model_len:
            return f"prompt+output {req.max_len} tokens exceeds max_model_len {limits.max_model_len}"
        if limits.max_prompt_len is not None and req.prompt_len > limits.max_prompt_len:
            return f"prompt {req.prompt_len} tokens exceeds the engine's max_input_tokens {limits.max_prompt_len}"
        if not kv.can_ever_fit(req):
            return f"needs more KV than the whole cache ({kv.num_blocks} blocks of {kv.block_size} tokens)"
        if self.max_queue_len is not None and len(view.waiting) >= self.max_queue_len:
            return f"queue already holds max_queue_len {self.max_queue_len} requests"
        if self.rule is not None:
            return self.rule.on_arrival(req, view.now, len(view.waiting), len(view.running), kv)
        return None

    def rejections(self, view: View) -> list[tuple[Request, str]]:
        """Waiting requests that have waited too long without ever being scheduled."""
        if self.max_queue_delay is None:
            return []
        out: list[tuple[Request, str]] = []
        delay, now = self.max_queue_delay, view.now
        for r in view.waiting:  # FCFS, so the never-scheduled ones are in arrival order
            if r.first_scheduled >= 0:
                continue  # preempted, not new: it has been admitted once
            if r.arrival + delay > now:  # the same sum as ``deadline``, so the wake-up time rejects it
                break
            out.append((r, f"waited longer than max_queue_delay {self.max_queue_delay} s"))
        return out


@dataclass(slots=True)
class View:
    """What a policy may look at. The queues are the core's own containers: read them, never change them.

    With the simulator's fast path, decoding requests sit in a decode group (``group``) whose members'
    own counters are not current: a policy that sets ``uses_decode_group`` plans them all with
    ``Plan.decode_group`` and looks one by one only at ``outside``; it calls ``ungroup()`` first if it needs to
    see every running request as it is."""

    now: float
    waiting: deque[Request]  # FCFS; recompute-preempted requests go back to the front
    running: list[Request]  # in admission order; the last is the first preemption victim
    swapped: deque[Request]
    kv: KVManager
    limits: Limits
    group: DecodeGroup | None = None
    outside: list[Request] | None = None  # running requests not in the group (all of them without a group)
    ungroup: Callable[[], None] = lambda: None
    decode_run: int = 0  # consecutive decode-only steps just taken (vLLM 0.6 multi-step blocks: sim/engines/sched.py)

    def budget(self) -> KVBudget:
        """A scratch copy of the free KV space to plan with."""
        return self.kv.budget()


@dataclass(slots=True)
class Plan:
    """A policy's decision for one step. The core applies: rejections, preemptions, swap-ins, then the
    scheduled list in order (a waiting request listed there is admitted)."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens to compute)
    preempt: list[tuple[Request, str]] = field(default_factory=list)  # (running request, "recompute" | "swap")
    swap_in: list[Request] = field(default_factory=list)  # swapped requests brought back (also scheduled)
    reject: list[tuple[Request, str]] = field(default_factory=list)  # (waiting or swapped request, reason)
    padded_rows: int = 0  # rows the step computes for nobody (static batching keeps finished rows)
    pad_to_longest: bool = False  # every row computes as many tokens as the longest row (padded prefill)
    decode_group: bool = False  # every member of the core's decode group computes one token


class Policy(Protocol):
    """A scheduling policy. ``limits`` are checked by the core against every plan.

    ``limits``, ``schedule`` and ``wake_time`` are required; the other members have the defaults written here,
    which a class that subclasses ``Policy`` inherits (the core reads them once, with these defaults for a policy
    that implements the protocol without subclassing it)."""

    __slots__ = ()  # keeps the slots of the dataclasses that subclass it

    limits: Limits
    # Who is refused at arrival or after waiting too long (``Admission.on_arrival``, ``rejections``); None: the
    # core refuses nobody at arrival.
    admission: Admission | None = None
    # The policy plans the core's decode group as a whole (``Plan.decode_group``, ``plan_group``): the core then
    # keeps one (sim.serving.decode_group) when its fast path is on.
    uses_decode_group: ClassVar[bool] = False
    # With nothing waiting or swapped and every running request decoding, the policy schedules exactly the
    # decode group: the core may then take such steps without asking it (sim.serving.fast_path).
    decode_all_when_idle: ClassVar[bool] = False

    def schedule(self, view: View) -> Plan:
        ...

    def schedule_arrival(self, view: View) -> Plan | None:
        """Optional (the core asks ``schedule`` where a policy lacks it or it returns None): the plan ``schedule(view)``
        would return, made faster, asked when nothing is swapped: mostly one request waiting and every running
        request in the decode group (``outside`` empty), which the step after nearly every arrival is."""
        return None

    def wake_time(self, view: View) -> float | None:
        """The next time the policy's decision may change without any arrival or finish (a batch timeout, an
        admission deadline), or None."""
        ...


def plan_group(view: View, plan: Plan, budget: KVBudget, tokens: int) -> tuple[list[Request], int]:
    """Schedule the decode group as a whole when the token budget and the free blocks allow (one token and
    at most one new block per member); else dissolve it. Returns the running requests left to plan one by one
    and the tokens left."""
    g = view.group
    if g is not None and g.members:
        if g.size <= tokens and budget.take(g.next_blocks):
            plan.decode_group = True
            assert view.outside is not None  # the core always lists the requests outside its group
            return view.outside, tokens - g.size
        view.ungroup()
    return view.running, tokens


def swap_back(r: Request, n: int, budget: KVBudget, plan: Plan) -> bool:
    """Plan bringing a swapped request back and computing ``n`` of its tokens, if the KV allows."""
    if not budget.swap_in(r):
        return False
    if not budget.allocate(r, n):
        budget.release(r)
        return False
    plan.swap_in.append(r)
    plan.scheduled.append((r, n))
    return True


def preempt_for(
    req: Request,
    n: int,
    running: list[Request],
    budget: KVBudget,
    plan: Plan,
    mode: str,
    taken: set[int],
) -> bool:
    """Free KV for ``req`` to compute ``n`` tokens by preempting the latest-admitted running requests not yet
    planned this step, as vLLM does. Returns False when ``req`` itself had to be preempted."""
    while not budget.allocate(req, n):
        victim = None
        for r in reversed(running):
            if r.id not in taken:
                victim = r
                break
        if victim is None or victim is req:
            _preempt(req, budget, plan, mode)
            taken.add(req.id)
            return False
        _preempt(victim, budget, plan, mode)
        taken.add(victim.id)
    return True


def _preempt(req: Request, budget: KVBudget, plan: Plan, mode: str) -> None:
    if mode == "swap" and budget.can_swap_out(req):
        budget.swap_out(req)
        plan.preempt.append((req, "swap"))
    else:  # recompute, or swap space is full
        budget.release(req)
        plan.preempt.append((req, "recompute"))
