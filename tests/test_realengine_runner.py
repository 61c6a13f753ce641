"""The model runner driven by the serving core (``fast_path=False``) with a trivial clock: one step per second.

Greedy outputs must be the same whatever the schedule: with chunked prefill or whole prompts, with preemption by
recompute or by swap, with the paged or the contiguous layout, with prefix caching, and with static batching's
padding; and they must equal a plain generation that recomputes the whole sequence without a cache. These runs
use float64, where a different batch composition cannot flip a near-tie of the argmax (float32 is checked
against float64 on the logits in test_realengine_model.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from realengine.attention import build_metadata  # noqa: E402
from realengine.kv_cache import KVCache, kv_bytes_per_block, num_blocks_for_memory, profile_num_blocks  # noqa: E402
from realengine.model import LlamaModel  # noqa: E402
from realengine.runner import ModelRunner, prompt_token_ids  # noqa: E402
from sim.hardware.kv_budget import kv_budget  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402
from sim.policies import ContinuousPolicy, Limits, StaticPolicy  # noqa: E402
from sim.serving.block_manager import PagedBlockManager  # noqa: E402
from sim.serving.core import ServingCore  # noqa: E402
from sim.serving.request import Request, RequestSpec  # noqa: E402

torch.set_num_threads(1)

TINY = ModelSpec.from_name("tiny")
MODEL64 = LlamaModel(TINY, seed=0, dtype="float64")

# arrivals 0..3 s; prompt + output up to 25 tokens: every request fits 7 blocks of 4 tokens
SPECS = [
    RequestSpec(id=0, arrival=0.0, prompt_len=13, output_len=7),
    RequestSpec(id=1, arrival=0.0, prompt_len=5, output_len=9),
    RequestSpec(id=2, arrival=1.0, prompt_len=21, output_len=4),
    RequestSpec(id=3, arrival=2.0, prompt_len=9, output_len=8),
    RequestSpec(id=4, arrival=3.0, prompt_len=17, output_len=6),
    RequestSpec(id=5, arrival=3.0, prompt_len=3, output_len=9),
]


def reference_outputs(specs: list[RequestSpec]) -> dict[int, list[int]]:
    """Greedy generation with no cache: every token a full forward over prompt + generated so far."""
    out = {}
    for s in specs:
        toks = prompt_token_ids(s, TINY.vocab_size, seed=0)
        gen: list[int] = []
        for _ in range(s.output_len):
            seq = toks + gen
            meta = build_metadata([0], [len(seq)])
            gen.append(int(MODEL64(torch.tensor(seq), meta.positions, meta).argmax()))
        out[s.id] = gen
    return out


REFERENCE = reference_outputs(SPECS)

# two requests that decode long enough to outgrow the cache: the victim has grown since it was admitted
GROWING = [RequestSpec(id=i, arrival=0.0, prompt_len=5, output_len=20) for i in range(2)]
GROWING_REFERENCE = reference_outputs(GROWING)


def drive(policy, bm: PagedBlockManager, runner: ModelRunner, specs=SPECS):
    """Run every request to the end: arrivals at their (integer) times, one step per second."""
    core = ServingCore(policy, bm, fast_path=False)
    core.on_finish = lambda r: runner.release(r.id)
    pending = sorted(specs, key=lambda s: s.arrival)
    outputs: dict[int, list[int]] = {s.id: [] for s in specs}
    t = 0.0
    for _ in range(1000):
        while pending and pending[0].arrival <= t:
            s = pending.pop(0)
            core.add_request(Request(s, s.arrival), t)
        if not core.has_work and not pending:
            break
        batch = core.schedule(t)
        if batch is not None:
            for rid, tok in runner.execute(batch).items():
                outputs[rid].append(tok)
            core.complete(batch, t + 1.0)
        t += 1.0
    else:
        raise AssertionError("the run did not finish")
    return outputs, core


def make_runner(bm, layout: str = "paged") -> ModelRunner:
    return ModelRunner(TINY, block_manager=bm, dtype="float64", model=MODEL64, kv_layout=layout,
                       max_num_seqs=8, max_model_len=32)


def check_clean(runner: ModelRunner, bm: PagedBlockManager) -> None:
    """Nothing is left behind: no runner state, every block and swap block free, every row free."""
    assert runner.live_requests == set()
    assert bm.num_free_blocks == bm.num_blocks and not bm.tables and not bm.cpu_tables
    assert runner.kv.num_free_cpu_blocks == runner.kv.num_cpu_blocks
    if runner.kv.layout == "contiguous":
        assert runner.kv.num_free_slots == runner.kv.k[0].shape[0]


CHUNKED = dict(limits=Limits(max_num_seqs=4, max_num_batched_tokens=12, max_model_len=32),
               enable_chunked_prefill=True)
WHOLE = dict(limits=Limits(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32), prefill_mode="mixed")


@pytest.mark.parametrize("kind", ["chunked", "mixed", "prefill_first"])
def test_outputs_equal_generation_without_cache(kind: str) -> None:
    if kind == "chunked":
        policy = ContinuousPolicy(**CHUNKED)
    elif kind == "mixed":
        policy = ContinuousPolicy(**WHOLE)
    else:
        policy = ContinuousPolicy(limits=WHOLE["limits"])
    bm = PagedBlockManager(64, 4)
    runner = make_runner(bm)
    outputs, core = drive(policy, bm, runner)
    assert outputs == REFERENCE
    assert core.stats.num_preemptions == 0
    check_clean(runner, bm)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
def test_recompute_preemption_keeps_outputs(layout: str, chunked: bool) -> None:
    policy = ContinuousPolicy(**(CHUNKED if chunked else WHOLE), preemption_mode="recompute")
    bm = PagedBlockManager(9, 4)  # 36 tokens for up to four requests of up to 25: preemption is certain
    runner = make_runner(bm, layout)
    outputs, core = drive(policy, bm, runner)
    assert core.stats.num_preemptions >= 2 and core.stats.num_swaps == 0
    assert outputs == REFERENCE
    check_clean(runner, bm)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
@pytest.mark.parametrize("workload", ["mixed", "growing"])
def test_swap_preemption_keeps_outputs(layout: str, chunked: bool, workload: str) -> None:
    specs, expected = (SPECS, REFERENCE) if workload == "mixed" else (GROWING, GROWING_REFERENCE)
    policy = ContinuousPolicy(**(CHUNKED if chunked else WHOLE), preemption_mode="swap")
    bm = PagedBlockManager(9, 4, num_cpu_blocks=32)
    runner = make_runner(bm, layout)
    reused: list[int] = []
    swap_out = runner.kv.swap_out

    def spy(blocks: list[int]):  # were the victim's blocks handed to another request in the same plan?
        others = {b for t in bm.tables.values() for b in t}
        reused.extend(b for b in blocks if b in others)
        return swap_out(blocks)

    runner.kv.swap_out = spy
    outputs, core = drive(policy, bm, runner, specs)
    assert core.stats.num_swaps >= 1
    assert runner.num_blocks_swapped_in == runner.num_blocks_swapped_out > 0
    if layout == "paged" and workload == "mixed":
        assert reused, "no swap-out's blocks were reused before the copy: the ordering is not exercised"
    assert outputs == expected
    check_clean(runner, bm)


def test_prefix_caching_keeps_outputs() -> None:
    # three families of shared prefixes, chunks of 4 tokens named by hash ids (as in the Mooncake trace)
    specs = [
        RequestSpec(id=i, arrival=float(i // 2), prompt_len=14 + i % 3, output_len=5,
                    hash_ids=tuple([100 * (i % 3) + j for j in range(3)] + [1000 + i]), hash_block_size=4)
        for i in range(7)
    ]
    expected = reference_outputs(specs)
    bm = PagedBlockManager(40, 4, enable_prefix_caching=True)
    runner = make_runner(bm)
    outputs, _ = drive(ContinuousPolicy(**CHUNKED), bm, runner, specs)
    assert bm.num_hit_tokens > 0
    assert outputs == expected
    assert runner.live_requests == set() and not bm.tables


def test_static_batching_padding_keeps_outputs() -> None:
    policy = StaticPolicy(batch_size=3, max_wait=0.0, limits=Limits(max_num_seqs=4, max_num_batched_tokens=1 << 20,
                                                                      max_model_len=32))
    bm = PagedBlockManager(64, 4)
    runner = make_runner(bm)
    seen = {"padded_rows": 0, "pad_to_longest": 0}
    execute = runner.execute

    def spy(batch):
        seen["padded_rows"] += batch.plan.padded_rows
        seen["pad_to_longest"] += batch.padding_tokens
        out = execute(batch)
        # the runner computes the padding the core prices (rows for nobody, prompts padded to the longest)
        assert runner.last_num_padding_tokens == batch.padding_tokens
        assert runner.last_num_tokens == batch.prefill_tokens + batch.decode_tokens
        return out

    runner.execute = spy
    outputs, _ = drive(policy, bm, runner)
    assert seen["padded_rows"] > 0 and seen["pad_to_longest"] > 0
    assert outputs == REFERENCE
    check_clean(runner, bm)


def test_static_batching_padded_rows_reach_the_lm_head(monkeypatch) -> None:
    """A finished request's padding row costs what the core prices it at: a whole decode row over the longest
    context, its logits computed and thrown away, as a padded batch computes them. The runner skipped the LM head
    for padding rows and ran them as one-token sequences without context, and on llama-57m a padded decode step
    ran at 0.74-0.88x the profile's prediction, so the simulator's static batches lasted longer than the
    engine's."""
    import realengine.attention as attention

    decode_rows: list[int] = []  # rows of each decode attention call
    paged_decode = attention.paged_decode_attention

    def counting_decode(q, *args):
        decode_rows.append(int(q.shape[0]))
        return paged_decode(q, *args)

    monkeypatch.setattr(attention, "paged_decode_attention", counting_decode)
    policy = StaticPolicy(batch_size=3, max_wait=0.0, limits=Limits(max_num_seqs=4, max_num_batched_tokens=1 << 20,
                                                                      max_model_len=32))
    bm = PagedBlockManager(64, 4)
    runner = make_runner(bm)
    model, execute = runner.model, runner.execute
    logit_rows: list[int] = []
    rows: list[tuple[int, int]] = []  # (rows of the batch, padding rows) per step

    def counting_model(*args):
        logits = model(*args)
        logit_rows.append(int(logits.shape[0]))
        return logits

    def spy(batch):
        rows.append((batch.num_rows, batch.plan.padded_rows))
        decode_rows.clear()
        out = execute(batch)
        if not batch.prefill_tokens:  # a decode step: every row in the decode call (once a layer)
            assert set(decode_rows) == {batch.num_rows}
        return out

    runner.model, runner.execute = counting_model, spy
    outputs, _ = drive(policy, bm, runner)
    assert any(pad for _, pad in rows)
    assert logit_rows == [n for n, _ in rows]  # every row of every step, padding rows included
    assert outputs == REFERENCE  # the padding rows' logits are thrown away


