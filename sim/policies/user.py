"""How the serving core runs a policy written against the public API (``sim.policies.api``).

``UserPolicy`` is the adapter between the core's internal contract (``sim.policies.base``: a ``View`` of the
core's own containers in, an internal ``Plan`` out, decode groups for the fast path) and the public one (read-only
``RequestView``s in, a public ``Plan`` out). It also makes a user's policy user input: an exception inside it, a
plan that names a request twice or breaks a limit, or a return value that is not a plan each raise
``PolicyError`` (a ``ScenarioError``: the command line prints it and exits 2), with the user's own frames of the
traceback and the step's time.

The fast path stays behind the core: a decode-group member's own counters lag the group's steps, and its view
brings them up to date when the policy reads one (``RequestView._now``), so the policy always sees current counters
and an ask costs nothing for the members it does not read. When the policy declares that its decision changes
only with arrivals and finishes (``depends_on``), the core may repeat a step in which every running request decoded
one token, and nothing else happened, without asking (``ServingCore.plan_without_policy``); ``check_fast_path``
runs a policy with and without that and names the first step where the two differ.
"""

from __future__ import annotations

import dis
import functools
import inspect
import numbers
import reprlib
import signal
import sys
import threading
import traceback
import types
from collections.abc import Collection, Iterable
from operator import index, itemgetter
from pathlib import Path
from time import perf_counter
from typing import Any

from sim.config.errors import PASS_THROUGH, ScenarioError, ServesimStop
from sim.policies import api
from sim.policies.base import Admission, Limits, Policy, View
from sim.policies.base import Plan as CorePlan
from sim.policies.loader import exception_text
from sim.policies.watchdog import LIMIT_ENV, WATCH
from sim.serving.decode_group import DecodeGroup
from sim.serving.request import Request, Status

_FIRST = itemgetter(0)


class PolicyError(ScenarioError):
    """A user's policy failed: it raised, returned something that is not a plan, or planned past a rule."""


def _user_frames(exc: BaseException, *, exception: bool = True) -> str:
    """The traceback of an exception raised in a policy, without servesim's own frames above the user's code
    (``exception=False``: the frames alone)."""
    tb = traceback.extract_tb(exc.__traceback__)
    # servesim's side of the call (QueuePolicy's step around a user's hooks among it, the public API's checks of
    # what a hook hands it: budget.allocate(r.id, 1) showed api.py's two frames under the user's), and the import
    # machinery between the loader and a user's module
    adapters = {str(Path(__file__).with_name(n)) for n in ("user.py", "gates.py", "configs.py", "loader.py",
                                                           "queue.py", "api.py")}
    frames = [f for f in tb if f.filename not in adapters and not f.filename.startswith("<frozen ")]
    if not frames:  # raised by servesim itself (a rank that does not order): the error's own line says it all
        return ""
    lines = traceback.format_list(frames) + (traceback.format_exception_only(type(exc), exc) if exception else [])
    return "".join(lines).rstrip()


def reads(policy: type | str, name: str) -> bool:
    """Whether a user's class reads an attribute ``name`` in its methods, the functions and lambdas inside them, or
    the module-level functions they call (servesim's own bases are not the user's code). Only functions the class
    reaches by name count: a sibling policy in the same file that reads ``name`` says nothing of this one. ``policy``
    may be the source text evaluate takes: its code is compiled, not run (text that does not compile reads nothing;
    the run says why)."""
    return any(name in code.co_names for code, _ in _reached(policy))


def module_globals(policy: type, kinds: tuple[type, ...]) -> dict[str, Any]:
    """The module-level objects of the types ``kinds`` that a user's class names in the code it reaches (as
    ``reads`` walks it), by name: a ``SERVED = {}`` beside the class, written to by its methods."""
    out: dict[str, Any] = {}
    for code, scopes in _reached(policy):
        for n in _globals_used(code):
            for scope in scopes:
                v = scope.get(n)
                if isinstance(v, kinds):
                    out.setdefault(n, v)
    return out


