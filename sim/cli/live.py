"""`servesim serve` and `servesim observe`: the real engine behind an OpenAI-compatible API, and a scenario's
traffic sent to any such server (realengine/server.py, sim/loop/observe.py). Registered on the main app by
sim/cli/main.py."""

# ruff: noqa: B008
from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

import typer

from sim.config.schema import ScenarioError
from sim.words import counted


def _load(scenario: Path, sets: list[str], num_requests: int | None, variant: str | None):
    """The scenario and the variant asked for (default: the first); exits 2 on bad input."""
    from sim.cli.common import _fail, _overrides
    from sim.config.scenario import load_scenario, variant_configs

    overrides = _overrides(sets, num_requests)
    try:
        sc, _ = load_scenario(scenario, overrides)
        if sc.sweep:
            # the example is the scenario's own first point: azure-conv sweeps rate_scale, and the fixed example
            # --set workload.arrival.rate=8 was refused on its trace arrivals
            import yaml

            key, values = next(iter(sc.sweep.items()))
            value = yaml.safe_dump(values[0], default_flow_style=True, width=math.inf).strip().removesuffix("\n...")
            raise ScenarioError("sweeps are not supported here: drop the sweep and pick one of its points, e.g. "
                                f"--set sweep=null --set '{key}={value}'")
        cfgs = variant_configs(sc)
        if variant is None:
            cfg = cfgs[0]
        else:
            found = [c for c in cfgs if c.name == variant]
            if not found:
                raise ScenarioError(f"--variant {variant!r}: the scenario has {', '.join(c.name for c in cfgs)}")
            cfg = found[0]
    except ScenarioError as e:
        _fail(str(e))
        raise AssertionError from None  # _fail exits
    return sc, cfg


