"""Pinned outputs: the SHA-256 of every file of the run folder of every shipped scenario, and of the summary of
the benchmarks' scenarios, each run small with its own fixed seed through ``servesim run``.

A refactoring must leave them byte-identical. A change that alters an output on purpose regenerates the pins in
the same commit and says so in its message:

    PYTHONPATH=. python tests/test_pinned_outputs.py --update

prints each file whose hash changed (or appeared, or went) and rewrites tests/data/pinned_outputs.json; without
``--update`` it only prints. Besides the files, the printed comparison (the command's stdout, the run folder's
path replaced by ``OUT``) is pinned as ``<stdout>``: it is an output too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "tests" / "data" / "pinned_outputs.json"
STDOUT = "<stdout>"

# Every shipped scenario at 20 requests: enough for queues, preemptions, replicas and sweeps to show, little
# enough that all of them together run in about 30 s on a shared 2-core machine. Every file of the folder is pinned.
SCENARIO_ARGS = ["-n", "20"]


def _bench(name: str) -> ModuleType:
    """A benchmark script as a module (benchmarks/ is no package), for the scenario it declares."""
    spec = importlib.util.spec_from_file_location(f"_pinned_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The benchmarks' own scenarios (bench_vidur, bench_limits and bench_million run shipped scenario files, pinned
# above): summary.json only, the figures a benchmark reports. bench_published and bench_fidelity build their runs
# row by row from data and calibration profiles, not from a scenario, and are not pinned here.
BENCH: dict[str, tuple[Callable[[], dict | Path], list[str]]] = {
    "bench_azure_conv": (lambda: _bench("bench_azure_conv").scenario_dict(300), []),
    "bench_cluster": (lambda: _bench("bench_cluster").scenario_dict(300, 16, 16.0, "least_kv"), []),
    "bench_planted_knobs": (lambda: ROOT / "tests" / "data" / "bench" / "scenario.yaml", []),
    "bench_validation": (lambda: ROOT / "calibration" / "scenarios" / "validate-tiny.yaml", ["-n", "40"]),
}


def _cases() -> dict[str, tuple[Callable[[], dict | Path], list[str], bool]]:
    """name -> (scenario file or dict, extra CLI arguments, whether every file is pinned or summary.json only)"""
    cases: dict[str, tuple[Callable[[], dict | Path], list[str], bool]] = {}
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        cases[f"scenarios/{path.stem}"] = ((lambda p=path: p), SCENARIO_ARGS, True)
    for name, (src, args) in BENCH.items():
        cases[f"benchmarks/{name}"] = (src, args, False)
    return cases


CASES = _cases()


def run_case(name: str, tmp: Path) -> dict[str, str]:
    """Run one case in ``tmp``; the SHA-256 of each pinned output, by file name."""
    src, args, every_file = CASES[name]
    scenario = src()
    if isinstance(scenario, dict):
        path = tmp / "scenario.yaml"
        path.write_text(yaml.safe_dump(scenario))
        scenario = path
    out = tmp / "out"
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "-q", *args])
    assert res.exit_code == 0, f"{name}: {res.output}"
    files = sorted(p.name for p in out.iterdir()) if every_file else ["summary.json"]
    pins = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files}
    if every_file:
        pins[STDOUT] = hashlib.sha256(res.stdout.replace(str(out), "OUT").encode()).hexdigest()
    return pins


def _expected() -> dict[str, dict[str, str]]:
    return json.loads(PINS.read_text())


def _diff(name: str, want: dict[str, str], got: dict[str, str]) -> list[str]:
    return [f"{name}/{f}: {'changed' if f in want and f in got else 'new' if f in got else 'gone'}"
            for f in sorted(set(want) | set(got)) if want.get(f) != got.get(f)]


def test_every_case_is_pinned() -> None:
    assert sorted(_expected()) == sorted(CASES), f"run: PYTHONPATH=. python {Path(__file__).relative_to(ROOT)} --update"


@pytest.mark.parametrize("name", sorted(CASES))
def test_pinned_output(name: str, tmp_path: Path) -> None:
    want = _expected().get(name, {})
    got = run_case(name, tmp_path)
    changed = _diff(name, want, got)
    assert not changed, (
        "outputs differ from the pins (a refactoring must not change them; an intended change regenerates them "
        f"with PYTHONPATH=. python {Path(__file__).relative_to(ROOT)} --update and says so in its commit):\n"
        + "\n".join(changed)
    )


def main(argv: list[str]) -> int:
    update = argv == ["--update"]
    if argv and not update:
        print("usage: PYTHONPATH=. python tests/test_pinned_outputs.py [--update]", file=sys.stderr)
        return 2
    want = _expected() if PINS.exists() else {}
    got: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(CASES):
            case_dir = Path(tmp) / name.replace("/", "_")
            case_dir.mkdir()
            got[name] = run_case(name, case_dir)
    changed = [line for name in sorted(set(want) | set(got))
               for line in _diff(name, want.get(name, {}), got.get(name, {}))]
    print("\n".join(changed) if changed else "no pinned output changed")
    if update and changed:
        PINS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {PINS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
