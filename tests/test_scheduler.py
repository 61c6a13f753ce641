"""The serving core driven by the simulator: properties over random seeded workloads and configurations, the fast
path's exact equivalence with stepping one by one, hand-computed schedules, and plans the core must refuse.

The hand-computed cases use a constant step time of 1 s, so every time is an integer and the expected plans can
be read off the policy's rules step by step (the derivations are in the comments).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.loop.simulator import ClosedLoopPlan
from sim.metrics.records import STEP_COLUMNS
from sim.policies import Admission, ContinuousPolicy, Limits, Plan, StaticPolicy
from sim.serving.block_manager import PagedBlockManager
from sim.serving.contiguous_allocator import ContiguousAllocator
from sim.serving.core import PlanError, ServingCore
from sim.serving.kv_manager import cdiv
from sim.serving.request import Request, RequestSpec
from tests.conftest import ConstCost, Run, simulate, sorted_plans

PROPS = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# ---- random workloads and configurations -----------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Everything that defines one run; ``build`` makes fresh objects (policies and managers hold state)."""

    seed: int
    num_requests: int
    rate: float  # open loop: Poisson arrivals per second, then rounded to ties now and then
    closed_users: int  # > 0: closed loop with this many users
    policy: str  # chunked | prefill_first | mixed | static
    preemption: str
    kv: str  # paged | contiguous-request | contiguous-max
    block_size: int
    kv_tokens: int
    cpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    max_queue_len: int | None
    max_queue_delay: float | None
    batch_size: int
    max_wait: float
    prefix_caching: bool = False
    shared_prefixes: bool = False

    def specs(self) -> list[RequestSpec]:
        rng = np.random.default_rng(self.seed)
        n = self.num_requests
        arrivals = np.cumsum(rng.exponential(1.0 / self.rate, n))
        ties = rng.random(n) < 0.3
        arrivals[ties] = np.round(arrivals[ties] * 8) / 8  # several requests at the very same time
        arrivals = np.sort(arrivals)
        prompts = rng.integers(1, 65, n)
        outputs = rng.integers(1, 25, n)
        out = []
        for i in range(n):
            ids: tuple[int, ...] = ()
            if self.shared_prefixes:
                fam = int(rng.integers(0, 3))
                k = int(rng.integers(0, 5))
                nh = cdiv(int(prompts[i]), 8)
                ids = tuple(100 * (fam + 1) + j if j < k else 10_000 + 100 * i + j for j in range(nh))
            out.append(
                RequestSpec(
                    id=i,
                    arrival=float(arrivals[i]),
                    prompt_len=int(prompts[i]),
                    output_len=int(outputs[i]),
                    hash_ids=ids,
                    hash_block_size=8,
                    session_id=i % self.closed_users if self.closed_users else None,
                )
            )
        return out

    def closed_loop(self) -> ClosedLoopPlan | None:
        if not self.closed_users:
            return None
        think = np.random.default_rng(self.seed + 1).exponential(0.05, self.num_requests)
        think[::4] = 0.0  # some users send again at the very end of the step that finished them
        return ClosedLoopPlan(self.closed_users, think)

    def build(self):
        limits = Limits(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len)
        admission = Admission(self.max_queue_len, self.max_queue_delay)
        if self.policy == "static":
            policy = StaticPolicy(
                batch_size=min(self.batch_size, self.max_num_seqs),
                max_wait=self.max_wait,
                limits=limits,
                preemption_mode=self.preemption,
                admission=admission,
            )
        else:
            policy = ContinuousPolicy(
                limits=limits,
                enable_chunked_prefill=self.policy == "chunked",
                prefill_mode="mixed" if self.policy == "mixed" else "prefill_first",
                preemption_mode=self.preemption,
                admission=admission,
            )
        num_blocks = max(1, self.kv_tokens // self.block_size)
        if self.kv == "paged":
            kv = PagedBlockManager(
                num_blocks, self.block_size, enable_prefix_caching=self.prefix_caching, num_cpu_blocks=self.cpu_blocks
            )
        else:
            kv = ContiguousAllocator(
                num_blocks,
                self.block_size,
                max_model_len=self.max_model_len,
                reserve="request" if self.kv == "contiguous-request" else "max_model_len",
                num_cpu_blocks=self.cpu_blocks,
            )
        return policy, kv

    def run(self, fast: bool = True) -> Run:
        policy, kv = self.build()
        return simulate(self.specs(), policy, kv, fast=fast, closed_loop=self.closed_loop())


@st.composite
def configs(draw, closed: bool | None = None, prefix_caching: bool = False) -> Config:
    policy = draw(st.sampled_from(["chunked", "prefill_first", "mixed", "static"]))
    max_model_len = draw(st.sampled_from([48, 96, 96, 96]))  # 48: some requests are too long and refused
    chunked = policy == "chunked"
    preemption = draw(st.sampled_from(["recompute", "swap"]))
    if chunked:
        mnbt = draw(st.integers(4, 128))
    elif policy == "static":
        mnbt = 1 << 20
    else:
        mnbt = draw(st.integers(max_model_len, 256))
    is_closed = draw(st.booleans()) if closed is None else closed
    bs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    kinds_kv = ["paged", "paged", "contiguous-request", "contiguous-max"]
    kv = "paged" if prefix_caching else draw(st.sampled_from(kinds_kv))
    kv_tokens = draw(st.integers(48, 192) | st.integers(48, 1024))  # mostly small, so that preemption happens
    if kv == "contiguous-max":
        kv_tokens = max(kv_tokens, max_model_len)
    return Config(
        seed=draw(st.integers(0, 2**32 - 1)),
        num_requests=draw(st.integers(8, 40)),
        rate=draw(st.floats(2.0, 200.0) | st.floats(50.0, 200.0)),
        closed_users=draw(st.integers(1, 6)) if is_closed else 0,
        policy=policy,
        preemption=preemption,
        kv=kv,
        block_size=bs,
        kv_tokens=kv_tokens,
        cpu_blocks=draw(st.integers(0, 64)),
        max_num_seqs=draw(st.integers(1, 16)),
        max_num_batched_tokens=mnbt,
        max_model_len=max_model_len,
        max_queue_len=draw(st.none() | st.integers(1, 10)),
        max_queue_delay=draw(st.none() | st.floats(0.01, 2.0)),
        batch_size=draw(st.integers(1, 8)),
        max_wait=draw(st.floats(0.0, 0.3)),
        prefix_caching=prefix_caching,
        shared_prefixes=prefix_caching or draw(st.booleans()),
    )


# ---- properties of any run -------------------------------------------------------------------------------------


def check_run(cfg: Config, run: Run) -> None:
    specs = cfg.specs()
    core, res = run.core, run.result
    limits = core.limits
    reqs = run.requests
    # every request sent once, and ends with exactly one outcome
    assert sorted(reqs) == [s.id for s in specs]
    assert sorted(r.id for r in core.done) == sorted(reqs)
    assert not core.waiting and not core.running and not core.swapped
    tokens_by_req: dict[int, int] = {}
    plans = sorted_plans(core)
    steps = res.steps
    assert len(plans) == len(steps["start"])
    for p, pre, dec in zip(plans, steps["prefill_tokens"], steps["decode_tokens"], strict=True):
        assert 1 <= len(p) <= limits.max_num_seqs
        total = sum(n for _, n in p)
        assert total <= limits.max_num_batched_tokens
        assert total == pre + dec and dec == sum(1 for _, n in p if n == 1)
        assert len({i for i, _ in p}) == len(p)
        for i, n in p:
            tokens_by_req[i] = tokens_by_req.get(i, 0) + n
    for i, r in reqs.items():
        assert r.outcome is not None and r.outcome.value in ("completed", "rejected")
        if r.outcome.value == "completed":
            assert r.num_output_tokens == r.output_len
            assert r.arrival <= r.first_scheduled <= r.first_token <= r.last_token == r.finish
            assert r.first_token - r.arrival <= r.finish - r.arrival  # TTFT <= E2EL
            # each token computed once, unless a recompute preemption threw some away (or the cache supplied some)
            need = r.prompt_len + r.output_len - 1
            if cfg.prefix_caching:
                assert tokens_by_req[i] >= 1
            elif r.num_preemptions == 0:
                assert tokens_by_req[i] == need
            else:
                assert tokens_by_req[i] >= need
            tt = r.token_times
            assert tt is not None and len(tt) == r.output_len
            assert all(a < b for a, b in zip(tt, tt[1:]))
            assert tt[0] == r.first_token and tt[-1] == r.finish
        else:
            assert r.first_scheduled < 0 and r.num_output_tokens == 0 and i not in tokens_by_req
            assert r.reason
            assert r.finish >= r.arrival
    # steps: one server, never overlapping, within the limits
    start, dur = steps["start"], steps["duration"]
    assert np.all(dur > 0)
    assert np.all(start[1:] >= start[:-1] + dur[:-1])
    assert np.all(steps["batch_size"] <= limits.max_num_seqs)
    assert np.all(steps["batch_size"] >= 1)
    assert np.all(steps["prefill_tokens"] + steps["decode_tokens"] <= limits.max_num_batched_tokens)
    assert np.all(steps["num_running"] <= limits.max_num_seqs)
    assert np.all(steps["kv_blocks_used"] <= core.kv.num_blocks)
    assert np.all(steps["kv_capacity_blocks"] == core.kv.num_blocks)
    if cfg.policy == "static":
        assert np.all(steps["batch_size"] + steps["padded_rows"] <= min(cfg.batch_size, cfg.max_num_seqs))
    else:
        assert not steps["padded_rows"].any() and not steps["padding_tokens"].any()
    if cfg.kv == "paged":
        assert np.all(steps["kv_blocks_reserved"] == 0)  # paged KV holds no block ahead of its tokens
    # pooled ITL = every gap between consecutive tokens of every request
    gaps = np.sort(np.concatenate([np.diff(r.token_times) for r in reqs.values() if r.token_times] + [np.zeros(0)]))
    np.testing.assert_array_equal(np.repeat(res.itl_gaps, res.itl_counts), gaps)
    # KV: consistent, and empty at the end
    kv = core.kv
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == kv.num_blocks
    assert kv.num_free_cpu_blocks == kv.num_cpu_blocks and not kv.cpu_tables
    assert not (kv.tables if isinstance(kv, PagedBlockManager) else kv.ranges)


def record_events(run: Run) -> None:
    """What happened, for hypothesis's statistics (pytest --hypothesis-show-statistics)."""
    steps, reqs = run.result.steps, run.sim.requests
    for name, hit in [
        ("preempted", steps["num_preempted"].any()),
        ("swapped", steps["swap_blocks"].any()),
        ("rejected", any(r.outcome.value == "rejected" for r in reqs)),
        ("padded", steps["padding_tokens"].any()),
        ("all completed", all(r.outcome.value == "completed" for r in reqs)),
    ]:
        if hit:
            event(name)


def assert_same_run(a: Run, b: Run) -> None:
    assert a.result.requests == b.result.requests
    assert set(a.result.steps) == set(b.result.steps) == set(STEP_COLUMNS)
    for k in STEP_COLUMNS:
        assert a.result.steps[k].dtype == b.result.steps[k].dtype, k
        assert np.array_equal(a.result.steps[k], b.result.steps[k]), k
    assert sorted_plans(a.core) == sorted_plans(b.core)
    assert np.array_equal(a.result.itl_gaps, b.result.itl_gaps)
    assert np.array_equal(a.result.itl_counts, b.result.itl_counts)
    assert {i: r.token_times for i, r in a.requests.items()} == {i: r.token_times for i, r in b.requests.items()}
    for f in fields(a.result):
        if f.name not in ("requests", "steps", "itl_gaps", "itl_counts"):
            assert getattr(a.result, f.name) == getattr(b.result, f.name), f.name


@PROPS
@given(configs())
def test_runs_keep_every_invariant(cfg: Config) -> None:
    run = cfg.run()
    check_run(cfg, run)
    record_events(run)


@PROPS
@given(configs(prefix_caching=True))
def test_runs_with_prefix_caching(cfg: Config) -> None:
    run = cfg.run()
    check_run(cfg, run)
    kv = run.core.kv
    assert kv.num_hit_tokens <= kv.num_queried_tokens
    if kv.num_hit_tokens:
        event("prefix hit")


@PROPS
@given(configs(closed=False))
def test_fast_path_is_exact_open_loop(cfg: Config) -> None:
    assert_same_run(cfg.run(fast=True), cfg.run(fast=False))


@PROPS
@given(configs(closed=True))
def test_fast_path_is_exact_closed_loop(cfg: Config) -> None:
    assert_same_run(cfg.run(fast=True), cfg.run(fast=False))


def test_random_configs_exercise_preemption_rejection_and_swap() -> None:
    """The property tests are only as good as what their configurations make happen: a fixed sample of them
    preempts by recompute and by swap, rejects at arrival and after a queue delay, and pads static batches."""
    seen = {"preempted": 0, "swapped": 0, "refused at arrival": 0, "refused after waiting": 0, "padded": 0}
    for seed in range(60):
        rng = np.random.default_rng(seed)
        policy = ["chunked", "prefill_first", "mixed", "static"][seed % 4]
        cfg = Config(
            seed=seed,
            num_requests=30,
            rate=float(rng.uniform(20, 200)),
            closed_users=0,
            policy=policy,
            preemption=["recompute", "swap"][(seed // 4) % 2],
            kv="paged",
            block_size=int(rng.choice([2, 4, 8])),
            kv_tokens=int(rng.integers(96, 256)),
            cpu_blocks=int(rng.integers(0, 64)),
            max_num_seqs=8,
            max_num_batched_tokens=64 if policy == "chunked" else (1 << 20 if policy == "static" else 128),
            max_model_len=96,
            max_queue_len=int(rng.integers(3, 12)) if seed % 3 else None,
            max_queue_delay=float(rng.uniform(0.02, 0.2)),
            batch_size=4,
            max_wait=0.05,
        )
        run = cfg.run()
        check_run(cfg, run)
        s = run.result.steps
        reasons = [r.reason for r in run.sim.requests if r.outcome.value == "rejected"]
        seen["preempted"] += int(s["num_preempted"].sum() > 0)
        seen["swapped"] += int(s["swap_blocks"].sum() > 0)
        seen["refused at arrival"] += int(any("max_queue_len" in x for x in reasons))
        seen["refused after waiting"] += int(any("max_queue_delay" in x for x in reasons))
        seen["padded"] += int(s["padding_tokens"].sum() > 0)
    assert all(v >= 3 for v in seen.values()), seen


# ---- exact schedules -------------------------------------------------------------------------------------------


def two_requests(b_arrival: float = 0.0) -> list[RequestSpec]:
    """A: prompt 4, output 3; B: prompt 2, output 2."""
    return [RequestSpec(0, 0.0, 4, 3), RequestSpec(1, b_arrival, 2, 2)]


def exact(specs, policy, kv=None) -> Run:
    return simulate(specs, policy, kv if kv is not None else PagedBlockManager(64, 2), cost=ConstCost(1.0))


def times(run: Run) -> dict[int, tuple[float, float, float]]:
    """id -> (first scheduled, first token, finish)."""
    return {i: (r.first_scheduled, r.first_token, r.finish) for i, r in run.requests.items()}


LIM = Limits(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)


@pytest.mark.parametrize("mode", ["prefill_first", "mixed"])
def test_exact_both_at_zero(mode: str) -> None:
    # t=0: both prompts (4 + 2 tokens), both sample their first token; t=1: both decode, B is done;
    # t=2: A decodes its third token.
    run = exact(two_requests(), ContinuousPolicy(limits=LIM, prefill_mode=mode))
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1), (1, 1)), ((0, 1),)]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (0.0, 1.0, 2.0)}
    s = run.result.steps
    assert s["start"].tolist() == [0.0, 1.0, 2.0]
    assert s["prefill_tokens"].tolist() == [6, 0, 0] and s["decode_tokens"].tolist() == [0, 2, 1]
    # after each step's allocation: A 2 blocks + B 1; A 3 (5 tokens) + B 2 (3 tokens); A 3 (B freed)
    assert s["kv_blocks_used"].tolist() == [3, 5, 3]
    np.testing.assert_array_equal(run.result.itl_gaps, [1.0])
    np.testing.assert_array_equal(run.result.itl_counts, [3])


