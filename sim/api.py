"""The Python API: one call runs a scenario (a file or a dict) and returns a :class:`Results` whose tables go
straight into pandas, without making pandas a dependency. ``servesim`` (the top-level package) re-exports it:

    import servesim
    res = servesim.run("scenarios/naive-vs-continuous.yaml", num_requests=100, seed=1,
                       set={"policy.max_num_seqs": 64})
    print(res.table())
    df = pandas.DataFrame(res.requests)

Bad input raises :class:`ScenarioError` with the message ``servesim run`` prints.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from sim.config.scenario import apply_override, load_scenario, parse_scenario
from sim.config.schema import Scenario, ScenarioError
from sim.metrics.columns import (
    ABSENT_IF_NEGATIVE,
    REQUEST_COLUMNS,
    STEP_CSV_COLUMNS,
    class_column_values,
    request_latencies,
)
from sim.metrics.records import REQUEST_FIELDS, STEP_COLUMNS, RunResult
from sim.output.compare import Comparison, RunFolderError, compare_runs
from sim.output.run_folder import read_requests, read_steps

__all__ = ["Comparison", "Results", "RunFolderError", "ScenarioError", "compare", "load", "run"]

# request fields whose negative value means "never happened" (output.py writes them as empty cells)


@contextmanager
def _quiet() -> Iterator[None]:
    """A metric with no data is NaN on purpose; numpy's warning while computing it would only alarm a user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(all="ignore"):
            yield


