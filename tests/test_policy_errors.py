"""A user's policy is user input: every way it can be wrong ends the run with exit 2 and one clear message, and no
run folder is written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Ran, servesim

HERE = Path(__file__).parent
POLICIES = HERE / "data" / "policies"

SCENARIO = """
name: bad-policy
seed: 0
workload:
  arrival: {{type: poisson, rate: 200.0}}
  num_requests: 20
  prompt_len: {{type: uniform, min: 20, max: 200}}
  output_len: {{type: uniform, min: 2, max: 30}}
deployment: {{model: llama-3.2-1b, gpu: l4, max_model_len: 1024}}
policy: {{type: custom, cls: "{cls}", max_num_seqs: 4{extra}}}
"""


def _scenario(tmp_path: Path, cls: str, extra: str = "") -> Path:
    """The scenario of a run of ``cls`` (with ``extra`` policy keys), the bad policies' files beside it."""
    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    (tmp_path / "broken_import.py").write_text((POLICIES / "broken_import.py").read_text())
    (tmp_path / "base_exception_import.py").write_text((POLICIES / "base_exception_import.py").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls=cls, extra=extra))
    return sc


def _run(tmp_path: Path, cls: str, extra: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """servesim run in a process of its own: for what a process shows (signals, the watchdog, sys.path, exit)."""
    sc = _scenario(tmp_path, cls, extra)
    return subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(sc), "--out", str(tmp_path / "out"), "-q"],
                          capture_output=True, text=True, timeout=300, cwd=HERE.parent,
                          env=None if env is None else {**os.environ, **env})


def _here(tmp_path: Path, cls: str, extra: str = "", env: dict[str, str] | None = None) -> Ran:
    """servesim run in this process (tests/conftest.py's servesim(): the exit status and stderr a process gives, a
    traceback included), for the tests about the message, not the process: an interpreter costs ~1 s of CPU."""
    return _run_here(_scenario(tmp_path, cls, extra), tmp_path, env)


def _run_here(scenario: Path, tmp_path: Path, env: dict[str, str] | None = None) -> Ran:
    """``servesim run SCENARIO --out TMP/out -q`` from the repository's root, in this process."""
    return servesim("run", str(scenario), "--out", str(tmp_path / "out"), "-q", cwd=HERE.parent, env=env)


