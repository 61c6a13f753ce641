"""The model runner: turns a step the serving core planned into tensors, runs it, returns the sampled tokens.

The engine loop is the simulator's, with a real executor::

    batch = core.schedule(now)             # the policy plans; the core allocates blocks
    tokens = runner.execute(batch)         # swaps, builds the varlen batch from the block tables, runs the model
    core.complete(batch, end)              # the core advances the requests (one token each that caught up)

The core must run with ``fast_path=False`` so that every request's counters are current in every step. Each
scheduled ``(request, n)`` computes positions ``[num_computed_tokens, num_computed_tokens + n)`` of its token
sequence: the prompt (a deterministic function of the request, see ``prompt_token_ids``) followed by the tokens
this runner sampled for it. A request that catches up samples one token (greedy). After a recompute preemption
the core resets ``num_computed_tokens`` and the same rule recomputes prompt and generated tokens.

Swap preemption: the core's ``_apply`` has already released the victim's device blocks (and may have handed them
to others in the same plan) when ``execute`` runs. The runner therefore keeps each request's block table as its
last step left it, and within ``execute`` copies every swap-out first, then every swap-in, then runs the forward
pass: no KV is written between the plan and the forward pass, so the released blocks still hold the victim's
K/V. Call ``release(req_id)`` when a request ends (completed, rejected, failed): ``core.on_finish`` is the hook.
"""

from __future__ import annotations

from collections.abc import Callable
from os import PathLike
from typing import Any

import numpy as np
import torch

from realengine.attention import build_metadata, cdiv
from realengine.kv_cache import KVCache, SwapHandle
from realengine.model import LlamaModel
from sim.hardware.models import ModelSpec
from sim.serving.request import RequestSpec

_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a cheap, well-spread integer hash."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def prompt_token_ids(spec: RequestSpec, vocab_size: int, seed: int = 0) -> list[int]:
    """The prompt's token ids: a hash of (seed, source, position) modulo the vocabulary. The source is the
    request's id, except inside the prefix its ``hash_ids`` name, where it is the hash id of the position's
    ``hash_block_size`` chunk: requests sharing a prefix then share its tokens, and prefix caching is exact."""
    n = spec.prompt_len
    pos = np.arange(n, dtype=np.uint64)
    src = np.full(n, spec.id & _MASK64, dtype=np.uint64)
    tag = np.ones(n, dtype=np.uint64)
    if spec.hash_ids:
        hb = spec.hash_block_size
        m = min(n, len(spec.hash_ids) * hb)
        ids = np.array([h & _MASK64 for h in spec.hash_ids], dtype=np.uint64)
        src[:m] = np.repeat(ids, hb)[:m]
        tag[:m] = 2
    with np.errstate(over="ignore"):
        x = _mix64(np.full(n, seed & _MASK64, dtype=np.uint64) ^ tag)
        x = _mix64(x ^ src)
        x = _mix64(x ^ pos)
    return (x % np.uint64(vocab_size)).astype(np.int64).tolist()