def test_exact_prefill_first_stalls_decodes() -> None:
    # B arrives at 0.5, during A's prefill. t=1: prefill-first runs B's prompt alone (A's decode waits);
    # t=2: both decode, B done at 3; t=3: A's last token.
    run = exact(two_requests(0.5), ContinuousPolicy(limits=LIM, prefill_mode="prefill_first"))
    assert sorted_plans(run.core) == [((0, 4),), ((1, 2),), ((0, 1), (1, 1)), ((0, 1),)]
    assert times(run) == {0: (0.0, 1.0, 4.0), 1: (1.0, 2.0, 3.0)}
    assert run.requests[0].token_times == [1.0, 3.0, 4.0]
    np.testing.assert_array_equal(run.result.itl_gaps, [1.0, 2.0])  # A waited 2 s for its second token
    np.testing.assert_array_equal(run.result.itl_counts, [2, 1])


def test_exact_mixed_decodes_alongside_prompts() -> None:
    # t=1: A decodes and B's whole prompt runs in the same step; t=2: both finish.
    run = exact(two_requests(0.5), ContinuousPolicy(limits=LIM, prefill_mode="mixed"))
    assert sorted_plans(run.core) == [((0, 4),), ((0, 1), (1, 2)), ((0, 1), (1, 1))]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (1.0, 2.0, 3.0)}
    assert run.result.steps["prefill_tokens"].tolist() == [4, 2, 0]
    assert run.result.steps["decode_tokens"].tolist() == [0, 1, 2]


