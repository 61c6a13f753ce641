"""Shares in summary.json stay within [0, 1] (the docs call busy_fraction a share of time)."""

from sim.config.scenario import load_scenario
from sim.loop.run import run_scenario
from sim.studies.teaching import find_scenario


def test_busy_fraction_of_a_gpu_busy_the_whole_run_is_1_not_more() -> None:
    # The continuous server computes from the first arrival to the last finish: the step durations summed in
    # floating point came to 1 + 2e-16 of the run, and summary.json said busy_fraction 1.0000000000000002.
    sc, raw = load_scenario(find_scenario("naive-vs-continuous"), {"workload.num_requests": 200})
    run = run_scenario(sc, raw)
    res, s = run.results[1], run.summaries["continuous"]
    assert float(res.steps["duration"].sum()) / s["duration"] > 1.0  # the rounding the share must not show
    assert s["busy_fraction"] == 1.0
