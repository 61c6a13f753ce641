"""The built-in ``fcfs`` and ``priority`` policies, step by step, against what vLLM's scheduler code does.

Each case is small enough to check by hand: a KV cache of a few 4-token blocks, one step per simulated second, the
fast path off so that every step's plan is seen. The expected traces were worked out from vLLM's source:

- V1 ``vllm/v1/core/sched/scheduler.py`` at 00024d314514900f361ad072af6931e403b7f589 (``Scheduler.schedule``: the
  running loop, its preemption, the waiting loop; ``_preempt_request``);
- V1 ``vllm/v1/core/sched/request_queue.py`` at 0097c7ed191ad98928976a47ae63ab625a5d112f (FCFS deque: prepend is
  ``appendleft``; priority heap ordered by ``Request.__lt__``: priority, arrival_time, request_id);
- V0 ``vllm/core/scheduler.py`` (``_schedule_priority_preemption``), for the one rule servesim takes from V0.

A trace row is (step, [(request id, tokens computed)], [preempted ids], waiting ids after the step). Where servesim
differs on purpose the test says so and docs/policies.md ("How fcfs and priority follow vLLM") explains why.
"""

from __future__ import annotations

from sim.policies import Limits
from sim.policies.priority import PriorityPolicy
from sim.policies.queue import FCFSPolicy, QueuePolicy
from sim.policies.user import UserPolicy
from sim.serving.block_manager import PagedBlockManager
from sim.serving.core import ServingCore
from sim.serving.request import Request, RequestSpec

Row = tuple[int, list[tuple[int, int]], list[int], list[int]]


def _trace(policy: QueuePolicy, specs: list[RequestSpec], blocks: int, steps: int, max_num_seqs: int = 8,
           max_num_batched_tokens: int = 64) -> list[Row]:
    """Step the core once per second (arrivals join before the step that starts at or after them)."""
    core = ServingCore(UserPolicy(policy, Limits(max_num_seqs, max_num_batched_tokens, 4096)),
                       PagedBlockManager(blocks, 4), fast_path=False)
    pending = sorted(specs, key=lambda s: (s.arrival, s.id))
    rows: list[Row] = []
    for k in range(steps):
        while pending and pending[0].arrival <= k:
            s = pending.pop(0)
            assert core.add_request(Request(s, s.arrival), float(k))
        batch = core.schedule(float(k))
        assert batch is not None, f"step {k}: nothing to run"
        rows.append((k, [(r.id, n) for r, n in batch.plan.scheduled], [r.id for r, _ in batch.plan.preempt],
                     [r.id for r in core.waiting]))
        core.complete(batch, k + 1.0)
    return rows


def test_fcfs_preempts_the_latest_admitted_which_recomputes_from_the_front_of_the_queue() -> None:
    """4 blocks. Request 2 waits (no free block) behind 0 and 1. At step 5 request 0 needs a fifth block: V1 pops
    the last of ``running`` (1, itself the request being planned next: ``self.running.pop()``), frees its KV, sets its
    ``num_computed_tokens`` to 0 and ``prepend_request``s it, so it waits AHEAD of 2, which arrived before it was
    preempted. At step 8 it is recomputed whole: prompt 4 + its 4 generated tokens = 8, then 2 fits beside it. At
    step 9 request 2, admitted last, is the victim in its turn (it needs a second block, none is left)."""
    specs = [RequestSpec(0, 0.0, 4, 8), RequestSpec(1, 0.5, 4, 8), RequestSpec(2, 1.5, 4, 2)]
    assert _trace(FCFSPolicy(), specs, blocks=4, steps=10) == [
        (0, [(0, 4)], [], []),
        (1, [(0, 1), (1, 4)], [], []),
        (2, [(0, 1), (1, 1)], [], [2]),  # 2 needs a block, none is free: the waiting loop breaks
        (3, [(0, 1), (1, 1)], [], [2]),
        (4, [(0, 1), (1, 1)], [], [2]),
        (5, [(0, 1)], [1], [1, 2]),  # victim = the latest admitted; back at the FRONT of waiting
        (6, [(0, 1)], [], [1, 2]),  # no admission: 1 needs 2 blocks for its 8 tokens, 1 is free
        (7, [(0, 1)], [], [1, 2]),  # 0 finishes (8 outputs)
        (8, [(1, 8), (2, 4)], [], []),  # recompute from 0 computed tokens: num_tokens = 4 + 4
        (9, [(1, 1)], [2], [2]),
    ]