def test_exact_chunked_prefill() -> None:
    # budget 3 tokens. t=0: A's first 3 prompt tokens (no sample); t=1: A's last prompt token (sample) + B's
    # prompt (sample); t=2: both decode, B done; t=3: A done.
    lim = Limits(max_num_seqs=8, max_num_batched_tokens=3, max_model_len=64)
    run = exact(two_requests(), ContinuousPolicy(limits=lim, enable_chunked_prefill=True))
    assert sorted_plans(run.core) == [((0, 3),), ((0, 1), (1, 2)), ((0, 1), (1, 1)), ((0, 1),)]
    assert times(run) == {0: (0.0, 2.0, 4.0), 1: (1.0, 2.0, 3.0)}
    s = run.result.steps
    assert s["prefill_tokens"].tolist() == [3, 2, 0, 0] and s["decode_tokens"].tolist() == [0, 1, 2, 1]


def test_exact_static_batch_pads() -> None:
    # one batch of both: a prefill padded to the longest prompt (2 rows x 4 tokens, 2 of padding), then decode
    # steps until A is done; B's row stays as padding in the last step.
    run = exact(two_requests(), StaticPolicy(batch_size=2, max_wait=5.0, limits=LIM))
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1), (1, 1)), ((0, 1),)]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (0.0, 1.0, 2.0)}
    s = run.result.steps
    assert s["batch_size"].tolist() == [2, 2, 1]
    assert s["padded_rows"].tolist() == [0, 0, 1]
    assert s["padding_tokens"].tolist() == [2, 0, 1]
    assert s["prefill_tokens"].tolist() == [6, 0, 0] and s["decode_tokens"].tolist() == [0, 2, 1]


