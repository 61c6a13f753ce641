"""The batch-slot chart: every scheduled request on a row of the batch, rebuilt from the records."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from sim.metrics.records import RunResult
from sim.metrics.request_table import RequestTable, as_table, kv_spans
from sim.metrics.step_columns import step_blocks
from sim.output.report.common import (
    TEMPLATE,
)

# --- batch slots ------------------------------------------------------------------------------------------------
#
# The records do not say which row of the batch a request occupied, only when it was first scheduled and when it
# finished. Rows are therefore reconstructed: each request holds a row over an interval, and intervals are packed
# into rows greedily in order of their start, each taking the lowest row free at that moment. That is the
# classic colouring of an interval graph, and it is optimal: a new row opens only when every open row is busy, so
# the number of rows equals the most intervals that overlap at any instant, and no assignment can use fewer.
#
# What interval a request holds depends on the policy, which the steps log reveals. Under static batching a
# finished request keeps its row as padding until the whole batch is done (steps log ``padded_rows > 0``); a batch
# is the set of requests first scheduled in the same step on the same replica, and it ends with its last finish.
# Without padded rows a request holds its row from its first scheduled step to its finish. A preempted request
# gives its row back from its preemption to its resume (the records keep both times): one bar per stretch it ran.

SLOT_REQUESTS = 300  # most requests drawn per variant in the slot chart
SLOT_PANELS = 8  # most variants (or sweep points) the slot chart draws


@dataclass(frozen=True, slots=True)
class SlotLayout:
    """Every scheduled request of one run placed on a row of the batch. Arrays are aligned, one entry per span in
    which a request held a row (one per request, plus one per resume after a preemption), in requests.csv order."""

    ids: np.ndarray  # request ids
    start: np.ndarray  # first scheduled, or resumed (s)
    finish: np.ndarray  # last token, failure or preemption (s)
    held_until: np.ndarray  # when its row is free again (s): the batch's end under static batching, else finish
    row: np.ndarray  # 0-based row, replicas stacked one above the other
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    num_rows: int  # per replica the most requests holding a row at one instant, summed over replicas
    batch_held: bool  # whether rows were held to the end of a batch (padding inferred from the steps log)
    # every span's count and latest held_until (NaN: none), kept apart from the arrays: those may hold only the
    # earliest spans (``slot_layout``'s ``first``), the chart's window
    spans: int
    held_end: float
    requests: int  # the scheduled requests those spans belong to (fewer than spans where some were preempted)
    replicas: int = 1  # the replicas whose rows are stacked

    def padded_rows_at(self, t: np.ndarray) -> np.ndarray:
        """How many rows are padding (finished, still held) at each time t."""
        t = np.asarray(t, dtype=np.float64)
        done = np.searchsorted(np.sort(self.finish), t, side="right")
        freed = np.searchsorted(np.sort(self.held_until), t, side="right")
        return done - freed


def assign_slots(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A row for each half-open interval [start, end), no two overlapping intervals on one row, in the fewest rows
    possible (the most intervals alive at one instant). Greedy in order of start (ties in input order); each
    interval takes the lowest-numbered free row. An interval with end <= start holds its row for an instant: a
    later start frees it, one at the same instant does not."""
    start = np.asarray(start, dtype=np.float64)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    rows = np.empty(len(start), dtype=np.int64)
    busy: list[tuple[float, bool, int]] = []  # (end, zero length, row) of rows in use
    free: list[int] = []  # released rows, lowest first
    opened = 0
    for i in np.argsort(start, kind="stable").tolist():
        s = start[i]
        while busy and (busy[0][0] < s or (busy[0][0] == s and not busy[0][1])):
            heapq.heappush(free, heapq.heappop(busy)[2])
        if free:
            r = heapq.heappop(free)
        else:
            r = opened
            opened += 1
        rows[i] = r
        heapq.heappush(busy, (end[i], bool(end[i] == s), r))
    return rows