def register(app: typer.Typer) -> None:
    from sim.cli.common import _input_argument, _input_option, _path_option, _set_option

    @app.command()
    def serve(
        scenario: Path = _input_argument(..., "scenario",
                                         help="Scenario YAML file: its deployment and policy are served."),
        variant: str | None = typer.Option(None, "--variant", help="The variant to serve (default: the first)."),
        model: str | None = typer.Option(None, "--model", help="Replace the scenario's model (tiny, llama-57m, "
                                         "smollm2-135m)."),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
        port: int = typer.Option(8000, "--port", help="Port (0: a free one, printed)."),
        policy: str | None = typer.Option(None, "--policy", help="Replace the policy type (as --set "
                                          "policy.type=NAME)."),
        num_gpu_blocks: int | None = typer.Option(None, "--num-gpu-blocks", help="KV cache blocks (default: "
                                                  "sized as vLLM does on CUDA, capped on CPU)."),
        weights: str = typer.Option("random", "--weights", help="random, real or auto (real weights where the "
                                    "model has them here)."),
        log: Path | None = _path_option("--log", help="Append one JSON line per finished request "
                                        "(arrival, first token, finish, tokens, chunk times; engine seconds)."),
        stall_timeout: float = typer.Option(60.0, "--stall-timeout", help="Fail queued requests (HTTP 500, with "
                                            "the reason) once the policy has left them waiting this many seconds "
                                            "with nothing running and no step taken (0: never)."),
        set_: list[str] = _set_option(),
    ) -> None:
        """Serve the real engine behind an OpenAI-compatible API (/v1/completions, /v1/chat/completions,
        streaming) with /metrics in vLLM's names, scheduling with the scenario's policy. Ctrl-C stops it."""
        from sim.cli.common import _fail, _real_weights

        if device not in ("cpu", "cuda"):
            _fail(f"--device must be cpu or cuda, got {device!r}")
        if not 0 <= port <= 65535:
            _fail(f"--port must be in 0..65535, got {port}")
        if not 0 <= stall_timeout < float("inf"):  # NaN too
            _fail(f"--stall-timeout must be a number of seconds >= 0 (0: never), got {stall_timeout}")
        sets = list(set_) + ([f"policy.type={policy}"] if policy else [])
        sc, cfg = _load(scenario, sets, None, variant)
        try:
            import torch

            from realengine.server import build_live_engine, make_server
        except ImportError as e:
            _fail(f"the engine needs torch: {e}")
            return
        if device == "cuda" and not torch.cuda.is_available():
            _fail("--device cuda: torch sees no CUDA device")
        if cfg.cluster is not None or cfg.disaggregation is not None:
            _fail(f"variant {cfg.name!r}: serve runs one engine replica (no cluster, no disaggregation)")
        real = _real_weights(weights, {str(model or cfg.deployment.model)}, None, device)
        log_file = None
        if log is not None:
            try:
                log_file = open(log, "a", encoding="utf-8")  # noqa: SIM115 - closed at shutdown
            except OSError as e:
                _fail(f"--log {log}: {e.strerror or e}")
        lock = threading.Lock()

        def write_log(row: dict) -> None:
            if log_file is not None:
                with lock:
                    log_file.write(json.dumps(row) + "\n")
                    log_file.flush()

        try:
            engine = build_live_engine(cfg, device=device, model_spec=model, num_gpu_blocks=num_gpu_blocks,
                                       real_model=real, log=write_log, stall_timeout_s=stall_timeout or None)
            server = make_server(engine, host, port)
        except (ScenarioError, ValueError) as e:
            _fail(str(e))
            return
        except OSError as e:
            _fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
            return
        import signal

        def stop(_signum, _frame) -> None:  # SIGTERM (a service manager, a container) stops it as Ctrl-C does
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        # a loop that dies (a user's policy raised) stops the server, as vLLM's API server exits when its engine
        # dies: it went on answering every request with HTTP 500, its terminal silent and its exit status 0
        died: list[BaseException] = []

        def engine_died(e: BaseException) -> None:
            died.append(e)
            threading.Thread(target=server.shutdown, daemon=True).start()  # not in the loop's thread: it waits

        engine.on_stop = engine_died
        engine.on_stall = lambda reason: typer.echo(f"warning: {reason}", err=True)
        engine.start()
        bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
        # a user's class by its name: "policy custom" said which of a scenario's classes was served no more
        kind = cfg.policy.type + (f" {cfg.policy.cls.rpartition(':')[2]}" if cfg.policy.type == "custom" else "")
        typer.echo(f"serving {engine.model_name} (variant {cfg.name}, policy {kind}, "
                   f"{engine.core.kv.num_blocks} KV blocks) on http://{bound_host}:{bound_port}/v1", err=True)
        sys.stderr.flush()
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            typer.echo("\nstopping", err=True)
        finally:
            server.server_close()
            engine.stop()
            if log_file is not None:
                log_file.close()
        if died:
            why = died[0]
            _fail(f"the engine stopped: {why}" if isinstance(why, ScenarioError) else
                  f"the engine stopped: {type(why).__name__}: {why}")

    @app.command()
    def observe(
        scenario: Path = _input_argument(..., "scenario", help="Scenario YAML file: its workload is sent."),
        endpoint: str = typer.Option(..., "--endpoint", help="The server's OpenAI API base, "
                                     "e.g. http://127.0.0.1:8000/v1."),
        out: Path | None = _path_option("--out", "-o", help="Run folder (default: runs/NAME-observed)."),
        api: str = typer.Option("completions", "--api", help="completions or chat."),
        model: str | None = typer.Option(None, "--served-model", help="Model name to send (default: the "
                                         "server's first in /v1/models)."),
        variant: str | None = typer.Option(None, "--variant", help="Whose workload to send (default: the first)."),
        num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Override "
                                                "workload.num_requests."),
        time_scale: float = typer.Option(1.0, "--time-scale", help="Arrival a is sent at a * X seconds."),
        timeout: float = typer.Option(600.0, "--timeout", help="Seconds a request may take in all."),
        scrape_interval: float = typer.Option(1.0, "--scrape-interval", help="Seconds between /metrics scrapes "
                                              "(0: none)."),
        tokenizer: Path | None = _input_option("--tokenizer", help="A tokenizer.json (Hugging Face "
                                              "tokenizers; the real extra) that sizes each prompt to its exact "
                                              "token count (default: one word per token, an approximation)."),
        simulate: bool = typer.Option(True, "--simulate/--no-simulate", help="Simulate the variant on the "
                                      "requests as sent and draw its step series over the scraped ones "
                                      "(live.html)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
        set_: list[str] = _set_option(),
    ) -> None:
        """Send the scenario's requests to a live OpenAI-compatible server at their arrival times, streaming;
        measure TTFT, ITL, TPOT and E2EL as `vllm bench serve` does; scrape /metrics; write a run folder that
        `servesim compare` reads."""
        import asyncio
        import dataclasses

        from sim.cli.common import _fail, _wrote, default_out
        from sim.config.scenario import slos_of
        from sim.loop.observe import ObserveRun, observe_async, write_observed_run
        from sim.loop.run import generate_workload
        from sim.output.table import format_table
        from sim.workload.arrivals import time_scale_problem

        if api not in ("completions", "chat"):
            _fail(f"--api must be completions or chat, got {api!r}")
        if not endpoint.startswith(("http://", "https://")):
            _fail(f"--endpoint must be an http:// or https:// URL, got {endpoint!r}")
        why = time_scale_problem(time_scale)
        if why is not None:
            _fail(why)
        if not scrape_interval >= 0:
            _fail(f"--scrape-interval must be >= 0, got {scrape_interval}")
        if not timeout > 0:
            _fail(f"--timeout must be > 0 seconds, got {timeout}")
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            _fail("observe needs aiohttp: pip install 'servesim[live]'")
        tok = None
        if tokenizer is not None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                _fail("--tokenizer needs the tokenizers package: pip install 'servesim[real]'")
            try:
                tok = Tokenizer.from_file(str(tokenizer))
            except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception for a bad file
                _fail(f"--tokenizer {tokenizer}: cannot read it: {e}")
        sc, cfg = _load(scenario, list(set_), num_requests, variant)
        try:
            wl = generate_workload(sc, cfg.workload)
        except ScenarioError as e:
            _fail(str(e))
            return
        why = time_scale_problem(time_scale, last_arrival=max((s.arrival for s in wl.requests), default=0.0))
        if why is not None:
            _fail(why)
        specs = [dataclasses.replace(s, arrival=s.arrival * time_scale) for s in wl.requests]
        closed = wl.closed_loop
        if closed is not None and time_scale != 1.0:
            closed = dataclasses.replace(closed, think_times=closed.think_times * time_scale)
        out_dir = out or default_out(sc.name, "-observed")
        if out_dir.exists() and not out_dir.is_dir():
            _fail(f"--out {out_dir}: exists and is not a folder")
        typer.echo(f"{sc.name}: {counted(len(specs), 'request')} to {endpoint} ({api})", err=True)
        bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=len(specs), desc="observe", unit="req", file=sys.stderr)
        run = ObserveRun(endpoint, api)
        if tok is not None and tokenizer is not None:
            run.prompt_method = f"tokenizer {tokenizer.name}: each prompt cut to its token count with it"
        try:
            asyncio.run(observe_async(run, specs, model=model or "", seed=sc.seed, closed_loop=closed,
                                      timeout=timeout, scrape_interval=scrape_interval,
                                      progress=None if bar is None else bar.update, tokenizer=tok))
        except KeyboardInterrupt:
            run.partial = True
            for rec in run.results.values():
                if not rec.success and not rec.error:
                    rec.error = "interrupted before it finished"
            typer.echo("\ninterrupted: writing what was measured", err=True)
        finally:
            if bar is not None:
                bar.close()
        sim_steps = None
        if simulate:
            from sim.loop.observe import simulated_steps

            try:
                sim_steps = simulated_steps(run, cfg)
            except ScenarioError as e:  # a user's policy that fails in the simulator: the observation still counts
                typer.echo(f"warning: no simulation drawn in live.html: {e}", err=True)
        written: list[str] = []
        try:
            _, info = write_observed_run(out_dir, run, cfg.name, scenario=sc.model_dump(mode="json"),
                                         slos=slos_of(sc), planned=len(specs), written=written,
                                         sim_steps=sim_steps)
        except OSError as e:
            _fail(f"--out {out_dir}: cannot write the run folder: {e.strerror or e}")
            return
        from sim.output.run_folder import read_summary

        typer.echo(format_table(read_summary(out_dir)["variants"]))
        if info["failures"]:
            typer.echo("failed requests: " + ", ".join(f"{k}: {v}" for k, v in info["failures"].items()), err=True)
        if run.partial:
            typer.echo(f"partial run: {info['requests_sent']} of {counted(len(specs), 'request')} sent", err=True)
        typer.echo(_wrote(out_dir, written))
        if run.partial:
            raise typer.Exit(130)
