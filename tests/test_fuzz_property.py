"""Property: every scenario document, valid or not, ends with exit 0 and finite results, or with exit 2 and one
message naming the field; never a traceback, never a hang. Hypothesis generates documents two ways: from the
schema (random values of random types at the keys a scenario has) and by mutating the shipped scenarios. Runs are
kept small (at most 24 requests) and each example has a generous deadline for a loaded machine."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.cli.main import app
from sim.config.scenario import MAX_SCENARIO_BYTES

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "scenarios").glob("*.yaml"))}
SECONDS_PER_EXAMPLE = 45.0  # a small run takes well under a second; the bound catches a hang, not slowness

BASE: dict[str, Any] = {
    "name": "p",
    "seed": 3,
    "workload": {
        "arrival": {"type": "poisson", "rate": 10.0},
        "num_requests": 12,
        "prompt_len": {"type": "uniform", "low": 8, "high": 200},
        "output_len": {"type": "exponential", "mean": 20, "min": 1, "max": 100},
    },
    "deployment": {"model": "llama-3.2-1b", "gpu": "l4", "max_model_len": 2048},
    "kv_cache": {"type": "paged"},
    "policy": {"type": "continuous", "max_num_seqs": 16, "enable_chunked_prefill": True,
               "max_num_batched_tokens": 512},
    "admission": {"max_queue_len": 100},
    "slos": {"ttft": 1.0},
    "variants": [{"name": "a"}, {"name": "b", "kv_cache": {"type": "contiguous", "reserve": "request"},
                                 "policy": {"type": "static", "batch_size": 4, "max_wait": 0.2}}],
}

# Values of every kind a file can hold, the edge cases included (YAML's .inf and .nan, 2^63, -0.0, huge).
ODD_NUMBERS = [0, -1, 1, 2, 0.5, -0.0, 1e-300, 1e300, 2**31, 2**63, 2**70, 10**12, float("inf"), float("-inf"),
               float("nan")]
VALUES = st.one_of(
    st.sampled_from(ODD_NUMBERS),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from(["", "x", "poisson", "paged", "static", "l4", "tiny", "/dev/zero", "azure-conv", "1e3"]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["type", "value", "zz"]), st.integers(-2, 5), max_size=2),
)


def _paths(d: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a document (mappings and list items), leaves and sections alike."""
    out = []
    if isinstance(d, dict):
        for k, v in d.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


def _small(doc: dict) -> dict:
    """A shipped scenario cut to a few requests and at most four runs, so that an example stays quick."""
    d = copy.deepcopy(doc)
    wl = d.setdefault("workload", {})
    wl["num_requests"] = 24
    if isinstance(wl.get("arrival"), dict) and wl["arrival"].get("type") == "trace":
        wl["arrival"].pop("repeat_to", None)
    if isinstance(d.get("sweep"), dict):
        d["sweep"] = {k: v[:2] for k, v in list(d["sweep"].items())[:1]}
    d["variants"] = (d.get("variants") or [])[:2]
    return d


@st.composite
def documents(draw) -> tuple[dict, tuple]:
    """(document, paths changed): a base (the schema-shaped BASE or a shipped scenario) with one to three keys set
    to random values, deleted, or joined by an unknown key."""
    name = draw(st.sampled_from(["BASE", *SHIPPED]))
    d = copy.deepcopy(BASE) if name == "BASE" else _small(SHIPPED[name])
    changed: list[tuple] = []
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(d)
        path = draw(st.sampled_from(paths))
        parent: Any = d
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["set", "set", "set", "delete", "unknown"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "unknown" and isinstance(parent, dict):
            parent["zz_" + str(path[-1])] = 1
            path = path[:-1] + ("zz_" + str(path[-1]),)
        else:
            parent[path[-1]] = draw(VALUES)
        changed.append(path)
    return d, tuple(changed)


def _finite(v: Any) -> bool:
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    return not isinstance(v, float) or math.isfinite(v)


def check(tmp_path: Path, doc: Any, changed: tuple[tuple, ...]) -> None:
    path = tmp_path / "s.yaml"
    text = yaml.safe_dump(doc, sort_keys=False)
    assert len(text) < MAX_SCENARIO_BYTES
    path.write_text(text)
    out = tmp_path / "out"
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "-q"])
    seconds = time.perf_counter() - start
    assert seconds < SECONDS_PER_EXAMPLE, (seconds, changed)
    assert result.exception is None or isinstance(result.exception, SystemExit), (repr(result.exception), changed)
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        summary = json.loads((out / "summary.json").read_text())
        assert _finite(summary["variants"]), changed
        assert "Warning" not in result.stderr
        return
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    # one message: a line per problem (several mutations can make several), each naming the file
    lines = err.splitlines()
    assert lines[0].startswith("error: "), err
    assert all(line.startswith(str(path)) or line.startswith("...") for line in lines[1:]), err
    assert result.stdout == "" and not out.exists()
    # the message names a key of the file: one changed, one of its sections, or another it conflicts with
    sections = {"workload", "deployment", "policy", "kv_cache", "variant", "sweep", "cluster", "admission", "slos"}
    keys = {str(k) for p in changed for k in p if not isinstance(k, int)} | sections
    assert any(k in err for k in keys) or "YAML" in err, (changed, err)


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=documents())
def test_any_document_runs_finite_or_fails_cleanly(tmp_path: Path, case: tuple[dict, Any]) -> None:
    doc, changed = case
    out = tmp_path / "out"
    if out.exists():  # examples share tmp_path: start each from a clean folder
        import shutil

        shutil.rmtree(out)
    check(tmp_path, doc, changed)


def test_every_shipped_scenario_cut_small_runs(tmp_path: Path) -> None:
    """The unmutated bases: each runs to exit 0 with finite results (so a failure above is the mutation's)."""
    for i, (name, doc) in enumerate(SHIPPED.items()):
        folder = tmp_path / str(i)
        folder.mkdir()
        check(folder, _small(doc), ((name,),))
        assert (folder / "out" / "summary.json").is_file(), name
