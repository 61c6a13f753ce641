"""The public face of a scheduling policy: what a user's own policy reads and what it returns.

A policy is a class with one required method, ``schedule(view) -> Plan``::

    import servesim

    class ShortestFirst(servesim.Policy):
        depends_on = frozenset({"arrivals", "finishes"})  # when its decision can change (default: every step)

        def schedule(self, view: servesim.PolicyView) -> servesim.Plan:
            plan = servesim.Plan()
            budget = view.kv.budget()
            ...
            return plan

The view is read-only: every request in it is a ``RequestView`` (arrival, prompt length, tokens computed and
generated so far, priority, tenant, SLO class, deadline, a predicted output length where a predictor is set), the
KV cache is a ``KVView`` (free and used blocks, and a scratch ``Budget`` to plan with), and ``limits`` are the
step limits the core enforces. The plan lists which requests compute how many tokens this step, which running
requests are preempted, which swapped ones come back and which waiting ones are refused. The serving core checks
every plan against the limits and the free KV blocks and applies it; the same object drives the simulator and the
real engine (``realengine``), which differ only in how long a step takes.

Nothing here exposes the simulator's fast path. A policy says what its decision depends on (``depends_on``); the
core then decides on its own when a stretch of pure decode steps may be taken without asking it. A policy that
declares nothing is asked every step, which is always correct, only slower. ``servesim check-policy`` (or
``sim.policies.user.check_fast_path``) runs a policy both ways and names the first step where they differ.

This is the module a policy author reads; the built-in ``fcfs``, ``priority``, ``sjf`` and ``edf`` policies are
written against it only (``sim.policies.queue`` and its subclasses), so they are the examples to copy.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from sim.policies.base import Limits, read_only
from sim.serving.request import Request

if TYPE_CHECKING:
    from sim.serving.decode_group import DecodeGroup
    from sim.serving.kv_manager import KVBudget, KVManager

__all__ = ["DEPENDS_ON", "Budget", "KVView", "Limits", "Plan", "Policy", "PolicyView", "Predictor", "RequestView"]

# What a policy's decision may depend on (``Policy.depends_on``). "arrivals" and "finishes": the decision changes
# only when a request arrives, finishes, is aborted, or when KV blocks run short (the core always asks then); a
# finish while nothing waits only shrinks a step in which everyone decodes, so the core asks at it only when
# requests wait (the running set's decision, restricted to who is left);
# "every_step": anything (the time, how far requests got), so the policy is asked before every step.
DEPENDS_ON = frozenset({"arrivals", "finishes", "every_step"})


class Predictor(Protocol):
    """Predicts a request's output length from what a server knows when it arrives (``sim.policies.predictors``)."""

    def predict(self, req: Request) -> int: ...


