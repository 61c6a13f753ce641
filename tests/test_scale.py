"""Issue 15: results stay byte-identical to those before the scale work (KV blocks kept as a range, progress,
lengths pairs), and (prompt, output) pairs sampled from a lengths file."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import load_scenario, parse_scenario
from sim.config.schema import ScenarioError
from sim.workload.generator import Workload
from sim.workload.length_pairs import load_pairs, resolve_lengths

ROOT = Path(__file__).resolve().parent.parent

# sha256 of what `servesim run scenarios/NAME.yaml -n 100` wrote on main at 39d384f, before the scale work: the CSVs
# whole, and summary.json's "variants" (as json.dumps(sort_keys=True)), so that blocks added beside it (units, the
# scenario echo) do not count. A change that alters a simulated result on purpose updates these, saying why.
# summary.json of memory-ceiling and autoscale-memory-bound since d1cb5bb and df1f41d: energy (a memory-streaming
# step draws 75% of the dynamic power range, not 35%) and the last digit of time-weighted means (dot products in
# fixed blocks); the CSVs did not change.
GOLDEN = {
    "memory-ceiling": {
        "summary.json": "edce7ae7295156a918895e04740a831b6685c6aa73f8d582715af52d44c70cbd",
        "requests.csv": "cb396ccab749da4b6897183deb275d72defb1b8df7ba6d7e864d5b40122587b8",
        "steps.csv": "db8d28300f6a7d0129da61382db894c31f12cc3aeca3609ee065a524d4a7c27b",
    },
    "mooncake-long-context": {  # prefix caching: the free queue's order decides the hits
        "summary.json": "5fcb19715a7559956798647b9e7f5f6d4fa861fc049784c62e50517622cace75",
        "requests.csv": "cec17f564676e81b92284cbdb90ee210c49f39e6f40457ef158f04019b001b1b",
        "steps.csv": "d781645fae25bc15b1247a9c83fdebf0122b93eba73e87750c1afa3bb8f02bff",
    },
    "autoscale-memory-bound": {  # a cluster with an autoscaler
        # replica time over the run's window, first arrival to last finish (issue 35): replicas_mean, GPU-hours,
        # cost and busy_fraction changed (scale-on-compute's mean was 1.0075 for 1 replica); the CSVs did not
        "summary.json": "de12572dc3211c248a8db6026213857cd67af60888f9052df47cc6ea27562fb4",
        "requests.csv": "a1229fbe09a9d7bc1d0076649e884fe77817ab0728b5a86e9679aa48eee9c908",
        "steps.csv": "96ecf2b14c5b15f60e9655f872a7c46ebe263cb3006a13430af4b42bb26b708f",
    },
    "lesson-paged-memory": {  # paged against contiguous
        "summary.json": "c27800af0a0d901c288c752cad8a5f4484652b930088c71f2e8d77b04af4cfa8",
        "requests.csv": "bf098274f18d6cfeedda87bed3050f36c2dbe80d9e74f8adf7f631c9dd32bb41",
        "steps.csv": "48f08dba513365465009624648c6149a5162eb93de2e10498f13025fbd85641a",
    },
}


# What was added to the files since then, without changing a figure that was there: the preemption and resume
# times of each request, the verdict's inputs, the rejection reasons and the energy (sim/costs/energy.py) per variant.
# They are left out before hashing, so the hashes still say that every value written at 39d384f is written the
# same, byte for byte.
ADDED_REQUEST_COLUMNS = ("preempted_at_s", "resumed_at_s")
ADDED_SUMMARY_KEYS = ("limits", "rejections", "energy")


def _requests_as_before(path: Path) -> bytes:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    keep = [i for i, c in enumerate(rows[0]) if c not in ADDED_REQUEST_COLUMNS]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([r[i] for i in keep] for r in rows)
    return buf.getvalue().encode()


@pytest.mark.parametrize("name", list(GOLDEN))
def test_run_folder_is_byte_identical_to_before(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / f"{name}.yaml"), "-n", "100", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    got = {"steps.csv": hashlib.sha256((out / "steps.csv").read_bytes()).hexdigest(),
           "requests.csv": hashlib.sha256(_requests_as_before(out / "requests.csv")).hexdigest()}
    variants = json.loads((out / "summary.json").read_text())["variants"]
    for summary in variants.values():
        for key in ADDED_SUMMARY_KEYS:
            summary.pop(key)
    got["summary.json"] = hashlib.sha256(json.dumps(variants, sort_keys=True).encode()).hexdigest()
    assert got == GOLDEN[name]


def test_vidur_arxiv_pairs_are_rows_of_the_file() -> None:
    path = resolve_lengths("vidur-arxiv")
    with open(path, newline="") as f:
        rows = {(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f)}
    prompt, output = load_pairs("vidur-arxiv", "num_prefill_tokens", "num_decode_tokens")
    assert len(prompt) == 28_257 and max(prompt + output) <= 4096
    wl = Workload.model_validate({"arrival": {"type": "poisson", "rate": 0.4}, "num_requests": 2000,
                                  "lengths": {"type": "pairs", "file": "vidur-arxiv"}})
    a = wl.generate(np.random.default_rng(0))
    b = wl.generate(np.random.default_rng(0))
    assert a.requests == b.requests  # seeded
    pairs = [(r.prompt_len, r.output_len) for r in a.requests]
    assert set(pairs) <= rows  # each request is one row: the pair is kept
    assert len(set(pairs)) > 1500  # drawn with replacement over the whole file, not the first rows


def test_pairs_in_order_and_own_columns(tmp_path: Path) -> None:
    p = tmp_path / "l.csv"
    p.write_text("in,out,x\n10,3,a\n0,7,b\n")
    wl = Workload.model_validate({"arrival": {"type": "poisson", "rate": 1}, "num_requests": 5,
                                  "lengths": {"type": "pairs", "file": str(p), "prompt_column": "in",
                                              "output_column": "out", "sample": "in_order"}})
    reqs = wl.generate(np.random.default_rng(1)).requests
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(10, 3), (1, 7), (10, 3), (1, 7), (10, 3)]


def test_pairs_errors_name_what_is_wrong(tmp_path: Path) -> None:
    base = {"name": "x", "workload": {"arrival": {"type": "poisson", "rate": 1}, "num_requests": 5,
                                      "lengths": {"type": "pairs", "file": "vidur-arxiv"}},
            "deployment": {"model": "tiny", "gpu": "l4"}}
    both = {**base, "workload": {**base["workload"], "prompt_len": {"type": "fixed", "value": 4}}}
    with pytest.raises(ScenarioError, match="drop prompt_len"):
        parse_scenario(both)
    p = tmp_path / "l.csv"
    p.write_text("a,b\n1,2\n")
    res = CliRunner().invoke(app, ["run", "-q", "-o", str(tmp_path / "o"), str(ROOT / "scenarios/plan-chat.yaml"),
                                   "--set", "workload.prompt_len=null", "--set", "workload.output_len=null",
                                   "--set", f"workload.lengths={{type: pairs, file: {p}}}"])
    assert res.exit_code == 2 and "no column 'num_prefill_tokens'" in res.output, res.output


def test_vidur_scenario_loads_and_runs_small() -> None:
    from sim.loop.run import run_scenario

    sc, raw = load_scenario(ROOT / "scenarios/vidur-arxiv-llama2-70b.yaml", {"workload.num_requests": 50})
    run = run_scenario(sc, raw)
    (s,) = run.summaries.values()
    assert s["num_completed"] == 50


def test_steps_csv_streamed_in_chunks_equals_the_whole_text() -> None:
    """write_run streams steps.csv in bounded chunks; any chunk size gives the same bytes."""
    import io

    from sim.loop.run import run_scenario
    from sim.output.run_folder import steps_csv, write_steps_csv

    sc, raw = load_scenario(ROOT / "scenarios/lesson-paged-memory.yaml", {"workload.num_requests": 30})
    results = run_scenario(sc, raw).results
    whole = steps_csv(results)
    for chunk in (1, 7, 1000):
        buf = io.StringIO()
        write_steps_csv(buf, results, chunk=chunk)
        assert buf.getvalue() == whole
    assert whole.count("\n") == 1 + sum(len(r.steps["start"]) for r in results)


def test_binned_steps_keep_the_totals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past FULL_STEPS_MAX steps the run folder holds steps_binned.csv instead of steps.csv: per replica and time
    bin, the same step count, busy time, tokens and peaks as the full log; --steps full brings the log back."""
    import sim.metrics.steps_binned as sb
    from sim.loop.run import run_scenario
    from sim.output.run_folder import write_run

    sc, raw = load_scenario(ROOT / "scenarios/autoscale-memory-bound.yaml", {"workload.num_requests": 40})
    run = run_scenario(sc, raw)
    out = tmp_path / "out"
    write_run(out, run.results, run.summaries)
    assert (out / "steps.csv").exists() and not (out / "steps_binned.csv").exists()
    monkeypatch.setattr(sb, "FULL_STEPS_MAX", 10)
    write_run(out, run.results, run.summaries)
    assert not (out / "steps.csv").exists()  # the earlier run's full log is not left to pass for this one's
    with open(out / "steps_binned.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for res in run.results:
        mine = [r for r in rows if r["variant"] == res.name]
        s = res.steps
        assert sum(int(r["num_steps"]) for r in mine) == len(s["start"])
        assert sum(float(r["busy_s"]) for r in mine) == pytest.approx(float(np.sum(s["duration"])), rel=1e-9)
        assert sum(int(r["decode_tokens"]) for r in mine) == int(np.sum(s["decode_tokens"]))
        assert max(int(r["max_kv_blocks_used"]) for r in mine) == int(np.max(s["kv_blocks_used"]))
        assert {int(r["replica"]) for r in mine} == set(np.asarray(s["replica"]).tolist())
        assert len(mine) <= sb.MAX_BINS * len(set(np.asarray(s["replica"]).tolist()))
    write_run(out, run.results, run.summaries, steps="full")
    assert (out / "steps.csv").exists() and not (out / "steps_binned.csv").exists()


def test_bin_width_is_a_round_number() -> None:
    from sim.metrics.steps_binned import bin_width

    assert bin_width(49_619.0) == 50.0 and bin_width(2000.0) == 1.0 and bin_width(2001.0) == 2.0
    assert bin_width(0.3) == 0.0002


def test_cli_refuses_an_unknown_steps_mode(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios/plan-chat.yaml"), "-q", "--steps", "some"])
    assert res.exit_code == 2 and "--steps must be auto, full or binned" in res.output
