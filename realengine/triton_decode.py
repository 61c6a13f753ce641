"""A Triton paged decode attention kernel: one query token per sequence over its paged KV cache.

Same contract as ``attention.paged_decode_attention_ref``: ``q [B, H, D]``, caches ``[num_blocks, block_size,
H_kv, D]``, ``block_tables [B, max_blocks]`` (int32/int64), ``seq_lens [B]``. Returns ``[B, H, D]`` in q's dtype.

Why it is shaped this way:

- One program per (sequence, KV head, split). The ``G = H / H_kv`` query heads that share a KV head are handled
  together, so each K/V element is read from memory once per step, not G times: decode is memory-bound, and the
  bytes read are the whole cost. The G query rows are padded to 16 so the two products are ``tl.dot`` calls.
- The context is walked in tiles of ``TILE`` tokens that may span several blocks: each token's block id comes
  from the block table (``block_tables[b, t // block_size]``), so any block size works and a tile is one gather.
- Online softmax (running max and sum in float32), as in flash attention: one pass over K/V.
- Split-K ("flash-decoding"): with few sequences (batch 1) there are only ``H_kv`` programs, too few to keep a
  GPU's memory system busy on long contexts, so the context is cut into ``num_splits`` parts that run in
  parallel and a second small kernel merges their partial results by their log-sum-exp.

It runs on CPU tensors under ``TRITON_INTERPRET=1`` (slowly), which is how the CPU test suite checks it against
the reference. ``register()`` installs it as the CUDA decode path of ``attention.paged_decode_attention``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from realengine import attention

MIN_DOT = 16  # tl.dot needs every dimension >= 16


@triton.jit
def _decode_partial(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_btb,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    scale,
    tokens_per_split,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    q = (q.to(tl.float32) * scale).to(k_ptr.dtype.element_ty)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for t0 in range(start, stop, TILE):
        t = t0 + tl.arange(0, TILE)
        t_ok = t < stop
        blk = tl.load(bt_ptr + b * stride_btb + t // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
        off = t % BLOCK_SIZE
        kv_ok = t_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + blk[:, None] * stride_kb + off[:, None] * stride_kt + kvh * stride_kh + d[None, :],
                    mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + blk[:, None] * stride_vb + off[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                    mask=kv_ok, other=0.0)
        if IEEE:  # float32 caches: full-precision products (tl.dot would otherwise round to tf32)
            x = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_G, TILE], float32
        else:
            x = tl.dot(q, tl.trans(k))
        x = tl.where(t_ok[None, :], x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(x - m_new[:, None])
        s = s * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    # an empty split (start >= seq_len) leaves m = -inf and s = 0: its lse is -inf and the merge gives it weight 0
    out = acc / tl.where(s > 0, s, 1.0)[:, None]
    lse = m + tl.log(tl.where(s > 0, s, 1.0))
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :], out,
             mask=g_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_ok)


@triton.jit
def _merge_splits(
    part_ptr, lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    sp_ok = sp < NUM_SPLITS
    d_ok = d < HEAD_DIM
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + sp, mask=sp_ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.exp(lse - top)
    w = w / tl.sum(w, axis=0)
    part = tl.load(part_ptr + b * stride_pb + h * stride_ph + sp[:, None] * stride_ps + d[None, :],
                   mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(part * w[:, None], axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def default_num_splits(batch: int, kv_heads: int, max_seq_len: int, *, tile: int = 64, num_sms: int = 132) -> int:
    """Enough splits that about two programs run per SM, without splits shorter than four tiles."""
    programs = batch * kv_heads
    if programs >= 2 * num_sms:
        return 1
    want = math.ceil(2 * num_sms / programs)
    return max(1, min(want, max_seq_len // (4 * tile), 64))


def paged_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                           max_seq_len: int, scale: float, *, num_splits: int | None = None,
                           tile: int = 64) -> Tensor:
    """The Triton kernel with ``attention.paged_decode_attention_ref``'s signature (plus tuning knobs)."""
    bsz, heads, dim = q.shape
    _, block_size, kv_heads, kdim = k_cache.shape
    if kdim != dim or heads % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit a cache of {kv_heads} KV heads of size {kdim}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("the kernel needs the head dimension contiguous in q and both caches")
    group = heads // kv_heads
    if num_splits is None:
        sms = (torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4)
        num_splits = default_num_splits(bsz, kv_heads, max_seq_len, tile=tile, num_sms=sms)
    num_splits = max(1, min(num_splits, math.ceil(max(1, max_seq_len) / tile)))
    # splits are whole tiles so that no tile straddles two splits
    tokens_per_split = math.ceil(math.ceil(max(1, max_seq_len) / num_splits) / tile) * tile
    part = torch.empty(bsz, heads, num_splits, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(bsz, heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = max(MIN_DOT, _pow2(dim))
    _decode_partial[(bsz, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part, lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1),
        float(scale), tokens_per_split,
        GROUP=group, BLOCK_G=max(MIN_DOT, _pow2(group)), HEAD_DIM=dim, BLOCK_D=block_d,
        BLOCK_SIZE=block_size, TILE=tile, IEEE=k_cache.dtype == torch.float32,
    )
    out = torch.empty_like(q)
    if num_splits == 1:
        out.copy_(part[:, :, 0])
        return out
    _merge_splits[(bsz, heads)](
        part, lse, out,
        part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, BLOCK_S=_pow2(num_splits), HEAD_DIM=dim, BLOCK_D=block_d,
    )
    return out


def register() -> None:
    """Use this kernel for decode attention on CUDA tensors (``attention.paged_decode_attention``)."""
    attention.register_cuda_decode_kernel(paged_decode_attention)