def test_exact_static_waits_for_a_full_batch_or_the_timeout() -> None:
    specs = [RequestSpec(0, 0.25, 4, 2), RequestSpec(1, 0.5, 2, 1), RequestSpec(2, 0.75, 3, 1)]
    # full batch of 2 at 0.5 (when B arrives); C then waits for the batch to end (at 2.5), alone, then for
    # max_wait from its arrival... which has passed: it starts at 2.5
    run = exact(specs, StaticPolicy(batch_size=2, max_wait=1.0, limits=LIM))
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1),), ((2, 3),)]
    assert times(run) == {0: (0.5, 1.5, 2.5), 1: (0.5, 1.5, 1.5), 2: (2.5, 3.5, 3.5)}
    assert run.result.steps["padded_rows"].tolist() == [0, 1, 0]
    # a batch of 3 never fills: the oldest waits max_wait (0.25 to 1.25), then A and B go; C, alone, waits
    # max_wait from its own arrival
    specs = [RequestSpec(0, 0.25, 4, 2), RequestSpec(1, 0.5, 2, 1), RequestSpec(2, 3.0, 3, 1)]
    run = exact(specs, StaticPolicy(batch_size=3, max_wait=1.0, limits=LIM))
    assert run.result.steps["start"].tolist() == [1.25, 2.25, 4.0]
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1),), ((2, 3),)]
    assert run.result.steps["padding_tokens"].tolist() == [2, 1, 0]


