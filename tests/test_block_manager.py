"""KV managers: stateful property tests against a shadow model, exact block counts, planning budgets, fragmentation.

The state machines play the core's part: they allocate a request's tokens, then "compute" them (advance
``num_computed_tokens`` and sample a token when the request has caught up), preempt by recompute or swap, and free
finished requests. The shadow model says what every table and every block must hold; it never reads the manager's
internals except to compare with them.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sim.serving.block_manager import PagedBlockManager
from sim.serving.contiguous_allocator import ContiguousAllocator
from sim.serving.kv_manager import BlockError, cdiv
from sim.serving.request import Request, RequestSpec

STATEFUL = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def req(id: int, prompt: int, output: int = 4, hash_ids: tuple[int, ...] = (), hbs: int = 16) -> Request:
    return Request(RequestSpec(id, 0.0, prompt, output, hash_ids=hash_ids, hash_block_size=hbs), arrival=0.0)


def grow_blocks(m, reqs: list[Request]) -> None:
    """One new block for each decoding request (the manager's decode fast-path entry point)."""
    if hasattr(m, "grow"):
        m.grow(reqs)
    else:  # the older one-at-a-time name
        for r in reqs:
            m.grow_one(r)


def compute(r: Request, n: int) -> None:
    """What the core does at the end of a step: the tokens are computed; a caught-up request samples one."""
    r.num_computed_tokens += n
    if r.num_computed_tokens == r.num_tokens:
        r.num_output_tokens += 1


# ---- paged: stateful -------------------------------------------------------------------------------------------


class PagedMachine(RuleBasedStateMachine):
    """Requests move new -> running -> (swapped -> running | new by recompute) -> gone."""

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.next_hash = 10_000
        self.new: dict[int, Request] = {}  # hold no KV
        self.running: dict[int, Request] = {}
        self.swapped: dict[int, Request] = {}
        self.content: dict[int, object] = {}  # block -> what its tokens are (shadow), None when meaningless

    prefix_caching = False
    own_blocks = False  # vLLM v1's cache of every prompt block (engine vllm-v1)

    @initialize(
        num_blocks=st.integers(1, 32),
        block_size=st.sampled_from([1, 2, 4, 8, 16]),
        hbs=st.sampled_from([16, 32]),
        cpu=st.integers(0, 32),
        first=st.lists(st.tuples(st.integers(1, 80), st.integers(1, 12), st.integers(-1, 1), st.integers(0, 5),
                                 st.floats(0.0, 1.0)), max_size=6),
    )
    def setup(self, num_blocks: int, block_size: int, hbs: int, cpu: int, first: list) -> None:
        self.m = PagedBlockManager(
            num_blocks, block_size, enable_prefix_caching=self.prefix_caching, num_cpu_blocks=cpu
        )
        self.m.cache_own_blocks = self.own_blocks
        self.bs = block_size
        self.hbs = hbs
        # a few "documents" that prompts share prefixes of
        self.families = [tuple(1000 * (f + 1) + i for i in range(16)) for f in range(2)]
        for prompt, output, family, shared, frac in first:  # start with some requests admitted
            self.add_request(prompt, output, family, shared)
            self.admit(len(self.new) - 1, frac)

    # -- shadow helpers --
    def label(self, r: Request, j: int) -> object:
        """Content of a request's block j once full: prompt blocks covered by hash ids are named by the ids of
        the prefix up to them (equal ids, equal tokens); anything else is private to the request."""
        ids = r.spec.hash_ids
        if (j + 1) * self.bs <= r.prompt_len:
            src = ((j + 1) * self.bs - 1) // r.spec.hash_block_size
            if src < len(ids):
                return ("prefix", ids[: src + 1], j)
        return ("own", r.id, j)

    def table(self, r: Request) -> list[int]:
        return self.m.tables[r.id]

    def refs(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in self.m.tables.values():
            for b in t:
                out[b] = out.get(b, 0) + 1
        return out

    def after_compute(self, r: Request, c0: int) -> None:
        """Record the content of the blocks this computation filled, then finish the request if it is done."""
        t = self.table(r)
        for j in range(c0 // self.bs, r.num_computed_tokens // self.bs):
            self.content[t[j]] = self.label(r, j)
        if r.num_output_tokens == r.output_len:
            self.release(r)
            del self.running[r.id]

    def release(self, r: Request) -> None:
        refs = self.refs()
        freed = sum(1 for b in self.table(r) if refs[b] == 1)
        before = self.m.num_free_blocks
        self.m.free(r)
        assert self.m.num_free_blocks - before == freed
        assert not self.m.holds(r)

    # -- rules --
    @rule(
        prompt=st.integers(1, 80),
        output=st.integers(1, 12),
        family=st.integers(-1, 1),
        shared=st.integers(0, 5),
    )
    def add_request(self, prompt: int, output: int, family: int, shared: int) -> None:
        if len(self.new) + len(self.running) + len(self.swapped) >= 10:
            return
        ids: tuple[int, ...] = ()
        if family >= 0:  # the first `shared` hash blocks are the family's, the rest are the request's own
            n = cdiv(prompt, self.hbs)
            own = tuple(range(self.next_hash, self.next_hash + n))
            self.next_hash += n
            ids = self.families[family][: min(shared, n)] + own[min(shared, n) :]
        self.new[self.next_id] = req(self.next_id, prompt, output, ids, self.hbs)
        self.next_id += 1

    @rule(pick=st.integers(0, 99), frac=st.floats(0.0, 1.0))
    def admit(self, pick: int, frac: float) -> None:
        if not self.new:
            return
        r = list(self.new.values())[pick % len(self.new)]
        m = self.m
        cached = m.num_cached_tokens(r)
        if not m.enable_prefix_caching:
            assert cached == 0
        assert cached % self.bs == 0 and cached <= r.num_tokens - 1  # at least one token left to compute
        left = r.num_tokens - max(r.num_computed_tokens, cached)
        n = 1 + int(frac * (left - 1))
        need = m.blocks_needed(r, n)
        free0 = m.num_free_blocks
        if need > free0:
            event("admission refused")
            refs0 = dict(m.ref_count)
            with pytest.raises(BlockError):
                m.allocate(r, n)
            assert not m.holds(r) and r.num_computed_tokens == 0  # a failed allocation leaves no trace
            assert m.num_free_blocks == free0 and m.ref_count == refs0
            return
        hit = m.allocate(r, n)
        assert hit == cached
        if hit:
            event("prefix hit")
        assert m.num_free_blocks == free0 - need
        t = self.table(r)
        assert len(t) == cdiv(r.num_computed_tokens + n, self.bs)
        assert r.num_computed_tokens == hit
        for j in range(hit // self.bs):  # a hit holds exactly the prefix this request would have computed
            assert self.content.get(t[j]) == self.label(r, j)
            # vLLM v1's own-block cache also returns the request's own blocks from before its preemption
            assert self.label(r, j)[0] == "prefix" or (self.own_blocks and self.label(r, j)[1] == r.id)
        for b in t[hit // self.bs :]:
            self.content[b] = None  # fresh blocks hold nothing yet
        del self.new[r.id]
        self.running[r.id] = r
        c0 = r.num_computed_tokens
        compute(r, n)
        self.after_compute(r, c0)

    @rule(pick=st.integers(0, 99), frac=st.floats(0.0, 1.0))
    def grow(self, pick: int, frac: float) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        m = self.m
        n = 1 + int(frac * (r.num_remaining - 1))
        need = m.blocks_needed(r, n)
        assert need == cdiv(r.num_computed_tokens + n, self.bs) - len(self.table(r))
        free0, len0 = m.num_free_blocks, len(self.table(r))
        if need > free0:
            event("grow refused")
            with pytest.raises(BlockError):
                m.allocate(r, n)
            assert m.num_free_blocks == free0 and len(self.table(r)) == len0  # nothing taken
            return
        assert m.allocate(r, n) == 0
        assert m.num_free_blocks == free0 - need
        for b in self.table(r)[len0:]:
            self.content[b] = None
        c0 = r.num_computed_tokens
        compute(r, n)
        self.after_compute(r, c0)

    @rule(picks=st.sets(st.integers(0, 9), min_size=1, max_size=4))
    def grow_decoders(self, picks: set[int]) -> None:
        """The decode fast path: decoding requests crossing a block boundary take exactly one block each."""
        if not any(self.crosses(r) for r in self.running.values()):
            return
        cands = [r for r in self.running.values() if self.crosses(r)]
        rs = list({cands[i % len(cands)].id: cands[i % len(cands)] for i in sorted(picks)}.values())
        m = self.m
        if not m.can_grow(len(rs)):
            assert m.num_free_blocks < len(rs)
            return
        free0 = m.num_free_blocks
        lens = [len(self.table(r)) for r in rs]
        grow_blocks(m, rs)
        assert m.num_free_blocks == free0 - len(rs)
        for r, n0 in zip(rs, lens, strict=True):
            assert len(self.table(r)) == n0 + 1
            self.content[self.table(r)[-1]] = None
            c0 = r.num_computed_tokens
            compute(r, 1)
            self.after_compute(r, c0)

    def crosses(self, r: Request) -> bool:
        return r.num_remaining == 1 and r.num_computed_tokens % self.bs == 0

    @rule(pick=st.integers(0, 99))
    def preempt_recompute(self, pick: int) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        self.release(r)
        r.num_computed_tokens = 0
        del self.running[r.id]
        self.new[r.id] = r

    @rule(pick=st.integers(0, 99))
    def finish_early(self, pick: int) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        self.release(r)
        del self.running[r.id]

    @rule(pick=st.integers(0, 99))
    def swap_out(self, pick: int) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        m = self.m
        n = len(self.table(r))
        cpu0, free0 = m.num_free_cpu_blocks, m.num_free_blocks
        if n > cpu0:
            with pytest.raises(BlockError):
                m.swap_out(r)
            assert m.num_free_cpu_blocks == cpu0 and m.num_free_blocks == free0 and m.holds(r)
            return
        refs = self.refs()
        freed = sum(1 for b in self.table(r) if refs[b] == 1)
        assert m.swap_out(r) == n
        assert m.num_free_cpu_blocks == cpu0 - n
        assert m.num_free_blocks == free0 + freed
        assert not m.holds(r) and m.cpu_tables[r.id] == n
        del self.running[r.id]
        self.swapped[r.id] = r

    @rule(pick=st.integers(0, 99))
    def swap_in(self, pick: int) -> None:
        if not self.swapped:
            return
        r = list(self.swapped.values())[pick % len(self.swapped)]
        m = self.m
        n = m.cpu_tables[r.id]
        assert n == cdiv(r.num_computed_tokens, self.bs)
        cpu0, free0 = m.num_free_cpu_blocks, m.num_free_blocks
        assert m.blocks_needed(r, 1) == cdiv(r.num_computed_tokens + 1, self.bs) - n
        if n > free0:
            event("paged swap-in refused")
            with pytest.raises(BlockError):
                m.swap_in(r)
            assert m.cpu_tables[r.id] == n and m.num_free_cpu_blocks == cpu0 and m.num_free_blocks == free0
            return
        assert m.swap_in(r) == n
        assert m.num_free_cpu_blocks == cpu0 + n and m.num_free_blocks == free0 - n
        t = self.table(r)
        for j, b in enumerate(t):  # the copy brings the request's own content back
            self.content[b] = self.label(r, j) if (j + 1) * self.bs <= r.num_computed_tokens else None
        del self.swapped[r.id]
        self.running[r.id] = r

    @rule(pick=st.integers(0, 99))
    def drop_swapped(self, pick: int) -> None:
        if not self.swapped:
            return
        r = list(self.swapped.values())[pick % len(self.swapped)]
        cpu0 = self.m.num_free_cpu_blocks
        self.m.drop_swapped(r)
        assert self.m.num_free_cpu_blocks == cpu0 + cdiv(r.num_computed_tokens, self.bs)
        del self.swapped[r.id]

    @rule(victims=st.sets(st.integers(0, 9), max_size=3), ins=st.sets(st.integers(0, 9), max_size=3),
          fracs=st.lists(st.floats(0.0, 1.0), min_size=10, max_size=10))
    def planned_step(self, victims: set[int], ins: set[int], fracs: list[float]) -> None:
        """Plan a step on a budget in the policies' order (preemptions, swap-ins, then allocations of running
        requests), apply it to the manager in the core's order, and compare: the budget is exact, also when
        requests preempted together share prefix blocks (the budget counts a block freed when its last reference is
        released, see test_budget_release_of_prefix_sharers)."""
        if not (self.running or self.swapped):
            return
        m = self.m
        running = list(self.running.values())
        budget = m.budget()
        vic = [running[i] for i in sorted(victims) if i < len(running)]
        # blocks held only by victims, by two or more of them: the case where counting references matters
        holders: dict[int, set[int]] = {}
        for r in running:
            for b in self.table(r):
                holders.setdefault(b, set()).add(r.id)
        vic_ids = {r.id for r in vic}
        shared_by_victims = sum(1 for h in holders.values() if len(h) > 1 and h <= vic_ids)
        for r in vic:
            budget.release(r)
        swapped = list(self.swapped.values())
        back = [swapped[i] for i in sorted(ins) if i < len(swapped) and budget.swap_in(swapped[i])]
        plan: list[tuple[Request, int]] = []
        for i, r in enumerate([r for r in running if r not in vic] + back):
            n = 1 + int(fracs[i % 10] * (r.num_remaining - 1))
            if budget.allocate(r, n):
                plan.append((r, n))
        for r in vic:
            self.release(r)
            r.num_computed_tokens = 0
            del self.running[r.id]
            self.new[r.id] = r
        for r in back:
            assert m.swap_in(r) == cdiv(r.num_computed_tokens, self.bs)
            for j, b in enumerate(self.table(r)):
                self.content[b] = self.label(r, j) if (j + 1) * self.bs <= r.num_computed_tokens else None
            del self.swapped[r.id]
            self.running[r.id] = r
        for r, n in plan:
            len0 = len(self.table(r))
            m.allocate(r, n)  # never raises: the budget said it fits
            for b in self.table(r)[len0:]:
                self.content[b] = None
        assert m.num_free_cpu_blocks == budget.cpu_free
        assert m.num_free_blocks == budget.free
        if shared_by_victims:
            event("victims share blocks")
        if len(plan) < len(running) - len(vic) + len(back):
            event("budget refused an allocation")
        for r, n in plan:
            c0 = r.num_computed_tokens
            compute(r, n)
            self.after_compute(r, c0)

    # -- invariants --
    @invariant()
    def manager_invariants(self) -> None:
        if not hasattr(self, "m"):
            return
        m = self.m
        m.check_invariants()
        assert m.num_used_blocks + m.num_free_blocks == m.num_blocks
        refs = self.refs()
        assert m.num_used_blocks == len(refs)  # every used block is in some table: no leak, no double free
        assert 0 <= m.num_free_blocks <= m.num_blocks
        if not m.enable_prefix_caching:
            assert all(c == 1 for c in refs.values())
        else:
            assert all(m.ref_count[b] == c for b, c in refs.items())
        assert set(m.tables) == set(self.running)
        assert m.cpu_tables == {i: cdiv(r.num_computed_tokens, self.bs) for i, r in self.swapped.items()}
        assert m.num_cpu_blocks - m.num_free_cpu_blocks == sum(m.cpu_tables.values())
        where: dict[int, tuple[int, int]] = {}
        for r in self.running.values():
            t = self.table(r)
            assert len(t) == cdiv(r.num_computed_tokens, self.bs)
            for j, b in enumerate(t):
                if (j + 1) * self.bs <= r.num_computed_tokens:
                    assert self.content[b] == self.label(r, j)
                if b in where:  # shared: the same prompt prefix at the same position
                    other, j2 = where[b]
                    assert j == j2
                    assert self.label(r, j) == self.label(self.running[other], j) and self.label(r, j)[0] == "prefix"
                where[b] = (r.id, j)


class PagedPrefixMachine(PagedMachine):
    prefix_caching = True


class PagedOwnBlocksMachine(PagedMachine):
    prefix_caching = True
    own_blocks = True


def test_planned_step_when_victims_share_a_prefix_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sequence HYPOTHESIS_PROFILE=explore found (seed 116800660751933280919679336743919761605): two running
    requests that share a prefix block are preempted together while a third grows. The manager frees the shared
    block and the budget counts it freed too; the state machine's check once added it a second time."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *a, **k: None)  # outside hypothesis
    s = PagedOwnBlocksMachine()
    s.setup(num_blocks=3, block_size=1, hbs=16, cpu=0, first=[(1, 1, 0, 0, 0.0)] * 3)
    for family, prompt, shared in [(0, 1, 0), (0, 1, 0), (1, 2, 1)]:
        s.add_request(family=family, output=1, prompt=prompt, shared=shared)
    s.admit(frac=0.0, pick=1)
    for family, prompt in [(0, 2), (0, 1), (0, 1)]:
        s.add_request(family=family, output=1, prompt=prompt, shared=0)
    for pick in (12, 0, 0):
        s.admit(frac=0.0, pick=pick)
    s.add_request(family=1, output=1, prompt=3, shared=1)
    s.admit(frac=0.0, pick=38)
    victims = [r for r in s.running.values() if s.table(r)[0] == 0]
    assert len(victims) == 2 and len(s.running) == 3  # the two sharers of block 0, and one more running
    s.planned_step(victims={1, 2}, ins=set(), fracs=[0.0] * 10)
    s.manager_invariants()
    assert s.m.num_free_blocks == 3  # everything finished (one output token each) and came free


TestPagedNoPrefix = PagedMachine.TestCase
TestPagedNoPrefix.settings = STATEFUL
TestPagedPrefix = PagedPrefixMachine.TestCase
TestPagedPrefix.settings = STATEFUL
TestPagedOwnBlocks = PagedOwnBlocksMachine.TestCase
TestPagedOwnBlocks.settings = STATEFUL


# ---- contiguous: stateful --------------------------------------------------------------------------------------


class ContiguousMachine(RuleBasedStateMachine):
    """A shadow address space (owner per block) against the allocator's holes and ranges."""

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.new: dict[int, Request] = {}
        self.running: dict[int, Request] = {}
        self.swapped: dict[int, Request] = {}

    @initialize(
        num_blocks=st.integers(4, 40),
        block_size=st.sampled_from([1, 2, 4]),
        reserve=st.sampled_from(["max_model_len", "request", "request"]),
        max_model_len=st.integers(1, 24),
        cpu=st.integers(0, 24),
        first=st.lists(st.tuples(st.integers(1, 16), st.integers(1, 12)), min_size=2, max_size=7),
    )
    def setup(
        self, num_blocks: int, block_size: int, reserve: str, max_model_len: int, cpu: int, first: list
    ) -> None:
        self.m = ContiguousAllocator(
            num_blocks, block_size, max_model_len=max_model_len, reserve=reserve, num_cpu_blocks=cpu
        )
        self.bs = block_size
        self.owner: list[int | None] = [None] * num_blocks
        for prompt, output in first:  # start with some requests admitted
            self.add_request(prompt, output)
            self.admit(len(self.new) - 1)

    def reserve(self, r: Request) -> int:
        tokens = r.max_len if self.m.reserve == "request" else max(self.m.max_model_len, r.max_len)
        return cdiv(tokens, self.bs)

    def first_fit(self, n: int) -> int:
        run = 0
        for i, o in enumerate(self.owner):
            run = run + 1 if o is None else 0
            if run == n:
                return i - n + 1
        return -1

    def place(self, r: Request) -> bool:
        """Allocate a reservation (admission or swap-in) and check where it went."""
        n = self.reserve(r)
        assert self.m.blocks_needed(r, 1) == (0 if r.id in self.swapped else n)
        start = self.first_fit(n)
        free0 = self.m.num_free_blocks
        if start < 0 and free0 >= n:
            event("external fragmentation")
        if start < 0:
            with pytest.raises(BlockError):
                if r.id in self.swapped:
                    self.m.swap_in(r)
                else:
                    self.m.allocate(r, 1)
            assert self.m.num_free_blocks == free0 and not self.m.holds(r)
            return False
        if r.id in self.swapped:
            cpu0 = self.m.num_free_cpu_blocks
            assert self.m.swap_in(r) == n
            assert self.m.num_free_cpu_blocks == cpu0 + n
        else:
            assert self.m.allocate(r, 1) == 0
        assert self.m.ranges[r.id] == (start, n)
        assert self.m.num_free_blocks == free0 - n
        self.owner[start : start + n] = [r.id] * n
        return True

    def unplace(self, r: Request) -> None:
        self.owner = [None if o == r.id else o for o in self.owner]

    @rule(prompt=st.integers(1, 16), output=st.integers(1, 12))
    def add_request(self, prompt: int, output: int) -> None:
        if len(self.new) + len(self.running) + len(self.swapped) >= 8:
            return
        self.new[self.next_id] = req(self.next_id, prompt, output)
        self.next_id += 1

    @rule(pick=st.integers(0, 99))
    def admit(self, pick: int) -> None:
        if not self.new:
            return
        r = list(self.new.values())[pick % len(self.new)]
        if self.place(r):
            compute(r, 1)
            del self.new[r.id]
            self.running[r.id] = r

    @rule(pick=st.integers(0, 99), frac=st.floats(0.0, 1.0))
    def grow(self, pick: int, frac: float) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        if r.num_output_tokens >= r.output_len:
            return
        n = 1 + int(frac * (r.num_remaining - 1))
        free0 = self.m.num_free_blocks
        assert self.m.blocks_needed(r, n) == 0 and self.m.can_grow(5)
        assert self.m.allocate(r, n) == 0  # writes into the reservation
        assert self.m.num_free_blocks == free0
        compute(r, n)

    @rule(pick=st.integers(0, 99))
    def free(self, pick: int) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        free0 = self.m.num_free_blocks
        self.m.free(r)
        assert self.m.num_free_blocks == free0 + self.reserve(r)
        self.unplace(r)
        del self.running[r.id]

    @rule(pick=st.integers(0, 99))
    def swap_out(self, pick: int) -> None:
        if not self.running:
            return
        r = list(self.running.values())[pick % len(self.running)]
        n = self.reserve(r)  # the whole reservation travels, as a naive server copies its buffer
        cpu0, free0 = self.m.num_free_cpu_blocks, self.m.num_free_blocks
        if n > cpu0:
            with pytest.raises(BlockError):
                self.m.swap_out(r)
            assert self.m.num_free_cpu_blocks == cpu0 and self.m.holds(r)
            return
        assert self.m.swap_out(r) == n
        assert self.m.num_free_cpu_blocks == cpu0 - n and self.m.num_free_blocks == free0 + self.reserve(r)
        self.unplace(r)
        del self.running[r.id]
        self.swapped[r.id] = r

    @rule(pick=st.integers(0, 99))
    def swap_in(self, pick: int) -> None:
        if not self.swapped:
            return
        r = list(self.swapped.values())[pick % len(self.swapped)]
        n = self.m.cpu_tables[r.id]
        if self.place(r):
            del self.swapped[r.id]
            self.running[r.id] = r
        else:
            assert self.m.cpu_tables[r.id] == n

    @rule(pick=st.integers(0, 99))
    def drop_swapped(self, pick: int) -> None:
        if not self.swapped:
            return
        r = list(self.swapped.values())[pick % len(self.swapped)]
        cpu0 = self.m.num_free_cpu_blocks
        self.m.drop_swapped(r)
        assert self.m.num_free_cpu_blocks == cpu0 + self.reserve(r)
        del self.swapped[r.id]

    @rule(pick=st.integers(0, 99), releases=st.sets(st.integers(0, 7), max_size=3))
    def budget_matches(self, pick: int, releases: set[int]) -> None:
        """Releases then an admission, planned on a budget (a copy of the holes), match the real allocator."""
        if not self.new:
            return
        m = self.m
        running = list(self.running.values())
        vic = [running[i] for i in sorted(releases) if i < len(running)]
        r = list(self.new.values())[pick % len(self.new)]
        budget = m.budget()
        for v in vic:
            budget.release(v)
        ok = budget.allocate(r, 1)
        for v in vic:
            m.free(v)
            self.unplace(v)
            del self.running[v.id]
        assert budget.free == m.num_free_blocks - (self.reserve(r) if ok else 0)
        assert ok == (self.first_fit(self.reserve(r)) >= 0)
        if ok:
            assert self.place(r)
            compute(r, 1)
            del self.new[r.id]
            self.running[r.id] = r
            assert [list(h) for h in budget.holes] == m.holes

    @invariant()
    def allocator_invariants(self) -> None:
        if not hasattr(self, "m"):
            return
        m = self.m
        m.check_invariants()
        assert m.num_used_blocks + m.num_free_blocks == m.num_blocks
        assert m.num_free_blocks == self.owner.count(None)
        # holes are exactly the maximal free runs: freed neighbours were merged
        runs, start = [], None
        for i, o in enumerate(self.owner + ["end"]):
            if o is None and start is None:
                start = i
            elif o is not None and start is not None:
                runs.append([start, i - start])
                start = None
        assert m.holes == runs
        assert set(m.ranges) == set(self.running)
        for i, r in self.running.items():
            start, n = m.ranges[i]
            assert n == self.reserve(r) and self.owner[start : start + n] == [i] * n
            assert r.num_computed_tokens <= n * self.bs
        assert m.cpu_tables == {i: self.reserve(r) for i, r in self.swapped.items()}


TestContiguous = ContiguousMachine.TestCase
TestContiguous.settings = STATEFUL


# ---- paged: hand cases -----------------------------------------------------------------------------------------


def test_paged_blocks_follow_tokens_exactly() -> None:
    m = PagedBlockManager(10, 4)
    r = req(0, prompt=10, output=5)
    assert m.blocks_needed(r, 10) == 3
    m.allocate(r, 10)
    compute(r, 10)  # 10 prompt tokens computed, first output sampled: 11 tokens
    assert (m.num_blocks_of(r), m.num_free_blocks, m.num_used_blocks) == (3, 7, 3)
    held = []
    for _ in range(4):  # decode tokens 11, 12, 13, 14 (1-based): the 13th opens block 4
        assert m.blocks_needed(r, 1) == (1 if r.num_computed_tokens % 4 == 0 else 0)
        m.allocate(r, 1)
        compute(r, 1)
        held.append(m.num_blocks_of(r))
    assert held == [3, 3, 4, 4]
    m.free(r)
    assert (m.num_free_blocks, m.tables) == (10, {})
    m.check_invariants()


def test_paged_chunked_prefill_and_capacity() -> None:
    m = PagedBlockManager(5, 4)
    other = req(1, 3)
    m.allocate(other, 3)
    r = req(0, prompt=13, output=3)  # holds at most 16 tokens = 4 blocks
    assert m.can_ever_fit(r) and m.can_ever_fit(req(2, 17, 3)) and not m.can_ever_fit(req(3, 17, 4))
    for n, blocks in [(3, 1), (5, 2), (5, 4)]:
        m.allocate(r, n)
        compute(r, n)
        assert m.num_blocks_of(r) == blocks
    assert r.num_output_tokens == 1 and m.num_free_blocks == 0  # the last chunk finished the prompt
    assert m.blocks_needed(r, 3) == 0  # tokens 14..16 still fit block 4
    assert m.blocks_needed(r, 4) == 1
    with pytest.raises(BlockError):
        m.allocate(r, 4)  # a 17th token would need a fifth block, and none is free
    assert m.num_blocks_of(r) == 4
    m.check_invariants()


def test_paged_block_size_one_is_one_block_per_token() -> None:
    m = PagedBlockManager(8, 1)
    r = req(0, prompt=5, output=3)
    m.allocate(r, 5)
    compute(r, 5)
    m.allocate(r, 1)
    compute(r, 1)
    assert m.num_blocks_of(r) == 6 and m.num_free_blocks == 2


def test_prefix_hits_exact() -> None:
    m = PagedBlockManager(16, 16, enable_prefix_caching=True)
    a = req(0, 64, hash_ids=(1, 2, 3, 4))
    m.allocate(a, 64)
    compute(a, 64)
    # equal prompt: 3 of 4 blocks hit, the last one is recomputed so that a token is left to sample from
    b = req(1, 64, hash_ids=(1, 2, 3, 4))
    assert m.num_cached_tokens(b) == 48
    assert m.blocks_needed(b, 16) == 1  # the three hit blocks are in use by a: shared, not taken
    free0 = m.num_free_blocks
    assert m.allocate(b, 16) == 48 and b.num_computed_tokens == 48
    assert m.num_free_blocks == free0 - 1
    assert m.tables[1][:3] == m.tables[0][:3] and m.tables[1][3] != m.tables[0][3]
    assert [m.ref_count[x] for x in m.tables[0]] == [2, 2, 2, 1]
    # a longer prompt with the same first four blocks gets all four
    assert m.num_cached_tokens(req(2, 70, hash_ids=(1, 2, 3, 4, 5))) == 64
    # a divergence stops the hits there; hashes are chained, so an equal id after a difference never hits
    assert m.num_cached_tokens(req(3, 64, hash_ids=(1, 2, 9, 4))) == 32
    assert m.num_cached_tokens(req(4, 64, hash_ids=(7, 2, 3, 4))) == 0
    assert m.num_cached_tokens(req(5, 64)) == 0  # no hash ids, no identity, no sharing
    assert m.num_cached_tokens(req(6, 20, hash_ids=(1, 2))) == 16  # 19 tokens can be hit at most: one block
    m.check_invariants()


def test_prefix_hits_with_larger_hash_blocks() -> None:
    m = PagedBlockManager(16, 16, enable_prefix_caching=True)
    a = req(0, 64, hash_ids=(1, 2), hbs=32)  # blocks 0, 1 under hash id 1; blocks 2, 3 under id 2
    m.allocate(a, 64)
    compute(a, 64)
    assert m.num_cached_tokens(req(1, 64, hash_ids=(1, 3), hbs=32)) == 32
    assert m.num_cached_tokens(req(2, 64, hash_ids=(1, 2), hbs=32)) == 48
    assert m.num_cached_tokens(req(3, 64, hash_ids=(5, 2), hbs=32)) == 0


def test_prefix_cache_survives_free_until_evicted() -> None:
    m = PagedBlockManager(6, 16, enable_prefix_caching=True)
    a = req(0, 64, hash_ids=(1, 2, 3, 4))
    m.allocate(a, 64)
    compute(a, 64)
    m.free(a)
    assert m.num_free_blocks == 6
    b = req(1, 64, hash_ids=(1, 2, 3, 4))
    assert m.num_cached_tokens(b) == 48
    assert m.blocks_needed(b, 16) == 4  # the hit blocks are free: reviving them takes them from the free count
    assert m.allocate(b, 16) == 48 and m.num_free_blocks == 2
    m.free(b)
    # an unrelated request that takes every free block evicts the cached prefix
    c = req(2, 96)
    m.allocate(c, 96)
    assert m.num_free_blocks == 0 and m.cached == {}
    m.free(c)
    assert m.num_cached_tokens(req(3, 64, hash_ids=(1, 2, 3, 4))) == 0
    m.check_invariants()


def test_paged_swap_in_refused_then_allowed() -> None:
    m = PagedBlockManager(4, 4, num_cpu_blocks=4)
    a, b = req(0, 8), req(1, 12)
    m.allocate(a, 8)
    compute(a, 8)
    assert m.swap_out(a) == 2 and m.num_free_blocks == 4 and m.num_free_cpu_blocks == 2
    m.allocate(b, 12)
    with pytest.raises(BlockError):
        m.swap_in(a)
    assert m.cpu_tables == {0: 2} and m.num_free_cpu_blocks == 2 and not m.holds(a)
    with pytest.raises(BlockError):
        m.swap_out(b)  # 3 blocks, 2 CPU blocks free
    assert m.holds(b) and m.num_free_blocks == 1
    m.free(b)
    assert m.swap_in(a) == 2 and m.num_blocks_of(a) == 2 and m.num_free_cpu_blocks == 4
    m.check_invariants()


def test_paged_budget_predicts_the_step() -> None:
    """A plan made on a budget (preempt one, swap one in, grow two, admit one) and then applied in the core's
    order leaves exactly the free blocks the budget predicted; the allocation it refuses would not fit."""
    m = PagedBlockManager(10, 4, num_cpu_blocks=8)
    a, b, c, d = req(0, 8, 8), req(1, 5, 8), req(2, 7, 8), req(3, 6, 8)
    for r in (a, b, c):
        m.allocate(r, r.prompt_len)
        compute(r, r.prompt_len)
    m.swap_out(c)  # c: 8 tokens, 7 computed, 2 blocks in CPU memory
    assert (m.num_free_blocks, m.num_free_cpu_blocks) == (6, 6)  # a: 2 blocks, b: 2 blocks
    budget = m.budget()
    budget.release(b)
    assert budget.free == 8
    assert budget.swap_in(c) and budget.free == 6 and budget.cpu_free == 8
    assert budget.allocate(c, 1) and budget.free == 6  # token 8 fits c's second block
    assert budget.allocate(a, 1) and budget.free == 5  # token 9 opens a's third block
    assert budget.allocate(a, 4) and budget.free == 4  # planned twice: 13 tokens, 4 blocks in all
    assert budget.allocate(d, 6) and budget.free == 2
    assert not budget.allocate(req(4, 12), 12) and budget.free == 2  # 3 blocks: refused, nothing reserved
    m.free(b)  # preempt (recompute)
    b.num_computed_tokens = 0
    assert m.swap_in(c) == 2
    for r, n in ((c, 1), (a, 1), (a, 4), (d, 6)):
        m.allocate(r, n)
        r.num_computed_tokens += n
    assert (m.num_free_blocks, m.num_free_cpu_blocks) == (2, 8)
    assert [m.num_blocks_of(r) for r in (a, b, c, d)] == [4, 0, 2, 2]
    with pytest.raises(BlockError):
        m.allocate(req(4, 12), 12)
    m.check_invariants()


def test_budget_release_of_prefix_sharers() -> None:
    """Requests preempted together that share prefix blocks free exactly what the real manager frees."""
    m = PagedBlockManager(8, 16, enable_prefix_caching=True)
    a, b = req(0, 48, hash_ids=(1, 2, 3)), req(1, 48, hash_ids=(1, 2, 3))
    m.allocate(a, 48)
    compute(a, 48)
    assert m.allocate(b, 16) == 32  # b shares a's first two blocks
    budget = m.budget()
    budget.release(a)
    budget.release(b)
    m.free(a)
    m.free(b)
    assert m.num_free_blocks == 8
    assert budget.free == 8


def test_budget_release_then_hit() -> None:
    """A hit on a block that a planned preemption releases costs a block (it is revived, not shared)."""
    m = PagedBlockManager(8, 16, enable_prefix_caching=True)
    a, c = req(0, 48, hash_ids=(1, 2, 3)), req(2, 48, hash_ids=(1, 2, 3))
    m.allocate(a, 48)
    compute(a, 48)
    budget = m.budget()
    budget.release(a)
    assert budget.allocate(c, 16)
    m.free(a)
    m.allocate(c, 16)
    assert m.num_free_blocks == budget.free


@pytest.mark.parametrize("prefix", [False, True])
def test_failed_allocate_changes_nothing(prefix: bool) -> None:
    """A request that holds no KV and does not fit leaves no trace: no table, no hit references taken, its
    computed tokens unchanged (as swap_in and the contiguous allocator do on failure)."""
    m = PagedBlockManager(4, 4, enable_prefix_caching=prefix)
    a = req(0, 8, hash_ids=(1,))
    m.allocate(a, 8)
    compute(a, 8)
    r = req(1, 40, hash_ids=(1, 2, 3))
    refs0, free0 = dict(m.ref_count), m.num_free_blocks
    with pytest.raises(BlockError):
        m.allocate(r, 40 - m.num_cached_tokens(r))
    assert (m.holds(r), r.num_computed_tokens, m.num_free_blocks) == (False, 0, free0)
    assert m.ref_count == refs0


# ---- contiguous: hand cases ------------------------------------------------------------------------------------


def contiguous_abc() -> tuple[ContiguousAllocator, Request, Request, Request]:
    """Ten blocks of one token holding A [0, 3), B [3, 7), C [7, 10)."""
    m = ContiguousAllocator(10, 1, max_model_len=1, reserve="request")
    a, b, c = req(0, 2, 1), req(1, 3, 1), req(2, 1, 2)
    for r in (a, b, c):
        m.allocate(r, r.prompt_len)
    assert m.ranges == {0: (0, 3), 1: (3, 4), 2: (7, 3)} and m.holes == []
    return m, a, b, c


def test_contiguous_external_fragmentation() -> None:
    m, a, b, c = contiguous_abc()
    m.free(a)
    m.free(c)
    assert m.holes == [[0, 3], [7, 3]] and m.num_free_blocks == 6 and m.largest_hole == 3
    d = req(3, 3, 1)  # 4 blocks: fewer than the 6 free, more than any hole
    assert m.blocks_needed(d, 3) == 4
    assert not m.budget().allocate(d, 3)
    with pytest.raises(BlockError):
        m.allocate(d, 3)
    assert m.num_free_blocks == 6 and not m.holds(d)
    # planning B's preemption merges the three holes in the budget's copy, and D then fits at the start
    budget = m.budget()
    budget.release(b)
    assert budget.allocate(d, 3) and budget.holes == [[4, 6]]
    m.free(b)
    assert m.holes == [[0, 10]]
    m.allocate(d, 3)
    assert m.ranges == {3: (0, 4)} and m.holes == [[4, 6]] and budget.holes == m.holes
    m.check_invariants()


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (0, 2, 1), (1, 0, 2), (1, 2, 0)])
def test_contiguous_holes_merge_on_free(order: tuple[int, int, int]) -> None:
    m, *reqs = contiguous_abc()
    for i in order:
        m.free(reqs[i])
        m.check_invariants()
        spans = sorted(m.holes)
        assert all(x[0] + x[1] < y[0] for x, y in zip(spans, spans[1:]))  # no two holes touch
    assert m.holes == [[0, 10]] and m.num_free_blocks == 10


def test_contiguous_reserves_max_model_len() -> None:
    m = ContiguousAllocator(20, 4, max_model_len=32)
    r = req(0, 5, 3)
    m.allocate(r, 5)
    assert m.num_blocks_of(r) == 8 and m.num_free_blocks == 12  # 32 tokens reserved for an 8-token request
    long = req(1, 40, 12)  # longer than max_model_len: its own length is reserved
    assert m.reserve_blocks(long) == 13 and not m.budget().allocate(long, 40)
    assert m.budget().allocate(req(2, 40, 8), 40)  # 12 blocks: fits exactly
    compute(r, 5)
    assert m.allocate(r, 1) == 0 and m.num_free_blocks == 12  # decoding writes into the reservation


def test_uncounted_hits_shorten_the_allocation() -> None:
    """A caller that planned a whole prompt before an equal prefix was published (two equal prompts admitted in
    one step) gets the hits anyway, and the new tokens shrink to what is left."""
    m = PagedBlockManager(16, 16, enable_prefix_caching=True)
    a, b = req(0, 64, hash_ids=(1, 2, 3, 4)), req(1, 64, hash_ids=(1, 2, 3, 4))
    m.allocate(a, 64)
    assert m.allocate(b, 64) == 48
    assert b.num_computed_tokens == 48 and m.num_blocks_of(b) == 4 and m.num_free_blocks == 16 - 5
    m.check_invariants()


def test_block_order_equals_a_full_free_list() -> None:
    """Untouched blocks kept as a range hand out the very blocks a full free stack did (results stay
    byte-identical): a seeded random mix of allocations, decode growth and frees, against that stack."""
    import random

    rnd = random.Random(7)
    n = 64
    m = PagedBlockManager(n, 4)
    stack = list(range(n - 1, -1, -1))  # the former free list: block 0 on top
    ref: dict[int, list[int]] = {}
    live: dict[int, Request] = {}
    for step in range(2000):
        op = rnd.random()
        if op < 0.4:
            r = req(step, rnd.randint(1, 40))
            need = cdiv(r.num_tokens, 4)
            if need > len(stack):
                continue
            m.allocate(r, r.num_tokens)
            ref[r.id] = stack[len(stack) - need :]
            del stack[len(stack) - need :]
            live[r.id] = r
        elif op < 0.7 and live:
            ids = rnd.sample(sorted(live), min(len(live), rnd.randint(1, 3)))
            if len(ids) > len(stack):
                continue
            grow_blocks(m, [live[i] for i in ids])
            for i in ids:
                ref[i].append(stack.pop())
        elif live:
            i = rnd.choice(sorted(live))
            m.free(live.pop(i))
            stack.extend(reversed(ref.pop(i)))
        assert {i: m.block_table(r) for i, r in live.items()} == ref
        assert m.num_free_blocks == len(stack)
    m.check_invariants()


@pytest.mark.parametrize("prefix", [False, True])
def test_host_memory_follows_blocks_in_use(prefix: bool) -> None:
    """A pool of 10^9 one-token blocks costs nothing until blocks are used (issue 15: block_size 1 on a large GPU
    took gigabytes for a few requests)."""
    import tracemalloc

    tracemalloc.start()
    try:
        m = PagedBlockManager(10**9, 1, enable_prefix_caching=prefix)
        reqs = [req(i, 1000) for i in range(10)]
        for r in reqs:
            m.allocate(r, 1000)
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert m.num_used_blocks == 10_000
    assert used < 10_000 * 400  # measured ~40 B a block without prefix caching, ~275 B with it


@pytest.mark.parametrize("kind", ["paged", "paged-prefix", "contiguous"])
def test_allocate_decodes_is_allocate_one_by_one(kind: str) -> None:
    """``budget.allocate_decodes(reqs)`` (the running decodes in one call) reserves what ``allocate(r, 1)`` on each
    in turn would, and stops where that loop would stop: at a request that does not decode, holds no KV, or does
    not fit. Checked on many seeded states, KV tight enough that it runs short."""
    import random

    rng = random.Random(7)
    stops = set()
    for case in range(200):
        if kind == "contiguous":
            m = ContiguousAllocator(40, 4, max_model_len=48, reserve="request")
        else:
            m = PagedBlockManager(rng.randint(8, 40), 4, enable_prefix_caching=kind == "paged-prefix")
        reqs = []
        for i in range(rng.randint(1, 12)):
            r = req(i, rng.randint(1, 20), rng.randint(2, 20), hash_ids=(1, 2) if i % 3 == 0 else ())
            if rng.random() < 0.15 or not m.budget().allocate(r, r.prompt_len):
                reqs.append(r)  # waiting: holds nothing
                continue
            m.allocate(r, r.prompt_len)
            compute(r, r.prompt_len if rng.random() < 0.8 else r.prompt_len - 1)  # decoding, or a prompt chunk
            for _ in range(rng.randint(0, 9)):  # decode a few steps
                if r.num_remaining == 1 and r.num_output_tokens < r.output_len and m.budget().allocate(r, 1):
                    m.allocate(r, 1)
                    compute(r, 1)
            reqs.append(r)
        rng.shuffle(reqs)
        bulk, one = m.budget(), m.budget()
        k = bulk.allocate_decodes(reqs)
        j = 0
        while j < len(reqs) and reqs[j].num_remaining == 1 and m.holds(reqs[j]) and one.allocate(reqs[j], 1):
            j += 1
        assert k == j, case
        stops.add("all" if k == len(reqs) else "no room" if reqs[k].num_remaining == 1 and m.holds(reqs[k]) else
                  "not a decode")
        assert bulk.free == one.free, case
        for r in reqs:  # the reservations are the same: giving any back frees the same
            bulk.release(r)
            one.release(r)
            assert bulk.free == one.free, case
        # reserve_decodes: the same reservations in one step, given the blocks they take (a decode group's count)
        dec = [r for r in reqs if r.num_remaining == 1 and m.holds(r)]
        loop, agg = m.budget(), m.budget()
        fits = loop.allocate_decodes(dec) == len(dec)
        assert agg.reserve_decodes(dec, sum(m.blocks_needed(r, 1) for r in dec)) == (fits and kind != "contiguous")
        if kind != "contiguous":  # a contiguous budget leaves it to allocate_decodes
            stops.add("reserved" if fits else "refused")
            if not fits:
                assert agg.free == m.budget().free, case  # nothing reserved
                continue
            assert agg.free == loop.free, case
            assert not agg.reserve_decodes(dec, 0) or not dec, case  # reserved already: refused
            for r in reqs:
                agg.release(r)
                loop.release(r)
                assert agg.free == loop.free, case
    # every way to stop was met (a contiguous reservation holds the whole request: a decode always fits)
    assert stops == ({"all", "not a decode"} if kind == "contiguous" else
                     {"all", "no room", "not a decode", "reserved", "refused"})


def test_reserved_decodes_count_when_asked_about_later() -> None:
    """reserve_decodes keeps its requests aside until a request holding blocks is asked about (a waiting one, the
    common next question, holds none): a waiting request's allocation, then more tokens for a reserved one and
    its release, leave the free count that reserving one by one leaves."""
    m = PagedBlockManager(40, 4)
    running = [req(i, 7) for i in range(3)]
    for r in running:  # each holds 2 blocks with 7 tokens computed: its 8th token fits, its 9th takes a block
        m.allocate(r, 7)
        compute(r, 7)
    waiting = req(9, 10)
    lazy, eager = m.budget(), m.budget()
    assert lazy.reserve_decodes(running, 0) and eager.allocate_decodes(running) == 3
    assert lazy._decoding is not None
    for b in (lazy, eager):
        assert b.allocate(waiting, 10)
    assert lazy._decoding is not None and lazy.free == eager.free  # the waiting request did not settle them
    for b in (lazy, eager):
        assert b.allocate(running[1], 1)  # its second token this step: a new block
    assert lazy.free == eager.free == 40 - 6 - 3 - 1
    for b in (lazy, eager):
        b.release(running[1])
    assert lazy.free == eager.free == 40 - 6 - 3 + 2
