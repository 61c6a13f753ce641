"""`servesim sweep`: parallel runs give the rows a serial run gives, rows stream to disk, and an interrupted sweep
resumes without redoing finished runs."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import load_scenario
from sim.config.schema import ScenarioError
from sim.studies.sweep import METRICS, column, columns_for, parallel_map, plan_sweep, read_rows, run_sweep
from tests.conftest import screen

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
OVERRIDES = {"workload.num_requests": 60, "sweep": {"workload.arrival.rate": [2.0, 4.0, 8.0]}}


def load(**extra):
    return load_scenario(SCENARIOS / "naive-vs-continuous.yaml", {**OVERRIDES, **extra})


def test_plan_has_one_run_per_point_and_variant() -> None:
    sc, raw = load()
    tasks = plan_sweep(sc, raw)
    assert [t.key for t in tasks] == [f"{v}[workload.arrival.rate={r}]" for r in (2.0, 4.0, 8.0)
                                      for v in ("naive", "continuous")]
    assert [t.index for t in tasks] == list(range(6))


def test_process_pool_gives_the_serial_rows(tmp_path: Path) -> None:
    sc, raw = load()
    serial = run_sweep(sc, raw, tmp_path / "serial", workers=1)
    pooled = run_sweep(sc, raw, tmp_path / "pool", workers=2)
    assert serial.ran == pooled.ran == 6
    assert serial.rows == pooled.rows
    assert (tmp_path / "serial" / "sweep.csv").read_text() == (tmp_path / "pool" / "sweep.csv").read_text()
    rows = serial.rows
    assert [r["index"] for r in rows] == list(range(6))
    # the numbers are the simulator's: continuous beats naive at every rate, and throughput follows the load
    for rate in (2.0, 4.0, 8.0):
        naive, cont = (next(r for r in rows if r["variant"] == v and r["workload.arrival.rate"] == rate)
                       for v in ("naive", "continuous"))
        assert cont["output_throughput"] > naive["output_throughput"] > 0
        assert cont["num_completed"] == 60
    html = (tmp_path / "serial" / "sweep.html").read_text()
    assert "output_throughput" in html and html.count("<tr>") == 7


class Interrupt(Exception):
    pass


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path: Path) -> None:
    sc, raw = load()
    out = tmp_path / "sw"

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_sweep(sc, raw, out, workers=1, progress=stop_after_two)
    with open(out / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 2  # the finished runs were on disk already
    resumed = run_sweep(sc, raw, out, workers=1)
    assert (resumed.ran, resumed.resumed) == (4, 2)
    full = run_sweep(sc, raw, tmp_path / "full", workers=1)
    assert resumed.rows == full.rows
    again = run_sweep(sc, raw, out, workers=1)
    assert (again.ran, again.resumed) == (0, 6)


def test_a_folder_of_another_sweep_is_refused(tmp_path: Path) -> None:
    sc, raw = load()
    run_sweep(sc, raw, tmp_path / "sw", workers=1)
    sc2, raw2 = load(sweep={"workload.arrival.rate": [2.0, 3.0]})
    with pytest.raises(ScenarioError, match="another scenario"):
        run_sweep(sc2, raw2, tmp_path / "sw", workers=1)
    fresh = run_sweep(sc2, raw2, tmp_path / "sw", workers=1, fresh=True)
    assert fresh.ran == 4 and len(read_rows(tmp_path / "sw" / "sweep.csv")) == 4


def test_a_sweep_json_cut_short_or_of_another_kind_is_one_error(tmp_path: Path) -> None:
    # Before: resuming beside a sweep.json cut short (it was written in place: a Ctrl-C or a full disk there) ended
    # in a JSONDecodeError traceback, and beside one holding a list in an AttributeError one
    sc, raw = load()
    first = run_sweep(sc, raw, tmp_path / "sw", workers=1)
    meta = tmp_path / "sw" / "sweep.json"
    for text in ('{"fingerp', "[1]"):
        meta.write_text(text)
        with pytest.raises(ScenarioError, match=r"sweep\.json: not a sweep's record \(unreadable or cut short\), so "
                                                r"the rows of its sweep\.csv cannot be matched to this sweep; --fresh"):
            run_sweep(sc, raw, tmp_path / "sw", workers=1)
    assert run_sweep(sc, raw, tmp_path / "sw", workers=1, fresh=True).ran == first.ran
    assert run_sweep(sc, raw, tmp_path / "sw", workers=1).ran == 0  # its record rewritten whole: resumed


def test_a_sweep_of_a_policy_file_edited_since_is_not_resumed(tmp_path: Path) -> None:
    """A user edits the policy a sweep (or tournament) ran and runs it again into the same folder: every run was
    found done and the old code's rows came back as the new code's, silently."""
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n    pass\n")
    sc, raw = load(**{"variants.1.policy": {"type": "custom", "cls": str(tmp_path / "mine.py") + ":Mine"}})
    first = run_sweep(sc, raw, tmp_path / "sw", workers=1)
    assert first.ran == 6 and {r["num_rejected"] for r in first.rows if r["variant"] == "continuous"} == {0}
    assert run_sweep(sc, raw, tmp_path / "sw", workers=1).ran == 0  # unchanged: resumed, nothing to run
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n"
                                      "    def refuse(self, req, view):\n        return 'edited'\n")
    sc, raw = load(**{"variants.1.policy": {"type": "custom", "cls": str(tmp_path / "mine.py") + ":Mine"}})
    with pytest.raises(ScenarioError, match=r"/sw holds runs of an earlier version of \S+/mine.py:Mine \(edited "
                       r"since\); --fresh to run them again, or another --out$"):
        run_sweep(sc, raw, tmp_path / "sw", workers=1)
    fresh = run_sweep(sc, raw, tmp_path / "sw", workers=1, fresh=True)
    assert fresh.ran == 6 and {r["num_rejected"] for r in fresh.rows if r["variant"] == "continuous"} == {60}


def test_a_sweep_whose_policy_raised_resumes_once_the_file_is_fixed(tmp_path: Path) -> None:
    """The usual edit: a policy raised, the sweep stopped with the other variant's rows done, the user fixed the
    file and ran it again. The class finished no run, so nothing old is kept of it: the sweep resumes."""
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n"
                                      "    def rank(self, req):\n        raise KeyError('oops')\n")
    sc, raw = load(**{"variants.1.policy": {"type": "custom", "cls": str(tmp_path / "mine.py") + ":Mine"}})
    with pytest.raises(ScenarioError, match="KeyError: 'oops'"):
        run_sweep(sc, raw, tmp_path / "sw", workers=1)
    assert [r["key"] for r in read_rows(tmp_path / "sw" / "sweep.csv")] == ["naive[workload.arrival.rate=2.0]"]
    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass Mine(servesim.QueuePolicy):\n    pass\n")
    sc, raw = load(**{"variants.1.policy": {"type": "custom", "cls": str(tmp_path / "mine.py") + ":Mine"}})
    again = run_sweep(sc, raw, tmp_path / "sw", workers=1)
    assert (again.ran, again.resumed) == (5, 1) and {r["num_completed"] for r in again.rows} == {60}


def test_a_sweep_whose_policy_helper_was_edited_since_is_not_resumed(tmp_path: Path) -> None:
    """The policy imports a module beside it (from helpers import key); the user edits that module and runs the same
    sweep again: the digest covered the policy's own file only, so every run was found done, the old key's rows
    shown as the new one's; and the process that ran it kept the first helper."""
    (tmp_path / "helpers.py").write_text("def key(req):\n    return None\n")
    (tmp_path / "mine.py").write_text("import servesim\nfrom helpers import key\n\n\n"
                                      "class Mine(servesim.QueuePolicy):\n"
                                      "    def refuse(self, req, view):\n        return key(req)\n")
    cls = {"variants.1.policy": {"type": "custom", "cls": str(tmp_path / "mine.py") + ":Mine"}}
    sc, raw = load(**cls)
    first = run_sweep(sc, raw, tmp_path / "sw", workers=1)
    assert first.ran == 6 and {r["num_rejected"] for r in first.rows if r["variant"] == "continuous"} == {0}
    assert run_sweep(sc, raw, tmp_path / "sw", workers=1).ran == 0  # unchanged: resumed, nothing to run
    (tmp_path / "helpers.py").write_text("def key(req):\n    return 'edited by hand'\n")
    sc, raw = load(**cls)
    with pytest.raises(ScenarioError, match=r"/sw holds runs of an earlier version of \S+/mine.py:Mine \(edited "
                       r"since\); --fresh to run them again, or another --out$"):
        run_sweep(sc, raw, tmp_path / "sw", workers=1)
    fresh = run_sweep(sc, raw, tmp_path / "sw", workers=1, fresh=True)
    assert fresh.ran == 6 and {r["num_rejected"] for r in fresh.rows if r["variant"] == "continuous"} == {60}


