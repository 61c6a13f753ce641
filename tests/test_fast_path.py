"""The simulator's fast path (decode group, plans repeated without asking the policy, fast_forward) must record
exactly what stepping every request one by one records, on real scenarios with the analytic cost model."""

from __future__ import annotations

import itertools
from types import UnionType
from typing import Literal, Union, get_args, get_origin

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sim.config.scenario import parse_scenario, variant_configs
from sim.config.schema import KVCacheConfig, PolicyConfig
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.costs.fitted import FittedCostModel
from sim.loop.run import generate_workload, simulate_variant


def _run_both(raw: dict):
    scenario = parse_scenario(raw)
    workload = generate_workload(scenario)
    out = []
    for cfg in variant_configs(scenario):
        fast = simulate_variant(cfg, workload, keep_token_times=True)
        slow = simulate_variant(cfg, workload, keep_token_times=True, fast_path=False)
        out.append((cfg.name, fast, slow))
    return out


def _assert_same(name, fast, slow):
    (rf, qf, cf), (rs, qs, cs) = fast, slow
    assert rf.requests == rs.requests and cf.stats == cs.stats, name
    for col in rs.steps:
        assert np.array_equal(rf.steps[col], rs.steps[col]), (name, col)
    assert np.array_equal(rf.itl_gaps, rs.itl_gaps) and np.array_equal(rf.itl_counts, rs.itl_counts), name
    times_f = {r.id: r.token_times for r in qf}
    times_s = {r.id: r.token_times for r in qs}
    assert times_f == times_s, name
    assert len(rs.steps["start"]) > 50  # the comparison covered a real run


CHAT = {
    "arrival": {"type": "poisson", "rate": 8.0},
    "num_requests": 150,
    "prompt_len": {"type": "lognormal", "mean": 400, "std": 300, "min": 8, "max": 2000},
    "output_len": {"type": "exponential", "mean": 120, "max": 600},
}