def test_priority_admits_by_priority_then_arrival_then_id() -> None:
    """One sequence slot. V1's priority heap pops by ``Request.__lt__``: (priority, arrival_time, request_id)."""
    specs = [RequestSpec(0, 0.0, 4, 1, priority=2), RequestSpec(1, 0.0, 4, 1, priority=1),
             RequestSpec(3, 0.0, 4, 1, priority=1), RequestSpec(2, 0.0, 4, 1, priority=1),
             RequestSpec(4, 0.0, 4, 1, priority=0)]
    rows = _trace(PriorityPolicy(), specs, blocks=100, steps=5, max_num_seqs=1)
    assert [sched for _, sched, _, _ in rows] == [[(4, 4)], [(1, 4)], [(2, 4)], [(3, 4)], [(0, 4)]]


def test_priority_victim_is_the_running_request_of_the_largest_priority_even_if_planned_already() -> None:
    """3 blocks. Running [0 (priority 5), 1 (priority 0)] in admission order. At step 2 request 0's token fits its
    block and is planned; request 1 then needs a fourth block. V1 preempts ``max(self.running, key=(priority,
    arrival_time))`` = 0, which was already scheduled this step: it leaves ``scheduled_running_reqs`` and its token
    goes back to the budget (``token_budget += num_scheduled_tokens.pop(...)``), and 1 gets the freed blocks."""
    specs = [RequestSpec(0, 0.0, 6, 4, priority=5), RequestSpec(1, 0.5, 4, 8, priority=0)]
    assert _trace(PriorityPolicy(), specs, blocks=3, steps=4) == [
        (0, [(0, 6)], [], []),
        (1, [(0, 1), (1, 4)], [], []),
        (2, [(1, 1)], [0], [0]),
        (3, [(1, 1)], [], [0]),  # 0 (8 tokens: 2 blocks) waits while 1 holds 2 of the 3 blocks
    ]


def test_priority_victim_itself_lets_the_rest_of_the_running_requests_run() -> None:
    """A deliberate difference (docs/policies.md). 3 blocks, running [0 (priority 5), 1 (priority 0)]. At step 2
    request 0 needs a block and is itself the victim. vLLM V1 then ``break``s out of its running loop: request 1,
    later in ``running``, is not scheduled, and the step computes nothing (1 decodes one step later). servesim goes
    on with the running requests after the victim, so 1 decodes in the freed block in the same step."""
    specs = [RequestSpec(0, 0.0, 3, 8, priority=5), RequestSpec(1, 0.5, 8, 4, priority=0)]
    rows = _trace(PriorityPolicy(), specs, blocks=3, steps=3)
    assert rows[2] == (2, [(1, 1)], [0], [0])  # vLLM V1: (2, [], [0], [0])


def test_priority_arrival_displaces_lower_priority_work_in_the_same_step() -> None:
    """A deliberate difference (docs/policies.md). Two slots, both held by priorities 1 and 2; a priority-0 request
    arrives. vLLM V1 preempts only when KV blocks run out, never for a waiting request: 2 would wait for a slot.
    servesim's ``priority`` takes V0's ``_schedule_priority_preemption`` rule (the lowest-priority running request is
    preempted while the waiting head outranks it and cannot be scheduled), and admits the head in the same step
    (V0 admitted it one step later, after a step of decodes)."""
    specs = [RequestSpec(0, 0.0, 4, 20, priority=1), RequestSpec(1, 0.0, 4, 20, priority=2),
             RequestSpec(2, 1.5, 4, 3, priority=0)]
    rows = _trace(PriorityPolicy(), specs, blocks=100, steps=3, max_num_seqs=2)
    assert rows[2] == (2, [(0, 1), (2, 4)], [1], [1])


def test_chunked_prefill_plans_the_running_requests_first_and_fills_the_budget_with_waiting_chunks() -> None:
    """``max_num_batched_tokens`` 8. V1's running loop takes ``min(num_new_tokens, token_budget)`` for each running
    request (a partial prompt continues), then the waiting loop fills what is left, the waiting request's chunk cut
    to the budget too (``min(num_new_tokens, token_budget)``); with nothing left, nobody is admitted."""
    specs = [RequestSpec(0, 0.0, 20, 2), RequestSpec(1, 0.5, 10, 2)]
    assert _trace(FCFSPolicy(), specs, blocks=100, steps=4, max_num_batched_tokens=8) == [
        (0, [(0, 8)], [], []),
        (1, [(0, 8)], [], [1]),  # the budget is spent on 0's chunk: 1 waits
        (2, [(0, 4), (1, 4)], [], []),
        (3, [(0, 1), (1, 6)], [], []),
    ]


