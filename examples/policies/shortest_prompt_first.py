"""Shortest prompt first, written from scratch on ``servesim.Policy``: the whole scheduling step in one method.

Running requests go first, in admission order (decodes and the rest of chunked prompts); when the KV blocks run
out, the latest admitted request is preempted (recompute: it waits again). Then waiting requests are admitted by
prompt length, shortest first, while the step's slots, tokens and blocks last. Short prompts stop queueing behind
long ones, so the mean time to first token falls where prompts are most of the work.

Run it: ``servesim run examples/policies/shortest_prompt_first.yaml``.
"""

import servesim


class ShortestPromptFirst(servesim.Policy):
    # The plan changes only when a request arrives or finishes (the core asks anyway when blocks run short), so
    # the core may repeat a step where every running request just decodes, without asking.
    depends_on = frozenset({"arrivals", "finishes"})

    def schedule(self, view: servesim.PolicyView) -> servesim.Plan:
        plan = servesim.Plan()
        budget = view.kv.budget()  # a scratch copy of the free KV blocks: reserve what the plan computes
        tokens = view.limits.max_num_batched_tokens
        running = list(view.running)  # in admission order: the last is the latest admitted
        while running and tokens > 0:
            r = running.pop(0)
            n = min(r.num_remaining, tokens)  # a decode is 1 token; a prompt is cut to what the step has left
            fits = budget.allocate(r, n)
            while not fits and running:  # out of blocks: preempt the latest admitted (not planned yet)
                victim = running.pop()
                budget.release(victim)
                plan.preempt(victim)
                fits = budget.allocate(r, n)
            if fits:
                plan.schedule(r, n)
                tokens -= n
            else:  # nobody left to preempt: r itself waits
                budget.release(r)
                plan.preempt(r)
        if plan.preempted:
            return plan  # as vLLM does: no admissions in a step that had to preempt
        free_slots = view.limits.max_num_seqs - len(view.running)
        for r in sorted(view.waiting, key=lambda r: (r.prompt_len, r.arrival, r.id)):
            n = min(r.num_remaining, tokens)
            if free_slots < 1 or n < 1 or not budget.allocate(r, n):
                break
            plan.schedule(r, n)
            tokens -= n
            free_slots -= 1
        return plan
