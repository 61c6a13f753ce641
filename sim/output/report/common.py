"""Shared pieces of the report: the Section each builder returns, the template and colours, and the reductions of
long series (windows, states, CDF samples) that keep a long run's page small."""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from sim.metrics.records import RunResult
from sim.metrics.request_table import as_table
from sim.metrics.step_columns import StepColumns, continues_ascending, step_blocks

MAX_POINTS = 1000  # most points a plotted series may have
MODEBAR_PX = 30  # plotly's mode bar: its icons fill the top 30 px of a figure, at the right, shown on hover
# plotly sets a title's baseline in the middle of the top margin: at 48 px, under the mode bar's band rather than
# in it (at a 50 px margin, titles such as "KV cache by request: ..." ran under its icons)
TOP_MARGIN = 96
MIN_WINDOWS = 20  # fewest windows a timeline uses, however short the run

# A small template: plotly's named ones add about 7 kB of JSON to every figure.
TEMPLATE = go.layout.Template(
    layout=dict(
        paper_bgcolor="white",
        plot_bgcolor="white",
        font=dict(family="sans-serif", size=12),
        xaxis=dict(gridcolor="#e5e5e5", zerolinecolor="#cccccc", showline=True, linecolor="#999999"),
        yaxis=dict(gridcolor="#e5e5e5", zerolinecolor="#cccccc", showline=True, linecolor="#999999"),
        hovermode="x unified",
        margin=dict(l=70, r=30, t=TOP_MARGIN, b=50),
    )
)
# plotly's 10, then Dark24's 24 (none of them close to the first 10): a sweep of 3 variants at 5 loads gave its 11th
# to 15th runs the 1st to 5th runs' colours
COLORS = qualitative.Plotly + qualitative.Dark24
LEGEND_ROW_PX = 22  # one row of a horizontal legend
LEGEND_PER_ROW = 3  # entries a row is assumed to hold (long variant names on a narrow page: fewer than fit at 1400 px)


def legend_below(fig: go.Figure, height: int) -> go.Figure:
    """``fig`` with its legend in rows at the bottom of the figure, under the x axis titles, and the figure
    ``height`` plus room for those rows. A legend placed at y = -0.2 to -0.3 of the plot was anchored by its
    bottom (plotly's automatic anchor below y = 1/3), so one that wrapped to a second row grew up over "time
    (s)"; anchored by its top, it pushed the margin and shrank the plot until it met the titles again (the
    cluster, power, fairness and disaggregation charts, seen rendered in Chromium: tests/test_browser_report.py)."""
    entries = len({(tr.legendgroup or tr.name) for tr in fig.data if tr.showlegend is not False and tr.name})
    extra = LEGEND_ROW_PX * max(1, math.ceil(entries / LEGEND_PER_ROW))
    return fig.update_layout(height=height + extra, margin=dict(b=70 + extra),
                             legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0.0,
                                         xanchor="left"))


@dataclass(slots=True)
class Section:
    """A heading with a figure and/or an HTML fragment (already escaped)."""

    title: str
    figure: go.Figure | None = None
    html: str = ""


def wrap_lines(text: str, chars: int) -> str:
    """``text`` broken with plotly's ``<br>`` into lines of at most ``chars`` characters (a word longer stays whole),
    the breaks it has kept."""
    return "<br>".join(line for part in text.split("<br>") for line in (textwrap.wrap(part, chars) or [part]))


def color(i: int) -> str:
    """The colour of the i-th variant, the same in every figure."""
    return COLORS[i % len(COLORS)]


# --- reducing long series --------------------------------------------------------------------------------------


def common_end(results: list[RunResult]) -> float:
    """One time axis for the per-variant charts: the latest end over the runs, so the variants line up."""
    return max((run_end(r) for r in results), default=1.0)


def run_end(result: RunResult) -> float:
    """The end of the run's time axis: the last step's end, the last finish or the duration, whichever is last
    (inside ``step_events_kept``, found once a run)."""
    return _once("run_end", result, lambda: _run_end(result))


def _run_end(result: RunResult) -> float:
    ends = [float(result.duration)]
    # the last step's end a block at a time: a long run's whole start and end columns were the report's peak
    last = [np.max(b["start"] + b["duration"]) for _, b in step_blocks(result.steps, ("start", "duration"))]
    if last:
        ends.append(float(np.max(last)))
    table = as_table(result.requests)
    if len(table):
        ends.append(table.most("finish"))
    return max(ends)


