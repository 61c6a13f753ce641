"""GPU memory figures: the memory stack over time and the KV cache by request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from sim.metrics.block_sums import RunSums
from sim.metrics.records import RunResult
from sim.metrics.request_table import as_table
from sim.metrics.step_columns import StepColumns, step_blocks
from sim.output.report.common import (
    MAX_POINTS,
    TEMPLATE,
    _held,
    _kv_capacity,
    _sorted_steps,
    _state_trace,
    _windowed,
    color,
    run_end,
    window_edges,
    window_runs,
)

# --- GPU memory stack -----------------------------------------------------------------------------------------

MEMORY_POINTS = MAX_POINTS // 2  # windows of the memory stack: five layers of them, and a smooth picture already

MEMORY_LAYERS = (
    ("weights", "model weights", "#7f7f7f"),
    ("kv_stored", "KV: tokens stored", "#1f77b4"),
    ("kv_slack", "KV: empty tail of partly filled blocks", "#9ecae1"),
    ("kv_reserved", "KV: reserved blocks, still empty", "#ff7f0e"),
    ("kv_free", "KV: free blocks", "#e8f4e8"),
)


def memory_layers(result: RunResult) -> tuple[dict[str, np.ndarray], float, str]:
    """Per step (sorted by start), the memory the run's GPUs hold, as the layers of ``MEMORY_LAYERS``; with the
    unit's scale and name (GiB when the run knows its bytes per block, else KV blocks with no weights layer).

    The KV pool splits exactly: stored tokens + the rest of their blocks + reserved empty blocks + free blocks =
    capacity. With prefix caching a shared token counts once per request that uses it, so the stored layer is
    capped at the room of the blocks that hold tokens."""
    s = _sorted_steps(result)
    scale, unit = _unit(result)
    return _layers_of(s, result, scale), scale, unit


def _unit(result: RunResult) -> tuple[float, str]:
    bpb = float(result.kv_bytes_per_block)
    return (bpb / 2**30, "GiB") if bpb > 0 else (1.0, "KV blocks")


def _layers_of(s: Mapping[str, np.ndarray], result: RunResult, scale: float) -> dict[str, np.ndarray]:
    """``memory_layers`` of the steps ``s`` (all of a run's, or a block of them: the arithmetic is elementwise)."""
    bpb = float(result.kv_bytes_per_block)
    bs = max(int(result.block_size), 1)
    cap = _kv_capacity(s, result)
    used = np.minimum(s["kv_blocks_used"].astype(np.float64), cap)
    reserved = np.clip(s["kv_blocks_reserved"].astype(np.float64), 0.0, used)
    free = cap - used
    del cap
    filled = used - reserved
    del used
    stored = np.minimum(s["kv_tokens"].astype(np.float64) / bs, filled)  # in blocks
    filled -= stored  # the slack: the rest of the blocks that hold tokens
    weights = float(result.weight_bytes) / bpb if bpb > 0 else 0.0  # in blocks
    layers = {
        "weights": np.full(len(free), weights),
        "kv_stored": stored,
        "kv_slack": filled,
        "kv_reserved": reserved,
        "kv_free": free,
    }
    for v in layers.values():  # in place (each is a new array): a long run's layers are 16 MB each per 2 M steps
        v *= scale
    return layers


_KV_COLUMNS = ("kv_capacity_blocks", "kv_blocks_used", "kv_blocks_reserved", "kv_tokens")


def _windowed_in_blocks(result: RunResult, s: StepColumns, edges: np.ndarray, scale: float
                        ) -> tuple[dict[str, np.ndarray], float] | None:
    """Each layer's ``state_per_window(t, layer, edges, "mean")`` and the most KV capacity, for one replica's
    log whose steps start in order, a block of steps at a time instead of five whole layers beside the times (the
    write phase's peak at 300,000 requests): the steps per window are counted from the starts first, then each
    layer's windows are summed as ``np.add.reduceat`` sums them (``RunSums``). None when out of order."""
    runs = window_runs(s, edges, step_blocks)
    if runs is None:
        return None
    held, counts = runs
    nb = len(edges) - 1
    sums = {key: RunSums(counts) for key, _, _ in MEMORY_LAYERS}
    cap_max = -np.inf
    for _, b in step_blocks(s, _KV_COLUMNS):
        for key, v in _layers_of(b, result, scale).items():
            sums[key].add(v)
        cap_max = max(cap_max, float(_kv_capacity(b, result).max()))
    out = {}
    for key, total in sums.items():
        agg = np.asarray(total.sums) / np.asarray(counts, dtype=np.int64)
        out[key] = _held(agg, held, nb)
    return out, cap_max


def _gpu_total_bytes(result: RunResult) -> float | None:
    """Memory of the GPUs one replica runs on, when the run recorded a preset or inline GPU."""
    dep = (result.config or {}).get("deployment")
    if not isinstance(dep, dict):
        return None
    from sim.hardware.gpu import resolve_gpu

    try:
        gpu = resolve_gpu(dep["gpu"])
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    return float(gpu.memory_bytes) * int(dep.get("tensor_parallel_size", 1) or 1)


def fig_memory_stack(result: RunResult, max_points: int = MEMORY_POINTS, x_end: float | None = None,
                     device: str = "GPU") -> go.Figure:
    """GPU memory over time as a stack (per-window means): the weights at the bottom, then KV holding tokens, the
    unfilled tail of their blocks, blocks reserved but still empty, and free blocks, up to the capacity line
    (weights + KV pool). Also the GPU's total memory when the run recorded which GPU it ran on: the gap is the
    activation reserve and the share gpu_memory_utilization keeps back. ``x_end`` as in ``fig_timeline``.
    ``device``: "CPU" for an engine run on a CPU (its summary records ``device: cpu``): the title says CPU memory
    and the scenario's GPU total is left out (it read "GPU memory" with an H100's 80 GB line over a CPU run)."""
    s = _sorted_steps(result)
    n = s.num_steps if isinstance(s, StepColumns) else len(s["start"])
    own_end = run_end(result)
    end = own_end if x_end is None else max(float(x_end), own_end)
    edges = window_edges(end, n, max_points)
    scale, unit = _unit(result)
    bpb = float(result.kv_bytes_per_block)
    weights = (float(result.weight_bytes) / bpb if bpb > 0 else 0.0) * scale  # every value of the weights layer
    windowed = _windowed_in_blocks(result, s, edges, scale) if isinstance(s, StepColumns) and n > max_points else None
    if windowed is None:
        layers, t = _layers_of(s, result, scale), s["start"]
        # no step ran (every request rejected): the pool the run was sized with, not 0
        cap = float(layers["weights"][0] + _kv_capacity(s, result).max() * scale) if n else \
            float(weights + result.kv_capacity_blocks * scale)
    else:
        cap = float(weights + windowed[1] * scale)
    fig = go.Figure()
    # no step ran (every request rejected): the weights stayed loaded and the KV pool stayed free all along, a
    # band each over the window (the chart showed only the capacity line)
    idle = {"weights": weights, "kv_free": cap - weights} if not n else None
    for key, label, c in MEMORY_LAYERS:
        if key == "weights" and not weights > 0 or idle is not None and key not in idle:
            continue
        trace: dict[str, Any]
        if idle is not None:
            trace = {"x": [0.0, float(edges[-1])], "y": [idle[key]] * 2}
        else:
            trace = _windowed(edges, windowed[0][key]) if windowed is not None else \
                _state_trace(t, layers[key], edges, "mean", max_points)
            # before the first step and past the run's own end (an axis shared with a longer run) the weights
            # stay and the pool is free: the stack began at the first step (blank from 0 to it), and held the
            # last step's KV to the axis' end
            empty = {"weights": weights, "kv_free": cap - weights}.get(key, 0.0)
            if "x0" in trace:  # per window: no value before the first step's window
                y = np.asarray(trace["y"])
                trace["y"] = np.where((edges[:-1] >= own_end) | np.isnan(y), empty, y).astype(np.float32)
            elif len(trace["x"]) and trace["x"][0] > 0:
                trace["x"] = np.r_[0.0, trace["x"]]
                trace["y"] = np.r_[np.float32(empty), trace["y"]].astype(np.float32)
        fig.add_trace(
            go.Scatter(
                name=label,
                stackgroup="memory",
                line=dict(color=c, width=0.5),
                fillcolor=c,
                hovertemplate=f"%{{y:.3f}} {unit}",
                **trace,
            )
        )
    x_end = float(edges[-1])
    fig.add_trace(
        go.Scatter(
            name="capacity: weights + KV pool",
            x=[0.0, x_end],
            y=[cap, cap],
            mode="lines",
            line=dict(color="black", dash="dash"),
        )
    )
    total = _gpu_total_bytes(result) if device == "GPU" else None
    if total is not None and unit == "GiB":
        fig.add_trace(
            go.Scatter(
                name="GPU memory",
                x=[0.0, x_end],
                y=[total / 2**30] * 2,
                mode="lines",
                line=dict(color="#d62728", dash="dot"),
            )
        )
    fig.update_layout(
        template=TEMPLATE,
        height=380,
        title=f"{device} memory: {result.name}" + _fleet_note(result),
        xaxis_title="time (s)",
        xaxis_range=[0.0, x_end],
        yaxis_title=f"memory ({unit})",
        yaxis_rangemode="tozero",
    )
    return fig


def _fleet_note(result: RunResult) -> str:
    """What a several-replica run's memory stack shows: its steps are every replica's, each window their mean, so
    the stack is one replica's memory on average beside one replica's capacity and GPU; the title said "GPU
    memory: colocated" over a four-replica fleet as if it were the fleet's."""
    n = len((result.cluster or {}).get("per_replica") or [])
    if n < 2:
        return ""
    pools = "" if not result.disaggregation else ", prefill and decode pools together"
    return f" (one replica, the mean over the steps of its {n} replicas{pools})"


REQUEST_KV_REQUESTS = 60  # most requests drawn as their own band in the per-request memory chart
REQUEST_KV_POINTS = 60  # time samples of that chart (evenly spaced, so the traces carry no x arrays)


def request_kv_window(result: RunResult, max_requests: int = REQUEST_KV_REQUESTS) -> float:
    """End of the window in which at most ``max_requests`` requests start computing: every request holding KV
    in ``[0, end)`` is then drawn."""
    table = as_table(result.requests)  # read as columns
    first = table.column("first_scheduled")
    starts = np.sort(first[first >= 0])
    if len(starts) == 0:
        return 0.0
    if len(starts) > max_requests:
        return float(starts[max_requests])
    return table.most("finish")


def request_kv_tokens(
    result: RunResult, t: np.ndarray, max_requests: int = REQUEST_KV_REQUESTS
) -> dict[int, np.ndarray]:
    """Per request id, the KV tokens it holds at the times ``t``: its prompt from its first step, then one more
    token per output token, spread evenly between its first token and its finish (the records keep no per-token
    times), nothing after it ends. A preempted request holds nothing from its preemption to its resume (the
    records keep both times), so the bands of a preempting run stay under the capacity."""
    out: dict[int, np.ndarray] = {}
    table = as_table(result.requests)  # the first requests to start, made into records alone
    first = table.column("first_scheduled")
    order = np.lexsort((table.column("id"), first))
    for i in order[first[order] >= 0][:max_requests].tolist():
        r = table[i]
        end = r.finish if r.finish >= 0 else float("inf")
        alive = np.zeros(len(t), dtype=bool)
        for lo, hi in r.kv_intervals(end):
            alive |= (t >= lo) & (t < hi)
        tokens = np.where(alive, float(r.prompt_tokens), 0.0)
        if r.first_token >= 0 and r.output_tokens > 1 and end > r.first_token:
            frac = np.clip((t - r.first_token) / (end - r.first_token), 0.0, 1.0)
            tokens = tokens + np.where(alive & (t >= r.first_token), 1.0 + frac * (r.output_tokens - 1), 0.0)
        out[r.id] = tokens
    return out


REQUEST_KV_CAPACITY_IN_RANGE = 2.0  # the KV pool is drawn when it is at most this many times the peak drawn


def fleet_kv_pool(result: RunResult) -> tuple[np.ndarray, np.ndarray] | None:
    """A several-replica run's KV pool over time, in blocks, as a step function: (times, blocks from each time on),
    the pools of the replicas ready then summed (an autoscaled fleet's grows and shrinks; a disaggregated run's
    prefill and decode pools may differ in size). None for a run of one replica."""
    lives = (result.cluster or {}).get("per_replica") or []
    if len(lives) < 2:
        return None
    pools = (result.disaggregation or {}).get("pools") or {}
    events: list[tuple[float, float]] = []
    for life in lives:
        blocks = float((pools.get(life.get("pool")) or {}).get("kv_capacity_blocks", result.kv_capacity_blocks))
        ready, released = life.get("ready"), life.get("released")
        if not isinstance(ready, int | float) or not np.isfinite(ready):
            continue  # never served: it held no pool
        events.append((float(ready), blocks))
        if isinstance(released, int | float) and np.isfinite(released):
            events.append((float(released), -blocks))
    times = np.array(sorted({0.0, *(t for t, _ in events)}))
    at, change = np.array([t for t, _ in events]), np.array([b for _, b in events])
    return times, np.array([change[at <= t].sum() for t in times])


def fig_memory_by_request(result: RunResult, max_requests: int = REQUEST_KV_REQUESTS,
                          points: int = REQUEST_KV_POINTS, x_end: float | None = None) -> go.Figure:
    """One band per active request's KV cache, stacked: every session's cache must stay resident, and the bands
    pile up towards the KV pool. The y axis spans the KV in use (a 1 GiB pile on a 70 GiB axis is invisible); the
    pool's capacity is drawn as a line when it is within REQUEST_KV_CAPACITY_IN_RANGE times the peak, else
    named in the title. The weights are not stacked: they are constant and named in the title. ``x_end``: the
    window's end (default: ``request_kv_window``); the report passes one end to every variant."""
    end = request_kv_window(result, max_requests) if x_end is None else float(x_end)
    t = np.linspace(0.0, end, points) if end > 0 else np.zeros(1)
    bpb = float(result.kv_bytes_per_block)
    bs = max(int(result.block_size), 1)
    scale, unit = (bpb / bs / 2**30, "GiB") if bpb > 0 else (1.0 / bs, "KV blocks")
    weights = float(result.weight_bytes) / 2**30 if bpb > 0 else 0.0
    fig = go.Figure()
    even = dict(x0=0.0, dx=float(t[1] - t[0]) if len(t) > 1 else 1.0)
    total = np.zeros(len(t))
    for i, (rid, tokens) in enumerate(request_kv_tokens(result, t, max_requests).items()):
        y = (tokens * scale).astype(np.float32)
        total += y
        fig.add_trace(go.Scatter(name=f"request {rid}", y=y, stackgroup="m", **even,
                                 line=dict(width=0.3, color=color(i)), fillcolor=color(i), showlegend=False,
                                 hovertemplate=f"request {rid}: %{{y:.3f}} {unit}<extra></extra>"))
    per_block = bpb / 2**30 if bpb > 0 else 1.0
    # a several-replica run's bands are every replica's requests: they pile against the fleet's pool, not one
    # replica's (lesson-disaggregation's 4 replicas read "KV pool 54.6 GiB" beside the bands of all four)
    fleet = fleet_kv_pool(result)
    if fleet is None:
        cap_x, cap_y, whose = np.array([0.0]), np.array([float(result.kv_capacity_blocks)]), ""
    else:
        cap_x, cap_y = fleet
        keep = cap_x <= t[-1]
        cap_x, cap_y = cap_x[keep], cap_y[keep]
        n = len((result.cluster or {}).get("per_replica") or [])
        whose = f" (all {n} replicas)" if len(np.unique(fleet[1])) == 1 else " (the replicas serving)"
    cap_y = cap_y * per_block
    cap = float(cap_y.max())
    peak = float(total.max()) if total.size else 0.0
    # what the bands are on a line of its own: on one line with a sweep point's name the title ran past the figure
    title = f"KV cache by request: {result.name}<br>(first {end:.0f} s, at most {max_requests} requests, one band each"
    if weights > 0:
        title += f"; weights {weights:.1f} GiB not stacked"
    low = float(cap_y.min())
    if low > 0 and (peak <= 0 or low <= REQUEST_KV_CAPACITY_IN_RANGE * peak):
        fig.add_trace(go.Scatter(name="KV pool capacity" + whose, x=np.r_[cap_x, float(t[-1])],
                                 y=np.r_[cap_y, cap_y[-1]], mode="lines", line=dict(color="black", dash="dash",
                                                                                    shape="hv")))
        # the axis reaches the pile too: at the capacity alone it cut off a pile above it (the even spread of
        # output tokens these bands assume); a fleet's pool that grows far above the pile leaves the axis
        top = max(min(cap, REQUEST_KV_CAPACITY_IN_RANGE * peak), peak) if peak > 0 else cap
        if cap > top:
            title += f"; KV pool up to {cap:.1f} {unit}, above the axis"
    else:
        title += f"; KV pool {cap:.1f} {unit}{whose}, off the scale"
        top = peak
    fig.update_layout(template=TEMPLATE, height=380, xaxis_title="time (s)", yaxis_title=f"KV cache ({unit})",
                      title=title + ")", yaxis_range=[0.0, 1.05 * top if top > 0 else 1.0],
                      xaxis_range=[0.0, float(t[-1])])
    return fig