def test_float32_runner_matches_float64_logits() -> None:
    """The float32 engine's sampled tokens agree with float64 on this workload (no near-ties here)."""
    bm = PagedBlockManager(64, 4)
    runner = ModelRunner(TINY, block_manager=bm, dtype="float32", seed=0)
    outputs, _ = drive(ContinuousPolicy(**CHUNKED), bm, runner)
    assert outputs == REFERENCE


def test_runner_refuses_the_fast_path_and_lost_tokens() -> None:
    bm = PagedBlockManager(64, 4)
    runner = make_runner(bm)
    core = ServingCore(ContinuousPolicy(**WHOLE), bm, fast_path=True)
    core.add_request(Request(SPECS[1], 0.0), 0.0)
    t = 0.0
    with pytest.raises(RuntimeError, match="fast_path=False"):
        for _ in range(5):
            batch = core.schedule(t)
            runner.execute(batch)
            core.complete(batch, t + 1)
            t += 1
    bm = PagedBlockManager(64, 4)
    runner = make_runner(bm)
    core = ServingCore(ContinuousPolicy(**WHOLE), bm, fast_path=False)
    core.add_request(Request(SPECS[1], 0.0), 0.0)
    batch = core.schedule(0.0)
    runner.execute(batch)
    core.complete(batch, 1.0)
    runner._tokens[SPECS[1].id].pop()  # the sampled token goes missing
    with pytest.raises(RuntimeError, match="lost"):
        runner.execute(core.schedule(1.0))