class Results:
    """What a run produced, one entry per variant (and sweep point), from :func:`run` or :func:`load`.

    ``summary`` maps variant name to its summary (the dict of ``summary.json``'s ``variants``; times in seconds).
    ``requests`` and ``steps`` are column dicts (column name -> list, a ``variant`` column first) with the very
    columns of requests.csv and steps.csv: ``pandas.DataFrame(res.requests)`` is one line. A value that never
    happened (no first token, say) is None, which pandas reads as missing.
    """

    def __init__(self, results: list[RunResult] | None, summary: dict[str, dict], *, scenario: dict | None = None,
                 title: str = "servesim", requests: dict[str, list] | None = None,
                 steps: dict[str, list] | None = None, source: str | None = None) -> None:
        self._results = results
        self.summary: dict[str, dict] = summary
        self.scenario: dict | None = scenario  # the resolved scenario, as summary.json records it
        self.title = title
        self.source = source  # the run folder a loaded result came from
        self._requests = requests
        self._steps = steps
        # a sweep's runs: one row per (point, variant) with its name in ``summary``, the variant and the point's
        # values by dotted key (empty when the scenario has no sweep)
        points = (scenario or {}).get("sweep_points")
        self.sweep: list[dict[str, Any]] = list(points) if isinstance(points, list) else []

    def __repr__(self) -> str:
        return f"Results({self.title!r}, variants={list(self.summary)})"

    @property
    def name(self) -> str:
        """The run's name: its scenario's ``name`` (a comparison's label for a run not written to a folder)."""
        name = (self.scenario or {}).get("name")
        return name if isinstance(name, str) and name else self.title.removeprefix("servesim: ")

    @property
    def variants(self) -> list[str]:
        """The variant names, in run order."""
        return list(self.summary)

    @property
    def results(self) -> list[RunResult]:
        """The simulator's own records per variant (``sim.metrics.records.RunResult``), for the
        ``sim.output.report.fig_*``
        functions. A loaded run rebuilds them from its CSV files (pooled ITL gaps are not stored there)."""
        if self._results is None:
            assert self.source is not None
            dep = (self.scenario or {}).get("deployment")
            block = dep.get("block_size") if isinstance(dep, dict) else None
            self._results = _rebuild(Path(self.source), self.summary, block if isinstance(block, int) else 16)
        return self._results

    @property
    def requests(self) -> dict[str, list]:
        """requests.csv as columns: ``variant`` then ``REQUEST_COLUMNS`` (times in seconds, ``_s`` names), then
        ``CLASS_COLUMNS`` when the run has request classes."""
        if self._requests is None:
            self._requests = _request_columns(self.results)
        return self._requests

    @property
    def steps(self) -> dict[str, list]:
        """steps.csv as columns: ``variant`` then ``STEP_CSV_COLUMNS`` (one row per engine step)."""
        if self._steps is None:
            self._steps = _step_columns(self.results)
        return self._steps

    def to_pandas(self, table: str = "requests"):
        """``requests``, ``steps`` or ``summary`` (one row per variant, nested keys joined by dots) as a pandas
        DataFrame; needs pandas (the notebooks extra installs it)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas needs pandas: pip install 'servesim[notebooks]' or pip install pandas; "
                              "res.requests and res.steps are plain column dicts otherwise") from None
        if table == "requests":
            df = pd.DataFrame(self.requests)
            # the times as float64, missing as NaN, as requests.parquet types them: a column of Nones (no TPOT in
            # a run of single-token answers) was dtype object, whose describe() counted "unique" values
            for c in df.columns:
                if c.endswith("_s") and c not in ("preempted_at_s", "resumed_at_s"):
                    df[c] = df[c].astype("float64")
            return df
        if table == "steps":
            return pd.DataFrame(self.steps)
        if table == "summary":
            return pd.DataFrame([{"variant": n, **_flat(s)} for n, s in self.summary.items()])
        raise ScenarioError(f"table must be requests, steps or summary, got {table!r}")

    def table(self) -> str:
        """The comparison table ``servesim run`` prints (one row per metric, one column per variant)."""
        from sim.output.table import format_table

        return format_table(self.summary)

    def figures(self) -> dict[str, Any]:
        """The report's plotly figures by section title (``fig.show()`` in a notebook)."""
        from sim.output.report import SECTIONS
        from sim.output.report.common import plotly_safe

        out: dict[str, Any] = {}
        with _quiet():
            for builder in SECTIONS:
                for sec in builder(self.results, self.summary):
                    if sec.figure is not None:
                        out[sec.title] = plotly_safe(sec.figure, self.summary)
        return out

    def report(self, path: str | os.PathLike) -> Path:
        """Write the offline HTML report (``report.html`` of a run folder) to ``path``; returns the path. A loaded
        run's is its folder's own page (rebuilt from the CSV files it lacked ITL, MFU and energy)."""
        from sim.config.files import output_file, write_atomically
        from sim.output.report import write_report

        p = output_file(path, "report path", "report.html")
        kept = self._kept_files().get("report.html")
        if kept is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(p.parent, {p.name: kept})
            return p
        with _quiet():
            return write_report(p, self.results, self.summary, self.title)

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write the run folder ``servesim run --out`` writes: summary.json, requests.csv, steps.csv, report.html
        and per variant NAME.vllm-bench.json and NAME.metrics.prom. Returns the folder."""
        from sim.config.files import output_folder
        from sim.output.run_folder import write_run

        with _quiet():
            return write_run(output_folder(out_dir, "out_dir"), self.results, self.summary, scenario=self.scenario,
                             title=self.title, extra=self._kept_files())

    def _kept_files(self) -> dict[str, Callable[[IO[str]], None]]:
        """A loaded run's files that its CSV files cannot rebuild, copied from the folder it was read from: the
        exports and the report need the pooled ITL gaps, the model and the power figures (rebuilt, the exports
        said mean_itl_ms 0.0 and model_id null), and transfers.csv, decisions.jsonl, memory.csv and texts.jsonl
        are not rebuilt at all. Each is streamed into its temporary file before any is moved into place, so a
        write over the very folder read copies the originals."""
        from sim.loop.disagg.output import TRANSFERS_FILE
        from sim.metrics.decisions import DECISIONS_FILE
        from sim.output.benchfiles.exports import export_names
        from sim.output.run_folder import MEMORY_FILE, REPORT_FILE, TEXTS_FILE

        if self.source is None:
            return {}
        names = [*export_names(list(self.summary)), REPORT_FILE, TRANSFERS_FILE, DECISIONS_FILE, MEMORY_FILE,
                 TEXTS_FILE]
        return {n: _copier(Path(self.source) / n) for n in names if (Path(self.source) / n).is_file()}

    def compare(self, other: Results | str | os.PathLike, *, labels: tuple[str, str] | None = None) -> Comparison:
        """This run (A) against another (B); see :func:`compare`."""
        return compare(self, other, labels=labels)


def _copier(path: Path) -> Callable[[IO[str]], None]:
    """What streams ``path``'s text, as written (no newline translation), into an open file."""
    def copy_into(f: IO[str]) -> None:
        with open(path, encoding="utf-8", newline="") as src:
            shutil.copyfileobj(src, f)
    return copy_into


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _request_columns(results: list[RunResult]) -> dict[str, list]:
    names = ("variant",) + REQUEST_COLUMNS
    cols: dict[str, list] = {n: [] for n in names}
    lists = [cols[n] for n in names]
    for res in results:
        for r in sorted(res.requests, key=lambda r: r.id):
            values: list[Any] = [res.name]
            for f in REQUEST_FIELDS:
                v = getattr(r, f)
                values.append(None if f in ABSENT_IF_NEGATIVE and v < 0 else v)
            values += [None if x == "" else x for x in request_latencies(r)]
            for col, v in zip(lists, values, strict=True):
                col.append(v)
    return cols | (class_column_values(results) or {})  # requests.csv's class columns, when the run has them


