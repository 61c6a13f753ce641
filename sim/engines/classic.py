"""servesim's classic idealised vLLM: ``deployment.engine: classic``, and what a deployment without
``deployment.engine`` runs (chunked prefill off, prefill-first steps, 256 sequences, vLLM's memory rule), so that
scenarios written before engines existed give the same results byte for byte.
"""

from __future__ import annotations

from typing import Any

from sim.engines.base import Engine
from sim.hardware.gpu import GPUSpec

CLASSIC_POLICY = {"max_num_seqs": 256, "enable_chunked_prefill": False, "prefill_mode": "prefill_first"}


def classic_policy(policy: Any) -> Any:
    """A continuous policy config with servesim's classic defaults where it has none, as before engines existed."""
    if getattr(policy, "type", None) != "continuous":
        return policy
    return policy.model_copy(update={k: v for k, v in CLASSIC_POLICY.items() if getattr(policy, k) is None})


class Classic(Engine):
    name = "classic"

    def fill_policy(self, policy: Any, cfg: Any, gpu: GPUSpec, max_model_len: int, kv_tokens: int | None) -> Any:
        return classic_policy(policy)

    def static_reserve_tokens(self, batch_size: int, max_model_len: int, max_input_len: int | None) -> int:
        # batch_size x max_model_len, as before engines sized a static batch for its longest prompt
        return batch_size * max_model_len


ENGINE = Classic()
