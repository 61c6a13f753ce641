"""First come, first served as a user would write it from a file: servesim.QueuePolicy's defaults, nothing more
(benchmarks/bench_user_policy.py times it against the built-in continuous policy)."""

import servesim


class UserFCFS(servesim.QueuePolicy):
    """FCFS with chunked prefill: the queue's own order, the latest admitted preempted first."""