class RequestView:
    """A read-only view of one request, current as of the step being planned. Compare views with ``is`` or by
    ``id``; hand them back to the ``Plan`` and the ``Budget``. A policy's views of a request are one object from
    step to step until the request finishes."""

    __slots__ = ("_r", "_pred", "_g", "_ttft")

    def __init__(self, r: Request, predictor: Predictor | None = None, ttft_slo: float | None = None) -> None:
        self._r = r
        self._pred = predictor
        self._ttft = ttft_slo  # the run's TTFT SLO (the scenario's slos), for a request whose class sets none
        # The core's decode group, set by the policy adapter (sim.policies.user): while the request is a member
        # its own counters lag the group's steps, and reading one through the view brings them up to date
        # (``_now``), so an ask costs nothing for the members a policy does not read.
        self._g: DecodeGroup | None = None

    def _now(self) -> Request:
        """The request, its counters current."""
        r = self._r
        if r.group_base >= 0 and self._g is not None:
            self._g.bring(r)
        return r

    # what the client sent
    @property
    def id(self) -> int:
        return self._r.id

    @property
    def arrival(self) -> float:
        """Seconds since the start of the run when the request reached the server."""
        return self._r.arrival

    @property
    def prompt_len(self) -> int:
        return self._r.prompt_len

    @property
    def priority(self) -> int:
        """Lower is served sooner (vLLM's convention); 0 unless the workload's classes or trace set it."""
        return self._r.spec.priority

    @property
    def tenant(self) -> str:
        return self._r.spec.tenant

    @property
    def slo_class(self) -> str:
        return self._r.spec.slo_class

    @property
    def deadline(self) -> float:
        """When its first token is due (arrival + its TTFT SLO: its class's, else the scenario's ``slos``), in run
        seconds; ``inf`` without a TTFT SLO."""
        slo = self._r.spec.ttft_slo
        if slo is None:
            slo = self._ttft
        return self._r.arrival + slo if slo is not None else float("inf")

    @property
    def predicted_output_len(self) -> int | None:
        """The configured predictor's estimate of the output length (tokens); None without a predictor. The true
        length is not shown: a real server does not know it either."""
        return self._pred.predict(self._now()) if self._pred is not None else None

    # serving state
    @property
    def status(self) -> str:
        """"waiting", "running" or "swapped"."""
        return self._r.status.value

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache."""
        return self._now().num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far (kept across a recompute preemption)."""
        return self._now().num_output_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        r = self._now()
        return r.prompt_len + r.num_output_tokens

    @property
    def num_remaining(self) -> int:
        """Tokens to compute before its next token is sampled: the rest of the prompt, or 1 while decoding."""
        r = self._r  # a decode-group member's counters lag by as many tokens each: the difference is current
        return r.prompt_len + r.num_output_tokens - r.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_remaining > 1

    @property
    def first_scheduled(self) -> float | None:
        """When it first ran, or None if it never has."""
        t = self._r.first_scheduled
        return t if t >= 0 else None

    @property
    def num_preemptions(self) -> int:
        return self._r.num_preemptions

    def __repr__(self) -> str:
        return (f"RequestView(id={self.id}, {self.status}, computed={self.num_computed_tokens}/{self.num_tokens}, "
                f"out={self.num_output_tokens}, priority={self.priority})")

    def __getattr__(self, name: str) -> Any:
        """Only for a name the view lacks: vLLM's name for a field (``req.arrival_time``), or a near miss, gets the
        view's own; the run printed Python's bare "'RequestView' object has no attribute 'arrival_time'"."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"'RequestView' object has no attribute {name!r}{_view_hint(name)}")


# vLLM's v1 Request's names (vllm/v1/request.py) and what a user may reach for, with the view's own
_VLLM_REQUEST_NAMES = {
    "arrival_time": "arrival", "num_prompt_tokens": "prompt_len", "request_id": "id",
    "max_tokens": None, "output_len": None, "num_output": None, "output_length": None,
}


def _view_hint(name: str) -> str:
    import difflib

    if name in _VLLM_REQUEST_NAMES:
        own = _VLLM_REQUEST_NAMES[name]
        return (f"; did you mean {own!r}?" if own else "; a request's true output length is never shown: "
                "predicted_output_len is the policy's predictor's estimate (None without one)")
    names = [n for n in dir(RequestView) if not n.startswith("_")]
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else f" (a RequestView has {', '.join(names)})"


def _req(rv: RequestView) -> Request:
    if not isinstance(rv, RequestView):
        raise TypeError(f"expected a request from the view (a RequestView), got {type(rv).__name__}: "
                        f"{reprlib.repr(rv)}")
    return rv._now()


@dataclass(frozen=True, slots=True)
class Decodes:
    """What the core knows of a step's running requests when all of them decode (its decode group): ``views``,
    the view's running tuple, and ``requests``, theirs, each with one token to compute, taking ``blocks`` new KV
    blocks in all. ``Budget.allocate_decodes(view.running)`` then reserves them in one step instead of one by
    one (the policy adapter, sim.policies.user, makes it; policies never see it)."""

    views: tuple[RequestView, ...]
    requests: Sequence[Request]
    blocks: int


class Budget:
    """A scratch copy of the free KV blocks to plan one step with. Spending it changes nothing real: the core
    applies the plan afterwards. Reserve room for every request the plan computes tokens for."""

    __slots__ = ("_b", "_decodes")

    def __init__(self, b: KVBudget, decodes: Decodes | None = None) -> None:
        self._b = b
        self._decodes = decodes

    def allocate(self, req: RequestView, num_new_tokens: int) -> bool:
        """Reserve room for ``num_new_tokens`` more tokens of ``req``; False (nothing reserved) if it does not fit.
        Raises ValueError for a negative count (a sign slip the scratch budget would take as room given back)."""
        r = req._r if type(req) is RequestView and req._r.group_base < 0 else _req(req)
        if num_new_tokens < 0:
            raise ValueError(f"budget.allocate(req, {num_new_tokens}) for request {r.id}: num_new_tokens must be >= 0")
        return self._b.allocate(r, num_new_tokens)

    def allocate_decodes(self, reqs: Sequence[RequestView]) -> int:
        """``allocate(req, 1)`` for each request of ``reqs`` in turn, while it is running with one token to compute
        (decoding) and the token fits; returns how many were reserved: the first ``k`` of ``reqs``, which the plan
        then schedules (``plan.schedule_each(reqs[:k], 1)``). Take the rest one by one with ``allocate``; the
        request at ``k`` may not fit, or not decode, or be reserved here already. A policy that runs its decoding
        requests first, as vLLM does, plans them in one call instead of one per request."""
        d = self._decodes
        if d is not None and reqs is d.views and self._b.reserve_decodes(d.requests, d.blocks):
            return len(reqs)
        try:
            rs = [v._r for v in reqs if type(v) is RequestView]
        except TypeError:
            raise TypeError(f"expected a sequence of requests from the view, got {type(reqs).__name__}") from None
        if len(rs) != len(reqs):
            for v in reqs:
                _req(v)  # names the first that is not a RequestView
        for v in reqs:
            if v._r.group_base >= 0:
                v._now()
        return self._b.allocate_decodes(rs)

    def release(self, req: RequestView) -> None:
        """Give back what a running request holds (plan its preemption too)."""
        self._b.release(_req(req))

    def can_swap_out(self, req: RequestView) -> bool:
        return self._b.can_swap_out(_req(req))

    def swap_out(self, req: RequestView) -> None:
        """Plan moving a running request's KV to CPU memory (its GPU blocks come free)."""
        self._b.swap_out(_req(req))

    def swap_in(self, req: RequestView) -> bool:
        """Plan bringing a swapped request's KV back; False if its blocks are not free."""
        return self._b.swap_in(_req(req))