def preemption_case(mode: str) -> Run:
    # 4 blocks of 2 tokens. t=0: A takes 2 blocks (4 tokens), B 1 block (2 tokens); both sample.
    # t=1: A needs a 3rd block for token 5 (takes the last free one); B needs a 2nd block for token 3: none is
    # left, and B, the latest admitted, is the victim of its own allocation.
    kv = PagedBlockManager(4, 2, num_cpu_blocks=4)
    policy = ContinuousPolicy(limits=LIM, prefill_mode="prefill_first", preemption_mode=mode)
    return exact(two_requests(), policy, kv)


def test_exact_preemption_by_recompute() -> None:
    run = preemption_case("recompute")
    # t=2: B must recompute prompt + its generated token (3 tokens, 2 blocks) but 1 block is free: A decodes
    # alone and finishes at 3; t=3: B recomputes 3 tokens and samples its last token.
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1),), ((0, 1),), ((1, 3),)]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (0.0, 1.0, 4.0)}
    assert run.requests[1].num_preemptions == 1 and run.requests[0].num_preemptions == 0
    s = run.result.steps
    assert s["num_preempted"].tolist() == [0, 1, 0, 0]
    assert s["swap_blocks"].tolist() == [0, 0, 0, 0]
    assert s["prefill_tokens"].tolist() == [6, 0, 0, 3]
    assert s["num_waiting"].tolist() == [0, 1, 1, 0]
    assert run.requests[1].token_times == [1.0, 4.0]


def test_exact_preemption_by_swap() -> None:
    run = preemption_case("swap")
    # t=1: B's block (1) goes to CPU; t=2: B cannot come back (it needs its block plus one for token 3, one is
    # free), A finishes at 3; t=3: B swaps its block in and decodes token 3.
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1),), ((0, 1),), ((1, 1),)]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (0.0, 1.0, 4.0)}
    s = run.result.steps
    assert s["num_preempted"].tolist() == [0, 1, 0, 0]
    assert s["swap_blocks"].tolist() == [0, 1, 0, 1]
    assert s["num_swapped"].tolist() == [0, 1, 1, 0]
    assert s["prefill_tokens"].tolist() == [6, 0, 0, 0]  # nothing recomputed


def test_exact_admission_delay_rejects_at_the_deadline_when_idle() -> None:
    # a static batch of 2 never fills; max_wait 5 s, but the queue delay limit of 1.5 s rejects the first request
    # at exactly 0.25 + 1.5, while the server idles; the second one then waits until 2.0 + 1.5
    specs = [RequestSpec(0, 0.25, 4, 2), RequestSpec(1, 2.0, 2, 1)]
    policy = StaticPolicy(batch_size=2, max_wait=5.0, limits=LIM, admission=Admission(max_queue_delay=1.5))
    run = exact(specs, policy)
    r0, r1 = run.requests[0], run.requests[1]
    assert (r0.outcome.value, r0.finish, r0.first_scheduled) == ("rejected", 1.75, -1.0)
    assert (r1.outcome.value, r1.finish) == ("rejected", 3.5)
    assert "max_queue_delay" in r0.reason
    assert len(run.result.steps["start"]) == 0


