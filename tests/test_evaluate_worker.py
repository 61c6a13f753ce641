"""servesim.evaluate()'s kept worker (sim/studies/eval_worker.py): one process serves call after call of a policy
given as source text, each call with the budgets, working directory and random states a fork would have given it,
and it is replaced after a failure or a death; the scores are those evaluate gave before the worker was kept."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import pytest

import servesim
from sim.studies.eval_worker import KEPT
from sim.studies.evaluate import WorkloadCache, evaluate
from tests.test_evaluate import HEADER, LIMITS, SCENARIO, SHORT_FIRST, ShortFirst, exact

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker needs fork")

# What evaluate() returned at c285ce3, before the kept worker (each call forked), in a worker and in-process alike:
# SHORT_FIRST on SCENARIO with LIMITS, seeds 3 and 4. The exact floats: whatever runs the policy, the figures are
# the same.
PINNED = {
    "ok": True, "fitness": 0.4508780361969974, "reason": None, "error": None, "seeds": [3, 4],
    "goodput": 7.921004025238952, "slo_attainment": 0.6866666666666666, "throughput": 11.535442755202357,
    "output_throughput": 1362.489141367611, "ttft_mean": 0.46186205445646206, "ttft_p50": 0.06299096009112404,
    "ttft_p99": 4.6207361431414125, "tpot_mean": 0.00880753482491032, "tpot_p50": 0.008595329420171957,
    "tpot_p99": 0.011792120952913626, "e2el_mean": 1.4883226572089592, "e2el_p50": 1.0565205771004846,
    "e2el_p99": 5.4271256715991445, "num_completed": 150.0, "num_rejected": 0.0, "num_preemptions": 0.0,
    "jain_index": None,
}
RANDOM_RANK = HEADER.replace("import servesim\n", "import random\n\nimport servesim\n") + \
    "        return (random.random(), req.id)\n"


CACHE = WorkloadCache()  # one cache, as a search loop keeps: a worker forked with a workload runs it by identity


def score(policy, **kw) -> servesim.Scores:
    kw.setdefault("set", LIMITS)
    return evaluate(policy, SCENARIO, cache=CACHE, **kw)


def same(s: servesim.Scores) -> dict:
    return {k: v for k, v in s.to_dict().items() if k != "cpu_seconds"}


def pid() -> int | None:
    p = KEPT._proc
    return None if p is None else p.pid


def test_scores_are_those_of_before_the_worker_was_kept():
    KEPT.close()
    kept = score(SHORT_FIRST, seeds=[3, 4])  # the kept worker
    assert pid() is not None
    assert same(kept) == same(score(SHORT_FIRST, seeds=[3, 4])) == PINNED  # its second call too
    assert same(score(ShortFirst(), seeds=[3, 4])) == PINNED  # an object: a worker forked for the call
    inproc = score(SHORT_FIRST, seeds=[3, 4], isolate=False)
    assert same(inproc) == PINNED and exact(kept.summaries) == exact(inproc.summaries)


def test_the_worker_serves_call_after_call_and_is_replaced_after_a_failure():
    KEPT.close()
    assert score(SHORT_FIRST).ok
    first, cpu = pid(), KEPT.cpu_seconds()
    assert first is not None and cpu > 0
    assert score(SHORT_FIRST).ok and pid() == first and KEPT.cpu_seconds() > cpu
    grows = "import servesim\nKEEP = []\n\n\nclass P(servesim.QueuePolicy):\n    def rank(self, req):\n" \
            "        KEEP.append(bytearray(20 * 2**20))\n        return req.id\n"
    if sys.platform.startswith("linux"):  # RLIMIT_AS holds on Linux
        assert score(grows, memory_limit=200, time_limit=20).reason == "memory"
        assert pid() is None  # the failed policy's worker is gone, its module with it
    assert score(HEADER + "        return 1 / 0\n").reason == "exception" and pid() is None
    assert same(score(SHORT_FIRST, seeds=[3, 4])) == PINNED  # a fresh worker, its budgets armed again
    assert pid() not in (None, first)


def test_each_call_gets_the_callers_working_directory_and_random_states(tmp_path, monkeypatch):
    score(SHORT_FIRST)  # the worker is forked here, in the test's working directory
    monkeypatch.chdir(tmp_path)
    state = random.getstate()
    a = score(RANDOM_RANK, out="out")  # relative to the caller's directory now, as in a fork made now
    assert a.ok and (tmp_path / "out" / "scores.json").is_file()
    assert same(score(RANDOM_RANK)) == same(a)  # the caller's random state did not move: the same draws
    random.random()
    # it moved, but a run starts the global generators from the scenario's seed (sim.loop.run.seeded_global_rngs):
    # the same draws, in a fork made now as in the kept worker
    assert same(score(RANDOM_RANK)) == same(a)
    random.setstate(state)
    assert same(score(RANDOM_RANK, isolate=False)) == same(a)  # in-process, from the same state


def test_a_worker_killed_while_it_waits_is_replaced():
    assert score(SHORT_FIRST).ok
    first = pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    for _ in range(6000):  # until it has ended (a zombie: its parent has not waited for it); slow on a busy machine
        with open(f"/proc/{first}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert same(score(SHORT_FIRST, seeds=[3, 4])) == PINNED
    assert pid() not in (None, first)


def test_a_worker_killed_as_a_call_begins_is_replaced_and_the_call_runs():
    """The race the test above once lost under load: the worker is killed from outside but still exiting (its pipe
    open) when the call writes its job, so the job is lost with it. Stopped (SIGSTOP) it takes the job and cannot
    read it; then killed, it is seen dead only from the reply pipe. A kept worker's own limits never send SIGKILL,
    so the call runs once more in a fresh worker: the pinned scores, not a 'timeout'."""
    assert same(score(SHORT_FIRST, seeds=[3, 4])) == PINNED  # the same call as below: it reuses this worker
    first = pid()
    assert first is not None
    os.kill(first, signal.SIGSTOP)
    killed = []
    killer = threading.Timer(0.5, lambda: killed.append(os.kill(first, signal.SIGKILL)))
    killer.start()
    try:
        assert same(score(SHORT_FIRST, seeds=[3, 4])) == PINNED
    finally:
        killer.join()
    assert killed == [None]  # killed while the call waited for its reply (not replaced before it)
    assert pid() not in (None, first)


def test_a_call_that_finds_the_worker_busy_runs_in_a_fork_of_its_own():
    assert score(SHORT_FIRST).ok
    first = pid()
    with KEPT._lock:  # another thread's call holds it
        assert same(score(SHORT_FIRST, seeds=[3, 4])) == PINNED
    assert pid() == first


def test_a_fork_of_the_caller_forks_a_worker_of_its_own():
    assert score(SHORT_FIRST).ok
    first = pid()
    child = os.fork()
    if child == 0:  # not the worker's parent: it must neither use nor kill the worker
        try:
            ok = KEPT.cpu_seconds() == 0 and score(SHORT_FIRST).ok
            ok = ok and pid() not in (None, first)
            KEPT.close()
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(child, 0)[1] == 0
    assert score(SHORT_FIRST).ok and pid() == first


def test_a_workload_the_worker_lacks_forks_a_worker_with_it_and_its_caches():
    assert score(SHORT_FIRST).ok
    first = pid()
    other = WorkloadCache()  # another cache: other workload objects, which the worker cannot have
    assert same(evaluate(SHORT_FIRST, SCENARIO, seeds=[3, 4], set=LIMITS, cache=other)) == PINNED
    second = pid()
    assert second not in (None, first)
    assert evaluate(SHORT_FIRST, SCENARIO, seeds=[3], set=LIMITS, cache=other).ok and pid() == second


def test_a_metric_registered_after_the_fork_reaches_the_summary(monkeypatch):
    from sim.metrics import registry

    assert score(SHORT_FIRST).ok
    first = pid()
    monkeypatch.setattr(registry, "_plugins", list(registry._plugins))  # the registration ends with the test
    registry.register_metric(registry.Metric("eval_probe", "probe", "int", "", "a test's metric",
                                             compute=lambda result: 7.0))
    try:
        s = score(SHORT_FIRST)
        assert s.summaries[0]["eval_probe"] == 7.0  # as a fork made now would have computed it
        assert pid() not in (None, first)
    finally:
        KEPT.close()  # its worker has the metric: no later test may get it


def _echo(payload, objs):
    return payload


def test_a_call_interrupted_while_it_waits_leaves_no_reply_for_the_next(monkeypatch):
    """Ctrl-C in a notebook while evaluate() waits: the worker still runs the interrupted job, so its reply would
    be read as the next call's (that call's scores silently those of the policy before)."""
    from sim.studies import eval_worker

    worker = eval_worker.KeptWorker()
    receive = eval_worker._receive

    def interrupted(fd, wall):
        monkeypatch.setattr(eval_worker, "_receive", receive)  # once
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_worker, "_receive", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.run(_echo, "first", [], [], 5.0, 256, keep=lambda v: True)
        assert worker.run(_echo, "second", [], [], 5.0, 256, keep=lambda v: True) == ("second", None, None)
    finally:
        worker.close()


def test_a_fork_that_fails_leaves_no_pipe_open(monkeypatch):
    """os.fork refused (EAGAIN under memory pressure): the error reaches the caller, and the pipes made for the
    worker are closed, not left open call after call of a search loop."""
    from sim.studies import eval_worker

    def refuse():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    fds = set(os.listdir("/proc/self/fd"))
    worker = eval_worker.KeptWorker()
    monkeypatch.setattr(eval_worker.os, "fork", refuse)
    with pytest.raises(BlockingIOError):
        worker.run(_echo, "x", [], [], 5.0, 256, keep=lambda v: True)
    with pytest.raises(BlockingIOError):
        eval_worker.run_forked(lambda: 1, 5.0, 256)
    assert set(os.listdir("/proc/self/fd")) == fds
