"""Which clock holds a CPU engine step still when CPU-bound neighbours run beside it (issue 38, item 5).

    python benchmarks/bench_clock.py                          # llama-57m, 8 decode rows, hogs 0, 1, 2
    python benchmarks/bench_clock.py --model tiny --steps 200 --rounds 2
    python benchmarks/bench_clock.py --rows 1 --query 256 --context 0   # a prefill chunk of 256 tokens instead

Times the same fixed engine step again and again: one step of ``--rows`` sequences with ``--context`` cached
tokens and ``--query`` new ones each (1: a decode step; more: a prefill chunk), on the real engine's model and
paged KV cache (``realengine.model.LlamaModel``, one torch thread, as the engine's virtual clock runs it), first
with nothing beside it, then with 1 and 2 ``python -c 'while 1: pass'`` processes, in ``--rounds`` interleaved
rounds (so that a drift in the machine's own load spreads over every condition). Each step is read on every
clock this machine offers:

- ``wall``: ``time.perf_counter``;
- ``thread``: ``time.thread_time``, the serving thread's CPU time (the engine's virtual clock on CPU today);
- ``task-clock``: the kernel's software task clock of the thread through ``perf_event_open`` (the same quantity
  as ``thread``: it shows whether the syscall itself is allowed);
- ``instructions`` and ``cycles``: the thread's user-mode hardware counters through ``perf_event_open``
  (``exclude_kernel=1``), where the machine exposes a PMU; the refusal is printed where it does not;
- ``median-of-K`` and ``min-of-K``: the same step run K times back to back on the thread clock, one reading
  being the median (or the minimum) of the K;
- ``thread/gemv`` and ``thread/model``: the thread clock divided by the machine's present speed: a fixed
  reference is timed on the thread clock before every step, and a step reads ``thread * ref_quiet / median(last
  R refs)``, ``ref_quiet`` being the reference's median in the first round without hogs. ``gemv``: a
  matrix-vector product over a weight larger than the last-level cache (a decode step streams its weights);
  ``model``: the same model's forward pass over one token without a cache (the step's own mix of operators).

Printed per clock: the median reading per condition, its ratio to the first condition's (hog / alone),
``drift`` = the largest over the smallest of those medians
(what a calibrated profile sees move when a neighbour starts: the number that must stay near 1), and within each
condition the coefficient of variation and the max/min ratio of single readings. ``--out FILE`` writes every
reading as JSON. Not part of the test suite; it loads the machine (up to 3 busy processes).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from realengine.attention import build_metadata  # noqa: E402
from realengine.kv_cache import KVCache  # noqa: E402
from realengine.model import LlamaModel  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402

_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
# perf_event_attr: type, size, config at offsets 0, 4, 8; the flag bits at offset 40
_HW, _SW = 0, 1
_EVENTS = {"instructions": (_HW, 1), "cycles": (_HW, 0), "task-clock": (_SW, 1)}
_EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 5, 1 << 6


def open_counter(name: str) -> tuple[Callable[[], float] | None, str]:
    """A reader of the calling thread's user-mode counter ``name`` (``_EVENTS``), or None and why not."""
    nr = _PERF_EVENT_OPEN.get(os.uname().machine)
    if nr is None:
        return None, f"no perf_event_open number known for {os.uname().machine}"
    kind, config = _EVENTS[name]
    attr = bytearray(128)  # PERF_ATTR_SIZE_VER7; the fields not set are zero
    struct.pack_into("IIQ", attr, 0, kind, len(attr), config)
    struct.pack_into("Q", attr, 40, _EXCLUDE_KERNEL | _EXCLUDE_HV)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # pid 0, cpu -1: this thread on any CPU; no group, no flags
    fd = libc.syscall(nr, buf, 0, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        return None, f"perf_event_open refused: errno {err} ({os.strerror(err)})"
    scale = 1e-9 if name == "task-clock" else 1.0  # the task clock counts nanoseconds

    def read() -> float:
        return struct.unpack("q", os.read(fd, 8))[0] * scale

    return read, "ok"


class FixedStep:
    """One step of ``rows`` sequences with ``context`` cached tokens and ``query`` new ones each, on the engine's
    model and paged cache; every call computes the same thing (the new tokens' K and V go to the same slots)."""

    def __init__(self, model: str, rows: int, context: int, query: int = 1, block_size: int = 16) -> None:
        spec = ModelSpec.from_name(model)
        self.model = LlamaModel(spec, dtype="float32", device="cpu", seed=0)
        per_seq = -(-(context + query) // block_size)
        self.cache = KVCache(spec, block_size=block_size, dtype=torch.float32, num_blocks=rows * per_seq)
        tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(rows)]
        self.meta = build_metadata([context] * rows, [query] * rows, block_size=block_size, block_tables=tables)
        self.ids = torch.arange(rows * query, dtype=torch.int64) % spec.vocab_size

    def __call__(self) -> None:
        self.model(self.ids, self.meta.positions, self.meta, self.cache)


class GemvReference:
    """The machine's present speed: a matrix-vector product over a weight larger than the last-level cache (a
    decode step streams its weights from memory), timed on the thread clock."""

    def __init__(self, mib: int = 48) -> None:
        self.w = torch.randn(mib * 2**20 // 4 // 1024, 1024)
        self.x = torch.randn(1, 1024)

    def __call__(self) -> float:
        t = time.thread_time()
        torch.nn.functional.linear(self.x, self.w)
        return time.thread_time() - t


class ModelReference:
    """The machine's present speed on the step's own mix of work: the same model's forward pass over one token
    without a cache (every layer's operators dispatched, every weight read), timed on the thread clock."""

    def __init__(self, step: FixedStep) -> None:
        self.model = step.model
        self.meta = build_metadata([0], [1])
        self.ids = torch.zeros(1, dtype=torch.int64)

    def __call__(self) -> float:
        t = time.thread_time()
        self.model(self.ids, self.meta.positions, self.meta, None)
        return time.thread_time() - t


def run_condition(step: FixedStep, refs: dict[str, Callable[[], float]], counters: dict[str, Callable[[], float]],
                  steps: int) -> dict[str, list[float]]:
    """``steps`` readings of the step on every base clock, and before each one reading of every reference."""
    clocks: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time, **counters}
    out: dict[str, list[float]] = {name: [] for name in [*clocks, *refs]}
    names = list(clocks)
    readers = [clocks[n] for n in names]
    with torch.inference_mode():
        for _ in range(steps):
            for name, ref in refs.items():
                out[name].append(ref())
            before = [r() for r in readers]
            step()
            after = [r() for r in reversed(readers)][::-1]  # read in the opposite order: each clock brackets the step
            for n, a, b in zip(names, after, before, strict=True):
                out[n].append(a - b)
    return out


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def stop(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        h.kill()
        h.wait()


def derived(raw: dict[str, list[float]], k: int, window: int, ref_quiet: dict[str, float]) -> dict[str, np.ndarray]:
    """Every clock's readings: the base clocks as measured, then the repeat and reference-scaled ones."""
    out = {n: np.asarray(v) for n, v in raw.items() if n not in ref_quiet}
    th = out["thread"]
    groups = th[: th.size // k * k].reshape(-1, k)
    out[f"median-of-{k}"] = np.median(groups, axis=1)
    out[f"min-of-{k}"] = groups.min(axis=1)
    for name, quiet in ref_quiet.items():
        r = np.asarray(raw[name])
        speed = np.array([np.median(r[max(0, i - window + 1): i + 1]) for i in range(r.size)]) / quiet
        out[f"thread/{name}"] = th / speed
    return out


def summarize(per_cond: dict[int, list[dict[str, np.ndarray]]]) -> dict[str, dict]:
    """Per clock: the median per condition (readings of every round pooled), drift across conditions, and the
    coefficient of variation and max/min of single readings within each condition."""
    clocks = list(next(iter(per_cond.values()))[0])
    table: dict[str, dict] = {}
    for c in clocks:
        row: dict = {"median": {}, "cv": {}, "maxmin": {}}
        for hogs, rounds in per_cond.items():
            v = np.concatenate([r[c] for r in rounds])
            row["median"][hogs] = float(np.median(v))
            row["cv"][hogs] = float(v.std() / v.mean())
            row["maxmin"][hogs] = float(v.max() / v.min())
        meds = list(row["median"].values())
        row["drift"] = max(meds) / min(meds)
        # the same across rounds too: each (condition, round) median, largest over smallest
        rmeds = [float(np.median(r[c])) for rounds in per_cond.values() for r in rounds]
        row["drift_rounds"] = max(rmeds) / min(rmeds)
        table[c] = row
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-57m")
    ap.add_argument("--rows", type=int, default=8, help="decode sequences in the step")
    ap.add_argument("--context", type=int, default=128, help="cached tokens per sequence")
    ap.add_argument("--query", type=int, default=1, help="new tokens per sequence (1: decode; more: prefill)")
    ap.add_argument("--steps", type=int, default=60, help="steps per condition per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--k", type=int, default=5, help="repeats per median-of-K / min-of-K reading")
    ap.add_argument("--window", type=int, default=5,
                    help="reference readings per speed estimate (thread/gemv, thread/model)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if min(args.rows, args.context + 1, args.query, args.steps, args.rounds, args.k, args.window) < 1 \
            or min(args.hogs) < 0:
        print("bench_clock: --rows, --query, --steps, --rounds, --k and --window must be >= 1, --context and --hogs "
              ">= 0", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # the engine's virtual clock runs one torch thread: the thread's counters see it all
    counters: dict[str, Callable[[], float]] = {}
    for name in ("task-clock", "instructions", "cycles"):
        reader, why = open_counter(name)
        print(f"perf_event_open {name:<13}: {why}")
        if reader is not None:
            counters[name] = reader
    step = FixedStep(args.model, args.rows, args.context, args.query)
    refs: dict[str, Callable[[], float]] = {"gemv": GemvReference(), "model": ModelReference(step)}
    with torch.inference_mode():
        for _ in range(5):  # warm-up
            step()
            for ref in refs.values():
                ref()
    print(f"{args.model}: step of {args.rows} rows x {args.context} context + {args.query} new; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    per_cond: dict[int, list[dict[str, np.ndarray]]] = {h: [] for h in args.hogs}
    raws: list[dict] = []
    ref_quiet: dict[str, float] = {}
    for rnd in range(args.rounds):
        for hogs in args.hogs:
            procs = start_hogs(hogs)
            try:
                time.sleep(0.5 if hogs else 0.0)  # let the hogs reach their loop
                raw = run_condition(step, refs, counters, args.steps)
            finally:
                stop(procs)
            if not ref_quiet:  # the first condition's, nominally quiet
                ref_quiet = {name: float(np.median(raw[name])) for name in refs}
            per_cond[hogs].append(derived(raw, args.k, args.window, ref_quiet))
            raws.append({"round": rnd, "hogs": hogs, "load_average": os.getloadavg()[0], **raw})
            print(f"  round {rnd} hogs {hogs}: thread median {1e3 * np.median(raw['thread']):.2f} ms, "
                  f"wall {1e3 * np.median(raw['wall']):.2f} ms, load {os.getloadavg()[0]:.2f}", flush=True)
    table = summarize(per_cond)
    conds = " ".join(f"{'hogs ' + str(h):>10}" for h in args.hogs)
    first, rest = args.hogs[0], args.hogs[1:]
    ratios = "".join(f"{f'x{h}/{first}':>7}" for h in rest)
    print(f"\n{'clock':<14}{conds}{ratios}{'drift':>8}{'rounds':>8}   CV per condition      max/min per condition")
    for c, row in table.items():
        unit = 1e3 if c not in ("instructions", "cycles") else 1e-6
        meds = " ".join(f"{unit * row['median'][h]:>10.3f}" for h in args.hogs)
        rs = "".join(f"{row['median'][h] / row['median'][first]:>7.3f}" for h in rest)
        cvs = " ".join(f"{100 * row['cv'][h]:5.1f}%" for h in args.hogs)
        mms = " ".join(f"{row['maxmin'][h]:5.2f}" for h in args.hogs)
        print(f"{c:<14}{meds}{rs}{row['drift']:>8.3f}{row['drift_rounds']:>8.3f}   {cvs}   {mms}")
    print(f"(medians in ms; instructions and cycles in millions; xH/{first}: the median with H hogs over the one with "
          f"{first}; drift: largest over smallest condition median; rounds: the same over every condition and round)")
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v)
                                                 for k, v in vars(args).items()},
                                        "table": table, "raw": raws}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