def rows_needed(start: np.ndarray, end: np.ndarray) -> int:
    """``int(assign_slots(start, end).max()) + 1`` (0 for no intervals) without placing them: when interval i is
    placed, the rows in use are those placed before it (its rank in start order) less those freed by then (an
    end before its start, or at it for an interval of non-zero length), and a row is opened only when every open
    row is in use. Sorted arrays instead of a Python loop over every request of a long run."""
    start = np.asarray(start, dtype=np.float64)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    if not len(start):
        return 0
    zero = end == start
    ends = np.sort(end[~zero])  # freed by a start at or after their end
    instants = np.sort(start[zero])  # freed only by a later start
    del zero, end
    starts = np.sort(start)
    most, block = 0, 1 << 16  # a block of starts at a time
    for lo in range(0, len(starts), block):
        s = starts[lo : lo + block]
        held = np.arange(lo, lo + len(s)) - np.searchsorted(ends, s, side="right")
        held -= np.searchsorted(instants, s, side="left")
        most = max(most, int(held.max()))
    return most + 1


def slot_layout(result: RunResult, first: int | None = None) -> SlotLayout:
    """Rows of the batch for one run (see the comment above ``SLOT_REQUESTS``). A preempted request holds no row
    from its preemption to its resume, so it takes one entry per span it ran (``RequestRecord.kv_intervals``).
    ``first``: keep only the spans that start no later than the ``first + 1``-th earliest start (ties kept), the
    most a chart of ``first`` requests draws, instead of arrays of every request (``spans``, ``held_end`` and
    ``num_rows`` still count them all); where rows are held to a batch's end, every span is kept."""
    table = as_table(result.requests)  # read as columns
    at, start, stop = kv_spans(table, np.maximum(table.column("finish"), table.column("first_scheduled")))
    finish = np.maximum(stop, start, out=stop)
    # a block of steps at a time: the whole column was the write phase's largest array (8 bytes a step, twice
    # while its chunks were joined)
    batch_held = any(bool((b["padded_rows"] > 0).any()) for _, b in step_blocks(result.steps, ("padded_rows",)))
    if first is not None and not batch_held and len(at) > first + 1:
        return _first_spans(table, at, start, finish, first)
    replica = table.column("replica")[at]
    held = finish.copy()
    if batch_held and len(at):
        # a batch: the requests first scheduled in one step of one replica; it ends with its last finish
        keys = np.stack([replica.astype(np.float64), start])
        _, group = np.unique(keys, axis=1, return_inverse=True)
        group = group.ravel()
        batch_end = np.full(group.max() + 1, -np.inf)
        np.maximum.at(batch_end, group, finish)
        held = batch_end[group]
    row = np.zeros(len(at), dtype=np.int64)
    offset = 0
    for rep in np.unique(replica):
        on = replica == rep
        row[on] = assign_slots(start[on], held[on]) + offset
        offset = int(row[on].max()) + 1
    return SlotLayout(
        ids=table.column("id")[at],
        start=start,
        finish=finish,
        held_until=held,
        row=row,
        prompt_tokens=table.column("prompt_tokens")[at],
        output_tokens=table.column("output_tokens")[at],
        num_rows=offset,
        batch_held=batch_held,
        spans=len(at),
        held_end=float(held.max()) if len(at) else float("nan"),
        requests=len(np.unique(at)),
        replicas=max(1, len(np.unique(replica))),
    )