CASES = [
    # a tournament spec names its policies' files relative to itself: "relative to the scenario file" misled there
    ("missing.py:X", "", "missing.py: file not found (a path is relative to the file that names it, a scenario or a "
     "tournament spec; from the command line (--set, --sweep) or in a scenario given from Python as a dict, to the "
     "working folder)"),
    # a typo in the file's name: told only where paths start from
    ("bad_policie.py:Idle", "", "to the working folder); did you mean bad_policies.py?"),
    ("bad_policies.py:Nope", "", "has no 'Nope' (its classes: AdmitsWithAnUnprintable, ClockReader, "
     "DescribesWithAnUnprintable, Fewest, ForgetsAReturn, Idle, NeedsArgs"),
    ("bad_policies.py", "", "expected 'path/to/file.py:ClassName'"),
    # a notebook's class named in a scenario then run from the command line, where __main__ is servesim itself
    ("__main__:Mine", "", "(__main__ names a class of the Python script or notebook running servesim.run; from the "
     "command line name the file that defines it, 'my_policy.py:Class')"),
    # the module form for a file beside the scenario named no other way to write it
    ("no_such_pkg.mod:X", "", "no_such_pkg.mod: no such module (No module named 'no_such_pkg'); a file of your own "
     "is named by its path: 'no_such_pkg/mod.py:X'"),
    ("bad_policies:Idle", "", "bad_policies: no such module (No module named 'bad_policies'); a file of your own is "
     "named by its path: 'bad_policies.py:Idle'"),
    # a path without .py: "importing it raised TypeError: the 'package' argument is required to perform a relative
    # import for './bad_policies'"; and 'bad_policies.Py' was told to write 'bad_policies/Py.py'
    ("./bad_policies:Idle", "", "./bad_policies: not a module name; a file of your own is named by its path, ending in "
     ".py: './bad_policies.py:Idle'"),
    ("bad_policies.Py:Idle", "", "bad_policies.Py: not a module name; a file of your own is named by its path, ending "
     "in .py: 'bad_policies.py:Idle'"),
    ("broken_import.py:X", "", "importing it raised ZeroDivisionError: division by zero (line 3)"),
    ("bad_policies.py:LIMIT", "", "bad_policies.py:LIMIT is an int, not a class"),  # was "is a int"
    ("bad_policies.py:NoSchedule", "", "NoSchedule does not override schedule(view)"),
    ("bad_policies.py:NotAPolicy", "", "NotAPolicy has no schedule(view) method"),
    ("bad_policies.py:NeedsArgs", "", "constructing it with args {} raised TypeError"),
    ("bad_policies.py:NeedsArgs", ", args: {threshold: -1}", "threshold must be >= 0, got -1"),
    ("bad_policies.py:NeedsArgs", ", args: {thresh: 1}", "unexpected keyword argument 'thresh' (NeedsArgs's "
     "constructor takes threshold; did you mean threshold?)"),
    # **kwargs forwarded to QueuePolicy: Python's message named QueuePolicy.__init__, not what the class takes
    ("bad_policies.py:ShortAheadForwardsArgs", ", args: {shrt: 1}", "raised TypeError: QueuePolicy.__init__() got an "
     "unexpected keyword argument 'shrt' (ShortAheadForwardsArgs's constructor takes short, enable_chunked_prefill, "
     "preemption_mode; did you mean short?)"),
    # args of the wrong type for the constructor's annotation (threshold: int): "abc" failed mid-run in the user's
    # own comparison, with no word of args; true and 2.5 ran silently
    ("bad_policies.py:NeedsArgs", ", args: {threshold: abc}", "bad_policies.py:NeedsArgs: args threshold='abc' "
     "does not fit NeedsArgs's constructor, which takes threshold: int (input should be a valid integer)"),
    ("bad_policies.py:NeedsArgs", ", args: {threshold: true}", "args threshold=True does not fit NeedsArgs's "
     "constructor, which takes threshold: int"),
    ("bad_policies.py:NeedsArgs", ", args: {threshold: 2.5}", "args threshold=2.5 does not fit"),
    ("bad_policies.py:Raises", "", "Raises: schedule(view) at t="),
    ("bad_policies.py:ReturnsNone", "", "schedule returned NoneType, not a servesim.Plan"),
    # `return servesim.Plan` without the call: 'schedule returned type', which named no mistake
    ("bad_policies.py:ReturnsPlanClass", "", "schedule returned type, not a servesim.Plan object (it returned the class "
     "itself: build one, plan = servesim.Plan(), and return it)"),
    ("bad_policies.py:TooMany", "", "more than max_num_seqs 4"),
    ("bad_policies.py:Twice", "", "schedules request 0 twice"),
    ("bad_policies.py:Idle", "", "simulation stalled: 20 requests without outcome"),
    # a policy that keeps the loop going but never lets a request finish ran until it was killed
    ("bad_policies.py:TakesBackWhatItPlans", "", "TakesBackWhatItPlans: simulation stalled at t=241.804167 s: no "
     "request arrived, started, generated a token or ended over the last 16384 asks of the policy (193.4 s), with 20 "
     "requests in its queues (0 running) needing 2742 tokens (a policy that plans nothing but asks to be woken again, "
     "or takes back what it planned, never lets a request finish; a policy waiting on the clock"),
    ("bad_policies.py:WakesForever", "", "WakesForever: simulation stalled at t=204.679497 s: no request arrived, "
     "started, generated a token or ended over the last 16384 asks of the policy (163.8 s)"),
    # sys.exit in a user's code ended servesim with that status and no message; a __str__ that raises, or a
    # describe() that does, gave a traceback
    ("bad_policies.py:SysExits", "", "SysExits: schedule(view) at t=0.029018 s called sys.exit(0)"),
    # a KeyboardInterrupt the policy raises is no Ctrl-C: it read "interrupted while simulating", exit 130; and an
    # exception without a message is named without a colon after it (it read "raised KeyboardInterrupt: ")
    ("bad_policies.py:RaisesKeyboardInterrupt", "", "RaisesKeyboardInterrupt: schedule(view) at t=0.000000 s raised "
     "KeyboardInterrupt\n  File "),
    ("bad_policies.py:SysExitsInInit", "", "constructing it with args {} called sys.exit(3)"),
    ("bad_policies.py:RaisesInDescribe", "", "RaisesInDescribe: describe() raised RuntimeError: describe broke"),
    ("bad_policies.py:PrintsItsDescription", "", "error: policy PrintsItsDescription: describe() returned None, not a "
     "str (it returns the line the run shows)"),
    # ranks that do not compare: Python's message named only the types, under servesim's own frames (caught at
    # t=0.042423 s, two asks late, until the waiting head's None stopped passing as first come first served)
    ("bad_policies.py:RanksUnlike", "", "RanksUnlike: schedule(view) at t=0.029018 s raised TypeError: rank(req) gave "
     "None for request 1 and (0.026545128257875354, 2) for request 2, which do not compare"),
    # None from a rank for the waiting head (a branch without its `return`) made the step first come first served:
    # a queue whose other ranks are keys ran in arrival order, exit 0
    ("bad_policies.py:ForgetsAReturn", "", "ForgetsAReturn: schedule(view) at t=0.126076 s raised TypeError: "
     "rank(req) gave None for request 5 and (0, 0.1194970161892151, 19) for request 19, which do not compare (None "
     "keeps first come first served only when every request gets it)"),
    # a NaN rank: every comparison with it is false, so the queue's order was arbitrary and the run said nothing
    ("bad_policies.py:RanksNaN", "", "RanksNaN: schedule(view) at t=0.029018 s raised ValueError: rank(req) gave "
     "(nan, 3) for request 3: NaN does not order"),
    # a numpy array as the rank: numpy's "truth value of an array ... is ambiguous", naming neither rank nor request
    ("bad_policies.py:RanksByArray", "", "RanksByArray: schedule(view) at t=0.029018 s raised TypeError: rank(req) "
     "gave array(["),
    ("bad_policies.py:PreemptsWithoutRank", "", "PreemptsWithoutRank sets preempt_for_waiting but keeps first come "
     "first served (no rank(req)): a waiting request displaces running work of a larger rank, so give it rank(req)"),
    # a reason that is not a str: refuse() returning a bool rejected every request, with 'False' as the reason
    ("bad_policies.py:RefusesWithTrue", "", "RefusesWithTrue at t=0.016468 s: rejects request 0 with reason True, not "
     "a str (QueuePolicy.refuse returns None to keep a request, a reason string to reject it)"),
    # nor is "": refuse() returning "" to mean "keep it" rejected every request (prompt <= 100) and exited 0
    ("bad_policies.py:RefusesWithEmptyReason", "", "RefusesWithEmptyReason at t=0.029018 s: rejects request 2 with an "
     "empty reason '' (QueuePolicy.refuse returns None to keep a request, a reason string that says why to reject "
     "it)"),
    # plan.reject's own reason, in a policy without refuse(): it was told what QueuePolicy.refuse returns
    ("bad_policies.py:RejectsWithNoReason", "", "RejectsWithNoReason at t=0.016468 s: rejects request 0 with reason "
     "None, not a str (plan.reject(req, reason) takes a reason string, recorded in requests.csv, to reject it)"),
    # a plan's lists changed by hand: Python's unpacking error under servesim's frames, exit 1
    ("bad_policies.py:TripleByHand", "", "TripleByHand at t=0.016468 s: plan.scheduled holds (RequestView("),
    ("bad_policies.py:RejectsByHand", "", "RejectsByHand at t=0.000000 s: plan.rejected is None, not a list (build a "
     "plan with its methods: schedule, preempt, swap_in, reject)"),
    # a hook of the wrong signature: refused when the class is loaded, not at its first call mid-run
    ("bad_policies.py:TakesNoView", "", "TakesNoView has schedule(), which cannot be called as schedule(view): too many "
     "positional arguments"),
    ("bad_policies.py:RanksWithView", "", "RanksWithView has rank(req, view), which cannot be called as rank(req): "
     "missing a required argument: 'view'"),
    # a request rejected or preempted twice: the core said it was "finished" or "waiting"
    ("bad_policies.py:RejectsTwice", "", "RejectsTwice at t=0.016468 s: rejects request 0 twice"),
    ("bad_policies.py:PreemptsTwice", "", "PreemptsTwice at t=0.029018 s: preempts request 0 twice"),
    # a negative count: the scratch budget took it (a block manager given -5 tokens frees no blocks it should)
    ("bad_policies.py:SignSlip", "", "SignSlip: schedule(view) at t=0.016468 s raised ValueError: "
     "budget.allocate(req, -5) for request 0: num_new_tokens must be >= 0"),
    ("bad_policies.py:UnprintableError", "",
     "UnprintableError: schedule(view) at t=0.000000 s raised _Unprintable: (its message could not be formatted)"),
    # an exception on BaseException but not Exception (a library's own, GeneratorExit, asyncio's CancelledError) in
    # schedule, a constructor or an import: a 60-line traceback of servesim's frames and exit 1
    ("bad_policies.py:RaisesBaseException", "", "RaisesBaseException: schedule(view) at t=0.029018 s raised _Abort: "
     "gave up"),
    ("bad_policies.py:RaisesGeneratorExitInInit", "", "constructing it with args {} raised GeneratorExit: closed"),
    ("base_exception_import.py:X", "", "importing it raised CancelledError: cancelled at import (line 3)"),
    # wake_time's NaN was read as no wake-up, its text and True as seconds ("0.5": 0.5 s), silently
    ("bad_policies.py:WakesAtNaN", "", "policy WakesAtNaN: wake_time returned nan at t=0.000000 s: NaN is no time "
     "(return None when nothing is due)"),
    ("bad_policies.py:WakesAtText", "", "policy WakesAtText: wake_time returned '0.5' at t=0.000000 s, not a time in "
     "seconds or None"),
    # vLLM's name for a request's field: Python's bare "'RequestView' object has no attribute 'arrival_time'"
    ("bad_policies.py:RanksByVllmName", "", "RanksByVllmName: schedule(view) at t=0.029018 s raised AttributeError: "
     "'RequestView' object has no attribute 'arrival_time'; did you mean 'arrival'?"),
    # a note on the view: "TypeError: super(type, obj): obj must be an instance or subtype of type" (Python 3.11's
    # own __setattr__ of a frozen slots dataclass, for a name that is not a field)
    ("bad_policies.py:TagsTheView", "", "TagsTheView: schedule(view) at t=0.000000 s raised FrozenInstanceError: cannot "
     "change 'note': PolicyView is read-only (what the core shows as of this step); keep state of your own on your "
     "object (self.note = ...)"),
    # a near miss on the KV view (or the limits, the plan, the budget): only RequestView's own names were suggested
    ("bad_policies.py:ReadsKVFreeBlocks", "", "ReadsKVFreeBlocks: schedule(view) at t=0.000000 s raised AttributeError: "
     "'KVView' object has no attribute 'free_blocks'; did you mean 'num_free_blocks'?"),
    # not a request: an object whose repr raises ended in servesim's traceback; the view filled lines with its repr
    ("bad_policies.py:SchedulesAnUnprintable", "", "SchedulesAnUnprintable at t=0.000000 s: schedules <_NoRepr "
     "instance at 0x"),
    ("bad_policies.py:SchedulesTheView", "", "SchedulesTheView at t=0.000000 s: schedules PolicyView(no...mpt_len=None)), "
     "which is not a request of the view (a RequestView)"),
    # the same for every object of the user's in a message (ranks, a preempt mode, a token count, describe()'s line):
    # a __repr__ that raised made the message raise (ranks: 'raised RuntimeError: no repr'; the others: exit 1)
    ("bad_policies.py:RanksUnprintable", "", "raised TypeError: rank(req) gave (<_NoRepr instance at 0x"),
    ("bad_policies.py:RanksNoneThenUnprintable", "", "raised TypeError: rank(req) gave None for request 1 and <_NoRepr "
     "instance at 0x"),
    ("bad_policies.py:PreemptsWithAnUnprintableMode", "", "preempts request 0 with mode <_NoRepr instance at 0x"),
    ("bad_policies.py:SchedulesUnprintableTokens", "", "schedules request 0 with <_NoRepr instance at 0x"),
    ("bad_policies.py:DescribesWithAnUnprintable", "", "describe() returned <_NoRepr instance at 0x"),
    # plan.schedule for a swapped request: the core said only "which is swapped"
    ("bad_policies.py:SchedulesSwapped", "", "SchedulesSwapped at t=0.053645 s: plan schedules request 1, which is "
     "swapped (a swapped request comes back with plan.swap_in(req, n), reserved by budget.swap_in(req) and "
     "budget.allocate(req, n))"),
    # a key of the built-in kinds that a user's class does not take (it was told "did you mean" the same key)
    ("sim.policies.queue:FCFSPolicy", ", enable_chunked_prefill: false",
     "enable_chunked_prefill: unknown key; other kinds of this section have it, the kind 'custom' not (your class's "
     "constructor arguments go under args: {args: {enable_chunked_prefill: ...}})"),
]


