"""The verdict names the limit each run was BUILT to hit (issue 17 point 1).

Each run is small (at most a few hundred requests on one simulated GPU) and seeded; the scenario fixes one knob so
that one limit dominates. The old ``bottleneck()`` (KV usage, then busy fraction and MFU only) called the first
"bandwidth-bound", the second "compute-bound" or "bandwidth-bound", the light run "underloaded" and had no words
for overload, slots or padding.
"""

from __future__ import annotations

import json

import pytest

from sim.metrics import bottleneck
from sim.run import run_scenario
from sim.scenario import parse_scenario
from sim.verdict import rank_limits


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
    assert lim["offered_rate"] > 2 * lim["served_rate"]
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
    from sim.report import bottlenecks_html
    from sim.table import format_table

    row = [line for line in format_table({"naive": naive}).splitlines() if line.startswith("padding")]
    assert len(row) == 1 and row[0].split()[-1] == f"{100 * naive['padding_fraction']:.1f}%"
    page = bottlenecks_html({"naive": naive})
    assert "<ol><li>overloaded (1.00): offered " in page and "<li>padding (0.6" in page
