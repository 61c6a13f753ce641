"""The summary's per-request readers on a long run (issue 40, item 3): what each holds at once, and that the
shortcuts a long run takes give what the general path gives, to the bit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_bounded_writes import peak_bytes, table_of

import sim.metrics.request_table as table_module
from sim.metrics.anomalies import _in_priority_order
from sim.metrics.request_table import RequestTable, compact
from sim.metrics.verdict import _waiting_spans


def sorted_order(table: RequestTable) -> bool:
    """_in_priority_order as it was: the lexsort of every scheduled request by replica, arrival, priority, id."""
    sched = table.column("first_scheduled")
    keep = sched >= 0
    replica, sched = table.column("replica")[keep], sched[keep]
    order = np.lexsort((table.column("id")[keep], table.column("priority")[keep], table.column("arrival")[keep],
                        replica))
    replica, sched = replica[order], sched[order]
    same = replica[1:] == replica[:-1]
    return bool(np.all(sched[1:][same] >= sched[:-1][same]))


def with_column(table: RequestTable, name: str, values: np.ndarray) -> RequestTable:
    numeric = dict(table._numeric)
    numeric[name] = compact(np.asarray(values, dtype=table_module._NUMERIC[name]))
    return RequestTable(numeric, table._codes, table._names, table._tuples, table._ints)


def cases() -> list[RequestTable]:
    out = []
    for seed in range(4):
        t = table_of(300, seed)
        sched = t.column("first_scheduled")
        out.append(t)  # scheduled out of arrival order: some pair inverted
        out.append(with_column(t, "first_scheduled", np.where(sched >= 0, np.arange(300.0), -1.0)))  # in order
        arrival = np.round(t.column("arrival"))  # ties: ordered by id
        out.append(with_column(with_column(t, "arrival", arrival), "first_scheduled",
                               np.where(sched >= 0, arrival + 0.5, -1.0)))
        out.append(with_column(t, "arrival", t.column("arrival")[::-1].copy()))  # arrivals decreasing: sorted
        out.append(with_column(t, "priority", np.arange(300) % 3))  # several priorities: the general path
        out.append(with_column(t, "replica", np.arange(300) % 2))  # several replicas
    return out


@pytest.mark.parametrize("i", range(24))
def test_in_priority_order_is_the_sorted_check(i: int) -> None:
    table = cases()[i]
    assert _in_priority_order(table) == sorted_order(table)


def test_in_priority_order_sees_both_answers() -> None:
    assert {_in_priority_order(t) for t in cases()} == {True, False}


def test_in_priority_order_of_one_replica_holds_two_values_a_request() -> None:
    # 400,000 requests in arrival order on one replica: the lexsort's keys, order and gathered columns were
    # some 44 bytes a request at once (17.7 MB); the arrivals and first steps of the scheduled ones are 16
    table = table_of(400_000)
    assert peak_bytes(sorted_order, table) > 15e6  # for scale
    assert peak_bytes(_in_priority_order, table) < 8e6


def test_waiting_spans_without_preemptions_are_the_arrival_to_the_first_step() -> None:
    table = table_of(2000)
    start, stop = _waiting_spans(SimpleNamespace(requests=table))
    sched, finish = table.column("first_scheduled"), table.column("finish")
    assert np.array_equal(start, table.column("arrival"))
    assert np.array_equal(stop, np.where(sched >= 0, sched, finish))
    assert (sched < 0).any()  # a rejected request's span ends at its finish
    preempted = RequestTable(table._numeric, table._codes, table._names,
                             {"preempted_at": {5: (start[5] + 1.0,)}, "resumed_at": {5: (start[5] + 2.0,)}}, {})
    start2, stop2 = _waiting_spans(SimpleNamespace(requests=preempted))  # the placement: one more span, after 5's
    assert np.array_equal(np.delete(start2, 6), start) and np.array_equal(np.delete(stop2, 6), stop)
    assert (start2[6], stop2[6]) == (start[5] + 1.0, start[5] + 2.0)


def test_waiting_spans_of_one_replica_hold_a_value_a_request() -> None:
    table = table_of(400_000)
    assert peak_bytes(_waiting_spans, SimpleNamespace(requests=table)) < 4.5e6  # the stops: 3.2 MB



@pytest.mark.parametrize("slos", [None, {"ttft": 1.0, "tpot": 0.05}])
def test_summary_drops_the_latencies_before_the_anomalies(slos: dict | None, monkeypatch: pytest.MonkeyPatch) -> None:
    # held to the end, a long run's latencies (41 bytes a request) sat beside every later reader of the table
    import weakref

    from test_energy import _one, _scenario

    import sim.metrics.summary as summary_module
    from sim.config.slos import SLOs

    r, _ = _one(_scenario(arrival={"type": "poisson", "rate": 8.0}, n=80))
    slo = None if slos is None else SLOs(**slos)
    whole = summary_module.summarize(r, slo)
    made: list[weakref.ref] = []
    alive: list[int] = []
    of_table, anomalies = summary_module._Latencies.of_table, summary_module.run_anomalies

    def latencies(table, done):  # type: ignore[no-untyped-def]
        lat = of_table(table, done)
        made.extend(weakref.ref(getattr(lat, f)) for f in ("ttft", "e2el", "queue", "multi", "tpot_all", "out_tok"))
        return lat

    def anomalies_after(*args):  # type: ignore[no-untyped-def]
        alive.append(sum(ref() is not None for ref in made))
        return anomalies(*args)

    monkeypatch.setattr(summary_module._Latencies, "of_table", latencies)
    monkeypatch.setattr(summary_module, "run_anomalies", anomalies_after)
    assert summary_module.summarize(r, slo) == whole
    assert len(made) == 6 and alive == [0]


def test_energy_attribution_of_a_long_run_holds_a_few_values_a_request() -> None:
    # 400,000 requests (a tenth never scheduled), 20,000 steps in blocks: the result's array from the start and
    # the prefill sums kept through the finish pass held 71.5 bytes a request at the peak; 63.5 now
    from sim.costs.energy import _attribute_in_blocks

    n, m = 400_000, 20_000
    table = table_of(n)
    rng = np.random.default_rng(0)
    start = np.linspace(0, float(table.column("finish").max()) + 1, m)
    pf, dec, e = rng.integers(0, 50, m).astype(float), rng.integers(0, 200, m).astype(float), rng.random(m)

    def blocks():  # type: ignore[no-untyped-def]
        for lo in range(0, m, 4096):
            yield lo, start[lo : lo + 4096], pf[lo : lo + 4096], dec[lo : lo + 4096], e[lo : lo + 4096]

    assert peak_bytes(_attribute_in_blocks, table, blocks, 1000.0) < 66 * n