@pytest.mark.parametrize(("cls", "extra", "message"), CASES, ids=[c[0] + c[1] for c in CASES])
def test_bad_policy_exits_2_with_one_message(tmp_path: Path, cls: str, extra: str, message: str) -> None:
    # in-process (tests/conftest.py's servesim(): a traceback the command lets out still reaches stderr): the 44
    # cases paid 31 s of CPU for an interpreter each
    p = servesim("run", str(_scenario(tmp_path, cls, extra)), "--out", str(tmp_path / "out"), "-q", cwd=HERE.parent)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr
    assert "Traceback (most recent call last)" not in p.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_an_error_the_public_api_raises_shows_the_users_frames_only(tmp_path: Path) -> None:
    """budget.allocate(r.id, 1): the message and the user's line, without servesim's own two frames of api.py
    (allocate, _req) under them."""
    p = _here(tmp_path, "bad_policies.py:ReservesById")
    line = (POLICIES / "bad_policies.py").read_text().splitlines().index("            budget.allocate(r.id, 1)") + 1
    assert p.returncode == 2, p.stderr
    assert p.stderr.endswith("ReservesById: schedule(view) at t=0.016468 s raised TypeError: expected a request from "
                             "the view (a RequestView), got int: 0\n" + f'  File "{tmp_path / "bad_policies.py"}"'
                             f", line {line}, in schedule\n"
                             "    budget.allocate(r.id, 1)\nTypeError: expected a request "
                             "from the view (a RequestView), got int: 0\n"), p.stderr


@pytest.mark.parametrize(("cls", "swap_space", "message"), [
    ("SwapsOutUnreserved", 0, "at t=0.029018 s: plan swaps request 0 out past the free CPU swap space: request 0 "
     "needs 9 CPU blocks, 0 free"),
    ("SwapsInUnreserved", 4, "at t=0.655928 s: plan swaps request 12 in past the free KV: request 12 needs 9 blocks "
     "to swap in, 8 free"),
])
def test_a_swap_past_the_free_blocks_exits_2(tmp_path: Path, cls: str, swap_space: int, message: str) -> None:
    """A swap the budget did not reserve (a swap-out with no CPU swap space, a swap-in past the free GPU blocks) ended
    with the KV manager's BlockError and its traceback, exit 1: the core checked only the blocks of scheduled
    tokens. The message names the step's time, as every other refused plan's does (it did not)."""
    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls=f"bad_policies.py:{cls}", extra="").replace(
        "max_model_len: 1024}", f"max_model_len: 256, num_gpu_blocks: 30, swap_space: {swap_space}}}").replace(
        "max_num_seqs: 4", "max_num_seqs: 8"))
    p = _run_here(sc, tmp_path)
    assert p.returncode == 2, p.stderr
    assert f"error: variant 'bad-policy': policy {cls} {message}" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out").exists()