def test_servesim_itself_is_no_helper_of_a_policy_at_the_repository_root() -> None:
    # a policy kept beside sim/ imports servesim from under its own folder: reloading that, were it "edited", would
    # make servesim's classes anew under the running simulator
    import types

    import servesim
    from sim.policies.loader import _helpers
    from sim.policies.queue import FCFSPolicy

    module = types.ModuleType("servesim_user_test")
    vars(module).update(servesim=servesim, FCFSPolicy=FCFSPolicy)
    root = str(Path(servesim.__file__).resolve().parent.parent)
    assert _helpers(module, root, {"sim.policies.queue"}) == {}


def test_cli_sweep(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--out", str(out), "-n", "40",
                              "--set", "sweep={policy.max_num_seqs: [4, 16]}", "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert "4 runs (4 run now, 0 already done)" in res.output
    rows = read_rows(out / "sweep.csv")
    assert {r["key"] for r in rows} == {"naive[policy.max_num_seqs=4]", "naive[policy.max_num_seqs=16]",
                                        "continuous[policy.max_num_seqs=4]", "continuous[policy.max_num_seqs=16]"}
    assert {column(m) for m in METRICS} <= set(rows[0])
    assert {"duration_s", "ttft.p99_s", "e2el.mean_s", "output_throughput"} <= set(rows[0])  # unit in the name
    bad = runner.invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--executor", "dask"])
    assert bad.exit_code == 2 and "--executor" in bad.output


def test_an_address_below_the_cli_is_used_or_refused_and_ray_gives_the_local_rows(tmp_path: Path) -> None:
    """The CLI refused --address without --executor ray, but run_sweep (and plan, through parallel_map) ran on the
    local pool without a word about it; and on a Ray this process had already started, an address elsewhere was
    dropped silently. Now the first is refused as the CLI refuses it, before anything is written, and the second
    warns that the jobs run on the Ray already started. On that Ray, a sweep gives the local rows (one Ray start
    for both: a sweep starting Ray itself is tests/test_sweep_cluster.py's Ray test)."""
    sc, raw = load()
    with pytest.raises(ScenarioError, match="--address 10.0.0.1:6379 names a Ray cluster, which only --executor ray"):
        run_sweep(sc, raw, tmp_path / "local", executor="local", workers=2, address="10.0.0.1:6379")
    assert not (tmp_path / "local").exists()
    with pytest.raises(ScenarioError, match="--address"):
        list(parallel_map(lambda shared, i: shared[i], [0, 1], shared=[7, 8], workers=1, address="10.0.0.1:6379"))
    ray = pytest.importorskip("ray")
    local = run_sweep(sc, raw, tmp_path / "serial", workers=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def pick(shared: list[int], i: int) -> int:  # pickled by value for Ray's workers
        return shared[i]

    try:
        here = ray.get_runtime_context().gcs_address
        with pytest.warns(UserWarning, match=r"Ray is already initialized in this process \(at .*\), so address "
                          r"'10.0.0.1:6379' is not used"):
            got = dict(parallel_map(pick, [0, 1], shared=[7, 8], executor="ray", address="10.0.0.1:6379"))
        assert got == {0: 7, 1: 8} and ray.is_initialized()  # the caller's Ray is kept
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert dict(parallel_map(pick, [1], shared=[7, 8], executor="ray", address=here)) == {0: 8}
        on_ray = run_sweep(sc, raw, tmp_path / "ray", executor="ray", workers=2)
        assert on_ray.rows == local.rows and ray.is_initialized()
    finally:
        ray.shutdown()


def test_cli_sweep_prints_a_table_of_the_runs_and_takes_the_grid_on_the_command_line(tmp_path: Path) -> None:
    """--sweep KEY=V1,V2 (repeatable: the grid is the product; values read as --set reads them) replaces the
    file's sweep section, and the runs come back as a table, as `servesim run` prints its comparison."""
    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--out", str(out), "-n", "30",
                                   "--set", "sweep={workload.num_requests: [5, 6]}",  # replaced by --sweep
                                   "--sweep", "workload.arrival.rate=2,4.5", "--sweep", "policy.max_num_seqs=4,16",
                                   "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    rows = read_rows(out / "sweep.csv")
    assert [r["key"] for r in rows] == [f"{v}[workload.arrival.rate={rate},policy.max_num_seqs={m}]"
                                        for rate in (2, 4.5) for m in (4, 16) for v in ("naive", "continuous")]
    assert "workload.num_requests" not in rows[0]
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["variant", "workload.arrival.rate", "policy.max_num_seqs", "TTFT", "p99", "(ms)",
                                "TPOT", "p99", "(ms)", "E2EL", "p99", "(s)", "output", "tok/s", "goodput", "(req/s)",
                                "SLO", "attainment", "KV", "usage", "max", "completed", "limit"]
    table = [line.split() for line in lines[2:10]]
    assert [(t[0], t[1], t[2]) for t in table] == [(r["variant"], str(r["workload.arrival.rate"]),
                                                    str(r["policy.max_num_seqs"])) for r in rows]
    assert [t[-2] for t in table] == ["30"] * 8  # completed, as sweep.csv says
    assert [t[-2] for t in table] == [str(r["num_completed"]) for r in rows]
    from sim.output.table import TABLE_ROWS

    ttft_ms = next(fmt for _, key, fmt in TABLE_ROWS if key == "ttft.p99")
    assert [t[3] for t in table] == [ttft_ms(r["ttft.p99_s"]) for r in rows]  # formatted as `run` formats it
    assert [t[-1] for t in table] == [r["bottleneck"].partition(":")[0] for r in rows]
    assert lines[10:] == ["naive-vs-continuous: 8 runs (8 run now, 0 already done)",
                          f"wrote {out}/: sweep.csv, sweep.json, sweep.html"]


def test_a_big_sweep_prints_the_first_runs_and_counts_the_rest(tmp_path: Path) -> None:
    from sim.studies.sweep import format_sweep_table

    sc, raw = load()
    run_sweep(sc, raw, tmp_path / "sw", workers=1)
    text = format_sweep_table(tmp_path / "sw" / "sweep.csv", limit=4)
    lines = text.splitlines()
    assert len(lines) == 2 + 4 + 1 and lines[-1] == f"... and 2 more runs in {tmp_path / 'sw' / 'sweep.csv'}"


def test_sweeping_a_scenario_without_a_sweep_is_refused(tmp_path: Path) -> None:
    """It once ran the scenario once, as if that were a sweep."""
    out = tmp_path / "none"
    res = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--out", str(out), "-q"])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.strip() == (f"error: {SCENARIOS / 'naive-vs-continuous.yaml'}: nothing to sweep: the scenario "
                                  "has no sweep section; give --sweep KEY=V1,V2,... (repeatable), or simulate the one "
                                  "point with `servesim run`")
    assert not out.exists()


@pytest.mark.parametrize("spec, message", [
    ("policy.max_num_seqs", "--sweep expects KEY=V1,V2,..."),
    ("=1,2", "--sweep expects KEY=V1,V2,..."),
    ("policy.max_num_seqs=", "--sweep policy.max_num_seqs: expects comma-separated values, got ''"),
    ("policy.max_num_seqs=[1,", "--sweep policy.max_num_seqs: cannot read '[1,' as comma-separated values"),
    ("polcy.max_num_seqs=1,2", "key 'polcy.max_num_seqs' must start with workload"),
    ("policy.max_num_seqs=4,-1", "policy.max_num_seqs"),
])
def test_bad_sweep_options(tmp_path: Path, spec: str, message: str) -> None:
    out = tmp_path / "bad"
    res = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--out", str(out), "-q",
                                   "--sweep", spec])
    assert res.exit_code == 2, res.output
    # one error (a point found bad while checking follows the line announcing the sweep)
    assert res.stderr.count("error: ") == 1 and "Traceback" not in res.output
    assert message in res.stderr
    assert not out.exists()
    twice = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "--sweep",
                                     "policy.max_num_seqs=1", "--sweep", "policy.max_num_seqs=2"])
    assert twice.exit_code == 2 and "--sweep policy.max_num_seqs: given twice" in twice.stderr