def _first_spans(table: RequestTable, at: np.ndarray, start: np.ndarray, finish: np.ndarray, first: int
                 ) -> SlotLayout:
    """``slot_layout``'s arrays for the spans that start no later than the ``first + 1``-th earliest start, rows
    held to each finish: greedy placement in start order gives these spans the rows it gives them among all
    (each depends only on the spans placed before it, which start no later), and each replica's row count
    comes from ``rows_needed``. A long run's layout was some 130 bytes a request, the report's largest holder."""
    cut = float(np.partition(start, first)[first])
    keep = start <= cut
    replicas = np.unique(table.column("replica"))
    replica = table.column("replica", at) if len(replicas) > 1 else None
    row = np.zeros(int(np.count_nonzero(keep)), dtype=np.int64)
    offset = 0
    for rep in replicas.tolist():
        on = slice(None) if replica is None else replica == rep
        mine = keep[on]
        part = assign_slots(start[on][mine], finish[on][mine])
        if replica is None:
            row[:] = part + offset
        else:
            row[(replica == rep)[keep]] = part + offset
        offset += rows_needed(start[on], finish[on])
    held_end = float(finish.max())
    rows = at[keep]
    return SlotLayout(ids=table.column("id", rows), start=start[keep], finish=finish[keep], held_until=finish[keep],
                      row=row, prompt_tokens=table.column("prompt_tokens", rows),
                      output_tokens=table.column("output_tokens", rows), num_rows=offset, batch_held=False,
                      spans=len(at), held_end=held_end, requests=len(np.unique(at)), replicas=len(replicas))


def _policy(result: RunResult) -> dict:
    pol = (result.config or {}).get("policy")
    return pol if isinstance(pol, dict) else {}


def _slot_limit(result: RunResult) -> tuple[str, int] | None:
    """The configured number of rows, when the run recorded its policy: batch_size or max_num_seqs."""
    pol = _policy(result)
    for key in ("batch_size", "max_num_seqs"):
        if isinstance(pol.get(key), int):
            return key, pol[key]
    return None


def slot_window(layouts: list[SlotLayout], max_requests: int = SLOT_REQUESTS) -> float:
    """The end of the common time window [0, t] in which no run starts more than max_requests requests: the
    earliest time at which some run starts its request number max_requests + 1 (the end of the runs when none
    does)."""
    ends = [lay.held_end for lay in layouts if len(lay.start)]
    t_end = max(ends, default=1.0)
    for lay in layouts:
        if len(lay.start) > max_requests:
            t_end = min(t_end, float(np.sort(lay.start)[max_requests]))
    return t_end


SLOT_COLORS = qualitative.D3  # one colour per request, cycling: neighbours in a row differ
PAD_COLOR = "#bbbbbb"


