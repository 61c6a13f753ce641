"""Text on the engine's model: scoring (log-likelihoods, perplexity), greedy generation, and real-text prompts.

Everything here drives the engine's own pieces (``LlamaModel``, ``KVCache``, ``build_metadata``), so a test that
generates through a paged cache exercises the same attention the engine runs. ``make_cache`` builds the cache;
``realengine.quant.QuantKVCache`` has the same constructor and can be passed as ``cache_cls``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from realengine.attention import build_metadata, cdiv
from realengine.kv_cache import KVCache
from realengine.model import LlamaModel


def make_cache(model: LlamaModel, *, num_seqs: int, max_len: int, layout: str = "paged", block_size: int = 16,
               cache_cls: Callable[..., KVCache] = KVCache, **kw) -> KVCache:
    """A cache with room for ``num_seqs`` sequences of ``max_len`` tokens, in either layout."""
    per = cdiv(max_len, block_size)
    if layout == "paged":
        return cache_cls(model.spec, block_size=block_size, dtype=model.dtype, device=model.device,
                         layout="paged", num_blocks=num_seqs * per, **kw)
    return cache_cls(model.spec, block_size=block_size, dtype=model.dtype, device=model.device,
                     layout="contiguous", max_num_seqs=num_seqs, max_model_len=per * block_size, **kw)


def _block_tables(num_seqs: int, per: int, seed: int) -> list[list[int]]:
    """Each sequence's blocks drawn from a seeded shuffle of all of them: tables that are neither contiguous nor
    in order, so that a paging mistake cannot hide."""
    order = np.random.default_rng(seed).permutation(num_seqs * per).tolist()
    return [order[i * per : (i + 1) * per] for i in range(num_seqs)]


@torch.inference_mode()
def sequence_logits(model: LlamaModel, ids: Sequence[int], *, chunk: int | None = None, layout: str = "paged",
                    block_size: int = 16, cache_cls: Callable[..., KVCache] = KVCache, seed: int = 0) -> Tensor:
    """Logits ``[len(ids), vocab]`` (float32) at every position of one sequence.

    ``chunk=None``: one forward without a cache (every token attends to the fresh K/V). ``chunk=n``: chunked
    prefill of ``n`` tokens a step through a cache (each chunk reads the earlier ones back from the cache), which
    is how a quantized KV cache's rounding reaches the scores."""
    n = len(ids)
    x = torch.tensor(list(ids), dtype=torch.long, device=model.device)
    if chunk is None:
        meta = build_metadata([0], [n], device=model.device, block_size=block_size)
        meta.logits_indices = torch.arange(n, device=model.device)
        return model(x, meta.positions, meta, None).float()
    cache = make_cache(model, num_seqs=1, max_len=n, layout=layout, block_size=block_size, cache_cls=cache_cls)
    table = _block_tables(1, cdiv(n, block_size), seed)[0]
    out = []
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        if layout == "paged":
            meta = build_metadata([a], [b - a], device=model.device, block_size=block_size, block_tables=[table])
        else:
            meta = build_metadata([a], [b - a], device=model.device, block_size=block_size, seq_slots=[0],
                                  row_len=cache.row_len)
        meta.logits_indices = torch.arange(b - a, device=model.device)
        out.append(model(x[a:b], meta.positions, meta, cache).float())
    return torch.cat(out)


def token_nll(logits: Tensor, ids: Sequence[int]) -> Tensor:
    """Negative log-likelihood (nats) of each next token: ``[len(ids) - 1]`` from ``[len(ids), vocab]`` logits."""
    target = torch.tensor(list(ids[1:]), dtype=torch.long, device=logits.device)
    return torch.nn.functional.cross_entropy(logits[:-1].float(), target, reduction="none")


def perplexity(model: LlamaModel, ids: Sequence[int], **kw) -> float:
    """exp(mean next-token NLL) of a token sequence under the model (see ``sequence_logits`` for ``kw``)."""
    return math.exp(float(token_nll(sequence_logits(model, ids, **kw), ids).mean()))


@dataclass(slots=True)
class Generation:
    """Greedy outputs of a batch of prompts, with the logits of every step for comparisons."""

    tokens: list[list[int]]  # generated token ids per prompt (stopping at and including eos, when given)
    step_logits: list[Tensor]  # [live sequences, vocab] per step: prefill's last rows, then each decode step
    step_rows: list[list[int]]  # which prompts the rows of each step's logits belong to


