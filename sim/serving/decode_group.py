"""The decode group: running requests that each compute one token per step, tracked in aggregate.

Most of serving is decode. Once a request has its first token, every later step it computes exactly one token,
so the core need not touch it every step: it joins the decode group, whose shared counters advance by one per
step, and its own counters stay as they were when it joined until it leaves (it finishes, is preempted, or a
policy asks to see every request individually). What a step must know about the group is O(1) (its size, the
tokens it attends to) or O(what changes) (the members that open a new KV block this step, those that finish).
This is what lets the simulator run a hundred thousand requests in seconds; the results are identical to
stepping every request one by one, which the tests check byte for byte.
"""

from __future__ import annotations

from bisect import insort
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from sim.serving.request import Request

if TYPE_CHECKING:
    from sim.serving.fast_path import Priced


def _admit_order(r: Request) -> int:
    return r.admit_seq


class DecodeGroup:
    """Members' ``num_computed_tokens``, ``num_output_tokens`` and ``last_token`` are as of group step
    ``r.group_base``; ``steps - r.group_base`` tokens have been added since."""

    __slots__ = ("block_size", "grows", "members", "steps", "finish_at", "buckets", "ctx", "prev_end", "ends",
                 "version", "lookahead", "priced", "offsets", "_finish_heap")

    def __init__(self, block_size: int, grows_on_decode: bool, keep_ends: bool) -> None:
        self.block_size = block_size
        self.grows = grows_on_decode  # paged KV takes a new block when a member crosses a block boundary
        self.members: dict[int, Request] = {}
        self.steps = 0  # group steps taken so far
        self.finish_at: dict[int, list[Request]] = {}  # group step -> members that sample their last token in it
        # every key of ``finish_at`` (and keys since removed, dropped when they reach the top): ``next_finish``
        # without a scan of the keys, which the fast path asks for at every segment and every finish
        self._finish_heap: list[int] = []
        # Step j writes each member's token number c + (j - 1 - base), opening a block when that is a multiple of
        # block_size: members are bucketed by (base - c) % block_size, and step j needs bucket (j - 1) % bs.
        # Buckets keep admission order, the order in which a policy would allocate.
        self.buckets: list[list[Request]] = [[] for _ in range(block_size)]
        self.ctx = 0  # sum over members of tokens in KV now
        # each member's ``num_computed_tokens - group_base``, sorted: its tokens in KV now are that plus ``steps``,
        # so the longest member is the last, without a scan of every member at every step
        self.offsets: list[int] = []
        self.prev_end = -1.0  # when every member last sampled
        self.ends: list[float] | None = [] if keep_ends else None  # end of every group step (token timestamps)
        # The group's future steps' shapes follow from its members alone, so the fast path may price steps ahead
        # and keep them (``priced``) until the members change: ``version`` counts joins and leaves. ``lookahead``:
        # how many steps past the next outside event to price (0: none; a cluster's replicas are read at every
        # arrival, so they take a few steps per call and reuse what was priced).
        self.version = 0
        self.lookahead = 0
        self.priced: Priced | None = None

    @property
    def size(self) -> int:
        return len(self.members)

    def crossing(self) -> list[Request]:
        """Members that need a new KV block in the next step (paged KV)."""
        return self.buckets[self.steps % self.block_size]

    @property
    def next_blocks(self) -> int:
        """Free blocks the next step takes."""
        return len(self.buckets[self.steps % self.block_size]) if self.grows else 0

    def computed(self, r: Request) -> int:
        """A member's tokens in KV now."""
        return r.num_computed_tokens + self.steps - r.group_base

    def max_computed(self) -> int:
        """The longest member's tokens in KV now (0 without members): asked at every step the group takes."""
        offsets = self.offsets
        return offsets[-1] + self.steps if offsets else 0

    def join(self, r: Request) -> None:
        """Add a request that sampled at ``prev_end`` and has exactly one token to compute."""
        s = self.steps
        self.version += 1
        r.group_base = s
        c = r.num_computed_tokens
        self.ctx += c
        self.members[r.id] = r
        insort(self.offsets, c - s)
        insort(self.buckets[(s - c) % self.block_size], r, key=_admit_order)
        f = s + r.output_len - r.num_output_tokens
        lst = self.finish_at.get(f)
        if lst is None:
            self.finish_at[f] = [r]
            heappush(self._finish_heap, f)
        else:
            insort(lst, r, key=_admit_order)

    def next_finish(self) -> int:
        """The next group step in which members sample their last token (the least key of ``finish_at``), -1 when
        none: keys leave ``finish_at`` (``leave``, ``advance``, the fast path) without telling the heap."""
        heap, finish_at = self._finish_heap, self.finish_at
        while heap:
            f = heap[0]
            if f in finish_at:
                return f
            heappop(heap)
        return -1

    def leave(self, r: Request) -> None:
        """Remove a member and bring its counters up to date."""
        base = r.group_base
        c = r.num_computed_tokens
        k = self.steps - base
        self.version += 1
        self.buckets[(base - c) % self.block_size].remove(r)
        f = base + r.output_len - r.num_output_tokens
        lst = self.finish_at.get(f)
        if lst is not None and r in lst:
            lst.remove(r)
            if not lst:
                del self.finish_at[f]
        del self.members[r.id]
        self.offsets.remove(c - base)
        self.ctx -= c + k
        if k:
            r.num_computed_tokens = c + k
            r.num_output_tokens += k
            r.last_token = self.prev_end
            if r.token_times is not None and self.ends is not None:
                r.token_times.extend(self.ends[base : self.steps])
        r.group_base = -1

    def sync(self) -> None:
        """Bring every member's counters up to date while it stays a member (``bring`` each)."""
        bring = self.bring
        for r in self.members.values():
            bring(r)

    def bring(self, r: Request) -> None:
        """Bring a member's counters up to date while it stays a member (a policy on the public API reads them;
        its view calls this on the first read, so an ask costs nothing for members the policy does not look
        at). A member's bucket, ``(base - c) % block_size``, and its finishing step, ``base + output_len -
        num_output_tokens``, do not change when its base and its counters advance together, nor does ``ctx``:
        when it is brought up to date is invisible to the group and to the core."""
        s = self.steps
        base = r.group_base
        k = s - base
        if k:
            ends = self.ends
            if r.token_times is not None and ends is not None:
                r.token_times.extend(ends[base:s])
            r.num_computed_tokens += k
            r.num_output_tokens += k
            r.last_token = self.prev_end
            r.group_base = s

    def dissolve(self) -> list[Request]:
        """Every member leaves (up to date); returns them."""
        out = list(self.members.values())
        for r in out:
            self.leave(r)
        return out

    def advance(self, end: float) -> list[Request]:
        """Account one group step ending at ``end``; returns the members that sampled their last token in it
        (still members, in admission order: the caller finishes them)."""
        self.steps += 1
        self.ctx += len(self.members)
        self.prev_end = end
        if self.ends is not None:
            self.ends.append(end)
        return self.finish_at.pop(self.steps, [])
