"""The Triton paged decode kernel against the float64 gather + SDPA reference, run by Triton's interpreter on the
CPU (the GPU script checks it on a real card, in bfloat16 too: the interpreter's bf16 dot is not exact)."""

from __future__ import annotations

import os

import pytest

# The interpreter is chosen when a kernel is decorated, so this must precede the kernel module's import. Nothing
# else in the suite uses Triton.
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from realengine import attention
from realengine.attention import paged_decode_attention_ref
from realengine.triton_decode import default_num_splits, paged_decode_attention, register

CASES = [
    # batch, heads, kv heads, head dim, block size, sequence lengths, splits, tile
    (3, 4, 2, 16, 16, [5, 40, 17], None, 16),
    (2, 8, 2, 32, 8, [70, 3], 3, 16),  # tiles span several blocks; a split with nothing for the short sequence
    (1, 6, 6, 24, 16, [130], 4, 16),  # no grouping; a head dim that is not a power of two
    (4, 4, 1, 16, 32, [1, 33, 64, 99], 1, 32),  # multi-query; a sequence of one token
    (2, 32, 8, 64, 16, [200, 129], 2, 64),  # Llama-3.1-8B's grouping (4 query heads per KV head)
]


def _inputs(b, h, hkv, d, bs, lens, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    nb = sum(-(-n // bs) for n in lens) + 7  # spare blocks: tables point at a scattered subset
    k = torch.randn(nb, bs, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(nb, bs, hkv, d, generator=g, dtype=torch.float64)
    q = torch.randn(b, h, d, generator=g, dtype=torch.float64)
    width = -(-max(lens) // bs)
    perm = torch.randperm(nb, generator=g)
    bt = torch.stack([perm[i * width : (i + 1) * width] if (i + 1) * width <= nb else perm[:width]
                      for i in range(b)]).to(torch.int32)
    return q, k, v, bt, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}kv{c[2]}d{c[3]}bs{c[4]}s{c[6]}")
def test_kernel_matches_float64_reference(case) -> None:
    b, h, hkv, d, bs, lens, splits, tile = case
    q, k, v, bt, sl = _inputs(b, h, hkv, d, bs, lens, torch.float64, seed=len(lens) + d)
    scale = d**-0.5
    ref = paged_decode_attention_ref(q, k, v, bt.long(), sl.long(), max(lens), scale)
    out = paged_decode_attention(q.float(), k.float(), v.float(), bt, sl, max(lens), scale, num_splits=splits,
                                 tile=tile)
    assert out.dtype == torch.float32 and out.shape == (b, h, d)
    rel = float((out.double() - ref).abs().max() / ref.abs().max())
    assert rel < 1e-5, rel


def test_float16_cache_close_to_reference() -> None:
    q, k, v, bt, sl = _inputs(2, 8, 2, 32, 16, [80, 37], torch.float64, seed=3)
    ref = paged_decode_attention_ref(q, k, v, bt.long(), sl.long(), 80, 32**-0.5)
    out = paged_decode_attention(q.half(), k.half(), v.half(), bt, sl, 80, 32**-0.5, num_splits=2, tile=16)
    assert out.dtype == torch.float16
    rel = float((out.double() - ref).abs().max() / ref.abs().max())
    assert rel < 2e-3, rel  # half precision: about 3 significant digits


def test_splits_do_not_change_the_result() -> None:
    q, k, v, bt, sl = _inputs(1, 4, 2, 16, 16, [250], torch.float64, seed=9)
    args = (q.float(), k.float(), v.float(), bt, sl, 250, 0.25)
    one = paged_decode_attention(*args, num_splits=1, tile=16)
    for s in (2, 5, 16):
        assert torch.allclose(paged_decode_attention(*args, num_splits=s, tile=16), one, rtol=1e-5, atol=1e-6)


def test_default_splits_fill_the_card() -> None:
    assert default_num_splits(1, 8, 16384, tile=64, num_sms=132) == 33  # 8 programs: 264 / 8 per SM pair
    assert default_num_splits(1, 8, 8192, tile=64, num_sms=132) == 32  # capped: splits of at least 4 tiles
    assert default_num_splits(64, 8, 8192, tile=64, num_sms=132) == 1  # 512 programs already
    assert default_num_splits(1, 8, 100, tile=64, num_sms=132) == 1  # too short to split


def test_register_installs_it_for_cuda_only() -> None:
    try:
        register()
        assert attention._cuda_decode_kernel is paged_decode_attention
        # CPU tensors still take the reference: the kernel is the CUDA path
        q, k, v, bt, sl = _inputs(1, 2, 1, 16, 16, [20], torch.float64, seed=1)
        out = attention.paged_decode_attention(q, k, v, bt.long(), sl.long(), 20, 0.25)
        assert out.dtype == torch.float64
    finally:
        attention.register_cuda_decode_kernel(None)


def test_bad_shapes_are_refused() -> None:
    q, k, v, bt, sl = _inputs(1, 3, 2, 16, 16, [20], torch.float64, seed=2)
    with pytest.raises(ValueError, match="KV heads"):
        paged_decode_attention(q.float(), k.float(), v.float(), bt, sl, 20, 0.25)
