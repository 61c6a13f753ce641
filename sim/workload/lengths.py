"""Length distributions of a scenario's workload (tokens): each samples n whole numbers >= 1 as an int64 array.

Continuous distributions are rounded to the nearest integer, then clipped to ``[min, max]`` (the clip puts mass on
the bounds, so the clipped mean differs from the nominal one).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from sim.config.input_model import Float, FrozenInputModel, Int
from sim.workload.trace_columns import TraceColumns
from sim.workload.traces import TRACES, TraceData, load_trace

LENGTH_CEILING = 2**40  # keeps unbounded draws inside int64; no model has a context near this
MAX_LENGTH = LENGTH_CEILING  # the longest prompt or output a scenario may ask for, in tokens

Length = Annotated[Int, Field(ge=1, le=MAX_LENGTH)]  # tokens


def fmt_g(x: float) -> str:
    """``x`` as a describe() line writes it (``%g``)."""
    return f"{x:g}"


def clip_round(x: np.ndarray, low: int, high: int | None) -> np.ndarray:
    """Draws rounded to whole tokens and clipped to ``[low, high]`` (no ``high``: the int64-safe ceiling)."""
    hi = LENGTH_CEILING if high is None else high
    return np.clip(np.rint(x), low, hi).astype(np.int64)


def bounds(low: int, high: int | None) -> str:
    """``[low, high]`` as a describe() line writes it (no ``high``: inf)."""
    return f"[{low}, {'inf' if high is None else high}]"


def check_min_max(low: float, high: float | None, what: str = "min", what_hi: str = "max") -> None:
    """Refuse bounds given the wrong way round, naming them."""
    if high is not None and high < low:
        raise ValueError(f"{what} ({low}) must be <= {what_hi} ({high})")


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """mu and sigma of the underlying normal for a lognormal with the given mean and standard deviation."""
    ratio = std / mean
    # log1p(r^2) overflows past r ~ 1e154; there it equals 2 ln r to double precision
    sigma2 = math.log1p(ratio * ratio) if ratio < 1e150 else 2 * (math.log(std) - math.log(mean))
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


class FixedLength(FrozenInputModel):
    """Every request gets the same length."""

    type: Literal["fixed"] = "fixed"
    value: Length = Field(description="Length in tokens.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed {self.value}"


def uniform_bounds(data: Any) -> Any:
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


class UniformLength(FrozenInputModel):
    """Whole numbers drawn uniformly from ``[min, max]``, both ends included (``low``/``high`` also read)."""

    type: Literal["uniform"] = "uniform"
    min: Length = Field(description="Smallest length in tokens (included).")
    max: Length = Field(description="Largest length in tokens (included); >= min.")

    _older_names = model_validator(mode="before")(uniform_bounds)

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max, size=n, endpoint=True, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform [{self.min}, {self.max}]"


class NormalLength(FrozenInputModel):
    """Normal draws rounded to whole tokens and clipped to ``[min, max]``."""

    type: Literal["normal"] = "normal"
    mean: Float = Field(gt=0, le=MAX_LENGTH, description="Mean before clipping, in tokens.")
    std: Float = Field(ge=0, le=MAX_LENGTH, description="Standard deviation before clipping, in tokens.")
    min: Length = Field(default=1, description="Lower clip in tokens.")
    max: Length | None = Field(default=None, description="Upper clip in tokens; none: no upper clip.")

    @model_validator(mode="after")
    def _check(self) -> NormalLength:
        check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return clip_round(rng.normal(self.mean, self.std, size=n), self.min, self.max)

    def describe(self) -> str:
        return f"normal(mean={fmt_g(self.mean)}, std={fmt_g(self.std)}) clipped to {bounds(self.min, self.max)}"


class LognormalLength(FrozenInputModel):
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
        check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu, sigma = lognormal_params(self.mean, self.std)
        return clip_round(rng.lognormal(mu, sigma, size=n), self.min, self.max)

    def describe(self) -> str:
        return f"lognormal(mean={fmt_g(self.mean)}, std={fmt_g(self.std)}) clipped to {bounds(self.min, self.max)}"


class ExponentialLength(FrozenInputModel):
    """Exponential draws, rounded and clipped to ``[min, max]`` (``max`` caps the long tail)."""

    type: Literal["exponential"] = "exponential"
    mean: Float = Field(gt=0, le=MAX_LENGTH, description="Mean before clipping, in tokens.")
    min: Length = Field(default=1, description="Lower clip in tokens.")
    max: Length | None = Field(default=None, description="Cap in tokens; none: no cap.")

    @model_validator(mode="after")
    def _check(self) -> ExponentialLength:
        check_min_max(self.min, self.max)
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return clip_round(rng.exponential(self.mean, size=n), self.min, self.max)

    def describe(self) -> str:
        return f"exponential(mean={fmt_g(self.mean)}) clipped to {bounds(self.min, self.max)}"


class TraceColumnsConfig(FrozenInputModel):
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


TRACE_FILE_HELP = (f"Shipped trace name ({', '.join(TRACES)}) or path to a .csv / .jsonl file (Azure's and Mooncake's "
               "layouts read as they are; others through columns).")


class EmpiricalLength(FrozenInputModel):
    """Lengths drawn with replacement from one column of a trace (its marginal; pairs are not kept)."""

    type: Literal["empirical"] = "empirical"
    trace: str = Field(description=TRACE_FILE_HELP)
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