def test_a_module_whose_own_import_fails_is_not_called_missing(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """cls 'module:Class' for a module that is there but imports one that is not was 'no such module', with the
    hint to name it as a file (affc9f0): the user was sent looking for a file that exists."""
    from sim.policies.loader import load_class

    (tmp_path / "needs_a_dep.py").write_text("import no_such_dependency_xyz  # noqa: F401\n\n\nclass P:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        load_class("needs_a_dep:P")
    assert str(e.value) == "needs_a_dep: importing it raised ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    with pytest.raises(ValueError, match=r"^not_there_xyz: no such module .*: 'not_there_xyz.py:P'$"):
        load_class("not_there_xyz:P")


def test_a_policy_file_imports_a_module_beside_it(tmp_path: Path) -> None:
    """``from helpers import key`` in my_policy.py, helpers.py beside it: ModuleNotFoundError under the servesim
    command, whose sys.path holds its bin folder (here: the repository root, the subprocess's working folder), not
    the policy's, though `python my_policy.py` would find it."""
    (tmp_path / "policy_helpers_beside.py").write_text("def key(req):\n"
                                                       "    return (req.prompt_len, req.arrival, req.id)\n")
    (tmp_path / "mine.py").write_text("import servesim\nfrom policy_helpers_beside import key\n\n\n"
                                      "class Mine(servesim.QueuePolicy):\n    def rank(self, req):\n"
                                      "        return key(req)\n")
    p = _run(tmp_path, "mine.py:Mine")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "summary.json").exists()


def test_a_policy_file_missing_beside_the_scenario_is_not_taken_from_the_working_folder(tmp_path: Path) -> None:
    """`cls: "examples/policies/shortest_prompt_first.py:..."` in a scenario with no such file beside it, run from
    the repository's root where one is: the run went on with the working folder's file, silently (exit 0)."""
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="examples/policies/shortest_prompt_first.py:ShortestPromptFirst", extra=""))
    assert (HERE.parent / "examples" / "policies" / "shortest_prompt_first.py").is_file()  # in the working folder
    p = _run_here(sc, tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr == (f"error: {sc}: policy.custom: {tmp_path}/examples/policies/shortest_prompt_first.py: file not "
                        "found (a path is relative to the file that names it, a scenario or a tournament spec; from the "
                        "command line (--set, --sweep) or in a scenario given from Python as a dict, to the working "
                        "folder)\n"), p.stderr
    assert not (tmp_path / "out").exists()


def test_a_module_that_fails_to_import_names_its_line_from_a_relative_path(tmp_path: Path) -> None:
    """`servesim run my_scenario.yaml` from the scenario's folder, as the docs run it: the '(line 3)' of the
    message was left out, the frames naming the file by its absolute path and the check by the relative one."""
    (tmp_path / "broken_import.py").write_text((POLICIES / "broken_import.py").read_text())
    (tmp_path / "s.yaml").write_text(SCENARIO.format(cls="broken_import.py:X", extra=""))
    p = servesim("run", "s.yaml", "--out", "out", "-q", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.endswith("broken_import.py: importing it raised ZeroDivisionError: division by zero (line 3)\n"), \
        p.stderr


def test_an_exception_in_a_policy_shows_the_users_frames(tmp_path: Path) -> None:
    p = _here(tmp_path, "bad_policies.py:Raises")
    assert "KeyError: 'no such key'" in p.stderr
    assert "bad_policies.py" in p.stderr and "in helper" in p.stderr  # the user's own frames
    assert "sim/policies/user.py" not in p.stderr  # not servesim's


@pytest.mark.parametrize(("cls", "message"), [("RanksUnlike", "which do not compare"),
                                              ("RanksNaN", "NaN does not order")])
def test_an_error_servesim_finds_in_a_hooks_result_is_said_once(tmp_path: Path, cls: str, message: str) -> None:
    """A rank error found by servesim (no frame of the user's below it) printed its message twice: the error line,
    then the same line again as the bare exception line of an empty traceback."""
    p = _here(tmp_path, f"bad_policies.py:{cls}")
    assert p.returncode == 2 and p.stderr.count(message) == 1, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: "), p.stderr  # the error's line ends the output


def _check(tmp_path: Path, cls: str) -> Ran:
    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls=cls, extra="").replace("rate: 200.0", "rate: 20.0").replace(
        "num_requests: 20", "num_requests: 60").replace("max: 30}", "max: 300}"))
    return servesim("check-policy", str(sc), cwd=HERE.parent)


def test_check_mode_names_the_first_step_a_wrong_declaration_changes(tmp_path: Path) -> None:
    p = _check(tmp_path, "bad_policies.py:ClockReader")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "DIFFERS: step " in p.stdout and "depends_on misses" in p.stdout
    # the two values in as few digits as tell them apart, as docs/write-a-policy.md shows them (not 17 of each)
    from sim.policies.check import _apart

    assert re.search(r" is [0-9.e-]{1,8} with the fast path, [0-9.e-]{1,8} stepping one by one", p.stdout), p.stdout
    assert _apart(0.03793607946479316, 0.025680997314422527) == ("0.03794", "0.02568")
    assert _apart(0.0119000001, 0.0119000002) == ("0.0119000001", "0.0119000002")
    assert _apart(3, 4) == ("3", "4") and _apart(0.5, "no step") == ("0.5", "no step")


def test_check_mode_passes_a_correct_declaration(tmp_path: Path) -> None:
    p = _check(tmp_path, "sim.policies.priority:PriorityPolicy")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok, the fast path gives the same" in p.stdout


def test_check_mode_on_a_sweep_says_how_to_pick_a_point(tmp_path: Path) -> None:
    """'pick one with --set' did not say how: --set workload.arrival.rate=8 alone kept the sweep, and the same
    error came back."""
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="sim.policies.priority:PriorityPolicy", extra="").replace(
        "rate: 200.0", "rate: 20.0") + "sweep: {workload.arrival.rate: [10, 20]}\n")
    cmd = ["check-policy", str(sc), "--set", "workload.arrival.rate=8"]
    p = servesim(*cmd, cwd=HERE.parent)
    assert p.returncode == 2 and p.stderr == ("error: check-policy runs a scenario's variants, not its sweep points: "
                                              "drop the sweep with --set sweep=null and pick its point with --set "
                                              "(--set workload.arrival.rate=8)\n"), p.stderr
    p = servesim(*cmd, "--set", "sweep=null", cwd=HERE.parent)
    assert p.returncode == 0 and "ok, the fast path gives the same" in p.stdout, p.stdout + p.stderr


def test_the_run_says_when_a_users_policy_is_asked(tmp_path: Path) -> None:
    """A user on the wrong declaration should know what it costs (vLLM PR #43724: a custom scheduler silently lost
    its fast path)."""
    for cls, words in (("bad_policies.py:NeedsArgs", "asked at arrivals, finishes and KV shortages"),
                       ("bad_policies.py:TooMany", "asked before every step")):
        p = _here(tmp_path, cls, ", args: {threshold: 1}" if "NeedsArgs" in cls else "")
        assert words in p.stderr, p.stderr


