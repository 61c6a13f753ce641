"""The simulator's decode fast path: a whole stretch of decode-group steps taken at once.

When nothing can change the policy's answer (no arrival, no finish, no block shortage, no deadline; see
``sim.policies.base``), the core repeats the last group-only plan without asking (``ServingCore.plan_without_policy``).
``fast_forward`` goes further: it prices a run of such steps together (``CostModel.decode_steps`` or one vectorised
``step_time`` call) and applies them in one tight loop that records exactly what ``ServingCore.schedule`` and
``ServingCore.complete`` would, step by step; the tests compare the two byte for byte.

It lives apart from the core because it is an optimisation of it, not a part of the serving logic: the core is
correct without it (the real engine never calls it), and a reader of the core need not read it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain
from typing import TYPE_CHECKING

import numpy as np

from sim.costs.costmodel import CostModel, StepShape, optional_member
from sim.engines.sched import graph_padding
from sim.metrics.records import FLOAT_PACKERS, INT_PACKERS, PACK_STRETCH
from sim.policies.base import Plan
from sim.serving.decode_group import DecodeGroup

if TYPE_CHECKING:
    from sim.serving.core import ServingCore

STEADY_PLAN = Plan(decode_group=True)  # what a group-aware policy plans when nothing waits and all decode
MAX_SEGMENT = 4096  # fast-forward at most this many steps at once (bounds the arrays it builds)
SCALAR_BELOW = 128  # price segments this short with scalar cost-model calls (numpy's fixed cost is some 30 us)
BULK_STEPS = 5  # apply stretches (steps between finishes) this long in bulk, shorter ones step by step


Segment = tuple[int, Sequence[int], Sequence[int]]  # a run of steps with the same members (``predict``)


def predict(g: DecodeGroup, k: int) -> list[Segment]:
    """The decode group's next ``k`` steps as runs with the same members (members leave after the step that
    samples their last token): each run's rows (padding aside), attended tokens and longest row
    (``StepShape.max_decode_len``) of each of its steps, which grow evenly within a run (ranges)."""
    j0 = g.steps
    end = j0 + k
    finish_at = g.finish_at
    segments: list[Segment] = []
    size, ctx = len(g.members), g.ctx
    offsets = g.offsets.copy()  # the members left, as ``DecodeGroup.offsets``
    pos = j0
    for f in sorted(f for f in finish_at if f < end) + [end]:
        n = f - pos  # steps pos+1 .. f, all with the current members
        if n:
            if offsets:
                top = offsets[-1] + pos + 1
                segments.append((size, range(ctx + size, ctx + size * (n + 1), size), range(top, top + n)))
            else:
                segments.append((size, [ctx] * n, [0] * n))
        ctx += size * n
        pos = f
        leaving = finish_at.get(f) if f < end else None
        if leaving:
            size -= len(leaving)
            for r in leaving:
                off = r.num_computed_tokens - r.group_base
                ctx -= off + f
                offsets.remove(off)
    return segments


def _price(cost: CostModel, rows_l: list[int], read_l: Sequence[int], max_l: Sequence[int],
           pad: int | list[int]) -> tuple[list[float], list[float]]:
    """Durations and FLOPs of the predicted steps, bit-identical to pricing each step's shape on its own.
    ``pad``: padding rows of every step, or of each (CUDA-graph padding)."""
    k = len(rows_l)
    if pad == 0 and k <= SCALAR_BELOW:
        # numpy's per-call overhead outweighs a short loop
        decode_steps = optional_member(cost, "decode_steps")
        return decode_steps(rows_l, read_l, max_l)
    pads = pad if isinstance(pad, list) else [pad] * k
    if k <= SCALAR_BELOW:
        shapes = [StepShape(n, n, n, c, c, p, 0, max_decode_len=m)
                  for n, c, m, p in zip(rows_l, read_l, max_l, pads, strict=True)]
        return [float(cost.step_time(sh)) for sh in shapes], [float(cost.step_flops(sh)) for sh in shapes]
    rows_a = np.asarray(rows_l, dtype=np.int64)
    read_a = _int64(read_l)
    shape = StepShape(
        num_seqs=rows_a,
        num_tokens=rows_a,
        num_decode_seqs=rows_a,
        kv_read_tokens=read_a,
        attn_pairs=read_a,
        num_padding_tokens=np.asarray(pads, dtype=np.int64),
        swap_blocks=np.zeros(k, dtype=np.int64),
        max_decode_len=_int64(max_l),
    )
    durations = np.asarray(cost.step_time(shape), dtype=np.float64).tolist()
    flops = np.asarray(cost.step_flops(shape), dtype=np.float64).tolist()
    return durations, flops


def _int64(xs: Sequence[int]) -> np.ndarray:
    """``xs`` as an int64 array (a range without a Python int per element)."""
    if isinstance(xs, range):
        return np.arange(xs.start, xs.stop, xs.step, dtype=np.int64)
    return np.asarray(xs, dtype=np.int64)


def fast_forward(
    core: ServingCore, now: float, horizon: float, cost: CostModel, *, finishes: bool = True,
    overshoot: bool = False, overshoot_finish: bool = True,
) -> tuple[list[float], float] | None:
    """Take several group-only steps of ``core`` at once: price them together, then apply them in one loop that
    records exactly what ``schedule``/``complete`` would (the tests compare the two). Stops before any step that
    would end at or after ``horizon`` (the next event from outside, such as an arrival) or when the policy must
    be asked again; ``finishes=False`` also stops before a step in which a request completes (when a completion
    can start an outside event, such as a closed-loop user's next request).

    ``overshoot=True`` also takes the step during which the horizon falls, when the event there is an arrival:
    an arrival during a step only joins the queue, which nothing in the step reads, so the step can be applied
    before the executor's clock reaches the arrival. The step's row then records the queue length before the
    arrival; the executor corrects it with ``steps.set_last_waiting`` once the clock has caught up (stepping one
    by one records the queue at the step's end). ``overshoot_finish=False`` overshoots only into a step in which
    no member finishes (a cluster's router reads the running set and the free blocks at the arrival, and a finish
    changes both only at the step's end). Returns (step durations, end of the last step), or None when no step
    qualifies."""
    g = core.group
    if g is None or now >= horizon or core.plan_without_policy(now) is None:
        return None
    plan = core.repeatable if core.repeatable is not None else STEADY_PLAN
    if plan.pad_to_longest:
        return None  # a padded batch's shape depends on its longest member; step it one by one
    j0 = g.steps
    # a finish makes the policy look again unless nothing waits (then the steady plan continues)
    keep_going = finishes and (core.steady_ok or core.all_decode) and not core.waiting and not core.swapped
    finish_at = g.finish_at
    next_finish = g.next_finish()  # the next group step in which members sample their last token
    last = j0 + MAX_SEGMENT
    if not keep_going and next_finish >= 0:
        last = min(last, next_finish - 1)
    if core.multi_step > 1 and (core.waiting or core.swapped):  # stop where the multi-step block ends
        last = min(last, j0 + (-core.decode_run) % core.multi_step)
    pad = plan.padded_rows
    priced = g.priced
    if (priced is not None and priced.version == g.version and priced.pad == pad
            and priced.j0 <= j0 < priced.j0 + len(priced.durations)):
        # steps priced by an earlier call with the same members: their shapes are this call's
        o = j0 - priced.j0
        durations, flops, read_l, ends = priced.durations, priced.flops, priced.read, priced.ends
        if ends[o] != now:  # the group got here another way (a step with others in it): new running sums
            ends[o:] = accumulate(durations[o:], initial=now)
        stop = min(last, priced.j0 + len(durations)) - priced.j0  # one past the last step this call may take
    else:
        o = 0
        durations, flops, read_l = _predict_and_price(core, g, cost, now, horizon, last, pad,
                                                      next_finish if keep_going else -1)
        if not durations:
            return None
        ends = list(accumulate(durations, initial=now))  # step i runs from ends[i] to ends[i + 1]
        if g.lookahead:
            g.priced = Priced(g.version, pad, j0, read_l, durations, flops, ends)
        stop = len(durations)
    # The loop below is ``_apply`` + ``complete`` for a group-only, unpadded plan, written out because it is the
    # simulator's innermost loop; the tests check that it records exactly what they would. Nothing from outside
    # can happen inside it, so only the horizon, the deadline, finishes and block shortages end it, and the first
    # two are known in advance from the steps' ends (running sums of the durations, added in order as stepping
    # one by one adds them): no step may start at or after the deadline, nor end at or after the horizon, except
    # (overshooting) the one the horizon falls in. The steps between two finishes form one run in the step log,
    # which keeps per step only what changes from one to the next (see ``StepLog``), the members' inter-token
    # gaps included. Indices into the priced lists: this call's first step is ``o``.
    deadline = core.policy_deadline if core.policy_deadline is not None else float("inf")
    over = bisect_left(ends, horizon, o) - 1  # the step in which the horizon falls (past ``stop`` if none)
    if overshoot and not overshoot_finish and j0 + over - o + 1 in finish_at:
        overshoot = False
    n = min(stop, bisect_left(ends, deadline, o), over + 1 if overshoot else over)
    kv = core.kv
    grows = g.grows
    buckets = g.buckets
    bs = len(buckets)
    members = g.members
    log = core.steps
    log.compact()
    log_ends, log_flops, log_need, log_stretches = log.ends, log.flops, log.need, log.stretches
    m = len(members)
    used = kv.num_used_blocks
    filled = core.filled_blocks
    kv_tokens = core.kv_tokens
    steps = j0
    run = o  # the first step of the current run
    i = o
    while i < n:
        # The steps up to the next finish (or ``n``) have the same members, so the same buckets: step ``t`` of
        # them takes a block for each member of ``buckets[(steps + t) % bs]``. Their values are computed for the
        # whole stretch at once (a loop per stretch, not per step): the blocks in one ``try_grow`` call (one call
        # with the crossings back to back hands out the blocks a call per step would, in the same order), up to
        # the first step for which the free blocks run out; the step log keeps them so (``StepLog.stretches``).
        k = min(n, i + next_finish - steps) - i if next_finish > steps else n - i
        shortage = False
        if k < BULK_STEPS:  # a short stretch costs less step by step
            need: list[int] = []
            c = 0
            for t in range(k):
                crossing = buckets[(steps + t) % bs]
                nb = len(crossing)
                if nb and grows and not kv.try_grow(crossing):
                    k, shortage = t, True  # a block shortage: the policy decides whom to preempt
                    break
                c += nb
                need.append(c)
        else:
            b0 = steps % bs
            if b0 + k <= bs:  # the buckets in the stretch's order
                cross = buckets[b0 : b0 + k]
            else:
                cross = buckets[b0:] + buckets[:b0]
                cross = (cross * (k // bs + 1))[:k] if k > bs else cross[:k]
            need = list(accumulate(map(len, cross)))  # blocks taken by the end of each step
            if grows:
                if need[-1] > kv.num_free_blocks:  # a block shortage: the policy decides whom to preempt
                    k = bisect_right(need, kv.num_free_blocks)
                    shortage = True
                    del cross[k:], need[k:]
                if k and need[-1]:
                    kv.try_grow(list(chain.from_iterable(cross)))
        if k:
            # used and filled blocks grow together with paged KV (the reserved blocks stay as they are); a
            # reservation (contiguous KV) fills the blocks it holds
            pack = FLOAT_PACKERS[k]
            log_ends.frombytes(pack(*ends[i + 1 : i + k + 1]))
            log_flops.frombytes(pack(*flops[i : i + k]))
            log_need.frombytes(INT_PACKERS[k](*need))
            log_stretches.frombytes(PACK_STRETCH(k, used, filled, kv_tokens, m, grows))
            if grows:
                used += need[-1]
            filled += need[-1]
            kv_tokens += m * k
        steps += k
        i += k
        if shortage:
            break
        if steps == next_finish:
            _end_run(core, g, run, i, ends, read_l)
            run = i
            core.filled_blocks, core.kv_tokens = filled, kv_tokens
            core.repeatable = None
            if core.waiting or core.swapped:  # as ServingCore.complete: a finish matters when someone waits
                core.all_decode = False
            for r in finish_at.pop(steps):
                core.retire(r, ends[i])
            m = len(members)
            used = kv.num_used_blocks
            filled, kv_tokens = core.filled_blocks, core.kv_tokens
            next_finish = g.next_finish()
            if i - 1 == over or not keep_going or not m:
                break
    end = o + steps - j0  # one past the last step taken
    if end > run:
        _end_run(core, g, run, end, ends, read_l)
    core.filled_blocks, core.kv_tokens = filled, kv_tokens
    if end == o:
        return None
    core.overshot = end > over
    core.decode_run += end - o
    core.busy_time += ends[end] - now
    core.last_end = ends[end]
    core.flops_done += sum(flops[o:end])
    return durations[o:end], ends[end]


class Priced:
    """Steps of a decode group priced ahead (``DecodeGroup.priced``): step ``i`` of the lists is group step
    ``j0 + i + 1``, running from ``ends[i]`` to ``ends[i + 1]``."""

    __slots__ = ("version", "pad", "j0", "read", "durations", "flops", "ends")

    def __init__(self, version: int, pad: int, j0: int, read: Sequence[int], durations: list[float],
                 flops: list[float], ends: list[float]) -> None:
        self.version, self.pad, self.j0, self.read = version, pad, j0, read
        self.durations, self.flops, self.ends = durations, flops, ends


def _predict_and_price(core: ServingCore, g: DecodeGroup, cost: CostModel, now: float, horizon: float, last: int,
                       pad: int, next_finish: int) -> tuple[list[float], list[float], Sequence[int]]:
    """Durations, FLOPs and attended tokens of the group's next steps, up to group step ``last`` and about as many
    as fit before ``horizon`` (plus ``g.lookahead``, up to ``next_finish`` when that is not -1, when the group keeps
    what it priced)."""
    j0 = g.steps
    if horizon != float("inf"):
        # how many steps fit before the horizon, from the first step's time. Later steps attend to more tokens,
        # so they are no shorter unless members leave; a small margin covers that (a guess that falls short
        # leaves the rest for the next call; one too long prices steps never taken).
        if horizon == now:  # (``timeline``'s call) none fits: the formula below gives 2 whatever the first costs
            fit = 2
        else:
            size = len(g.members)
            rows, read = size + pad, g.ctx + size
            gp = graph_padding(core.graph_sizes, rows) if core.graph_sizes else 0
            rows += gp
            if not pad and not gp:
                first = optional_member(cost, "decode_step_time")(rows, read)
            else:
                first = float(cost.step_time(StepShape(rows, rows, rows, read, read, pad + gp, 0)))
            fit = int((horizon - now) / max(first, 1e-9) * 1.02) + 2
        if g.lookahead:
            # priced steps are kept until the members change, which the next finish does
            fit += g.lookahead
            if next_finish >= 0:
                last = min(last, next_finish)
        last = min(last, j0 + fit)
    elif g.finish_at:
        # no event ahead (the arrivals are over): the steps up to the last member's finish, not MAX_SEGMENT of
        # them, since the group is empty after it (256 replicas each priced 4,096 steps as the run drained)
        last = min(last, max(g.finish_at))
    k = last - j0
    if k < 1:
        return [], [], []
    # predict each step's rows and attended tokens (members leave after their finishing step)
    size, ctx = len(g.members), g.ctx
    if not g.finish_at or g.next_finish() >= j0 + k:  # nobody leaves before the last step: constant rows
        # attended and longest tokens grow evenly: ranges, which the cost model may price without a list
        top = g.max_computed() + 1
        segments: list[Segment] = [(size, range(ctx + size, ctx + size * (k + 1), size), range(top, top + k))
                                   if size else (size, [ctx] * k, [0] * k)]
    else:
        segments = predict(g, k)
    # CUDA-graph padding: each run's rows up to the next captured size
    sizes = core.graph_sizes
    gpads = [graph_padding(sizes, n + pad) for n, _, _ in segments] if sizes else [0] * len(segments)
    read_l = segments[0][1] if len(segments) == 1 else list(chain.from_iterable(s[1] for s in segments))
    if k > SCALAR_BELOW:  # one numpy call over the steps end to end
        rows_l: list[int] = []
        pads: list[int] = []
        max_l: list[int] = []
        for (n, reads, longest), gp in zip(segments, gpads, strict=True):
            rows_l += [n + pad + gp] * len(reads)
            pads += [pad + gp] * len(reads)
            max_l += longest
        durations, flops = _price(cost, rows_l, read_l, max_l, pads)
        return durations, flops, read_l
    # a run at a time: its rows the same, its attended tokens a range, which the cost model prices fastest
    durations, flops = [], []
    for (n, reads, longest), gp in zip(segments, gpads, strict=True):
        t, f = _price(cost, [n + pad + gp] * len(reads), reads, longest, pad + gp)
        if len(segments) == 1:
            return t, f, read_l
        durations += t
        flops += f
    return durations, flops, read_l


def _end_run(core: ServingCore, g: DecodeGroup, first: int, stop: int, ends: list[float],
             read_l: Sequence[int]) -> None:
    """Account steps ``first`` to ``stop - 1`` of a ``fast_forward`` segment, all with the same members, in the
    decode group and the step log (their per-step values are in the log already)."""
    m = len(g.members)
    n = stop - first
    if g.ctx + m != read_l[first] or g.ctx + m * n != read_l[stop - 1]:
        raise AssertionError("fast_forward predicted a different step shape")
    g.steps += n
    g.ctx += m * n
    g.prev_end = ends[stop]
    if g.ends is not None:  # token timestamps
        g.ends += ends[first + 1 : stop + 1]
    if core.plans is not None:
        core.plans += [tuple(sorted((i, 1) for i in g.members))] * n
    core.steps.end_decode_run(
        n, ends[first], m, core.kv.num_blocks, len(core.running), len(core.waiting), len(core.swapped),
        graph_padding(core.graph_sizes, m) if core.graph_sizes else 0,
    )


class Timeline:
    """What a replica in a steady decode stretch will look like over its next steps, without taking them: step
    ``k`` (``o <= k < o + n``) runs from ``ends[k]`` to ``ends[k + 1]`` with ``used[k - o]`` KV blocks in use
    once it has taken its blocks. Its last step is the first in which members finish, or the last before a
    block shortage, the policy's deadline or the end of what was priced."""

    __slots__ = ("ends", "o", "n", "used", "expiry")

    def __init__(self, ends: list[float], o: int, used: list[int]) -> None:
        self.ends, self.o, self.n, self.used = ends, o, len(used), used
        self.expiry = ends[o + len(used)]

    def used_at(self, t: float, now_used: int) -> int:
        """KV blocks in use at time ``t`` as a router reads them (a step in flight has taken its blocks);
        ``now_used`` before the first step."""
        k = bisect_left(self.ends, t, self.o, self.o + self.n + 1) - 1
        return now_used if k < self.o else self.used[k - self.o]


def timeline(core: ServingCore, now: float, cost: CostModel) -> Timeline | None:
    """The core's next steps as a ``Timeline``, when it is in a steady decode stretch (only the decode group
    runs, nothing waits or is swapped, no padding); None otherwise. Prices through the group's ``priced`` cache,
    so the ``fast_forward`` that takes the steps later reuses the prices."""
    g = core.group
    if g is None or not g.members or core.waiting or core.swapped or not core.steady_ok:
        return None
    if core.plan_without_policy(now) is None:
        return None
    plan = core.repeatable if core.repeatable is not None else STEADY_PLAN
    if plan.pad_to_longest or plan.padded_rows:
        return None
    j0 = g.steps
    next_finish = g.next_finish()
    priced = g.priced
    if (priced is not None and priced.version == g.version and priced.pad == 0
            and priced.j0 <= j0 < priced.j0 + len(priced.durations)):
        o = j0 - priced.j0
        ends = priced.ends
        if ends[o] != now:
            ends[o:] = accumulate(priced.durations[o:], initial=now)
        stop = len(priced.durations)
    else:
        durations, flops, read_l = _predict_and_price(core, g, cost, now, now, j0 + MAX_SEGMENT, 0, next_finish)
        if not durations:
            return None
        ends = list(accumulate(durations, initial=now))
        g.priced = Priced(g.version, 0, j0, read_l, durations, flops, ends)
        o, stop = 0, len(durations)
    # the steps it may show: up to the policy's deadline (no step starts at or after it), up to the first in
    # which members finish, then up to the first for which the free blocks run out; computed for the stretch at
    # once, as fast_forward's bulk path does (a loop per step: 2% more instructions in a 16-replica run)
    if core.policy_deadline is not None:
        stop = bisect_left(ends, core.policy_deadline, o, stop)
    n = stop - o
    if next_finish > j0:
        n = min(n, next_finish - j0)
    if n <= 0:
        return None
    kv = core.kv
    used = kv.num_used_blocks
    if not g.grows:
        return Timeline(ends, o, [used] * n)
    buckets = g.buckets
    bs = len(buckets)
    b0 = j0 % bs
    sizes = list(map(len, buckets[b0:] + buckets[:b0]))  # blocks taken by the next bs steps, in order
    need = list(accumulate(sizes * (n // bs + 1) if n > bs else sizes, initial=used))
    del need[0], need[n:]
    if not kv.can_grow(need[-1] - used):  # a block shortage: the timeline ends before the step that lacks one
        del need[bisect_right(need, used + kv.num_free_blocks):]
    return Timeline(ends, o, need) if need else None
