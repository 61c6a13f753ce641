"""The workload section of a scenario: when requests arrive and how long their prompts and outputs are.

Pydantic models validate the YAML (one discriminated union per pluggable axis, keyed by ``type``);
:meth:`Workload.generate` turns a validated workload into plain :class:`~sim.serving.request.RequestSpec` records with
numpy, so that every compared variant of a run replays the very same requests.

Conventions:

- Renewal arrival processes (``poisson``, ``gamma``, ``constant``) start at t=0 and the i-th request (counting from
  1) arrives after i inter-arrival gaps, so ``constant`` with rate r sends at 1/r, 2/r, ...
- Token lengths are whole numbers >= 1: continuous distributions are rounded to the nearest integer, then clipped
  to ``[min, max]`` (the clip puts mass on the bounds, so the clipped mean differs from the nominal one).
- ``shared_prefix`` prepends the same system prompt to every request: ``prompt_len`` grows by that many tokens and
  the request carries hash ids for the prefix's whole blocks of :data:`PREFIX_HASH_BLOCK_SIZE` tokens (ids 0, 1,
  ...). Prompt blocks past the end of ``hash_ids`` belong to the request alone, the same reading as an empty
  ``hash_ids``. A prefix shorter than one block therefore shares nothing.
- ``classes`` splits the arrivals into request classes (interactive, batch...), each with its own priority,
  tenant, SLOs and, optionally, its own length distributions. A request's class is drawn with the classes'
  shares from a child stream of its own, spawned only when classes are given, so that a workload without classes
  draws exactly what it drew before they existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from sim.serving.failures import FailurePlan
from sim.serving.request import RequestSpec
from sim.workload.length_pairs import LengthPairs
from sim.workload.trace_columns import ClassColumns, TraceColumns
from sim.workload.traces import TRACES, TraceData, load_trace

PREFIX_HASH_BLOCK_SIZE = 16  # tokens named by one hash id of a synthetic shared prefix (vLLM's default block size)
_LENGTH_CEILING = 2**40  # keeps unbounded draws inside int64; no model has a context near this
MAX_LENGTH = _LENGTH_CEILING  # the longest prompt or output a scenario may ask for, in tokens
# Requests one run may hold: each costs about 1 KB of records and state while it runs (measured: see
# tests/test_hardening.py), so this bound keeps a run within a few GB, and refuses a typo of 1e8 up front.
MAX_REQUESTS = 2_000_000
_REQUEST_BYTES = 1000  # approximate memory per request, for the message that refuses a larger run


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads true/false as 1/0; in a scenario file that is always a slip
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]  # an integer field of a scenario file
Float = Annotated[float, BeforeValidator(_not_bool)]  # a number field of a scenario file (finite: see InputModel)


class InputModel(BaseModel):
    """Base of every section of a scenario file: unknown keys are refused and every float must be finite
    (``.inf`` and ``.nan`` are refused where they enter). Number fields use ``Int`` and ``Float``, which refuse
    ``true``/``false``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Length = Annotated[Int, Field(ge=1, le=MAX_LENGTH)]  # tokens


def _g(x: float) -> str:
    return f"{x:g}"


def _clip_round(x: np.ndarray, low: int, high: int | None) -> np.ndarray:
    hi = _LENGTH_CEILING if high is None else high
    return np.clip(np.rint(x), low, hi).astype(np.int64)


def _bounds(low: int, high: int | None) -> str:
    return f"[{low}, {'inf' if high is None else high}]"


def _check_min_max(low: float, high: float | None, what: str = "min", what_hi: str = "max") -> None:
    if high is not None and high < low:
        raise ValueError(f"{what} ({low}) must be <= {what_hi} ({high})")


def _lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """mu and sigma of the underlying normal for a lognormal with the given mean and standard deviation."""
    ratio = std / mean
    # log1p(r^2) overflows past r ~ 1e154; there it equals 2 ln r to double precision
    sigma2 = math.log1p(ratio * ratio) if ratio < 1e150 else 2 * (math.log(std) - math.log(mean))
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def too_many_requests(n: int) -> str:
    """Why a run of ``n`` requests is refused, with what it would need."""
    return (f"{n} requests would need about {n * _REQUEST_BYTES / 1e9:.3g} GB of memory for their records; a run "
            f"holds at most {MAX_REQUESTS} (split the load over several runs, or sample it)")


