"""A long run's requests leave memory as they finish (sim.metrics.request_table): every output must be what the
run would have written keeping them. The threshold (STREAM_MIN) is lowered so that small runs take the streamed
path, and the chunks are made small so that a run spans many."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sim.loop.run as run_module
import sim.metrics.request_table as table_module
from sim.cli.main import app
from sim.config.scenario import load_scenario, variant_configs
from sim.loop.run import generate_workload, simulate_variant
from sim.metrics.records import RequestRecord, RunResult
from sim.metrics.request_table import RequestTable
from sim.output.run_folder import requests_csv, write_requests_csv

ROOT = Path(__file__).resolve().parent.parent

# (scenario, its options): request classes, tenants and priority preemptions; failures, a leak and rejections
CASES = {
    "classes-priority": ["-n", "300"],
    "failure-leak": ["-n", "3000"],
}


def _folder(scenario: str, args: list[str], out: Path) -> dict[str, str]:
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / f"{scenario}.yaml"), "--out", str(out), "-q",
                                   *args])
    assert res.exit_code == 0, res.output
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_streamed_run_writes_the_same_bytes(scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _folder(scenario, CASES[scenario], tmp_path / "kept")
    monkeypatch.setattr(run_module, "STREAM_MIN", 0)
    monkeypatch.setattr(table_module, "CHUNK", 37)
    streamed = _folder(scenario, CASES[scenario], tmp_path / "streamed")
    assert "requests.csv" in kept and "summary.json" in kept
    assert streamed == kept


def test_table_reads_back_every_record(monkeypatch: pytest.MonkeyPatch) -> None:
    sc, _ = load_scenario(ROOT / "scenarios" / "failure-leak.yaml", {"workload.num_requests": 3000})
    cfg = variant_configs(sc)[1]  # leaky-40gb: preemptions, failures and rejections
    wl = generate_workload(sc)
    kept, _, _ = simulate_variant(cfg, wl)
    monkeypatch.setattr(run_module, "STREAM_MIN", 0)
    monkeypatch.setattr(table_module, "CHUNK", 50)
    streamed, reqs, core = simulate_variant(cfg, wl)
    table = streamed.requests
    assert isinstance(table, RequestTable) and isinstance(kept.requests, list)
    assert reqs == [] and len(core.done) < 50  # the requests left memory as they finished
    assert list(table) == kept.requests
    assert table[5] == kept.requests[5] and table[-1] == kept.requests[-1] and table[10:20] == kept.requests[10:20]
    assert {r.outcome for r in table} == {"completed", "failed", "rejected"}
    assert any(r.preempted_at for r in table)
    assert (table.outcome_is("rejected").sum() == sum(r.outcome == "rejected" for r in kept.requests))
    assert streamed.duration == kept.duration


def test_a_tables_records_are_made_without_the_frozen_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a table's rows back as records goes through RequestRecord's twin (plain slot stores, 3.5-4 ->
    about 1.8 us a record), not its frozen ``__init__``: the records are RequestRecords equal to those put in,
    hashed alike and still frozen. Int times (a trace's first arrival at 0) and spans come back as they went in."""
    from sim.metrics.request_table import as_table

    recs = [RequestRecord(i, 0 if i == 0 else 0.5 * i, 1.0 * i, 1.5 * i, 2.0 * i, 10 + i, 3, 3, i % 2,
                          "completed" if i % 3 else "failed", "" if i % 3 else "lost", i % 4, -1,
                          (0.25 * i,) if i % 2 else (), (0.3 * i,) if i % 2 else ()) for i in range(40)]
    table = as_table(recs)
    made = []
    init = RequestRecord.__init__

    def counted(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(RequestRecord, "__init__", counted)
    back = list(table)
    assert not made
    assert back == recs and [hash(r) for r in back] == [hash(r) for r in recs]
    assert all(type(r) is RequestRecord for r in back) and type(back[0].arrival) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        back[1].finish = 0.0  # type: ignore[misc]


def test_energy_attributed_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """sim.costs.energy reads a log's steps a block at a time, continuing each running sum from the block before:
    each request's energy equals, bit for bit, what the whole columns give."""
    import dataclasses

    import numpy as np

    import sim.costs.energy as energy

    sc, _ = load_scenario(ROOT / "scenarios" / "failure-leak.yaml", {"workload.num_requests": 1500})
    result, _, _ = simulate_variant(variant_configs(sc)[1], generate_workload(sc))
    e = energy.run_energy(result)
    assert e is not None and len(result.steps["start"]) > 10_000
    whole = dataclasses.replace(result, steps={k: np.asarray(v) for k, v in result.steps.items()})
    expected = energy.attribute(whole, e.step_energy_j, e.energy_j)
    monkeypatch.setattr(energy, "ATTRIBUTE_ROWS", 777)
    got = energy.attribute(result, e.step_energy_j, e.energy_j)
    assert got.tobytes() == expected.tobytes() and expected.sum() > 0


def test_in_columns_only_for_records_in_id_order() -> None:
    """write_run reads a run's records as one set of columns (in_columns); records out of id order stay a list,
    since a RequestTable is read as being in id order (by_id returns it as it is)."""
    sc, _ = load_scenario(ROOT / "scenarios" / "failure-leak.yaml", {"workload.num_requests": 200})
    kept, _, _ = simulate_variant(variant_configs(sc)[1], generate_workload(sc))
    table = table_module.in_columns(kept.requests)
    assert isinstance(table, RequestTable) and list(table) == kept.requests
    shuffled = kept.requests[1:] + kept.requests[:1]
    assert table_module.in_columns(shuffled) is shuffled
    assert table_module.by_id(table_module.in_columns(shuffled)) == kept.requests


@pytest.mark.parametrize("classes", [False, True])
def test_requests_csv_from_columns_equals_from_records(classes: bool) -> None:
    """requests.csv's rows of a RequestTable come from its columns (fields_of), not from records made again: the
    cells equal those of the records themselves, byte for byte: times that were the Python int 0 (and latencies
    of ints), empty cells for what never happened, joined preemption times, classes and SLOs."""
    recs = [
        RequestRecord(0, 0, 0, 0.25, 1, 5, 3, 3, 0, "completed", "", 0, -1),  # int times: int latencies
        RequestRecord(1, 0, 0.5, 0.75, 2.0, 5, 1, 1, 0, "completed", "", 1, 7),  # one token: no TPOT
        RequestRecord(2, 0.1, 0.2, 0.4, 0.9, 9, 4, 4, 2, "completed", "", 0, 7, (0.3, 0.5), (0.35, 0.6)),
        RequestRecord(3, 0.2, -1.0, -1.0, 0.2, 9, 0, 4, 0, "rejected", "too long", 0, -1),
        RequestRecord(4, 0.3, 0.3, 0.5, 0.6, 9, 2, 8, 1, "failed", "kv leak", 1, -1, (0.55,), ()),
        RequestRecord(5, 1 / 3, 0.4, 0.7, 1.1, 2, 3, 3, 0, "completed", "", 0, -1),
    ]
    if classes:
        recs = [dataclasses.replace(r, priority=r.id % 2, tenant=f"t{r.id % 3}", slo_class="gold" if r.id else "",
                                    ttft_slo=0 if r.id == 1 else 0.5 * r.id - 1, tpot_slo=0.05) for r in recs]
    empty = np.zeros(0)
    listed = RunResult("v", recs, {}, empty, empty, 1.0, 1.0, 10, 16)
    table = table_module.as_table(recs)
    assert isinstance(table, RequestTable) and table.column("id").tolist() == [r.id for r in recs]
    columns = dataclasses.replace(listed, requests=table)
    text = requests_csv([listed])
    assert requests_csv([columns]) == text
    assert ",0,0,0.25,1," in text and ",0.3;0.5,0.35;0.6," in text and ",too long," in text
    buf = io.StringIO()
    write_requests_csv(buf, [columns], chunk=4)  # rows lo..hi of the table, chunk by chunk
    assert buf.getvalue() == text


@pytest.mark.parametrize("rows", [1, 7, 1000])
def test_vllm_bench_lists_written_a_block_at_a_time(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vllm-bench JSON's per-request lists are made ``rows`` requests at a time as the file is written: the
    same bytes as json.dumps of the whole result, for a streamed run (rejections, failures, energies_j) and for
    hand-made records (times that were the Python int 0, an empty reason)."""
    import json
    import math

    from sim.output.benchfiles.export_vllm import vllm_bench_result, vllm_bench_writer

    sc, _ = load_scenario(ROOT / "scenarios" / "failure-leak.yaml", {"workload.num_requests": 1500})
    monkeypatch.setattr(run_module, "STREAM_MIN", 0)
    streamed, _, _ = simulate_variant(variant_configs(sc)[1], generate_workload(sc))
    recs = [RequestRecord(0, 0, 0, 0.25, 1, 5, 3, 3, 0, "completed", "", 0, -1),
            RequestRecord(1, 0.2, -1.0, -1.0, 0.2, 9, 0, 4, 0, "rejected", "", 0, -1),
            RequestRecord(2, 0.3, 0.3, 0.5, 0.6, 9, 2, 8, 1, "failed", "kv leak", 1, -1, (0.55,), ())]
    empty = np.zeros(0)
    hand = RunResult("v", recs, {}, empty, empty, 1.0, 1.0, 10, 16)
    texts = []
    for result in (streamed, hand):
        whole = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                 for k, v in vllm_bench_result(result, request_rate=4.0).items()}
        buf = io.StringIO()
        vllm_bench_writer(result, request_rate=4.0, rows=rows)(buf)
        assert buf.getvalue() == json.dumps(whole)
        texts.append(json.loads(buf.getvalue()))
    assert isinstance(streamed.requests, RequestTable) and len(texts[0]["energies_j"]) == 1500
    assert any(texts[0]["errors"]) and not all(texts[0]["errors"])
    assert texts[1]["start_times"] == [0, 0.2, 0.3] and texts[1]["errors"] == ["", "rejected", "kv leak"]


def test_columns_are_kept_compact_and_read_back_in_their_dtypes() -> None:
    """A table keeps a column whose values are all the same (bit for bit: -0.0 is not 0.0) as one value, and
    integers in the narrowest dtype that holds them (128 bytes a request were most of a long run's memory);
    read back, each column has its dtype and the very values, selected or not, and the records are the same."""
    recs = [RequestRecord(i, 0.5 * i, 0.5 * i, 0.6 * i, 1.0 + i, 100 + 600 * i, 3, 3, 0, "completed", "", 0, -1)
            for i in range(50)]
    recs[7] = dataclasses.replace(recs[7], num_preemptions=70_000, first_token=-0.0)
    sink = table_module.RequestSink()
    for r in recs:
        sink.add_record(r)
    table = sink.table()
    kept = table._numeric
    assert kept["replica"].strides == (0,) and kept["ttft_slo"].strides == (0,)  # one value each
    assert kept["prompt_tokens"].dtype == np.int16 and kept["id"].dtype == np.int8
    assert kept["num_preemptions"].dtype == np.int32 and kept["first_token"].strides != (0,)
    assert table._codes["outcome"].strides == (0,)
    for name in ("replica", "prompt_tokens", "num_preemptions", "ttft_slo", "first_token"):
        col = table.column(name)
        assert col.dtype == (np.float64 if name in ("ttft_slo", "first_token") else np.int64)
        assert col.tolist() == [getattr(r, name) for r in recs]
    assert np.signbit(table.column("first_token")[7])
    assert list(table) == recs
    some = table.select(table.column("id") % 3 == 0)
    assert list(some) == recs[::3] and some._numeric["replica"].strides == (0,)
    assert table.text("outcome")[0].dtype == np.int32 and table.outcome_is("completed").all()


def _sink_of(ids: list[int], chunk: int, monkeypatch: pytest.MonkeyPatch) -> tuple[table_module.RequestSink, list]:
    monkeypatch.setattr(table_module, "CHUNK", chunk)
    recs = [RequestRecord(i, 0.5 * i, 0.5 * i, 0.6 * i, 1.0 + i, 100 + i % 7, 3 + i % 300, 3, 0, "completed", "",
                          0, -1) for i in ids]
    sink = table_module.RequestSink()
    for r in recs:
        sink.add_record(r)
    return sink, sorted(recs, key=lambda r: r.id)


@pytest.mark.parametrize("first", [True, False])
def test_requests_received_out_of_order_are_placed_in_id_order(first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # ids 0..n-1 (a run's) are placed at their rows; other ids are sorted: the same columns either way
    rng = np.random.default_rng(2)
    ids = rng.permutation(2000) if first else rng.choice(10_000, 2000, replace=False)
    sink, want = _sink_of(ids.tolist(), 64, monkeypatch)
    table = sink.table()
    assert list(table) == want and table.in_id_order()
    assert table._numeric["prompt_tokens"].dtype == np.int8 and table._numeric["output_tokens"].dtype == np.int16
    assert table._numeric["session_id"].strides == (0,)


def test_placing_a_long_run_in_id_order_holds_a_column_not_its_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    # 200,000 requests received out of order: the joined int64 ids, their order, each joined column and its
    # reordered copy were held beside the chunks and the columns made; placed at their ids, one column at a time
    import tracemalloc

    n = 200_000
    ids = np.arange(n).reshape(-1, 1000)[:, ::-1].ravel()  # finished out of order within each thousand
    sink, _ = _sink_of(ids.tolist(), 1 << 15, monkeypatch)
    sink.flush()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        table = sink.table()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert table.in_id_order() and table.column("id")[-1] == n - 1
    assert peak < 44 * n  # the table it makes is some 36 bytes a request (52 at the peak before)


def test_the_run_folder_reads_the_columns_the_summary_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run below STREAM_MIN keeps a list of records; its summary and its run folder both read them as columns,
    which were made twice (0.09 s each of a 20,000-request run). The folder now reads the summary's (the bytes are
    the pinned outputs' concern)."""
    sc, raw = load_scenario(ROOT / "scenarios" / "classes-priority.yaml", {"workload.num_requests": 50})
    made: list[int] = []
    table = table_module.RequestSink.table

    def counted(self: table_module.RequestSink, *, sort: bool = True) -> RequestTable:
        made.append(self.count)
        return table(self, sort=sort)

    monkeypatch.setattr(table_module.RequestSink, "table", counted)
    run = run_module.run_scenario(sc, raw)
    assert isinstance(run.results[0].requests, list)  # the result keeps its records, as it always did
    assert made == [50] * len(run.results)  # one table per variant, by its summary
    run_module.write_scenario_run(run, tmp_path / "run")
    # and none made again of a whole run for the folder (its report makes tables of each class's requests)
    assert made.count(50) == len(run.results) and len(made) > len(run.results)
    table_module.as_table(run.results[0].requests)  # outside: a list read once is made into a table
    assert made.count(50) == len(run.results) + 1
