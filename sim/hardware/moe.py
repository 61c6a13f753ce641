"""Mixture-of-experts arithmetic: which expert weights a step reads.

A MoE layer (Mixtral, Qwen3-MoE) replaces the dense MLP with ``E`` experts, each a gated MLP of
``moe_intermediate_size``, and a router (``hidden x E``) that sends every token to ``k`` of them. The parameters
stored are all ``E`` experts; the FLOPs per token are those of ``k`` experts; the expert weights one step reads
depend on how many distinct experts its tokens touch. With uniform, independent routing (the load-balancing loss
these models are trained with drives routing towards it) an expert escapes one token with probability
``1 - k/E`` and all ``T`` tokens of a step with ``(1 - k/E)^T``, so a step reads on average

    E x (1 - (1 - k/E)^T)       experts per layer

(one token: exactly k; many tokens: all E). Real routing is skewed, so this is the upper end of what a step
reads for a given T; it is exact at T = 1 and at large T.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def expected_experts(num_experts: int, experts_per_tok: int, num_tokens: Any) -> Any:
    """Expected distinct experts ``num_tokens`` tokens touch in one layer (an array for an array of counts).
    The same numpy expression serves scalars and arrays, so both round alike."""
    miss = 1.0 - experts_per_tok / num_experts
    return num_experts * (1.0 - np.power(miss, num_tokens))


# config.json fields of the MoE model types ModelSpec reads; anything else MoE is refused by name
MOE_MODEL_TYPES = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts", "deepseek_v2": "n_routed_experts",
                   "deepseek_v3": "n_routed_experts"}
# DeepSeek-V2's layout (multi-head latent attention, shared experts, the first layers dense); V3 and R1 keep it
# (their sigmoid, group-limited routing and multi-token-prediction module change no step's cost here: the MTP
# layer only runs as a draft model, which a scenario configures under speculative)
DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