def _step_columns(results: list[RunResult]) -> dict[str, list]:
    cols: dict[str, list] = {"variant": []}
    for c in STEP_CSV_COLUMNS:
        cols[c] = []
    for res in results:
        n = len(res.steps["start"]) if "start" in res.steps else 0
        cols["variant"] += [res.name] * n
        for k, c in zip(STEP_COLUMNS, STEP_CSV_COLUMNS, strict=True):
            cols[c] += np.asarray(res.steps[k], dtype=STEP_COLUMNS[k]).tolist()
    return cols


def _overrides(num_requests: int | None, seed: int | None, set: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if set is not None and not isinstance(set, Mapping):  # the CLI's "key=value" text, or pairs
        raise ScenarioError(f"set must map dotted keys to values, e.g. {{'policy.max_num_seqs': 64}}; got "
                            f"{type(set).__name__} {set!r}")
    for key, value in (set or {}).items():
        if not isinstance(key, str) or not key.strip():
            raise ScenarioError(f"set: keys are dotted scenario keys (e.g. 'policy.max_num_seqs'), got {key!r}")
        out[key.strip()] = value
    if num_requests is not None:
        if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
            raise ScenarioError(f"num_requests must be an integer >= 1, got {num_requests!r}")
        out["workload.num_requests"] = num_requests
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ScenarioError(f"seed must be an integer >= 0, got {seed!r}")
        out["seed"] = seed
    return out


def scenario_with(scenario: str | os.PathLike | Mapping[str, Any], overrides: Mapping[str, Any]
                  ) -> tuple[Scenario, dict[str, Any], str]:
    """(validated scenario, raw dict, source name) of a YAML file's path or a dict with ``overrides`` (dotted key
    -> value, as ``--set``) applied; a dict is copied first."""
    if isinstance(scenario, Mapping):
        raw = copy.deepcopy(dict(scenario))
        for key, value in overrides.items():
            try:
                apply_override(raw, key, value)
            except ScenarioError as e:
                raise ScenarioError(f"scenario: set {e}") from None
        return parse_scenario(raw, source="scenario"), raw, "scenario"
    if isinstance(scenario, (str, os.PathLike)):
        sc, raw = load_scenario(scenario, dict(overrides))  # a str as given: "" is no folder
        return sc, raw, os.fspath(scenario)
    raise ScenarioError(f"scenario must be a YAML file's path or a dict, got {type(scenario).__name__}")


def _unpredicted(prepared: Any) -> list[str]:
    """``VARIANT: note`` for each variant whose user's policy reads predicted_output_len without a predictor, and
    whose policy orders by prefix-cache hits without prefix caching (lpm)."""
    from sim.loop.build import build, uncached_note
    from sim.policies.user import UserPolicy

    notes = []
    for _, _, cfgs in prepared.plans[:1]:  # the first sweep point's variants: the same classes at every point
        for cfg in cfgs:
            if (note := uncached_note(cfg)) is not None:
                notes.append(f"{cfg.name}: {note}")
            if getattr(cfg.policy, "type", None) == "custom" and cfg.cluster is None and cfg.disaggregation is None:
                policy = build(cfg)[0]
                if isinstance(policy, UserPolicy) and (note := policy.unpredicted()) is not None:
                    notes.append(f"{cfg.name}: {note}")
    return notes



def _policy_kinds() -> tuple[str, ...]:
    """The built-in policy kinds, ``policy.type``'s values (custom too)."""
    from typing import get_args

    from sim.policies.configs import PolicyConfig

    return tuple(get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(PolicyConfig)[0]))

