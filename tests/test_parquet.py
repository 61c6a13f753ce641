"""``servesim run --format parquet``: the run folder's tables as Parquet (pyarrow, an optional extra) hold what
the CSVs hold, and without pyarrow the option is refused before the run starts."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.output.run_folder import read_requests, read_steps

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = str(ROOT / "scenarios" / "memory-ceiling.yaml")


def _run(out: Path, *extra: str) -> None:
    res = CliRunner().invoke(app, ["run", SCENARIO, "-n", "60", "-q", "-o", str(out), *extra])
    assert res.exit_code == 0, res.output


def test_parquet_tables_hold_what_the_csvs_hold(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    _run(tmp_path / "csv")
    _run(tmp_path / "pq", "--format", "parquet")
    pq_dir = tmp_path / "pq"
    assert (pq_dir / "requests.parquet").is_file() and (pq_dir / "steps.parquet").is_file()
    assert not (pq_dir / "requests.csv").exists() and not (pq_dir / "steps.csv").exists()
    assert (pq_dir / "summary.json").read_text() == (tmp_path / "csv" / "summary.json").read_text()
    a, b = read_requests(tmp_path / "csv"), read_requests(pq_dir)
    assert a == b and sum(len(v) for v in a.values()) > 60  # every variant's requests, record for record
    sa, sb = read_steps(tmp_path / "csv"), read_steps(pq_dir)
    assert sa.keys() == sb.keys()
    for name in sa:
        for col in sa[name]:
            assert sa[name][col].dtype == sb[name][col].dtype and np.array_equal(sa[name][col], sb[name][col]), col
    # absent times are nulls, as the CSV's empty cells
    import pyarrow.parquet as pq

    t = pq.read_table(pq_dir / "requests.parquet")
    with open(tmp_path / "csv" / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert t.column_names == list(rows[0])
    assert t.column("first_token_s").null_count == sum(r["first_token_s"] == "" for r in rows)


def test_parquet_binned_steps_match_the_csv(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    _run(tmp_path / "csv", "--steps", "binned")
    _run(tmp_path / "pq", "--steps", "binned", "--format", "parquet")
    with open(tmp_path / "csv" / "steps_binned.csv", newline="") as f:
        rows = list(csv.reader(f))
    t = pq.read_table(tmp_path / "pq" / "steps_binned.parquet")
    assert t.column_names == rows[0] and t.num_rows == len(rows) - 1
    got = t.to_pylist()
    for row, rec in zip(rows[1:], got, strict=True):
        assert [str(rec[c]) if isinstance(rec[c], str) else float(rec[c]) for c in rows[0]] == \
            [row[0]] + [float(x) for x in row[1:]]


def test_a_later_csv_run_removes_the_parquet_tables(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    _run(tmp_path, "--format", "parquet")
    _run(tmp_path)
    assert not (tmp_path / "requests.parquet").exists() and not (tmp_path / "steps.parquet").exists()
    assert (tmp_path / "requests.csv").is_file()


def test_a_run_into_a_folder_of_ones_own_keeps_files_named_like_another_formats_tables(tmp_path: Path) -> None:
    """Only a run folder's other-format tables are an earlier run's: a user's requests.parquet and steps_binned.csv
    in a folder that held no run were deleted by a csv run (and a parquet run deleted their requests.csv)."""
    (tmp_path / "requests.parquet").write_text("mine")
    (tmp_path / "steps_binned.csv").write_text("mine too")  # this run writes steps.csv: its binned steps are stale
    _run(tmp_path)
    assert (tmp_path / "requests.parquet").read_text() == "mine"
    assert (tmp_path / "steps_binned.csv").read_text() == "mine too"
    assert (tmp_path / "requests.csv").is_file() and (tmp_path / "summary.json").is_file()


def test_format_parquet_without_pyarrow_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    res = CliRunner().invoke(app, ["run", SCENARIO, "-n", "5", "-q", "-o", str(tmp_path / "x"), "--format",
                                   "parquet"])
    assert res.exit_code == 2
    assert "pyarrow" in res.output and "servesim[parquet]" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", SCENARIO, "-n", "5", "-q", "-o", str(tmp_path), "--format", "xlsx"])
    assert res.exit_code == 2 and "--format must be csv or parquet" in res.output