# ---------------------------------------------------------------------------------------------------------------
# Length distributions (tokens). Each samples n whole numbers >= 1 as an int64 array.


class FixedLength(_Model):
    """Every request gets the same length."""

    type: Literal["fixed"] = "fixed"
    value: Length = Field(description="Length in tokens.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed {self.value}"


def _uniform_bounds(data: Any) -> Any:
    """Every distribution names its bounds ``min`` and ``max``; ``uniform`` once took ``low`` and ``high``, which
    scenario files written then still use. Those are read as ``min`` and ``max``; both spellings at once is an
    error rather than a silent choice."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for old, new in (("low", "min"), ("high", "max")):
        if old in out:
            if new in out:
                raise ValueError(f"give {new} or {old} (its older name), not both")
            out[new] = out.pop(old)
    return out


class UniformLength(_Model):
    """Whole numbers drawn uniformly from ``[min, max]``, both ends included (``low``/``high`` also read)."""

    type: Literal["uniform"] = "uniform"
    min: Length = Field(description="Smallest length in tokens (included).")
    max: Length = Field(description="Largest length in tokens (included); >= min.")

    _older_names = model_validator(mode="before")(_uniform_bounds)

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        _check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max, size=n, endpoint=True, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform [{self.min}, {self.max}]"


class NormalLength(_Model):
    """Normal draws rounded to whole tokens and clipped to ``[min, max]``."""

    type: Literal["normal"] = "normal"
    mean: Float = Field(gt=0, le=MAX_LENGTH, description="Mean before clipping, in tokens.")
    std: Float = Field(ge=0, le=MAX_LENGTH, description="Standard deviation before clipping, in tokens.")
    min: Length = Field(default=1, description="Lower clip in tokens.")
    max: Length | None = Field(default=None, description="Upper clip in tokens; none: no upper clip.")

    @model_validator(mode="after")
    def _check(self) -> NormalLength:
        _check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _clip_round(rng.normal(self.mean, self.std, size=n), self.min, self.max)

    def describe(self) -> str:
        return f"normal(mean={_g(self.mean)}, std={_g(self.std)}) clipped to {_bounds(self.min, self.max)}"


class LognormalLength(_Model):
    """Lognormal draws, rounded and clipped to ``[min, max]``.

    Parametrised by the mean and standard deviation of the lengths themselves (not of their logarithm), which is
    how traces are summarised: sigma^2 = ln(1 + std^2/mean^2), mu = ln(mean) - sigma^2/2.
    """

    type: Literal["lognormal"] = "lognormal"
    mean: Float = Field(gt=0, le=MAX_LENGTH, description="Mean length before clipping, in tokens.")
    std: Float = Field(gt=0, le=MAX_LENGTH, description="Standard deviation before clipping, in tokens.")
    min: Length = Field(default=1, description="Lower clip in tokens.")
    max: Length | None = Field(default=None, description="Upper clip in tokens; none: no upper clip.")

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        _check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu, sigma = _lognormal_params(self.mean, self.std)
        return _clip_round(rng.lognormal(mu, sigma, size=n), self.min, self.max)

    def describe(self) -> str:
        return f"lognormal(mean={_g(self.mean)}, std={_g(self.std)}) clipped to {_bounds(self.min, self.max)}"


class ExponentialLength(_Model):
    """Exponential draws, rounded and clipped to ``[min, max]`` (``max`` caps the long tail)."""

    type: Literal["exponential"] = "exponential"
    mean: Float = Field(gt=0, le=MAX_LENGTH, description="Mean before clipping, in tokens.")
    min: Length = Field(default=1, description="Lower clip in tokens.")
    max: Length | None = Field(default=None, description="Cap in tokens; none: no cap.")

    @model_validator(mode="after")
    def _check(self) -> ExponentialLength:
        _check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _clip_round(rng.exponential(self.mean, size=n), self.min, self.max)

    def describe(self) -> str:
        return f"exponential(mean={_g(self.mean)}) clipped to {_bounds(self.min, self.max)}"


class TraceColumnsConfig(_Model):
    """Which columns of a user's own CSV or JSONL trace hold what (for files that are not Azure's or Mooncake's
    layout). Without it, common names are recognised: arrival_s / timestamp, prompt_tokens / input_length...
    """

    timestamp: str | None = Field(
        default="timestamp", description="Column of the arrival time; none: a lengths-only file (not as arrivals)."
    )
    prompt_len: str = Field(default="prompt_len", description="Column of the prompt length in tokens.")
    output_len: str = Field(default="output_len", description="Column of the output length in tokens.")
    time_unit: Literal["s", "ms", "us", "ns", "datetime"] = Field(
        default="s", description="Unit of the timestamp column: seconds (default), ms, us, ns, or a date and time."
    )

    def build(self) -> TraceColumns:
        return TraceColumns(self.timestamp, self.prompt_len, self.output_len, self.time_unit)


_TRACE_FILE = (f"Shipped trace name ({', '.join(TRACES)}) or path to a .csv / .jsonl file (Azure's and Mooncake's "
               "layouts read as they are; others through columns).")


class EmpiricalLength(_Model):
    """Lengths drawn with replacement from one column of a trace (its marginal; pairs are not kept)."""

    type: Literal["empirical"] = "empirical"
    trace: str = Field(description=_TRACE_FILE)
    column: Literal["prompt", "output"] = Field(description="Which lengths to sample: prompt or output tokens.")
    columns: TraceColumnsConfig | None = Field(default=None, description="Column names of a user's own file.")

    def load(self) -> TraceData:
        return load_trace(self.trace, columns=None if self.columns is None else self.columns.build())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        data = self.load()
        values = data.prompt_len if self.column == "prompt" else data.output_len
        return values[rng.integers(0, len(values), size=n)]

    def describe(self) -> str:
        return f"empirical {self.column} lengths of {self.trace}"


LengthDistribution = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | ExponentialLength | EmpiricalLength,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------------------------------------------------------
# Think times of closed-loop users (seconds, >= 0).


class FixedThinkTime(_Model):
    """Every pause lasts the same time."""

    type: Literal["fixed"] = "fixed"
    value: Float = Field(ge=0, allow_inf_nan=False, description="Pause in seconds.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.float64)

    def describe(self) -> str:
        return f"{_g(self.value)} s"


class ExponentialThinkTime(_Model):
    """Exponentially distributed pauses (memoryless users)."""

    type: Literal["exponential"] = "exponential"
    mean: Float = Field(gt=0, allow_inf_nan=False, description="Mean pause in seconds.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, size=n)

    def describe(self) -> str:
        return f"exponential(mean={_g(self.mean)} s)"


class UniformThinkTime(_Model):
    """Pauses drawn uniformly from ``[min, max]`` seconds (``low``/``high`` also read)."""

    type: Literal["uniform"] = "uniform"
    min: Float = Field(ge=0, allow_inf_nan=False, description="Shortest pause in seconds.")
    max: Float = Field(ge=0, allow_inf_nan=False, description="Longest pause in seconds; >= min.")

    _older_names = model_validator(mode="before")(_uniform_bounds)

    @model_validator(mode="after")
    def _check(self) -> UniformThinkTime:
        _check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.min, self.max, size=n)

    def describe(self) -> str:
        return f"uniform [{_g(self.min)}, {_g(self.max)}] s"


class LognormalThinkTime(_Model):
    """Lognormal pauses, parametrised by the mean and standard deviation of the pauses themselves."""

    type: Literal["lognormal"] = "lognormal"
    mean: Float = Field(gt=0, allow_inf_nan=False, description="Mean pause in seconds.")
    std: Float = Field(gt=0, allow_inf_nan=False, description="Standard deviation of the pause in seconds.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu, sigma = _lognormal_params(self.mean, self.std)
        return rng.lognormal(mu, sigma, size=n)

    def describe(self) -> str:
        return f"lognormal(mean={_g(self.mean)} s, std={_g(self.std)} s)"


ThinkTime = Annotated[
    FixedThinkTime | ExponentialThinkTime | UniformThinkTime | LognormalThinkTime,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------------------------------------------------------
# Arrival processes.


class PoissonArrival(_Model):
    """Open loop, exponential inter-arrival gaps (what ``vllm bench serve --request-rate`` sends)."""

    type: Literal["poisson"] = "poisson"
    rate: Float = Field(gt=0, allow_inf_nan=False, description="Mean request rate in requests per second.")

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.rate, size=n))

    def describe(self) -> str:
        return f"poisson {_g(self.rate)} req/s"


class GammaArrival(_Model):
    """Open loop, gamma inter-arrival gaps: cv=1 is Poisson, cv>1 burstier, cv<1 more regular."""

    type: Literal["gamma"] = "gamma"
    rate: Float = Field(gt=0, allow_inf_nan=False, description="Mean request rate in requests per second.")
    cv: Float = Field(
        gt=0, allow_inf_nan=False, description="Coefficient of variation of the gaps (std / mean), unitless."
    )

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2  # mean shape*scale = 1/rate, cv = 1/sqrt(shape)
        return np.cumsum(rng.gamma(shape, 1.0 / (self.rate * shape), size=n))

    def describe(self) -> str:
        return f"gamma {_g(self.rate)} req/s, cv {_g(self.cv)}"


class ConstantArrival(_Model):
    """Open loop, evenly spaced requests."""

    type: Literal["constant"] = "constant"
    rate: Float = Field(gt=0, allow_inf_nan=False, description="Request rate in requests per second.")

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.arange(1, n + 1, dtype=np.float64) / self.rate

    def describe(self) -> str:
        return f"constant {_g(self.rate)} req/s"


class AllAtOnceArrival(_Model):
    """Offline batch: every request is there at t=0."""

    type: Literal["all_at_once"] = "all_at_once"

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float64)

    def describe(self) -> str:
        return "all at once (offline batch)"


class ClosedLoopArrival(_Model):
    """Closed loop: ``num_users`` users each send a request, wait for it to finish, think, and send the next."""

    type: Literal["closed_loop"] = "closed_loop"
    num_users: Int = Field(ge=1, description="Concurrent users, each with at most one request in flight.")
    think_time: ThinkTime = Field(
        default_factory=lambda: FixedThinkTime(value=0.0),
        description="Pause in seconds between a request's completion (or rejection) and the user's next send.",
    )

    def describe(self) -> str:
        return f"closed loop, {self.num_users} users, think time {self.think_time.describe()}"


class TraceArrival(_Model):
    """Replay a trace's arrival times; its (prompt, output) pairs too unless ``prompt_len``/``output_len`` are set.

    ``start``/``end`` pick a window in seconds of the original trace (since its first request); arrivals are then
    multiplied by ``time_scale / rate_scale`` and, with ``repeat_to``, tiled up to that many requests (see
    :func:`sim.workload.traces.load_trace`).
    """

    type: Literal["trace"] = "trace"
    trace: str = Field(description=_TRACE_FILE)
    columns: TraceColumnsConfig | None = Field(default=None, description="Column names of a user's own file.")
    start: Float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="Window start in seconds of the original trace."
    )
    end: Float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Window end in seconds (excluded); none: to the end."
    )
    # bounded so that their ratio times a trace's span stays a finite number of seconds
    time_scale: Float = Field(
        default=1.0, ge=1e-6, le=1e6, description="Multiplies inter-arrival times (0.5: twice as fast)."
    )
    rate_scale: Float = Field(
        default=1.0, ge=1e-6, le=1e6, description="Multiplies the request rate (2: twice the rate)."
    )
    repeat_to: Int | None = Field(
        default=None,
        ge=1,
        description="Tile the window back to back until this many requests exist; none: the window once.",
    )

    @field_validator("repeat_to")
    @classmethod
    def _not_too_many(cls, n: int | None) -> int | None:
        if n is not None and n > MAX_REQUESTS:
            raise ValueError(too_many_requests(n))
        return n

    @model_validator(mode="after")
    def _check(self) -> TraceArrival:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be greater than start ({self.start})")
        if self.columns is not None and self.columns.timestamp is None:
            raise ValueError("columns.timestamp: a trace replayed as arrivals needs its arrival-time column")
        return self

    def load(self) -> TraceData:
        return load_trace(
            self.trace,
            start=self.start,
            end=self.end,
            time_scale=self.time_scale,
            rate_scale=self.rate_scale,
            repeat_to=self.repeat_to,
            columns=None if self.columns is None else self.columns.build(),
        )

    def describe(self) -> str:
        parts = [f"trace {self.trace}"]
        if self.start or self.end is not None:
            parts.append(f"window [{_g(self.start)}, {'end' if self.end is None else _g(self.end)}) s")
        if self.time_scale != 1.0:
            parts.append(f"time x{_g(self.time_scale)}")
        if self.rate_scale != 1.0:
            parts.append(f"rate x{_g(self.rate_scale)}")
        if self.repeat_to is not None:
            parts.append(f"tiled to {self.repeat_to} requests")
        return ", ".join(parts)


ArrivalProcess = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | AllAtOnceArrival | ClosedLoopArrival | TraceArrival,
    Field(discriminator="type"),
]


class Failures(_Model):
    """Requests that end mid-flight: a share of them, each a drawn time after its arrival (client disconnects,
    errors). A request already finished by then is untouched. The same requests fail at the same times in every
    compared variant; a variant with ``deployment.leak_kv_on_failure`` is the server that forgets to free them."""

    fraction: Float = Field(ge=0, le=1, allow_inf_nan=False, description="Share of the requests that fail.")
    after: ThinkTime = Field(description="Seconds after its arrival at which a failing request fails.")
    reason: Literal["cancelled", "error"] = Field(
        default="cancelled", description="What the failure is, in the records: a client cancellation or a server error."
    )

    def describe(self) -> str:
        return f"{_g(100 * self.fraction)}% {self.reason} after {self.after.describe()}"

    def draw(self, rng: np.random.Generator, ids: np.ndarray) -> FailurePlan:
        n = round(self.fraction * len(ids))
        chosen = np.sort(rng.permutation(ids)[:n])
        delays = self.after.sample(rng, n)
        reason = "cancelled by the client" if self.reason == "cancelled" else "server error"
        return FailurePlan(cancel_after={int(i): float(d) for i, d in zip(chosen, delays, strict=True)},
                           cancel_reason=reason)


# ---------------------------------------------------------------------------------------------------------------
# Request classes.

_SHARE_TOLERANCE = 1e-6  # shares written as decimals (0.1 + 0.2 + 0.7) sum to 1 only within rounding


class ClassSLO(_Model):
    """A class's service-level objectives, in seconds (vLLM's ``--goodput`` takes the same metrics, in ms)."""

    ttft: Float | None = Field(default=None, gt=0, description="TTFT bound in seconds; none: no bound.")
    tpot: Float | None = Field(
        default=None, gt=0, description="TPOT bound in seconds per output token after the first; none: no bound."
    )


class RequestClass(_Model):
    """One class of requests: its share of the arrivals, who sends it, how urgent it is and what it must meet.

    The classes split the workload's one arrival process by share. With Poisson arrivals that is the same as an
    arrival process per class: each class's arrivals are an independent Poisson process of rate share x rate
    (thinning), so classes of rates r1 and r2 are ``rate: r1 + r2`` with shares r1/(r1 + r2) and r2/(r1 + r2).
    """

    name: str = Field(min_length=1, description="The class's name (requests.csv's slo_class column).")
    share: Float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of the arrivals in this class; the classes' shares sum to 1. None (every class): "
        "each request's class is named by its trace's slo_class column.",
    )
    priority: Int = Field(
        default=0, ge=-(2**62), le=2**62, description="Scheduling priority; lower is served sooner (vLLM's convention)."
    )
    tenant: str = Field(default="", description="Tenant (customer, team) the class's requests belong to; '' none.")
    slo: ClassSLO = Field(default_factory=ClassSLO, description="The SLOs the class's requests are held to.")
    prompt_len: LengthDistribution | None = Field(
        default=None, description="Prompt length in tokens for this class; none: the workload's."
    )
    output_len: LengthDistribution | None = Field(
        default=None, description="Output tokens for this class; none: the workload's."
    )

    def describe(self) -> str:
        parts = [self.name if self.share is None else f"{self.name} {_g(100 * self.share)}%"]
        if self.priority:
            parts.append(f"priority {self.priority}")
        if self.tenant:
            parts.append(f"tenant {self.tenant}")
        for label, v in (("TTFT", self.slo.ttft), ("TPOT", self.slo.tpot)):
            if v is not None:
                parts.append(f"{label} <= {_g(v)} s")
        for label, dist in (("prompt", self.prompt_len), ("output", self.output_len)):
            if dist is not None:
                parts.append(f"{label} {dist.describe()}")
        return " ".join(parts[:1]) + ("" if len(parts) == 1 else f" ({', '.join(parts[1:])})")


def _check_classes(classes: list[RequestClass]) -> None:
    if not classes:
        raise ValueError("classes: give at least one class, or leave classes out")
    names = [c.name for c in classes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"classes: names must be unique; {', '.join(map(repr, twice))} appear more than once")
    given = [c.share is not None for c in classes]
    if any(given) and not all(given):
        raise ValueError("classes: give every class a share, or none (then a trace's slo_class column names them)")
    if all(given):
        total = sum(c.share for c in classes if c.share is not None)
        if abs(total - 1.0) > _SHARE_TOLERANCE:
            raise ValueError(f"classes: shares must sum to 1, got {total:g}")


def _class_fields(classes: list[RequestClass], which: np.ndarray, trace: ClassColumns | None,
                  n: int) -> list[tuple[int, str, str, float | None, float | None]]:
    """(priority, tenant, slo_class, ttft_slo, tpot_slo) of each request: its class's, where a trace's own
    priority or tenant column, if any, wins over the class's."""
    per_class = [(c.priority, c.tenant, c.name, c.slo.ttft, c.slo.tpot) for c in classes]
    rows = [per_class[k] for k in which.tolist()]
    if trace is not None and trace.priority is not None:
        rows = [(p, *r[1:]) for p, r in zip(trace.priority[:n].tolist(), rows, strict=True)]
    if trace is not None and trace.tenant is not None:
        rows = [(r[0], t, *r[2:]) for t, r in zip(trace.tenant[:n], rows, strict=True)]
    return rows


