"""Arrival processes of a scenario's workload (when requests are sent), and the think times of closed-loop users.

Renewal arrival processes (``poisson``, ``gamma``, ``constant``) start at t=0 and the i-th request (counting from 1)
arrives after i inter-arrival gaps, so ``constant`` with rate r sends at 1/r, 2/r, ...
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field, field_validator, model_validator

from sim.config.input_model import Float, FrozenInputModel, Int
from sim.config.limits import MAX_ARRIVAL_S, MAX_REQUESTS, too_many_requests
from sim.words import counted
from sim.workload.lengths import (
    TRACE_FILE_HELP,
    TraceColumnsConfig,
    check_min_max,
    fmt_g,
    lognormal_params,
    uniform_bounds,
)
from sim.workload.traces import TraceData, load_trace

# ---------------------------------------------------------------------------------------------------------------
# Think times of closed-loop users (seconds, >= 0).



def time_scale_problem(time_scale: float, name: str = "--time-scale", last_arrival: float = 0.0) -> str | None:
    """Why ``time_scale`` cannot stretch arrivals onto the wall clock (arrival ``a`` is sent at ``a * time_scale``
    seconds: the real engine, validate, observe), or None. NaN put every arrival at 0 and inf at inf (NaN
    latencies on the engine; observe waited forever), another workload without a word. ``last_arrival``: the
    workload's last arrival, which scaled must stay within the span a run may have (``--time-scale 1e300`` on the
    engine read every TTFT 0.0 ms: a millisecond step is lost to rounding next to 1e299 s)."""
    if isinstance(time_scale, bool) or not isinstance(time_scale, int | float) or not 0 <= time_scale < math.inf:
        return f"{name} must be a finite number >= 0, got {time_scale}"
    if not last_arrival * time_scale <= MAX_ARRIVAL_S:
        return (f"{name} {time_scale:g} puts the last arrival ({last_arrival:.3g} s) at "
                f"{last_arrival * time_scale:.3g} s, past the {MAX_ARRIVAL_S:.0e} s a run may span (at that clock a "
                "step's milliseconds are lost to rounding); lower it")
    return None

class FixedThinkTime(FrozenInputModel):
    """Every pause lasts the same time."""

    type: Literal["fixed"] = "fixed"
    value: Float = Field(ge=0, allow_inf_nan=False, description="Pause in seconds.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.float64)

    def describe(self) -> str:
        return f"{fmt_g(self.value)} s"


class ExponentialThinkTime(FrozenInputModel):
    """Exponentially distributed pauses (memoryless users)."""

    type: Literal["exponential"] = "exponential"
    mean: Float = Field(gt=0, allow_inf_nan=False, description="Mean pause in seconds.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, size=n)

    def describe(self) -> str:
        return f"exponential(mean={fmt_g(self.mean)} s)"


class UniformThinkTime(FrozenInputModel):
    """Pauses drawn uniformly from ``[min, max]`` seconds (``low``/``high`` also read)."""

    type: Literal["uniform"] = "uniform"
    min: Float = Field(ge=0, allow_inf_nan=False, description="Shortest pause in seconds.")
    max: Float = Field(ge=0, allow_inf_nan=False, description="Longest pause in seconds; >= min.")

    _older_names = model_validator(mode="before")(uniform_bounds)

    @model_validator(mode="after")
    def _check(self) -> UniformThinkTime:
        check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.min, self.max, size=n)

    def describe(self) -> str:
        return f"uniform [{fmt_g(self.min)}, {fmt_g(self.max)}] s"


class LognormalThinkTime(FrozenInputModel):
    """Lognormal pauses, parametrised by the mean and standard deviation of the pauses themselves."""

    type: Literal["lognormal"] = "lognormal"
    mean: Float = Field(gt=0, allow_inf_nan=False, description="Mean pause in seconds.")
    std: Float = Field(gt=0, allow_inf_nan=False, description="Standard deviation of the pause in seconds.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu, sigma = lognormal_params(self.mean, self.std)
        return rng.lognormal(mu, sigma, size=n)

    def describe(self) -> str:
        return f"lognormal(mean={fmt_g(self.mean)} s, std={fmt_g(self.std)} s)"


ThinkTime = Annotated[
    FixedThinkTime | ExponentialThinkTime | UniformThinkTime | LognormalThinkTime,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------------------------------------------------------
# Arrival processes.


class PoissonArrival(FrozenInputModel):
    """Open loop, exponential inter-arrival gaps (what ``vllm bench serve --request-rate`` sends)."""

    type: Literal["poisson"] = "poisson"
    rate: Float = Field(gt=0, allow_inf_nan=False, description="Mean request rate in requests per second.")

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.rate, size=n))

    def describe(self) -> str:
        return f"poisson {fmt_g(self.rate)} req/s"


class GammaArrival(FrozenInputModel):
    """Open loop, gamma inter-arrival gaps: cv=1 is Poisson, cv>1 burstier, cv<1 more regular."""

    type: Literal["gamma"] = "gamma"
    rate: Float = Field(gt=0, allow_inf_nan=False, description="Mean request rate in requests per second.")
    # Bounded so that the shape 1/cv^2 stays a finite positive float: past 1e154 cv**2 overflowed (a traceback) and
    # below 1e-154 the shape became inf (nan gaps: every request at time 0). 1e-6 is a clock, 1e6 one burst.
    cv: Float = Field(
        ge=1e-6, le=1e6, allow_inf_nan=False,
        description="Coefficient of variation of the gaps (std / mean), unitless.",
    )

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2  # mean shape*scale = 1/rate, cv = 1/sqrt(shape)
        # a rate so small that rate * shape underflows to 0 has an infinite mean gap: the generator refuses it
        scale = 1.0 / (self.rate * shape) if self.rate * shape > 0 else math.inf
        return np.cumsum(rng.gamma(shape, scale, size=n))

    def describe(self) -> str:
        return f"gamma {fmt_g(self.rate)} req/s, cv {fmt_g(self.cv)}"


class ConstantArrival(FrozenInputModel):
    """Open loop, evenly spaced requests."""

    type: Literal["constant"] = "constant"
    rate: Float = Field(gt=0, allow_inf_nan=False, description="Request rate in requests per second.")

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.arange(1, n + 1, dtype=np.float64) / self.rate

    def describe(self) -> str:
        return f"constant {fmt_g(self.rate)} req/s"


class AllAtOnceArrival(FrozenInputModel):
    """Offline batch: every request is there at t=0."""

    type: Literal["all_at_once"] = "all_at_once"

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float64)

    def describe(self) -> str:
        return "all at once (offline batch)"


def _seconds_too(schema: dict[str, Any]) -> None:
    """The think time's JSON Schema: a number of seconds (read as a fixed pause) or one of the distributions."""
    union = {k: schema.pop(k) for k in ("oneOf", "discriminator") if k in schema}
    schema["anyOf"] = [{"type": "number", "minimum": 0}, union]