class ModelRunner:
    """Runs the core's batches on a ``LlamaModel`` with a ``KVCache`` addressed by the core's block tables.

    ``kv_layout="contiguous"`` keeps the same scheduling (the core's paged block manager still decides what fits)
    but stores each request's KV in one row of ``max_model_len`` tokens, of ``max_num_seqs`` rows: the layout
    paging replaced, to measure what paging costs.
    """

    def __init__(
        self,
        model_spec: ModelSpec,
        *,
        block_manager,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float32",
        seed: int = 0,  # weights; prompt tokens use token_seed (default: the same seed)
        kv_layout: str = "paged",
        max_num_seqs: int = 0,  # contiguous layout: rows
        max_model_len: int = 0,  # contiguous layout: tokens per row
        model: LlamaModel | None = None,  # a model built already (e.g. to size the cache from a warm-up)
        weights_path: str | PathLike[str] | None = None,
        token_seed: int | None = None,
        prompt_fn: Callable[[RequestSpec], list[int]] | None = None,  # prompt token ids (default: prompt_token_ids)
    ) -> None:
        if model is None:
            model = LlamaModel(model_spec, dtype=dtype, device=device, seed=seed, weights_path=weights_path)
        elif model.spec != model_spec:
            raise ValueError(f"the model given is {model.spec.name}, not {model_spec.name}")
        if kv_layout == "paged" and not hasattr(block_manager, "tables"):
            raise ValueError("the paged layout needs a block manager with block tables (PagedBlockManager)")
        self.spec = model_spec
        self.block_manager = block_manager
        self.model = model
        self.device = model.device
        self.block_size = block_manager.block_size
        self.paged = kv_layout == "paged"
        self.kv = KVCache(
            model_spec,
            block_size=self.block_size,
            dtype=model.dtype,
            device=self.device,
            layout=kv_layout,
            num_blocks=block_manager.num_blocks,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            num_cpu_blocks=getattr(block_manager, "num_cpu_blocks", 0),
        )
        self.token_seed = seed if token_seed is None else token_seed
        self.prompt_fn = prompt_fn  # a real model's text prompts (realengine.text.text_prompt_ids)
        self._tokens: dict[int, list[int]] = {}  # request id -> prompt + sampled token ids
        self._blocks: dict[int, list[int]] = {}  # paged: block table as the request's last step left it
        self._slots: dict[int, int] = {}  # contiguous: the request's cache row
        self._swapped: dict[int, SwapHandle] = {}  # request id -> its KV in CPU swap space
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self.last_num_tokens = 0  # rows the last step computed for requests
        self.last_num_padding_tokens = 0  # rows it computed for nobody (static batching's padding)
        # called with the batch just before the forward pass, where a real out-of-memory error is raised: the
        # engine's fault injection sets it for one step
        self.fault: Callable[[Any], None] | None = None

    # ---- state ---------------------------------------------------------------------------------------------
    @property
    def live_requests(self) -> set[int]:
        """Requests the runner holds anything for (tokens, a block table copy, a cache row, a CPU copy)."""
        return set(self._tokens) | set(self._blocks) | set(self._slots) | set(self._swapped)

    def block_table(self, req_id: int) -> list[int]:
        """The cache blocks a live request's KV is in, as its last step left them (a copy): still readable after
        the core freed them, until another step runs (a disaggregated prefill's KV is copied out then)."""
        return list(self._blocks[req_id])

    def tokens(self, req_id: int) -> list[int]:
        """Prompt + sampled token ids of a live request (a copy)."""
        return list(self._tokens[req_id])

    def release(self, req_id: int) -> None:
        """Drop everything held for a request that ended; unknown ids are ignored."""
        self._tokens.pop(req_id, None)
        self._blocks.pop(req_id, None)
        slot = self._slots.pop(req_id, None)
        if slot is not None:
            self.kv.free_slot(slot)
        handle = self._swapped.pop(req_id, None)
        if handle is not None:
            self.kv.free_handle(handle)

    # ---- the step ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch) -> dict[int, int]:
        """Run one ``sim.serving.core.Batch`` (after ``core.schedule``, before ``core.complete``). Returns
        ``{request id: sampled token}`` for the requests that caught up."""
        if batch.group_size:
            raise RuntimeError("the runner needs every request every step: build the core with fast_path=False")
        plan = batch.plan
        for r, mode in plan.preempt:  # copies out first: the blocks they free may be reused just below
            self._preempt(r, mode)
        for r in plan.swap_in:
            self._swap_in(r)
        self.last_num_tokens = self.last_num_padding_tokens = 0
        if not plan.scheduled:
            return {}
        # decodes first: the attention batches the leading one-token sequences into one call
        rows = [rn for rn in plan.scheduled if rn[1] == 1] + [rn for rn in plan.scheduled if rn[1] != 1]
        ctx: list[int] = []
        qlens: list[int] = []
        sample: list[bool] = []
        ids: list[int] = []
        where: list = []  # block tables (paged) or cache rows (contiguous)
        tables = self.block_manager.tables if self.paged else None
        for r, n in rows:
            toks = self._tokens.get(r.id)
            if toks is None:
                toks = self._tokens[r.id] = (prompt_token_ids(r.spec, self.spec.vocab_size, self.token_seed)
                                             if self.prompt_fn is None else list(self.prompt_fn(r.spec)))
            c = r.num_computed_tokens
            if len(toks) != r.num_tokens:
                raise RuntimeError(f"request {r.id}: the runner holds {len(toks)} tokens, the core counts "
                                   f"{r.num_tokens} (a sampled token was lost, or the request was not released)")
            ids.extend(toks[c : c + n])
            ctx.append(c)
            qlens.append(n)
            sample.append(c + n == len(toks))
            if tables is not None:  # paged
                table = tables[r.id]
                snap = self._blocks.get(r.id)
                if snap is None or len(snap) != len(table) or snap[-1] != table[-1]:
                    self._blocks[r.id] = list(table)
                where.append(table)
            else:
                slot = self._slots.get(r.id)
                if slot is None:
                    slot = self._slots[r.id] = self.kv.take_slot()
                where.append(slot)
        pads: list[int] = []
        if plan.pad_to_longest or plan.padded_rows:
            longest = max(qlens)
            if plan.pad_to_longest:
                pads = [longest - n for n in qlens if n < longest]
            pads += [longest] * plan.padded_rows
        if self.paged:
            meta = build_metadata(ctx, qlens, device=self.device, block_size=self.block_size, block_tables=where,
                                  sample=sample, pad_lens=pads, sampled_pads=plan.padded_rows)
        else:
            meta = build_metadata(ctx, qlens, device=self.device, block_size=self.block_size, seq_slots=where,
                                  row_len=self.kv.row_len, sample=sample, pad_lens=pads,
                                  sampled_pads=plan.padded_rows)
        self.last_num_tokens, self.last_num_padding_tokens = len(ids), sum(pads)
        input_ids = torch.tensor(ids + [0] * sum(pads), dtype=torch.long, device=self.device)
        if self.fault is not None:
            self.fault(batch)
        logits = self.model(input_ids, meta.positions, meta, self.kv)
        sampled = logits.argmax(dim=-1).tolist()  # also waits for the device: the step is done
        out: dict[int, int] = {}
        it = iter(sampled)
        for (r, _), s in zip(rows, sample, strict=True):
            if s:
                t = next(it)
                self._tokens[r.id].append(t)
                out[r.id] = t
        return out

    def _preempt(self, r, mode: str) -> None:
        if mode == "swap":
            if self.paged:
                blocks = self._blocks.pop(r.id)
                n = self.block_manager.cpu_tables[r.id]
                if n != len(blocks):
                    raise RuntimeError(f"request {r.id}: the core swapped out {n} blocks, the runner knew "
                                       f"{len(blocks)}")
            else:
                slot = self._slots.pop(r.id)
                blocks = self.kv.slot_blocks(slot, cdiv(r.num_computed_tokens, self.block_size))
                self.kv.free_slot(slot)
            self._swapped[r.id] = self.kv.swap_out(blocks)
            self.num_blocks_swapped_out += len(blocks)
        else:  # recompute: the KV is simply dropped; the tokens stay
            self._blocks.pop(r.id, None)
            row = self._slots.pop(r.id, None)  # contiguous layout: the cache row it held, if any
            if row is not None:
                self.kv.free_slot(row)

    def _swap_in(self, r) -> None:
        handle = self._swapped.pop(r.id)
        n = len(handle)
        if self.paged:
            gpu = self.block_manager.tables[r.id][:n]  # swap-in took these before the plan's allocations
        else:
            slot = self._slots[r.id] = self.kv.take_slot()
            gpu = self.kv.slot_blocks(slot, n)
        self.kv.swap_in(handle, gpu)
        self.num_blocks_swapped_in += n
