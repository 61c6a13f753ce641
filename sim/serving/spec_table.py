"""A long workload's requests as columns: what ``GeneratedWorkload.requests`` holds past ``SPEC_TABLE_MIN``.

A ``RequestSpec`` with its float and ints costs about 300 bytes, and a workload held every one of them for the
whole run: 295 MB at a million requests, 3 GB at ten million. ``SpecTable`` keeps arrival, prompt and output
lengths as numpy columns (24 bytes a request) and makes each ``RequestSpec`` when it is read, equal field for
field to the one the tuple held (the same ``tolist`` conversion, so the same Python floats and ints); the
simulator makes each one as it sends it, and it leaves memory with its request. Only workloads without request
classes use it (their specs are the arrays plus shared values), so every value is checked here, in bulk, where
the tuple's ``RequestSpec`` checked each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from sim.serving.request import RequestSpec, checked_specs

# Workloads with more requests than this keep them as a SpecTable; shorter ones as the tuple of specs they always had
SPEC_TABLE_MIN = 1 << 17
_CHUNK = 1 << 12  # specs made at a time when iterated


class SpecTable(Sequence[RequestSpec]):
    """Requests 0..n-1 in arrival order (ids follow it), made from columns when read.

    ``hash_ids``: None (each request's are ``shared_hash_ids``) or one tuple per request; ``sessions``: None (no
    request has one) or one session id per request."""

    __slots__ = ("_arrival", "_prompt", "_output", "_shared", "_hash_ids", "_hash_block_size", "_sessions")

    def __init__(self, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, *,
                 shared_hash_ids: tuple[int, ...] = (), hash_ids: Sequence[tuple[int, ...]] | None = None,
                 hash_block_size: int, sessions: Sequence[int | None] | None = None) -> None:
        assert len(arrival) == len(prompt) == len(output), "one value per request in each column"
        self._arrival = arrival
        self._prompt = _narrow(prompt)
        self._output = _narrow(output)
        self._shared = shared_hash_ids
        self._hash_ids = hash_ids
        self._hash_block_size = hash_block_size
        self._sessions = sessions

    @classmethod
    def check(cls, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> bool:
        """Whether every request passes ``RequestSpec``'s own checks (else the caller makes the tuple, whose
        first bad spec raises its error)."""
        return bool(np.all(prompt >= 1) and np.all(output >= 1) and np.all(arrival >= 0))

    def __len__(self) -> int:
        return len(self._arrival)

    def _specs(self, lo: int, hi: int) -> list[RequestSpec]:
        times, prompt, output = (c[lo:hi].tolist() for c in (self._arrival, self._prompt, self._output))
        ids, shared, sessions, size = self._hash_ids, self._shared, self._sessions, self._hash_block_size
        # every value was checked in bulk (``check``)
        return checked_specs((lo + k, t, p, o, shared if ids is None else ids[lo + k], size,
                              None if sessions is None else sessions[lo + k])
                             for k, (t, p, o) in enumerate(zip(times, prompt, output, strict=True)))

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, i: slice) -> list[RequestSpec]: ...

    def __getitem__(self, i: int | slice) -> RequestSpec | list[RequestSpec]:
        n = len(self)
        if isinstance(i, slice):
            lo, hi, step = i.indices(n)
            return self._specs(lo, max(lo, hi)) if step == 1 else self._specs(0, n)[i]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request index out of range")
        return self._specs(i, i + 1)[0]

    def __iter__(self) -> Iterator[RequestSpec]:
        n = len(self)
        for lo in range(0, n, _CHUNK):
            yield from self._specs(lo, min(lo + _CHUNK, n))

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same specs (the tuple a shorter workload holds)."""
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


def _narrow(lengths: np.ndarray) -> np.ndarray:
    """Token counts in the smallest unsigned dtype that holds them (2 bytes each up to 65,535 instead of 8: a
    workload of ten million requests held 160 MB of them for the whole run); ``tolist`` reads back the same ints."""
    a = np.asarray(lengths)
    if a.dtype.kind not in "iu" or not len(a) or int(a.min()) < 0:
        return a
    return a.astype(np.min_scalar_type(int(a.max())), copy=False)
