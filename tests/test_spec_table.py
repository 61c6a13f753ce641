"""A long workload's requests are kept as columns (sim.serving.spec_table): each RequestSpec is made when read, and
every output must be what the run would have written from the tuple of specs. The threshold (SPEC_TABLE_MIN) is
lowered so that small workloads take the columnar path."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sim.serving.spec_table as spec_table
from sim.cli.main import app
from sim.config.scenario import load_scenario
from sim.loop.run import generate_workload
from sim.serving.spec_table import SpecTable

ROOT = Path(__file__).resolve().parent.parent

# failures and rejections; the same with a shared prefix (hash ids every request shares); a trace with its own
# hash ids; a closed loop (session ids) swept over its users
CASES = {
    "failures": ("failure-leak", ["-n", "2000"]),
    "shared-prefix": ("failure-leak", ["-n", "500", "--set", "workload.shared_prefix=40"]),
    "hash-ids": ("mooncake-long-context", ["-n", "200"]),
    "closed-loop": ("lesson-pipeline-bubbles", ["-n", "64"]),
}


def _folder(scenario: str, args: list[str], out: Path) -> dict[str, str]:
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / f"{scenario}.yaml"), "--out", str(out), "-q",
                                   *args])
    assert res.exit_code == 0, res.output
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


def _workload(case: str, n: int):  # noqa: ANN202
    scenario, args = CASES[case]
    sets = {"workload.num_requests": n}
    if "--set" in args:
        key, value = args[args.index("--set") + 1].split("=")
        sets[key] = int(value)
    sc, _ = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", sets)
    return generate_workload(sc)


@pytest.mark.parametrize("case", sorted(CASES))
def test_columnar_workload_writes_the_same_bytes(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, args = CASES[case]
    kept = _folder(scenario, args, tmp_path / "kept")
    monkeypatch.setattr(spec_table, "SPEC_TABLE_MIN", 0)
    assert isinstance(_workload(case, int(args[1])).requests, SpecTable)
    columns = _folder(scenario, args, tmp_path / "columns")
    assert "requests.csv" in kept and "summary.json" in kept
    assert columns == kept


@pytest.mark.parametrize("case", sorted(CASES))
def test_specs_read_back_equal_the_tuples_value_and_type(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _workload(case, 500).requests
    monkeypatch.setattr(spec_table, "SPEC_TABLE_MIN", 0)
    monkeypatch.setattr(spec_table, "_CHUNK", 7)  # iteration crosses many chunks
    table = _workload(case, 500).requests
    assert isinstance(kept, tuple) and isinstance(table, SpecTable)
    assert table == kept and kept == table and list(table) == list(kept) and len(table) == 500
    for got, want in zip(table, kept, strict=True):
        assert [type(getattr(got, f)) for f in got.__slots__] == [type(getattr(want, f)) for f in want.__slots__]
    assert table[3] == kept[3] and table[-1] == kept[-1] and table[10:20] == list(kept[10:20])
    assert table[::7] == list(kept[::7])
    with pytest.raises(IndexError):
        table[500]
    assert table != kept[:-1]


def test_only_valid_columns_become_a_table() -> None:
    ok = np.ones(3)
    assert SpecTable.check(np.zeros(3), ok, ok)
    assert not SpecTable.check(np.array([0.0, -1.0, 2.0]), ok, ok)  # the tuple's RequestSpec raises its error
    assert not SpecTable.check(np.zeros(3), np.array([1, 0, 1]), ok)


def test_lengths_are_kept_narrow_and_read_back_as_the_same_ints() -> None:
    # a workload of ten million requests held 160 MB of int64 lengths for the whole run (issue 40, item 3)
    prompt = np.array([1, 300, 16384, 70_000], dtype=np.int64)
    output = np.array([1, 2, 255, 4], dtype=np.int64)
    table = SpecTable(np.arange(4.0), prompt, output, hash_block_size=16)
    assert (table._prompt.nbytes, table._output.nbytes) == (16, 4)  # uint32, uint8
    assert [(s.prompt_len, s.output_len) for s in table] == list(zip(prompt.tolist(), output.tolist(), strict=True))
    assert all(type(s.prompt_len) is int and type(s.output_len) is int for s in table)