def run(
    scenario: str | os.PathLike | Mapping[str, Any],
    *,
    num_requests: int | None = None,
    seed: int | None = None,
    set: Mapping[str, Any] | None = None,  # the CLI's --set, by the same name
    progress: bool = False,
    policy: Any = None,
) -> Results:
    """Simulate every variant of a scenario on the same workload, as ``servesim run`` does, and return the
    :class:`Results` (nothing is written; call ``.write(dir)`` for the run folder).

    ``scenario`` is a YAML file's path or the same content as a dict. ``num_requests`` and ``seed`` replace
    ``workload.num_requests`` and ``seed``; ``set`` maps dotted keys to values, like ``--set`` (the values are
    Python values, not YAML text). ``policy``: a policy object of your own (a ``servesim.Policy``) that becomes
    the scenario's default policy section, so every variant that names no policy of its own runs it (a fresh
    copy each); its limits take their defaults unless ``set`` gives them (``{"policy.max_num_seqs": 8}``).
    Raises :class:`ScenarioError` with one message naming what is wrong.
    """
    from sim.loop.run import prepare_scenario, run_scenario

    overrides: dict[str, Any] = {}
    if not isinstance(progress, bool):  # progress="yes" ended in an AttributeError of the run loop, unnamed
        raise ScenarioError(f"progress must be True or False, got {type(progress).__name__} {progress!r}")
    given = _overrides(num_requests, seed, set)  # set's keys trimmed, as they are applied
    if isinstance(policy, type):  # the class itself, as evaluate takes it: it failed deep in the check, unnamed
        raise ScenarioError(f"policy= takes a policy object, not the class {policy.__qualname__}: pass "
                            f"{policy.__qualname__}() (its constructor's arguments in the call)")
    if isinstance(policy, str) and policy in _policy_kinds():  # told to name it as a file's class, cls 'fcfs'
        raise ScenarioError(f"policy= takes a policy object, not the text {policy!r}: a built-in kind is named with "
                            f"set={{'policy.type': {policy!r}}}")
    if isinstance(policy, Mapping):  # a policy section: "cls python:dict: dict has no schedule(view) method"
        keys = ", ".join(f"'policy.{k}': {v!r}" for k, v in policy.items())
        raise ScenarioError(f"policy= takes a policy object, not a policy section: give its keys in set, "
                            f"set={{{keys}}}")
    if isinstance(policy, str):  # a scenario's cls: "cls python:str: str has no schedule(view) method"
        name = policy.rpartition(":")[2] or "MyPolicy"
        raise ScenarioError(f"policy= takes a policy object, not the text {policy!r}: pass {name}() from an import, "
                            f"or name the file's class with set={{'policy.type': 'custom', 'policy.cls': {policy!r}}}")
    if policy is not None:  # first, so that set's policy.* keys apply to it
        # set={"policy.type": "fcfs"} replaced the object without a word: the run was not the one asked for
        # on the trimmed keys: " policy.type" slipped past a check of set's own and then replaced the object
        clash = sorted(k for k in given
                       if k in ("policy", "policy.type", "policy.cls", "policy.args", "policy.instance"))
        if clash:
            raise ScenarioError(f"policy= and set's {clash[0]!r} both choose the policy; give one of them (set's "
                                "policy.* limits such as policy.max_num_seqs apply to the object)")
        overrides["policy"] = {"type": "custom", "cls": f"python:{type(policy).__qualname__}", "instance": policy}
    overrides.update(given)
    sc, raw, source = scenario_with(scenario, overrides)
    prepared = prepare_scenario(sc, raw, source=source)
    for note in _unpredicted(prepared):  # servesim run prints these; a Python caller gets them as warnings
        warnings.warn(note, UserWarning, stacklevel=2)
    with _quiet():
        out = run_scenario(prepared, progress=progress)
    from sim.loop.results import slow_policy_note

    for note in filter(None, map(slow_policy_note, out.results)):  # servesim run prints these too
        warnings.warn(note, UserWarning, stacklevel=2)
    doc = sc.model_dump(mode="json")
    if out.sweep:
        doc["sweep_points"] = out.sweep
    return Results(out.results, out.summaries, scenario=doc, title=f"servesim: {sc.name}")


