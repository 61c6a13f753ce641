"""Fair share between tenants: a ``servesim.QueuePolicy`` that changes one rule, the order of the waiting queue.

The tenant that has been served the fewest tokens so far goes first (least attained service per tenant), ties by
arrival and id; the queue policy does the rest as vLLM does (running requests first, chunked prefill, preemption
of the running request with the largest rank, here the latest of the best-served tenant). A tenant that floods the
server then delays mostly itself: a light tenant's requests no longer queue behind the flood.

Run it: ``servesim run examples/policies/fair_share.yaml``.
"""

import servesim


class FairShare(servesim.QueuePolicy):
    # rank() reads the tokens served per tenant, a counter that grows at every step, so the decision may change at
    # any step: the default, "every_step", is the honest declaration (the core asks before every step).
    depends_on = frozenset({"every_step"})

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)  # enable_chunked_prefill, preemption_mode
        self.served: dict[str, int] = {}  # tokens computed so far, per tenant

    def rank(self, req: servesim.RequestView) -> tuple[int, float, int]:
        return (self.served.get(req.tenant, 0), req.arrival, req.id)

    def schedule(self, view: servesim.PolicyView) -> servesim.Plan:
        plan = super().schedule(view)  # ranks with the counts as of the start of the step
        for r, n in plan.scheduled:  # asked every step, so every computed token passes here
            self.served[r.tenant] = self.served.get(r.tenant, 0) + n
        return plan
