"""Whether a run changed state that a user's class shares between its objects, which would make the next object
not start fresh (``sim.policies.configs.UserClassConfig.make`` asks before it makes one).

``served = {}`` written on the class rather than in __init__, ``SERVED = {}`` at the top of its file, or a random
generator made once at either place (``RNG = np.random.default_rng(0)``) is one object for every variant, sweep point
and replica run in a process: each would start with what the runs before it left there, and policies would be
compared on different footing, silently.
"""

from __future__ import annotations

import collections
import random
import weakref
from typing import Any

import numpy as np

# A user's class -> copies of its class-level containers as its last object was made (the module docstring says why)
_SHARED: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()
# numpy arrays too: counts = np.zeros(n) on the class, added to in place, is the same one array for every object;
# and random generators, whose draws a run moves on (two identical variants of a policy breaking ties with a
# module-level np.random.default_rng(0) read TTFT mean 6.31 s and 6.28 s)
_RNGS = (np.random.Generator, np.random.RandomState, random.Random)
_MUTABLE = (dict, list, set, bytearray, collections.deque, np.ndarray, *_RNGS)
_MAX_ITEMS = 1000


def _containers(kind: type) -> dict[str, Any]:
    """The mutable containers a user's class (and its user-written bases) holds as class attributes, and those at
    the top of its modules that its code names ("global NAME": ``SERVED = {}`` beside the class is as shared), but
    for those it names in ``shared_caches``: a memo of results that do not depend on a run, shared on purpose (a dict
    the class fills from rank() was refused as a run's state)."""
    from sim.policies.user import module_globals

    declared = getattr(kind, "shared_caches", ())
    declared = {declared} if isinstance(declared, str) else set(declared)
    found: dict[str, Any] = {}
    for klass in reversed(kind.__mro__):
        if klass.__module__.partition(".")[0] not in ("sim", "servesim", "builtins"):
            found.update((k, v) for k, v in vars(klass).items()
                         if not k.startswith("__") and isinstance(v, _MUTABLE) and k not in declared)
    found.update((f"global {k}", v) for k, v in module_globals(kind, _MUTABLE).items() if k not in declared)
    return found


def _plain(v: Any, depth: int = 0) -> Any:
    """A copy of the containers in ``v`` down to what they hold (compared by value), the objects inside them left
    as they are (compared by identity: a deep copy of one is never equal to it)."""
    if depth > 8:
        return v
    if isinstance(v, dict):
        return {k: _plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, collections.deque)):
        return [_plain(x, depth + 1) for x in v]
    if isinstance(v, np.ndarray):  # its bytes, compared by value (an array's == is elementwise; a NaN equals itself)
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, _RNGS):  # where its stream stands
        state = v.getstate() if isinstance(v, random.Random) else v.bit_generator.state \
            if isinstance(v, np.random.Generator) else v.get_state(legacy=False)
        return ("rng", _plain(state, depth + 1))
    return set(v) if isinstance(v, set) else bytes(v) if isinstance(v, bytearray) else v


def _snapshot(kind: type) -> dict[str, Any]:
    # not a container of more than _MAX_ITEMS items: a lookup table, copied at every object made (a 100,000-point
    # sweep would pay for it), and rarely a run's state, which starts empty
    return {k: (_size(v), _plain(v)) for k, v in _containers(kind).items() if _size(v) <= _MAX_ITEMS}


def _size(v: Any) -> int:
    return int(v.size) if isinstance(v, np.ndarray) else 0 if isinstance(v, _RNGS) else len(v)


def _shared_state_changed(kind: Any, only: str | None = None) -> str | None:
    """The class attribute a run changed since the last object of ``kind`` was made, or None (``only``: whether
    that one is still changed)."""
    before = _SHARED.get(kind) if isinstance(kind, type) else None
    if not before:
        return None
    for k, v in _containers(kind).items():
        if only is not None and k != only:
            continue
        try:
            if k in before and (_size(v) != before[k][0] or bool(_plain(v) != before[k][1])):
                return k
        except Exception:  # noqa: BLE001, S112 - an object whose == is elementwise (a pandas Series): no truth value
            continue
    return None
