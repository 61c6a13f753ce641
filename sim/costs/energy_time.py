"""Power over time: a run's energy cut at time edges (the report's power chart, the energy between two instants
that ``plan`` prices its choice by) and the running sums of energy and busy seconds the metrics export samples;
all from ``sim.costs.energy``'s per-step power, read a block of steps at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.costs.energy import PowerModel, power_blocks, run_energy
from sim.metrics.request_table import as_table
from sim.metrics.step_columns import StepColumns

if TYPE_CHECKING:
    from sim.metrics.records import RunResult


def power_over_time(result: RunResult, bins: int = 200) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean power of the fleet in ``bins`` equal time bins over the run (bin centres in s, W): each step's energy
    in the bins it runs through, by the seconds it runs in each (a step longer than a bin, a padded static prefill,
    put whole into its first bin drew several times the board's limit there and idle power in the next), the
    idle draw of the up replicas over what the steps left of the bin. Summed over the bins, power x width is the
    run's energy."""
    t0 = as_table(result.requests).least("arrival")
    t1 = t0 + float(result.duration)
    edges, width = np.linspace(t0, t1, bins + 1), (t1 - t0) / bins
    joules = _energy_per_bin(result, edges, np.full(bins, width)) if t1 > t0 else None
    return None if joules is None else ((edges[:-1] + edges[1:]) / 2, joules / width)


def energy_between(result: RunResult, lo: float, hi: float) -> float | None:
    """Joules the fleet drew from ``lo`` to ``hi``, within the run, cut as ``power_over_time`` cuts its bins."""
    t0 = as_table(result.requests).least("arrival")
    edges = np.array([t0, lo, hi, t0 + float(result.duration)])
    joules = _energy_per_bin(result, edges, np.diff(edges)) if np.all(np.diff(edges) > 0) else None
    return None if joules is None else float(joules[1])


def _energy_per_bin(result: RunResult, edges: np.ndarray, widths: np.ndarray) -> np.ndarray | None:
    """Joules in each bin between ``edges`` (the run's first arrival to its end); None: power not modelled."""
    e = run_energy(result)
    if e is None or result.power is None:
        return None
    pm = result.power
    binned = _binned_in_blocks(pm, result.steps, edges) \
        if isinstance(result.steps, StepColumns) and isinstance(pm, PowerModel) else None
    if binned is not None:
        busy_j, busy_s = binned
    else:
        starts = np.asarray(result.steps["start"], dtype=np.float64)
        dur = np.asarray(result.steps["duration"], dtype=np.float64)
        where, step, secs = _bin_pieces(edges, starts, dur)
        busy_j = np.bincount(where, weights=e.step_power_w[step] * secs, minlength=len(widths))
        busy_s = np.bincount(where, weights=secs, minlength=len(widths))
    up_s = _up_per_bin(result, edges)  # None: a fixed fleet, its size in every bin
    up_s = widths * e.up_seconds / (edges[-1] - edges[0]) if up_s is None else up_s
    idle_s = np.maximum(up_s - busy_s, 0.0)
    idle_j = idle_s * (e.idle_energy_j / idle_s.sum()) if idle_s.sum() > 0 else idle_s * 0.0
    return busy_j + idle_j


def _up_per_bin(result: RunResult, edges: np.ndarray) -> np.ndarray | None:
    """Replica-seconds the fleet was up (paid for) in each bin, from each replica's life; None without lives. An
    autoscaled fleet grows and shrinks: its mean size in every bin put the idle draw of replicas not yet ordered
    into the first bins (one 72 W L4 up, the chart read 138 W)."""
    lives = (result.cluster or {}).get("per_replica")
    if not lives:
        return None
    lo, hi = edges[:-1], edges[1:]
    up = np.zeros(len(lo))
    for life in lives:
        end = np.inf if life["released"] is None else life["released"]
        up += np.maximum(np.minimum(hi, end) - np.maximum(lo, life["provisioned"]), 0.0)
    return up