def fig_batch_slots(
    results: list[RunResult], max_requests: int = SLOT_REQUESTS, t_end: float | None = None,
    layouts: list[SlotLayout] | None = None,
) -> go.Figure:
    """Rows of the batch over time, one panel per variant on one shared time axis: a coloured bar per request
    from its first scheduled step to its finish, grey hatched bars where a finished request still holds its row
    (static batching's padding), blank where a row is idle. Draws the window [0, t_end] (default: the longest
    window in which no variant starts more than max_requests requests); bars are cut at its end. ``layouts``:
    the results' ``slot_layout``s when the caller has them (several arrays a request: made once)."""
    if not results:
        return go.Figure(layout=dict(template=TEMPLATE, title="Batch slots: no runs"))
    if layouts is None:
        layouts = [slot_layout(r) for r in results]
    t_end = slot_window(layouts, max_requests) if t_end is None else float(t_end)
    titles = []
    shown: list[np.ndarray] = []
    for res, lay in zip(results, layouts, strict=True):
        keep = lay.start < t_end
        shown.append(keep)
        rows = f"{lay.num_rows} row{'' if lay.num_rows == 1 else 's'} at the busiest instant"
        if lay.replicas > 1:  # "66 rows at the busiest instant; max_num_seqs=256" over 8 replicas' stacked rows
            rows = (f"{lay.num_rows} rows: {lay.replicas} replicas stacked, each as many as it held at its "
                    "busiest instant")
        limit = _slot_limit(res)
        if limit is not None:
            rows += f"; {limit[0]}={limit[1]}" + (" per replica" if lay.replicas > 1 else "")
        drawn = f"{int(keep.sum())} of {lay.spans} scheduled request{'' if lay.spans == 1 else 's'} drawn"
        if lay.spans > lay.requests:  # a resumed request's own bar: the bars outnumber the requests
            drawn = (f"{int(keep.sum())} of {lay.spans} bars drawn, {lay.requests} scheduled requests (a preempted "
                     "request has one bar per stretch it ran)")
        titles.append(f"{res.name}: {drawn}; {rows}")
    heights = []
    for res, lay, keep in zip(results, layouts, shown, strict=True):
        top = int(lay.row[keep].max()) + 1 if keep.any() else 1
        limit = _slot_limit(res)
        if limit is not None and limit[0] == "batch_size":
            top = max(top, limit[1])  # the empty rows of a partial batch are idle slots too
        heights.append(top)
    fig = make_subplots(
        rows=len(results),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / max(len(results), 1)),
        subplot_titles=titles,
        row_heights=[h + 4 for h in heights],
    )
    for i, (lay, keep, top) in enumerate(zip(layouts, shown, heights, strict=True), start=1):
        s = lay.start[keep]
        f = np.minimum(lay.finish[keep], t_end)
        h = np.minimum(lay.held_until[keep], t_end)
        colors = [SLOT_COLORS[k % len(SLOT_COLORS)] for k in lay.ids[keep].tolist()]
        custom = np.stack(
            [lay.ids[keep], lay.prompt_tokens[keep], lay.output_tokens[keep]], axis=1
        ).astype(np.int32)
        fig.add_trace(
            go.Bar(
                name="request",
                legendgroup="request",
                showlegend=i == 1,
                orientation="h",
                base=s.astype(np.float32),
                x=(f - s).astype(np.float32),
                y=lay.row[keep].astype(np.int32),
                width=0.85,
                marker=dict(color=colors, line=dict(width=0)),
                customdata=custom,
                hovertemplate="request %{customdata[0]}: %{customdata[1]} prompt, %{customdata[2]} output tokens"
                "<br>%{base:.3f} s to %{x:.3f} s later<extra></extra>",
            ),
            row=i,
            col=1,
        )
        pad = h > f
        if pad.any():
            fig.add_trace(
                go.Bar(
                    name="padding: finished, row still held",
                    legendgroup="padding",
                    showlegend=True,
                    orientation="h",
                    base=f[pad].astype(np.float32),
                    x=(h[pad] - f[pad]).astype(np.float32),
                    y=lay.row[keep][pad].astype(np.int32),
                    width=0.85,
                    marker=dict(color="white", line=dict(width=0), pattern=dict(shape="/", fgcolor=PAD_COLOR)),
                    hovertemplate="padding row %{y}: %{x:.3f} s<extra></extra>",
                ),
                row=i,
                col=1,
            )
        fig.update_yaxes(
            title_text="row", range=[top - 0.5, -0.5], showgrid=False, zeroline=False, row=i, col=1
        )
    fig.update_xaxes(range=[0.0, t_end], row=len(results), col=1, title_text="time (s)", title_standoff=6,
                     automargin=True)
    fig.update_layout(
        # a bottom margin for the x axis's ticks and title and, below them, the legend: without it plotly drew the
        # axis title over the tick labels (issue 35: "time (s)" over the tick "30")
        margin=dict(b=110),
        template=TEMPLATE,
        barmode="overlay",
        bargap=0,
        hovermode="closest",
        height=int(min(1600, 140 + sum(max(120.0, 9.0 * (h + 4)) for h in heights))),
        title=dict(
            text=f"Batch slots over the first {t_end:.4g} s (at most {max_requests} requests per variant)",
            x=0.01,
            xanchor="left",
        ),
        # below the plot: the modebar sits at the top right, where the legend used to be and covered it
        legend=dict(orientation="h", yref="container", y=0.005, yanchor="bottom", x=0.0, xanchor="left"),
    )
    return fig
