"""The decode graph's static buffers, run eagerly on the CPU: the same tokens and the same cache contents as the
engine's ordinary decode path (the capture itself needs CUDA; the GPU script measures it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from realengine.attention import build_metadata
from realengine.cuda_graph import DecodeGraph
from realengine.kv_cache import KVCache
from realengine.model import LlamaModel
from sim.hardware.models import ModelSpec

TINY = ModelSpec.from_name("tiny")
BS = 4


def _prefilled(prompts: list[list[int]], tables: list[list[int]]):
    model = LlamaModel(TINY, seed=3)
    cache = KVCache(TINY, block_size=BS, dtype=torch.float32, num_blocks=40)
    meta = build_metadata([0] * len(prompts), [len(p) for p in prompts], block_size=BS, block_tables=tables)
    ids = torch.tensor([t for p in prompts for t in p])
    first = model(ids, meta.positions, meta, cache).argmax(-1)
    return model, cache, first


def test_eager_graph_buffers_decode_like_the_engine() -> None:
    g = torch.Generator().manual_seed(4)
    lens = [5, 11, 2]
    prompts = [torch.randint(0, TINY.vocab_size, (n,), generator=g).tolist() for n in lens]
    perm = torch.randperm(40, generator=g).tolist()
    tables = [perm[0:6], perm[6:12], perm[12:18]]  # room for 24 tokens each, scattered blocks
    steps = 7
    model_a, cache_a, tok_a = _prefilled(prompts, tables)
    model_b, cache_b, tok_b = _prefilled(prompts, tables)
    assert torch.equal(tok_a, tok_b)
    graph = DecodeGraph(model_b, cache_b, batch_size=3, max_blocks=8)
    assert not graph.capture
    ctx = torch.tensor(lens)
    for _ in range(steps):
        # the engine's path: fresh metadata every step
        meta = build_metadata(ctx.tolist(), [1, 1, 1], block_size=BS, block_tables=tables)
        tok_a = model_a(tok_a, meta.positions, meta, cache_a).argmax(-1)
        width = int((ctx.max() + 1 + BS - 1) // BS)
        tok_b = graph.step(tok_b, ctx, torch.tensor([t[:width] for t in tables])).clone()
        assert torch.equal(tok_a, tok_b)
        ctx += 1
    # equal up to rounding: the graph attends over the full table width (masked), a different reduction length
    for ka, kb in zip(cache_a.k + cache_a.v, cache_b.k + cache_b.v, strict=True):
        assert torch.allclose(ka, kb, rtol=1e-5, atol=1e-6)
    assert cache_a.k[0].abs().sum() > 0  # the comparison is not between two empty caches


def test_graph_refuses_what_it_cannot_replay() -> None:
    model = LlamaModel(TINY, seed=1)
    cache = KVCache(TINY, block_size=BS, dtype=torch.float32, num_blocks=8)
    graph = DecodeGraph(model, cache, batch_size=2, max_blocks=2)
    with pytest.raises(ValueError, match="exactly 2 sequences"):
        graph.step(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="exceed"):
        graph.step(torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                   torch.zeros(2, 3, dtype=torch.long))
    contiguous = KVCache(TINY, block_size=BS, dtype=torch.float32, layout="contiguous", max_num_seqs=2,
                         max_model_len=8)
    with pytest.raises(ValueError, match="paged"):
        DecodeGraph(model, contiguous, batch_size=2, max_blocks=2)