def _bin_pieces(edges: np.ndarray, start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each step cut at the bin edges it crosses: per piece, in step order, its bin, its step's index and its
    seconds. The first and last bins reach out to -inf and +inf, so the pieces of a step add up to its duration."""
    bins = len(edges) - 1
    end = start + dur
    first = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, bins - 1)
    last = np.clip(np.searchsorted(edges, end, side="left") - 1, first, bins - 1)  # an end on an edge: the bin before
    n = last - first + 1
    step = np.repeat(np.arange(len(start)), n)
    where = first[step] + np.arange(len(step)) - np.repeat(np.cumsum(n) - n, n)
    lo = np.concatenate(([-np.inf], edges[1:-1]))  # bin b spans lo[b] to hi[b]
    hi = np.concatenate((edges[1:-1], [np.inf]))
    secs = np.minimum(end[step], hi[where]) - np.maximum(start[step], lo[where])
    return where, step, np.where(n[step] == 1, dur[step], secs)  # a step within one bin keeps its exact duration


def _sequential_into(out: np.ndarray, where: np.ndarray, x: np.ndarray) -> None:
    """``out[where[i]] += x[i]`` in order (what ``np.bincount`` with weights does) for ``where`` nondecreasing,
    each bin's run of values added one after the other by ``np.cumsum`` from the bin's sum so far."""
    cut = np.flatnonzero(where[1:] != where[:-1]) + 1
    for i0, i1 in zip(np.r_[0, cut].tolist(), np.r_[cut, len(where)].tolist(), strict=True):
        b = int(where[i0])
        out[b] = np.cumsum(np.concatenate(([out[b]], x[i0:i1])))[-1]


def _binned_in_blocks(pm: PowerModel | None, steps: StepColumns, edges: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray] | None:
    """power_over_time's busy joules and seconds per bin (``np.bincount`` of the steps' energy and durations by
    the bin each starts in) read a block of steps at a time, for steps in start order (a log's own: then each
    bin's steps are a run, summed in order as bincount sums them). None when the steps are not in start order."""
    assert pm is not None
    bins = len(edges) - 1
    busy_j, busy_s = np.zeros(bins), np.zeros(bins)
    last = 0
    for _, block, power in power_blocks(pm, steps, extra=("start",)):
        where, step, secs = _bin_pieces(edges, block["start"], block["duration"])
        if not len(where):
            continue
        if int(where[0]) < last or not bool(np.all(where[1:] >= where[:-1])):
            return None
        last = int(where[-1])
        _sequential_into(busy_j, where, power[step] * secs)
        _sequential_into(busy_s, where, secs)
    return busy_j, busy_s


def running_energy(pm: PowerModel, steps: StepColumns, at: np.ndarray, rows: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For steps in end order (one replica's log): the running sums of the steps' energy (J) and busy seconds to
    the end of each step ``at`` (nondecreasing), and the power (W) of each step ``rows`` (increasing), read a block
    of steps at a time: the values ``np.cumsum`` of the whole arrays gives there (a running sum is sequential, so
    each block continues from the last), without the arrays."""
    run_j, run_s, power_at = np.empty(len(at)), np.empty(len(at)), np.empty(len(rows))
    carry: tuple[float, float] | None = None
    for lo, block, power in power_blocks(pm, steps):
        hi = lo + len(power)
        dur = block["duration"]
        if carry is None:
            cj, cs, off = np.cumsum(power * dur), np.cumsum(dur), lo
        else:
            cj = np.cumsum(np.concatenate(([carry[0]], power * dur)))
            cs, off = np.cumsum(np.concatenate(([carry[1]], dur))), lo - 1
        a, b = np.searchsorted(at, [lo, hi], side="left")
        run_j[a:b], run_s[a:b] = cj[at[a:b] - off], cs[at[a:b] - off]
        r0, r1 = np.searchsorted(rows, [lo, hi], side="left")
        power_at[r0:r1] = power[rows[r0:r1] - lo]
        if len(power):
            carry = (float(cj[-1]), float(cs[-1]))
    return run_j, run_s, power_at


def steps_energy(result: RunResult, energy: dict | None, output_tokens: int) -> dict | None:
    """A summary's ``energy`` with its figures over the run's steps alone, the idle gaps between them left out
    (``idle_energy_j`` 0, ``mean_power_w`` over the steps' seconds): what an energy counter reads over an engine run
    on the virtual clock, which skips its idle gaps (realengine/executor.py), so that ``servesim validate`` compares
    like with like. None where ``energy`` is None or the run has no power model."""
    e = run_energy(result) if energy is not None else None
    if e is None or energy is None:
        return None
    busy_s = float(np.sum(np.asarray(result.steps["duration"], dtype=np.float64)))
    joules = e.busy_energy_j
    return {**energy, "energy_j": joules, "idle_energy_j": 0.0,
            "j_per_output_token": joules / output_tokens if output_tokens else float("nan"),
            "mean_power_w": joules / busy_s if busy_s > 0 else float("nan")}