def test_exact_admission_delay_rejects_at_the_next_step_when_busy() -> None:
    # one sequence at a time, max_queue_delay 1.5 s. A runs 0..3. B (arrived 0.2, deadline 1.7) is refused when
    # the policy next looks, at the end of the step running at its deadline: t=2. C (1.0, deadline 2.5) is
    # refused at 3; D (1.8, deadline 3.3) is scheduled at 3.
    specs = [RequestSpec(0, 0.0, 2, 3), RequestSpec(1, 0.2, 2, 1), RequestSpec(2, 1.0, 1, 1), RequestSpec(3, 1.8, 2, 1)]
    lim = Limits(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64)
    run = exact(specs, ContinuousPolicy(limits=lim, admission=Admission(max_queue_delay=1.5)))
    r = run.requests
    assert [r[i].outcome.value for i in range(4)] == ["completed", "rejected", "rejected", "completed"]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (-1.0, -1.0, 2.0), 2: (-1.0, -1.0, 3.0), 3: (3.0, 4.0, 4.0)}
    assert run.result.steps["num_rejected"].tolist() == [0, 0, 1, 1]
    assert sorted_plans(run.core) == [((0, 2),), ((0, 1),), ((0, 1),), ((3, 2),)]


def test_admission_deadline_is_exact() -> None:
    """A request is refused at exactly arrival + max_queue_delay when the server is idle then. (0.7 - 0.2 rounds
    below 0.5: a test 'arrival > now - delay' would miss it at its own wake-up time and stall.)"""
    specs = [RequestSpec(0, 0.5, 4, 2), RequestSpec(1, 3.0, 2, 1)]
    policy = StaticPolicy(batch_size=2, max_wait=5.0, limits=LIM, admission=Admission(max_queue_delay=0.2))
    run = exact(specs, policy)
    assert [r.finish for r in run.sim.requests] == [0.5 + 0.2, 3.0 + 0.2]
    assert all(r.outcome.value == "rejected" for r in run.sim.requests)


def test_exact_admission_queue_length() -> None:
    # max_queue_len 1: at t=0 A is queued and scheduled at once (the queue empties); B (0.5) queues; C (0.6)
    # finds one waiting and is refused at its arrival
    specs = [RequestSpec(0, 0.0, 2, 2), RequestSpec(1, 0.5, 2, 1), RequestSpec(2, 0.6, 2, 1)]
    lim = Limits(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64)
    run = exact(specs, ContinuousPolicy(limits=lim, admission=Admission(max_queue_len=1)))
    r = run.requests
    assert (r[2].outcome.value, r[2].finish) == ("rejected", 0.6)
    assert times(run) == {0: (0.0, 1.0, 2.0), 1: (2.0, 3.0, 3.0), 2: (-1.0, -1.0, 0.6)}


def test_exact_too_long_or_too_large_rejected_at_arrival() -> None:
    specs = [RequestSpec(0, 0.0, 60, 5), RequestSpec(1, 0.0, 30, 3), RequestSpec(2, 0.5, 2, 1)]
    run = exact(specs, ContinuousPolicy(limits=LIM), PagedBlockManager(16, 2))  # 32 tokens of KV
    r = run.requests
    assert "max_model_len" in r[0].reason and r[0].finish == 0.0  # 65 > 64
    assert "KV" in r[1].reason and r[1].finish == 0.0  # 33 tokens > 32
    assert r[2].outcome.value == "completed" and times(run)[2] == (0.5, 1.5, 1.5)


@pytest.mark.parametrize("mode", ["prefill_first", "mixed", "chunked"])
def test_exact_same_prefix_admitted_together(mode: str) -> None:
    """Two equal 64-token prompts at t=0, 16-token blocks, prefix caching. The policy plans both whole (nothing
    is cached when it plans), but A's blocks are published when A is allocated, so B, allocated next in the same
    step, hits 3 of them and computes only its last 16 tokens."""
    specs = [RequestSpec(i, 0.0, 64, 2, hash_ids=(1, 2, 3, 4), hash_block_size=16) for i in range(2)]
    policy = ContinuousPolicy(
        limits=Limits(8, 256, 256), enable_chunked_prefill=mode == "chunked",
        prefill_mode="mixed" if mode == "mixed" else "prefill_first",
    )
    kv = PagedBlockManager(64, 16, enable_prefix_caching=True)
    run = exact(specs, policy, kv)
    assert sorted_plans(run.core) == [((0, 64), (1, 16)), ((0, 1), (1, 1))]
    assert times(run) == {0: (0.0, 1.0, 2.0), 1: (0.0, 1.0, 2.0)}
    s = run.result.steps
    assert s["prefill_tokens"].tolist() == [80, 0]
    assert s["kv_blocks_used"].tolist() == [5, 7]  # 4 + 1 blocks, then each opens a fifth for token 65
    assert kv.num_hit_tokens == 48 and kv.num_queried_tokens == 128