def test_the_run_says_when_a_policy_reads_a_prediction_it_has_no_predictor_for(tmp_path: Path) -> None:
    """Shortest job first written as ``rank = (req.predicted_output_len, req.arrival, req.id)`` with no predictor:
    every prediction is None, None ties with None, and the run was first come first served without a word."""
    (tmp_path / "mine.py").write_text("import servesim\n\n\ndef size(req):\n    return req.predicted_output_len\n"
                                      "\n\nclass Mine(servesim.QueuePolicy):\n    def rank(self, req):\n"
                                      "        return (size(req), req.arrival, req.id)\n")
    note = ("bad-policy: policy Mine reads predicted_output_len, but the policy has no predictor, so it is None for "
            "every request: set its predictor (predictor: {type: oracle}, lognormal or buckets)")
    p = _here(tmp_path, "mine.py:Mine")
    assert p.returncode == 0 and note in p.stderr.splitlines(), p.stderr
    p = _here(tmp_path, "mine.py:Mine", ", predictor: {type: oracle}")
    assert p.returncode == 0 and "predicted_output_len" not in p.stderr, p.stderr
    p = _here(tmp_path, "bad_policies.py:Idle")  # a class that never reads it: no note
    assert "predicted_output_len" not in p.stderr, p.stderr


@pytest.mark.parametrize(("cls", "line"), [("Spins", "while view.now >= 0"), ("Sleeps", "time.sleep(3600)")])
def test_a_policy_that_never_returns_is_stopped(tmp_path: Path, cls: str, line: str) -> None:
    """A loop that never ends, or a wait on nothing: stopped after SERVESIM_POLICY_TIMEOUT_S (60 s by default) with
    one message naming the call and the user's line it was in, exit 2, nothing written; never a hang."""
    p = _run(tmp_path, f"bad_policies.py:{cls}", env={"SERVESIM_POLICY_TIMEOUT_S": "0.5"})
    assert p.returncode == 2, p.stderr
    assert f"policy {cls}: schedule(view) at t=" in p.stderr and "did not return within 0.5 s" in p.stderr, p.stderr
    assert line in p.stderr and "bad_policies.py" in p.stderr  # where the user's code was stopped
    assert "Traceback (most recent call last)" not in p.stderr and "sim/policies/user.py" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_a_constructor_or_module_that_never_returns_is_stopped(tmp_path: Path) -> None:
    """Importing a user's module and constructing its class run the user's code at validation: a constructor or a
    module that never finished hung the run before any watch was armed. Each is stopped as a schedule() is."""
    p = _run(tmp_path, "bad_policies.py:SleepsInInit", env={"SERVESIM_POLICY_TIMEOUT_S": "0.5"})
    assert p.returncode == 2, p.stderr
    assert "SleepsInInit: constructing it with args {} did not return within 0.5 s" in p.stderr, p.stderr
    assert "time.sleep(3600)" in p.stderr and "Traceback (most recent call last)" not in p.stderr
    (tmp_path / "hangs.py").write_text("import time\n\ntime.sleep(3600)\n")
    p = _run(tmp_path, "hangs.py:X", env={"SERVESIM_POLICY_TIMEOUT_S": "0.5"})
    assert p.returncode == 2, p.stderr
    assert "hangs.py:X: importing it did not return within 0.5 s" in p.stderr, p.stderr
    assert 'hangs.py", line 3, in <module>' in p.stderr and "loader.py" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_policy_time_limit_is_named(tmp_path: Path) -> None:
    for value in ("abc", "0", "-1", "inf"):
        p = _here(tmp_path, "bad_policies.py:Spins", env={"SERVESIM_POLICY_TIMEOUT_S": value})
        assert p.returncode == 2, p.stderr
        assert f"SERVESIM_POLICY_TIMEOUT_S must be a number of seconds > 0, got {value!r}" in p.stderr, p.stderr


def test_ctrl_c_inside_a_policy_is_still_ctrl_c(tmp_path: Path) -> None:
    """Only the watchdog's own interrupt becomes a policy error: the user's Ctrl-C stops the run as Ctrl-C does."""
    p = _run(tmp_path, "bad_policies.py:PressesCtrlC")
    assert p.returncode == 130, p.stderr
    assert "did not return" not in p.stderr