def load(run_dir: str | os.PathLike) -> Results:
    """Read a run folder written by ``servesim run``, ``servesim engine run`` or :meth:`Results.write` back into
    :class:`Results`. Raises :class:`RunFolderError` (a :class:`ScenarioError`) when the folder or its
    summary.json is missing or unreadable."""
    from sim.output.compare import read_run

    if not isinstance(run_dir, (str, os.PathLike)):
        raise RunFolderError(f"run_dir must be a run folder's path, got {type(run_dir).__name__}")
    side = read_run(run_dir)
    p = Path(run_dir)
    doc = side.document
    scenario = doc.get("scenario") if isinstance(doc.get("scenario"), dict) else None
    name = scenario.get("name") if scenario else p.name
    return Results(None, side.summaries, scenario=scenario, title=f"servesim: {name}", source=str(p))


def compare(a: Results | str | os.PathLike, b: Results | str | os.PathLike, *,
            labels: tuple[str, str] | None = None) -> Comparison:
    """Run A against run B (each a :class:`Results` or a run folder): ``.table()`` is the summary side by side
    with the ratio B / A per metric, ``.figure()`` the overlaid latency CDFs, ``.write(dir)`` the HTML page
    ``servesim compare --out`` writes. Each run is labelled by its folder's name, or an in-memory run by its
    scenario's name; ``labels`` names them instead (two runs of one scenario, say). Where both labels are the
    same the table falls back to A and B."""
    sa, sb = _side(a), _side(b)
    if labels is not None:
        if (not isinstance(labels, (tuple, list)) or len(labels) != 2
                or not all(isinstance(x, str) and x.strip() for x in labels)):
            raise ScenarioError(f"labels must be two non-empty strings (A's, B's), got {labels!r}")
        sa.label, sb.label = labels[0].strip(), labels[1].strip()
    return compare_runs(sa, sb)


def _side(x: Results | str | os.PathLike):
    from sim.output.compare import RunSide, read_run

    if isinstance(x, Results):
        if x.source is not None and x._results is None:
            return read_run(x.source)
        recs = {r.name: list(r.requests) for r in x.results}
        return RunSide(x.name, x.summary, recs, {"variants": x.summary})
    if isinstance(x, (str, os.PathLike)):
        return read_run(x)
    raise ScenarioError(f"compare takes Results or run folders, got {type(x).__name__}")


def _rebuild(folder: Path, summary: dict[str, dict], block_size: int) -> list[RunResult]:
    """RunResults from a run folder's CSV files, for the report's figures. What the files do not hold (pooled
    ITL gaps, the device's peak FLOP/s, a variant's own block size: the scenario's default is taken) is left
    empty; the summary keeps the true metrics."""
    try:
        reqs = read_requests(folder)
        steps = read_steps(folder)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RunFolderError(f"{folder}: cannot read requests.csv / steps.csv: {e}") from None
    out = []
    for name, s in summary.items():
        st = steps.get(name) or {k: np.zeros(0, dtype=t) for k, t in STEP_COLUMNS.items()}
        cap = st.get("kv_capacity_blocks")
        duration = s.get("duration")
        out.append(RunResult(
            name=name, requests=reqs.get(name, []), steps=st, itl_gaps=np.zeros(0), itl_counts=np.zeros(0, np.int64),
            duration=float(duration) if isinstance(duration, (int, float)) and math.isfinite(duration) else 0.0,
            peak_flops=0.0, kv_capacity_blocks=int(cap.max()) if cap is not None and len(cap) else 0,
            block_size=block_size, cluster=s.get("cluster") if isinstance(s.get("cluster"), dict) else None,
            # the summary's spec_decode block holds every counter the report's section reads
            spec_decode=s.get("spec_decode") if isinstance(s.get("spec_decode"), dict) else None,
        ))
    return out
