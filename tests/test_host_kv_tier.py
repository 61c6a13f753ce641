"""The prefix cache's host-memory tier (sim/serving/host_kv_tier.py): LRU pool, the block manager's eviction and hit
paths through it, its price in the step, its scenario section, and the Mooncake lesson's range."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import load_scenario, parse_scenario, variant_configs
from sim.config.schema import ScenarioError
from sim.costs.analytic import AnalyticCostModel
from sim.costs.costmodel import StepShape
from sim.costs.fitted import FittedCostModel
from sim.loop.build import build
from sim.loop.run import run_scenario
from sim.serving.block_manager import PagedBlockManager
from sim.serving.host_kv_tier import HostKVTier
from sim.serving.request import Request, RequestSpec
from tests.conftest import scenario_summaries

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def req(id: int, prompt: int, hash_ids: tuple[int, ...], output: int = 2) -> Request:
    return Request(RequestSpec(id, 0.0, prompt, output, hash_ids=hash_ids, hash_block_size=4), arrival=0.0)


def run_through(m: PagedBlockManager, r: Request) -> int:
    """Admit a request with its whole prompt (what a step computes), then free it; returns the cached tokens."""
    hit = m.allocate(r, r.num_tokens - max(r.num_computed_tokens, m.num_cached_tokens(r)))
    r.num_computed_tokens = r.num_tokens
    m.free(r)
    return hit


def test_lru_pool_keeps_the_most_recent_and_counts() -> None:
    t = HostKVTier(capacity_blocks=2, bytes_per_block=1000, bandwidth=1e6, latency=1e-3)
    t.store(1)
    t.store(2)
    t.store(1)  # refreshed, not stored twice
    t.store(3)  # evicts 2, the least recently used
    assert 1 in t and 3 in t and 2 not in t
    assert (t.stored_blocks, t.evicted_blocks) == (3, 1)
    at_once = HostKVTier(capacity_blocks=2, bytes_per_block=1000, bandwidth=1e6, latency=1e-3)
    at_once.store_all([1, 2, 1, 3])  # one allocation's evictions together: the pool of storing them one by one
    assert (list(at_once._lru), at_once.stored_blocks, at_once.evicted_blocks) == (list(t._lru), 3, 1)
    assert t.run_length([1, 3, 2, 1]) == 2
    t.load([1, 3])
    assert t.take_pending() == pytest.approx(1e-3 + 2 * 1000 / 1e6)
    assert t.take_pending() == 0.0
    s = t.summary(block_size=4)
    assert (s["hit_loads"], s["loaded_blocks"], s["loaded_bytes"], s["recompute_saved_tokens"]) == (1, 2, 2000, 8)
    empty = HostKVTier(capacity_blocks=0, bytes_per_block=1, bandwidth=1.0)
    empty.store(5)
    assert len(empty) == 0 and empty.stored_blocks == 0


def test_evicted_prefix_comes_back_from_host_instead_of_recompute() -> None:
    # 4 GPU blocks of 4 tokens: request a (3 full prompt blocks) is evicted by b, then a's prefix returns in c
    m = PagedBlockManager(4, 4, enable_prefix_caching=True)
    m.host = HostKVTier(capacity_blocks=16, bytes_per_block=100, bandwidth=1e4, latency=0.5)
    a = req(0, 13, (1, 2, 3, 4))
    assert run_through(m, a) == 0
    b = req(1, 13, (7, 8, 9, 10))
    assert run_through(m, b) == 0  # takes every block: a's three prefix blocks go to host memory
    assert m.host.stored_blocks == 3 and len(m.cached) == 3
    c = req(2, 14, (1, 2, 3, 5))
    assert m.num_cached_tokens(c) == 12  # all three of a's prefix blocks, from the host
    assert m.blocks_needed(c, 2) == 4  # loaded blocks need GPU blocks like computed ones
    assert m.allocate(c, 2) == 12
    assert c.num_computed_tokens == 12
    assert m.host.loaded_blocks == 3 and m.host.take_pending() == pytest.approx(0.5 + 3 * 100 / 1e4)
    assert m.num_hit_tokens == 0  # the GPU cache had none of them
    # the loaded blocks hold a's prefix on the GPU again: a fourth request hits them there
    hashes = m.prefix_hashes(c)
    assert [m.block_hash.get(x) for x in m.block_table(c)[:3]] == hashes[:3]
    m.check_invariants()
    d = req(3, 14, (1, 2, 3, 6))
    assert m.num_cached_tokens(d) == 12 and m.blocks_needed(d, 2) == 1  # shared with c, on the GPU


def test_gpu_hits_then_host_hits_continue_the_chain() -> None:
    m = PagedBlockManager(6, 4, enable_prefix_caching=True)
    m.host = HostKVTier(capacity_blocks=16, bytes_per_block=1, bandwidth=1.0, latency=0.0)
    run_through(m, req(0, 13, (1, 2, 3, 4)))  # a: blocks hold prefixes 1, 12, 123 (freed, cached)
    # b takes the 2 untouched blocks, then a's freed ones tail first: its partial block, then prefix 123
    run_through(m, req(1, 13, (7, 8, 9, 10)))
    c = req(2, 14, (1, 2, 3, 5))
    gpu = len(m._hits(c))
    assert (gpu, m._host_hits(c, gpu)) == (2, m.prefix_hashes(c)[2:3])  # the GPU has 1 and 12, the host 123
    assert m.allocate(c, 2) == 12
    m.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(5, 30)), min_size=1, max_size=25),
       st.integers(2, 12), st.integers(0, 8))
def test_random_traffic_keeps_invariants_and_hits_hold_the_prefix(reqs, num_blocks, host_blocks) -> None:
    m = PagedBlockManager(num_blocks, 4, enable_prefix_caching=True)
    m.host = HostKVTier(capacity_blocks=host_blocks, bytes_per_block=1, bandwidth=1.0, latency=0.0)
    for i, (doc, prompt) in enumerate(reqs):
        ids = tuple(100 * doc + j for j in range(8))  # requests of one "document" share its prefix
        r = req(i, prompt, ids)
        cached = m.num_cached_tokens(r)
        n = r.num_tokens - cached
        if m.blocks_needed(r, n) > m.num_free_blocks:
            continue
        assert m.allocate(r, n) == cached
        hashes = m.prefix_hashes(r)
        for j, blk in enumerate(m.block_table(r)[: cached // 4]):  # every cached block holds this very prefix
            assert m.block_hash.get(blk) in (hashes[j], None)
            assert m.cached.get(hashes[j]) is not None
        m.check_invariants()
        r.num_computed_tokens = r.num_tokens
        m.free(r)
        m.check_invariants()
        assert len(m.host) <= host_blocks


def test_cost_models_add_the_load_time_as_is() -> None:
    shape = StepShape(1, 100, 0, 100, 5050)
    cost = AnalyticCostModel("llama-3.1-8b", "h100-sxm")
    base = cost.step_time(shape)
    shape.host_load_time = 0.25
    assert cost.step_time(shape) == base + 0.25
    fitted = FittedCostModel(step=1e-3, token=1e-5)
    assert fitted.step_time(shape) == pytest.approx(1e-3 + 100 * 1e-5 + 0.25)


def _scenario(kv_cache: dict) -> dict:
    return {"workload": {"arrival": {"type": "trace", "trace": "mooncake", "end": 20}},
            "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm"}, "kv_cache": kv_cache}


def test_host_cache_needs_prefix_caching() -> None:
    sc = parse_scenario(_scenario({"type": "paged", "host_cache": {"size_gib": 8}}))
    with pytest.raises(ScenarioError, match="host_cache .*enable_prefix_caching: true"):
        build(variant_configs(sc)[0])
    with pytest.raises(ScenarioError, match="size_gib"):
        parse_scenario(_scenario({"type": "paged", "enable_prefix_caching": True, "host_cache": {"size_gib": 0}}))


def test_host_cache_section_sizes_the_pool_from_the_kv_block() -> None:
    sc = parse_scenario(_scenario({"type": "paged", "enable_prefix_caching": True,
                                   "host_cache": {"size_gib": 8, "bandwidth": 25}}))
    _, kv, _, built = build(variant_configs(sc)[0])
    assert isinstance(kv, PagedBlockManager) and kv.host is not None
    # llama-3.1-8b bf16: 128 KiB per token, 2 MiB per 16-token block: 8 GiB hold 4,096 blocks
    assert built.budget.kv_bytes_per_block == 2 << 20
    assert kv.host.capacity_blocks == 4096 and kv.host.bandwidth == 25e9


@pytest.fixture(scope="module")
def host_lesson() -> dict[str, dict]:
    # tests/test_scenarios.py checks the lesson on this very run: simulated once for both
    return scenario_summaries(SCENARIOS / "lesson-host-kv-cache.yaml", {"workload.arrival.end": 200},
                              prefill_tokens=True)


def test_lesson_host_tier_cuts_prefill_and_ttft_on_mooncake(host_lesson) -> None:
    # Mooncake (Qin et al., FAST'25) and LMCache: a larger KV store than the GPU's turns the returning turns'
    # recomputation into copies. At end=200 (599 requests) the run measured: TTFT mean 5.49 s (GPU only), 4.87 s
    # (256 GiB), 3.61 s (1 TiB); prefill 7.97 M, 7.53 M, 6.87 M tokens
    gpu, h256, h1t = host_lesson["gpu-only"], host_lesson["host-256"], host_lesson["host-1024"]
    assert "host_kv" not in gpu
    assert 0.55 <= h1t["ttft"]["mean"] / gpu["ttft"]["mean"] <= 0.80
    assert h1t["ttft"]["mean"] < h256["ttft"]["mean"] < gpu["ttft"]["mean"]
    saved = 1 - h1t["prefill_tokens"] / gpu["prefill_tokens"]
    assert 0.08 <= saved <= 0.25, saved
    assert gpu["prefill_tokens"] > h256["prefill_tokens"] > h1t["prefill_tokens"]
    assert h1t["host_kv"]["recompute_saved_tokens"] > h256["host_kv"]["recompute_saved_tokens"] > 0
    assert h1t["goodput"] > gpu["goodput"]
    # the loads cost far less than the prefill they replace: 1 TiB loads ~1.1 M tokens in well under a minute
    assert h1t["host_kv"]["load_seconds"] < 60


def test_report_has_the_host_tier_section(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sim.cli.main import app

    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / "lesson-host-kv-cache.yaml"), "-q", "-o", str(out),
                                   "--set", "workload.arrival.end=30"])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert "Host tier of the prefix cache" in page and "prefill tokens saved" in page
    assert "Pipeline stages" not in page


def test_cluster_adds_up_its_replicas_host_tiers() -> None:
    path = SCENARIOS / "lesson-host-kv-cache.yaml"
    scenario, raw = load_scenario(path, {"workload.arrival.end": 40, "variants": [
        {"name": "fleet", "cluster": {"replicas": 2, "router": "prefix_affinity"},
         "kv_cache": {"type": "paged", "enable_prefix_caching": True, "host_cache": {"size_gib": 1}}}]})
    run = run_scenario(scenario, raw, source=str(path))
    h = run.summaries["fleet"]["host_kv"]
    assert h["capacity_blocks"] == 2 * 512  # two pools of 1 GiB in 2 MiB blocks
    assert h["stored_blocks"] >= h["evicted_blocks"] >= 0 and h["loaded_bytes"] == h["loaded_blocks"] * (2 << 20)


def test_fast_path_gives_the_steps_of_stepping_one_by_one() -> None:
    import numpy as np

    from sim.loop.run import generate_workload, simulate_variant

    path = SCENARIOS / "lesson-host-kv-cache.yaml"
    sc, _ = load_scenario(path, {"workload.arrival.end": 60, "deployment.num_gpu_blocks": 8192,
                                 "deployment.max_model_len": 131072})
    cfg = variant_configs(sc)[2]  # host-1024
    wl = generate_workload(sc)
    fast, _, _ = simulate_variant(cfg, wl, fast_path=True)
    slow, _, _ = simulate_variant(cfg, wl, fast_path=False)
    assert fast.host_kv is not None and fast.host_kv["loaded_blocks"] > 0  # a small GPU cache: the host serves
    for k in fast.steps:
        assert np.array_equal(fast.steps[k], slow.steps[k]), k
    assert fast.host_kv == slow.host_kv