class ClosedLoopArrival(FrozenInputModel):
    """Closed loop: ``num_users`` users each send a request, wait for it to finish, think, and send the next."""

    type: Literal["closed_loop"] = "closed_loop"
    num_users: Int = Field(ge=1, description="Concurrent users, each with at most one request in flight.")
    think_time: ThinkTime = Field(
        default_factory=lambda: FixedThinkTime(value=0.0), json_schema_extra=_seconds_too,
        description="Pause in seconds between a request's completion (or rejection) and the user's next send: "
        "a number (a fixed pause) or a distribution {type: fixed | exponential | uniform | lognormal, ...}.",
    )

    @field_validator("think_time", mode="before")
    @classmethod
    def _seconds_are_a_fixed_pause(cls, v: object) -> object:
        """``think_time: 1.5`` (seconds, as the field is described) is ``{type: fixed, value: 1.5}``; it was
        refused as "expected a mapping". Anything else but a mapping is refused naming both forms."""
        if isinstance(v, int | float) and not isinstance(v, bool):
            return {"type": "fixed", "value": v}
        if not isinstance(v, dict | BaseModel):
            raise ValueError("expected a number of seconds (>= 0) or a distribution {type: fixed | exponential | "
                             "uniform | lognormal, ...}")
        return v

    def describe(self) -> str:
        return f"closed loop, {counted(self.num_users, 'user')}, think time {self.think_time.describe()}"


class TraceArrival(FrozenInputModel):
    """Replay a trace's arrival times; its (prompt, output) pairs too unless ``prompt_len``/``output_len`` are set.

    ``start``/``end`` pick a window in seconds of the original trace (since its first request); arrivals are then
    multiplied by ``time_scale / rate_scale`` and, with ``repeat_to``, tiled up to that many requests (see
    :func:`sim.workload.traces.load_trace`).
    """

    type: Literal["trace"] = "trace"
    trace: str = Field(description=TRACE_FILE_HELP)
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
        data = load_trace(
            self.trace,
            start=self.start,
            end=self.end,
            time_scale=self.time_scale,
            rate_scale=self.rate_scale,
            repeat_to=self.repeat_to,
            columns=None if self.columns is None else self.columns.build(),
        )
        if not data.timed:  # as columns.timestamp: none is refused above; else every request arrives at 0.0
            raise ValueError(
                f"{data.source}: no arrival-time column, so it cannot be replayed as arrivals; draw its "
                f"(prompt, output) rows with workload.lengths: {{type: pairs, file: {self.trace}}} under another "
                "arrival process, or name the time column in columns.timestamp"
            )
        return data

    def describe(self) -> str:
        parts = [f"trace {self.trace}"]
        if self.start or self.end is not None:
            parts.append(f"window [{fmt_g(self.start)}, {'end' if self.end is None else fmt_g(self.end)}) s")
        if self.time_scale != 1.0:
            parts.append(f"time x{fmt_g(self.time_scale)}")
        if self.rate_scale != 1.0:
            parts.append(f"rate x{fmt_g(self.rate_scale)}")
        if self.repeat_to is not None:
            parts.append(f"tiled to {self.repeat_to} requests")
        return ", ".join(parts)


ArrivalProcess = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | AllAtOnceArrival | ClosedLoopArrival | TraceArrival,
    Field(discriminator="type"),
]

