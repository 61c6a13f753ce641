"""Contiguous KV allocation, the naive baseline that paging replaced.

Each admitted request reserves, up front, room for the longest it may become, as one contiguous range of a
linear address space (first fit). The unused tail of every reservation is internal waste; the holes left
between reservations of different sizes are external fragmentation: a request can be refused while the free
space, added up, would hold it. Space is counted in blocks of ``block_size`` tokens only so that its numbers
compare with the paged manager's.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence

from sim.serving.host_kv_tier import HostKVTier
from sim.serving.kv_manager import BlockError, cdiv
from sim.serving.request import Request


def _first_fit(holes: list[list[int]], n: int) -> int:
    """Index of the first hole of at least ``n`` blocks, or -1."""
    for i, (_, length) in enumerate(holes):
        if length >= n:
            return i
    return -1


def _carve(holes: list[list[int]], i: int, n: int) -> int:
    start, length = holes[i]
    if length == n:
        del holes[i]
    else:
        holes[i] = [start + n, length - n]
    return start


def _give_back(holes: list[list[int]], start: int, n: int) -> None:
    insort(holes, [start, n])
    # merge with neighbours so that freed space can hold a large request again
    i = next(k for k, h in enumerate(holes) if h[0] == start)
    if i + 1 < len(holes) and holes[i][0] + holes[i][1] == holes[i + 1][0]:
        holes[i][1] += holes[i + 1][1]
        del holes[i + 1]
    if i > 0 and holes[i - 1][0] + holes[i - 1][1] == holes[i][0]:
        holes[i - 1][1] += holes[i][1]
        del holes[i]


class ContiguousAllocator:
    """Reserve ``reserve_blocks(req)`` blocks per request, contiguously, at its first allocation."""

    grows_on_decode = False
    host: HostKVTier | None = None  # no prefix cache, so no host tier under it

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_model_len: int,
        reserve: str = "max_model_len",
        num_cpu_blocks: int = 0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if reserve not in ("max_model_len", "request"):
            raise ValueError(f"reserve must be 'max_model_len' or 'request', got {reserve!r}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.reserve = reserve
        self.num_cpu_blocks = num_cpu_blocks
        self.num_free_cpu_blocks = num_cpu_blocks
        self.holes: list[list[int]] = [[0, num_blocks]]  # [start block, length], sorted by start
        self.ranges: dict[int, tuple[int, int]] = {}  # request id -> (start, blocks)
        self.cpu_tables: dict[int, int] = {}
        self._num_free = num_blocks
        self.num_hit_tokens = 0
        self.num_queried_tokens = 0

    def reserve_blocks(self, req: Request) -> int:
        """Blocks reserved for a request: its prompt plus all it may generate."""
        if self.reserve == "request":
            tokens = req.max_len
        else:
            tokens = max(self.max_model_len, req.max_len)
        return cdiv(tokens, self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free

    @property
    def largest_hole(self) -> int:
        return max((h[1] for h in self.holes), default=0)

    def holds(self, req: Request) -> bool:
        return req.id in self.ranges

    def num_blocks_of(self, req: Request) -> int:
        r = self.ranges.get(req.id)
        return 0 if r is None else r[1]

    def block_table(self, req: Request) -> list[int]:
        r = self.ranges.get(req.id)
        return [] if r is None else list(range(r[0], r[0] + r[1]))

    def can_ever_fit(self, req: Request) -> bool:
        return self.reserve_blocks(req) <= self.num_blocks

    def num_cached_tokens(self, req: Request) -> int:
        return 0  # no prefix sharing without paging

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        if req.id in self.ranges:
            return 0
        if req.id in self.cpu_tables:
            return 0  # its swap-in brings the reservation back
        return self.reserve_blocks(req)

    def allocate(self, req: Request, num_new_tokens: int) -> int:
        r = self.ranges.get(req.id)
        if r is None:
            n = self.reserve_blocks(req)
            i = _first_fit(self.holes, n)
            if i < 0:
                raise BlockError(f"request {req.id} needs {n} contiguous blocks, largest hole {self.largest_hole}")
            self.ranges[req.id] = (_carve(self.holes, i, n), n)
            self._num_free -= n
            r = self.ranges[req.id]
        if req.num_computed_tokens + num_new_tokens > r[1] * self.block_size:
            raise BlockError(f"request {req.id} outgrew its reservation of {r[1]} blocks")
        return 0

    def can_grow(self, n: int) -> bool:
        return True  # decoding writes into the reservation

    def grow(self, reqs: list[Request]) -> None:
        pass  # decoding writes into the reservation

    def try_grow(self, reqs: list[Request]) -> bool:
        return True  # decoding writes into the reservation

    def free(self, req: Request) -> None:
        r = self.ranges.pop(req.id, None)
        if r is not None:
            _give_back(self.holes, *r)
            self._num_free += r[1]

    def swap_out(self, req: Request) -> int:
        n = self.ranges[req.id][1]  # the whole reservation travels, as a naive server copies its buffer
        if n > self.num_free_cpu_blocks:
            raise BlockError(f"request {req.id} needs {n} CPU blocks, {self.num_free_cpu_blocks} free")
        self.free(req)
        self.cpu_tables[req.id] = n
        self.num_free_cpu_blocks -= n
        return n

    def swap_in(self, req: Request) -> int:
        n = self.cpu_tables[req.id]
        del self.cpu_tables[req.id]
        try:
            self.allocate(req, 0)
        except BlockError:
            self.cpu_tables[req.id] = n
            raise
        self.num_free_cpu_blocks += n
        return n

    def drop_swapped(self, req: Request) -> None:
        self.num_free_cpu_blocks += self.cpu_tables.pop(req.id, 0)

    def budget(self) -> ContiguousBudget:
        return ContiguousBudget(self)

    def check_invariants(self) -> None:
        spans = sorted([list(r) for r in self.ranges.values()] + [list(h) for h in self.holes])
        pos = 0
        for start, n in spans:
            assert start == pos and n > 0, "reservations and holes must tile the address space"
            pos += n
        assert pos == self.num_blocks
        assert self._num_free == sum(h[1] for h in self.holes)
        assert self.num_cpu_blocks - self.num_free_cpu_blocks == sum(self.cpu_tables.values())


class ContiguousBudget:
    """Plans against a copy of the holes, so that a policy sees external fragmentation too."""

    __slots__ = ("_m", "holes", "cpu_free", "_placed")

    def __init__(self, m: ContiguousAllocator) -> None:
        self._m = m
        self.holes = [list(h) for h in m.holes]
        self.cpu_free = m.num_free_cpu_blocks
        self._placed: dict[int, tuple[int, int]] = {}

    @property
    def free(self) -> int:
        return sum(h[1] for h in self.holes)

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        m = self._m
        if req.id in m.ranges or req.id in self._placed:
            r = m.ranges.get(req.id) or self._placed[req.id]
            return req.num_computed_tokens + num_new_tokens <= r[1] * m.block_size
        n = m.reserve_blocks(req)
        i = _first_fit(self.holes, n)
        if i < 0:
            return False
        self._placed[req.id] = (_carve(self.holes, i, n), n)
        return True

    def allocate_decodes(self, reqs: Sequence[Request]) -> int:
        k = 0
        for r in reqs:
            if r.prompt_len + r.num_output_tokens - r.num_computed_tokens != 1 or r.id not in self._m.ranges or \
                    not self.allocate(r, 1):
                break
            k += 1
        return k

    def reserve_decodes(self, reqs: Sequence[Request], blocks: int) -> bool:
        return False  # whether a decode fits is each reservation's own question: allocate_decodes asks it

    def release(self, req: Request) -> None:
        r = self._placed.pop(req.id, None) or self._m.ranges.get(req.id)
        if r is not None:
            _give_back(self.holes, *r)

    def take(self, n: int) -> bool:
        return n == 0  # decoding writes into reservations; nothing else is taken without a request

    def can_swap_out(self, req: Request) -> bool:
        return self._m.num_blocks_of(req) <= self.cpu_free

    def swap_out(self, req: Request) -> None:
        self.cpu_free -= self._m.num_blocks_of(req)
        self.release(req)

    def swap_in(self, req: Request) -> bool:
        if not self.allocate(req, 0):
            return False
        self.cpu_free += self._m.cpu_tables.get(req.id, 0)
        return True