@pytest.mark.parametrize("fast", [False, True])
def test_exact_idle_server_between_requests(fast: bool) -> None:
    # A alone (prompt 1, output 5: steps at 0..4), then B at 10 the same: each step holds only its own tokens
    specs = [RequestSpec(0, 0.0, 1, 5), RequestSpec(1, 10.0, 1, 5)]
    run = simulate(specs, ContinuousPolicy(limits=LIM), PagedBlockManager(64, 2), cost=ConstCost(1.0), fast=fast)
    s = run.result.steps
    assert s["start"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 10.0, 11.0, 12.0, 13.0, 14.0]
    assert s["kv_tokens"].tolist() == [1, 2, 3, 4, 5] * 2
    assert s["kv_blocks_reserved"].tolist() == [0] * 10
    # with the linear cost model, step times follow the tokens read, so B's steps take as long as A's (up to
    # the rounding of end - start at t=10; one token more read would add 1e-8 s)
    run = simulate(specs, ContinuousPolicy(limits=LIM), PagedBlockManager(64, 2), fast=fast)
    d = run.result.steps["duration"]
    np.testing.assert_allclose(d[5:], d[:5], rtol=0, atol=1e-13)


@pytest.mark.parametrize("fast", [False, True])
def test_exact_closed_loop_send_while_decoding(fast: bool) -> None:
    # user 0 sends A (prompt 1, output 2) and, 0.5 s after A ends, C (prompt 2, output 2); user 1 sends B
    # (prompt 1, output 10). t=0: both prompts; t=1: both decode, A done at 2; t=2: B alone; C arrives at 2.5;
    # t=3: C's prompt alone (prefill first; B stalls); t=4: B and C decode, C done at 5; t=5..10: B, done at 11.
    specs = [RequestSpec(0, 0.0, 1, 2, session_id=0), RequestSpec(1, 0.0, 1, 10, session_id=1),
             RequestSpec(2, 0.0, 2, 2, session_id=0)]
    loop = ClosedLoopPlan(2, np.array([0.5, 0.0, 0.0]))
    run = simulate(specs, ContinuousPolicy(limits=LIM), PagedBlockManager(64, 2), cost=ConstCost(1.0), fast=fast,
                   closed_loop=loop)
    assert {i: (r.arrival, *times(run)[i]) for i, r in run.requests.items()} == {
        0: (0.0, 0.0, 1.0, 2.0), 1: (0.0, 0.0, 1.0, 11.0), 2: (2.5, 3.0, 4.0, 5.0)
    }
    assert sorted_plans(run.core) == [((0, 1), (1, 1))] * 2 + [((1, 1),), ((2, 2),), ((1, 1), (2, 1))] + [
        ((1, 1),)
    ] * 6


def test_exact_static_batch_swaps_back_in() -> None:
    """The preemption case under static batching, by swap: B (1 block) goes to CPU at t=1; at t=2 it cannot come
    back (its block plus one for token 3, one free); A finishes at 3; B swaps in and finishes at 4. B's row stays
    in the batch as padding while it is out, and A's after it finished."""
    kv = PagedBlockManager(4, 2, num_cpu_blocks=4)
    run = exact(two_requests(), StaticPolicy(batch_size=2, max_wait=0.0, limits=LIM, preemption_mode="swap"), kv)
    assert sorted_plans(run.core) == [((0, 4), (1, 2)), ((0, 1),), ((0, 1),), ((1, 1),)]
    assert times(run) == {0: (0.0, 1.0, 3.0), 1: (0.0, 1.0, 4.0)}
    s = run.result.steps
    assert s["swap_blocks"].tolist() == [0, 1, 0, 1]
    assert s["padded_rows"].tolist() == [0, 1, 1, 1]
    assert s["padding_tokens"].tolist() == [2, 1, 1, 1]


def test_exact_chunked_swap_in_of_a_long_remainder() -> None:
    """Budget 2 tokens, 7 blocks of 1 token. A (prompt 1, output 6) and B (prompt 6, output 1) prefill one
    token each per step; at t=3 A takes the last free block for its 4th token, B finds none for its 4th prompt
    token and is swapped out (3 blocks). A finishes at 6; B, with 3 tokens left (more than a step's budget),
    comes back chunk by chunk: 2 tokens at t=6, 1 at t=7."""
    specs = [RequestSpec(0, 0.0, 1, 6), RequestSpec(1, 0.0, 6, 1)]
    policy = ContinuousPolicy(limits=Limits(4, 2, 64), enable_chunked_prefill=True, preemption_mode="swap")
    run = exact(specs, policy, PagedBlockManager(7, 1, num_cpu_blocks=8))
    assert sorted_plans(run.core) == [((0, 1), (1, 1))] * 3 + [((0, 1),)] * 3 + [((1, 2),), ((1, 1),)]
    assert times(run) == {0: (0.0, 1.0, 6.0), 1: (0.0, 8.0, 8.0)}
    assert run.result.steps["swap_blocks"].tolist() == [0, 0, 0, 3, 0, 0, 3, 0]


