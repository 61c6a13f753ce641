"""The ``servesim`` command: a thin typer layer over plain functions that notebooks call too.

Bad input ends with one message naming the field and the reason, exit code 2, and no traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from sim.scenario import ScenarioError, json_schema, load_scenario, parse_value

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="servesim: simulate LLM inference serving (TTFT, TPOT, ITL, throughput, KV memory) on GPUs.",
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _overrides(sets: list[str], num_requests: int | None) -> dict:
    out = {}
    for s in sets:
        key, sep, value = s.partition("=")
        if not sep or not key:
            _fail(f"--set expects KEY=VALUE (dotted key), got {s!r}")
        try:
            out[key.strip()] = parse_value(value)
        except ScenarioError as e:  # a YAML error in one value
            _fail(f"--set {key}: {e}")
    if num_requests is not None:
        if num_requests < 1:
            _fail(f"--num-requests must be >= 1, got {num_requests}")
        out["workload.num_requests"] = num_requests
    return out


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder to write (default: runs/NAME)."),
    set_: list[str] = typer.Option([], "--set", help="Override a scenario value: dotted.key=value (repeatable)."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Simulate every variant of a scenario on the same workload; print the comparison, write the run folder."""
    from sim.metrics import bottleneck
    from sim.output import format_table
    from sim.run import prepare_scenario, run_scenario, write_scenario_run

    overrides = _overrides(set_, num_requests)
    try:
        sc, raw = load_scenario(scenario, overrides)
        # everything that can be wrong with the input fails here, before any output
        prepared = prepare_scenario(sc, raw, source=str(scenario))
    except ScenarioError as e:
        _fail(str(e))
        return
    out_dir = out or Path("runs") / sc.name
    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"--out {out_dir}: exists and is not a folder")
    typer.echo(f"{sc.name}: {sc.workload.describe()}", err=True)
    result = run_scenario(prepared, progress=not quiet and sys.stderr.isatty())
    try:
        write_scenario_run(result, out_dir)
    except OSError as e:
        _fail(f"--out {out_dir}: cannot write the run folder: {e.strerror or e}")
    typer.echo(format_table(result.summaries))
    for name, s in result.summaries.items():
        typer.echo(f"{name}: {bottleneck(s)}")
    typer.echo(f"wrote {out_dir}/summary.json, requests.csv, steps.csv, report.html")


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files (for editor completion)."""
    typer.echo(json.dumps(json_schema(), indent=2))


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
