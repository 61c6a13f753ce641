"""The worker processes in which ``servesim.evaluate`` (sim/studies/evaluate.py) runs a user's policy, held to a
CPU-time and a memory budget (POSIX: they are forked).

- **The kept worker** (:data:`KEPT`) is forked at the first call and serves the calls after it, one at a time, so
  that a search loop's calls pay neither a fork nor the child's first touches of the caller's memory (on
  benchmarks/bench_evaluate.py's 1,000-request evaluation a fork per call cost 20-30 ms of CPU over ~110 ms).
  It takes jobs that travel whole through a pipe (evaluate sends policies given as source text) and keeps the
  objects it was forked with (the workloads) by identity, so that they are never copied: a job that needs one it
  lacks forks a fresh worker. Each job gets the caller's working directory and global random states (``random``,
  ``numpy.random``), as a fork would have, and its own budgets: ``RLIMIT_CPU`` (soft, at the CPU time used so far
  plus the budget) and ``RLIMIT_AS`` (soft, at the address space at the job's start plus the memory budget). The
  worker is replaced after a job its caller does not want to keep it for (evaluate: any failure, since the
  policy may have left the worker's modules half changed), when it dies or overruns the wall-clock guard, and when
  it has grown by :data:`GROWTH` bytes since its fork, and when the caller's stamp changes (evaluate's: the
  registries of GPUs, engines and metrics, which a summary reads and which grow when a plugin registers).
- **A worker forked for one call** (:func:`run_forked`) runs anything, a closure included; evaluate uses it for a
  policy object or class (they live in the caller's memory, and only a fork made now sees them as they are now)
  and when the kept worker is busy with another thread's call. Its limits are hard ones: ``RLIMIT_CPU``'s hard
  limit 2 s past the soft one (SIGKILL for code that ignores SIGXCPU).

Either way a worker's death is a (reason, error) pair, never an exception: "timeout" for SIGXCPU or SIGKILL (the
CPU-time limit) and for a worker still running past the wall-clock guard (10 times the budget plus 30 s: a worker
that sleeps or blocks uses no CPU time), "crash" otherwise.
"""

from __future__ import annotations

import gc
import math
import os
import pickle
import random
import resource
import select
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

GROWTH = 256 * 2**20  # bytes of address space a kept worker may gain over the jobs it serves before it is replaced
_JOB = struct.Struct("<Q")  # a job: its length, then the pickle
_REPLY = struct.Struct("<Qd?")  # a reply: its length, the worker's CPU seconds so far, whether it exits; the pickle
_UNLOADABLE = "servesim: a job the kept worker could not unpickle"  # the reply then: run it in a fresh fork


class _Closed(Exception):
    """The other end of the pipe closed (the worker died) before a whole message came."""


class _Late(Exception):
    """The wall-clock guard ran out before a whole message came."""


def _address_space() -> int | None:
    """This process's virtual memory size in bytes (Linux), None where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _cpu_used() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _arm(time_limit: float, memory_limit: int, *, final: bool) -> None:
    """The budgets of the job about to run in this (worker) process. ``final``: the process runs this one job, so
    the limits are hard ones too; else only the soft limits move (a process can raise them again, up to the hard
    limits, for its next job)."""
    # behind the interval timer (evaluate's), for code that never returns to the interpreter: SIGXCPU
    soft = math.ceil(_cpu_used() + time_limit) + 2
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if final:
        hard = soft + 2  # then SIGKILL, for code that ignores SIGXCPU
    elif hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    size = _address_space()
    if size is not None:
        limit = size + memory_limit * 2**20
        hard = limit if final else resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # what is buffered would otherwise be written twice (a fork) or late (a kept worker)
        except Exception:
            pass


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    """Exactly ``n`` bytes of ``fd``; raises ``_Closed`` at the end of the pipe, ``_Late`` past ``deadline``
    (a time.monotonic(); None: wait for ever)."""
    parts = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Late
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise _Closed
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _reply(fd: int, value: Any, retire: bool) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    _write(fd, _REPLY.pack(len(data), _cpu_used(), retire) + data)


def _receive(fd: int, wall: float) -> tuple[Any, float, bool]:
    """A worker's reply: (value, its CPU seconds so far, whether it exits). Raises ``_Closed`` or ``_Late``."""
    deadline = time.monotonic() + wall
    size, cpu, retire = _REPLY.unpack(_read(fd, _REPLY.size, deadline))
    return pickle.loads(_read(fd, size, deadline)), cpu, retire


