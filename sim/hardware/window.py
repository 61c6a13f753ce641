"""Gemma-2's sliding-window layers: what servesim represents of them, and where it refuses.

Gemma-2 (Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size", arXiv 2408.00118, section 2;
Hugging Face ``modeling_gemma2.py``) alternates local and global attention: layers 0, 2, 4, ... attend to the last
``sliding_window`` (4,096) tokens only, the odd layers to the whole context (8,192 at most). A local layer's KV is
therefore bounded by the window: a request of ``n`` tokens caches

    global layers x n + local layers x min(n, sliding_window)        token-layers of KV

and a local layer's attention reads at most the window. servesim's block manager and cost model count every
layer alike, which is exact while the whole context fits in the window (``max_model_len <= sliding_window``): a
longer ``max_model_len`` is refused, naming the field, rather than priced as full attention. vLLM 0.5 did the same
for Gemma-2 (it disabled the window and capped the length at the window's 4,096 tokens) until its attention
backends could run the alternating window.
"""

from __future__ import annotations

from typing import Any


def num_local_layers(m: Any) -> int:
    """Layers attending to the window only: every ``sliding_window_pattern``-th layer is global, counted from 1
    (Gemma-2: pattern 2, so the even layers 0, 2, ... are local)."""
    if not m.sliding_window:
        return 0
    p = m.sliding_window_pattern
    return sum(1 for i in range(m.num_layers) if p == 0 or (i + 1) % p != 0)


def window_kv_elements(m: Any, num_tokens: int, tensor_parallel_size: int = 1) -> int:
    """KV elements a request of ``num_tokens`` tokens caches on one GPU, the local layers' bounded by the window."""
    local = num_local_layers(m)
    per_layer = m.kv_elements_per_token(tensor_parallel_size) // m.num_layers
    held = min(num_tokens, m.sliding_window) if local else num_tokens
    return per_layer * ((m.num_layers - local) * num_tokens + local * held)


def window_refusal(m: Any, max_model_len: int) -> str | None:
    """Why ``max_model_len`` cannot be represented for ``m`` (None: it can)."""
    if m.sliding_window and max_model_len > m.sliding_window:
        return (f"deployment.max_model_len {max_model_len} is past {m.name}'s sliding_window of {m.sliding_window} "
                f"tokens: its {num_local_layers(m)} local layers would hold and read only the window, which servesim "
                f"does not model (it would price full attention there); set max_model_len <= {m.sliding_window}")
    return None
