"""Helpers every command of the command line shares (sim/cli/main.py and the commands it registers from other modules,
such as sim/cli/live.py): one error path (exit 2), Ctrl-C's exit 130, --set parsing, the closing "wrote" line.
They live below the commands so that a module of commands imports them without importing sim.cli.main."""

from __future__ import annotations

import contextlib
import typing
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import typer
from typer.core import TyperCommand

from sim.config.files import InterruptedAfterWrite, input_path, output_path
from sim.config.scenario import parse_value
from sim.config.scenario_messages import digits_of_size
from sim.config.schema import ScenarioError
from sim.config.slos import SLOUnitWarning

try:  # typer 0.2x carries its own copy of click, whose exceptions its commands raise
    from typer._click.exceptions import BadParameter, NoSuchOption, UsageError
except ImportError:  # pragma: no cover - an older typer runs on click itself
    from click.exceptions import BadParameter, NoSuchOption, UsageError  # type: ignore[assignment]


class ScenarioKeyOptions(TyperCommand):
    """A command that reads a scenario (it has --set): an option it lacks that names a scenario key (``servesim run
    --model X``, ``--tp 2``) is answered with the --set that sets it; it was click's "No such option: --model" and a
    guess ("Possible options: --help")."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)
        try:
            return super().parse_args(ctx, args)
        except BadParameter as e:
            why = _bad_number(e.param, given)
            if why is None:
                raise
            raise BadParameter(why, ctx, e.param) from None
        except NoSuchOption as e:
            opts = [o for p in self.params for o in getattr(p, "opts", ()) if o.startswith("--")]
            if "--set" not in opts or any(len(o) > 3 and (e.option_name.startswith(o) or o.startswith(e.option_name))
                                          for o in opts):
                raise  # no scenario here, or a longer or shorter spelling of the command's own (--output: --out)
            if e.option_name == "--variant":  # the scenario's variants, which some commands pick from; it was
                raise UsageError(_no_variant_option(ctx), ctx) from None  # deployment.speculative.acceptance.variant
            if e.option_name == "--sweep":  # servesim sweep's; it was told 'give --set sweep=KEY=V1,V2', which
                # sets the section to that text and is refused ("expected a mapping")
                value = next((given[i + 1] for i, a in enumerate(given[:-1]) if a == "--sweep"), "KEY=V1,V2")
                key, _, values = value.partition("=")
                how = f"give the scenario a sweep section, --set 'sweep={{{key}: [{values}]}}'" \
                    if _command_names(ctx) == ["run"] else \
                    f"it runs one point: --set {key}={values.split(',')[0]}"
                raise UsageError(f"No such option: --sweep; {ctx.command_path} has no --sweep (servesim sweep takes "
                                 f"it): {how}", ctx) from None
            from sim.config.scenario_messages import key_place
            from sim.config.schema import Scenario

            place = key_place(Scenario, e.option_name.lstrip("-").replace("-", "_"))
            if place is None:
                raise
            value = "VALUE"
            for i, a in enumerate(given):
                if a == e.option_name and i + 1 < len(given):
                    value = given[i + 1]
                elif a.startswith(e.option_name + "="):
                    value = a.partition("=")[2]
            key = place.rpartition(".")[2]
            if key in COMMAND_PLACES.get(self.name or "", {}):
                own = COMMAND_PLACES[self.name or ""][key]
                if own is None:
                    raise
                if own.startswith("--"):
                    raise UsageError(f"No such option: {e.option_name}; {self.name} takes {own}: give {own} "
                                     f"{value}", ctx) from None
                place, value = own, f"[{value}]"  # a list the command searches
            if key == "gpu" and value != "VALUE":
                _check_gpus(e.option_name, value, place, ctx)
            first = " (0: a list's first item)" if ".0." in place else ""
            raise UsageError(f"No such option: {e.option_name}; it is the scenario's {place}: give --set "
                                   f"{place}={value}{first}", ctx) from None


def _number_kind(annotation: Any) -> type | None:
    """int or float where an option's annotation is one (``int``, ``int | None``, ``list[int]``), else None."""
    if annotation in (int, float):
        return annotation
    kinds = {_number_kind(a) for a in typing.get_args(annotation) if a is not type(None)}
    return kinds.pop() if len(kinds) == 1 else None


def _bad_number(param: Any, given: list[str]) -> str | None:
    """What is wrong with a number option's value and the forms it takes, or None where it is no number option:
    ``capacity --context 4k`` got typer's "Input should be a valid integer, unable to parse string as an integer",
    which says neither what was read nor what is taken (a 4k that the table's own headings print)."""
    kind = _number_kind(getattr(getattr(param, "type_descriptor", None), "annotation", None))
    if kind is None:
        return None
    opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    values = [given[i + 1] for i, a in enumerate(given[:-1]) if a in opts]
    values += [a.partition("=")[2] for a in given if a.partition("=")[0] in opts and "=" in a]
    for value in values:
        try:
            kind(value)
        except ValueError:
            break
    else:
        return None
    name = max(opts, key=len)
    if kind is int and (digits := digits_of_size(value)) is not None:
        form = f"give it in digits, {digits} (no k or m)"
    elif kind is int:
        form = "give a whole number in digits"
    else:
        form = "give a number in digits (with a decimal point, no % or unit)"
    more = ""
    if getattr(param, "multiple", False):  # one value a flag (click's): "--context 1024,4096" is one value
        parts = [p.strip() for p in value.split(",")]
        more = (f"; several are given by repeating it: {' '.join(f'{name} {p}' for p in parts)}"
                if len(parts) > 1 and all(p.isdigit() for p in parts) else f"; repeat {name} for several")
    return f"{value!r} is not {'a whole number' if kind is int else 'a number'}: {form}{more}"


