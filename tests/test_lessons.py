"""The published lessons, reproduced by the ``scenarios/lesson-*.yaml`` files, hold within the simulator.

Each lesson runs scaled down (fewer requests, same configuration) and its published range is asserted, so a
change to the scheduler, the allocators or the cost model that breaks a lesson fails here. The scaled-down request
counts are the smallest that keep the lesson inside its range with a margin; the full-size figures are in each
file's comments.

- continuous batching: 4-8x the output throughput of naive static batching on mixed chat lengths (seed 003);
- paged memory: KV token utilisation above 95% with paged blocks, below 40% with contiguous reservations, on the
  same workload (seed 003, vLLM paper: 60-80% waste against under 4%);
- memory-bound: KV full, compute low, requests queued, preempted and rejected; ``bottleneck()`` names memory
  (seed 000's "the ceiling: memory").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.metrics.summary import bottleneck
from sim.metrics.verdict import rank_limits
from tests.conftest import scenario_summaries

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def run_lesson(stem: str, overrides: dict) -> dict[str, dict]:
    # tests/test_scenarios.py checks each lesson on the very same run (same request count): simulated once
    return scenario_summaries(SCENARIOS / f"{stem}.yaml", overrides)


@pytest.fixture(scope="module")
def continuous_batching() -> dict[str, dict]:
    # 600 requests: 5.7x (300 requests gives 4.7x, too close to the band's edge; full size 1,500 gives 6.4x)
    return run_lesson("lesson-continuous-batching", {"workload.num_requests": 600})


@pytest.fixture(scope="module")
def paged_memory() -> dict[str, dict]:
    return run_lesson("lesson-paged-memory", {"workload.num_requests": 300})


@pytest.fixture(scope="module")
def memory_bound() -> dict[str, dict]:
    # 200 requests: enough arrivals for the queue to reach the rejection limit many times
    return run_lesson("lesson-memory-bound", {"workload.num_requests": 200})


# ---- continuous batching --------------------------------------------------------------------------------------
def test_continuous_over_naive_is_4_to_8x(continuous_batching):
    naive, cont = continuous_batching["naive"], continuous_batching["continuous"]
    ratio = cont["output_throughput"] / naive["output_throughput"]
    assert 4.0 <= ratio <= 8.0, f"continuous / naive = {ratio:.2f}x, outside the lesson's 4-8x"


def test_continuous_keeps_up_while_naive_queues(continuous_batching):
    naive, cont = continuous_batching["naive"], continuous_batching["continuous"]
    for s in (naive, cont):
        assert s["num_completed"] == s["num_requests"]
    assert cont["ttft"]["p99"] < 2.0  # no queue builds
    assert naive["ttft"]["p50"] > 30.0  # the naive server falls further behind with every batch
    assert naive["padding_fraction"] > 0.3  # rows waiting for the longest request compute padding
    assert cont["padding_fraction"] == 0.0
    # the naive server loses to waiting rows, not to the memory ceiling
    assert naive["kv_usage"]["max"] < 0.5 and cont["kv_usage"]["max"] < 0.5


# ---- paged memory ---------------------------------------------------------------------------------------------
def test_paged_over_95_contiguous_under_40_percent(paged_memory):
    contiguous, paged = paged_memory["contiguous"], paged_memory["paged"]
    assert paged["kv_token_utilization"] > 0.95
    assert contiguous["kv_token_utilization"] < 0.40
    # the vLLM paper's 60-80% waste for contiguous reservation, under 4% for pages
    assert 0.60 <= 1 - contiguous["kv_token_utilization"] <= 0.80
    assert 1 - paged["kv_token_utilization"] < 0.04


def test_same_work_contiguous_needs_more_memory(paged_memory):
    contiguous, paged = paged_memory["contiguous"], paged_memory["paged"]
    assert contiguous["num_requests"] == paged["num_requests"]
    assert contiguous["total_output_tokens"] == paged["total_output_tokens"]
    assert contiguous["kv_usage"]["max"] > 0.95  # reservations fill the cache...
    assert paged["kv_usage"]["max"] < 0.6  # ...pages hold the same requests in well under the capacity
    assert contiguous["kv_usage"]["mean"] > 2 * paged["kv_usage"]["mean"]
    assert contiguous["ttft"]["p99"] > paged["ttft"]["p99"]  # requests wait for reserved memory


# ---- memory-bound ---------------------------------------------------------------------------------------------
def test_memory_bound_failure_mode(memory_bound):
    s = memory_bound["bf16-two-gpus"]
    assert s["kv_usage"]["max"] > 0.99  # KV full
    assert s["kv_usage"]["mean"] > 0.8
    assert s["mfu"] < 0.3  # compute far from saturated
    assert s["busy_fraction"] > 0.95  # while the GPU reads as busy
    assert s["num_rejected"] > 0 and s["num_preemptions"] > 0
    assert s["queue"]["p99"] > 10.0  # requests wait up to the admission limit (20 s)
    assert s["mean_batch_size"] < 20  # KV, not max_num_seqs (256), caps the batch
    # requests pile up (overloaded), and the reason is memory: the first cause the verdict names
    assert rank_limits(s).causes[0] == "memory-bound" and "memory-bound: KV usage" in bottleneck(s)


def test_memory_bound_remedy(memory_bound):
    s, fp8 = memory_bound["bf16-two-gpus"], memory_bound["fp8-weights-and-kv"]
    assert fp8["num_rejected"] == 0 and fp8["num_completed"] == fp8["num_requests"]
    assert fp8["output_throughput"] > 1.2 * s["output_throughput"]
    assert fp8["kv_usage"]["max"] < 0.5
    assert "memory-bound" not in rank_limits(fp8).causes[:1] and "memory-bound" not in bottleneck(fp8)


# ---- speculative decoding -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def speculative() -> dict[int, float]:
    """Output throughput of draft-k4 over no-spec at each number of users (the batch). 768 requests a run: 1.69x,
    1.56x, 1.24x, 0.94x and 0.94x (full size, 1,024: 0.93x and 0.92x at 256 and 512 users; 600 gives 0.99x at 256, too
    close to the 1.0 this asserts below)."""
    s = run_lesson("lesson-speculative-decoding", {"workload.num_requests": 768})
    return {u: s[f"draft-k4[num_users={u}]"]["output_throughput"] / s[f"no-spec[num_users={u}]"]["output_throughput"]
            for u in (1, 16, 64, 256, 512)}, s


def test_speculative_decoding_speeds_up_batch_1(speculative):
    # Leviathan et al. 2023: (1 - a^(k+1)) / ((1 - a)(k c + 1)) = 1.70x for a = 0.7, k = 4, c = 0.16
    ratio, s = speculative
    assert 1.5 <= ratio[1] <= 2.0, f"speed-up at batch 1 {ratio[1]:.2f}x, outside 1.5-2.0x"
    spec = s["draft-k4[num_users=1]"]["spec_decode"]
    assert 2.6 <= spec["mean_acceptance_length"] <= 2.9  # 1 + 0.7 (1 - 0.7^4) / 0.3 = 2.77
    assert 0.3 <= spec["draft_time_share"] <= 0.45


def test_speculative_decoding_gain_shrinks_then_turns_into_a_loss(speculative):
    # vLLM docs (medium-to-low QPS) and Liu et al. 2024 (higher request rates: latency increases)
    ratio, s = speculative
    users = sorted(ratio)
    assert all(ratio[a] > ratio[b] for a, b in zip(users, users[1:-1], strict=False)), ratio
    assert ratio[64] > 1.0, ratio
    assert 0.8 <= ratio[256] < 1.0 and 0.8 <= ratio[512] < 1.0, ratio
    # the loss shows in the latency too: each token of a busy server's reply comes later
    assert s["draft-k4[num_users=512]"]["tpot"]["mean"] > s["no-spec[num_users=512]"]["tpot"]["mean"]


def test_speculation_off_under_load_keeps_the_gain_and_drops_the_loss(speculative):
    # vLLM's disable_by_batch_size (SmartSpec's point: speculate by the load)
    ratio, s = speculative

    def gain(users: int) -> float:
        off = s[f"draft-k4-off-under-load[num_users={users}]"]["output_throughput"]
        return off / s[f"no-spec[num_users={users}]"]["output_throughput"]

    for users in (1, 16, 64):  # below the threshold: the very runs of draft-k4
        assert gain(users) == ratio[users]
    assert 0.99 <= gain(256) <= 1.1 and 0.99 <= gain(512) <= 1.1, (gain(256), gain(512))
