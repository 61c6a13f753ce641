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


@app.command()
def sweep(
    scenario: Path = typer.Argument(..., help="Scenario YAML file (its sweep section gives the points)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Sweep folder (default: runs/NAME-sweep)."),
    executor: str = typer.Option("local", "--executor", help="local (a process pool) or ray."),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", help="Parallel runs (default: all cores)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (default: start one here)."),
    fresh: bool = typer.Option(False, "--fresh", help="Redo every run, even those already in the folder."),
    set_: list[str] = typer.Option([], "--set", help="Override a scenario value: dotted.key=value (repeatable)."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Run every (sweep point, variant) in parallel, one row per run streamed to OUT/sweep.csv; an interrupted
    sweep resumes without redoing finished runs. Writes OUT/sweep.html at the end."""
    from sim.sweep import run_sweep

    if workers is not None and workers < 1:
        _fail(f"--workers must be >= 1, got {workers}")
    overrides = _overrides(set_, num_requests)
    try:
        sc, raw = load_scenario(scenario, overrides)
    except ScenarioError as e:
        _fail(str(e))
        return
    out_dir = out or Path("runs") / f"{sc.name}-sweep"
    bar = None
    if not quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc=sc.name, unit="run", leave=False)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done
            bar.refresh()

    try:
        res = run_sweep(sc, raw, out_dir, source=str(scenario), executor=executor, workers=workers,
                        address=address, fresh=fresh, progress=progress)
    except ScenarioError as e:
        _fail(str(e))
        return
    except OSError as e:
        _fail(f"--out {out_dir}: {e.strerror or e}")
        return
    finally:
        if bar is not None:
            bar.close()
    typer.echo(f"{sc.name}: {len(res.rows)} runs ({res.ran} run now, {res.resumed} already done)")
    typer.echo(f"wrote {res.out_dir}/sweep.csv, sweep.html")


engine_app = typer.Typer(no_args_is_help=True, help="Run a scenario on the real engine (realengine/, needs torch).")
app.add_typer(engine_app, name="engine")


@engine_app.command("run")
def engine_run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder to write (default: runs/NAME-engine)."),
    model: Optional[str] = typer.Option(None, "--model", help="Replace the scenario's model (e.g. tiny)."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n", help="Override workload.num_requests."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Arrival a comes at a * X wall seconds."),
    num_gpu_blocks: Optional[int] = typer.Option(
        None, "--num-gpu-blocks", help="KV cache blocks (default: sized as vLLM does on CUDA, capped on CPU)."
    ),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp32, bf16, fp16 (default: fp32 on CPU, the "
                                        "deployment's weight_dtype on CUDA)."),
    set_: list[str] = typer.Option([], "--set", help="Override a scenario value: dotted.key=value (repeatable)."),
) -> None:
    """Replay the scenario's workload on the real engine, every variant in turn; write the same run folder as
    `servesim run` (with measured step durations) plus memory.csv."""
    from sim.metrics import summarize
    from sim.output import format_table
    from sim.run import generate_workload
    from sim.scenario import slos_of, variant_configs

    if device not in ("cpu", "cuda"):
        _fail(f"--device must be cpu or cuda, got {device!r}")
    if time_scale < 0:
        _fail(f"--time-scale must be >= 0, got {time_scale}")
    if num_gpu_blocks is not None and num_gpu_blocks < 1:
        _fail(f"--num-gpu-blocks must be >= 1, got {num_gpu_blocks}")
    overrides = _overrides(set_, num_requests)
    try:
        sc, raw = load_scenario(scenario, overrides)
        if sc.sweep:
            raise ScenarioError("sweeps are not supported by `servesim engine run`; run one point (--set)")
        cfgs = variant_configs(sc)
        wl = generate_workload(sc)
    except ScenarioError as e:
        _fail(str(e))
        return
    try:
        import torch  # noqa: F401

        from realengine.engine import engine_config, run_engine, write_engine_run
        from realengine.model import torch_dtype
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
    try:  # everything the input can get wrong fails here, before any run
        for cfg in cfgs:
            engine_config(cfg, model_spec=model, num_gpu_blocks=num_gpu_blocks, device=device)
    except (ScenarioError, ValueError) as e:
        _fail(str(e))
    out_dir = out or Path("runs") / f"{sc.name}-engine"
    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"--out {out_dir}: exists and is not a folder")
    typer.echo(f"{sc.name}: {sc.workload.describe()} on the engine ({device})", err=True)
    results, summaries, memory = [], {}, []
    for cfg in cfgs:
        result, _, _ = run_engine(cfg, wl, device=device, dtype=tdtype, model_spec=model,
                                  num_gpu_blocks=num_gpu_blocks, time_scale=time_scale, memory_samples=memory)
        results.append(result)
        summaries[result.name] = summarize(result, slos_of(sc))
    try:
        write_engine_run(out_dir, results, memory, summaries, scenario=sc.model_dump(mode="json"),
                         title=f"servesim engine ({device}): {sc.name}")
    except OSError as e:
        _fail(f"--out {out_dir}: cannot write the run folder: {e.strerror or e}")
    typer.echo(format_table(summaries))
    typer.echo(f"wrote {out_dir}/summary.json, requests.csv, steps.csv, report.html, memory.csv")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
