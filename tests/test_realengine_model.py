"""The real engine's model and attention against independent float64 references, on random non-zero inputs.

The reference forward below is written from the formulas (complex-number rotary embedding, explicit per-head
softmax with a causal mask), not from the engine's code; it reads the weights through their Hugging Face names.
Relative error is ``max |a - b| / max |b|``.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from realengine.attention import attention, build_metadata  # noqa: E402
from realengine.kv_cache import KVCache  # noqa: E402
from realengine.model import LlamaModel, load_safetensors, save_safetensors  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402

torch.set_num_threads(1)

TINY = ModelSpec.from_name("tiny")
# tied head, Qwen2-like q/k/v biases, o and MLP biases, an explicit head_dim, another rope_theta: every option
TINY_VARIANT = dataclasses.replace(TINY, name="tiny-variant", tie_word_embeddings=True, qkv_bias=True,
                                   o_bias=True, mlp_bias=True, head_dim=8, rope_theta=500000.0,
                                   num_attention_heads=6, num_key_value_heads=3)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


# ---- independent float64 reference ---------------------------------------------------------------------------


def ref_forward(spec: ModelSpec, w: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """Logits ``[len(tokens), vocab]`` of a full causal forward, float64, from the formulas."""
    w = {k: v.double() for k, v in w.items()}
    n, d = len(tokens), spec.head_dim
    nh, nkv = spec.num_attention_heads, spec.num_key_value_heads
    half = d // 2
    inv = spec.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
    rot = torch.polar(torch.ones(n, half, dtype=torch.float64), torch.arange(n, dtype=torch.float64)[:, None] * inv)

    def rope(x: torch.Tensor) -> torch.Tensor:  # x [n, heads, d]; pairs (i, i + d/2) as complex numbers
        z = torch.complex(x[..., :half], x[..., half:]) * rot[:, None, :]
        return torch.cat([z.real, z.imag], dim=-1)

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + spec.norm_eps)

    def lin(x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj").view(n, nh, d))
        k = rope(lin(h, p + "self_attn.k_proj").view(n, nkv, d))
        v = lin(h, p + "self_attn.v_proj").view(n, nkv, d)
        heads = []
        for j in range(nh):
            g = j // (nh // nkv)
            s = (q[:, j] @ k[:, g].T) / d**0.5
            s = s.masked_fill(~causal, float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[:, g])
        x = x + lin(torch.cat(heads, dim=-1), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = lin(h, p + "mlp.gate_proj"), lin(h, p + "mlp.up_proj")
        x = x + lin(gate * torch.sigmoid(gate) * up, p + "mlp.down_proj")
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if spec.tie_word_embeddings else w["lm_head.weight"]
    return x @ head.T


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: int, scale: float) -> torch.Tensor:
    """``q [n, H, D]`` at positions ctx.. over ``k, v [ctx + n, H_kv, D]``, float64, explicit softmax."""
    q, k, v = q.double(), k.double(), v.double()
    n, nh = q.shape[:2]
    rep = nh // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q, k) * scale
    allowed = torch.arange(k.shape[0])[None, :] <= ctx + torch.arange(n)[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, dim=-1), v)


# ---- shapes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b"])
def test_parameter_count_matches_the_spec(name: str) -> None:
    spec = ModelSpec.from_name(name)
    m = LlamaModel(spec, dtype="bf16", device="meta")
    assert sum(p.numel() for p in m.parameters()) == spec.num_params
    assert m.weight_bytes() == spec.weight_bytes("bf16")


def test_variant_parameter_count_and_refusals() -> None:
    m = LlamaModel(TINY_VARIANT)
    assert sum(p.numel() for p in m.parameters()) == TINY_VARIANT.num_params
    with pytest.raises(ValueError, match="not Llama-like"):
        LlamaModel(ModelSpec.from_name("opt-13b"), device="meta")
    with pytest.raises(ValueError, match="unknown dtype"):
        LlamaModel(TINY, dtype="fp8")


def test_same_seed_same_weights_across_dtypes() -> None:
    a = LlamaModel(TINY, seed=3)
    b = LlamaModel(TINY, seed=3, dtype="float64")
    c = LlamaModel(TINY, seed=4)
    params = zip(a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True)
    for (na, pa), (_, pb), (_, pc) in params:
        assert torch.equal(pa.double(), pb), na
        assert not torch.equal(pa, pc), na
        assert pa.abs().min() > 0, f"{na} holds a zero"


# ---- full forward against the reference ----------------------------------------------------------------------


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("spec", [TINY, TINY_VARIANT], ids=lambda s: s.name)
def test_full_forward_matches_float64_reference(spec: ModelSpec) -> None:
    toks = _tokens(23, spec.vocab_size, 1)
    ref = ref_forward(spec, LlamaModel(spec, seed=5).hf_state_dict(), toks)
    meta = build_metadata([0], [len(toks)], sample=None)
    meta.logits_indices = torch.arange(len(toks))  # every row, to compare every position
    m32 = LlamaModel(spec, seed=5)
    assert rel_err(m32(torch.tensor(toks), meta.positions, meta), ref) < 1e-5
    m64 = LlamaModel(spec, seed=5, dtype="float64")
    assert rel_err(m64(torch.tensor(toks), meta.positions, meta), ref) < 1e-12


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_runs_close_to_reference(dtype: str) -> None:
    toks = _tokens(17, TINY.vocab_size, 2)
    m = LlamaModel(TINY, seed=5, dtype=dtype)
    ref = ref_forward(TINY, LlamaModel(TINY, seed=5).hf_state_dict(), toks)
    meta = build_metadata([0], [len(toks)])
    out = m(torch.tensor(toks), meta.positions, meta)
    assert out.dtype == m.dtype and torch.isfinite(out).all()
    assert rel_err(out, ref[-1:]) < 5e-2


# ---- attention over the cache --------------------------------------------------------------------------------

H, HKV, D = 4, 2, 16


def _random_tables(lens: list[int], num_blocks: int, bs: int, seed: int) -> list[list[int]]:
    """Disjoint block tables in a shuffled order (so that no sequence's blocks are consecutive by accident)."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    out, at = [], 0
    for n in lens:
        k = -(-n // bs) + 1  # one spare block at the end: tables may be longer than needed
        out.append(perm[at : at + k])
        at += k
    return out


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize(
    "case",
    [
        ([0], [13]),  # prefill
        ([9], [6]),  # chunked prefill: new tokens over a cached context, across block boundaries
        ([15], [1]),  # decode
        ([3, 12, 0, 7, 8], [1, 1, 10, 5, 1]),  # decodes, a prompt, a chunk and a late decode in one step
    ],
    ids=["prefill", "chunked", "decode", "mixed"],
)
def test_attention_matches_float64_reference(layout: str, case: tuple[list[int], list[int]]) -> None:
    ctx, qlens = case
    bs, g = 4, torch.Generator().manual_seed(11)
    lens = [c + n for c, n in zip(ctx, qlens, strict=True)]
    tables = _random_tables(lens, 64, bs, seed=12)
    spec = dataclasses.replace(TINY, num_attention_heads=H, num_key_value_heads=HKV, head_dim=D, num_layers=1)
    cache = KVCache(spec, block_size=bs, dtype=torch.float32, layout=layout, num_blocks=64,
                    max_num_seqs=len(ctx) + 2, max_model_len=32)
    kc, vc = cache.layer(0)
    rows = [len(ctx) + 1 - i for i in range(len(ctx))]  # contiguous: rows out of order
    full_k = [torch.randn(n, HKV, D, generator=g) for n in lens]
    full_v = [torch.randn(n, HKV, D, generator=g) for n in lens]
    qs = [torch.randn(n, H, D, generator=g) for n in qlens]
    for i, c in enumerate(ctx):  # the cached context, written slot by slot from the definition
        for p in range(c):
            if layout == "paged":
                kc[tables[i][p // bs], p % bs], vc[tables[i][p // bs], p % bs] = full_k[i][p], full_v[i][p]
            else:
                kc[rows[i], p], vc[rows[i], p] = full_k[i][p], full_v[i][p]
    if layout == "paged":
        meta = build_metadata(ctx, qlens, block_size=bs, block_tables=tables)
    else:
        meta = build_metadata(ctx, qlens, block_size=bs, seq_slots=rows, row_len=cache.row_len)
    q = torch.cat(qs)
    k = torch.cat([fk[c:] for fk, c in zip(full_k, ctx, strict=True)])
    v = torch.cat([fv[c:] for fv, c in zip(full_v, ctx, strict=True)])
    out = attention(q, k, v, (kc, vc), meta, D**-0.5)
    for i, (c, n) in enumerate(zip(ctx, qlens, strict=True)):
        a = meta.query_start_loc[i]
        ref = ref_attention(qs[i], full_k[i], full_v[i], c, D**-0.5)
        assert rel_err(out[a : a + n], ref) < 1e-5, f"sequence {i}"
        for p in range(c + n):  # the new tokens landed in their slots
            if layout == "paged":
                assert torch.equal(kc[tables[i][p // bs], p % bs], full_k[i][p])
                assert torch.equal(vc[tables[i][p // bs], p % bs], full_v[i][p])
            else:
                assert torch.equal(kc[rows[i], p], full_k[i][p])


# ---- generation through the cache ----------------------------------------------------------------------------


class Seq:
    """A sequence stepped through a cache: its tokens, block table or row, and how many are computed."""

    def __init__(self, tokens: list[int], table: list[int], row: int) -> None:
        self.tokens, self.table, self.row, self.done = tokens, table, row, 0


def step(model: LlamaModel, cache: KVCache, work: list[tuple[Seq, int]]) -> torch.Tensor:
    """Compute ``n`` more tokens of each sequence in one step; logits at each one's last new token."""
    ctx = [s.done for s, _ in work]
    qlens = [n for _, n in work]
    if cache.layout == "paged":
        meta = build_metadata(ctx, qlens, block_size=cache.block_size, block_tables=[s.table for s, _ in work])
    else:
        meta = build_metadata(ctx, qlens, block_size=cache.block_size, seq_slots=[s.row for s, _ in work],
                              row_len=cache.row_len)
    ids = torch.tensor([t for s, n in work for t in s.tokens[s.done : s.done + n]])
    out = model(ids, meta.positions, meta, cache)
    for s, n in work:
        s.done += n
    return out


def _cache(layout: str, dtype=torch.float32, spec: ModelSpec = TINY) -> KVCache:
    return KVCache(spec, block_size=4, dtype=dtype, layout=layout, num_blocks=48, max_num_seqs=4,
                   max_model_len=64)


@pytest.mark.parametrize("spec", [TINY, TINY_VARIANT], ids=lambda s: s.name)
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("chunks", [[20], [5, 3, 8, 4], [1, 19]], ids=["prefill", "chunked", "one-then-rest"])
def test_cached_generation_matches_full_forward(spec: ModelSpec, layout: str, chunks: list[int]) -> None:
    toks = _tokens(30, spec.vocab_size, 7)
    ref = ref_forward(spec, LlamaModel(spec, seed=5).hf_state_dict(), toks)
    model = LlamaModel(spec, seed=5)
    cache = _cache(layout, spec=spec)
    seq = Seq(toks, _random_tables([32], 48, 4, seed=8)[0], row=2)
    for n in chunks:  # the prompt, in pieces
        out = step(model, cache, [(seq, n)])
        assert rel_err(out[0], ref[seq.done - 1]) < 1e-5
    while seq.done < len(toks):  # then one token at a time
        out = step(model, cache, [(seq, 1)])
        assert rel_err(out[0], ref[seq.done - 1]) < 1e-5, f"position {seq.done - 1}"


def _mixed_schedule(model: LlamaModel, cache: KVCache, together: bool) -> list[torch.Tensor]:
    """Three sequences brought to different phases, then one step that decodes one, continues the chunked
    prompt of another and starts a third; run as one batch or one sequence at a time."""
    tables = _random_tables([24, 24, 24], 48, 4, seed=9)
    seqs = [Seq(_tokens(24, TINY.vocab_size, 20 + i), tables[i], row=i) for i in range(3)]
    step(model, cache, [(seqs[0], 11)])
    step(model, cache, [(seqs[1], 6)])
    work = [(seqs[0], 1), (seqs[1], 5), (seqs[2], 9)]
    if together:
        return list(step(model, cache, work))
    return [step(model, cache, [w])[0] for w in work]


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_mixed_batch_equals_separate(layout: str) -> None:
    model = LlamaModel(TINY, seed=5)
    a = _mixed_schedule(model, _cache(layout), together=True)
    b = _mixed_schedule(model, _cache(layout), together=False)
    for x, y in zip(a, b, strict=True):
        assert rel_err(x, y) < 1e-5


def test_contiguous_layout_equals_paged() -> None:
    model = LlamaModel(TINY, seed=5)
    outs = {}
    for layout in ("paged", "contiguous"):
        cache = _cache(layout)
        seq = Seq(_tokens(25, TINY.vocab_size, 3), _random_tables([28], 48, 4, seed=4)[0], row=1)
        res = [step(model, cache, [(seq, 9)])[0]]
        while seq.done < 25:
            res.append(step(model, cache, [(seq, 1)])[0])
        outs[layout] = torch.stack(res)
    assert rel_err(outs["contiguous"], outs["paged"]) < 1e-6


def test_padding_rows_do_not_change_results() -> None:
    model = LlamaModel(TINY, seed=5)
    toks = _tokens(12, TINY.vocab_size, 5)
    plain = build_metadata([0], [12])
    padded = build_metadata([0], [12], pad_lens=[3, 12])
    ids = torch.tensor(toks)
    a = model(ids, plain.positions, plain)
    b = model(torch.cat([ids, torch.zeros(15, dtype=torch.long)]), padded.positions, padded)
    assert b.shape == a.shape and rel_err(b, a) < 1e-6


# ---- weights from a file -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_safetensors_round_trip(tmp_path, dtype: str) -> None:
    src = LlamaModel(TINY_VARIANT, seed=1, dtype=dtype)
    path = tmp_path / "model.safetensors"
    save_safetensors(src.hf_state_dict(), path)
    state = load_safetensors(path)
    assert set(state) == set(src.hf_state_dict())
    assert "model.layers.1.self_attn.k_proj.bias" in state and "lm_head.weight" not in state  # tied
    dst = LlamaModel(TINY_VARIANT, seed=2, dtype=dtype, weights_path=path)
    for (name, a), (_, b) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    missing = dict(state)
    del missing["model.norm.weight"]
    with pytest.raises(KeyError, match="lacks"):
        LlamaModel(TINY_VARIANT).load_hf_state_dict(missing)


def test_a_meta_model_takes_the_checkpoints_tensors_as_its_weights() -> None:
    """The GGUF load (realengine/gguf_model.py) allocated a second copy of every weight (to_empty) and copied the
    dequantized tensors into it, joining q/k/v and gate/up into one more copy first: 0.5 GB and a pass over it for
    SmolLM2. With ``device`` the checkpoint's tensors are the weights: a model built on meta has the source's numbers
    and outputs, and an unfused weight is the very tensor given."""
    src = LlamaModel(TINY_VARIANT, seed=1)
    state = {k: v.clone() for k, v in src.hf_state_dict().items()}
    dst = LlamaModel(TINY_VARIANT, device="meta")
    dst.load_hf_state_dict(state, device="cpu")
    assert dst.device.type == "cpu"
    for (name, a), (_, b) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
        assert b.device.type == "cpu" and torch.equal(a, b), name
    assert dst.layers[0].self_attn.o_proj.weight.data_ptr() == state["model.layers.0.self_attn.o_proj.weight"].data_ptr()
    toks = _tokens(12, TINY_VARIANT.vocab_size, 3)
    meta = build_metadata([0], [12])
    assert torch.equal(dst(torch.tensor(toks), meta.positions, meta), src(torch.tensor(toks), meta.positions, meta))
