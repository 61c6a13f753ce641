"""SLO-aware admission: turn a request away as soon as the queue ahead of it makes its TTFT deadline unreachable.

A ``servesim.QueuePolicy`` (first come first served) with one rule added before each step: a waiting request that
never ran is expected to start after every request kept ahead of it, one every ``1 / service_rate`` seconds; when
that is past its deadline (``RequestView.deadline``: arrival + its class's TTFT SLO, else the scenario's
``slos.ttft``) it is rejected at once, so its client can retry elsewhere and the server spends nothing on an answer
that would come too late. The requests it keeps then meet their SLO. ``service_rate`` is what the server completes
per second at full load (requests/s; read it from an FCFS run's "scheduled ... req/s" in the verdict line).

The hook ``refuse(req, view)`` is asked only of the requests a step reaches, at the moment they could start, so
it can reject a request whose deadline has passed but not one that will miss it; this policy looks at the whole
queue instead, and hands the rest to the queue policy.

Run it: ``servesim run examples/policies/slo_admission.yaml``.
"""

import dataclasses

import servesim


class SLOAdmission(servesim.QueuePolicy):
    # Besides arrivals and finishes, the decision changes with the clock; wake_time() names the next moment it
    # would, so the core still may repeat all-decode steps without asking until then.
    depends_on = frozenset({"arrivals", "finishes"})

    def __init__(self, service_rate: float, **kwargs) -> None:
        super().__init__(**kwargs)  # enable_chunked_prefill, preemption_mode
        if isinstance(service_rate, bool) or not isinstance(service_rate, int | float) or not service_rate > 0:
            raise ValueError(f"service_rate must be requests/s > 0, got {service_rate!r}")
        self.service_rate = float(service_rate)

    def _triage(self, view: servesim.PolicyView) -> tuple[list[servesim.RequestView], list[servesim.RequestView]]:
        """(kept, late): late are waiting requests that would start at or after their deadline."""
        kept: list[servesim.RequestView] = []
        late: list[servesim.RequestView] = []
        for r in view.waiting:
            start = view.now + len(kept) / self.service_rate  # the requests kept ahead of it go first
            (late if r.first_scheduled is None and start >= r.deadline else kept).append(r)
        return kept, late

    def schedule(self, view: servesim.PolicyView) -> servesim.Plan:
        kept, late = self._triage(view)
        plan = super().schedule(dataclasses.replace(view, waiting=tuple(kept)))
        for r in late:
            plan.reject(r, f"TTFT deadline {r.deadline:.2f} s out of reach at t={view.now:.2f} s")
        return plan

    def wake_time(self, view: servesim.PolicyView) -> float | None:
        kept, _ = self._triage(view)
        due = [r.deadline - i / self.service_rate for i, r in enumerate(kept) if r.first_scheduled is None]
        return min((t for t in due if view.now < t < float("inf")), default=None)
