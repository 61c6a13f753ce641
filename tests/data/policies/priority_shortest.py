"""A user's own policy for the engine parity test (tests/test_engine_user_policy.py): the lower priority value
first, then the shorter prompt, then arrival and id (a total order). A waiting request of a better rank displaces
running work of a worse one, as vLLM's priority scheduler does, so on a small KV cache the schedule differs from
first come first served in both order and preemptions."""

import servesim


class PriorityShortestPrompt(servesim.QueuePolicy):
    preempt_for_waiting = True

    def __init__(self, displace: bool = True, **kw) -> None:
        super().__init__(**kw)
        if not isinstance(displace, bool):
            raise ValueError(f"displace must be true or false, got {displace!r}")
        self.preempt_for_waiting = displace

    def rank(self, req: servesim.RequestView) -> tuple[int, int, float, int]:
        return (req.priority, req.prompt_len, req.arrival, req.id)
