"""The public face of the two other decisions a serving stack makes about a request: which replica gets it
(``Router``) and whether it is accepted at all (``Admission``). Both read a frozen snapshot, never the live
serving cores, and each answer may carry a reason (BLIS's ``RoutingDecision`` and ``Admit -> (bool, reason)``).

    class FewestWaiting(servesim.Router):
        def route(self, request, replicas):
            return min(replicas, key=lambda r: (r.num_waiting, r.index)).index

    class OnlyShortPrompts(servesim.Admission):
        def admit(self, request, state):
            return None if request.prompt_len <= 4096 else "prompt longer than 4096 tokens"

A scenario names them as it names a policy: ``cluster: {router: {type: custom, cls: "file.py:Class", args: {}}}``
and ``admission: {rule: {type: custom, cls: ..., args: ...}}``; ``admission: {rule: {type: token_bucket, rate, burst}}``
is the built-in rate limiter, written on this same API. Errors inside them are the user's: one message, exit 2.
"""

from __future__ import annotations

import math
import operator
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.policies.api import RequestView, misnamed_hook, wrong_signature
from sim.policies.base import read_only
from sim.policies.watchdog import WATCH
from sim.serving.request import Request


@read_only
@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica at the instant a request arrives."""

    index: int  # what ``route`` returns to pick it
    num_waiting: int
    num_running: int
    num_swapped: int
    num_free_blocks: int
    num_blocks: int
    cached_tokens: int  # prompt tokens of the request being routed that this replica's prefix cache holds

    @property
    def num_outstanding(self) -> int:
        return self.num_waiting + self.num_running + self.num_swapped

    @property
    def kv_usage(self) -> float:
        return 1 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


@read_only
@dataclass(frozen=True, slots=True)
class AdmissionState:
    """The replica a request arrives at, as the admission rule sees it."""

    now: float
    num_waiting: int
    num_running: int
    num_free_blocks: int
    num_blocks: int


class Router:
    """Subclass and write ``route(request, replicas) -> index`` (an ``int``, one of ``replicas[i].index``)."""

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define route(request, replicas) -> int")


class Admission:
    """Subclass and write ``admit(request, state) -> None`` to accept, or a reason string to refuse."""

    def admit(self, request: RequestView, state: AdmissionState) -> str | None:
        raise NotImplementedError(f"{type(self).__name__} must define admit(request, state) -> str | None")


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


class TokenBucket(Admission):
    """A rate limiter (BLIS's token-bucket admission; API gateways' usual limit): ``rate`` requests per second
    refill a bucket of ``burst``; a request that finds it empty is refused."""

    def __init__(self, rate: float, burst: float = 1.0) -> None:
        # a number's type first: TokenBucket("10") ended in math.isfinite's "must be real number, not str"
        if not (_is_number(rate) and math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0 (requests per second), got {rate!r}")
        if not (_is_number(burst) and math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst must be a finite number >= 1 (requests), got {burst!r}")
        self.rate, self.burst = float(rate), float(burst)
        self._level, self._at = float(burst), 0.0

    def admit(self, request: RequestView, state: AdmissionState) -> str | None:
        self._level = min(self.burst, self._level + (state.now - self._at) * self.rate)
        self._at = state.now
        # A millionth of a request's slack: arrivals exactly 1/rate apart refill 0.9999999999999999 of a token by
        # floating-point rounding, and a bucket of 1 at 10/s admitted 34 of 50 requests sent every 0.1 s
        if self._level < 1 - 1e-6:
            return f"rate limit: token bucket of {self.burst:g} refilled at {self.rate:g} requests/s is empty"
        self._level = max(0.0, self._level - 1)
        return None


def _implements(obj: Any, method: str, base: type, args: tuple[str, ...]) -> str | None:
    if (why := misnamed_hook(type(obj), base)) is not None:
        return why
    fn = getattr(obj, method, None)
    if not callable(fn):
        return f"has no {method}() method"
    if getattr(type(obj), method, None) is getattr(base, method):
        return f"does not override {method}()"
    return wrong_signature(obj, method, args)


def implements_router(obj: Any) -> str | None:
    return _implements(obj, "route", Router, ("request", "replicas"))


def implements_admission(obj: Any) -> str | None:
    return _implements(obj, "admit", Admission, ("request", "state"))


class UserRouter:
    """A public ``Router`` as the simulator's router function ``(request, replicas) -> position``."""

    def __init__(self, user: Any) -> None:
        self.user = user
        self.name = type(user).__name__
        self.ttft_slo: float | None = None  # the scenario's TTFT SLO, for a request whose class has none
        WATCH.arm()  # a call into it that never returns is stopped (sim/policies/watchdog.py)

    def __call__(self, req: Request, replicas: Sequence[Any]) -> int:
        from sim.policies.user import PolicyError, call_user

        snap = [ReplicaView(i, len(c.waiting), len(c.running), len(c.swapped), c.kv.num_free_blocks,
                            c.kv.num_blocks, c.kv.num_cached_tokens(req) if not c.kv.holds(req) else 0)
                for i, c in ((i, rep.core) for i, rep in enumerate(replicas))]
        i = call_user(f"router {self.name}: route(request {req.id})", self.user.route,
                      RequestView(req, None, self.ttft_slo), tuple(snap))
        try:  # numpy's integers too: a router written as np.argmin over the replicas returns an np.int64
            pos = None if isinstance(i, bool) else operator.index(i)
        except TypeError:
            pos = None
        if pos is None or not 0 <= pos < len(snap):
            raise PolicyError(f"router {self.name}: route(request {req.id}) returned {reprlib.repr(i)}, not the index "
                              f"of one of the {len(snap)} replicas (0..{len(snap) - 1})")
        return pos


class UserAdmission:
    """A public ``Admission`` as the core's extra arrival check."""

    def __init__(self, user: Any) -> None:
        self.user = user
        self.name = type(user).__name__
        self.ttft_slo: float | None = None  # the scenario's TTFT SLO, for a request whose class has none
        WATCH.arm()  # a call into it that never returns is stopped (sim/policies/watchdog.py)

    def on_arrival(self, req: Request, now: float, waiting: int, running: int, kv: Any) -> str | None:
        from sim.policies.user import PolicyError, call_user

        state = AdmissionState(now, waiting, running, kv.num_free_blocks, kv.num_blocks)
        why = call_user(f"admission {self.name}: admit(request {req.id})", self.user.admit,
                       RequestView(req, None, self.ttft_slo), state)
        if why is not None and not isinstance(why, str):
            raise PolicyError(f"admission {self.name}: admit(request {req.id}) returned {reprlib.repr(why)}: return "
                              "None to accept or a reason string to refuse")
        if why is not None and not why.strip():  # an admit() returning "" to mean "accept" refused every request
            raise PolicyError(f"admission {self.name}: admit(request {req.id}) returned an empty reason {why!r}: "
                              "return None to accept or a reason string that says why to refuse")
        return why
