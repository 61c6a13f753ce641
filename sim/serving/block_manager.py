"""Paged KV block manager: fixed-size blocks allocated on demand, block tables, reference counts, prefix cache.

Pure Python, no torch: the real engine addresses its KV tensors through these very block tables. Blocks are
integers in ``range(num_blocks)``. A block is *used* while some request references it; a free block may still
carry the hash of the prefix it holds (prefix caching), and is then reused on a hit until it is evicted, least
recently freed first.

The ``KVManager`` protocol it implements, and ``BlockError``, are in sim/serving/kv_manager.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, MutableSequence, Sequence
from functools import partial
from itertools import takewhile
from operator import attrgetter, is_not
from typing import cast

from sim.serving.host_kv_tier import HostKVTier
from sim.serving.kv_manager import BlockError, cdiv
from sim.serving.request import Request

_IS_BLOCK = partial(is_not, None)  # a prefix-cache lookup that found a block


class PagedBlockManager:
    """vLLM-style paged KV: a request holds ``ceil(tokens / block_size)`` blocks, taken one at a time."""

    grows_on_decode = True

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = False,
        num_cpu_blocks: int = 0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.num_cpu_blocks = num_cpu_blocks
        # Host memory follows the blocks in use, not the pool: blocks never handed out yet are one range
        # [_next, num_blocks), taken in ascending order, so a pool of 10^8 one-token blocks costs nothing until it is
        # used. Per-block state (reference counts, prefix hashes, free flags) lives in dicts keyed by touched blocks.
        # The order blocks are handed out is the one a full free list would give: the stack (no prefix caching) has
        # the untouched range below the freed blocks, the queue (prefix caching) has it ahead of them.
        self._next = 0
        self.ref_count: dict[int, int] = {}  # block -> references (prefix caching; 1 per table block otherwise)
        self.block_hash: dict[int, int] = {}  # block -> prefix hash it holds (prefix caching)
        # Freed blocks. With prefix caching a free block can be revived by a hit; its queue entry then goes stale
        # and is skipped when it reaches the head (``_in_free`` holds the live ones). Two views of the one
        # container so that each path is typed: a queue with prefix caching, a stack without (bulk slices).
        self._queue: deque[int] = deque()
        self._stack: list[int] = []
        self._free: MutableSequence[int] = self._queue if enable_prefix_caching else self._stack
        self._in_free: set[int] = set()
        self._num_free = num_blocks
        self.cached: dict[int, int] = {}  # prefix hash -> block holding it
        self.tables: dict[int, list[int]] = {}  # request id -> block ids, in token order
        self.cpu_tables: dict[int, int] = {}  # request id -> blocks held in CPU swap space
        self.num_free_cpu_blocks = num_cpu_blocks
        self._hashes: dict[int, list[int]] = {}  # request id -> chained hashes of its full prompt blocks
        self.num_hit_tokens = 0  # prefix-cache statistics
        self.num_queried_tokens = 0
        # host-memory tier under the prefix cache (sim.serving.host_kv_tier): evicted prefixes go there, and a prompt
        # continuing past its GPU hits loads the blocks the host holds instead of computing them; None: off
        self.host: HostKVTier | None = None
        # vLLM v1 hashes every full prompt block, not only the prefixes a workload declares shared: a request's own
        # blocks stay in the cache once freed, so one preempted by recompute finds what it computed still there
        # (vllm/v1/core/kv_cache_manager.py get_computed_blocks; kv_cache_utils.py hash_request_tokens). Set by
        # sim.engines.registry for engine vllm-v1 with prefix caching on; off, only the workload's hash ids are cached.
        self.cache_own_blocks = False
        # With cache_own_blocks, the free queue is exact LRU as vLLM's (block_pool.py FreeKVCacheBlockQueue removes a
        # revived block from its list): a block revived by a hit and freed again is evicted from its new place at
        # the tail, not from its stale entry's older place. stale[b] counts b's entries ahead of its live one. (The
        # classic prefix cache keeps the older order, which existing results depend on.)
        self._stale: dict[int, int] = {}

    # ---- read-only queries (policies may call these) -------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free

    def holds(self, req: Request) -> bool:
        return req.id in self.tables

    def block_table(self, req: Request) -> list[int]:
        return list(self.tables.get(req.id, ()))

    def num_blocks_of(self, req: Request) -> int:
        t = self.tables.get(req.id)
        return 0 if t is None else len(t)

    def can_ever_fit(self, req: Request) -> bool:
        return cdiv(req.max_len, self.block_size) <= self.num_blocks

    def prefix_hashes(self, req: Request) -> list[int]:
        """Chained hashes of the request's full prompt blocks, derived from the workload's hash ids, so that
        block j's hash names the whole prefix up to it (equal hash, equal prefix)."""
        h = self._hashes.get(req.id)
        if h is None:
            spec = req.spec
            h = []
            prev, prev_src = 0, -1
            if spec.hash_ids:
                bs, hbs, ids = self.block_size, spec.hash_block_size, spec.hash_ids
                for j in range(spec.prompt_len // bs):
                    src = ((j + 1) * bs - 1) // hbs
                    if src >= len(ids):
                        break
                    # most blocks start no new id (16-token blocks, 512-token ids): no slice to take
                    prev = hash((prev, tuple(ids[prev_src + 1 : src + 1]) if src != prev_src else (), j))
                    prev_src = src
                    h.append(prev)
            if self.cache_own_blocks:  # the blocks past the shared ids belong to this request alone
                for j in range(len(h), spec.prompt_len // self.block_size):
                    prev = hash((prev, "own", req.id, j))
                    h.append(prev)
            self._hashes[req.id] = h
        return h

    def _hashed(self, req: Request) -> bool:
        """Whether the request's prompt blocks have hashes (the workload's ids, or its own blocks under vLLM v1)."""
        return bool(req.spec.hash_ids) or self.cache_own_blocks

    def _hits(self, req: Request) -> list[int]:
        """Blocks of the prefix cache that hold the request's leading full prompt blocks (at least one token is
        always left to compute, so a fully cached prompt still recomputes its last block)."""
        if not self.enable_prefix_caching or req.id in self.tables or not self._hashed(req):
            return []
        max_blocks = (req.num_tokens - 1) // self.block_size
        lookup: Callable[[int], int | None] = self.cached.get  # the leading run that finds blocks, in C
        return cast("list[int]", list(takewhile(_IS_BLOCK, map(lookup, self.prefix_hashes(req)[:max_blocks]))))

    def _host_hits(self, req: Request, num_gpu_hits: int) -> list[int]:
        """Prefix hashes of the blocks past the request's ``num_gpu_hits`` GPU hits that the host tier holds,
        in order (empty without a tier; the same one-token-left rule as ``_hits``)."""
        host = self.host
        if host is None or not len(host) or req.id in self.tables or not self._hashed(req):
            return []
        hashes = self.prefix_hashes(req)[num_gpu_hits:(req.num_tokens - 1) // self.block_size]
        return hashes[:host.run_length(hashes)]

    def num_cached_tokens(self, req: Request) -> int:
        """Tokens of a request that holds no KV yet that the prefix cache (and its host tier) already has."""
        if not self.enable_prefix_caching:
            return 0  # (the policies ask for every waiting request they look at)
        n = len(self._hits(req))
        return (n + len(self._host_hits(req, n))) * self.block_size

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """Free blocks that ``allocate(req, num_new_tokens)`` would take (cache hits on used blocks are free)."""
        table = self.tables.get(req.id)
        if table is not None:
            return max(0, cdiv(req.num_computed_tokens + num_new_tokens, self.block_size) - len(table))
        swapped = self.cpu_tables.get(req.id)
        if swapped is not None:  # beyond the blocks its swap-in brings back
            return max(0, cdiv(req.num_computed_tokens + num_new_tokens, self.block_size) - swapped)
        if not self.enable_prefix_caching:
            return cdiv(req.num_computed_tokens + num_new_tokens, self.block_size)
        hits = self._hits(req)
        # blocks loaded from the host tier need fresh GPU blocks, like computed ones
        cached = len(hits) + len(self._host_hits(req, len(hits))) if self.host is not None else len(hits)
        computed = max(req.num_computed_tokens, cached * self.block_size)
        shared = sum(1 for b in hits if self.ref_count[b] > 0)  # hits exist only with prefix caching
        return cdiv(computed + num_new_tokens, self.block_size) - shared

    # ---- mutations (the core calls these) ------------------------------------------------------------------
    def _take_queue(self, n: int) -> list[int]:
        """Take ``n`` free blocks with prefix caching, in order: untouched ones first, then the free queue's head,
        evicting the prefix each still holds (to the host tier where there is one). One loop for all ``n``: a
        long prompt takes hundreds of blocks at once."""
        nxt = self._next
        k = min(n, self.num_blocks - nxt)
        out = list(range(nxt, nxt + k))
        self._next = nxt + k
        if k < n:
            popleft, in_free, stale = self._queue.popleft, self._in_free, self._stale
            block_hash, cached = self.block_hash, self.cached
            offloaded: list[int] = []  # evicted prefixes, in order, for the host tier
            for _ in range(n - k):
                while True:
                    b = popleft()
                    s = stale.get(b) if stale else None
                    if s is not None:  # an entry left behind when b was revived
                        if s > 1:
                            stale[b] = s - 1
                        else:
                            del stale[b]
                        continue
                    if b in in_free:
                        break
                in_free.remove(b)
                h = block_hash.pop(b, None)
                if h is not None and cached.get(h) == b:  # evict the prefix this free block still held
                    del cached[h]
                    offloaded.append(h)
                out.append(b)
            if offloaded and self.host is not None:  # offloaded to host memory rather than lost
                self.host.store_all(offloaded)
        self._num_free -= n
        self.ref_count.update(dict.fromkeys(out, 1))
        return out

    def _take(self, n: int) -> list[int]:
        if self.enable_prefix_caching:
            return self._take_queue(n)
        free = self._stack
        self._num_free -= n
        if n <= len(free):
            out = free[len(free) - n :]
            del free[len(free) - n :]
            return out
        # the stack's bottom is the untouched range in descending order, ending with ``_next``
        k = n - len(free)
        out = list(range(self._next + k - 1, self._next - 1, -1)) + free
        self._next += k
        free.clear()
        return out

    def _pop(self) -> int:
        if self._stack:
            return self._stack.pop()
        b = self._next
        self._next += 1
        return b

    def _release_table(self, table: list[int]) -> None:
        if self.enable_prefix_caching:  # a block comes free when its last reference goes
            ref_count, in_free, free = self.ref_count, self._in_free, self._queue
            n = 0
            for b in reversed(table):
                rc = ref_count[b] - 1
                ref_count[b] = rc
                if rc == 0:
                    in_free.add(b)
                    free.append(b)
                    n += 1
            self._num_free += n
        else:
            self._free.extend(reversed(table))
            self._num_free += len(table)

    def allocate(self, req: Request, num_new_tokens: int) -> int:
        """Make room for ``num_new_tokens`` more tokens. A request that holds no KV first takes its prefix-cache
        hits, which advances its ``num_computed_tokens``; hits the caller did not count (a request with the same
        prefix allocated just before) shorten ``num_new_tokens`` to what is left. Returns the cached tokens it got."""
        table = self.tables.get(req.id)
        hit_tokens = 0
        loaded: list[int] = []  # prefix hashes of the blocks loaded from the host tier
        if table is None:
            hits = self._hits(req)
            bs = self.block_size
            c = req.num_computed_tokens
            if self.host is not None:
                loaded = self._host_hits(req, len(hits))
                if (len(hits) + len(loaded)) * bs <= c:
                    loaded = []
            if (hits or loaded) and (len(hits) + len(loaded)) * bs > c:
                hit_tokens = (len(hits) + len(loaded)) * bs
                num_new_tokens = min(num_new_tokens, req.num_tokens - hit_tokens)
                c = hit_tokens
            # check before changing anything, so that a failed allocation leaves no trace
            revived = sum(1 for b in hits if self.ref_count[b] == 0) if hits else 0
            need = cdiv(c + num_new_tokens, bs) - len(hits) + revived
            if need > self._num_free:
                raise BlockError(f"request {req.id} needs {need} blocks, {self._num_free} free")
            if self.enable_prefix_caching and self._hashed(req):
                self.num_queried_tokens += req.num_tokens
            table = []
            for b in hits:
                if self.ref_count[b] == 0:
                    self._in_free.discard(b)  # its queue entry goes stale
                    if self.cache_own_blocks:
                        self._stale[b] = self._stale.get(b, 0) + 1
                    self._num_free -= 1
                self.ref_count[b] += 1
                table.append(b)
            if hit_tokens:
                # GPU hits only: the host tier counts its own (HostKVTier.loaded_blocks)
                self.num_hit_tokens += max(len(hits) * bs, req.num_computed_tokens) - req.num_computed_tokens
                req.num_computed_tokens = hit_tokens
            self.tables[req.id] = table
            if loaded and self.host is not None:  # before the blocks are taken: evictions to host keep these
                self.host.load(loaded)
        c0 = req.num_computed_tokens
        total = c0 + num_new_tokens
        need = -(-total // self.block_size) - len(table)  # cdiv, without a call a request
        if need > self._num_free:
            raise BlockError(f"request {req.id} needs {need} blocks, {self._num_free} free")
        if need > 0:
            table += self._take(need)
            if loaded:  # the loaded blocks hold their prefixes on the GPU again
                self._register(req, table, len(table) - need, len(table) - need + len(loaded))
        if self.enable_prefix_caching and self._hashed(req) and c0 < req.prompt_len:
            self._register(req, table, c0 // self.block_size, min(total, req.prompt_len) // self.block_size)
        return hit_tokens

    def _register(self, req: Request, table: list[int], first: int, end: int) -> None:
        """Publish the request's prompt blocks [first, end), now full, in the prefix cache."""
        block_hash, cached = self.block_hash, self.cached
        # (a prompt can have fewer hashed blocks than [first, end): its ids may stop short of its end)
        for b, h in zip(table[first:end], self.prefix_hashes(req)[first:end], strict=False):
            if b not in block_hash and h not in cached:
                cached[h] = b
                block_hash[b] = h

    def can_grow(self, n: int) -> bool:
        return n <= self._num_free

    def grow(self, reqs: list[Request]) -> None:
        """Append one block to each decoding request's table (the decode fast path knows they cross a block
        boundary this step), in order."""
        if not self.try_grow(reqs):
            raise BlockError(f"{len(reqs)} decoding requests need a block each, {self._num_free} free")

    def try_grow(self, reqs: list[Request]) -> bool:
        """``grow(reqs)`` when there are blocks for all of them, else False and nothing taken."""
        n = len(reqs)
        if n > self._num_free:
            return False
        tables = self.tables
        if self.enable_prefix_caching:
            for r, b in zip(reqs, self._take_queue(n), strict=True):
                tables[r.id].append(b)
            return True
        stack = self._stack
        if 0 < n <= len(stack):  # the decode fast path's common case: each takes the next block off the stack
            for r, b in zip(reqs, stack[: -n - 1 : -1], strict=True):
                tables[r.id].append(b)
            del stack[-n:]
        else:
            pop = self._pop
            for r in reqs:
                tables[r.id].append(pop())
        self._num_free -= n
        return True

    def free(self, req: Request) -> None:
        """Release every block of the request. The tail is released first so that, with prefix caching, a
        request's deepest blocks are evicted before the prefix others are likeliest to share."""
        table = self.tables.pop(req.id, None)
        if table is not None:
            self._release_table(table)
        self._hashes.pop(req.id, None)

    def swap_out(self, req: Request) -> int:
        """Move the request's KV to CPU swap space; returns blocks copied."""
        n = len(self.tables[req.id])
        if n > self.num_free_cpu_blocks:
            raise BlockError(f"request {req.id} needs {n} CPU blocks, {self.num_free_cpu_blocks} free")
        self._release_table(self.tables.pop(req.id))
        self.cpu_tables[req.id] = n
        self.num_free_cpu_blocks -= n
        return n

    def swap_in(self, req: Request) -> int:
        """Bring a swapped request's KV back into fresh GPU blocks; returns blocks copied."""
        n = self.cpu_tables.pop(req.id)
        if n > self._num_free:
            self.cpu_tables[req.id] = n
            raise BlockError(f"request {req.id} needs {n} blocks to swap in, {self._num_free} free")
        self.num_free_cpu_blocks += n
        self.tables[req.id] = self._take(n)
        return n

    def drop_swapped(self, req: Request) -> None:
        """Forget a swapped request's CPU copy (it was aborted or rejected while swapped)."""
        n = self.cpu_tables.pop(req.id, 0)
        self.num_free_cpu_blocks += n

    def budget(self) -> PagedBudget:
        return PagedBudget(self)

    def check_invariants(self) -> None:
        """Blocks are conserved and ref counts match the block tables (used by the property tests)."""
        refs: dict[int, int] = {}
        for table in self.tables.values():
            for b in table:
                assert 0 <= b < self._next, "a table holds a block never handed out"
                refs[b] = refs.get(b, 0) + 1
        untouched = self.num_blocks - self._next
        assert 0 <= untouched <= self._num_free, "more untouched blocks than free ones"
        assert 0 <= self.num_free_cpu_blocks <= self.num_cpu_blocks
        assert self.num_cpu_blocks - self.num_free_cpu_blocks == sum(self.cpu_tables.values())
        if not self.enable_prefix_caching:
            assert all(r <= 1 for r in refs.values()), "a block is in two tables without prefix caching"
            free = self._stack
            assert len(free) == len(set(free)) == self._num_free - untouched, "free stack: duplicates or wrong count"
            assert all(b not in refs and b < self._next for b in free), "a free block is in a table"
            assert self._num_free + len(refs) == self.num_blocks, "blocks not conserved"
            return
        assert refs == {b: r for b, r in self.ref_count.items() if r > 0}, "ref counts differ from block tables"
        live_free = self._in_free
        assert live_free <= set(self._queue), "a free block is missing from the free queue"
        assert len(live_free) + untouched == self._num_free, "free count differs from free queue"
        assert all(self.ref_count.get(b, 0) == 0 for b in live_free), "a free block is referenced"
        assert self._num_free + len(refs) == self.num_blocks, "blocks not conserved"
        for h, b in self.cached.items():
            assert self.block_hash.get(b) == h, "prefix cache points at a block holding another prefix"


_ID = attrgetter("id")


class PagedBudget:
    """Free-block arithmetic for planning a step against a ``PagedBlockManager``."""

    __slots__ = ("_m", "free", "cpu_free", "_planned", "_released", "_decoding")

    def __init__(self, m: PagedBlockManager) -> None:
        self._m = m
        self.free = m.num_free_blocks
        self.cpu_free = m.num_free_cpu_blocks
        self._planned: dict[int, int] = {}  # request id -> tokens planned this step
        self._released: dict[int, int] = {}  # block -> references the planned preemptions drop (prefix caching)
        # the requests reserve_decodes planned one token each, not yet in _planned: they go in when a request
        # holding blocks, as each of them does, is next asked about (most asks then only admit a waiting request,
        # which holds none)
        self._decoding: Sequence[Request] | None = None

    def _settle(self) -> None:
        """Put the requests of ``reserve_decodes`` into ``_planned``."""
        if self._decoding is not None:
            self._planned.update(dict.fromkeys(map(_ID, self._decoding), 1))
            self._decoding = None

    def _refs(self, b: int) -> int:
        return self._m.ref_count[b] - self._released.get(b, 0)

    def _needed(self, req: Request, num_new_tokens: int) -> int:
        m = self._m
        if not m.enable_prefix_caching or req.id in m.tables or req.id in m.cpu_tables or not self._released:
            return m.blocks_needed(req, num_new_tokens)
        # a hit on a block that this plan's preemptions release is no longer shared: reviving it costs a block
        hits = m._hits(req)
        cached = len(hits) + len(m._host_hits(req, len(hits))) if m.host is not None else len(hits)
        computed = max(req.num_computed_tokens, cached * m.block_size)
        return cdiv(computed + num_new_tokens, m.block_size) - sum(1 for b in hits if self._refs(b) > 0)

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        if self._decoding is not None and req.id in self._m.tables:  # only a holder of blocks can be one of them
            self._settle()
        planned = self._planned.get(req.id, 0)
        if not planned:
            table = self._m.tables.get(req.id)
            if table is not None:  # a running request's next blocks (what blocks_needed says), the common case
                need = -(-(req.num_computed_tokens + num_new_tokens) // self._m.block_size) - len(table)
                if need > self.free:
                    return False
                if need > 0:
                    self.free -= need
                self._planned[req.id] = num_new_tokens
                return True
        before = self._needed(req, planned) if planned else 0
        need = self._needed(req, planned + num_new_tokens) - before
        if need > self.free:
            return False
        self.free -= need
        self._planned[req.id] = planned + num_new_tokens
        return True

    def allocate_decodes(self, reqs: Sequence[Request]) -> int:
        # allocate's common case, once per running request at every ask of a policy: one loop, no calls
        self._settle()
        m = self._m
        tables, bs, planned = m.tables, m.block_size, self._planned
        free = self.free
        k = 0
        for r in reqs:
            c = r.num_computed_tokens
            if r.prompt_len + r.num_output_tokens - c != 1 or r.id in planned:
                break
            table = tables.get(r.id)
            if table is None:
                break
            need = (c + bs) // bs - len(table)  # blocks for c + 1 tokens, less those it holds
            if need > 0:
                if need > free:
                    break
                free -= need
            planned[r.id] = 1
            k += 1
        self.free = free
        return k

    def reserve_decodes(self, reqs: Sequence[Request], blocks: int) -> bool:
        # at every ask of a policy on the public API while all the running requests decode: the loop above, less
        # its per-request arithmetic (the decode group counted the blocks)
        if self._planned or self._decoding is not None or blocks > self.free:
            return False
        self.free -= blocks
        self._decoding = reqs
        return True

    def release(self, req: Request) -> None:
        m = self._m
        table = m.tables.get(req.id, ())
        if m.enable_prefix_caching:
            released = self._released
            for b in table:  # a block comes free when the last of its references goes
                released[b] = released.get(b, 0) + 1
                if m.ref_count[b] == released[b]:
                    self.free += 1
        else:
            self.free += len(table)
        if self._decoding is not None and req.id in self._m.tables:  # only a holder of blocks can be one of them
            self._settle()
        planned = self._planned.pop(req.id, 0)
        if planned:
            self.free += m.blocks_needed(req, planned)

    def take(self, n: int) -> bool:
        """Reserve ``n`` free blocks (the decode group's growth this step)."""
        if n > self.free:
            return False
        self.free -= n
        return True

    def can_swap_out(self, req: Request) -> bool:
        return self._m.num_blocks_of(req) <= self.cpu_free

    def swap_out(self, req: Request) -> None:
        self.cpu_free -= self._m.num_blocks_of(req)
        self.release(req)

    def swap_in(self, req: Request) -> bool:
        n = self._m.cpu_tables.get(req.id, 0)
        if n > self.free:
            return False
        self.free -= n
        self.cpu_free += n
        return True