def _wall(time_limit: float) -> float:
    return 10 * time_limit + 30  # a worker that sleeps or waits uses no CPU time: the guard against blocking


def _late(wall: float) -> tuple[None, str, str]:
    return None, "timeout", f"the policy's worker was still running after {wall:g} s of wall-clock time " \
        "(blocked, or starved of CPU)"


def _death(status: int, time_limit: float) -> tuple[None, str, str]:
    """(None, reason, error) of a worker that ended, by ``status`` (os.waitpid's), without a whole reply."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return None, "timeout", f"the policy's runs took more than the {time_limit:g} s CPU-time budget " \
                f"(worker killed by {signal.Signals(sig).name})"
        return None, "crash", f"the policy's worker died of {signal.Signals(sig).name}"
    return None, "crash", f"the policy's worker exited with status {os.WEXITSTATUS(status)} and no result"


def _child_setup() -> None:
    # the collector would walk (and so copy, page by page) every object inherited from the caller
    gc.freeze()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind


def _fork(body: Callable[[], None], close: Sequence[int]) -> int:
    """Fork a worker that closes ``close`` (the caller's ends of its pipes), runs ``body`` and exits: 0 when
    ``body`` returned, 1 when it raised. Returns the worker's pid."""
    _flush()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the caller's code
        status = 1
        try:
            for fd in close:
                os.close(fd)
            _child_setup()
            body()
            status = 0
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    return pid


def run_forked(work: Callable[[], Any], time_limit: float, memory_limit: int) -> tuple[Any, str | None, str | None]:
    """``work()`` in a child forked for it and held to the budgets: (its value, None, None), or (None, reason,
    error) when the child died (killed at its limits, or crashed) or blocked past the wall-clock guard."""
    r, w = os.pipe()

    def body() -> None:
        _arm(time_limit, memory_limit, final=True)
        _reply(w, work(), True)

    try:
        pid = _fork(body, [r])
    except BaseException:  # no worker (fork refused): its pipe goes too
        os.close(r)
        raise
    finally:
        os.close(w)
    wall = _wall(time_limit)
    try:
        value = _receive(r, wall)[0]
    except _Late:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return _late(wall)
    except _Closed:
        return _death(os.waitpid(pid, 0)[1], time_limit)
    finally:
        os.close(r)
    os.waitpid(pid, 0)
    return value, None, None


# ---- the kept worker -------------------------------------------------------------------------------------------

def _serve(jobs: int, replies: int, kept: dict[int, Any]) -> None:
    """The kept worker's loop: a job in, its reply out, until the pipe closes or the worker retires."""
    start = _address_space()
    while True:
        try:
            job = _read(jobs, _JOB.unpack(_read(jobs, _JOB.size, None))[0], None)
        except _Closed:
            return
        try:
            fn, payload, ids, cwd, states, time_limit, memory_limit = pickle.loads(job)
            objs = [kept[i] for i in ids]
        except Exception:
            _reply(replies, _UNLOADABLE, True)
            return
        os.chdir(cwd)
        random.setstate(states[0])
        np.random.set_state(states[1])
        _arm(time_limit, memory_limit, final=False)
        value = fn(payload, objs)
        _flush()
        size = _address_space()
        retire = start is not None and size is not None and size > start + GROWTH
        _reply(replies, value, retire)
        if retire:
            return


@dataclass(slots=True)
class _Proc:
    pid: int
    jobs: int  # the write end of its job pipe
    replies: int  # the read end of its reply pipe
    owner: int  # the process that forked it (a fork of the owner must not use it)
    kept: dict[int, Any]  # what it was forked with, by id (held here so that no id is reused meanwhile)
    stamp: Hashable  # the caller's stamp when it was forked
    cpu: float = 0.0  # its CPU seconds as of its last reply
    reaped: bool = False  # waited for already


def _alive(p: _Proc) -> bool:
    """Whether the worker still runs (one that ended is waited for)."""
    try:
        p.reaped = os.waitpid(p.pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        p.reaped = True
    return not p.reaped


class KeptWorker:
    """A worker process kept between jobs (see the module docstring); thread-safe: a job that finds it busy gets
    None and runs elsewhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: _Proc | None = None

    def cpu_seconds(self) -> float:
        """The CPU time the live worker reported with its last reply (0 with none live). A worker's time moves to
        ``RUSAGE_CHILDREN`` once it is replaced, so this plus that counts every worker's time once."""
        p = self._proc
        return p.cpu if p is not None and p.owner == os.getpid() else 0.0

    def run(self, fn: Callable[[Any, list[Any]], Any], payload: Any, objs: Sequence[Any], also: Iterable[Any],
            time_limit: float, memory_limit: int, keep: Callable[[Any], bool], stamp: Hashable = None
            ) -> tuple[Any, str | None, str | None] | None:
        """``fn(payload, objs)`` in the kept worker, under the budgets: as :func:`run_forked`, or None where the
        job cannot run there (the worker is busy with another thread's job, or ``payload`` does not pickle).
        ``fn`` and ``payload`` travel by pickle, ``objs`` by identity: a worker forked without one of them is
        replaced by one forked with ``objs`` and ``also`` (what later jobs are likely to need). ``stamp``: what
        this process's state that the job reads looks like (a worker forked under another stamp is replaced).
        ``keep(value)``: whether the worker may serve another job after returning ``value``."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._run(fn, payload, objs, also, time_limit, memory_limit, keep, stamp)
        except BaseException:
            # interrupted (Ctrl-C) while the job or its reply is in a pipe: the rest would be read as the next
            # job's (that call's scores silently the interrupted one's), so the worker goes
            self.close()
            raise
        finally:
            self._lock.release()

    def _run(self, fn: Callable[[Any, list[Any]], Any], payload: Any, objs: Sequence[Any], also: Iterable[Any],
             time_limit: float, memory_limit: int, keep: Callable[[Any], bool], stamp: Hashable
             ) -> tuple[Any, str | None, str | None] | None:
        states = (random.getstate(), np.random.get_state())
        try:
            job = pickle.dumps((fn, payload, [id(o) for o in objs], os.getcwd(), states, time_limit, memory_limit),
                               protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return None
        p = self._proc
        if p is not None and (p.owner != os.getpid() or not _alive(p)):  # a fork of the owner; or a dead worker
            self.close()
            p = None
        if p is None or p.stamp != stamp or any(id(o) not in p.kept for o in objs):
            self.close()
            p = self._spawn([*objs, *also], stamp)
        try:
            _write(p.jobs, _JOB.pack(len(job)) + job)
        except OSError:  # it died just now, while it waited (killed from outside): once more, in a fresh one
            self.close()
            p = self._spawn([*objs, *also], stamp)
            _write(p.jobs, _JOB.pack(len(job)) + job)
        wall = _wall(time_limit)
        for attempt in (1, 2):
            try:
                value, p.cpu, retire = _receive(p.replies, wall)
                break
            except _Late:
                self.close()
                return _late(wall)
            except _Closed:
                status = self.close()
                if attempt == 2 or not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                    return _death(status, time_limit)
                # Killed from outside: a kept worker's own budget is a soft CPU limit (SIGXCPU) and the wall-clock
                # guard above, never SIGKILL. One killed while it waited may still be exiting when the job is
                # written (its pipe still open), and the job is lost with it: once more, in a fresh one.
                p = self._spawn([*objs, *also], stamp)
                _write(p.jobs, _JOB.pack(len(job)) + job)
        if isinstance(value, str) and value == _UNLOADABLE:
            self.close()
            return None
        if retire or not keep(value):
            self.close()
        return value, None, None

    def _spawn(self, objs: Iterable[Any], stamp: Hashable) -> _Proc:
        kept = {id(o): o for o in objs}
        jobs_r, jobs_w = os.pipe()
        replies_r, replies_w = os.pipe()
        try:
            pid = _fork(lambda: _serve(jobs_r, replies_w, kept), [jobs_w, replies_r])
        except BaseException:  # no worker (fork refused): its pipes go too
            os.close(jobs_w)
            os.close(replies_r)
            raise
        finally:
            os.close(jobs_r)
            os.close(replies_w)
        self._proc = _Proc(pid, jobs_w, replies_r, os.getpid(), kept, stamp)
        return self._proc

    def close(self) -> int:
        """End the worker (if one is live) and wait for it; returns its wait status (0 with none)."""
        p, self._proc = self._proc, None
        if p is None:
            return 0
        os.close(p.jobs)
        os.close(p.replies)
        if p.owner != os.getpid() or p.reaped:  # a fork of the owner: the worker is not this process's child
            return 0
        # An idle worker would exit at the end of its job pipe, but a process forked from this one meanwhile may
        # hold that pipe open: the worker holds nothing, it is killed (a worker that already ended keeps its
        # status).
        os.kill(p.pid, signal.SIGKILL)
        return os.waitpid(p.pid, 0)[1]


KEPT = KeptWorker()  # the one evaluate() uses