def _reached(policy: type | str) -> Iterable[tuple[types.CodeType, list[dict[str, object]]]]:
    """Each code object a user's class (or source text) reaches, with the user's modules its names are looked up in."""
    codes: list[types.CodeType] = []
    scopes: list[dict[str, object]] = []  # the user's modules, where a called helper is looked up
    if isinstance(policy, str):
        try:
            codes.append(compile(policy, "<policy>", "exec"))
        except (SyntaxError, ValueError):
            return
    for klass in policy.__mro__ if isinstance(policy, type) else ():
        if klass.__module__.partition(".")[0] in ("sim", "servesim", "builtins"):
            continue
        module = sys.modules.get(klass.__module__)
        if module is not None:
            scopes.append(vars(module))
        else:  # evaluate's source text runs in a namespace of its own, no module: its functions' globals are it
            scopes.extend({id(g): g for v in vars(klass).values()
                           if isinstance(g := getattr(getattr(v, "__func__", v), "__globals__", None), dict)}.values())
        codes.extend(_codes(vars(klass).values()))
    seen: set[types.CodeType] = set()
    while codes:
        code = codes.pop()
        if code in seen:
            continue
        seen.add(code)
        yield code, scopes
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        codes.extend(_codes(scope[n] for scope in scopes for n in _globals_used(code) if n in scope))


# what looks a name up in a module (LOAD_NAME: module-level code, as evaluate's source text compiles to, and class
# bodies) rather than on an object: co_names holds attribute names too, and self.CALLS is not a module's CALLS
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})


@functools.lru_cache(maxsize=4096)
def _globals_used(code: types.CodeType) -> frozenset[str]:
    """The names ``code`` loads, stores or deletes as globals (dis), not its attribute names."""
    return frozenset(i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS)


def _codes(values: Iterable[object]) -> list[types.CodeType]:
    """The code objects of the functions, methods and properties among ``values``."""
    out: list[types.CodeType] = []
    for v in values:
        for fn in (getattr(v, "__func__", v), getattr(v, "fget", None)):
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType):
                out.append(code)
    return out


def unpredicted_note(name: str | None) -> str:
    """What ``UserPolicy.unpredicted`` says of the policy ``name`` (None: source text, its class not yet made)."""
    return (f"policy {name or '(source text)'} reads predicted_output_len, but the policy has no predictor, so it "
            "is None for every request: set its predictor (predictor: {type: oracle}, lognormal or buckets)")


def call_user(what: str, fn: Any, *args: Any, wrap: bool = True) -> Any:
    """``fn(*args)``, with an exception raised inside the user's code turned into one ``PolicyError`` that shows
    the user's own frames, and a call that does not return within the watchdog's limit stopped with one
    (sim/policies/watchdog.py). ``wrap=False``: only the stop is a ``PolicyError``, any exception passes as it is
    (the loader and the constructor word their own)."""
    w = WATCH
    if threading.get_ident() != w.main:  # only the main thread is watched (signals reach it alone)
        return _call_plain(what, fn, args) if wrap else fn(*args)
    w.calls += 1
    w.fired = False  # a stop the last call's code caught (its own ``except:``) is not this call's
    outer = w.inside  # a call inside another (a policy that runs a simulation of its own): the outer goes on after
    w.inside = True
    try:
        return fn(*args)
    except PolicyError:
        raise
    except KeyboardInterrupt as e:
        if not w.fired:
            if raised_by_code(e):  # the policy's own raise is its error (exit 2), not the user's Ctrl-C (exit 130)
                raise _raised(what, e) from None
            raise  # Ctrl-C
        w.fired = False
        raise PolicyError(f"{what} did not return within {w.limit:g} s ({LIMIT_ENV} sets the limit); "
                          f"stopped in\n{_user_frames(e, exception=False)}") from None
    except ServesimStop:
        raise
    except BaseException as e:  # not only Exception: sys.exit, GeneratorExit, a library's own BaseException
        if not wrap:
            raise
        raise _raised(what, e) from None
    finally:
        w.inside = outer


