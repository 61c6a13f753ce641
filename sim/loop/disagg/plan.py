"""Disaggregated candidates for ``servesim plan``: for every replica count r >= 2 of a per-replica
configuration, the splits xPyD with x + y = r (both pools on that configuration: the same GPU, TP degree, dtypes
and policy), at the same GPU count and so the same price as the r colocated replicas.

They pass the same bounds as the colocated candidate they split (memory and the lone-request latency bounds are
per replica; the throughput bound counts the workload's whole GPU time against all r replicas, which no split
can beat), and the search ranks them by the same rules: cheapest first, then precision, then the lower tail
latency relative to the SLOs; among equals the colocated deployment comes first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sim.loop.disagg.config import DisaggConfig, PlanDisaggConfig, PoolConfig


def split_candidates(ev: Any, vcfg: Any, plan_cfg: PlanDisaggConfig) -> list[tuple[Any, Any]]:
    """(Evaluation, VariantConfig or None) for each split of ``ev``'s replicas: a pruned colocated evaluation
    gives pruned splits (its reason holds for them), a surviving one gives variants to simulate."""
    c = ev.candidate
    lo = plan_cfg.min_replicas_per_pool
    out = []
    for x in range(lo, c.replicas - lo + 1):
        cand = dataclasses.replace(c, prefill_replicas=x)
        e = dataclasses.replace(ev, candidate=cand, lower_bounds=dict(ev.lower_bounds))
        if vcfg is None:
            out.append((e, None))
            continue
        d = DisaggConfig(prefill=PoolConfig(replicas=x), decode=PoolConfig(replicas=c.replicas - x),
                         kv_link=plan_cfg.kv_link)
        out.append((e, dataclasses.replace(vcfg, disaggregation=d)))
    return out