def _check_gpus(option: str, value: str, place: str, ctx: Any) -> None:
    """``--gpu X`` is answered with the --set that sets the GPU: refused here, naming the presets, where X is none
    (``engine run --gpu h100x`` was told to give --set deployment.gpu=h100x, a second try bound to fail)."""
    from sim.hardware.gpu import GPU_PRESETS, GPUSpec
    from sim.hardware.names import preset_hint

    for name in value.strip("[]").split(","):
        try:
            GPUSpec.from_name(name)
        except ValueError as e:  # and the preset nvidia-smi's name is, as the scenario's deployment.gpu says it
            setting = f"give --set {place}={'[NAME]' if value.startswith('[') else 'NAME'}"
            why = (f"{e}; {setting}" if "is ambiguous" in str(e) else  # a100: the choices, not every preset
                   f"{name.strip()!r} is no GPU preset: {setting} with one of {', '.join(GPU_PRESETS)}"
                   f"{preset_hint(name.strip(), 'gpu')}")
            raise UsageError(f"No such option: {option}; it is the scenario's {place}, and {why}", ctx) from None


def _command_names(ctx: Any) -> list[str]:
    """The command's names below the root (["engine", "run"]): its command_path's words are the program's too
    ("python -m sim.cli run" read as "-m sim.cli run")."""
    names: list[str] = []
    c = ctx
    while c.parent is not None:
        names, c = [c.info_name, *names], c.parent
    return names


def _no_variant_option(ctx: Any) -> str:
    """`servesim run s.yaml --variant mine`: the commands that run every variant of a scenario have no --variant to
    pick one; say so and name those that have it (read from the app, so that the list keeps up with it)."""
    def walk(cmd: Any, path: str) -> Iterator[str]:
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            if any("--variant" in getattr(p, "opts", ()) for p in sub.params):
                yield f"{path} {name}".strip()
            yield from walk(sub, f"{path} {name}")

    root = ctx.find_root()
    others = ", ".join(walk(root.command, root.info_name or ""))
    every = _command_names(ctx) in (["run"], ["sweep"], ["check-policy"], ["engine", "run"])
    what = "runs every variant of the scenario: to run one, leave the others out of its variants" if every \
        else "has no --variant"
    return f"No such option: --variant; {ctx.command_path} {what} (these take --variant: {others})"


# A command that takes a scenario key from elsewhere, for ScenarioKeyOptions' hint: key -> the list it searches
# under plan (plan replaces the deployment's gpu and the policy's max_num_seqs with each candidate's; its --gpu was
# pointed at deployment.gpu), an option of its own ("--..."), or None where it sets the key itself (no hint)
COMMAND_PLACES: dict[str, dict[str, str | None]] = {
    "plan": {"gpu": "plan.gpus", "tensor_parallel_size": "plan.tensor_parallel_sizes",
             "pipeline_parallel_size": "plan.pipeline_parallel_sizes", "weight_dtype": "plan.weight_dtypes",
             "kv_dtype": "plan.kv_dtypes", "max_num_seqs": "plan.max_num_seqs",
             "enable_chunked_prefill": "plan.enable_chunked_prefill", "replicas": None},
    "observe": {"model": "--served-model"},  # the model it asks the server for
}


_show_warning = warnings.showwarning


def _input_warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                        file: Any = None, line: str | None = None) -> None:
    """A warning about the user's input (an SLO of 200 "seconds") as one line, as an error is, not Python's
    "pydantic/main.py:792: SLOUnitWarning: ..." and the source line under it."""
    if issubclass(category, SLOUnitWarning):
        typer.echo(f"warning: {message}", err=True)
    else:
        _show_warning(message, category, filename, lineno, file, line)


warnings.showwarning = _input_warning_line


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _interrupted(what: str) -> None:
    """Ctrl-C: say what it stopped, and exit 130 (128 + SIGINT), as a shell reports a process ended by it."""
    typer.echo(f"\ninterrupted {what}", err=True)
    raise typer.Exit(130)


class _Doing:
    """What a command is doing, for the line Ctrl-C prints (``_on_ctrl_c``); set as it moves on."""

    def __init__(self, what: str) -> None:
        self.what = what


