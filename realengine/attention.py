"""Attention over the KV cache, for prefill, chunked prefill and decode in one step.

A step is a flattened batch of new tokens (varlen, as vLLM lays it out): sequence ``i`` contributes the rows
``[query_start_loc[i], query_start_loc[i + 1])``, at positions ``context_lens[i] ...``; its new tokens attend to
its ``context_lens[i]`` cached tokens and causally among themselves. The new tokens' K/V are written into the
cache first (vLLM's order), then each sequence reads its whole context back from the cache.

Two cache layouts, both ``[rows, row_len, kv_heads, head_dim]`` per layer and addressed by a flat slot
``row * row_len + offset``:

- paged: rows are blocks of ``block_size`` tokens, found through the sequence's block table;
- contiguous: one row per sequence (``max_model_len`` tokens), the layout paging replaced, kept to measure what
  paging costs.

The attention itself is a reference that runs anywhere: gather the context into a contiguous tensor and call
``torch.nn.functional.scaled_dot_product_attention`` with the right mask (grouped-query heads through
``enable_gqa``). Sequences that compute one token (decodes) are batched into one call; the runner puts them
first. ``paged_decode_attention`` is the hook where a Triton paged decode kernel plugs in on CUDA
(``register_cuda_decode_kernel``); until one is registered it is the reference everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class AttentionMetadata:
    """Layout of one step's flattened batch. Python lists are for loops on the host; tensors live on the device."""

    query_start_loc: list[int]  # B + 1 offsets: sequence i's new tokens are rows [qsl[i], qsl[i + 1])
    context_lens: list[int]  # B: tokens of sequence i already in the cache before this step
    num_decodes: int  # the leading sequences that compute exactly one token each (one batched call)
    max_decode_len: int  # longest context + 1 among those decodes
    positions: Tensor  # [T] position of every row (padding rows included)
    logits_indices: Tensor  # rows where a token is sampled: the last new token of each sampling sequence
    block_size: int  # tokens per cache row of the paged layout; the row length of the contiguous one
    slot_mapping: Tensor | None = None  # [qsl[-1]] flat cache slot of every new token; None without a cache
    block_tables: Tensor | None = None  # [B, max_blocks] paged layout; short rows padded with block 0 (masked)
    seq_slots: list[int] | None = None  # [B] contiguous layout: the cache row of each sequence
    seq_slots_t: Tensor | None = None  # the same on the device
    seq_lens: Tensor | None = None  # [B] context + new tokens, on the device
    pad_lens: tuple[int, ...] = ()  # padding sequences after the B real ones: no cache, outputs discarded
    # a paged decode step's padding rows (static batching) that attend the longest sequence's context in the decode
    # call, as a padded batch's rows do: the first ``pad_decodes`` padding sequences (one token each), and the
    # decode call's block tables and lengths for the ``num_decodes + pad_decodes`` rows
    pad_decodes: int = 0
    decode_tables: Tensor | None = None
    decode_seq_lens: Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_start_loc) - 1

    @property
    def num_tokens(self) -> int:
        """Rows of real (not padding) sequences."""
        return self.query_start_loc[-1]


