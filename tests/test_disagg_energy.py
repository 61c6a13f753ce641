"""A disaggregated run's energy (sim/costs/pooled_power.py): each pool's GPUs draw their own power, the requests'
energies sum to the run's, and ``servesim plan`` with the joules objective can choose a split."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import servesim
from sim.costs.energy import run_energy
from sim.hardware.gpu import resolve_gpu


def _scenario(rate: float, n: int, low: int, high: int) -> dict[str, Any]:
    return {
        "name": "disagg-energy", "seed": 1,
        "workload": {"arrival": {"type": "poisson", "rate": rate}, "num_requests": n,
                     "prompt_len": {"type": "uniform", "low": low, "high": high},
                     "output_len": {"type": "uniform", "low": 20, "high": 100}},
        "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 8192},
    }


def test_a_disaggregated_run_has_energy_pool_by_pool() -> None:
    """Before: power None for prefill/decode pools, summary energy null."""
    raw = _scenario(6.0, 30, 1000, 2000)
    # the decode pool on another GPU: its steps and its idle draw at that GPU's figures
    raw["variants"] = [{"name": "1P1D", "disaggregation": {
        "prefill": {"replicas": 1}, "decode": {"replicas": 1, "deployment": {"gpu": "a100-80gb"}},
        "kv_link": {"kind": "infiniband"}}}]
    run = servesim.run(raw)
    (r,) = run.results
    s = run.summary["1P1D"]["energy"]
    e = run_energy(r)
    assert s is not None and e is not None
    assert float(e.request_energy_j.sum()) == pytest.approx(s["energy_j"], rel=1e-12)
    pools = s["pools"]
    a100, l4 = resolve_gpu("a100-80gb"), resolve_gpu("l4")
    assert (pools["prefill"]["idle_w"], pools["decode"]["idle_w"]) == (l4.idle_w, a100.idle_w)
    # idle: each replica's GPU at its idle power for the run's seconds it did not compute
    assert r.cluster is not None
    idle = sum((r.duration - life["busy_seconds"]) * (l4 if life["pool"] == "prefill" else a100).idle_w
               for life in r.cluster["per_replica"])
    assert e.idle_energy_j == pytest.approx(idle, rel=1e-9)
    # every completed request worked on both pools: each drew some of each pool's steps' energy
    assert bool(np.all(e.request_energy_j > 0))


def test_plan_with_the_joules_objective_can_choose_a_split() -> None:
    """Before: a split's J/output token was NaN, so the plan chose 2 x l4 (0.165 J) over 1P1D (0.141 J)."""
    from sim.config.scenario import parse_scenario
    from sim.studies.planner import plan

    raw = _scenario(12.0, 20, 1000, 2000) | {"slos": {"ttft": 1.0, "tpot": 0.05}}
    raw["plan"] = {"gpus": ["l4"], "tensor_parallel_sizes": [1], "weight_dtypes": ["bf16"], "kv_dtypes": ["auto"],
                   "max_num_seqs": [16], "enable_chunked_prefill": [False], "max_gpus": 2, "objective": "joules",
                   "disaggregation": {"kv_link": {"kind": "infiniband"}}}
    result = plan(parse_scenario(raw))
    by_label = {e.candidate.label(): e for e in result.evaluations}
    split, two = by_label["1P1D x l4, weights bf16, KV bf16, max_num_seqs 16, chunked prefill off"], \
        by_label["2 x l4, weights bf16, KV bf16, max_num_seqs 16, chunked prefill off"]
    assert split.meets and two.meets and split.j_per_output_token < two.j_per_output_token
    assert result.chosen is split
