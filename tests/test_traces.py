"""Trace readers: counts, rates and shapes of the shipped traces, replay transforms, and error messages."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim.workload import traces
from sim.workload.traces import TRACE_DIR, TRACES, load_trace

# From sim/workload/data/traces/NOTICE.md: requests, mean rate (req/s), mean prompt and mean output tokens.
SHAPES = {
    "azure-code": (8819, 2.57, 2048, 28),
    "azure-conv": (19366, 5.53, 1155, 211),
    "mooncake": (12031, 3.40, 12035, 343),
}


def _lines(path: Path) -> int:
    """Requests in a file: data lines, counting a last line without its newline."""
    with open(path, encoding="utf-8") as f:
        n = sum(1 for line in f if line.strip())
    return n - 1 if path.suffix == ".csv" else n  # the CSV header


def _azure_rows(name: str) -> list[tuple[int, int]]:
    with open(TRACE_DIR / TRACES[name], newline="") as f:
        return [(int(r[1]), int(r[2])) for r in list(csv.reader(f))[1:]]


@pytest.mark.parametrize("name", list(SHAPES))
def test_shipped_trace_counts_rates_and_means(name: str) -> None:
    n, rate, prompt_mean, output_mean = SHAPES[name]
    t = load_trace(name)
    assert len(t) == n == _lines(TRACE_DIR / TRACES[name])
    assert t.arrival.dtype == np.float64 and t.prompt_len.dtype == np.int64 and t.output_len.dtype == np.int64
    assert t.arrival[0] == 0.0 and np.all(np.diff(t.arrival) >= 0)
    assert t.mean_rate == pytest.approx(rate, abs=0.005)  # NOTICE rounds to 2 decimals
    assert t.prompt_len.mean() == pytest.approx(prompt_mean, abs=0.5)
    assert t.output_len.mean() == pytest.approx(output_mean, abs=0.5)
    assert t.prompt_len.min() >= 1 and t.output_len.min() >= 1
    assert not t.arrival.flags.writeable  # the parse cache cannot be corrupted
    assert (t.hash_ids is not None) == (name == "mooncake")


def test_azure_timestamps_are_exact() -> None:
    code = load_trace("azure-code")
    # 18:17:03.9799600 -> 18:17:04.0319600 -> 18:17:04.0...: integer ns, then one rounding.
    assert code.arrival[1] == 0.052
    conv = load_trace("azure-conv")
    # 18:15:46.6805900 -> 19:14:08.4025270
    assert conv.arrival[-1] == 3501.721937


def test_azure_pairs_are_kept_in_file_order() -> None:
    t = load_trace("azure-conv")
    rows = np.array(_azure_rows("azure-conv"))
    np.testing.assert_array_equal(t.prompt_len, rows[:, 0])
    np.testing.assert_array_equal(t.output_len, rows[:, 1])


def test_mooncake_hash_ids_cover_the_prompt() -> None:
    t = load_trace("mooncake")
    assert t.hash_block_size == 512 and t.hash_ids is not None
    assert t.hash_ids[0] == tuple(range(14))
    assert all(len(h) == math.ceil(p / 512) for h, p in zip(t.hash_ids, t.prompt_len.tolist(), strict=True))
    with open(TRACE_DIR / TRACES["mooncake"]) as f:
        first = json.loads(f.readline())
    assert (t.prompt_len[0], t.output_len[0]) == (first["input_length"], first["output_length"])


def test_fast_and_row_parsers_agree() -> None:
    for name in ("azure-code", "azure-conv"):
        path = str(TRACE_DIR / TRACES[name])
        for fast, slow in zip(traces._read_azure(path), traces._read_azure_rows(path), strict=True):
            np.testing.assert_array_equal(fast, slow)


def test_window_selects_original_seconds() -> None:
    full = load_trace("azure-conv")
    w = load_trace("azure-conv", start=600.0, end=1200.0)
    keep = (full.arrival >= 600.0) & (full.arrival < 1200.0)
    assert len(w) == keep.sum() > 0
    np.testing.assert_array_equal(w.arrival, full.arrival[keep] - full.arrival[keep][0])
    np.testing.assert_array_equal(w.prompt_len, full.prompt_len[keep])
    np.testing.assert_array_equal(w.output_len, full.output_len[keep])
    # Open end and max_requests.
    tail = load_trace("azure-conv", start=3000.0)
    assert len(tail) == (full.arrival >= 3000.0).sum()
    head = load_trace("azure-conv", start=600.0, max_requests=10)
    np.testing.assert_array_equal(head.prompt_len, full.prompt_len[keep][:10])


def test_time_and_rate_scale_combine_as_one_factor() -> None:
    base = load_trace("azure-code")
    half_time = load_trace("azure-code", time_scale=0.5)
    double_rate = load_trace("azure-code", rate_scale=2.0)
    np.testing.assert_array_equal(half_time.arrival, base.arrival * 0.5)
    np.testing.assert_array_equal(double_rate.arrival, half_time.arrival)
    assert half_time.duration == base.duration / 2
    both = load_trace("azure-code", time_scale=0.5, rate_scale=2.0)
    assert both.duration == base.duration / 4
    assert both.mean_rate == pytest.approx(4 * base.mean_rate, rel=1e-12)
    third = load_trace("azure-code", time_scale=2.0, rate_scale=3.0)
    np.testing.assert_array_equal(third.arrival, base.arrival * (2.0 / 3.0))
    np.testing.assert_array_equal(third.prompt_len, base.prompt_len)  # lengths untouched


def test_repeat_to_tiles_the_window() -> None:
    w = load_trace("azure-conv", end=300.0, rate_scale=2.0)
    m = len(w)
    n = 100_000
    t = load_trace("azure-conv", end=300.0, rate_scale=2.0, repeat_to=n)
    assert len(t) == n
    assert np.all(np.diff(t.arrival) >= 0)
    shift = w.duration + w.duration / (m - 1)
    for k in (1, 2, n // m):
        chunk = slice(k * m, min((k + 1) * m, n))
        length = chunk.stop - chunk.start
        np.testing.assert_allclose(t.arrival[chunk], w.arrival[:length] + k * shift, rtol=1e-12)
        np.testing.assert_array_equal(t.prompt_len[chunk], w.prompt_len[:length])
        np.testing.assert_array_equal(t.output_len[chunk], w.output_len[:length])
    # The gap across a seam is one mean gap.
    assert t.arrival[m] - t.arrival[m - 1] == pytest.approx(w.duration / (m - 1))
    # Fewer than the window: a cut.
    short = load_trace("azure-conv", end=300.0, repeat_to=5)
    np.testing.assert_array_equal(short.arrival, load_trace("azure-conv", max_requests=5).arrival)


def test_repeat_to_gives_copies_their_own_prefix_ids() -> None:
    w = load_trace("mooncake", max_requests=100)
    t = load_trace("mooncake", max_requests=100, repeat_to=250)
    assert t.hash_ids is not None and w.hash_ids is not None and len(t.hash_ids) == 250
    assert t.hash_ids[:100] == w.hash_ids
    first = {h for ids in t.hash_ids[:100] for h in ids}
    second = {h for ids in t.hash_ids[100:200] for h in ids}
    assert not first & second
    # Sharing inside a copy is kept: equal ids in the window stay equal in the copy.
    assert (t.hash_ids[100][0] == t.hash_ids[101][0]) == (w.hash_ids[0][0] == w.hash_ids[1][0])
    assert [len(h) for h in t.hash_ids[100:200]] == [len(h) for h in w.hash_ids]


# ---------------------------------------------------------------------------------------------------------------
# Errors and edge cases, on small files written for the test.

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_trace(missing)
    with pytest.raises(FileNotFoundError, match="azure-cod"):
        load_trace("azure-cod")  # a misspelt name is read as a path


@pytest.mark.parametrize(
    ("body", "line", "what"),
    [
        ("2023-11-16 18:00:00.0000000,10,5\n2023-11-16 18:00:01.0000000,ten,5\n", 3, "ContextTokens"),
        ("2023-11-16 18:00:00.0000000,10,5\n2023-11-16 18:00:01.0000000,10,-5\n", 3, "GeneratedTokens"),
        ("2023-11-16 18:00:00.0000000,10,5\n2023-11-16 18:00:01.0000000,10,5\n2023-11-16 18:0x:02,1,1\n", 4,
         "TIMESTAMP"),
        ("2023-11-16 18:00:00.0000000,10,5\n2023-02-30 18:00:01.0000000,10,5\n", 3, "TIMESTAMP"),
        ("2023-11-16 18:00:00.0000000,10\n", 2, "fields"),
    ],
)
def test_malformed_csv_row_names_file_and_line(tmp_path: Path, body: str, line: int, what: str) -> None:
    path = _write(tmp_path, "bad.csv", HEADER + body)
    with pytest.raises(ValueError, match=f"bad.csv:{line}: .*{what}"):
        load_trace(path)


def test_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
    path = _write(tmp_path, "bad.jsonl", good + '{"timestamp": 5, "input_length": 10,\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        load_trace(path)
    path = _write(tmp_path, "miss.jsonl", good + good + '{"timestamp": 5, "output_length": 2}\n')
    with pytest.raises(ValueError, match="miss.jsonl:3: missing field 'input_length'"):
        load_trace(path)
    path = _write(tmp_path, "float.jsonl", good + '{"timestamp": 5, "input_length": 10.5, "output_length": 2}\n')
    with pytest.raises(ValueError, match="float.jsonl:2: input_length must be an integer"):
        load_trace(path)


def test_other_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(_write(tmp_path, "t.txt", "x"))
    with pytest.raises(ValueError, match="columns .* name no prompt and output lengths; map them"):
        load_trace(_write(tmp_path, "h.csv", "time,in,out\n"))
    with pytest.raises(ValueError, match="no requests"):
        load_trace(_write(tmp_path, "empty.csv", HEADER))
    with pytest.raises(ValueError, match="no requests in the window"):
        load_trace("azure-code", start=1e6)
    with pytest.raises(ValueError, match="at least 2 requests"):
        load_trace("azure-code", max_requests=1, repeat_to=10)
    for kwargs in ({"time_scale": 0.0}, {"rate_scale": -1.0}, {"start": 5.0, "end": 5.0}, {"repeat_to": 0}):
        with pytest.raises(ValueError):
            load_trace("azure-code", **kwargs)


def test_zero_lengths_are_clamped_and_disorder_sorted(tmp_path: Path) -> None:
    body = (
        "2023-11-16 23:59:59.5000000,0,7\n"
        "2023-11-16 23:59:58.2500000,30,0\n"  # earlier than the row above
        "2023-11-17 00:00:01.0000001,40,9\n"  # across midnight, 100 ns resolution
    )
    t = load_trace(_write(tmp_path, "z.csv", HEADER + body))
    np.testing.assert_array_equal(t.arrival, [0.0, 1.25, 2.7500001])
    np.testing.assert_array_equal(t.prompt_len, [30, 1, 40])
    np.testing.assert_array_equal(t.output_len, [1, 7, 9])


def test_row_reader_handles_quoting_and_column_order(tmp_path: Path) -> None:
    text = 'GeneratedTokens,TIMESTAMP,ContextTokens\n"5",2023-11-16 18:00:00,"10"\n6,2023-11-16T18:00:02.5,11\n'
    t = load_trace(_write(tmp_path, "q.csv", text))
    np.testing.assert_array_equal(t.arrival, [0.0, 2.5])
    np.testing.assert_array_equal(t.prompt_len, [10, 11])
    np.testing.assert_array_equal(t.output_len, [5, 6])


# ---------------------------------------------------------------------------------------------------------------
# A user's own trace: other column names, plain seconds, CSV or JSONL.


def test_own_csv_in_plain_seconds_with_common_names(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path, "mine.csv", "arrival_s,prompt_tokens,output_tokens\n0.5,12,3\n2.25,40,9\n1.0,7,1\n"))
    np.testing.assert_array_equal(t.arrival, [0.0, 0.5, 1.75])  # sorted, relative to the first
    np.testing.assert_array_equal(t.prompt_len, [12, 7, 40])
    np.testing.assert_array_equal(t.output_len, [3, 1, 9])


def test_own_jsonl_through_a_column_mapping(tmp_path: Path) -> None:
    from sim.workload.trace_columns import TraceColumns

    body = '{"t": 1000, "in": 5, "out": 2, "user": "a"}\n{"t": 1250, "in": 6.0, "out": 3}\n'
    t = load_trace(_write(tmp_path, "mine.jsonl", body), columns=TraceColumns("t", "in", "out", "ms"))
    np.testing.assert_array_equal(t.arrival, [0.0, 0.25])
    np.testing.assert_array_equal(t.prompt_len, [5, 6])
    with pytest.raises(ValueError, match=r"mine.jsonl: no column 'tokens_in'"):
        load_trace(tmp_path / "mine.jsonl", columns=TraceColumns("t", "tokens_in", "out", "ms"))
    with pytest.raises(ValueError, match=r"mine2.jsonl:2: t must be a number of ms, got 'soon'"):
        load_trace(_write(tmp_path, "mine2.jsonl", '{"t": 1, "in": 5, "out": 2}\n{"t": "soon", "in": 5, "out": 2}\n'),
                   columns=TraceColumns("t", "in", "out", "ms"))
    with pytest.raises(ValueError, match="time_unit must be one of"):
        TraceColumns("t", "in", "out", "hours")


def test_own_trace_in_a_scenario(tmp_path: Path) -> None:
    """A scenario replays a user's CSV with renamed columns and dates; a mapping naming a missing column is one
    clear error naming the key."""
    from sim.config.scenario import parse_scenario
    from sim.config.schema import ScenarioError
    from sim.loop.run import run_scenario

    path = _write(tmp_path, "log.csv", "when,req_in,req_out\n2026-01-01 10:00:00,30,4\n2026-01-01 10:00:02.5,50,6\n")
    arrival = {"type": "trace", "trace": str(path),
               "columns": {"timestamp": "when", "prompt_len": "req_in", "output_len": "req_out",
                           "time_unit": "datetime"}}
    sc = {"name": "own", "workload": {"arrival": arrival}, "deployment": {"model": "llama-3.1-8b", "gpu": "a100-80gb"}}
    (res,) = run_scenario(parse_scenario(sc)).results
    assert sorted((r.arrival, r.prompt_tokens) for r in res.requests) == [(0.0, 30), (2.5, 50)]
    bad = {**arrival, "columns": {**arrival["columns"], "prompt_len": "tokens"}}
    with pytest.raises(ScenarioError, match=r"workload\.arrival\.trace: .*log.csv: no column 'tokens'"):
        parse_scenario({**sc, "workload": {"arrival": bad}})
    with pytest.raises(ScenarioError, match="needs its arrival-time column"):
        parse_scenario({**sc, "workload": {"arrival": {**arrival, "columns": {"timestamp": None}}}})


def test_a_missing_length_column_is_named(tmp_path: Path) -> None:
    """Issue 35: a trace lacking only its output-length column was told it named "no prompt and output lengths"."""
    with pytest.raises(ValueError, match=r"name the prompt lengths \(prompt_tokens\) but no output lengths \(looked "
                                         r"for output_len, output_tokens, "):
        load_trace(_write(tmp_path, "p.csv", "arrival_s,prompt_tokens\n0.1,10\n0.2,20\n"))
    with pytest.raises(ValueError, match=r"name the output lengths \(output_length\) but no prompt lengths"):
        load_trace(_write(tmp_path, "o.jsonl", '{"timestamp": 0, "output_length": 2}\n'))
    # and so does the command, with exit 2
    from typer.testing import CliRunner

    from sim.cli.main import app

    doc = {"name": "t", "workload": {"arrival": {"type": "trace", "trace": str(tmp_path / "p.csv")}},
           "deployment": {"model": "llama-3.2-1b", "gpu": "l4"}}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "s.json"), "-q", "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "name the prompt lengths (prompt_tokens) but no output lengths" in res.stderr


def test_a_lengths_only_file_is_refused_as_arrivals(tmp_path: Path) -> None:
    """Vidur's CSV (lengths, no time column) as `arrival: trace` sent every request at 0.0, a burst nobody asked
    for (exit 0); `columns: {timestamp: null}` was already refused. Its lengths still load, as pairs do."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    path = _write(tmp_path, "v.csv", "num_prefill_tokens,num_decode_tokens\n30,4\n50,6\n")
    assert not load_trace(path).timed and load_trace(path).prompt_len.tolist() == [30, 50]
    doc = {"name": "t", "workload": {"arrival": {"type": "trace", "trace": str(path)}},
           "deployment": {"model": "llama-3.2-1b", "gpu": "l4"}}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "s.json"), "-q", "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert f"{path}: no arrival-time column, so it cannot be replayed as arrivals" in res.stderr
    assert not (tmp_path / "out").exists()
    assert load_trace(_write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0.5,3,4\n")).timed


def test_a_bad_date_in_a_mapped_column_names_that_column(tmp_path: Path) -> None:
    # A user's log whose dates carry a time zone: the message named Azure's TIMESTAMP column, which the file does
    # not have, and did not say what in the value was wrong.
    from sim.workload.trace_columns import TraceColumns

    path = _write(tmp_path, "log.csv", "sent_at,tin,tout\n2024-01-01 00:00:00,10,2\n2024-01-01 00:00:03+00:00,10,2\n")
    with pytest.raises(ValueError) as e:
        load_trace(path, columns=TraceColumns("sent_at", "tin", "tout", "datetime"))
    assert str(e.value) == (f"{path}:3: bad sent_at '2024-01-01 00:00:03+00:00' (expected YYYY-MM-DD "
                            "HH:MM:SS.fffffff, without a time zone)")