def _choices(model: type[BaseModel]) -> list[dict]:
    """Every combination of the discrete options (Literal and bool fields) of one config class, read from its
    schema: an option added to a policy or KV config is covered here without editing this file."""
    axes: list[list[tuple[str, object]]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if name == "type":
            continue
        members = [a for a in get_args(ann) if a is not type(None)] if get_origin(ann) in (Union, UnionType) else []
        if len(members) == 1:  # Optional (None: the engine's default): its values
            ann = members[0]
        if ann is bool:
            axes.append([(name, False), (name, True)])
        elif get_origin(ann) is Literal:
            axes.append([(name, v) for v in get_args(ann)])
    kind = get_args(model.model_fields["type"].annotation)[0]
    return [{"type": kind, **dict(combo)} for combo in itertools.product(*axes)]


def _union_members(union) -> list[type[BaseModel]]:
    return list(get_args(get_args(union)[0]))  # Annotated[Union[A, B], Field(...)] -> (A, B)


def _with_numbers(policy: dict) -> dict:
    """Numbers that make each policy behave non-trivially on CHAT: batches that wait, chunks that split prompts."""
    if policy["type"] == "static":
        return {**policy, "batch_size": 8, "max_wait": 0.2}
    if policy["type"] == "custom":  # a user's class: the FCFS example, loaded by module name
        policy = {**policy, "cls": "sim.policies.queue:FCFSPolicy"}
    if policy.get("enable_chunked_prefill", policy["type"] not in ("static", "continuous")):
        return {**policy, "max_num_batched_tokens": 512}
    return policy


POLICIES = [_with_numbers(c) for m in _union_members(PolicyConfig) for c in _choices(m)]
KV_CACHES = [c for m in _union_members(KVCacheConfig) for c in _choices(m)]


def test_every_option_is_enumerated():
    assert {p["type"] for p in POLICIES} == {"static", "continuous", "fcfs", "priority", "sjf", "edf", "custom",
                                             "vtc", "lpm", "lof"}
    assert {k["type"] for k in KV_CACHES} == {"paged", "contiguous"}
    assert len(POLICIES) >= 18 and len(KV_CACHES) >= 4  # 2 static + 16 continuous; 2 paged + 2 contiguous


@pytest.mark.parametrize("kv", KV_CACHES, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(str(v) for v in p.values()))
def test_fast_path_matches_step_by_step(policy, kv):
    raw = {
        "workload": CHAT,
        "deployment": {"model": "llama-3.1-8b", "gpu": "l4", "max_model_len": 4096, "num_gpu_blocks": 400},
        "policy": policy,
        "kv_cache": kv,
        "admission": {"max_queue_delay": 30.0},
    }
    for name, fast, slow in _run_both(raw):
        _assert_same(name, fast, slow)
    if kv["type"] == "paged" and policy["type"] == "continuous" and not kv["enable_prefix_caching"] and \
            policy.get("capacity_scheduler_policy") != "guaranteed_no_evict":
        assert fast[0].steps["num_preempted"].sum() > 0  # the scarce KV (400 blocks of 16 tokens) forced preemptions


def test_fast_path_matches_on_trace_with_prefix_caching():
    raw = {
        "workload": {"arrival": {"type": "trace", "trace": "mooncake", "end": 60}, "num_requests": 120},
        "deployment": {"model": "llama-3.2-1b", "gpu": "a100-80gb", "max_model_len": 131072},
        "policy": {"type": "continuous", "enable_chunked_prefill": True},
        "kv_cache": {"type": "paged", "enable_prefix_caching": True},
    }
    for name, fast, slow in _run_both(raw):
        _assert_same(name, fast, slow)


def test_fast_path_matches_closed_loop():
    raw = {
        "workload": {
            "arrival": {"type": "closed_loop", "num_users": 12, "think_time": {"type": "exponential", "mean": 0.5}},
            "num_requests": 120,
            "prompt_len": {"type": "uniform", "low": 50, "high": 800},
            "output_len": {"type": "uniform", "low": 1, "high": 300},
        },
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 4096},
        "policy": {"type": "continuous", "enable_chunked_prefill": True},
    }
    for name, fast, slow in _run_both(raw):
        _assert_same(name, fast, slow)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rows=st.lists(st.integers(1, 512), min_size=1, max_size=40),
    base=st.integers(0, 10**7),
    tp=st.sampled_from([1, 2]),
    wd=st.sampled_from(["bf16", "fp8", "int4"]),
)
def test_decode_steps_bit_identical_to_step_time(rows, base, tp, wd):
    reads = [base + 7 * i + r for i, r in enumerate(rows)]
    compute_bound = AnalyticCostModel("llama-3.1-8b", "h100-sxm", weight_dtype=wd, tensor_parallel_size=tp,
                                      compute_efficiency=0.0005)
    assert compute_bound._k[7] > compute_bound._k[8]  # decode_steps' other branch: attention bound by compute
    models = [
        AnalyticCostModel("llama-3.1-8b", "h100-sxm", weight_dtype=wd, tensor_parallel_size=tp),
        compute_bound,
        FittedCostModel(step=1.1e-3, token=2.3e-5, decode_seq=1.7e-6, seq=3.1e-6, attn_pair=1.3e-11,
                        kv_read_token=4.7e-9, swap_block=2.9e-5, flops_per_token=1.6e10, flops_per_seq=1.1e9,
                        flops_per_attn_pair=2.6e5),
    ]
    for cost in models:
        times, flops = cost.decode_steps(rows, reads)
        for n, c, t, f in zip(rows, reads, times, flops, strict=True):
            shape = StepShape(n, n, n, c, c, 0, 0)
            assert t == cost.step_time(shape)
            if hasattr(cost, "decode_step_time"):
                assert cost.decode_step_time(n, c) == t
            assert f == cost.step_flops(shape)
        arr = StepShape(*(np.asarray(x, dtype=np.int64) for x in (rows, rows, rows, reads, reads)),
                        np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.int64))
        assert np.asarray(cost.step_time(arr)).tolist() == times


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    runs=st.lists(st.tuples(st.integers(1, 512), st.integers(1, 30)), min_size=1, max_size=4),
    base=st.integers(0, 10**7),
    as_range=st.booleans(),
    tp=st.sampled_from([1, 2]),
    wd=st.sampled_from(["bf16", "fp8"]),
)
def test_decode_steps_in_runs_of_equal_rows_bit_identical_to_step_time(runs, base, as_range, tp, wd):
    """The fast path's usual shapes: runs of steps with the same rows, each attending ``rows`` more tokens than
    the one before, the attended tokens given as a range (a stretch without departures) or a list. The cost model
    prices a run with its row count's terms once; every step must still be step_time's and step_flops'."""
    rows: list[int] = []
    reads: list[int] = []
    c = base
    for n, k in runs:
        rows += [n] * k
        reads += range(c + n, c + n * (k + 1), n)
        c += n * k
    one_run = len(runs) == 1
    given_reads = range(base + rows[0], base + rows[0] * (len(rows) + 1), rows[0]) if one_run and as_range \
        else reads
    assert list(given_reads) == reads
    for cost in (AnalyticCostModel("llama-3.1-8b", "h100-sxm", weight_dtype=wd, tensor_parallel_size=tp),
                 AnalyticCostModel("llama-3.1-8b", "h100-sxm", weight_dtype=wd, tensor_parallel_size=tp,
                                   compute_efficiency=0.0005)):
        times, flops = cost.decode_steps(rows, given_reads)
        assert len(times) == len(flops) == len(rows)
        for n, r, t, f in zip(rows, reads, times, flops, strict=True):
            shape = StepShape(n, n, n, r, r, 0, 0)
            assert t == cost.step_time(shape) == cost.decode_step_time(n, r)
            assert f == cost.step_flops(shape)
            assert type(f) is float


