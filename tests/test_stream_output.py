"""requests.csv written a chunk of requests at a time, column by column (issue 40, item 3): the same bytes as the
row-by-row writer it replaced, whatever the chunk size, for every kind of request a run records."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

import numpy as np
import pytest

from sim.metrics.columns import CLASS_COLUMNS, REQUEST_COLUMNS, class_cells, request_latencies
from sim.metrics.records import REQUEST_FIELDS, RequestRecord, RunResult, has_classes
from sim.output.run_folder import _ABSENT, _LISTS, _join_times, requests_csv, write_requests_csv


def row_by_row(results: list[RunResult]) -> str:
    """The writer before issue 40: one row per record, its cells from request_latencies and class_cells."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    classes = any(has_classes(res.requests) for res in results)
    w.writerow(("variant",) + REQUEST_COLUMNS + (CLASS_COLUMNS if classes else ()))
    for res in results:
        for r in sorted(res.requests, key=lambda r: r.id):
            values = [getattr(r, f) for f in REQUEST_FIELDS]
            cells = [_join_times(v) if many else "" if gone and v < 0 else v
                     for v, gone, many in zip(values, _ABSENT, _LISTS, strict=True)]
            w.writerow([res.name, *cells, *request_latencies(r), *(class_cells(r) if classes else [])])
    return buf.getvalue()


def records(n: int, seed: int, classes: bool) -> list[RequestRecord]:
    """Seeded records of every kind: completed (one and many tokens, never scheduled by observe), rejected,
    failed after preemptions, sessions or none, an int arrival of 0 as a trace gives it, and class fields."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = int(rng.integers(5))
        arrival = 0 if i == 0 else float(rng.uniform(0, 100))
        first = arrival + float(rng.exponential(0.1))
        token = first + float(rng.exponential(0.05))
        finish = token + float(rng.exponential(2.0))
        out_tok = 1 if kind == 1 else int(rng.integers(2, 500))
        pre = tuple(float(x) for x in np.sort(rng.uniform(first, finish, int(rng.integers(0, 3)))))
        outcome, reason = ("rejected", "prompt too long") if kind == 2 else \
            ("failed", "cancelled, with a comma") if kind == 3 else ("completed", "")
        out.append(RequestRecord(
            i, arrival, -1.0 if kind in (2, 4) else first, -1.0 if kind == 2 else token, finish,
            int(rng.integers(1, 4000)), 0 if kind == 2 else out_tok, out_tok, len(pre), outcome, reason,
            int(rng.integers(3)), -1 if kind == 0 else int(rng.integers(50)), pre, pre[:-1] if kind == 3 else pre,
            *((int(rng.integers(3)), f"t{kind}", "gold" if kind else "", 1.5 if kind == 1 else -1.0, -1.0)
              if classes else ()),
        ))
    rng.shuffle(out)  # a writer sorts by id
    return out


def run_of(name: str, recs: list[RequestRecord]) -> RunResult:
    return RunResult(name=name, requests=recs, steps={}, itl_gaps=np.zeros(0), itl_counts=np.zeros(0, dtype=np.int64),
                     duration=100.0, peak_flops=0.0, kv_capacity_blocks=0, block_size=16)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("classes", [False, True])
def test_chunked_requests_csv_equals_row_by_row(chunk: int, classes: bool) -> None:
    results = [run_of("a", records(300, 1, classes)), run_of("b,quoted", records(211, 2, False))]
    whole = row_by_row(results)
    assert ("slo_class" in whole.partition("\n")[0]) is classes
    buf = io.StringIO()
    write_requests_csv(buf, results, chunk=chunk)
    assert buf.getvalue() == whole
    assert requests_csv(results) == whole


def test_requests_csv_quotes_text_cells_as_csv_does() -> None:
    """The text cells (variant name, reason, tenant, class) written through the format, quoted as csv.writer
    quotes them: quotes doubled, commas and line breaks inside quotes, an empty text an empty cell."""
    recs = records(40, 3, True)
    odd = ['say "hi"', "a,b", "two\nlines", "cr\rhere", ""]
    recs = [replace(r, reason=odd[i % 5], tenant=odd[(i + 1) % 5], slo_class=odd[(i + 2) % 5])
            for i, r in enumerate(recs)]
    results = [run_of('v "1",\nx', recs), run_of("plain", records(9, 4, False))]
    text = requests_csv(results)
    assert text == row_by_row(results)
    assert '"say ""hi"""' in text and '"v ""1"",\nx"' in text


def test_steps_csv_equals_the_csv_writers_rows() -> None:
    """steps.csv's rows, through the format, are those csv.writer writes of the same cells (a variant name with a
    quote, a comma and a line break; floats with repr, ints with str)."""
    from sim.metrics.columns import STEP_CSV_COLUMNS
    from sim.metrics.records import STEP_COLUMNS
    from sim.output.run_folder import steps_csv

    rng = np.random.default_rng(5)
    n = 50
    steps = {k: (rng.random(n) * 10.0 ** rng.integers(-8, 9, n)) if t is np.float64 else rng.integers(0, 9000, n)
             for k, t in STEP_COLUMNS.items()}
    results = [replace(run_of('v "2",\nb', []), steps=steps), replace(run_of("plain", []), steps=steps)]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("variant",) + STEP_CSV_COLUMNS)
    for res in results:
        w.writerows([res.name, *(np.asarray(res.steps[k], dtype=t)[i].item() for k, t in STEP_COLUMNS.items())]
                    for i in range(n))
    assert steps_csv(results) == buf.getvalue()