def test_cli_sweep_shows_progress_on_stderr_unless_quiet(tmp_path: Path) -> None:
    args = ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "-n", "20", "--sweep", "workload.arrival.rate=2,3",
            "-j", "1"]
    shown = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert shown.exit_code == 0, shown.output
    # the header once every point is checked, as the runs start
    header = f"naive-vs-continuous: 2 points x 2 variants = 4 runs -> {tmp_path / 'a'}/\n"
    checking, runs = shown.stderr.index("naive-vs-continuous: checking points:"), shown.stderr.index(header)
    assert checking < runs < shown.stderr.index("naive-vs-continuous: runs:") and "/2 [" in shown.stderr
    assert "/4 [" in shown.stderr
    quiet = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "-q"])
    assert quiet.exit_code == 0 and quiet.stderr == header.replace("/a/", "/b/")


def test_a_bad_sweep_point_is_one_error_without_the_header(tmp_path: Path) -> None:
    # Before: "naive-vs-continuous: 2 points x 2 variant(s) = 4 runs -> DIR/" stood above the error, printed before
    # the points were checked
    res = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "-n", "10", "--sweep",
                                   "workload.arrival.rate=2,-1", "-q", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and res.stderr.startswith("error: "), res.stderr
    assert "runs ->" not in res.stderr and not (tmp_path / "s").exists()


