"""The workload section of a scenario: when requests arrive and how long their prompts and outputs are.

Pydantic models validate the YAML (one discriminated union per pluggable axis, keyed by ``type``);
:meth:`Workload.generate` turns a validated workload into plain :class:`~sim.serving.request.RequestSpec` records with
numpy, so that every compared variant of a run replays the very same requests.

Its parts have their own modules: ``workload/arrivals.py`` (arrival processes, closed-loop think times),
``workload/lengths.py`` (length distributions), ``workload/classes.py`` (request classes) and
``workload/length_pairs.py`` (lengths drawn in pairs from a file). This one holds the section and its ``generate``.

``shared_prefix`` prepends the same system prompt to every request: ``prompt_len`` grows by that many tokens and the
request carries hash ids for the prefix's whole blocks of :data:`PREFIX_HASH_BLOCK_SIZE` tokens (ids 0, 1, ...).
Prompt blocks past the end of ``hash_ids`` belong to the request alone, the same reading as an empty ``hash_ids``. A
prefix shorter than one block therefore shares nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from sim.config.input_model import Float, FrozenInputModel, Int
from sim.config.limits import MAX_ARRIVAL_S, MAX_REQUESTS, too_many_requests
from sim.serving import spec_table
from sim.serving.failures import FailurePlan
from sim.serving.request import RequestSpec, checked_specs
from sim.serving.spec_table import SpecTable
from sim.words import counted
from sim.workload.arrivals import ArrivalProcess, ClosedLoopArrival, ThinkTime, TraceArrival
from sim.workload.classes import RequestClass, check_classes, class_fields, trace_fields
from sim.workload.length_pairs import LengthPairs
from sim.workload.lengths import MAX_LENGTH, LengthDistribution, fmt_g
from sim.workload.sampling import Sampling
from sim.workload.trace_columns import ClassColumns

PREFIX_HASH_BLOCK_SIZE = 16  # tokens named by one hash id of a synthetic shared prefix (vLLM's default block size)


class Failures(FrozenInputModel):
    """Requests that end mid-flight: a share of them, each a drawn time after its arrival (client disconnects,
    errors). A request already finished by then is untouched. The same requests fail at the same times in every
    compared variant; a variant with ``deployment.leak_kv_on_failure`` is the server that forgets to free them."""

    fraction: Float = Field(ge=0, le=1, allow_inf_nan=False, description="Share of the requests that fail.")
    after: ThinkTime = Field(description="Seconds after its arrival at which a failing request fails.")
    reason: Literal["cancelled", "error"] = Field(
        default="cancelled", description="What the failure is, in the records: a client cancellation or a server error."
    )

    def describe(self) -> str:
        return f"{fmt_g(100 * self.fraction)}% {self.reason} after {self.after.describe()}"

    def draw(self, rng: np.random.Generator, ids: np.ndarray) -> FailurePlan:
        n = round(self.fraction * len(ids))
        chosen = np.sort(rng.permutation(ids)[:n])
        delays = self.after.sample(rng, n)
        reason = "cancelled by the client" if self.reason == "cancelled" else "server error"
        return FailurePlan(cancel_after={int(i): float(d) for i, d in zip(chosen, delays, strict=True)},
                           cancel_reason=reason)


# ---------------------------------------------------------------------------------------------------------------
# The workload and what it generates.


@dataclass(slots=True, eq=False)
class ClosedLoop:
    """How the simulator drives a closed-loop workload.

    Request i belongs to user ``i % num_users`` (its ``session_id``); each user sends its requests in id order.
    Every user sends its first request at t=0; when request i completes or is rejected at time t, its user sends
    the next one at ``t + think_times[i]``. Pre-drawn, so every compared variant sees the same pauses.
    """

    num_users: int
    think_times: np.ndarray  # float64 seconds, one per request id


@dataclass(frozen=True, slots=True, eq=False)
class GeneratedWorkload:
    """The requests of one run, sorted by arrival, with ids 0..n-1 in that order."""

    requests: Sequence[RequestSpec]  # a tuple, or past spec_table.SPEC_TABLE_MIN requests a SpecTable (columns)
    closed_loop: ClosedLoop | None = None
    failures: FailurePlan | None = None  # requests that fail mid-flight (the workload's failures section)

    def __len__(self) -> int:
        return len(self.requests)


class Workload(FrozenInputModel):
    """The workload section of a scenario."""

    arrival: ArrivalProcess = Field(description="When requests are sent.")
    num_requests: Int | None = Field(
        default=None,
        ge=1,
        description="Requests to generate. Required unless arrival is a trace; for a trace: its first "
        "num_requests (none: all of the window, tiled if repeat_to is set).",
    )
    prompt_len: LengthDistribution | None = Field(
        default=None,
        description="Prompt length in tokens (without shared_prefix). Required unless arrival is a trace; for a "
        "trace it replaces the trace's prompt lengths (and drops its prefix hash ids).",
    )
    output_len: LengthDistribution | None = Field(
        default=None,
        description="Output tokens to generate. Required unless arrival is a trace; for a trace it replaces the "
        "trace's output lengths.",
    )
    lengths: LengthPairs | None = Field(
        default=None,
        description="(prompt, output) lengths drawn together from a lengths file, instead of prompt_len and "
        "output_len (for a trace: instead of its own lengths).",
    )
    shared_prefix: Int = Field(
        default=0,
        ge=0,
        le=MAX_LENGTH,
        description="Tokens of a system prompt prepended to every prompt and shared by all requests (prefix "
        f"caching can reuse its whole {PREFIX_HASH_BLOCK_SIZE}-token blocks); 0: none.",
    )
    failures: Failures | None = Field(
        default=None, description="Requests that fail mid-flight (cancellations, errors); none by default."
    )
    sampling: Sampling | None = Field(
        default=None,
        description="How every request samples (vLLM's temperature, top_p, top_k); none: as the benchmark "
        "clients send them, greedy (vllm bench serve's temperature 0). Top-p below 1 costs vLLM a sort of each "
        "row's vocabulary each step (sim/engines/sampling.py).",
    )
    classes: list[RequestClass] | None = Field(
        default=None,
        description="Request classes (e.g. interactive and batch), each with its share of the arrivals, priority, "
        "tenant, SLOs and optionally its own lengths; none: every request alike (no class).",
    )

    @field_validator("num_requests")
    @classmethod
    def _not_too_many(cls, n: int | None) -> int | None:
        if n is not None and n > MAX_REQUESTS:
            raise ValueError(too_many_requests(n))
        return n

    @model_serializer(mode="wrap")
    def _without_unset_lengths(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a workload without lengths pairs dumps as it did before they existed, so that summary.json of every
        # earlier scenario stays byte-identical (the run folder records the resolved scenario)
        d = handler(self)
        for key in ("lengths", "classes", "sampling"):  # likewise for classes and sampling
            if d.get(key, ...) is None:
                del d[key]
        return d

    @model_validator(mode="after")
    def _check(self) -> Workload:
        if self.classes is not None:
            check_classes(self.classes)
            if any(c.share is None for c in self.classes) and not isinstance(self.arrival, TraceArrival):
                raise ValueError("classes: give each class a share (only a trace's slo_class column can name them)")
            if self.lengths is not None and any(c.prompt_len or c.output_len for c in self.classes):
                raise ValueError("classes: a class's prompt_len/output_len cannot be combined with lengths pairs")
        if self.lengths is not None:
            both = [k for k in ("prompt_len", "output_len") if getattr(self, k) is not None]
            if both:
                raise ValueError(f"lengths draws prompt and output lengths together; drop {', '.join(both)}")
        if not isinstance(self.arrival, TraceArrival):
            needed = ("num_requests",) if self.lengths is not None else ("num_requests", "prompt_len", "output_len")
            missing = [k for k in needed if getattr(self, k) is None]
            if missing:
                raise ValueError(f"arrival type {self.arrival.type!r} needs {', '.join(missing)}")
        return self

    def describe(self) -> str:
        """One line for the CLI; reads no file."""
        parts = [self.arrival.describe()]
        if self.num_requests is not None:
            parts.append(counted(self.num_requests, "request"))
        if self.lengths is not None:
            parts.append(self.lengths.describe())
        for label, dist in (("prompt", self.prompt_len), ("output", self.output_len)) if self.lengths is None else ():
            text = "from trace" if dist is None else dist.describe()  # validated: None only with a trace
            parts.append(f"{label} {text} tokens")
        if self.shared_prefix:
            parts.append(f"shared prefix {self.shared_prefix} tokens")
        if self.failures is not None:
            parts.append(f"failures: {self.failures.describe()}")
        if self.sampling is not None:
            parts.append(self.sampling.describe())
        if self.classes is not None:
            parts.append(f"classes: {', '.join(c.describe() for c in self.classes)}")
        return "; ".join(parts)

    def generate(self, rng: np.random.Generator) -> GeneratedWorkload:
        """Draw the requests. Arrivals, prompt lengths, output lengths and think times use four child streams
        spawned from ``rng`` (which advances its spawn counter), so changing one distribution leaves the others'
        draws unchanged. Raises FileNotFoundError / ValueError from trace loading, and ValueError when a trace
        holds fewer than ``num_requests`` or carries its own hash ids together with ``shared_prefix``.
        """
        arrival_rng, prompt_rng, output_rng, think_rng = rng.spawn(4)
        # spawned only when asked for, so that workloads without failures draw exactly what they always drew
        failure_rng = rng.spawn(1)[0] if self.failures is not None else None
        class_rng = rng.spawn(1)[0] if self.classes is not None else None  # likewise: after the others
        trace_classes: ClassColumns | None = None
        hash_ids: list[tuple[int, ...]] | None = None
        hash_block_size = 512  # RequestSpec's default; only read alongside hash ids
        arrival = self.arrival

        if isinstance(arrival, TraceArrival):
            data = arrival.load()
            n = len(data) if self.num_requests is None else self.num_requests
            if n > len(data):
                raise ValueError(
                    f"{arrival.describe()} holds {counted(len(data), 'request')}, fewer than num_requests={n} "
                    "(widen the window or set repeat_to)"
                )
            times = data.arrival[:n]
            prompt = data.prompt_len[:n] if self.prompt_len is None else self.prompt_len.sample(prompt_rng, n)
            output = data.output_len[:n] if self.output_len is None else self.output_len.sample(output_rng, n)
            if self.lengths is not None:  # the pairs replace the trace's lengths (and its prompts' hash ids)
                prompt, output = self.lengths.draw(prompt_rng, n)
            elif data.hash_ids is not None and self.prompt_len is None:  # ids describe the trace's own prompts
                hash_ids, hash_block_size = data.hash_ids[:n], data.hash_block_size
            trace_classes = data.classes
        else:
            assert self.num_requests is not None
            n = self.num_requests  # validated: set unless the arrival is a trace
            if isinstance(arrival, ClosedLoopArrival):
                times = np.zeros(n, dtype=np.float64)  # the simulator sets real send times
            else:
                times = arrival.times(arrival_rng, n)
            if self.lengths is not None:  # one stream draws the rows: a pair's two lengths come from one row
                prompt, output = self.lengths.draw(prompt_rng, n)
            else:
                assert self.prompt_len is not None and self.output_len is not None  # validated
                prompt = self.prompt_len.sample(prompt_rng, n)
                output = self.output_len.sample(output_rng, n)

        last = float(times[-1]) if n else 0.0
        if not last <= MAX_ARRIVAL_S:  # nan too (an infinite gap times a zero draw): never "all at time 0"
            when = "no finite time" if math.isnan(last) else f"{last:.3g} s"
            raise ValueError(
                f"{arrival.describe()}: the last of {n} requests arrives at {when}, past the "
                f"{MAX_ARRIVAL_S:.0e} s a run may span (at that clock a step's milliseconds are lost to rounding); "
                "raise the rate or lower the time scale"
            )

        which = None  # each request's class index, when the workload has classes
        if self.classes is not None:
            assert class_rng is not None  # spawned above whenever classes are set
            which = self._assign_classes(class_rng, n, trace_classes)
            prompt, output = self._class_lengths(class_rng, which, prompt, output)

        if self.shared_prefix:
            if hash_ids is not None:
                raise ValueError(
                    "shared_prefix cannot be combined with a trace that carries its own hash ids "
                    f"({arrival.describe()}); set prompt_len to replace the trace's prompts"
                )
            prompt = prompt + self.shared_prefix
            prefix_ids = tuple(range(self.shared_prefix // PREFIX_HASH_BLOCK_SIZE))
            hash_block_size = PREFIX_HASH_BLOCK_SIZE
        else:
            prefix_ids = ()

        # Sorted by arrival (a no-op for every built-in process; kept so ids always follow arrival order).
        order = None if n < 2 or bool(np.all(times[1:] >= times[:-1])) else np.argsort(times, kind="stable")
        if order is not None:
            times, prompt, output = times[order], prompt[order], output[order]
            if which is not None:
                which = which[order]
            if trace_classes is not None:
                trace_classes = trace_classes.take(order)
            if hash_ids is not None:
                hash_ids = [hash_ids[i] for i in order]

        closed = None
        sessions: list[int | None] = [None] * n
        if isinstance(arrival, ClosedLoopArrival):
            think = arrival.think_time.sample(think_rng, n)
            # one user's pauses add up along its requests: the latest send is at least its sum
            paused = float(np.bincount(np.arange(n) % arrival.num_users, weights=think).max()) if n else 0.0
            if paused > MAX_ARRIVAL_S:
                raise ValueError(
                    f"{arrival.describe()}: a user's think times add up to {paused:.3g} s, past the "
                    f"{MAX_ARRIVAL_S:.0e} s a run may span (at that clock a step's milliseconds are lost to "
                    "rounding); shorten the think time"
                )
            closed = ClosedLoop(arrival.num_users, think)
            sessions = [i % arrival.num_users for i in range(n)]
        ids = hash_ids if hash_ids is not None else [prefix_ids] * n
        if which is not None:
            assert self.classes is not None
            fields = class_fields(self.classes, which, trace_classes, n)
        elif trace_classes is not None:
            fields = trace_fields(trace_classes, n)
        else:  # no class anywhere: the records exactly as before classes existed
            fields = None
        requests: Sequence[RequestSpec]
        if fields is None and n > spec_table.SPEC_TABLE_MIN and SpecTable.check(times, prompt, output):
            # a long workload: columns, each spec made when read (sim/serving/spec_table.py)
            requests = SpecTable(times, prompt, output, shared_hash_ids=prefix_ids, hash_ids=hash_ids,
                                 hash_block_size=hash_block_size, sessions=None if closed is None else sessions)
        elif fields is None:
            rows = ((i, t, p, o, h, hash_block_size, s) for i, (t, p, o, h, s) in enumerate(
                zip(times.tolist(), prompt.tolist(), output.tolist(), ids, sessions, strict=True)))
            # checked in bulk when they all pass; else each spec checks itself and the first bad one says why
            requests = tuple(checked_specs(rows) if SpecTable.check(times, prompt, output)
                             else (RequestSpec(*row) for row in rows))
        else:
            requests = tuple(
                RequestSpec(i, t, p, o, h, hash_block_size, s, *f)
                for i, (t, p, o, h, s, f) in enumerate(
                    zip(times.tolist(), prompt.tolist(), output.tolist(), ids, sessions, fields, strict=True)
                )
            )
        failures = None
        if self.failures is not None:
            assert failure_rng is not None  # spawned above whenever failures are set
            failures = self.failures.draw(failure_rng, np.arange(n, dtype=np.int64))
        return GeneratedWorkload(requests, closed, failures)

    def _assign_classes(self, rng: np.random.Generator, n: int, trace: ClassColumns | None) -> np.ndarray:
        """Each request's class index: named by the trace's slo_class column when it has one, else drawn with
        the shares (one uniform draw per request from ``rng``)."""
        assert self.classes is not None
        names = [c.name for c in self.classes]
        if trace is not None and trace.slo_class is not None:
            index = {name: k for k, name in enumerate(names)}
            unknown = sorted({c for c in trace.slo_class[:n] if c not in index})
            if unknown:
                raise ValueError(f"the trace's slo_class column names {', '.join(map(repr, unknown[:5]))}, which "
                                 f"workload.classes does not define (it has {', '.join(map(repr, names))})")
            return np.array([index[c] for c in trace.slo_class[:n]], dtype=np.int64)
        shares = [c.share for c in self.classes]
        if any(s is None for s in shares):
            raise ValueError("classes without shares need a trace with an slo_class column to name each request's "
                             "class; this trace has none (give each class a share)")
        cum = np.cumsum(np.array(shares, dtype=np.float64))
        cum[-1] = 1.0  # shares sum to 1 within rounding: the last class takes what rounding leaves
        return np.searchsorted(cum, rng.random(n), side="right").astype(np.int64)

    def _class_lengths(self, rng: np.random.Generator, which: np.ndarray, prompt: np.ndarray, output: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
        """The lengths with each class's own distributions drawn in, for the requests of that class. Two child
        streams per class (prompt, output), so one class's change leaves the others' draws alone."""
        assert self.classes is not None
        streams = rng.spawn(2 * len(self.classes))
        prompt, output = prompt.copy(), output.copy()  # a trace's arrays are read-only
        for k, c in enumerate(self.classes):
            mine = which == k
            m = int(mine.sum())
            if c.prompt_len is not None:
                prompt[mine] = c.prompt_len.sample(streams[2 * k], m)
            if c.output_len is not None:
                output[mine] = c.output_len.sample(streams[2 * k + 1], m)
        return prompt, output
