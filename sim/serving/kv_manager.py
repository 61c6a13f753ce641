"""What the serving core, its fast path and the policies see of a KV cache manager: the ``KVManager`` protocol that
the paged (sim/serving/block_manager.py) and contiguous (sim/serving/contiguous_allocator.py) managers implement,
the ``KVBudget`` a policy spends while it plans, and ``BlockError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sim.serving.host_kv_tier import HostKVTier
from sim.serving.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVBudget(Protocol):
    """A scratch copy of the free KV space that a policy spends while it plans a step. Spending it changes
    nothing real; the core then applies the plan to the real manager."""

    @property
    def free(self) -> int:
        """KV blocks still free in this plan."""
        ...

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Reserve room for ``num_new_tokens`` more tokens of ``req``; False (and nothing reserved) if none."""
        ...

    def release(self, req: Request) -> None:
        """Return what ``req`` holds (a planned preemption)."""
        ...

    def allocate_decodes(self, reqs: Sequence[Request]) -> int:
        """``allocate(r, 1)`` for each of ``reqs`` in turn while ``r`` has one token to compute, holds KV on the
        GPU and fits; returns how many were reserved (the leading ones of ``reqs``). A request reserved in this
        budget already may stop it too: ``allocate`` takes it and those after it one by one."""
        ...

    def reserve_decodes(self, reqs: Sequence[Request], blocks: int) -> bool:
        """``allocate_decodes(reqs)`` reserving all of them, in one step, for a caller that knows what the loop
        would find: every one of ``reqs`` is running and decoding, and one more token of each takes ``blocks``
        new blocks in all (a decode group: ``DecodeGroup.next_blocks``). False, nothing reserved, when this budget
        has reservations already, the blocks are not free, or it cannot tell (then ``allocate_decodes``
        decides)."""
        ...

    def take(self, n: int) -> bool:
        """Reserve ``n`` free blocks without naming a request; False (nothing reserved) if not enough."""
        ...

    def can_swap_out(self, req: Request) -> bool:
        """Whether the CPU swap space has room for what ``req`` holds."""
        ...

    def swap_out(self, req: Request) -> None:
        """Plan moving ``req``'s KV to CPU swap space: its GPU blocks come free (call ``can_swap_out`` first)."""
        ...

    def swap_in(self, req: Request) -> bool:
        """Plan bringing a swapped request's KV back; False (nothing reserved) if the GPU blocks are not free."""
        ...


class KVManager(Protocol):
    """What the core, the fast path and the policies need from a KV cache manager (paged or contiguous)."""

    block_size: int
    num_blocks: int
    grows_on_decode: bool  # decoding takes new blocks (paged) or writes into a reservation (contiguous)
    num_cpu_blocks: int  # CPU swap space, in blocks
    num_free_cpu_blocks: int
    cpu_tables: dict[int, int]  # request id -> blocks it holds in CPU swap space
    host: HostKVTier | None  # the prefix cache's host-memory tier (paged with prefix caching only); None: none

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    def num_cached_tokens(self, req: Request) -> int:
        """Tokens of a request that holds no KV yet that the prefix cache already has."""
        ...

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """Free blocks ``allocate(req, num_new_tokens)`` would take."""
        ...

    def can_ever_fit(self, req: Request) -> bool: ...

    def holds(self, req: Request) -> bool: ...

    def block_table(self, req: Request) -> list[int]:
        """The GPU blocks holding the request's KV, in token order (a copy); empty when it holds none."""
        ...

    def allocate(self, req: Request, num_new_tokens: int) -> int:
        """Make room for ``num_new_tokens`` more tokens; returns the prefix-cache tokens the request got."""
        ...

    def free(self, req: Request) -> None: ...

    def swap_out(self, req: Request) -> int:
        """Move the request's KV to CPU swap space; returns blocks copied."""
        ...

    def swap_in(self, req: Request) -> int:
        """Bring a swapped request's KV back to the GPU; returns blocks copied."""
        ...

    def drop_swapped(self, req: Request) -> None:
        """Forget a swapped request's CPU copy (aborted or rejected while swapped)."""
        ...

    def can_grow(self, n: int) -> bool:
        """Whether ``n`` decoding requests can each take one more block (always, where decoding takes none)."""
        ...

    def grow(self, reqs: list[Request]) -> None:
        """Give each decoding request one more block, in order (the core checked ``can_grow`` first)."""
        ...

    def try_grow(self, reqs: list[Request]) -> bool:
        """``grow(reqs)`` if ``can_grow(len(reqs))``, in one call (the fast path's inner loop); False, and
        nothing changed, when the blocks are not there."""
        ...

    def budget(self) -> KVBudget: ...


class BlockError(RuntimeError):
    """An allocation the core was told would fit did not: a policy planned past the free blocks."""
