"""Routers: which replica of a cluster gets an arriving request.

A router is a function ``route(request, replicas) -> index into replicas``, called at the request's arrival
with the replicas that take traffic now (provisioning and draining ones are left out). It reads each replica's
serving core as it stands at that instant: the simulator never runs a replica past the next arrival, so what
a router sees is what a real router's health checks would report.

- ``round_robin``: in turn, blind to load.
- ``least_outstanding``: fewest requests waiting, running or swapped (what most load balancers do).
- ``least_kv``: lowest KV-cache usage counting the blocks the queued prompts will need (memory-pressure aware:
  a replica with few but long requests is full although its queue is short).
- ``prefix_affinity``: the replica whose prefix cache already holds most of the request's prompt blocks (the
  Mooncake trace carries real block hashes), ties and misses broken by least outstanding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sim.serving.request import Request

Router = Callable[[Request, Sequence[Any]], int]


def outstanding(core) -> int:
    return len(core.waiting) + len(core.running) + len(core.swapped)


def kv_pressure(core) -> float:
    """Share of the KV blocks in use plus those the waiting prompts need (so a backlog counts before it runs)."""
    kv = core.kv
    queued = 0
    bs = kv.block_size
    for r in core.waiting:
        queued += -(-r.prompt_len // bs)
    return (kv.num_used_blocks + queued) / kv.num_blocks


def round_robin() -> Router:
    state = {"next": 0}

    def route(req: Request, replicas: Sequence[Any]) -> int:
        i = state["next"] % len(replicas)
        state["next"] += 1
        return i

    return route


def least_outstanding() -> Router:
    def route(req: Request, replicas: Sequence[Any]) -> int:
        return min(range(len(replicas)), key=lambda i: (outstanding(replicas[i].core), i))

    return route


def least_kv() -> Router:
    def route(req: Request, replicas: Sequence[Any]) -> int:
        return min(range(len(replicas)), key=lambda i: (kv_pressure(replicas[i].core), outstanding(replicas[i].core),
                                                        i))

    return route


def prefix_affinity() -> Router:
    def route(req: Request, replicas: Sequence[Any]) -> int:
        def key(i: int):
            core = replicas[i].core
            return (-core.kv.num_cached_tokens(req), outstanding(core), i)

        return min(range(len(replicas)), key=key)

    return route


ROUTERS: dict[str, Callable[[], Router]] = {
    "round_robin": round_robin,
    "least_outstanding": least_outstanding,
    "least_kv": least_kv,
    "prefix_affinity": prefix_affinity,
}


def make_router(name: Any) -> Router:
    """A built-in router by name, or a router config (``RouterConfig``: a user's or one on the public API, a fresh
    ``servesim.Router`` per run)."""
    if not isinstance(name, str):
        from sim.policies.gates import UserRouter

        return UserRouter(name.make())
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; expected one of {', '.join(ROUTERS)}") from None