def build_metadata(
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    device: str | torch.device = "cpu",
    block_size: int = 16,
    block_tables: Sequence[Sequence[int]] | None = None,
    seq_slots: Sequence[int] | None = None,
    row_len: int = 0,
    sample: Sequence[bool] | None = None,
    pad_lens: Sequence[int] = (),
    sampled_pads: int = 0,
) -> AttentionMetadata:
    """Metadata of a step: sequence i has ``context_lens[i]`` cached tokens and computes ``query_lens[i]`` new ones.

    Give ``block_tables`` (paged: block ids in token order, at least enough for context + new tokens) or
    ``seq_slots`` with ``row_len`` (contiguous), or neither (no cache: every context must be 0). ``sample[i]``
    says whether sequence i samples (default: all). ``pad_lens`` adds padding sequences of that many tokens,
    computed without a cache; the last ``sampled_pads`` of them reach the LM head too (static batching's padded
    rows: a padded batch computes every row's logits, which are discarded), the others do not (a prompt's
    padding to the longest). In a paged step whose sequences all decode, those padded rows also join the decode
    attention over the longest sequence's context (read only: they write no K/V), as the core prices them."""
    ctx = np.asarray(context_lens, dtype=np.int64).reshape(-1)
    ql = np.asarray(query_lens, dtype=np.int64).reshape(-1)
    b = len(ql)
    if len(ctx) != b:
        raise ValueError(f"{len(ctx)} context lengths for {b} sequences")
    if b and ql.min() < 1:
        raise ValueError("every sequence computes at least one token")
    qsl = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(ql, out=qsl[1:])
    nt = int(qsl[-1])
    seq_of = np.repeat(np.arange(b), ql)
    pos = np.arange(nt, dtype=np.int64) - qsl[:-1][seq_of] + ctx[seq_of]
    seq_lens = ctx + ql
    pads = tuple(int(n) for n in pad_lens)
    all_pos = np.concatenate([pos] + [np.arange(n, dtype=np.int64) for n in pads]) if pads else pos
    cached = block_tables is not None or seq_slots is not None
    if not cached and b and ctx.max() > 0:
        raise ValueError("a sequence with cached context needs block_tables or seq_slots")
    nd = 0
    if cached:
        while nd < b and ql[nd] == 1:
            nd += 1
    dev = torch.device(device)

    def to_dev(a: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    if sample is None:
        rows = qsl[1:] - 1
    else:
        rows = (qsl[1:] - 1)[np.asarray(sample, dtype=bool)]
    if sampled_pads:
        if not 0 < sampled_pads <= len(pads):
            raise ValueError(f"{sampled_pads} sampled padding sequences of {len(pads)}")
        ends = nt + np.cumsum(np.asarray(pads, dtype=np.int64)) - 1
        rows = np.concatenate([rows, ends[len(pads) - sampled_pads:]])
    meta = AttentionMetadata(
        query_start_loc=qsl.tolist(),
        context_lens=ctx.tolist(),
        num_decodes=nd,
        max_decode_len=int(seq_lens[:nd].max()) if nd else 0,
        positions=to_dev(all_pos),
        logits_indices=to_dev(rows.astype(np.int64)),
        block_size=block_size,
        pad_lens=pads,
    )
    if block_tables is not None:
        if len(block_tables) != b:
            raise ValueError(f"{len(block_tables)} block tables for {b} sequences")
        widths = -(-seq_lens // block_size)
        table = np.zeros((b, int(widths.max()) if b else 0), dtype=np.int64)
        for i, t in enumerate(block_tables):
            w = int(widths[i])
            if len(t) < w:
                raise ValueError(f"sequence {i} holds {seq_lens[i]} tokens but its block table has {len(t)} blocks")
            table[i, :w] = t[:w]
        slots = table[seq_of, pos // block_size] * block_size + pos % block_size
        meta.block_tables = to_dev(table)
        meta.slot_mapping = to_dev(slots)
        meta.seq_lens = to_dev(seq_lens)
        # a padded decode step's padding rows (every sequence decodes, every padding row one token long)
        if sampled_pads == len(pads) > 0 and nd == b > 0 and all(n == 1 for n in pads):
            longest = int(np.argmax(seq_lens))
            meta.pad_decodes = len(pads)
            meta.decode_tables = to_dev(np.concatenate([table, np.repeat(table[longest:longest + 1], len(pads), 0)]))
            meta.decode_seq_lens = to_dev(np.concatenate([seq_lens, np.repeat(seq_lens[longest], len(pads))]))
    elif seq_slots is not None:
        rows_ = np.asarray(seq_slots, dtype=np.int64).reshape(-1)
        if len(rows_) != b:
            raise ValueError(f"{len(rows_)} cache rows for {b} sequences")
        if b and seq_lens.max() > row_len:
            raise ValueError(f"a sequence holds {int(seq_lens.max())} tokens, longer than its row ({row_len})")
        meta.block_size = row_len
        meta.seq_slots = rows_.tolist()
        meta.seq_slots_t = to_dev(rows_)
        meta.slot_mapping = to_dev(rows_[seq_of] * row_len + pos)
        meta.seq_lens = to_dev(seq_lens)
    return meta


# ---- cache writes ---------------------------------------------------------------------------------------------


def write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Store new tokens' K/V ``[n, kv_heads, head_dim]`` at their flat slots (either layout)."""
    h, d = k.shape[-2:]
    k_cache.view(-1, h, d).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, h, d).index_copy_(0, slot_mapping, v)


# ---- attention ------------------------------------------------------------------------------------------------


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, *, mask: Tensor | None = None,
          causal: bool = False) -> Tensor:
    """q ``[B, H, n, D]``, k/v ``[B, H_kv, L, D]`` -> ``[B, H, n, D]``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """A sequence with no cached context: ``[n, H, D]`` queries over its own ``[n, H_kv, D]`` keys, causal."""
    o = _sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale, causal=True)
    return o[0].transpose(0, 1)


def _context_attention(q: Tensor, k: Tensor, v: Tensor, ctx: int, scale: float) -> Tensor:
    """``[n, H, D]`` new tokens at positions ctx.. over ``[ctx + n, H_kv, D]`` keys: token j sees keys <= ctx + j."""
    n, length = q.shape[0], k.shape[0]
    dev = q.device
    mask = torch.arange(length, device=dev)[None, :] <= (ctx + torch.arange(n, device=dev))[:, None]
    o = _sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale, mask=mask)
    return o[0].transpose(0, 1)


def paged_prefill_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, ctx: int,
                            scale: float) -> Tensor:
    """One sequence's ``[n, H, D]`` new tokens (already written) over its context + themselves, read through its
    block table (a ``[max_blocks]`` row; only the first ``ceil((ctx + n) / block_size)`` entries are read)."""
    length = ctx + q.shape[0]
    bs = k_cache.shape[1]
    blocks = block_table[: cdiv(length, bs)]
    k = k_cache[blocks].flatten(0, 1)[:length]
    v = v_cache[blocks].flatten(0, 1)[:length]
    return _context_attention(q, k, v, ctx, scale)


def contiguous_prefill_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, row: int, ctx: int,
                                 scale: float) -> Tensor:
    """As ``paged_prefill_attention`` for the contiguous layout: the context is a slice (a view, no copy)."""
    length = ctx + q.shape[0]
    return _context_attention(q, k_cache[row, :length], v_cache[row, :length], ctx, scale)


def paged_decode_attention_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                               seq_lens: Tensor, max_seq_len: int, scale: float) -> Tensor:
    """Decode reference: ``q [B, H, D]`` (one token per sequence, already written) over each sequence's
    ``seq_lens[b]`` cached tokens. Gathers ``ceil(max_seq_len / block_size)`` blocks per sequence into
    ``[B, L, H_kv, D]`` and masks each row past its length."""
    bsz = q.shape[0]
    bs = k_cache.shape[1]
    nb = cdiv(max_seq_len, bs)
    bt = block_tables[:, :nb]
    k = k_cache[bt].flatten(1, 2).transpose(1, 2)  # [B, H_kv, nb * bs, D]
    v = v_cache[bt].flatten(1, 2).transpose(1, 2)
    mask = torch.arange(nb * bs, device=q.device)[None, :] < seq_lens[:, None]
    o = _sdpa(q[:, :, None, :], k, v, scale, mask=mask[:, None, None, :])
    return o.view(bsz, q.shape[1], q.shape[2])


_cuda_decode_kernel: Callable[..., Tensor] | None = None


def register_cuda_decode_kernel(fn: Callable[..., Tensor] | None) -> None:
    """Install (or, with None, remove) a CUDA paged decode kernel with ``paged_decode_attention_ref``'s signature.
    The Triton kernel registers itself here; nothing in this module needs triton."""
    global _cuda_decode_kernel
    _cuda_decode_kernel = fn


def paged_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                           max_seq_len: int, scale: float) -> Tensor:
    """Paged decode attention: the registered CUDA kernel for CUDA tensors, else the gather + SDPA reference."""
    if q.is_cuda and _cuda_decode_kernel is not None:
        return _cuda_decode_kernel(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale)
    return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale)


def contiguous_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, rows: list[int], rows_t: Tensor,
                                seq_lens: Tensor, max_seq_len: int, scale: float) -> Tensor:
    """Decode over the contiguous layout. When the rows are consecutive (``r0, r0 + 1, ...``) the context is a
    view of the cache, no copy: the case a benchmark of paging's cost arranges."""
    bsz = q.shape[0]
    r0 = rows[0]
    if rows == list(range(r0, r0 + bsz)):
        k, v = k_cache[r0 : r0 + bsz, :max_seq_len], v_cache[r0 : r0 + bsz, :max_seq_len]
    else:
        k, v = k_cache[rows_t, :max_seq_len], v_cache[rows_t, :max_seq_len]
    mask = torch.arange(max_seq_len, device=q.device)[None, :] < seq_lens[:, None]
    o = _sdpa(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), scale, mask=mask[:, None, None, :])
    return o.view(bsz, q.shape[1], q.shape[2])


