"""Jain's index over tenants measures the service they received while backlogged (sim/metrics/fairness.py), as
the VTC paper defines fairness: it was each tenant's output tokens served over those asked for, 1.0 whenever every
request completed, so FCFS and VTC read alike on a tenant scenario."""

from __future__ import annotations

import math

import pytest

from sim.config.scenario import parse_scenario
from sim.loop.run import run_scenario


def _two_tenants(num_requests: int = 1000) -> dict:
    # two tenants, one sending three times the other's requests, both far over what one A100 serves: both stay
    # backlogged, so a fair scheduler gives them equal service and FCFS gives them service as they arrive
    return {
        "name": "two-tenants", "seed": 0,
        "workload": {"arrival": {"type": "poisson", "rate": 30.0}, "num_requests": num_requests,
                     "prompt_len": {"type": "fixed", "value": 200}, "output_len": {"type": "fixed", "value": 200},
                     "classes": [{"name": "big", "share": 0.75, "tenant": "big"},
                                 {"name": "small", "share": 0.25, "tenant": "small"}]},
        "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb", "max_model_len": 1024},
        "variants": [{"name": "fcfs", "policy": {"type": "fcfs", "max_num_seqs": 16}},
                     {"name": "vtc", "policy": {"type": "vtc", "max_num_seqs": 16}}],
    }


def test_backlogged_fairness_tells_vtc_from_fcfs() -> None:
    raw = _two_tenants()
    s = run_scenario(parse_scenario(raw), raw).summaries
    fcfs, vtc = s["fcfs"]["fairness"], s["vtc"]["fairness"]
    assert s["fcfs"]["num_completed"] == s["vtc"]["num_completed"] == 1000
    # every request completed under both: the share of demand served is equal
    assert fcfs["served_share_jain_index"] == vtc["served_share_jain_index"] == 1.0
    assert fcfs["backlogged_windows"] >= 10 and vtc["backlogged_windows"] >= 5
    # FCFS serves the backlogged tenants about 3:1, Jain's (1 + 3)^2 / (2 (1 + 9)) = 0.8; VTC about 1:1
    assert fcfs["jain_index"] == pytest.approx(0.8, abs=0.05)
    assert vtc["jain_index"] > 0.98


def test_without_contention_the_index_is_one_and_without_tenants_there_is_none() -> None:
    from sim.metrics.fairness import backlogged_jain
    from sim.metrics.records import RequestRecord
    from sim.metrics.request_table import as_table
    from sim.metrics.verdict import waiting_spans

    def rec(i: int, tenant: str, arrival: float) -> RequestRecord:
        return RequestRecord(i, arrival, arrival, arrival + 0.1, arrival + 1.0, 10, 10, 10, 0, "completed", "", 0,
                             -1, tenant=tenant)

    table = as_table([rec(0, "a", 0.0), rec(1, "b", 2.0), rec(2, "a", 4.0)])  # nobody ever waits
    rows = {name: mask for name, mask in table.groups("tenant").items() if name}
    assert backlogged_jain(table, rows, waiting_spans(table)) == (1.0, 0)
    index, windows = backlogged_jain(table, {}, waiting_spans(table))
    assert math.isnan(index) and windows == 0


def test_a_tenant_refused_at_arrival_is_not_called_fairly_served() -> None:
    # A policy that rejects every request of one tenant when a step reaches it: those requests never wait, so the
    # tenant is never backlogged and the windows alone read 1.0 (was fairness.jain_index 1.0); Jain's index of the
    # shares served (1 and 0) is 1 / 2, the least two tenants can read
    import servesim

    class RefuseSmall(servesim.QueuePolicy):
        def refuse(self, req, view):  # type: ignore[no-untyped-def]
            return "tenant small refused" if req.tenant == "small" else None

    raw = _two_tenants(200)
    raw["workload"]["arrival"]["rate"] = 4.0  # light load: nobody waits long, so no window has two backlogged
    del raw["variants"]
    [fair] = [s["fairness"] for s in servesim.run(raw, policy=RefuseSmall()).summary.values()]
    assert fair["served_share_jain_index"] == 0.5 and fair["jain_index"] == 0.5
    [fcfs] = [s["fairness"] for s in servesim.run(raw).summary.values()]  # the same load served in full: fair
    assert fcfs["jain_index"] == fcfs["served_share_jain_index"] == 1.0