@torch.inference_mode()
def greedy_generate(
    model: LlamaModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    layout: str = "paged",
    block_size: int = 16,
    eos_token_id: int | None = None,
    cache_cls: Callable[..., KVCache] = KVCache,
    seed: int = 0,
    on_token: Callable[[int, int], None] | None = None,
) -> Generation:
    """Greedy decoding of all prompts as one batch, the way the engine steps: one prefill step of every prompt
    (varlen), then one decode step per token for every sequence still going, through a cache of the given
    layout (paged: shuffled block tables). ``on_token(prompt index, token)`` is called as each token arrives."""
    b = len(prompts)
    max_len = max(len(p) for p in prompts) + max_new_tokens
    cache = make_cache(model, num_seqs=b, max_len=max_len, layout=layout, block_size=block_size,
                       cache_cls=cache_cls)
    tables = _block_tables(b, cdiv(max_len, block_size), seed)
    seqs = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in range(b)]
    gen = Generation(out, [], [])
    live = list(range(b))
    ctx = [0] * b
    dev = model.device
    while live and max_new_tokens > 0:
        qlens = [len(seqs[i]) - ctx[i] for i in live]
        ids = [t for i in live for t in seqs[i][ctx[i] :]]
        if layout == "paged":
            meta = build_metadata([ctx[i] for i in live], qlens, device=dev, block_size=block_size,
                                  block_tables=[tables[i] for i in live])
        else:
            meta = build_metadata([ctx[i] for i in live], qlens, device=dev, block_size=block_size,
                                  seq_slots=live, row_len=cache.row_len)
        logits = model(torch.tensor(ids, dtype=torch.long, device=dev), meta.positions, meta, cache)
        gen.step_logits.append(logits.float())
        gen.step_rows.append(list(live))
        nxt = logits.argmax(-1).tolist()
        still = []
        for i, t in zip(live, nxt, strict=True):
            ctx[i] = len(seqs[i])
            seqs[i].append(t)
            out[i].append(t)
            if on_token is not None:
                on_token(i, t)
            if len(out[i]) < max_new_tokens and t != eos_token_id:
                still.append(i)
        live = still
    return gen


# ---- real-text prompts for the engine ---------------------------------------------------------------------------

# Questions a request asks (one per request, chosen by its id), and a passage that lengthens a prompt to the
# workload's prompt_len. Written for this project.
QUESTIONS = (
    "What is the capital of France?",
    "Give three tips for staying healthy.",
    "Explain in one paragraph why the sky is blue.",
    "Write a short poem about the sea.",
    "What is a prime number? Give two examples.",
    "How does a bicycle stay upright?",
    "Name three planets of the solar system.",
    "What should I pack for a weekend of hiking?",
)
PASSAGE = (
    "The village sat at the edge of a wide valley, where the river slowed and spread into shallow pools. "
    "Every morning the baker opened his shop before sunrise, and the smell of fresh bread drifted along the "
    "main street. Children walked to the school on the hill, farmers drove their carts to the market, and the "
    "old clock on the town hall struck the hours a little late, as it had done for as long as anyone could "
    "remember. In the summer, visitors came to swim in the river and to walk the paths through the forest. "
    "In the winter, snow closed the pass to the north, and the village was quiet until spring. "
)


def text_prompt_ids(req_id: int, prompt_len: int, tokenizer, *, seed: int = 0) -> list[int]:
    """A chat prompt of exactly ``prompt_len`` tokens: a question (picked by ``req_id`` and ``seed``) after as
    much of ``PASSAGE`` (repeated) as fills the length. Prompts shorter than the chat frame keep its tail (the
    question and the assistant header), so the model is always asked to answer."""
    q = QUESTIONS[(req_id + seed) % len(QUESTIONS)]
    head = tokenizer.encode("<|im_start|>user\n")
    tail = tokenizer.encode(f"\n\n{q}<|im_end|>\n<|im_start|>assistant\n")
    room = prompt_len - len(head) - len(tail)
    if room < 0:
        return (head + tail)[-prompt_len:]
    filler: list[int] = []
    passage = tokenizer.encode(PASSAGE)
    while len(filler) < room:
        filler.extend(passage)
    return head + filler[:room] + tail


__all__ = [
    "PASSAGE",
    "QUESTIONS",
    "Generation",
    "greedy_generate",
    "make_cache",
    "perplexity",
    "sequence_logits",
    "text_prompt_ids",
    "token_nll",
]