class KVView:
    """The KV cache as a policy sees it: sizes and counts, never the blocks themselves."""

    __slots__ = ("_kv", "_decodes")

    def __init__(self, kv: KVManager, decodes: Decodes | None = None) -> None:
        self._kv = kv
        self._decodes = decodes

    @property
    def block_size(self) -> int:
        return self._kv.block_size

    @property
    def num_blocks(self) -> int:
        return self._kv.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._kv.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self._kv.num_used_blocks

    @property
    def usage(self) -> float:
        """Fraction of the GPU KV blocks in use (vLLM's kv_cache_usage)."""
        return self._kv.num_used_blocks / self._kv.num_blocks if self._kv.num_blocks else 0.0

    def blocks_needed(self, req: RequestView, num_new_tokens: int) -> int:
        """Free blocks computing ``num_new_tokens`` more tokens of ``req`` would take now."""
        return self._kv.blocks_needed(_req(req), num_new_tokens)

    def num_cached_tokens(self, req: RequestView) -> int:
        """Prompt tokens of a waiting request that the prefix cache already holds (0 without prefix caching)."""
        return self._kv.num_cached_tokens(_req(req))

    def budget(self) -> Budget:
        """A fresh scratch budget for planning this step."""
        return Budget(self._kv.budget(), self._decodes)


@read_only
@dataclass(frozen=True, slots=True)
class PolicyView:
    """Everything a policy may read for one step. Queues are tuples of ``RequestView`` in the core's order:
    ``waiting`` first come first served, with requests preempted by recompute back at its front; ``running`` in
    admission order; ``swapped`` in the order they were swapped out."""

    now: float  # seconds since the start of the run
    waiting: tuple[RequestView, ...]
    running: tuple[RequestView, ...]
    swapped: tuple[RequestView, ...]
    kv: KVView
    limits: Limits  # max_num_seqs, max_num_batched_tokens, max_model_len: the core rejects a plan past them


class Plan:
    """A policy's decision for one step. The core applies, in this order: rejections, preemptions, swap-ins, then
    the scheduled requests in the order they were added (a waiting request scheduled here is admitted)."""

    __slots__ = ("scheduled", "preempted", "swapped_in", "rejected", "_each")

    def __init__(self) -> None:
        self.scheduled: list[tuple[RequestView, int]] = []
        self.preempted: list[tuple[RequestView, str]] = []
        self.swapped_in: list[RequestView] = []
        self.rejected: list[tuple[RequestView, str]] = []
        # the last schedule_each: where its entries start in ``scheduled``, the entries and the sequence they were
        # made from, so that the core checks them at once when they are still there as made
        self._each: tuple[int, list[tuple[RequestView, int]], Sequence[RequestView]] | None = None

    def schedule(self, req: RequestView, num_tokens: int) -> None:
        """Compute ``num_tokens`` tokens of ``req`` this step (1 to ``req.num_remaining``; reserve them in the
        budget first). A waiting request is admitted."""
        self.scheduled.append((req, num_tokens))

    def schedule_each(self, reqs: Sequence[RequestView], num_tokens: int) -> None:
        """``schedule(req, num_tokens)`` for each of ``reqs``, in order."""
        chunk = list(zip(reqs, repeat(num_tokens)))
        self._each = (len(self.scheduled), chunk, reqs)
        self.scheduled.extend(chunk)

    def preempt(self, req: RequestView, mode: str = "recompute") -> None:
        """Take a running request off the GPU: "recompute" drops its KV (it waits again, at the front of the
        queue), "swap" copies it to CPU memory. Release or swap it out in the budget too."""
        self.preempted.append((req, mode))

    def swap_in(self, req: RequestView, num_tokens: int) -> None:
        """Bring a swapped request back and compute ``num_tokens`` of it (``Budget.swap_in`` and ``allocate``
        first)."""
        self.swapped_in.append(req)
        self.scheduled.append((req, num_tokens))

    def reject(self, req: RequestView, reason: str) -> None:
        """Refuse a waiting or swapped request for good (an API error); ``reason`` is recorded."""
        self.rejected.append((req, reason))

    def unschedule(self, req: RequestView) -> int:
        """Take ``req`` out of the scheduled list (a request preempted after it was planned); returns the tokens
        it had, 0 if it was not there."""
        for i, (r, n) in enumerate(self.scheduled):
            if r is req:
                del self.scheduled[i]
                return n
        return 0

    def __len__(self) -> int:
        return len(self.scheduled)