def test_a_policy_that_catches_the_watchdogs_interrupt_is_still_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy's own ``except:`` may swallow the watchdog's KeyboardInterrupt. The same call, still running a limit
    later, is stopped again; and once the call has returned, the next call is watched as any other and a Ctrl-C in
    it is still Ctrl-C (before: the stale stop disabled the watchdog for the rest of the process and turned every
    later Ctrl-C into a timeout error)."""
    import signal
    import time

    from sim.policies.user import PolicyError, call_user
    from sim.policies.watchdog import WATCH

    monkeypatch.setenv("SERVESIM_POLICY_TIMEOUT_S", "0.3")
    WATCH.arm()

    def swallows() -> str:
        try:
            time.sleep(30)
        except KeyboardInterrupt:
            return "went on"
        return "slept"

    def spins(seconds: float) -> str:
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            pass
        return "returned"

    def swallows_then_spins() -> str:
        swallows()
        return spins(10)

    def ctrl_c() -> None:
        signal.raise_signal(signal.SIGINT)  # as the terminal sends it

    def raises_it() -> None:
        raise KeyboardInterrupt

    assert call_user("swallows", swallows) == "went on"
    with pytest.raises(KeyboardInterrupt):
        call_user("ctrl_c", ctrl_c)
    # a KeyboardInterrupt the policy raises itself is its error (before: taken for Ctrl-C, exit 130)
    with pytest.raises(PolicyError, match=r"^raises_it raised KeyboardInterrupt"):
        call_user("raises_it", raises_it)
    with pytest.raises(PolicyError, match=r"^spins did not return within 0.3 s"):
        call_user("spins", spins, 10)
    with pytest.raises(PolicyError, match=r"^swallows_then_spins did not return within 0.3 s"):
        call_user("swallows_then_spins", swallows_then_spins)


def test_ctrl_c_through_a_librarys_python_sigint_handler_is_a_ctrl_c() -> None:
    """A library's SIGINT handler that ends with ``raise KeyboardInterrupt`` (after its own cleanup) made Ctrl-C in
    a policy call read as the policy's raise: "schedule raised KeyboardInterrupt", exit 2, not 130. The policy's own
    raise stays its error under that handler."""
    import signal

    from sim.policies.user import PolicyError, call_user

    def library_handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def ctrl_c() -> None:
        signal.raise_signal(signal.SIGINT)  # as the terminal sends it

    def raises_it() -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, library_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            call_user("ctrl_c", ctrl_c)
        with pytest.raises(PolicyError, match=r"^raises_it raised KeyboardInterrupt"):
            call_user("raises_it", raises_it)
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_policy_that_never_returns_is_stopped_where_sigint_is_ignored(tmp_path: Path) -> None:
    """A run started in the background by a script (or under nohup) begins with SIGINT ignored, and Python then drops
    the watchdog's interrupt: the run hung. It is stopped as anywhere else, exit 2."""
    import signal

    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="bad_policies.py:Spins", extra=""))
    p = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(sc), "--out", str(tmp_path / "out"), "-q"],
                       capture_output=True, text=True, timeout=60, cwd=HERE.parent,
                       env={**os.environ, "SERVESIM_POLICY_TIMEOUT_S": "0.5"},
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert p.returncode == 2, p.stderr
    assert "did not return within 0.5 s" in p.stderr and "while view.now >= 0" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_forked_worker_watches_a_policy_made_before_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker forked after the policy was made (the watcher armed in the parent) has its calls watched too, at the
    parent's limit: before, the child had no watcher until something armed it again, and its calls ran unstopped."""
    import signal
    import time

    from sim.policies.user import PolicyError, call_user
    from sim.policies.watchdog import WATCH

    monkeypatch.setenv("SERVESIM_POLICY_TIMEOUT_S", "0.3")
    WATCH.arm()

    def spins() -> str:
        t = time.monotonic()
        while time.monotonic() - t < 10:
            pass
        return "returned"

    pid = os.fork()
    if pid == 0:  # the child: exit 0 when stopped with the parent's limit
        code = 1
        try:
            call_user("spins", spins)
        except PolicyError as e:
            code = 0 if "did not return within 0.3 s" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_sigint_left_to_the_system_still_stops_a_policy_and_still_ends_the_process(tmp_path: Path) -> None:
    """A script that sets SIGINT to SIG_DFL (Ctrl-C ends it at once, no traceback) and then runs servesim: a policy
    that never returns is stopped (it hung: Python drops the watchdog's interrupt for a signal it does not handle),
    and a SIGINT from outside still ends the process as SIG_DFL does."""
    import signal

    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="bad_policies.py:Spins", extra=""))
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
              f"sys.argv = ['servesim', 'run', {str(sc)!r}, '--out', {str(tmp_path / 'out')!r}, '-q']; "
              "from sim.cli.main import main; main()")
    env = {**os.environ, "SERVESIM_POLICY_TIMEOUT_S": "0.5"}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=HERE.parent,
                       env=env)
    assert p.returncode == 2, p.stderr
    assert "did not return within 0.5 s" in p.stderr and "while view.now >= 0" in p.stderr, p.stderr
    # the same run with a limit far off, sent SIGINT while the policy spins: ended by the signal, as before. The
    # policy touches a file as it starts to spin, so the signal goes as soon as it spins (a fixed 8 s wait spun a
    # core for about 6 s of it).
    import time

    spinning = tmp_path / "spinning"
    (tmp_path / "spins_said.py").write_text(
        "from pathlib import Path\n\nimport servesim\n\n\nclass SpinsSaid(servesim.QueuePolicy):\n"
        "    def schedule(self, view):\n"
        f"        Path({str(spinning)!r}).touch()\n"
        "        while view.now >= 0:\n            pass\n")
    sc.write_text(SCENARIO.format(cls="spins_said.py:SpinsSaid", extra=""))
    env["SERVESIM_POLICY_TIMEOUT_S"] = "600"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=HERE.parent, env=env)
    deadline = time.monotonic() + 60
    while not spinning.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert spinning.exists(), proc.communicate(timeout=30)  # the run started and the policy spins
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == -signal.SIGINT
    proc.communicate()


def test_a_call_that_calls_a_policy_itself_is_still_watched_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that runs a simulation of its own (a nested run: its policy's calls go through call_user inside the
    outer call) is still watched once the inner calls return: before, the inner call's end marked the main thread
    as outside any call, and the outer call then ran unstopped."""
    import signal
    import time

    from sim.policies.user import PolicyError, call_user
    from sim.policies.watchdog import WATCH

    monkeypatch.setenv("SERVESIM_POLICY_TIMEOUT_S", "0.3")
    WATCH.arm()

    def outer() -> str:
        call_user("inner", lambda: None)
        t = time.monotonic()
        while time.monotonic() - t < 10:
            pass
        return "returned"

    with pytest.raises(PolicyError, match=r"^outer did not return within 0.3 s"):
        call_user("outer", outer)
    assert not WATCH.inside


def test_an_async_schedule_is_named_without_a_never_awaited_warning(tmp_path: Path) -> None:
    # `async def schedule` returned a coroutine: the message said only "returned coroutine", and Python then
    # printed "RuntimeWarning: coroutine 'ScheduleIsAsync.schedule' was never awaited" and a hint about tracemalloc
    # under it, two more lines that looked like a second error.
    p = _run(tmp_path, "bad_policies.py:ScheduleIsAsync")
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines()[-1] == (
        "error: variant 'bad-policy': policy ScheduleIsAsync: schedule returned coroutine, not a servesim.Plan "
        "(schedule is an async def: the core calls it as a plain function)")
    assert "RuntimeWarning" not in p.stderr and not (tmp_path / "out").exists()


def test_a_number_yaml_reads_as_text_is_the_float_a_float_arg_takes() -> None:
    # PyYAML (YAML 1.1) reads 6e0, 5e-4 and 1.0e3 as text (an exponent wants a sign and a point). A scenario's own
    # number fields take them as numbers (--set deployment.gpu_memory_utilization=9e-1 runs), but a user's class
    # given args {service_rate: 6e0} was told "args service_rate='6e0' does not fit SLOAdmission's constructor,
    # which takes service_rate: float (input should be a valid number)", exit 2. Now the float it spells, where the
    # annotation takes a float and not text; elsewhere the text stays text
    import servesim
    from sim.policies.loader import fitted_args

    example = HERE.parent / "examples" / "policies" / "slo_admission.yaml"
    spelled, plain = (servesim.run(example, num_requests=20, set={"variants.1.policy.args.service_rate": v}).summary
                      for v in ("6e0", 6.0))
    assert spelled == plain

    class Mixed:
        def __init__(self, rate: float, limit: float | None = None, name: str = "", either: str | float = 0,
                     count: int = 0) -> None:
            pass

    assert fitted_args(Mixed, {"rate": "5e-4", "limit": "-1.5E+3", "name": "1e3", "either": "2e1"}) == {
        "rate": 5e-4, "limit": -1500.0, "name": "1e3", "either": "2e1"}
    with pytest.raises(ValueError, match=r"args count='1e3' does not fit Mixed's constructor, which takes count: int"):
        fitted_args(Mixed, {"count": "1e3"})
    with pytest.raises(ValueError, match=r"args rate='1024' does not fit"):  # a quoted number stays text
        fitted_args(Mixed, {"rate": "1024"})
    with pytest.raises(ValueError, match=r"args rate='1e400' does not fit"):  # past a float: not inf, silently
        fitted_args(Mixed, {"rate": "1e400"})


FILLS_BATCH = """
import servesim


