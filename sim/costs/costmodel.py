"""Cost models: how long one step of a batch takes on a device.

A cost model sees a step through ``StepShape``, a handful of integer aggregates of the batch. Every field may
also be a numpy array, one entry per step: the simulator's decode fast-forward asks for many successive steps at
once, and the same arithmetic then gives bit-identical times to asking one by one.

The protocol and the shape live here; the implementations have their own modules: ``sim/costs/analytic.py``
(``AnalyticCostModel``, a roofline from the model's and the GPU's specs) and ``sim/costs/fitted.py``
(``FittedCostModel``, coefficients fitted to a real engine, and the calibration profile's format).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(slots=True)
class StepShape:
    """What a step's duration depends on. Padding rows and tokens (static batching) are included: the GPU
    computes them even though nobody receives their output."""

    num_seqs: int | np.ndarray  # rows in the batch, padding rows included
    num_tokens: int | np.ndarray  # new tokens computed (prefill + decode + padding): drives the linear layers
    num_decode_seqs: int | np.ndarray  # rows computing exactly one token
    kv_read_tokens: int | np.ndarray  # sum over rows of tokens attended (cached context + new): KV bytes read
    attn_pairs: int | np.ndarray  # sum over rows of q*c + q*(q+1)/2 (causal query-key pairs): attention FLOPs
    num_padding_tokens: int | np.ndarray = 0  # of num_tokens, how many are padding (wasted work)
    swap_blocks: int | np.ndarray = 0  # KV blocks copied between GPU and CPU memory this step (out + in)
    # seconds the executor idled just before this step (0: it starts where the previous step ended). A real
    # engine pays a wake-up after idling (the OS's timer slack, a CPU or GPU leaving its power-saving state,
    # cold caches) that grows with the idle time; a fitted profile measures it
    idle_before: float | np.ndarray = 0.0
    # tokens attended by the longest decode row (its context + 1; 0: unknown). An engine whose decode attention
    # gathers every row padded to the longest context pays rows x this, not the sum of the contexts
    max_decode_len: int | np.ndarray = 0
    # speculative decoding (sim.serving.spec_decode): rows verifying draft tokens (each computes 1 + its drafts, counted
    # in num_tokens), the draft tokens of the step, and those rows' cached context. The target's cost model
    # prices the step as it is; sim.serving.spec_decode.SpecDecodeCost adds the proposer's time from these
    num_spec_seqs: int = 0
    num_draft_tokens: int = 0
    spec_context_tokens: int = 0
    # seconds of prefix blocks loaded back from the host-memory tier before the step (sim.serving.host_kv_tier): the
    # tier prices its own link, so every cost model adds it as it is
    host_load_time: float = 0.0


class CostModel(Protocol):
    """Predicts step times. Implementations: ``AnalyticCostModel`` (roofline from specs) and
    ``FittedCostModel`` (coefficients fitted to a real engine by calibration).

    ``step_time``, ``step_flops`` and ``peak_flops`` are required. ``decode_steps`` and ``decode_step_time`` are
    the simulator's decode fast path (``sim.serving.fast_path``); their defaults here price through ``step_time``, and
    a model overrides them only to be faster, never to give other numbers (the tests check bit-identity). A class
    that subclasses ``CostModel`` inherits the defaults; one that only has the required members gets them through
    ``optional_member``."""

    __slots__ = ()  # keeps the slots of the dataclasses that subclass it

    def step_time(self, shape: StepShape) -> float | np.ndarray:
        """Seconds the step takes (an array when the shape's fields are arrays)."""
        ...

    def step_flops(self, shape: StepShape) -> float | np.ndarray:
        """Useful floating-point operations of the step (padding excluded), for model FLOPs utilisation."""
        ...

    @property
    def peak_flops(self) -> float:
        """The device's peak dense FLOP/s for the model's compute dtype, summed over its shards."""
        ...

    def decode_steps(self, rows: Sequence[int], reads: Sequence[int],
                     longest: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
        """Times and FLOPs of unpadded one-token-per-row steps: ``rows[i]`` rows attending ``reads[i]`` tokens,
        the longest of them ``longest[i]`` (``StepShape.max_decode_len``; 0 when not given). ``reads`` and
        ``longest`` may be ranges (a stretch whose rows stay the same)."""
        ms = longest if longest is not None else [0] * len(rows)
        shapes = [StepShape(n, n, n, c, c, max_decode_len=m) for n, c, m in zip(rows, reads, ms, strict=True)]
        return [float(self.step_time(s)) for s in shapes], [float(self.step_flops(s)) for s in shapes]

    def decode_step_time(self, n: int, c: int) -> float:
        """One unpadded decode step's time: ``n`` rows attending ``c`` tokens."""
        return float(self.step_time(StepShape(n, n, n, c, c)))


def optional_member(cost: object, name: str) -> Any:
    """``cost``'s member ``name``, one of ``CostModel``'s members with a default; that default, bound to ``cost``,
    when ``cost`` implements the protocol without subclassing it and lacks the member (a test's few-line model)."""
    member = getattr(cost, name, None)
    return member if member is not None else getattr(CostModel, name).__get__(cost)


def is_array(*xs: Any) -> bool:
    """Whether any of ``xs`` is a numpy array (a shape asked for many steps at once)."""
    for x in xs:
        if x.__class__ is np.ndarray:
            return True
    return False