def raised_by_code(e: BaseException) -> bool:
    """Whether ``e`` (a KeyboardInterrupt) was raised by a ``raise`` statement, not by Ctrl-C: Python raises a
    signal's KeyboardInterrupt where it checks for signals (a call, a loop's jump back), never at a ``raise``, and a
    re-raised Ctrl-C keeps the frame it arrived in last. A Ctrl-C that SIGINT's handler turns into a raise (a
    library's Python handler, ``raise KeyboardInterrupt`` after its own cleanup) is a Ctrl-C: the handler's frame is
    in the traceback (it was read as the policy's error, exit 2)."""
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    handler = signal.getsignal(signal.SIGINT)
    while isinstance(handler, functools.partial):
        handler = handler.func
    handler_code = getattr(getattr(handler, "__func__", handler), "__code__", None)
    if not frames or any(t.tb_frame.f_code is handler_code for t in frames):
        return False
    tb = frames[-1]
    code = tb.tb_frame.f_code
    return any(i.offset == tb.tb_lasti and i.opname == "RAISE_VARARGS" for i in dis.get_instructions(code))


def _call_plain(what: str, fn: Any, args: tuple) -> Any:
    try:
        return fn(*args)
    except (PolicyError, *PASS_THROUGH):
        raise
    except BaseException as e:  # not only Exception: sys.exit, GeneratorExit, a library's own BaseException
        raise _raised(what, e) from None


def _raised(what: str, e: BaseException) -> PolicyError:
    try:
        frames = _user_frames(e)
    except Exception:  # a user's __str__ that raises (traceback formats the message too)
        frames = _user_frames(e, exception=False)
    return PolicyError(f"{what} {exception_text(e)}\n{frames}".rstrip())


def _malformed(up: api.Plan) -> str | None:
    """What is wrong with the shape of a plan's lists (entries added or replaced by hand), or None."""
    for name, second in (("scheduled", "tokens"), ("preempted", "mode"), ("rejected", "reason"), ("swapped_in", "")):
        entries = getattr(up, name)
        if not isinstance(entries, list):
            return (f"plan.{name} is {reprlib.repr(entries)}, not a list (build a plan with its methods: schedule, "
                    "preempt, swap_in, reject)")
        for x in entries:
            if second and not (isinstance(x, tuple) and len(x) == 2):
                return (f"plan.{name} holds {reprlib.repr(x)}, not a (request, {second}) pair (build a plan with "
                        "its methods: schedule, preempt, swap_in, reject)")
    return None