@runtime_checkable
class _Schedules(Protocol):
    def schedule(self, view: PolicyView) -> Plan: ...


class Policy:
    """Subclass this and write ``schedule``. Optional members:

    - ``depends_on``: when the decision can change (``DEPENDS_ON``); the default, every step, is always safe;
    - ``wake_time(view)``: the next time the decision may change with nothing arriving or finishing (a timer);
    - ``describe()``: a line for the run's log.
    The constructor takes the scenario's ``args`` as keyword arguments; validate them there and raise
    ``ValueError`` with a message naming the argument."""

    depends_on: ClassVar[frozenset[str]] = frozenset({"every_step"})
    # the methods the core calls, with what it passes: their signatures are checked when the class is loaded
    _hook_signatures: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = (
        ("schedule", ("view",)), ("wake_time", ("view",)), ("describe", ()))

    def schedule(self, view: PolicyView) -> Plan:
        raise NotImplementedError(f"{type(self).__name__} must define schedule(view) -> servesim.Plan")

    def wake_time(self, view: PolicyView) -> float | None:
        return None

    def describe(self) -> str:
        return type(self).__name__


def implements_policy(obj: Any) -> str | None:
    """Why ``obj`` cannot serve as a policy, or None. A class that does not subclass ``Policy`` is accepted when it
    has a ``schedule`` method (structural typing), with every step as its ``depends_on``."""
    if (why := misnamed_hook(type(obj), Policy)) is not None:
        return why
    if not isinstance(obj, _Schedules) or not callable(obj.schedule):
        return "has no schedule(view) method"
    if type(obj).schedule is Policy.schedule:
        return "does not override schedule(view)"
    dep = getattr(obj, "depends_on", Policy.depends_on)
    if not isinstance(dep, frozenset | set | tuple | list) or not set(dep) <= DEPENDS_ON:
        return f"depends_on must be a set of {sorted(DEPENDS_ON)}, got {dep!r}"
    for method, args in getattr(type(obj), "_hook_signatures", Policy._hook_signatures):
        if (why := wrong_signature(obj, method, args)) is not None:
            return why
    return None


def misnamed_hook(kind: type, base: type) -> str | None:
    """Why a name the user's classes of ``kind`` define looks like a hook of servesim's classes it subclasses (or of
    ``base``, the API it is meant to implement) that they leave unset (``rnak``, ``depend_on``), or None: a
    misspelled hook is never called, and a QueuePolicy subclass ran as plain FCFS without a word."""
    import difflib

    ours = [c for c in kind.__mro__ if c.__module__.startswith("sim.") or c is object]
    hooks = {n for c in (*ours, base) for n in vars(c) if not n.startswith("_")} | {"shared_caches"}
    mine = [n for c in kind.__mro__ if c not in ours for n in vars(c) if not n.startswith("_")]
    unset = {h.lower(): h for h in hooks if h not in mine}
    for name in mine:
        if name not in hooks and (close := difflib.get_close_matches(name.lower(), unset, n=1, cutoff=0.75)):
            return (f"defines {name}, which servesim never calls or reads; did you mean {unset[close[0]]}? (a helper "
                    "of your own: start its name with _)")
    return None


def wrong_signature(obj: Any, method: str, args: tuple[str, ...]) -> str | None:
    """Why ``obj.method`` cannot be called with ``args`` (``def schedule(self)``, a parameter too many), or None;
    checked when the class is loaded, where it failed only at the method's first call, mid-run."""
    fn = getattr(obj, method, None)
    if not callable(fn):
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): its first call says
        return None
    try:
        sig.bind(*args)
    except TypeError as e:
        return f"has {method}{sig}, which cannot be called as {method}({', '.join(args)}): {e}"
    return None
