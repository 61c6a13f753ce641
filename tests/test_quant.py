"""Quantization on the engine (realengine/quant.py), on the tiny random model: no real weights needed.

- each weight format's rounding is within its grid's bound; int4 packing is exact on values of the grid;
- a quantized copy shares the untouched tensors, leaves the original alone, and matches the float model closely;
- caching the dequantized weights changes nothing but speed;
- the fp8 and int8 KV caches store one byte per element (plus int8's scales), read back within their rounding,
  and swap out and in exactly;
- the simulator's bytes per element are what the engine stores.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from realengine.model import LlamaModel  # noqa: E402
from realengine.quality import QuantConfig, kv_bytes_per_token  # noqa: E402
from realengine.quant import (  # noqa: E402
    FP8_MAX,
    QuantKVCache,
    QuantLinear,
    cache_dequantized,
    kv_cache_class,
    quant_linears,
    quantize_model,
    weight_memory,
)
from realengine.text import greedy_generate, sequence_logits  # noqa: E402
from sim.hardware.dtypes import dtype_bytes  # noqa: E402
from sim.hardware.models import ModelSpec  # noqa: E402

torch.set_num_threads(1)
TINY = ModelSpec.from_name("tiny")


@pytest.fixture(scope="module")
def model():
    return LlamaModel(TINY, seed=3)


def test_int8_and_fp8_rounding_bounds():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=g) * torch.linspace(0.01, 2.0, 32)[:, None]  # rows of different ranges
    q8 = QuantLinear(w, None, "int8")
    err = (q8.dequantize() - w).abs()
    assert (err <= q8.scale / 2 + 1e-7).all()  # round to nearest on a per-row grid
    f8 = QuantLinear(w, None, "fp8")
    rel = ((f8.dequantize() - w).abs() / w.abs().clamp_min(1e-3 * f8.scale * FP8_MAX))
    assert float(rel.max()) <= 2**-4 + 1e-6  # e4m3: 3 mantissa bits
    assert q8.qweight.dtype == torch.int8 and f8.qweight.dtype == torch.uint8


def test_int4_packing_is_exact_on_its_grid():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-7, 8, (8, 128), generator=g)
    codes[:, ::64] = 7  # every group of 64 reaches the grid's end, so its scale is exactly 2**-4
    w = codes.float() * 2**-4
    q = QuantLinear(w, None, "int4", group_size=64)
    assert q.qweight.shape == (8, 64) and q.scale.shape == (8, 2) and q.scale.dtype == torch.float16
    assert torch.equal(q.dequantize(), w)
    with pytest.raises(ValueError, match="groups"):
        QuantLinear(torch.randn(4, 96), None, "int4", group_size=64)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_quantized_copy(model, fmt):
    q = quantize_model(model, fmt)
    assert len(quant_linears(q)) == 4 * TINY.num_layers and not quant_linears(model)
    assert q.embed_tokens is model.embed_tokens  # shared, not copied
    mem = weight_memory(q)
    assert mem.bytes_per_linear_weight == dtype_bytes(fmt)
    assert mem.total < weight_memory(model).total
    ids = list(range(3, 40))
    ref = sequence_logits(model, ids)
    out = sequence_logits(q, ids)
    tol = {"int8": 0.02, "fp8": 0.1, "int4": 0.3}[fmt]
    assert float((out - ref).abs().max()) < tol * float(ref.abs().max())
    cache_dequantized(q, True)
    try:
        torch.testing.assert_close(sequence_logits(q, ids), out, rtol=0, atol=0)  # the same numbers
    finally:
        cache_dequantized(q, False)


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_quantized_kv_cache(model, fmt):
    ids = list(range(5, 61))
    plain = sequence_logits(model, ids, chunk=8)
    quant = sequence_logits(model, ids, chunk=8, cache_cls=kv_cache_class(fmt))
    diff = float((quant - plain).abs().max())
    assert 0 < diff < 0.05 * float(plain.abs().max())  # rounded (not identical), but close
    contiguous = sequence_logits(model, ids, chunk=8, layout="contiguous", cache_cls=kv_cache_class(fmt))
    torch.testing.assert_close(contiguous, quant, rtol=1e-5, atol=1e-5)
    # generation through a quantized paged cache agrees with the plain cache on the tiny model's first tokens
    a = greedy_generate(model, [ids[:20], ids[:9]], 4).tokens
    b = greedy_generate(model, [ids[:20], ids[:9]], 4, cache_cls=kv_cache_class(fmt)).tokens
    assert [x[:2] for x in a] == [x[:2] for x in b]


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_quantized_kv_swap_round_trip(fmt):
    cache = QuantKVCache(TINY, kv_format=fmt, block_size=4, dtype=torch.float32, layout="paged", num_blocks=6,
                         num_cpu_blocks=3)
    h, d = TINY.num_key_value_heads, TINY.head_dim
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, h, d, generator=g)
    slots = torch.arange(8) + 4  # blocks 1 and 2
    for i in range(TINY.num_layers):
        cache.k[i].view(-1, h, d).index_copy_(0, slots, x)
        cache.v[i].view(-1, h, d).index_copy_(0, slots, -x)
    before = [cache.k[0][torch.tensor([1, 2])].clone(), cache.v[1][torch.tensor([1, 2])].clone()]
    handle = cache.swap_out([1, 2])
    cache.swap_in(handle, [4, 5])
    assert torch.equal(cache.k[0][torch.tensor([4, 5])], before[0])
    assert torch.equal(cache.v[1][torch.tensor([4, 5])], before[1])
    assert cache.num_free_cpu_blocks == 3
    err = (before[0].reshape(8, h, d) - x).abs().max()
    assert float(err) < (0.07 if fmt == "fp8" else 0.02) * float(x.abs().max())


def test_kv_bytes_match_the_simulator(model):
    assert kv_bytes_per_token(model, "fp8") == TINY.kv_bytes_per_token("fp8")
    assert kv_bytes_per_token(model, None) == TINY.kv_bytes_per_token("fp32")
    scales = 2 * TINY.num_layers * TINY.num_key_value_heads * 2  # one float16 per token, head, K and V, layer
    assert kv_bytes_per_token(model, "int8") == TINY.kv_bytes_per_token("int8") + scales
    with pytest.raises(ValueError, match="KV format"):
        kv_cache_class("int4")


def test_quant_config_parse():
    assert QuantConfig.parse("int4+kv-fp8") == QuantConfig("int4", "fp8")
    assert QuantConfig.parse("kv-int8").name == "kv-int8"
    assert QuantConfig.parse("none") == QuantConfig() and QuantConfig().name == "none"
    for bad in ("int3", "int8+int4", "kv-int4", "kv-fp8+kv-int8"):
        with pytest.raises(ValueError):
            QuantConfig.parse(bad)