@contextlib.contextmanager
def _on_ctrl_c(doing: str, out: Path | None = None) -> Iterator[_Doing]:
    """Ctrl-C in the block: one line saying what it stopped and what became of ``out`` (None: the command writes
    nothing), then exit 130. Without it a command exited 130 without a word (typer's own handling), the user left
    to guess whether a half-written profile or run folder was there. Every writer under it writes whole or not at
    all (``sim.config.files.write_atomically``), so the line can say which."""
    existed = out is not None and out.exists()
    stage = _Doing(doing)
    try:
        yield stage
    except InterruptedAfterWrite:
        _interrupted(f"after writing {out} (complete)")
    except KeyboardInterrupt:
        left = "nothing was written" if out is None else \
            f"{out} was left as it was" if existed else f"{out} was not written"
        _interrupted(f"while {stage.what}; {left}")


@contextlib.contextmanager
def _quiet_numpy() -> Iterator[None]:
    """No numpy RuntimeWarnings on the terminal: a metric with no data is NaN on purpose (n/a in the table, null
    in summary.json), and the warning numpy prints while computing it would only alarm a user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(all="ignore"):
            yield


def _set_option() -> Any:  # typer.Option is typed Any, so that it fits any parameter
    """``--set KEY=VALUE``, the same on every command that reads a scenario."""
    return typer.Option([], "--set", metavar="KEY=VALUE",
                        help="Override a scenario value: dotted.key=value (repeatable).")


def _nonempty(name: str, path: Callable[[str, str], Path] = output_path) -> Any:
    """A parser of a path option or argument that refuses an empty value, naming ``name`` (``path``: the check,
    ``output_path`` or ``input_path``). ``Path("")`` is the current folder: ``--out ""`` (an unset shell variable)
    wrote a run's files among the user's own, and ``servesim run ""`` said ``error: .: not a file``."""
    def parse(text: str) -> Path:
        try:
            return path(text, name)
        except ScenarioError as e:
            _fail(str(e))
            raise  # not reached: _fail exits

    return parse


def _path_option(*names: str, help: str) -> Any:
    """An optional path option to write (``--out``, ``--json``, ``--log``): an empty value is refused."""
    return typer.Option(None, *names, help=help, parser=_nonempty(names[0]), metavar="<path>")


def _input_argument(default: Any, name: str, *, help: str, metavar: str | None = None) -> Any:
    """A path argument read as input (a scenario, a run folder, benchmark files): an empty one is refused, named
    as the usage line names it."""
    check = _nonempty(metavar or name, input_path)

    # a callback on the text (path_type=str keeps '' from becoming Path('.')), not a parser: typer labels an argument
    # with a parser by its annotation's class, '<Path>', where a path argument reads '<path>'
    def convert(value: Any) -> Any:
        return value if value is None else [check(v) for v in value] if isinstance(value, (list, tuple)) \
            else check(value)

    return typer.Argument(default, help=help, callback=convert, path_type=str, metavar=metavar)


def _input_option(*names: str, default: Any = None, help: str) -> Any:
    """A path option read as input (``--profile``, ``--scenario``, ``--from-bench``): an empty one is refused."""
    return typer.Option(default, *names, help=help, parser=_nonempty(names[0], input_path), metavar="<path>")


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


def default_out(name: str, suffix: str = "") -> Path:
    """``runs/NAME[suffix]``, the folder a command writes without ``--out``. The name as a file name (as variants'
    exports are), so that a scenario named ``../../x`` or ``a/b`` stays one folder inside ``runs/``: it wrote
    outside it, or under a folder of its own."""
    from sim.output.benchfiles.exports import file_stem

    return Path("runs") / (file_stem(name) + suffix)


def _wrote(out_dir: Path, names: list[str]) -> str:
    """The closing line: every file the run wrote into its folder, the per-variant exports on a line of their own
    (a run of many variants or sweep points writes two files for each)."""
    from sim.output.benchfiles.exports import BENCH_SUFFIX, METRICS_SUFFIX

    per_variant = [n for n in names if n.endswith((BENCH_SUFFIX, METRICS_SUFFIX))]
    shared = [f"{n} (--steps full for every step)" if n.startswith("steps_binned.") else n
              for n in names if n not in per_variant]
    line = f"wrote {out_dir}/: {', '.join(shared)}"
    if per_variant:
        line += f"\nand per variant (vllm bench serve's result JSON, Prometheus metrics): {', '.join(per_variant)}"
    return line


def _real_weights(choice: str, names: set[str], dtype, device: str):
    """The ``RealModel`` ``--weights`` asks for (None: random weights)."""
    if choice not in ("auto", "real", "random"):
        _fail(f"--weights must be auto, real or random, got {choice!r}")
    if choice == "random":
        return None
    from realengine.gguf_model import load_real_model, no_real_weights, real_weights_available

    name = next(iter(names)) if len(names) == 1 else ""
    if not (name and real_weights_available(name)):
        if choice == "real":
            _fail(f"--weights real: {no_real_weights(sorted(names))}")
        return None
    import torch

    return load_real_model(name, dtype=dtype or (torch.bfloat16 if device == "cuda" else torch.float32),
                           device=device)