class FillsBatch(servesim.Policy):
    \"\"\"Static batching: holds arrivals until 8 wait (or the oldest has waited 30 s), looking every millisecond, then
    runs the batch to its end.\"\"\"

    def schedule(self, view):
        plan = servesim.Plan()
        budget = view.kv.budget()
        if view.running:
            for r in view.running:
                if budget.allocate(r, 1):
                    plan.schedule(r, 1)
        elif len(view.waiting) >= 8 or (view.waiting and view.now - view.waiting[0].arrival > 30.0):
            for r in view.waiting[:8]:
                if budget.allocate(r, r.prompt_len):
                    plan.schedule(r, r.prompt_len)
        return plan

    def wake_time(self, view):
        return view.now + 0.001 if view.waiting and not view.running else None
"""


def test_a_policy_waiting_on_the_clock_for_a_batch_to_fill_is_not_stalled(tmp_path: Path) -> None:
    """A policy that looks every millisecond while it holds a partial batch is waiting, not stuck: at 0.5 req/s it
    was stopped as stalled at t=14.8 s, 8,192 asks after the last outcome with 5 short requests held (557 tokens).
    Arrivals now count as the run moving on, and a wait on the clock alone (the last 5 of 13 requests held 30 s for
    a batch that never fills) is stopped only after 60 simulated seconds."""
    import servesim

    (tmp_path / "batch.py").write_text(FILLS_BATCH)
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="batch.py:FillsBatch", extra="").replace("rate: 200.0", "rate: 0.5")
                  .replace("num_requests: 20", "num_requests: 13").replace("max_num_seqs: 4", "max_num_seqs: 8"))
    res = servesim.run(sc)
    assert res.summary["bad-policy"]["num_completed"] == 13


HOLDS_UNTIL = """
import servesim


class HoldsUntil(servesim.Policy):
    \"\"\"Runs nothing before t=150 s (an off-peak window), then every request; asks to be woken at 150 s, or, polling,
    every millisecond.\"\"\"

    def __init__(self, poll: bool = False) -> None:
        self.poll = poll

    def schedule(self, view):
        plan = servesim.Plan()
        if view.now < 150.0:
            return plan
        budget = view.kv.budget()
        for r in [*view.running, *view.waiting][:view.limits.max_num_seqs]:
            n = r.num_tokens - r.num_computed_tokens
            if budget.allocate(r, n):
                plan.schedule(r, n)
        return plan

    def wake_time(self, view):
        if view.now >= 150.0 or not view.waiting:
            return None
        return view.now + 0.001 if self.poll else 150.0
"""


def test_a_policy_waiting_past_the_stall_rule_is_told_to_ask_for_the_time_it_waits_for(tmp_path: Path) -> None:
    """A policy holding requests for a window of 150 s is waiting, not stuck: asked to be woken at the window's
    time it runs to the end; polling every millisecond it is stopped 60 s into the wait, as a policy that only asks to be
    woken is, and the message said nothing of the way out (the rule cannot tell the two apart)."""
    import servesim

    (tmp_path / "hold.py").write_text(HOLDS_UNTIL)
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="hold.py:HoldsUntil", extra=""))
    assert servesim.run(sc).summary["bad-policy"]["num_completed"] == 20
    with pytest.raises(servesim.ScenarioError) as e:
        servesim.run(sc, set={"policy.args.poll": True})
    assert str(e.value).endswith(
        "never lets a request finish; a policy waiting on the clock for longer returns the time it waits for from "
        "wake_time(view), rather than asking again every few milliseconds)"), e.value


def test_a_sweep_over_a_policy_file_finds_it_beside_the_scenario(tmp_path: Path) -> None:
    """`sweep: {policy.cls: ["mine.py:Mine", ...]}` with mine.py beside the scenario, run from another folder: each
    point's file was looked for in the working folder ("mine.py: file not found"), though the scenario's own
    policy.cls beside it was found; a whole policy section swept alike."""
    import servesim

    (tmp_path / "mine.py").write_text("from sim.policies.queue import FCFSPolicy\n\n\nclass Mine(FCFSPolicy):\n"
                                      "    pass\n\n\nclass Other(FCFSPolicy):\n    pass\n")
    sc = tmp_path / "s.yaml"
    text = SCENARIO.format(cls="mine.py:Mine", extra="")
    assert Path.cwd() != tmp_path
    for sweep in ('{policy.cls: ["mine.py:Mine", "mine.py:Other"]}',
                  '{policy: [{type: custom, cls: "mine.py:Other", max_num_seqs: 4}]}'):
        sc.write_text(text + f"sweep: {sweep}\n")
        runs = [s for s in servesim.run(sc).summary.values() if isinstance(s, dict) and "num_completed" in s]
        assert runs and [s["num_completed"] for s in runs] == [20] * len(runs), sweep


def test_a_policy_file_named_on_the_command_line_is_relative_to_the_working_folder(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`servesim run other/s.yaml --set policy.cls=mine.py:Mine` (or --sweep policy.cls=...) with mine.py in the
    working folder, as --out and --profile are: since the scenario's own files are looked for beside it only, the
    command line's was too ("file not found" beside the scenario)."""
    from sim.config.scenario import load_scenario
    from sim.loop.run import prepare_scenario

    (tmp_path / "other").mkdir()
    sc = tmp_path / "other" / "s.yaml"
    sc.write_text(SCENARIO.format(cls="sim.policies.queue:FCFSPolicy", extra=""))
    (tmp_path / "mine.py").write_text("from sim.policies.queue import FCFSPolicy\n\n\nclass Mine(FCFSPolicy):\n"
                                      "    pass\n")
    monkeypatch.chdir(tmp_path)
    loaded, _ = load_scenario(sc, {"policy.cls": "mine.py:Mine"})
    assert loaded.policy.make().__class__.__name__ == "Mine"
    loaded, raw = load_scenario(sc, {"sweep": {"policy.cls": ["mine.py:Mine"]}})
    prepare_scenario(loaded, raw, source=str(sc))  # each point's class found