def test_exact_static_batch_uses_prefix_hits() -> None:
    # A and then B, the same 32-token prompt in 16-token blocks: B finds A's first block cached and computes 16
    specs = [RequestSpec(i, 3.0 * i, 32, 1, hash_ids=(1, 2), hash_block_size=16) for i in range(2)]
    kv = PagedBlockManager(8, 16, enable_prefix_caching=True)
    run = exact(specs, StaticPolicy(batch_size=1, max_wait=0.0, limits=LIM), kv)
    assert sorted_plans(run.core) == [((0, 32),), ((1, 16),)]
    assert times(run) == {0: (0.0, 1.0, 1.0), 1: (3.0, 4.0, 4.0)}
    assert kv.num_hit_tokens == 16


# ---- plans the core refuses ------------------------------------------------------------------------------------


@dataclass
class BadPolicy:
    """Schedules every waiting request for ``tokens(r)`` tokens, whatever the limits say."""

    limits: Limits
    tokens: object = None
    twice: bool = False

    def schedule(self, view) -> Plan:
        n = self.tokens or (lambda r: r.num_remaining)
        plan = Plan(scheduled=[(r, n(r)) for r in view.waiting])
        if self.twice:
            plan.scheduled.append(plan.scheduled[0])
        return plan

    def wake_time(self, view) -> float | None:
        return None


def bad_core(policy: BadPolicy, kv=None, n: int = 3, prompt: int = 4) -> ServingCore:
    core = ServingCore(policy, kv or PagedBlockManager(64, 4))
    for i in range(n):
        core.add_request(Request(RequestSpec(i, 0.0, prompt, 2), arrival=0.0), 0.0)
    return core


@pytest.mark.parametrize(
    "policy, kv, match",
    [
        (BadPolicy(Limits(2, 64, 64)), None, "max_num_seqs"),
        (BadPolicy(Limits(8, 10, 64)), None, "max_num_batched_tokens"),
        (BadPolicy(Limits(8, 64, 64), tokens=lambda r: 5), None, "left"),
        (BadPolicy(Limits(8, 64, 64), tokens=lambda r: 0), None, "left"),
        (BadPolicy(Limits(8, 64, 64), twice=True), None, "twice"),
        (BadPolicy(Limits(8, 64, 64)), PagedBlockManager(2, 4), "KV"),
    ],
)
def test_core_refuses_bad_plans(policy: BadPolicy, kv, match: str) -> None:
    core = bad_core(policy, kv)
    with pytest.raises(PlanError, match=match):
        core.schedule(0.0)


def test_core_accepts_the_same_plan_within_limits() -> None:
    core = bad_core(BadPolicy(Limits(3, 12, 64)))
    batch = core.schedule(0.0)
    assert batch is not None and batch.num_scheduled == 3 and batch.prefill_tokens == 12
    done = core.complete(batch, 1.0)
    assert done == [] and all(r.num_output_tokens == 1 for r in core.running)


def test_batch_records_the_blocks_each_swap_moves() -> None:
    """A swap's GPU blocks, as the block manager chose them, travel with the batch (the real engine copies
    exactly these), and finish listeners hear about every request that ends."""
    from sim.policies import ContinuousPolicy, Limits
    from sim.serving.block_manager import PagedBlockManager
    from sim.serving.core import ServingCore
    from sim.serving.request import Request, RequestSpec

    kv = PagedBlockManager(6, 4, num_cpu_blocks=8)
    core = ServingCore(
        ContinuousPolicy(Limits(4, 64, 24), prefill_mode="mixed", preemption_mode="swap"), kv, fast_path=False
    )
    ended: list[int] = []
    core.finish_listeners.append(lambda r: ended.append(r.id))
    reqs = [Request(RequestSpec(i, 0.0, 8, 9), arrival=0.0) for i in range(2)]
    for r in reqs:
        core.add_request(r, 0.0)
    t, outs, ins, tables = 0.0, [], [], {}
    while core.has_work:
        batch = core.schedule(t)
        assert batch is not None
        if batch.swapped_out:
            for rid, blocks in batch.swapped_out:
                assert blocks == tables[rid]  # the blocks it held before the step
                outs.append((rid, len(blocks)))
        if batch.swapped_in:
            for rid, blocks in batch.swapped_in:
                # the blocks that receive the CPU copy lead its table (the step may append one to grow)
                assert blocks == kv.tables[rid][: len(blocks)]
                ins.append((rid, len(blocks)))
        core.complete(batch, t + 1.0)
        tables = {rid: list(b) for rid, b in kv.tables.items()}
        t += 1.0
    assert [o[0] for o in outs] == [1] and ins == outs  # the latest admitted went out and came back whole
    assert sorted(ended) == [0, 1]
    kv.check_invariants()