def attention(q: Tensor, k: Tensor, v: Tensor, kv: tuple[Tensor, Tensor] | None, meta: AttentionMetadata,
              scale: float) -> Tensor:
    """One layer's attention for a whole step. ``q [T, H, D]``, ``k, v [T, H_kv, D]`` are the step's rows (RoPE
    applied); ``kv`` is the layer's ``(k_cache, v_cache)``, or None for no cache. Returns ``[T, H, D]``."""
    out = torch.empty_like(q)
    qsl = meta.query_start_loc
    nt = qsl[-1]
    if kv is not None:
        k_cache, v_cache = kv
        slots, seq_lens = meta.slot_mapping, meta.seq_lens
        assert slots is not None and seq_lens is not None, "a step over a cache has slot_mapping and seq_lens"
        write_kv(k_cache, v_cache, k[:nt], v[:nt], slots)
        nd = meta.num_decodes
        tables, rows = meta.block_tables, meta.seq_slots  # paged: block tables; contiguous: one row per sequence
        if meta.pad_decodes:  # every row of the step decodes, the padding rows over the longest context
            assert meta.decode_tables is not None and meta.decode_seq_lens is not None
            m = nd + meta.pad_decodes
            out[:m] = paged_decode_attention(q[:m], k_cache, v_cache, meta.decode_tables, meta.decode_seq_lens,
                                             meta.max_decode_len, scale)
        elif nd:
            if tables is not None:
                out[:nd] = paged_decode_attention(q[:nd], k_cache, v_cache, tables[:nd], seq_lens[:nd],
                                                  meta.max_decode_len, scale)
            else:
                assert rows is not None and meta.seq_slots_t is not None, "the contiguous layout has seq_slots"
                out[:nd] = contiguous_decode_attention(q[:nd], k_cache, v_cache, rows[:nd], meta.seq_slots_t[:nd],
                                                       seq_lens[:nd], meta.max_decode_len, scale)
        for i in range(nd, meta.num_seqs):
            a, b = qsl[i], qsl[i + 1]
            ctx = meta.context_lens[i]
            if ctx == 0:  # a fresh prompt: its keys are exactly the ones just written
                out[a:b] = causal_attention(q[a:b], k[a:b], v[a:b], scale)
            elif tables is not None:
                out[a:b] = paged_prefill_attention(q[a:b], k_cache, v_cache, tables[i], ctx, scale)
            else:
                assert rows is not None, "the contiguous layout has seq_slots"
                out[a:b] = contiguous_prefill_attention(q[a:b], k_cache, v_cache, rows[i], ctx, scale)
    else:
        for i in range(meta.num_seqs):
            a, b = qsl[i], qsl[i + 1]
            out[a:b] = causal_attention(q[a:b], k[a:b], v[a:b], scale)
    a = nt + meta.pad_decodes
    for n in meta.pad_lens[meta.pad_decodes:]:
        out[a : a + n] = causal_attention(q[a : a + n], k[a : a + n], v[a : a + n], scale)
        a += n
    return out
