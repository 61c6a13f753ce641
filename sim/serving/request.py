"""Requests: the immutable workload item and the mutable serving state.

The state follows vLLM v1: a request holds ``num_tokens`` (prompt plus tokens generated so far) and
``num_computed_tokens`` (tokens whose KV is in the cache). A step lets a request catch up by some number of
tokens; when it has caught up, one new token is sampled. Prefill, chunked prefill, decode and recompute after
preemption are therefore the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, make_dataclass
from enum import StrEnum
from typing import Any


def unfrozen_twin(cls: type) -> type:
    """A class with the fields and slots of the frozen slots dataclass ``cls``, not frozen and without its
    ``__post_init__``: build one of it and assign ``cls`` to its ``__class__`` (CPython allows it between classes of
    the same slots), and it is a ``cls`` like any other (equal, hashed and pickled alike). A frozen dataclass's
    ``__init__`` stores each field through ``object.__setattr__``: 4.4 us for twenty fields against 0.5 us for plain
    slot stores (timeit, this machine), which counts where a run makes one record of each of 10^7 requests. Only
    where the values are known valid (the twin checks nothing), and for ``cls`` itself: a subclass has a layout of
    its own (``__class__`` assignment raises TypeError), so make its objects through its own ``__init__``."""
    if late := [f.name for f in fields(cls) if not f.init]:  # the twin would take them as arguments, out of order
        raise TypeError(f"{cls.__name__}'s fields {late} are not __init__ arguments: its twin would misplace them")
    spec = [(f.name, f.type, field(default=f.default, default_factory=f.default_factory)) for f in fields(cls)]
    twin = make_dataclass(f"_{cls.__name__}Unfrozen", spec, slots=True)
    if twin.__slots__ != cls.__slots__:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} must be a slots dataclass for its twin to share its layout")
    return twin


class Status(StrEnum):  # a str too: compares and serialises as its value
    WAITING = "waiting"  # queued, holds no KV (new, or preempted by recompute)
    RUNNING = "running"  # holds KV on the GPU
    SWAPPED = "swapped"  # preempted by swap: its KV lives in CPU memory
    FINISHED = "finished"


class Outcome(StrEnum):
    COMPLETED = "completed"
    REJECTED = "rejected"  # refused by admission control; never ran to completion
    FAILED = "failed"  # aborted mid-flight (error, cancellation, out of memory)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload, as the client sends it. Identical for every compared variant."""

    id: int
    arrival: float  # seconds since the start of the run
    prompt_len: int  # prompt tokens
    output_len: int  # tokens to generate (end of sequence ignored, as in `vllm bench serve`)
    # Prefix identity: hash_ids[i] names prompt tokens [i*hash_block_size, (i+1)*hash_block_size). Equal ids at
    # equal positions mean an equal prefix up to there (the Mooncake trace's convention). Empty: no sharing.
    hash_ids: tuple[int, ...] = ()
    hash_block_size: int = 512
    session_id: int | None = None  # conversation or closed-loop user the request belongs to
    # Request classes (the workload's ``classes:`` or a trace's columns). vLLM's convention: a lower priority value
    # is served sooner. ``slo_class`` names the class whose SLOs the request is held to; ``ttft_slo`` (seconds) is
    # its own TTFT bound, so its deadline for a first token is ``arrival + ttft_slo`` (None: no bound); ``tpot_slo``
    # (seconds per output token after the first) its TPOT bound.
    priority: int = 0
    tenant: str = ""
    slo_class: str = ""
    ttft_slo: float | None = None
    tpot_slo: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"request {self.id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"request {self.id}: output_len must be >= 1, got {self.output_len}")
        if self.arrival < 0:
            raise ValueError(f"request {self.id}: arrival must be >= 0, got {self.arrival}")
        if self.ttft_slo is not None and not self.ttft_slo > 0:
            raise ValueError(f"request {self.id}: ttft_slo must be > 0 seconds, got {self.ttft_slo}")
        if self.tpot_slo is not None and not self.tpot_slo > 0:
            raise ValueError(f"request {self.id}: tpot_slo must be > 0 seconds, got {self.tpot_slo}")


@dataclass(slots=True, eq=False)
class Request:
    """Serving state of one request. Owned by the core; policies read it through the view."""

    spec: RequestSpec
    arrival: float  # may differ from spec.arrival in closed-loop runs, where a user sends after a think time
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0  # tokens generated so far (survive recompute preemption)
    first_scheduled: float = -1.0
    first_token: float = -1.0
    last_token: float = -1.0
    finish: float = -1.0
    num_preemptions: int = 0
    # when each preemption freed its GPU KV and when it held KV again (recompute: next scheduled; swap: swapped
    # in); None until the first preemption, so the 10^5 requests that are never preempted carry no list
    preempted_at: list[float] | None = None
    resumed_at: list[float] | None = None
    outcome: Outcome | None = None
    reason: str = ""  # why a request was rejected or failed
    replica: int = 0
    admit_seq: int = 0  # order of (last) admission into the running set: the policies' allocation order
    group_base: int = -1  # decode-group step at which it joined the group; -1 when not a member
    # Optional per-token timestamps; kept only when the run asks for them (they are large at scale).
    token_times: list[float] | None = field(default=None)
    # copies of the spec's fields, read on every step (a plain attribute is cheaper than a property)
    id: int = field(init=False)
    prompt_len: int = field(init=False)
    output_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.spec.id
        self.prompt_len = self.spec.prompt_len
        self.output_len = self.spec.output_len

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold to sample the next token."""
        return self.prompt_len + self.num_output_tokens

    @property
    def num_remaining(self) -> int:
        """Tokens to compute before the next token is sampled."""
        return self.prompt_len + self.num_output_tokens - self.num_computed_tokens

    @property
    def max_len(self) -> int:
        """Tokens the request will hold at most: prompt plus all its output."""
        return self.prompt_len + self.output_len

    @property
    def is_prefill(self) -> bool:
        """True while the request computes more than one token to reach its next sample."""
        return self.num_remaining > 1

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, {self.status.value}, computed={self.num_computed_tokens}/"
            f"{self.num_tokens}, out={self.num_output_tokens}/{self.output_len})"
        )


_SpecUnfrozen = unfrozen_twin(RequestSpec)


def through_twin(cls: type, twin: type, rows: Iterable[tuple[Any, ...]]) -> list:
    """A ``cls`` of each row (its fields in order), made through ``twin`` (``unfrozen_twin(cls)``): plain slot
    stores, no checks."""
    out = [twin(*row) for row in rows]
    for obj in out:
        obj.__class__ = cls
    return out


def checked_specs(rows: Iterable[tuple[Any, ...]]) -> list[RequestSpec]:
    """A ``RequestSpec`` of each row (its fields in order, as many as the row has), made without RequestSpec's
    checks (``unfrozen_twin``): only for values checked in bulk beforehand (``SpecTable.check``). A workload makes
    one of each of its requests: 1.2 us a spec through the frozen ``__init__`` and ``__post_init__``."""
    return through_twin(RequestSpec, _SpecUnfrozen, rows)