@pytest.mark.parametrize(("key", "values", "says"), [
    ("deployment.gpu", "h100-sxm,h100-sx", "at {'deployment.gpu': 'h100-sx'}: variant 'naive': deployment.gpu: "
     "unknown GPU 'h100-sx'"),
    ("deployment.model", "llama-3.1-8b,llama-3.1-70b", "at {'deployment.model': 'llama-3.1-70b'}: variant 'naive': "
     "deployment: llama-3.1-70b does not fit on 1 x a100-80gb"),
])
def test_a_point_no_gpu_runs_is_refused_before_any_run(tmp_path: Path, key: str, values: str, says: str) -> None:
    """An unknown GPU or a model that does not fit passes the schema: the sweep ran the first points, wrote
    sweep.csv and then ended with the error, naming no point (docs/clusters.md: found while the points are
    checked, before any run)."""
    res = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "-n", "10", "--sweep",
                                   f"{key}={values}", "-q", "-j", "1", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and says in res.stderr, res.stderr
    assert "runs ->" not in res.stderr and not (tmp_path / "s").exists()


def test_a_disaggregated_point_whose_workload_the_pools_refuse_is_refused_before_any_run(tmp_path: Path) -> None:
    """check_variants built each distinct configuration once, keyed without the scenario's workload, so a sweep of
    workload.failures over a disaggregated scenario skipped the pools' check at its second point: the first point
    ran, sweep.csv was written, and the error named no point."""
    text = (SCENARIOS / "lesson-disaggregation.yaml").read_text()
    (tmp_path / "d.yaml").write_text(text + "sweep:\n  workload.failures:\n    - null\n    - {fraction: 0.2, after: "
                                     "{type: uniform, min: 0.0, max: 3.0}}\n")
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "d.yaml"), "-n", "10", "-q", "-j", "1", "--out",
                                   str(tmp_path / "s")])
    assert res.exit_code == 2 and "at {'workload.failures': {" in res.stderr, res.stderr
    assert "disaggregation does not model workload.failures" in res.stderr and not (tmp_path / "s").exists()