class UserPolicy(Policy):
    """Runs a public-API policy inside the core (see the module docstring)."""

    __slots__ = ("user", "limits", "admission", "predictor", "ttft_slo", "name", "may_repeat", "uses_decode_group",
                 "_views", "seconds", "asks", "cudagraph_capture_sizes")

    def __init__(self, user: Any, limits: Limits, admission: Admission | None = None,
                 predictor: api.Predictor | None = None) -> None:
        why = api.implements_policy(user)
        if why is not None:
            raise PolicyError(f"{type(user).__name__} {why} (see servesim.Policy)")
        WATCH.arm()  # a call into it that never returns is stopped (sim/policies/watchdog.py)
        self.user = user
        self.limits = limits
        self.admission = admission
        self.predictor = predictor
        self.ttft_slo: float | None = None  # the scenario's TTFT SLO, for views of requests whose class has none
        # the decode batch sizes the engine replays CUDA graphs for (sim/engines/sched.py configure_policy; the
        # core pads a decode step to the next one): the engine's, whoever schedules. Empty: unpadded, as a policy
        # on the public API always ran, so under vllm-v1 a priority variant priced cheaper steps than continuous
        self.cudagraph_capture_sizes: tuple[int, ...] = ()
        self.name = type(user).__name__
        dep = frozenset(getattr(user, "depends_on", api.Policy.depends_on))
        # the core may repeat an all-decode step without asking only when the policy said nothing but arrivals
        # and finishes (and block shortages, which always make the core ask) can change its decision
        self.may_repeat = "every_step" not in dep
        self.uses_decode_group = self.may_repeat  # type: ignore[misc]  # per object: from its depends_on
        # request -> its view, made once per request (a request keeps its view object while it lives): a view
        # only points at its request, and the policy is asked at every arrival with every running request in it.
        # Keyed by the request object (requests compare by identity), so another run's request of the same id
        # gets a view of its own.
        self._views: dict[Request, api.RequestView] = {}
        self.seconds, self.asks = 0.0, 0  # the wall time of the user's schedule calls, and how many there were

    def describe(self) -> str:
        d = getattr(self.user, "describe", None)
        if not callable(d):
            return self.name
        line = call_user(f"policy {self.name}: describe()", d)
        if not isinstance(line, str):  # a describe() that prints its line returned None: "policy None: asked ..."
            raise PolicyError(f"policy {self.name}: describe() returned {reprlib.repr(line)}, not a str (it returns "
                              "the line the run shows)")
        return line

    def capabilities(self) -> str:
        """What the core will do with this policy, in words: a user on the wrong declaration should know what it
        costs (in vLLM a custom scheduler on the wrong base silently lost its fast path: PR #43724)."""
        if self.may_repeat:
            return (f"policy {self.describe()}: asked at arrivals, finishes and KV shortages (depends_on); decode "
                    "stretches between them run without asking (servesim check-policy verifies the declaration)")
        return (f"policy {self.describe()}: asked before every step (depends_on: every_step); declare "
                "depends_on = {'arrivals', 'finishes'} if that is all its decision reads, for the fast path")

    def unpredicted(self) -> str | None:
        """A note when the policy's code reads ``predicted_output_len`` but it has no predictor: every request's
        is None, and a rank led by it, ``(req.predicted_output_len, req.arrival, req.id)``, compares None with
        None as equal and serves first come first served, the shortest-job-first written never running."""
        if self.predictor is not None or not reads(type(self.user), "predicted_output_len"):
            return None
        return unpredicted_note(self.name)

    def _public_view(self, view: View, hidden: set[int], planning: bool = False) -> api.PolicyView:
        waiting = view.waiting if not hidden else [r for r in view.waiting if r.id not in hidden]
        swapped = view.swapped if not hidden else [r for r in view.swapped if r.id not in hidden]
        cache = self._views
        if len(cache) > 2 * (len(view.waiting) + len(view.running) + len(view.swapped)) + 64:
            # finished requests' views, dropped now and then: the cache stays about the size of the queues
            self._views = {r: v for r, v in cache.items() if r.status is not Status.FINISHED}
        g = view.group
        running = self._views_of(view.running, g)
        decodes = None
        if planning and g is not None and g.grows and len(g.members) == len(running):
            # every running request is a member of the decode group: each decodes, and one more token of each
            # takes the group's next blocks
            decodes = api.Decodes(running, view.running, g.next_blocks)
        return api.PolicyView(view.now, self._views_of(waiting, g), running, self._views_of(swapped, g),
                              api.KVView(view.kv, decodes), view.limits)

    def _views_of(self, reqs: Collection[Request], group: DecodeGroup | None) -> tuple[api.RequestView, ...]:
        cache = self._views
        try:
            return tuple(map(cache.__getitem__, reqs))  # each seen before, as most are: one pass in C
        except KeyError:
            pred, ttft = self.predictor, self.ttft_slo
            for r in reqs:
                if r not in cache:
                    v = cache[r] = api.RequestView(r, pred, ttft)
                    v._g = group  # reads of a member's counters bring it up to date
            return tuple(map(cache.__getitem__, reqs))

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        return call_user(f"policy {self.name}: {what}", fn, *args)

    def wake_time(self, view: View) -> float | None:
        times = []
        if self.admission is not None and (d := self.admission.deadline(view.waiting)) is not None:
            times.append(d)
        wt = getattr(self.user, "wake_time", None)
        if callable(wt) and getattr(type(self.user), "wake_time", None) is not api.Policy.wake_time:
            t = self._call("wake_time(view)", wt, self._public_view(view, set()))
            if t is not None:
                # a number of seconds: "1.5" and True were read as 1.5 and 1.0 s, and NaN (0 * inf, a mean of
                # nothing) as no wake-up at all, silently; a time already past wakes nothing (it is now)
                if isinstance(t, bool) or not isinstance(t, numbers.Real):
                    raise PolicyError(f"policy {self.name}: wake_time returned {reprlib.repr(t)} at "
                                      f"t={view.now:.6f} s, not a time in seconds or None")
                t = float(t)
                if t != t:
                    raise PolicyError(f"policy {self.name}: wake_time returned nan at t={view.now:.6f} s: NaN is no "
                                      "time (return None when nothing is due)")
                times.append(t)
        return min(times) if times else None

    def schedule(self, view: View) -> CorePlan:
        rejected = self.admission.rejections(view) if self.admission is not None else []
        hidden = {r.id for r, _ in rejected} if rejected else set()
        pv = self._public_view(view, hidden, planning=True)
        t0 = perf_counter()
        up = self._call(f"schedule(view) at t={view.now:.6f} s", self.user.schedule, pv)
        self.seconds += perf_counter() - t0
        self.asks += 1
        if not isinstance(up, api.Plan):
            hint = ""
            if inspect.iscoroutine(up) or inspect.isgenerator(up):
                up.close()  # never run: closed here, or Python warns that it was never awaited, as a second error
                kind = "an async def" if inspect.iscoroutine(up) else "a generator (it yields)"
                hint = f" (schedule is {kind}: the core calls it as a plain function)"
            elif isinstance(up, type) and issubclass(up, api.Plan):  # `return servesim.Plan`: "returned type"
                hint = " object (it returned the class itself: build one, plan = servesim.Plan(), and return it)"
            raise PolicyError(f"policy {self.name}: schedule returned {type(up).__name__}, not a servesim.Plan{hint}")
        try:
            return self._translate(up, rejected, view, pv.running)
        except PolicyError:
            raise
        except (TypeError, ValueError):
            # a plan whose lists were changed by hand, not through its methods: found only when it breaks, so
            # that a well-made plan pays nothing for the check
            why = _malformed(up)
            if why is None:
                raise
            self._fail(view.now, why)
            raise

    def _reason_hint(self) -> str:
        """Whose reason it is: a QueuePolicy's refuse() (what plan.reject's reason comes from there), else the
        policy's own plan.reject call, which the refuse() wording sent looking for a hook it does not have."""
        from sim.policies.queue import QueuePolicy

        user = type(self.user)
        if issubclass(user, QueuePolicy) and user.refuse is not QueuePolicy.refuse:
            return "QueuePolicy.refuse returns None to keep a request, a reason string"
        return "plan.reject(req, reason) takes a reason string, recorded in requests.csv,"

    def _translate(self, up: api.Plan, rejected: list[tuple[Request, str]], view: View,
                   running: tuple[api.RequestView, ...]) -> CorePlan:
        plan = CorePlan(reject=list(rejected))
        named: set[int] = set()  # a request rejected or preempted twice: the core found it "finished", "waiting"
        for rv, reason in up.rejected:
            r = self._req(rv, view.now, "rejects")
            if r.id in named:
                self._fail(view.now, f"rejects request {r.id} twice")
            named.add(r.id)
            if r.status not in (Status.WAITING, Status.SWAPPED):
                self._fail(view.now, f"rejects request {r.id}, which is {r.status.value} (only waiting or swapped "
                           "requests can be rejected)")
            if not isinstance(reason, str):  # as an admission's admit(): True, False or 0 is no reason
                # reprlib: short, and a user's object whose __repr__ raises is shown, not raised (a traceback)
                self._fail(view.now, f"rejects request {r.id} with reason {reprlib.repr(reason)}, not a str "
                           f"({self._reason_hint()} to reject it)")
            if not reason.strip():  # a refuse() returning "" to mean "keep it" rejected every request, exit 0
                self._fail(view.now, f"rejects request {r.id} with an empty reason {reason!r} ({self._reason_hint()} "
                           "that says why to reject it)")
            plan.reject.append((r, reason))
        for rv, mode in up.preempted:
            r = self._req(rv, view.now, "preempts")
            if r.status is not Status.RUNNING:
                self._fail(view.now, f"preempts request {r.id}, which is {r.status.value}, not running")
            if r.id in named:  # (running: not among the rejected)
                self._fail(view.now, f"preempts request {r.id} twice")
            named.add(r.id)
            if mode not in ("recompute", "swap"):
                self._fail(view.now, f"preempts request {r.id} with mode {reprlib.repr(mode)}: use 'recompute' or "
                           "'swap'")
            plan.preempt.append((r, mode))
        # (most plans preempt and reject nobody: no set comprehensions, each a call, at every ask)
        gone = {r.id for r, _ in plan.preempt} | {r.id for r, _ in plan.reject} if plan.preempt or plan.reject \
            else set()
        for rv in up.swapped_in:
            r = self._req(rv, view.now, "swaps in")
            if r.status is not Status.SWAPPED or r.id in gone:
                self._fail(view.now, f"swaps in request {r.id}, which is {r.status.value}, not swapped")
            plan.swap_in.append(r)
        # The scheduled list is checked in one tight loop (it runs at every arrival and finish, once per running
        # request): anything amiss, and the list is walked again by _check_each, which names the first wrong entry
        # and the rule it breaks.
        g = view.group
        members = g.members if g is not None else {}
        entries = up.scheduled
        each = up._each if type(up) is api.Plan else None  # a subclass may schedule its own way
        in_group = 0
        if each is not None and not gone and len(members) == len(running):
            start, chunk, reqs = each
            k = len(chunk)
            # ``reqs is running``: the view's own tuple (QueuePolicy passes ``running[:k]``, which is that tuple
            # when k covers it), so the chunk's requests are the running ones without comparing them one by one
            if k and k == len(running) and type(chunk[0][1]) is int and chunk[0][1] == 1 and \
                    entries[start:start + k] == chunk and (reqs is running or tuple(map(_FIRST, chunk)) == running):
                # The plan scheduled every running request for one token in one call (schedule_each), and they
                # are all members of the decode group: each entry of that part is right, and no other entry may
                # name a member (it would be a second), so only the rest is checked one by one.
                entries = entries[:start] + entries[start + k:]
                in_group = k
        seen: set[int] = set()
        add = seen.add
        total = in_group
        out: list[tuple[Request, int]] = []
        ok = True
        RV = api.RequestView
        for rv, n in entries:
            if type(rv) is not RV or type(n) is not int:
                ok = False
                break
            q = rv._r
            if q.group_base >= 0:  # a member: running, with exactly one token to compute
                if n != 1 or entries is not up.scheduled:
                    ok = False
                    break
                in_group += 1
            elif q.status is Status.FINISHED or not 1 <= n <= q.prompt_len + q.num_output_tokens - \
                    q.num_computed_tokens:
                ok = False
                break
            else:
                out.append((q, n))
            add(q.id)
            total += n
        if not ok or len(seen) != len(entries) or (gone and not gone.isdisjoint(seen)):
            if _integer_counts(up):  # numpy's integers made ints: the plan is checked again, as written
                return self._translate(up, rejected, view, running)
            self._check_each(up, gone, view.now)
        lim = self.limits
        num_seqs = len(up.scheduled)  # distinct requests, as checked
        if num_seqs > lim.max_num_seqs:
            self._fail(view.now, f"schedules {num_seqs} requests, more than max_num_seqs {lim.max_num_seqs}")
        if total > lim.max_num_batched_tokens:
            self._fail(view.now, f"schedules {total} tokens, more than max_num_batched_tokens "
                       f"{lim.max_num_batched_tokens}")
        if in_group and in_group == len(members) and not (plan.preempt and
                                                          any(r.group_base >= 0 for r, _ in plan.preempt)):
            # The core's decode group takes one token per member as a whole (sim.serving.decode_group): the plan gives
            # every member exactly that, so it says so and lists the others one by one.
            plan.decode_group = True
            plan.scheduled = out
            return plan
        if members:
            view.ungroup()  # the members are planned one by one (their counters are current: nothing changes)
        plan.scheduled = [(rv._r, n) for rv, n in up.scheduled]
        return plan

    def _fail(self, now: float, what: str) -> None:
        raise PolicyError(f"policy {self.name} at t={now:.6f} s: {what}")

    def _check_each(self, up: api.Plan, gone: set[int], now: float) -> None:
        """Raise for the first entry of the scheduled list that breaks a rule."""
        seen: set[int] = set()
        for rv, n in up.scheduled:
            q = rv._r if type(rv) is api.RequestView else None
            if q is None or q.id in seen or q.id in gone or type(n) is not int or q.status is Status.FINISHED or \
                    not 1 <= n <= q.prompt_len + q.num_output_tokens - q.num_computed_tokens:
                self._explain(rv, n, seen, gone, now)
            assert q is not None  # _explain raised otherwise
            seen.add(q.id)
        raise AssertionError("the tight check of the scheduled list found a fault that _check_each did not")

    def _explain(self, rv: Any, n: Any, seen: set[int], gone: set[int], now: float) -> None:
        r = self._req(rv, now, "schedules")
        if r.id in seen:
            self._fail(now, f"schedules request {r.id} twice")
        if r.id in gone:
            self._fail(now, f"schedules request {r.id}, which the same plan preempts or rejects")
        if type(n) is not int:
            self._fail(now, f"schedules request {r.id} with {reprlib.repr(n)} tokens, not an int")
        left = r.prompt_len + r.num_output_tokens - r.num_computed_tokens
        self._fail(now, f"schedules {n} tokens of request {r.id}, which has {left} to compute (schedule 1 to "
                   "num_remaining)")

    def _req(self, rv: Any, now: float, verb: str) -> Request:
        if not isinstance(rv, api.RequestView):
            self._fail(now, f"{verb} {reprlib.repr(rv)}, which is not a request of the view (a RequestView)")
        r = rv._r
        if r.status is Status.FINISHED:
            self._fail(now, f"{verb} request {r.id}, which has finished")
        return r


def _integer_counts(up: api.Plan) -> bool:
    """Make the token counts of ``up`` that are integers of another type (numpy's: ``min(r.num_remaining,
    tokens)`` with a budget kept as an np.int64) Python ints, as a router's index is taken; whether any was. A bool
    is no count and stays, for the check to name."""
    def whole(n: Any) -> Any:
        if type(n) is int or isinstance(n, bool):
            return n
        try:
            return index(n)
        except TypeError:
            return n

    fixed = [(rv, whole(n)) for rv, n in up.scheduled]
    if all(a[1] is b[1] for a, b in zip(fixed, up.scheduled, strict=True)):
        return False
    up.scheduled[:] = fixed
    if up._each is not None:  # schedule_each's entries, as they now are in the list
        start, chunk, reqs = up._each
        up._each = (start, up.scheduled[start:start + len(chunk)], reqs)
    return True