# ---- the cache on its own ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_swap_round_trip_is_exact(layout: str) -> None:
    cache = KVCache(TINY, block_size=4, dtype=torch.float32, layout=layout, num_blocks=16, max_num_seqs=4,
                    max_model_len=16, num_cpu_blocks=6)
    g = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    src, dst = [9, 2, 14], [0, 15, 3]
    saved = [(k[src].clone(), v[src].clone()) for k, v in (cache.blocks(i) for i in range(TINY.num_layers))]
    handle = cache.swap_out(src)
    assert len(handle) == 3 and cache.num_free_cpu_blocks == 3
    for i in range(TINY.num_layers):  # the device blocks are reused (overwritten) while the request is out
        k, v = cache.blocks(i)
        k[src], v[src] = torch.randn(3, *k.shape[1:], generator=g), torch.randn(3, *v.shape[1:], generator=g)
    other = cache.swap_out([5, 6])  # a second request swapped out in between
    cache.swap_in(handle, dst)
    for i, (k0, v0) in enumerate(saved):
        k, v = cache.blocks(i)
        assert torch.equal(k[dst], k0) and torch.equal(v[dst], v0)
    assert cache.num_free_cpu_blocks == 4
    with pytest.raises(RuntimeError, match="CPU blocks free"):
        cache.swap_out([0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="device blocks"):
        cache.swap_in(other, [1])
    cache.free_handle(other)
    assert cache.num_free_cpu_blocks == 6


def test_cache_shapes_and_sizes() -> None:
    paged = KVCache(TINY, block_size=16, dtype=torch.bfloat16, num_blocks=10)
    assert paged.k[0].shape == (10, 16, TINY.num_key_value_heads, TINY.head_dim)
    assert paged.nbytes == 10 * paged.bytes_per_block == 10 * 16 * TINY.kv_bytes_per_token("bf16")
    contig = KVCache(TINY, block_size=16, dtype=torch.float32, layout="contiguous", max_num_seqs=3,
                     max_model_len=40)
    assert contig.k[0].shape == (3, 48, TINY.num_key_value_heads, TINY.head_dim)  # rows rounded to whole blocks
    assert contig.num_blocks == 9 and contig.slot_blocks(2, 2) == [6, 7]
    assert [contig.take_slot() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="slots"):
        contig.take_slot()


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b"])
def test_num_blocks_for_memory_sizes_as_the_simulator_does(name: str) -> None:
    spec = ModelSpec.from_name(name)
    reserve = 3 << 30
    budget = kv_budget(spec, "h200", weight_dtype="bf16", block_size=16, activation_reserve_bytes=reserve)
    n = num_blocks_for_memory(spec, torch.bfloat16, 16, 0.9, budget.total_memory, spec.weight_bytes("bf16"),
                              reserve)
    assert n == budget.num_gpu_blocks
    assert kv_bytes_per_block(spec, torch.bfloat16, 16) == budget.kv_bytes_per_block
    with pytest.raises(ValueError, match="not one KV block"):
        num_blocks_for_memory(spec, torch.bfloat16, 16, 0.9, 1 << 30, spec.weight_bytes("bf16"), 0)


def test_profile_num_blocks_on_cpu_needs_an_override() -> None:
    model = LlamaModel(TINY)
    assert profile_num_blocks(model, block_size=16, max_num_batched_tokens=64, max_num_seqs=4,
                              num_blocks_override=7) == 7
    with pytest.raises(ValueError, match="needs CUDA"):
        profile_num_blocks(model, block_size=16, max_num_batched_tokens=64, max_num_seqs=4)


def test_prompt_token_ids() -> None:
    a = RequestSpec(id=1, arrival=0.0, prompt_len=40, output_len=1, hash_ids=(7, 8, 9), hash_block_size=8)
    b = RequestSpec(id=2, arrival=0.0, prompt_len=40, output_len=1, hash_ids=(7, 8, 5), hash_block_size=8)
    ta, tb = prompt_token_ids(a, 256), prompt_token_ids(b, 256)
    assert ta == prompt_token_ids(a, 256) and all(0 <= t < 256 for t in ta)
    assert ta[:16] == tb[:16] and ta[16:] != tb[16:]  # shared chunks give shared tokens, nothing else does
    assert prompt_token_ids(a, 256, seed=1) != ta
    assert len(set(ta)) > 20  # spread over the vocabulary