def _trace_fields(trace: ClassColumns, n: int) -> list[tuple[int, str, str, float | None, float | None]]:
    """The request-class fields a trace's own columns give, without ``classes``: no SLOs."""
    prio = [0] * n if trace.priority is None else trace.priority[:n].tolist()
    tenant = ("",) * n if trace.tenant is None else trace.tenant[:n]
    name = ("",) * n if trace.slo_class is None else trace.slo_class[:n]
    return [(p, t, c, None, None) for p, t, c in zip(prio, tenant, name, strict=True)]


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

    requests: tuple[RequestSpec, ...]
    closed_loop: ClosedLoop | None = None
    failures: FailurePlan | None = None  # requests that fail mid-flight (the workload's failures section)

    def __len__(self) -> int:
        return len(self.requests)


class Workload(_Model):
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
        for key in ("lengths", "classes"):  # likewise for classes
            if d.get(key, ...) is None:
                del d[key]
        return d

    @model_validator(mode="after")
    def _check(self) -> Workload:
        if self.classes is not None:
            _check_classes(self.classes)
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
            parts.append(f"{self.num_requests} requests")
        if self.lengths is not None:
            parts.append(self.lengths.describe())
        for label, dist in (("prompt", self.prompt_len), ("output", self.output_len)) if self.lengths is None else ():
            text = "from trace" if dist is None else dist.describe()  # validated: None only with a trace
            parts.append(f"{label} {text} tokens")
        if self.shared_prefix:
            parts.append(f"shared prefix {self.shared_prefix} tokens")
        if self.failures is not None:
            parts.append(f"failures: {self.failures.describe()}")
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
                    f"{arrival.describe()} holds {len(data)} requests, fewer than num_requests={n} "
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
            closed = ClosedLoop(arrival.num_users, arrival.think_time.sample(think_rng, n))
            sessions = [i % arrival.num_users for i in range(n)]
        ids = hash_ids if hash_ids is not None else [prefix_ids] * n
        if which is not None:
            assert self.classes is not None
            fields = _class_fields(self.classes, which, trace_classes, n)
        elif trace_classes is not None:
            fields = _trace_fields(trace_classes, n)
        else:  # no class anywhere: the records exactly as before classes existed
            fields = None
        if fields is None:
            requests = tuple(
                RequestSpec(i, t, p, o, h, hash_block_size, s)
                for i, (t, p, o, h, s) in enumerate(
                    zip(times.tolist(), prompt.tolist(), output.tolist(), ids, sessions, strict=True)
                )
            )
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