def test_decode_group_max_computed_is_the_longest_member() -> None:
    """The group keeps its longest member as members join (recounting only when that member leaves): after every
    join, leave, step and sync, max_computed equals the longest member's tokens counted one by one."""
    import random

    from sim.serving.decode_group import DecodeGroup
    from sim.serving.request import Request, RequestSpec

    rng = random.Random(3)
    g = DecodeGroup(16, True, False)
    outside: list[Request] = [Request(RequestSpec(i, 0.0, rng.randint(1, 900), 10**6), 0.0) for i in range(40)]
    for r in outside:
        r.num_computed_tokens = r.prompt_len
        r.num_output_tokens = 1
    for _ in range(3000):
        op = rng.random()
        if op < 0.3 and outside:
            g.join(outside.pop(rng.randrange(len(outside))))
        elif op < 0.5 and g.members:
            r = rng.choice(list(g.members.values()))
            g.leave(r)
            outside.append(r)
        elif op < 0.55:
            g.sync()
        else:
            g.advance(float(g.steps))
        assert g.max_computed() == max((g.computed(r) for r in g.members.values()), default=0)


def test_decode_group_next_finish_is_the_least_finishing_step() -> None:
    """next_finish keeps a heap of finishing steps that removals do not touch: after every join (also rejoins at
    a step already left), leave, step (its finishers leaving, as the core retires them) and a key taken out of
    finish_at as the fast path does, it equals the least key of finish_at counted again."""
    import random

    from sim.serving.decode_group import DecodeGroup
    from sim.serving.request import Request, RequestSpec

    rng = random.Random(5)
    g = DecodeGroup(16, True, False)
    outside: list[Request] = [Request(RequestSpec(i, 0.0, 10, rng.randint(2, 30)), 0.0) for i in range(60)]
    for r in outside:
        r.num_computed_tokens, r.num_output_tokens = r.prompt_len, 1
    finishes = 0
    for _ in range(4000):
        op = rng.random()
        if op < 0.3 and outside:
            r = outside.pop(rng.randrange(len(outside)))
            if r.num_output_tokens >= r.output_len:  # finished: comes back as a new request
                r.num_computed_tokens, r.num_output_tokens = r.prompt_len, 1
            g.join(r)
        elif op < 0.45 and g.members:
            r = rng.choice(list(g.members.values()))
            g.leave(r)
            outside.append(r)
        elif op < 0.5 and g.finish_at:
            f = g.next_finish()
            while g.steps < f - 1:
                g.advance(float(g.steps))
            g.steps += 1  # the fast path's step: it takes the finishers out of finish_at itself
            for r in g.finish_at.pop(g.steps):
                g.leave(r)
                outside.append(r)
        else:
            done = g.advance(float(g.steps))
            finishes += len(done)
            for r in done:
                g.leave(r)
                outside.append(r)
        assert g.next_finish() == min(g.finish_at, default=-1)
    assert finishes > 100


@pytest.mark.parametrize("prefix", [False, True])
def test_one_try_grow_for_a_stretch_hands_out_the_blocks_of_a_call_per_step(prefix: bool) -> None:
    """fast_forward takes a stretch's blocks in one try_grow call, the steps' crossings back to back (a member
    twice when the stretch is longer than a block): the blocks a call per step hands out, in the same order,
    whether they come off the freed stack or the untouched range (seeded random frees in between)."""
    import random

    from sim.serving.block_manager import PagedBlockManager
    from sim.serving.request import Request, RequestSpec

    rnd = random.Random(3)
    one, per_step = PagedBlockManager(300, 4, enable_prefix_caching=prefix), \
        PagedBlockManager(300, 4, enable_prefix_caching=prefix)
    live: list[Request] = []
    for rid in range(400):
        if len(live) < 12 and one.num_free_blocks >= 3:
            r = Request(RequestSpec(rid, 0.0, 9, 4), arrival=0.0)
            one.allocate(r, 9)
            per_step.allocate(r, 9)
            live.append(r)
        crossings = [rnd.sample(live, rnd.randint(0, min(3, len(live)))) for _ in range(rnd.randint(1, 9))]
        crossings += crossings[:2]  # the same members cross again a block later
        flat = [r for c in crossings for r in c]
        if len(flat) > one.num_free_blocks:
            continue
        assert one.try_grow(flat)
        for c in crossings:
            assert per_step.try_grow(c)
        if rnd.random() < 0.5:
            r = live.pop(rnd.randrange(len(live)))
            one.free(r)
            per_step.free(r)
        assert one.tables == per_step.tables and one.num_free_blocks == per_step.num_free_blocks
    one.check_invariants()
