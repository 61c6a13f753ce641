"""Power and energy of a disaggregated run: each pool (prefill, decode) draws as its own GPUs do.

A pool's energy is its steps' energy (``sim.costs.energy``'s per-step power of the pool's GPUs, tensor parallel
included) plus its replicas' idle power over the run less their busy seconds; the run's energy is the pools' sum.
A request's share of a pool's energy is ``sim.costs.energy.attribute``'s over that pool's steps, with the request
placed where it worked in the pool (``PoolPower.windows``): on the prefill pool from its first scheduling to its
prefill's end (its prompt), on the decode pool from its admission there to its finish (its output tokens); a pool's
shares are scaled to the pool's energy, so the requests' energies sum to the run's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from sim.costs.energy import PowerModel, RunEnergy, attribute
from sim.metrics.request_table import as_table

if TYPE_CHECKING:
    from sim.metrics.records import RequestRecord, RunResult

_STEP_KEYS = ("start", "duration", "replica", "flops", "prefill_tokens", "padding_tokens", "decode_tokens",
              "batch_size", "padded_rows", "kv_tokens")
WINDOW_KEYS = ("replica", "first_scheduled", "first_token", "finish")


@dataclass(frozen=True, slots=True, eq=False)
class PoolPower:
    """One pool: its replicas (the step log's ``replica`` values), their power model, and where each request worked
    in it (``WINDOW_KEYS`` -> one value a request, in ``RunResult.requests``' order; ``first_scheduled`` -1: none)."""

    role: str
    replicas: tuple[int, ...]
    model: PowerModel
    windows: dict[str, np.ndarray]


@dataclass(frozen=True, slots=True, eq=False)
class PooledPower:
    """A disaggregated run's power figures: one ``PoolPower`` a pool (``RunResult.power``, as a PowerModel is a
    replica's)."""

    pools: tuple[PoolPower, ...]

    def for_replica(self, replica: int) -> PowerModel:
        """The power model of the GPUs of the step log's replica ``replica``."""
        return next(p.model for p in self.pools if replica in p.replicas)

    def step_power(self, steps: Any) -> np.ndarray:
        """W of the replica that ran each step (its pool's GPUs)."""
        rep = np.asarray(steps["replica"])
        out = np.zeros(len(rep))
        for p in self.pools:
            mask = np.isin(rep, p.replicas)
            out[mask] = p.model.step_power(_rows(steps, mask))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"pools": {p.role: {"replicas": len(p.replicas), **p.model.to_dict()} for p in self.pools}}

    def run_energy(self, result: RunResult, up: float) -> RunEnergy:
        """The run's energy (``sim.costs.energy.run_energy``'s) over ``up`` replica-seconds, shared evenly by the
        replicas (every pool is up the whole run)."""
        steps = result.steps
        rep = np.asarray(steps["replica"])
        table = as_table(result.requests)
        records = list(table)
        total_replicas = sum(len(p.replicas) for p in self.pools)
        busy = idle = 0.0
        per_request = np.zeros(len(records))
        power = self.step_power(steps)
        for p in self.pools:
            mask = np.isin(rep, p.replicas)
            dur = np.asarray(steps["duration"], dtype=np.float64)[mask]
            energy = power[mask] * dur
            pool_idle = max(up * len(p.replicas) / total_replicas - float(dur.sum()), 0.0) * p.model.idle_w \
                * p.model.gpus
            w = p.windows
            placed = [dataclasses.replace(r, replica=int(w["replica"][i]), finish=float(w["finish"][i]),
                                          first_scheduled=float(w["first_scheduled"][i]),
                                          first_token=float(w["first_token"][i])) for i, r in enumerate(records)]
            view = _PoolView(placed, _rows(steps, mask))  # the requests as they worked in the pool, its steps
            per_request += attribute(view, energy, float(energy.sum()) + pool_idle)  # type: ignore[arg-type]
            busy += float(energy.sum())
            idle += pool_idle
        peak = float(power.max()) if len(power) else float("nan")
        return RunEnergy(self, steps, idle, up, per_request, busy, peak)


class _PoolView(NamedTuple):
    requests: list[RequestRecord]
    steps: dict[str, np.ndarray]


def _rows(steps: Any, mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: np.asarray(steps[k])[mask] for k in _STEP_KEYS}