def test_a_policy_slower_than_its_steps_is_said(tmp_path: Path) -> None:
    """A policy whose own schedule calls take longer than the steps it plans ran as fast as FCFS and said nothing:
    no clock here counts them, while a real server's scheduler runs between its steps. FCFS is not named."""
    import re

    p = _here(tmp_path, "bad_policies.py:SlowToPlan")
    assert p.returncode == 0, p.stderr
    m = re.search(r"\nbad-policy: the policy's own schedule calls took ([0-9.]+) s over ([0-9,]+) asks \(([0-9.]+) ms "
                  r"each\), ([0-9]+)% of the ([0-9.]+) s its steps took; no clock here counts that time", p.stderr)
    assert m is not None, p.stderr
    assert float(m[3]) >= 5.0 and int(m[4]) > 25
    fast = _here(tmp_path, "sim.policies.queue:FCFSPolicy")
    assert fast.returncode == 0 and "policy's own" not in fast.stderr, fast.stderr


def test_the_run_says_when_a_policy_orders_by_prefix_hits_no_cache_keeps(tmp_path: Path) -> None:
    """lpm (SGLang's longest prefix match) without prefix caching: every request shows 0 cached tokens, so it
    served first come first served, and a comparison of lpm with fcfs showed no difference without a word. The
    same for a class of one's own that reads num_cached_tokens."""
    import warnings

    import servesim

    (tmp_path / "mine.py").write_text("import servesim\n\n\nclass CacheFirst(servesim.QueuePolicy):\n"
                                      "    def schedule(self, view):\n        self.kv = view.kv\n"
                                      "        return super().schedule(view)\n\n    def rank(self, req):\n"
                                      "        return (-self.kv.num_cached_tokens(req), req.arrival, req.id)\n")
    scenario = SCENARIO.format(cls="", extra="").split("policy:")[0] + (
        "variants:\n  - {name: lpm, policy: {type: lpm}}\n"
        "  - {name: lpm-cached, policy: {type: lpm}, kv_cache: {type: paged, enable_prefix_caching: true}}\n"
        "  - {name: mine, policy: {type: custom, cls: 'mine.py:CacheFirst'}}\n")
    (tmp_path / "s.yaml").write_text(scenario)
    p = _run_here(tmp_path / "s.yaml", tmp_path)
    assert p.returncode == 0, p.stderr
    keeps = "(kv_cache: {type: paged, enable_prefix_caching: true} keeps them)"
    lpm = ("lpm: lpm orders by prefix-cache hits, but the KV cache keeps no prefixes: every request shows 0 cached "
           f"tokens, so it serves first come first served {keeps}")
    mine = ("mine: policy CacheFirst reads num_cached_tokens, but the KV cache keeps no prefixes: every request shows "
            f"0 cached tokens {keeps}")
    lines = p.stderr.splitlines()
    assert lpm in lines and mine in lines and not any(s.startswith("lpm-cached:") for s in lines), p.stderr
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        servesim.run(str(tmp_path / "s.yaml"), num_requests=5)
    assert lpm in [str(w.message) for w in caught]


def test_a_policy_that_never_preempts_is_told_why_it_stalled(tmp_path: Path) -> None:
    """Running requests that fill the KV cache while the policy preempts none: the stall said "a policy never
    schedules them?", though it had scheduled them all; it now names the full cache and the missing preemption."""
    (tmp_path / "bad_policies.py").write_text((POLICIES / "bad_policies.py").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.format(cls="bad_policies.py:NeverPreempts", extra="").replace(
        "max_model_len: 1024}", "max_model_len: 256, num_gpu_blocks: 24}"))
    p = _run_here(sc, tmp_path)
    assert p.returncode == 2, p.stderr
    assert "policy NeverPreempts: simulation stalled: " in p.stderr, p.stderr
    assert ("running requests hold 24 of 24 KV blocks and none has a free block for its next token: a policy that "
            "never preempts (plan.preempt) stops when the KV cache fills") in p.stderr, p.stderr


@pytest.mark.parametrize(("cls", "message"), [
    ("RanksUnderAMisspelledName", "RanksUnderAMisspelledName defines rnak, which servesim never calls or reads; did "
     "you mean rank? (a helper of your own: start its name with _)"),
    ("WithMisspelledDependsOn", "WithMisspelledDependsOn defines depend_on, which servesim never calls or reads; did "
     "you mean depends_on?"),
])
def test_a_hook_under_a_misspelled_name_is_named(tmp_path: Path, cls: str, message: str) -> None:
    """A QueuePolicy subclass whose rank (or depends_on) was misspelled ran as plain FCFS (or with QueuePolicy's own
    declaration), exit 0 and no word: the hook of that name was never called."""
    p = _here(tmp_path, f"bad_policies.py:{cls}")
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr
    assert "Traceback (most recent call last)" not in p.stderr


def test_a_rank_is_shown_whole_in_its_error() -> None:
    """reprlib's defaults cut a rank past 30 characters: a dataclass key lost its middle in its own message
    ("rank(req) gave None for request 0 and Key(priority=...al=0.25, id=7) for request 7"), as did most of a
    tenant's name in a tuple."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from sim.policies.queue import QueuePolicy

    @dataclass(frozen=True, order=True)
    class Key:
        priority: int
        deadline: float
        arrival: float
        id: int

    class ForgetsAReturn(QueuePolicy):
        def rank(self, req):
            return None if req.id == 0 else Key(3, 12.5, 0.25, req.id)

    class ByTenant(QueuePolicy):
        def rank(self, req):
            return (float("nan"), "tenant-with-a-rather-long-name-42", req.id)

    with pytest.raises(TypeError, match=r"^rank\(req\) gave None for request 0 and \S*Key\(priority=3, deadline=12.5, "
                       r"arrival=0.25, id=7\) for request 7, "):
        ForgetsAReturn()._first_come([SimpleNamespace(id=0), SimpleNamespace(id=7)])
    with pytest.raises(ValueError, match=r"gave \(nan, 'tenant-with-a-rather-long-name-42', 5\) for request 5"):
        ByTenant()._ranks([SimpleNamespace(id=5)])


def test_a_nan_in_a_named_tuple_or_dataclass_rank_is_refused() -> None:
    """A NaN was refused in a float or a plain tuple only: a named tuple's or an ordered dataclass's ``k != k``
    compares its fields by identity first (a NaN is itself), so the queue was left in the sort's arbitrary order
    without a word."""
    from collections import namedtuple
    from dataclasses import dataclass
    from types import SimpleNamespace

    from sim.policies.queue import QueuePolicy

    Named = namedtuple("Named", "deadline id")

    @dataclass(frozen=True, order=True)
    class Key:
        deadline: float
        id: int

    for make in (Named, Key):
        class ByDeadline(QueuePolicy):
            def rank(self, req, make=make):
                return make(float("nan") if req.id == 3 else 1.0, req.id)

        with pytest.raises(ValueError, match=r"for request 3: NaN does not order"):
            ByDeadline()._ranks([SimpleNamespace(id=1), SimpleNamespace(id=3)])
        assert ByDeadline()._ranks([SimpleNamespace(id=1)]) == [make(1.0, 1)]
