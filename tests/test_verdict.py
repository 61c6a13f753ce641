"""The verdict names the limit each run was BUILT to hit (issue 17 point 1).

Each run is small (at most a few hundred requests on one simulated GPU) and seeded; the scenario fixes one knob so
that one limit dominates. The old ``bottleneck()`` (KV usage, then busy fraction and MFU only) called the first
"bandwidth-bound", the second "compute-bound" or "bandwidth-bound", the light run "underloaded" and had no words
for overload, slots or padding.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim.config.scenario import load_scenario, parse_scenario
from sim.loop.run import run_scenario
from sim.metrics.summary import bottleneck
from sim.metrics.verdict import rank_limits

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def _run(workload: dict, variant: dict, deployment: dict | None = None) -> dict:
    raw = {
        "name": "verdict",
        "seed": 0,
        "workload": workload,
        "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 4096, **(deployment or {})},
        "variants": [{"name": "v", **variant}],
    }
    run = run_scenario(parse_scenario(raw), raw)
    return run.summaries["v"]


CHAT = {"prompt_len": {"type": "lognormal", "mean": 600, "std": 500, "min": 16, "max": 3072},
        "output_len": {"type": "exponential", "mean": 250, "min": 1, "max": 1024}}


@pytest.fixture(scope="module")
def naive() -> dict:
    # 10 req/s offered to a static server that sustains about 1 req/s: the "717 s queue, 66% padding"
    return _run({"arrival": {"type": "poisson", "rate": 10.0}, "num_requests": 200, **CHAT},
                {"policy": {"type": "static", "batch_size": 16, "max_wait": 0.5},
                 "kv_cache": {"type": "contiguous", "reserve": "max_model_len"}})


def test_naive_static_batching_is_overloaded_then_padding(naive):
    v = rank_limits(naive)
    assert v.names[0] == "overloaded"
    assert v.causes[0] == "padding"
    assert "bandwidth-bound" not in v.names[:2]
    lim = naive["limits"]
    assert lim["offered_rate"] > 2 * lim["scheduled_rate"]
    assert lim["queue_end"] > lim["queue_start"]  # the queue grows over the arrival window
    text = bottleneck(naive)
    assert text.startswith("overloaded: offered ") and "padding" in text and "bandwidth" not in text


def test_slot_cap_when_max_num_seqs_is_full_and_kv_has_room():
    # 64 slots, short prompts and long outputs: the batch stays at 64 while requests queue; KV stays far from full
    s = _run({"arrival": {"type": "poisson", "rate": 20.0}, "num_requests": 400,
              "prompt_len": {"type": "fixed", "value": 64}, "output_len": {"type": "fixed", "value": 400}},
             {"policy": {"type": "continuous", "max_num_seqs": 64}})
    v = rank_limits(s)
    assert v.causes[0] == "batch-slot cap", v.text
    assert s["kv_usage"]["max"] < 0.5
    assert s["limits"]["mean_running"] > 0.75 * 64  # the ramp-up and the drain after the last arrival run below it
    assert "batch-slot cap" in bottleneck(s)


def test_tiny_kv_is_memory_bound():
    s = _run({"arrival": {"type": "poisson", "rate": 4.0}, "num_requests": 150, **CHAT},
             {"policy": {"type": "continuous", "max_num_seqs": 256}}, {"num_gpu_blocks": 400})
    v = rank_limits(s)
    assert v.causes[0] == "memory-bound", v.text
    assert s["num_preemptions"] > 0
    # the line says both that requests pile up and why: the old one named memory but not the overload
    text = bottleneck(s)
    assert text.startswith("overloaded: ") and "then memory-bound: KV usage" in text and "preemptions" in text


def test_light_load_at_batch_1_is_bandwidth_bound():
    s = _run({"arrival": {"type": "poisson", "rate": 0.2}, "num_requests": 20,
              "prompt_len": {"type": "fixed", "value": 128}, "output_len": {"type": "fixed", "value": 128}},
             {"policy": {"type": "continuous", "max_num_seqs": 1}})
    v = rank_limits(s)
    assert v.names[0] == "bandwidth-bound", v.text
    assert "overloaded" not in v.names
    assert bottleneck(s).startswith("bandwidth-bound: MFU ")


def test_huge_prompts_are_compute_bound():
    s = _run({"arrival": {"type": "poisson", "rate": 0.5}, "num_requests": 20,
              "prompt_len": {"type": "fixed", "value": 4000}, "output_len": {"type": "fixed", "value": 1}},
             {"policy": {"type": "continuous", "max_num_seqs": 256}})
    v = rank_limits(s)
    assert v.names[0] == "compute-bound", v.text
    assert s["limits"]["prefill_share"] > 0.99


def test_verdict_reads_back_from_summary_json(naive):
    again = json.loads(json.dumps(naive, default=float).replace("NaN", "null"))
    assert rank_limits(again).names == rank_limits(naive).names


def test_old_summary_without_limits_still_gets_a_line(naive):
    old = {k: v for k, v in naive.items() if k != "limits"}
    text = bottleneck(old)
    assert text.endswith(".") and "padding" in text


def test_padding_share_in_the_table_and_the_report(naive):
    from sim.output.report import bottlenecks_html
    from sim.output.table import format_table

    row = [line for line in format_table({"naive": naive}).splitlines() if line.startswith("padding")]
    assert len(row) == 1 and row[0].split()[-1] == f"{100 * naive['padding_fraction']:.1f}%"
    page = bottlenecks_html({"naive": naive})
    assert "<br>symptom: overloaded (1.00): offered " in page and "<ol><li>padding (0.6" in page


def _shipped(file: str, variants: list[str] | None = None, **overrides) -> dict:
    _, raw = load_scenario(SCENARIOS / file, overrides)
    if variants is not None:
        raw["variants"] = [v for v in raw["variants"] if v["name"] in variants]
    return run_scenario(parse_scenario(raw), raw).summaries


def test_no_queue_is_no_overload_however_many_requests_are_in_flight_at_the_end():
    # issue 35: at 300 requests the continuous server had finished 5.65 of 6.23 req/s by the last arrival (the
    # rest still decoding) and was called "overloaded" with "queue 0 -> 0 waiting, queueing 0% of E2EL"
    runs = _shipped("naive-vs-continuous.yaml", **{"workload.num_requests": 300})
    cont, naive = runs["continuous"], runs["naive"]
    assert cont["slo_attainment"] == 1.0 and cont["limits"]["queue_end"] < 1
    assert "overloaded" not in rank_limits(cont).names, bottleneck(cont)
    assert bottleneck(cont).startswith("bandwidth-bound: ")
    assert rank_limits(naive).names[0] == "overloaded"  # its queue grows: 22 -> 207 waiting
    assert naive["limits"]["queue_end"] - naive["limits"]["queue_start"] > 150
    assert re.match(r"overloaded: offered 6\.23 req/s, scheduled \d\.\d\d req/s \(first to last arrival\), "
                    r"queue \d+ -> \d+ waiting, queueing 9\d% of E2EL; then padding: ", bottleneck(naive))


def test_disaggregation_lesson_is_not_overloaded():
    # issue 35: colocated and 3P1D were "overloaded" with "queue 0 -> 0, queueing 1% of E2EL"
    runs = _shipped("lesson-disaggregation.yaml", ["colocated", "3P1D"])
    for name, s in runs.items():
        assert "overloaded" not in rank_limits(s).names, (name, bottleneck(s))
        assert s["limits"]["queue_growth"] < 0.05 * s["limits"]["offered_rate"]


def _limits(naive: dict, **lim) -> dict:
    return {**naive, "limits": {**naive["limits"], **lim}}


@pytest.mark.parametrize(
    "lim, score",
    [
        ({"queue_growth": 0.49, "queue_start": 0.0, "queue_end": 30.0}, None),  # 4.9% of 10 req/s: under 5%
        ({"queue_growth": 0.5, "queue_start": 0.0, "queue_end": 30.0}, 0.1),  # 5%: overloaded, 2 x 5%
        ({"queue_growth": 4.0, "queue_start": 10.0, "queue_end": 200.0}, 0.8),
        ({"queue_growth": 6.0, "queue_start": 10.0, "queue_end": 200.0}, 1.0),
        ({"queue_growth": 0.5, "queue_start": 0.0, "queue_end": 0.9}, None),  # under one request: noise
        ({"queue_growth": 0.0, "queue_start": 0.0, "queue_end": 0.0, "queue_share": 0.6}, 0.6),  # queue dominates
        ({"queue_growth": 0.0, "queue_start": 0.0, "queue_end": 0.0, "queue_share": 0.49}, None),
    ],
)
def test_overload_needs_a_growing_queue_or_queueing_to_dominate(naive, lim, score):
    s = _limits(naive, **{"offered_rate": 10.0, "scheduled_rate": 1.0, "queue_share": 0.0, **lim})
    over = [x for x in rank_limits(s).limits if x.name == "overloaded"]
    assert [x.score for x in over] == ([] if score is None else [pytest.approx(score, rel=1e-12)])


def test_a_high_queue_share_while_keeping_up_is_batch_formation_not_overload(naive):
    """Static batching on the CPU profile (calibration/scenarios/validate-tiny.yaml, variant static) read
    "overloaded: offered 56.82 req/s, scheduled 55.39 req/s, queue 2 -> 3 waiting, queueing 53% of E2EL": the
    queue share came from batches forming, not from a server falling behind."""
    lim = {"offered_rate": 56.82, "scheduled_rate": 55.39, "queue_growth": 0.1, "queue_start": 2.0,
           "queue_end": 3.0, "queue_share": 0.53, "static": True, "slot_cap": 16}
    v = rank_limits(_limits(naive, **lim))
    assert "overloaded" not in v.names
    (formation,) = [x for x in v.limits if x.name == "batch formation"]
    assert formation.score == pytest.approx(0.53)
    assert formation.evidence == "queueing 53% of E2EL while static batches of 16 formed, the queue steady"
    # the same share with requests scheduled 5% slower than they arrive: overloaded, and no batch formation
    v = rank_limits(_limits(naive, **{**lim, "scheduled_rate": 0.95 * 56.82 - 0.01}))
    assert v.names[0] == "overloaded" and "batch formation" not in v.names


# scenarios/azure-code-bursty.yaml's chunked variant at max_num_batched_tokens 320, 400 requests (measured)
_BURSTY_320 = {
    "num_requests": 400, "num_steps": 5000, "busy_fraction": 0.166, "num_preemptions": 0, "num_rejected": 0,
    "kv_usage": {"mean": 0.017, "max": 0.049}, "padding_fraction": 0.0,
    "limits": {"offered_rate": 1.772, "scheduled_rate": 1.688, "queue_share": 0.592, "queue_start": 0.046,
               "queue_end": 2.717, "queue_growth": 0.016, "waiting_share": 0.568, "mean_running": 3.075,
               "slot_cap": 256.0, "static": False, "waiting_batched_tokens": 315.624, "token_cap": 320.0,
               "busy_mfu": 0.35, "prefill_share": 0.989},
}


def test_continuous_batching_that_keeps_up_names_its_queueing_and_what_it_waits_behind():
    """scenarios/azure-code-bursty.yaml's chunked variant at max_num_batched_tokens 320 (400 requests): queueing 59%
    of E2EL, the queue steady, scheduled within 5% of the offered rate. Its verdict read "compute-bound: MFU 35%
    while computing, GPU busy 17% of the time (more load would fit)", the queue unnamed: the budget that held the
    bursts' prompts back binds only in the bursts, and is scored over the run's time."""
    s = _BURSTY_320
    lim = s["limits"]
    v = rank_limits(s)
    assert v.names[:2] == ["queueing", "token-budget cap"]
    assert v.text.startswith("queueing: 59% of E2EL waiting for a first step while scheduled as fast as offered (the "
                             "queue steady), behind the token-budget cap; then token-budget cap: 316 of ")
    # no cap filled: the bursts alone; a smaller share, or a server falling behind, is no such limit
    free = {**lim, "waiting_batched_tokens": 20.0}
    assert rank_limits({**s, "limits": free}).limits[0].evidence.endswith("(the queue steady), in bursts of arrivals")
    assert "queueing" not in rank_limits({**s, "limits": {**lim, "queue_share": 0.49}}).names
    behind = rank_limits({**s, "limits": {**lim, "scheduled_rate": 1.6}}).names
    assert behind[0] == "overloaded" and "queueing" not in behind


def test_an_overloaded_run_with_an_idle_gpu_names_the_cap_it_waits_behind_not_spare_room():
    """The same variant at max_num_batched_tokens 256 (400 requests, measured): scheduled 1.67 of 1.77 req/s
    offered, queueing 66% of E2EL. Its verdict read "overloaded: ...; then compute-bound: MFU 35% while computing,
    GPU busy 17% of the time (more load would fit)": an overload beside spare room, and the budget the bursts
    queued behind unnamed (its score 0.10 under the roofline's 0.15)."""
    lim = {**_BURSTY_320["limits"], "scheduled_rate": 1.666, "queue_share": 0.657, "queue_start": 0.051,
           "queue_end": 3.239, "queue_growth": 0.019, "waiting_share": 0.597, "mean_running": 2.787,
           "waiting_batched_tokens": 252.7, "token_cap": 256.0, "busy_mfu": 0.348}
    s = {**_BURSTY_320, "busy_fraction": 0.167, "limits": lim}
    v = rank_limits(s)
    assert v.names == ["overloaded", "token-budget cap", "compute-bound"]
    assert "more load would fit" not in v.text
    assert v.text.split("; then ")[1].startswith("token-budget cap: 253 of max_num_batched_tokens 256 tokens")
    # no cap filled: the roofline follows the overload, still without claiming spare room
    free = rank_limits({**s, "limits": {**lim, "waiting_batched_tokens": 20.0}})
    assert free.names[:2] == ["overloaded", "compute-bound"] and "more load would fit" not in free.text
    # keeping up, the idle GPU's spare room is said again
    assert "(more load would fit)" in rank_limits({**s, "limits": {**lim, "scheduled_rate": 1.77,
                                                                     "queue_share": 0.3}}).text


@pytest.mark.parametrize("slot_cap", [None, "gone"])
def test_batch_formation_without_a_slot_cap_names_no_batch_size(naive, slot_cap):
    """A summary without the batch size (slot_cap null: a static policy whose batch_size the config did not record,
    or a summary.json written before slot_cap) read "static batches of 0 formed"."""
    lim = {"offered_rate": 56.82, "scheduled_rate": 55.39, "queue_growth": 0.1, "queue_start": 2.0,
           "queue_end": 3.0, "queue_share": 0.53, "static": True, "slot_cap": slot_cap}
    s = _limits(naive, **lim)
    if slot_cap == "gone":
        del s["limits"]["slot_cap"]
    (formation,) = [x for x in rank_limits(s).limits if x.name == "batch formation"]
    assert formation.evidence == "queueing 53% of E2EL while static batches formed, the queue steady"


def test_report_ranks_the_causes_by_score_and_sets_the_overload_apart(naive):
    from sim.output.report import bottlenecks_html

    # a queue that makes 60% of E2EL (overload 0.60) while 66% of the tokens are padding (0.66): the overload
    # still leads the verdict, and the numbered ranking stays in score order
    s = _limits(naive, queue_growth=0.0, queue_start=0.0, queue_end=0.0, queue_share=0.6)
    assert rank_limits(s).names[:2] == ["overloaded", "padding"]
    page = bottlenecks_html({"naive": s})
    ranking = page.split("<ol>")[1]
    scores = [float(x) for x in re.findall(r"<li>[a-z -]+ \((\d\.\d\d)\)", ranking)]
    assert len(scores) >= 2 and scores == sorted(scores, reverse=True)
    assert "overloaded" not in ranking
    assert "<br>symptom: overloaded (0.60): offered " in page


def test_a_disaggregated_run_is_ranked_by_its_busiest_pools_roof():
    """3P1D read 'compute-bound: MFU 33% while computing' over the whole fleet: its three prefill GPUs' compute-
    heavy steps outweighed the one decode GPU that is busy 100% of the time and limits the run, at 4% MFU. Each
    pool is judged against its own roof, and the busiest pool's is the run's (scenarios/lesson-disaggregation.yaml,
    300 requests)."""
    pools = {"prefill": {"busy_fraction": 0.38, "busy_mfu": 0.59}, "decode": {"busy_fraction": 0.996, "busy_mfu": 0.04}}
    s = {"num_steps": 100, "busy_fraction": 0.54, "limits": {"busy_mfu": 0.33, "prefill_share": 0.95},
         "disaggregation": {"pools": pools}}
    v = rank_limits(s)
    assert v.text == ("bandwidth-bound: decode pool (the busiest): MFU 4% while computing, busy 100% of the time; "
                      "prefill pool compute-bound: MFU 59% while computing, busy 38%.")
    assert v.limits[0].score == pytest.approx(0.996)  # the busiest pool's share, not the fleet's 0.54
    from sim.config.scenario import variant_configs
    from sim.loop.run import generate_workload, simulate_variant
    from sim.metrics.summary import summarize

    sc, _ = load_scenario("scenarios/lesson-disaggregation.yaml", {"workload.num_requests": 300})
    cfg = next(c for c in variant_configs(sc) if c.name == "3P1D")
    text = rank_limits(summarize(simulate_variant(cfg, generate_workload(sc))[0])).text
    assert text.startswith("bandwidth-bound: decode pool (the busiest): MFU 4% while computing, busy 100% of the "
                           "time; prefill pool compute-bound: MFU 59%"), text


def test_a_disaggregated_runs_memory_is_judged_in_its_fullest_pool():
    """The KV usage the verdict reads was the mean over both pools: a decode pool full at 90% beside a prefill
    pool's nearly empty cache read 45%, under the 85% that makes a run memory-bound, and the limit went unnamed."""
    pools = {"prefill": {"busy_fraction": 0.3, "busy_mfu": 0.5, "kv_usage_mean": 0.01},
             "decode": {"busy_fraction": 0.9, "busy_mfu": 0.05, "kv_usage_mean": 0.9}}
    s = {"num_steps": 100, "busy_fraction": 0.6, "kv_usage": {"mean": 0.45, "max": 0.97}, "num_preemptions": 12,
         "limits": {"busy_mfu": 0.3}, "disaggregation": {"pools": pools}}
    v = rank_limits(s)
    assert v.names[0] == "memory-bound" and v.limits[0].score == pytest.approx(0.97)
    assert v.text.startswith("memory-bound: KV usage 90% on average in the decode pool (peak 97%), 12 "
                             "preemptions; then bandwidth-bound: decode pool (the busiest)")
    pools["decode"]["kv_usage_mean"] = 0.3  # the pools' means under the fleet's: the fleet's is said
    assert "KV usage 45% on average (peak 97%)" in rank_limits(s).text


def test_a_disaggregated_run_names_each_pools_busy_share():
    """3P1D (scenarios/lesson-disaggregation.yaml) read 'compute-bound: MFU 35% while computing, GPU busy 56% of
    the time': the share over both pools, while its one decode GPU, the bottleneck the lesson names, was busy
    99.8% of the time. Each pool's share is said; and 'more load would fit' is said only when the busiest pool has
    room, not when a saturated pool hides in a fleet under half busy."""
    pools = {"prefill": {"busy_fraction": 0.2}, "decode": {"busy_fraction": 0.998}}
    s = {"num_steps": 100, "busy_fraction": 0.4, "limits": {"busy_mfu": 0.35}, "disaggregation": {"pools": pools}}
    text = rank_limits(s).text
    assert text == ("compute-bound: MFU 35% while computing, GPU busy 40% of the time (prefill pool 20%, decode pool "
                    "100%).")
    pools["decode"]["busy_fraction"] = 0.3
    assert rank_limits(s).text.endswith("(prefill pool 20%, decode pool 30%) (more load would fit).")
    assert rank_limits({"num_steps": 100, "busy_fraction": 0.4, "limits": {"busy_mfu": 0.35}}).text.endswith(
        "GPU busy 40% of the time (more load would fit).")


def test_a_full_token_budget_is_named_not_the_slots_it_leaves_empty():
    # docs/write-a-policy.md's my_scenario.yaml: prompts of about 2,000 tokens against a budget of 2,048 per step,
    # 64 slots. The verdict read "then batch-slot cap: 8.7 of max_num_seqs 64 running", a cap used a seventh,
    # and never named the token budget that held the waiting requests back
    s = _run({"arrival": {"type": "poisson", "rate": 5.0}, "num_requests": 200,
              "prompt_len": {"type": "lognormal", "mean": 2000, "std": 2500, "min": 64, "max": 8000},
              "output_len": {"type": "exponential", "mean": 40, "min": 1, "max": 400}},
             {"policy": {"type": "fcfs", "max_num_seqs": 64, "max_num_batched_tokens": 2048}},
             {"max_model_len": 8192})
    v = rank_limits(s)
    assert "token-budget cap" in v.causes and "batch-slot cap" not in v.names, v.text  # 8.7 of 64 slots: no cap
    assert "max_num_seqs" not in v.text and "of max_num_batched_tokens 2,048 tokens per step" in v.text, v.text
    assert s["limits"]["token_cap"] == 2048 and s["limits"]["waiting_batched_tokens"] > 0.9 * 2048


def test_a_disaggregated_runs_token_budget_is_each_pools_own():
    # The prefill pool's steps hold two 2,000-token prompts of its 4,096-token budget while prompts queue; the decode
    # pool's budget is 16,384. The verdict compared the steps of both pools (3,536 tokens a step while requests
    # waited) with the decode pool's budget, the only one the run's config records: '3,536 of
    # max_num_batched_tokens 16,384', a budget no step of the prefill pool had
    s = _run({"arrival": {"type": "poisson", "rate": 30.0}, "num_requests": 400,
              "prompt_len": {"type": "fixed", "value": 2000}, "output_len": {"type": "fixed", "value": 50}},
             {"disaggregation": {
                 "prefill": {"policy": {"type": "continuous", "max_num_batched_tokens": 4096}},
                 "decode": {"policy": {"type": "continuous", "max_num_batched_tokens": 16384}}}},
             {"gpu": "h100-sxm"})
    pools = s["disaggregation"]["pools"]
    assert pools["prefill"]["token_cap"] == 4096 and pools["decode"]["token_cap"] == 16384
    assert pools["prefill"]["waiting_batched_tokens"] == pytest.approx(4000, rel=0.01)
    limit = next(lim for lim in rank_limits(s).limits if lim.name == "token-budget cap")
    assert re.match(r"prefill pool: 3,9\d\d of max_num_batched_tokens 4,096 tokens per step", limit.evidence), limit
    assert limit.score > 0.8


def test_a_cap_mostly_unused_is_not_listed():
    # classes-priority (300 requests): its steps compute 306 of a 2,048-token budget while requests wait for its 32
    # slots, yet the ranking listed "token-budget cap (0.11)" beside the slots that hold them
    scenario, raw = load_scenario(SCENARIOS / "classes-priority.yaml", {"workload.num_requests": 300})
    s = run_scenario(scenario, raw).summaries["fcfs"]
    v = rank_limits(s)
    assert s["limits"]["waiting_batched_tokens"] < 0.25 * s["limits"]["token_cap"]
    assert "batch-slot cap" in v.causes and "token-budget cap" not in v.names, v.names


@pytest.mark.parametrize("policy, budget", [({"type": "fcfs", "max_num_seqs": 64}, 8192),
                                            ({"type": "continuous", "max_num_seqs": 64}, 16384)])
def test_a_default_token_budget_is_judged_as_the_core_applied_it(policy, budget):
    # The budget was read from the recorded policy section alone, None where servesim's default applies (8,192
    # with chunked prefill, else max(8,192, max_model_len)): such runs got token_cap NaN and no token-budget
    # candidate at all, whatever their steps held
    s = _run({"arrival": {"type": "poisson", "rate": 8.0}, "num_requests": 150,
              "prompt_len": {"type": "fixed", "value": 6000}, "output_len": {"type": "fixed", "value": 20}},
             {"policy": policy}, {"max_model_len": 16384})
    assert s["limits"]["token_cap"] == budget
    limit = next(lim for lim in rank_limits(s).limits if lim.name == "token-budget cap")
    assert f"of max_num_batched_tokens {budget:,} tokens per step" in limit.evidence and limit.score > 0.5, limit