def window_edges(t_end: float, n_steps: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Edges of equal windows over [0, t_end]: about one window per four steps, between MIN_WINDOWS and
    max_points windows."""
    n = int(min(max_points, max(MIN_WINDOWS, n_steps // 4)))
    return np.linspace(0.0, max(t_end, 1e-9), n + 1)


def amount_per_window(starts: np.ndarray, durations: np.ndarray, amounts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Sum of each step's amount that falls in each window, the amount spread evenly over the step's duration
    (a zero-length step counts at its start; windows are half-open [a, b), the last one closed). Exact for
    overlapping steps too (several replicas)."""
    starts = np.asarray(starts, dtype=np.float64)
    durations = np.asarray(durations, dtype=np.float64)
    amounts = np.asarray(amounts, dtype=np.float64)
    cum = np.zeros(len(edges))
    point = durations <= 0
    if point.any():
        order = np.argsort(starts[point], kind="stable")
        t, a = starts[point][order], amounts[point][order]
        idx = np.searchsorted(t, edges, side="left")
        idx[-1] = np.searchsorted(t, edges[-1], side="right")  # the last window is closed
        cum += np.concatenate(([0.0], np.cumsum(a)))[idx]
    if len(starts) > KEEP_EVENTS_MAX and not point.any() and _in_order(starts, durations):
        cum += _cum_in_chunks(starts, durations, amounts, edges)  # a long run's: a chunk of its steps at a time
    elif not point.all():
        # the same arithmetic as concatenating and cumulating into new arrays, done in place and with each
        # temporary dropped once used: a long run's steps made some twenty temporaries of twice its columns
        s, d, a = (starts, durations, amounts) if not point.any() else \
            (starts[~point], durations[~point], amounts[~point])
        times, rate_after = _step_events(s, d, a)
        del s, d, a
        np.cumsum(rate_after, out=rate_after)
        gained = np.diff(times)
        gained *= rate_after[:-1]
        del rate_after
        at_times = np.empty(len(times))
        at_times[0] = 0.0
        np.cumsum(gained, out=at_times[1:])
        del gained
        cum += np.interp(edges, times, at_times)  # the cumulative amount is linear between those times
    return np.diff(cum)


# Inside ``step_events_kept``, what a pass over a long run's whole log found (``_once``): the report read each
# log's starts about 20 times (its end five times, the order of its starts five), each pass expanding its chunks
_kept_reads: dict[tuple[Any, int], tuple[Any, Any]] | None = None


def keeping() -> bool:
    """Whether this is inside ``step_events_kept`` (what ``_once`` finds is kept)."""
    return _kept_reads is not None


def _once(what: Any, of: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, found once for ``what`` (a hashable name of what is computed) of the object ``of`` inside
    ``step_events_kept`` (a run or its steps, which do not change while the report is made); outside, every
    time."""
    kept = _kept_reads
    if kept is None:
        return compute()
    hit = kept.get((what, id(of)))
    if hit is None or hit[0] is not of:  # (the object held with it: its id is not another's)
        hit = kept[(what, id(of))] = (of, compute())
    return hit[1]


# Inside ``step_events_kept``, the last run's merged step times (``_placement``), reused while the report windows
# further amounts over the same steps (it windows four: busy time and FLOPs, decode and prefill tokens); one run's
# only and up to KEEP_EVENTS_MAX steps, so what it holds stays bounded (18 bytes a step)
_kept_events: list[tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]] | None = None
KEEP_EVENTS_MAX = 1 << 20


@contextmanager
def step_events_kept() -> Iterator[None]:
    """Inside the block, the order of a run's step starts and ends is found once for all the amounts windowed
    over the same arrays of starts and durations (``amount_per_window``)."""
    global _kept_events, _kept_reads
    outer, _kept_events = _kept_events, [] if _kept_events is None else _kept_events
    outer_reads, _kept_reads = _kept_reads, {} if _kept_reads is None else _kept_reads
    try:
        yield
    finally:
        _kept_events, _kept_reads = outer, outer_reads


EVENT_ROWS = 1 << 16  # steps whose starts and ends _cum_in_chunks orders at a time


def _in_order(s: np.ndarray, d: np.ndarray) -> bool:
    """Whether the steps start in order and end in order (one replica's log), read a block at a time."""
    return _in_order_blocks((lo, {"start": s[lo : lo + EVENT_ROWS], "duration": d[lo : lo + EVENT_ROWS]})
                            for lo in range(0, len(s), EVENT_ROWS))


def _in_order_blocks(blocks: Iterator[tuple[int, Mapping[str, np.ndarray]]]) -> bool:
    """Whether the steps, fed as blocks of their starts and durations, start in order, end in order and each
    last a positive time (``_cum_in_blocks``'s steps)."""
    last_s = last_e = -np.inf
    for _, b in blocks:
        bs = np.asarray(b["start"], dtype=np.float64)
        bd = np.asarray(b["duration"], dtype=np.float64)
        be = bs + bd
        if not (continues_ascending(bs, last_s) and continues_ascending(be, last_e) and bool(np.all(bd > 0))):
            return False
        last_s, last_e = bs[-1], be[-1]
    return True


def _cum_in_chunks(s: np.ndarray, d: np.ndarray, a: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``_cum_in_blocks`` of whole arrays, ``EVENT_ROWS`` steps at a time."""
    return _cum_in_blocks(((s[lo : lo + EVENT_ROWS], d[lo : lo + EVENT_ROWS], a[lo : lo + EVENT_ROWS])
                           for lo in range(0, len(s), EVENT_ROWS)), edges)


def _cum_in_blocks(blocks: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]], edges: np.ndarray) -> np.ndarray:
    """The cumulative amount at each edge (``np.interp(edges, times, at_times)`` of amount_per_window) for steps of
    positive duration that start in order and end in order, fed as consecutive blocks of (starts, durations,
    amounts): ``_cums_in_blocks`` of one amount."""
    return _cums_in_blocks(((s, d, (a,)) for s, d, a in blocks), edges, 1)[0]


def _cums_in_blocks(blocks: Iterator[tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]], edges: np.ndarray,
                    m: int) -> list[np.ndarray]:
    """``_cum_in_blocks`` of ``m`` amounts of the same steps at once, fed as blocks of (starts, durations, the
    amounts), with the events (each step's start and end, stably sorted by time) made a block at a time instead of
    as four arrays of twice the steps (the write phase's peak at a million requests), and ordered once for all the
    amounts (the report windows four over a long run's steps: each pass read the log's starts and placed them).
    The events before the next block's first start in the stable order are the starts before it and the ends
    strictly before it (an equal end sorts after a start), so each block's events are a contiguous stretch of the
    whole order; the running sums continue from the block before (a cumulative sum is sequential), and each edge is
    interpolated between the same two events as in the whole arrays, so every value is the same."""
    outs = [np.empty(len(edges)) for _ in range(m)]
    done = 0  # edges set
    t_prev: float | None = None  # the last event so far
    prevs: list[tuple[float, float]] = []  # each amount's rate after it and amount at it
    pending_s, pending_d = np.zeros(0), np.zeros(0)  # steps started whose ends are not placed yet
    pending_a = [np.zeros(0)] * m
    cur = next(blocks, None)
    while cur is not None:
        nxt = next(blocks, None)
        s, d, amounts = cur
        ps, pd = np.concatenate((pending_s, s)), np.concatenate((pending_d, d))
        ends = ps + pd
        k = len(ends) if nxt is None else int(np.searchsorted(ends, nxt[0][0], side="left"))
        # the two sorted runs merged, a start before an equal end (the stable argsort's order, see _step_events)
        # (placed through indices, not boolean masks: a tenth of the time, for a block's few hundred kB)
        n_ev = len(s) + k
        start_at = np.searchsorted(ends[:k], s, side="left")
        start_at += np.arange(len(s), dtype=start_at.dtype)
        is_start = np.zeros(n_ev, dtype=bool)
        is_start[start_at] = True
        end_at = np.flatnonzero(~is_start)
        times = np.empty(n_ev)
        times[start_at], times[end_at] = s, ends[:k]
        pending_s, pending_d = ps[k:], pd[k:]
        if t_prev is not None:  # with the last event before, so that the pair across the cut is interpolated here
            times = np.concatenate(([t_prev], times))
        upto = int(np.searchsorted(edges, times[-1], side="left"))  # edges before the last event
        for j, a in enumerate(amounts):
            pa = np.concatenate((pending_a[j], a))
            rate = np.empty(n_ev)
            rate[start_at], rate[end_at] = a / d, -(pa[:k] / pd[:k])
            pending_a[j] = pa[k:]
            if t_prev is None:
                rate_after = np.cumsum(rate)
                at = np.empty(len(times))
                at[0] = 0.0
                np.cumsum(np.diff(times) * rate_after[:-1], out=at[1:])
                prevs.append((float(rate_after[-1]), float(at[-1])))
            else:
                rate_after = np.cumsum(np.concatenate(([prevs[j][0]], rate)))
                at = np.cumsum(np.concatenate(([prevs[j][1]], np.diff(times) * rate_after[:-1])))
                prevs[j] = (float(rate_after[-1]), float(at[-1]))
            outs[j][done:upto] = np.interp(edges[done:upto], times, at)
        done = max(done, upto)
        t_prev = float(times[-1])
        cur = nxt
    assert t_prev is not None and not len(pending_s)
    for out, (_, last) in zip(outs, prevs, strict=True):
        out[done:] = last  # at or past the last event: its amount, as np.interp gives
    return outs


def _step_events(s: np.ndarray, d: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's start and end (``np.concatenate((s, s + d))``) in stable sorted order, and the rate each starts
    (+a/d) or ends (-a/d) there (the order: ``_placement``)."""
    n = len(s)
    placed = _placement(s, d)
    rate = a / d
    rate_after = np.empty(2 * n)  # rate on [times[i], times[i+1]) once sorted and cumulated
    if len(placed) == 2:  # sorted by the argsort
        times, order = placed
        rate_after[:n] = rate
        np.negative(rate, out=rate_after[n:])
        return times, rate_after[order]
    times, is_start, is_end = placed
    rate_after[is_start] = rate
    np.negative(rate, out=rate)
    rate_after[is_end] = rate
    return times, rate_after


def _placement(s: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, ...]:
    """The steps' starts and ends in stable sorted order, with where each came from: (times, the starts' places,
    the ends' places) as indices (as boolean masks past KEEP_EVENTS_MAX steps), or (times, the argsort's
    permutation of starts then ends). The steps of
    one replica's log start in order and end in order, so the sorted times are the two sorted halves merged,
    starts first among equal times, which is the permutation the stable argsort gives: placed by search, it costs
    a boolean per time instead of the argsort's index, its buffer and the gathered copies (a long run's peak was
    this sort). Otherwise the argsort. Inside ``step_events_kept``, kept for the next call with these arrays."""
    kept = _kept_events
    if kept and kept[0][0] is s and kept[0][1] is d:
        return kept[0][2]
    n = len(s)
    e = s + d
    placed: tuple[np.ndarray, ...]
    if not (bool(np.all(s[1:] >= s[:-1])) and bool(np.all(e[1:] >= e[:-1]))):
        times = np.concatenate((s, e))
        del e
        order = np.argsort(times, kind="stable")
        if len(order) < 2**31:  # the same permutation in half the bytes: it is held beside two columns
            order = order.astype(np.int32)
        placed = (times[order], order)
    else:
        # start i is preceded by starts 0..i-1 and by the ends strictly before it (an equal end sorts after it)
        at = np.searchsorted(e, s, side="left")
        at += np.arange(n, dtype=at.dtype)
        is_start = np.zeros(2 * n, dtype=bool)
        is_start[at] = True
        if n <= KEEP_EVENTS_MAX:
            # the places as indices: assigning through them takes a tenth of a boolean mask's time, for 8 bytes a
            # time where the masks take one (a long run keeps the masks)
            is_end = np.flatnonzero(~is_start)
            is_start = at
        else:
            del at
            is_end = ~is_start
        times = np.empty(2 * n)
        times[is_start] = s
        times[is_end] = e  # the ends fill the other places in their own (sorted) order
        placed = (times, is_start, is_end)
    if kept is not None:
        kept.clear()
        if n <= KEEP_EVENTS_MAX:
            for x in placed:
                x.flags.writeable = False  # shared by the calls that hit it
            kept.append((s, d, placed))
    return placed


def state_per_window(t: np.ndarray, values: np.ndarray, edges: np.ndarray, how: str = "max") -> np.ndarray:
    """Per window, the maximum (how="max") or mean (how="mean") of the values whose time t (sorted) falls in
    it. A window without any keeps the previous window's value: the state holds while nothing runs."""
    nb = len(edges) - 1
    out = np.full(nb, np.nan)
    if len(t) == 0:
        return out
    values = np.asarray(values, dtype=np.float64)
    uniq, first = _window_starts(np.asarray(t), edges)
    if how == "max":
        agg = np.maximum.reduceat(values, first)
    elif how == "mean":
        agg = np.add.reduceat(values, first) / np.diff(np.append(first, len(values)))
    else:
        raise ValueError(f"how must be 'max' or 'mean', got {how!r}")
    return _held(agg, uniq, nb)


def window_runs(s: Mapping[str, np.ndarray], edges: np.ndarray, blocks: Callable = step_blocks
                ) -> tuple[np.ndarray, list[int]] | None:
    """``_window_starts`` of the steps' starts read a block at a time, for starts in order: the windows that hold
    any step, and how many steps each holds (their runs, in order). None when the starts are out of order.
    ``blocks``: ``step_blocks`` (a caller's own name for it, which tests cut small). Inside ``step_events_kept``,
    found once a log and edges (the timeline and the memory figure ask for the same)."""
    return _once(("window_runs", edges.tobytes(), blocks), s, lambda: _window_runs(s, edges, blocks))


def _window_runs(s: Mapping[str, np.ndarray], edges: np.ndarray, blocks: Callable
                 ) -> tuple[np.ndarray, list[int]] | None:
    nb = len(edges) - 1
    bounds = np.zeros(nb + 1, dtype=np.int64)
    last, n = -np.inf, 0
    for _, b in blocks(s, ("start",)):
        t = np.asarray(b["start"])
        if not continues_ascending(t, last):
            return None
        last, n = t[-1], n + len(t)
        bounds[1:nb] += np.searchsorted(t, edges[1:nb], side="left")
    bounds[nb] = n
    held = np.flatnonzero(bounds[:-1] < bounds[1:])
    return held, np.diff(np.append(bounds[held], n)).tolist()


def _held(agg: np.ndarray, uniq: np.ndarray, nb: int) -> np.ndarray:
    """``nb`` windows' values: ``agg`` in the windows ``uniq``, each other window holding the one before's."""
    out = np.full(nb, np.nan)
    out[uniq] = agg
    idx = np.where(np.isnan(out), 0, np.arange(nb))
    np.maximum.accumulate(idx, out=idx)
    return out[idx]


def _window_starts(t: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The windows that hold any t (t before the first edge in the first window, past the last in the last) and
    where each one's run of t begins: ``np.unique`` of each t's window, with its first index."""
    nb = len(edges) - 1
    if len(t) > 1 and not bool(np.all(t[1:] >= t[:-1])):  # out of order (or NaN): each t's window, then unique
        return np.unique(np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nb - 1), return_index=True)
    # in order: window k (0 < k < nb) begins at the first t >= edges[k]. The few edges are searched in t instead
    # of each t in the edges, and no unique over a window per t (a long run's steps: 0.9 of its 14 s writing)
    bounds = np.empty(nb + 1, dtype=np.intp)
    bounds[0], bounds[nb] = 0, len(t)
    bounds[1:nb] = np.searchsorted(t, edges[1:nb], side="left")
    held = np.flatnonzero(bounds[:-1] < bounds[1:])
    return held, bounds[held]


def _windowed(edges: np.ndarray, y: np.ndarray) -> dict:
    """Trace arguments for per-window values: implicit x (x0, dx), float32 y, drawn as steps."""
    return dict(x0=float(edges[0]), dx=float(edges[1] - edges[0]), y=np.asarray(y, dtype=np.float32), line_shape="hv")


def _state_trace(t: np.ndarray, v: np.ndarray, edges: np.ndarray, how: str, max_points: int,
                 end: float = np.inf) -> dict:
    """A state series: the raw points when there are few, else one value per window (none from ``end`` on)."""
    if len(t) <= max_points:
        return dict(x=np.asarray(t, dtype=np.float64), y=np.asarray(v, dtype=np.float32), line_shape="hv")
    return _windowed(edges, held_until(edges, state_per_window(t, v, edges, how), end))


def held_until(edges: np.ndarray, y: np.ndarray, end: float) -> np.ndarray:
    """``y`` per window with no value in the windows that start at or after ``end``, the run's own end on an
    axis shared with a longer run: a state held past a run's last step drew requests running after the last one
    had finished (the raw points end at the last step too)."""
    late = np.asarray(edges[:-1]) >= end
    if not late.any():
        return y
    y = np.array(y, dtype=np.float64)
    y[late] = np.nan
    return y


def _count_trace(times: np.ndarray, weights: np.ndarray, edges: np.ndarray, max_points: int) -> dict:
    """A cumulative count of events: exact steps when few, else its value at each window's end."""
    order = np.argsort(times, kind="stable")
    times = np.asarray(times, dtype=np.float64)[order]
    cum = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    if len(times) <= max_points:
        x = np.concatenate(([0.0], times, [edges[-1]]))
        y = np.concatenate(([0.0], cum, [cum[-1] if len(cum) else 0.0]))
        return dict(x=x, y=y.astype(np.float32), line_shape="hv")
    at_end = np.concatenate(([0.0], cum))[np.searchsorted(times, edges[1:], side="right")]
    return dict(x0=float(edges[1]), dx=float(edges[1] - edges[0]), y=at_end.astype(np.float32), line_shape="hv")


def ecdf_points(values: np.ndarray, max_points: int = MAX_POINTS) -> dict:
    """Trace arguments for an empirical CDF: x = values (float32: plenty for a picture), y implicit (y0, dy).
    Every value when there are at most max_points; else the quantiles at max_points evenly spaced
    probabilities from 0 to 1."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = len(v)
    if n <= max_points:
        return dict(x=v.astype(np.float32), y0=1.0 / max(n, 1), dy=1.0 / max(n, 1), line_shape="hv")
    p = np.linspace(0.0, 1.0, max_points)
    return dict(x=np.quantile(v, p).astype(np.float32), y0=0.0, dy=1.0 / (max_points - 1))


def trace_points(fig: go.Figure) -> int:
    """The most points any trace of the figure holds (for tests of the downsampling)."""
    most = 0
    for tr in fig.data:
        for attr in ("x", "y"):
            v = getattr(tr, attr, None)
            if v is not None:
                most = max(most, len(v))
    return most


def _sorted_steps(result: RunResult) -> Mapping[str, np.ndarray]:
    s = result.steps
    if isinstance(s, StepColumns) and _starts_in_order(s):  # a log's own: checked a block at a time
        return s
    start = np.asarray(s["start"])
    if start.size < 2 or bool(np.all(start[1:] >= start[:-1])):
        # already in order (one replica's log; a cluster's merged log): the stable sort is the identity, and the
        # steps stay as they are (a long run's columns are read lazily, not copied all at once)
        return s
    order = np.argsort(start, kind="stable")
    return {k: np.asarray(v)[order] for k, v in s.items()}


def _starts_in_order(s: StepColumns) -> bool:
    return bool(_once("starts_in_order", s, lambda: _read_starts_in_order(s)))


def _read_starts_in_order(s: StepColumns) -> bool:
    last = -np.inf
    for _, b in step_blocks(s, ("start",)):
        t = np.asarray(b["start"])
        if not continues_ascending(t, last):
            return False
        last = t[-1]
    return True


def _kv_capacity(s: Mapping[str, np.ndarray], result: RunResult) -> np.ndarray:
    cap = s["kv_capacity_blocks"].astype(np.float64)
    return np.where(cap > 0, cap, float(result.kv_capacity_blocks))


def plotly_safe(fig: go.Figure, names: Iterable[str]) -> go.Figure:
    """``fig`` with each of ``names`` (variant names) written with entities in its titles and legend entries:
    plotly.js reads <b>, <i>, <br>... there as markup, so a variant named "tp<b>2</b>" showed as a bold "tp2".
    Only the names are escaped; the figures' own markup (a <br> in a title) stays."""
    swaps = [(n, html.escape(n, quote=False)) for n in names if any(c in n for c in "<>&")]
    if not swaps:
        return fig

    def safe(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for raw, esc in swaps:
            text = text.replace(raw, esc)
        return text

    for tr in fig.data:
        if getattr(tr, "name", None):
            tr.name = safe(tr.name)
    if fig.layout.title.text:
        fig.layout.title.text = safe(fig.layout.title.text)
    for a in fig.layout.annotations:
        a.text = safe(a.text)
    return fig