def test_a_bad_sweep_point_clears_the_progress_bar_before_its_error(tmp_path: Path) -> None:
    # Before: the error was printed while the bar was drawn, after its text: "naive-vs-continuous: checking points:
    # 0%|          | 0/2 [00:00<?, ?point/s]error: ..."
    res = CliRunner().invoke(app, ["sweep", str(SCENARIOS / "naive-vs-continuous.yaml"), "-n", "10", "--sweep",
                                   "workload.arrival.rate=2,-1", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "checking points" in res.stderr, res.stderr  # a bar was drawn
    assert screen(res.stderr) == [f"error: {SCENARIOS / 'naive-vs-continuous.yaml'} at {{'workload.arrival.rate': "
                                  "-1}: workload.arrival.rate: must be greater than 0 (got -1)"], res.stderr


class _Taken(list):
    """A list that records how many of its items were taken when."""

    def __init__(self, n: int) -> None:
        super().__init__(range(n))
        self.taken = 0

    def __iter__(self):
        for x in super().__iter__():
            self.taken += 1
            yield x


def test_parallel_map_hands_out_a_few_jobs_per_worker_at_a_time() -> None:
    """A 10,000-run sweep once submitted every run at once and kept every future (and its row) to the end."""
    import operator

    from sim.studies.sweep import IN_FLIGHT_PER_WORKER, parallel_map

    items = _Taken(60)
    seen = []
    for i, result in parallel_map(operator.is_, items, workers=2):  # is_(None, item): a top-level function
        assert items.taken <= len(seen) + 1 + IN_FLIGHT_PER_WORKER * 2
        seen.append(i)
        assert result is False
    assert sorted(seen) == list(range(60))


def test_rows_are_rewritten_in_run_order_one_line_each(tmp_path: Path) -> None:
    from sim.studies.sweep import _rewrite_in_run_order

    table = tmp_path / "sweep.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "key", "bottleneck"])
        for i in (2, 0, 3, 1):
            w.writerow([i, f"k{i}", f'limit, "quoted" {i}'])
    _rewrite_in_run_order(table)
    assert [(r["index"], r["bottleneck"]) for r in read_rows(table)] == [(i, f'limit, "quoted" {i}') for i in range(4)]


def test_the_page_holds_the_first_rows_and_plots_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.studies.sweep as sweep

    sc, raw = load()
    res = run_sweep(sc, raw, tmp_path / "sw", workers=1)
    monkeypatch.setattr(sweep, "HTML_TABLE_ROWS", 2)
    page = sweep.write_sweep_html(tmp_path / "p.html", "t", sweep.iter_rows(res.table),
                                  columns_for(plan_sweep(sc, raw))).read_text()
    assert page.count("<tr>") == 1 + 2 and "6 runs. The table shows the first 2; sweep.csv has them all." in page


def test_a_sweep_over_seeds_draws_a_workload_per_seed(tmp_path: Path) -> None:
    """The seed was refused as a sweep key ('must start with workload, ...'); the tournament sweeps it."""
    sc, raw = load(sweep={"seed": [0, 1]})
    rows = run_sweep(sc, raw, tmp_path / "s", workers=1).rows
    assert [(r["variant"], r["seed"]) for r in rows] == [("naive", 0), ("continuous", 0), ("naive", 1),
                                                         ("continuous", 1)]
    assert rows[0]["ttft.p99_s"] != rows[2]["ttft.p99_s"]  # another seed, other requests


def test_a_verdict_in_the_page_stays_on_one_line(tmp_path: Path) -> None:
    """The bottleneck column's verdicts (180 characters) wrapped in their cells and made every row of sweep.html's
    table about ten lines tall (seen in chromium at 1400 px). Cells do not wrap; a text past 40 characters is cut
    to one line, left-aligned, whole in its tooltip."""
    import sim.studies.sweep as sweep

    verdict = "bandwidth-bound: MFU 2% while computing, GPU busy 76% of the time, prefill 90% of tokens; " * 2
    verdict = verdict.strip()
    cols = ["index", "key", "variant", "num_requests", "bottleneck"]
    page = sweep.write_sweep_html(tmp_path / "p.html", "t", [{"index": 0, "key": "k0", "variant": "a",
                                                              "num_requests": 5, "bottleneck": verdict}],
                                  cols).read_text()
    assert "white-space:nowrap" in page and "td.text{text-align:left;max-width:28em;overflow:hidden" in page
    assert f'<td>5</td><td class="text" title="{verdict}">{verdict}</td>' in page
    assert "<p>1 run.</p>" in page  # it said "1 runs."


def test_a_column_of_the_page_has_one_number_format(tmp_path: Path) -> None:
    """Each value at 4 significant digits gave one column 1, 0.2, 0.004046 and 1.237 (slo_attainment and the queue
    times of an 8-run sweep), points out of line. A column's floats take the decimal places of 4 significant
    digits of its largest; counts stay whole, swept values as given."""
    import re

    import sim.studies.sweep as sweep

    cols = ["index", "key", "variant", "workload.arrival.rate", "num_requests", "queue.mean_s", "kv_usage.mean"]
    rows = [{"index": i, "key": f"k{i}", "variant": "a", "workload.arrival.rate": rate, "num_requests": 30,
             "queue.mean_s": q, "kv_usage.mean": kv}
            for i, (rate, q, kv) in enumerate([(0.5, 1.0, 0.0005788), (1.5, 0.2, 0.001801), (2.5, 0.004046, 0.0),
                                               (3.5, 1.237, 0.00062)])]
    page = sweep.write_sweep_html(tmp_path / "p.html", "t", rows, cols).read_text()
    cells = [re.findall(r"<td>([^<]*)</td>", tr) for tr in re.findall(r"<tr>(<td>.*?)</tr>", page)]
    assert [c[3:] for c in cells] == [["0.5", "30", "1.000", "0.000579"], ["1.5", "30", "0.200", "0.001801"],
                                      ["2.5", "30", "0.004", "0.000000"], ["3.5", "30", "1.237", "0.000620"]]
    # a largest value that rounds up to the next power of ten: 9.9996 read 10.000 (5 significant digits)
    for col in ((9.9996, 1.5), (0.00099996, 0.0005), (999.97, 2.0)):
        rows = [{"index": i, "key": f"k{i}", "variant": "a", "num_requests": 30, "queue.mean_s": q}
                for i, q in enumerate(col)]
        page = sweep.write_sweep_html(tmp_path / "p.html", "t", rows, cols[:3] + ["num_requests", "queue.mean_s"])
        cells = [re.findall(r"<td>([^<]*)</td>", tr)[-1] for tr in re.findall(r"<tr>(<td>.*?)</tr>", page.read_text())]
        assert cells == {9.9996: ["10.00", "1.50"], 0.00099996: ["0.001000", "0.000500"], 999.97: ["1000", "2"]}[col[0]]


def test_a_sweep_over_the_runs_slos_gives_goodput_at_each_bound(tmp_path: Path) -> None:
    """slos.ttft was refused as a sweep key ('must start with workload, ...'): goodput against several TTFT bounds
    took one run each. The same requests at each point; only goodput and attainment move."""
    sc, raw = load(sweep={"slos.ttft": [0.01, 2.0]}, **{"workload.num_requests": 12})
    rows = [r for r in run_sweep(sc, raw, tmp_path / "s", workers=1).rows if r["variant"] == "continuous"]
    assert [r["slos.ttft"] for r in rows] == [0.01, 2.0] and rows[0]["ttft.p99_s"] == rows[1]["ttft.p99_s"]
    assert rows[0]["slo_attainment"] < rows[1]["slo_attainment"] and rows[0]["goodput"] < rows[1]["goodput"]


def test_address_auto_on_the_ray_already_started_is_not_warned_of(monkeypatch: pytest.MonkeyPatch) -> None:
    """--address auto (Ray's word for the cluster running here) on a Ray this process had started warned "address
    'auto' is not used: the jobs run there; call ray.shutdown() first to run them at that address", though that Ray
    is the one auto finds. Another address is still warned of. (A stand-in for Ray: starting one takes 10-20 s.)"""
    import sys
    from types import SimpleNamespace

    from sim.studies.sweep import _ray_init

    fake = SimpleNamespace(is_initialized=lambda: True,
                           get_runtime_context=lambda: SimpleNamespace(gcs_address="192.0.2.2:44527"))
    monkeypatch.setitem(sys.modules, "ray", fake)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ray_init(2, "auto") == (fake, False)
    with pytest.warns(UserWarning, match=r"so address '10.0.0.1:6379' is not used"):
        _ray_init(2, "10.0.0.1:6379")


def test_no_ray_at_the_address_names_the_address_not_the_out_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """`servesim sweep S --executor ray --address auto` with no Ray running said "error: --out DIR: Could not find
    any running Ray instance. Please specify the one to connect to by setting `--address` flag or `RAY_ADDRESS`":
    Ray's ConnectionError is an OSError, read as the folder's. (A stand-in for Ray.)"""
    import sys
    from types import SimpleNamespace

    from sim.studies.sweep import _ray_init

    def init(**kw: object) -> None:
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")

    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: False, init=init))
    with pytest.raises(ScenarioError, match=r"^--address auto: no Ray cluster to join \(Could not find any running Ray "
                       r"instance\); start one with `ray start --head`, or leave --address out to start Ray here$"):
        _ray_init(2, "auto")