def test_without_chunking_whole_prompts_join_the_decodes_while_they_fit_the_budget() -> None:
    """``enable_chunked_prefill: false``: V1's waiting loop admits a prompt whole beside the running decodes, and
    ``break``s at the first that exceeds the budget left (``num_new_tokens > token_budget``), not cutting it. (V0
    without chunking ran prompts in steps of their own: the ``continuous`` policy's ``prefill_first``.) Budget 8."""
    specs = [RequestSpec(0, 0.0, 4, 3), RequestSpec(1, 0.5, 6, 3), RequestSpec(2, 0.5, 8, 1)]
    assert _trace(FCFSPolicy(enable_chunked_prefill=False), specs, blocks=100, steps=5,
                  max_num_batched_tokens=8) == [
        (0, [(0, 4)], [], []),
        (1, [(0, 1), (1, 6)], [], [2]),  # 2's 8 tokens exceed the 1 left
        (2, [(0, 1), (1, 1)], [], [2]),  # 0 finishes
        (3, [(1, 1)], [], [2]),  # 8 > 7: 2 waits on; 1 finishes
        (4, [(2, 8)], [], []),
    ]


def test_max_num_seqs_holds_back_a_waiting_request_while_tokens_are_left() -> None:
    """V1's waiting loop stops when ``len(self.running) == max_num_seqs`` (``running`` counts every admitted request,
    preempted ones removed), whatever budget is left: two slots, three prompts of 4 tokens, a budget of 64."""
    specs = [RequestSpec(0, 0.0, 4, 2), RequestSpec(1, 0.0, 4, 2), RequestSpec(2, 0.0, 4, 2)]
    assert _trace(FCFSPolicy(), specs, blocks=100, steps=3, max_num_seqs=2) == [
        (0, [(0, 4), (1, 4)], [], [2]),
        (1, [(0, 1), (1, 1)], [], [2]),  # both finish (2 outputs each)
        (2, [(2, 4)], [], []),
    ]


def test_priority_without_displacement_is_vllm_v1s_rule() -> None:
    """``preempt_for_waiting: false`` gives V1's rule exactly: the priority-0 arrival of the case above finds both
    slots held and waits (V1's waiting loop breaks at ``len(self.running) == max_num_seqs``; nothing preempts for a
    waiting request), until request 0 and 1 finish and free a slot; the running requests keep decoding."""
    from sim.policies.configs import PriorityPolicyConfig

    policy = PriorityPolicyConfig.model_validate({"type": "priority", "preempt_for_waiting": False}).make()
    assert policy.preempt_for_waiting is False
    specs = [RequestSpec(0, 0.0, 4, 4, priority=1), RequestSpec(1, 0.0, 4, 5, priority=2),
             RequestSpec(2, 1.5, 4, 3, priority=0)]
    assert _trace(policy, specs, blocks=100, steps=6, max_num_seqs=2) == [
        (0, [(0, 4), (1, 4)], [], []),
        (1, [(0, 1), (1, 1)], [], []),
        (2, [(0, 1), (1, 1)], [], [2]),  # servesim's default (V0's rule): (2, [(0, 1), (2, 4)], [1], [1])
        (3, [(0, 1), (1, 1)], [], [2]),  # 0 finishes (4 outputs)
        (4, [(1, 1), (2, 4)], [], []),  # 1 finishes (5 outputs)
        (5, [(2, 1)], [], []),
    ]
    assert PriorityPolicyConfig.model_validate({"type": "priority"}).make().preempt_for_waiting is True


def test_priority_under_the_vllm_v1_engine_takes_v1s_rule() -> None:
    """Under ``deployment.engine: vllm-v1`` the priority policy kept servesim's default, V0's displacement, so
    classes-priority at 300 requests (KV at most 5.5% used, the 32 slots the limit) preempted 43 batch requests that
    vLLM V1 never preempts: its victim is chosen only when a running request's blocks run out. The engine's rule is
    now the default (an explicit ``preempt_for_waiting`` wins); without an engine, and under vllm-v0, V0's rule as
    before."""
    import servesim

    path = "scenarios/classes-priority.yaml"
    only = {"variants": [{"name": "priority", "policy": {"type": "priority", "max_num_seqs": 32,
                                                         "enable_chunked_prefill": True,
                                                         "max_num_batched_tokens": 2048}}]}

    def preemptions(**policy_keys) -> int:
        run = servesim.run(path, num_requests=300, set={**only, "deployment.engine": "vllm-v1", **{
            f"variants.0.policy.{k}": v for k, v in policy_keys.items()}})
        return run.summary["priority"]["num_preemptions"]

    assert preemptions() == 0
    assert preemptions(preempt_for_waiting=True) > 0
    assert servesim.run(path, num_requests=300, set=only).summary["priority"]["num_preemptions"] > 0
