"""Speculative decoding on the real engine: a draft proposes k tokens, the target verifies them in one step.

The draft is the target's first ``num_layers`` decoder layers followed by the target's final norm and LM head: a
self-speculative draft (the layer-skipping drafts of Zhang et al. 2023, "Draft & Verify", and LayerSkip). With
random weights a separately drawn small model agrees with the target about as often as chance (1 / vocabulary),
while the target's own first layers agree often (tiny: its 1 of 2 layers gives about 40% of greedy tokens).
Its scenario form is vLLM's ``method: draft_model`` with ``model`` the target's shape with fewer layers.

The draft's layers are the target's, so its KV at a position is the target's for the same token: the draft
passes write their KV into the target's cache (the first layers only), in the slots the core allocated for the
drafts, and the verification step overwrites those slots with the same values for the accepted tokens. No second
cache is needed (the simulator still counts a draft's KV: an engine with a separate draft would hold one).

A step with drafts (``batch.drafts``, set by the core's ``sim.serving.spec_decode.SpecDecoder``):

1. ``max(k)`` draft passes, each one token per drafting row (row r drafts ``drafts[r]`` tokens), greedy;
2. one target forward in which each drafting row computes its last token and its drafts (1 + k tokens) and
   returns logits at all of them; the other rows (prefill chunks) run as in ``ModelRunner``;
3. greedy verification: draft i is accepted while it equals the target's argmax at the position before it; the
   row emits the accepted drafts plus the target's token after them. The accepted counts go to the core through
   ``EngineAcceptor`` (the acceptance model of the engine's core: measured, not drawn) and are kept per request
   (``measured``) so that the simulator can replay them (``sim.serving.spec_decode.MeasuredAcceptance``).

Greedy speculative decoding emits exactly the tokens plain greedy decoding would (up to floating-point ties);
the tests check it against a run without speculation.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from realengine.attention import build_metadata
from realengine.model import LlamaModel, rope_cos_sin
from realengine.runner import ModelRunner, prompt_token_ids
from sim.hardware.models import ModelSpec
from sim.serving.request import Request
from sim.serving.spec_decode import SpecDecoder, SpeculativeConfig, draft_spec


def draft_layers(cfg: SpeculativeConfig, target: ModelSpec) -> int:
    """Decoder layers of the target the engine's draft runs; a ValueError for drafts the engine cannot run."""
    if cfg.method != "draft_model":
        raise ValueError(f"the engine runs method draft_model (the target's first layers), not {cfg.method}")
    spec = draft_spec(cfg, target)
    assert spec is not None  # draft_model always has one
    same = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
    if any(getattr(spec, f) != getattr(target, f) for f in same) or not 1 <= spec.num_layers < target.num_layers:
        raise ValueError(f"the engine's draft is the target's first layers: speculative.model must be "
                         f"{target.name}'s shape with 1 to {target.num_layers - 1} layers, got {spec.name}")
    return spec.num_layers


def check_engine_draft(speculative: SpeculativeConfig | None, target: ModelSpec) -> None:
    """A ValueError, before anything runs, for a speculative section the engine cannot run."""
    if speculative is not None:
        draft_layers(speculative, target)


@torch.inference_mode()
def forward_layers(model: LlamaModel, input_ids: torch.Tensor, meta, kv_cache, num_layers: int) -> torch.Tensor:
    """``model``'s forward through its first ``num_layers`` layers, then its final norm and LM head."""
    x = F.embedding(input_ids, model.embed_tokens)
    cos, sin = rope_cos_sin(meta.positions, model.spec.head_dim, model.spec.rope_theta, model.dtype)
    for i, layer in enumerate(model.decoder_layers[:num_layers]):
        x = layer(x, cos, sin, meta, kv_cache.layer(i))
    return F.linear(model.norm(x[meta.logits_indices]), model.lm_head_weight)


class SpecDecodeRunner(ModelRunner):
    """A ``ModelRunner`` whose decoding rows draft with the target's first layers and verify in one step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.draft_num_layers = 0  # set by ``speculate``
        self.pending: dict[int, int] = {}  # request id -> drafts accepted in the step just run
        self.measured: dict[int, list[int]] = {}  # request id -> accepted drafts, draft by draft
        self.draft_seconds = 0.0  # host time spent in draft passes (CPU: thread time)

    def speculate(self, cfg: SpeculativeConfig) -> SpecDecoder:
        """Turn drafting on with ``cfg``; the decoder the core runs with (its acceptance: what this runner
        measures)."""
        if not self.paged:
            raise ValueError("speculative decoding on the engine needs the paged KV layout")
        self.draft_num_layers = draft_layers(cfg, self.spec)
        return SpecDecoder(cfg.num_speculative_tokens, EngineAcceptor(self), cfg.disable_by_batch_size)

    @torch.inference_mode()
    def execute(self, batch) -> dict[int, int]:
        drafts = batch.drafts
        if not drafts:
            return super().execute(batch)
        plan = batch.plan
        if batch.group_size or plan.pad_to_longest or plan.padded_rows:
            raise RuntimeError("speculative steps run unpadded, without the decode group")
        for r, mode in plan.preempt:
            self._preempt(r, mode)
        for r in plan.swap_in:
            self._swap_in(r)
        tables = self.block_manager.tables
        rows: list[tuple[Request, int]] = []
        for r, n in plan.scheduled:
            toks = self._tokens.get(r.id)
            if toks is None:
                toks = self._tokens[r.id] = (prompt_token_ids(r.spec, self.spec.vocab_size, self.token_seed)
                                             if self.prompt_fn is None else list(self.prompt_fn(r.spec)))
            if len(toks) != r.num_tokens:
                raise RuntimeError(f"request {r.id}: the runner holds {len(toks)} tokens, the core counts "
                                   f"{r.num_tokens}")
            rows.append((r, n + drafts.get(r.id, 0)))
            snap = self._blocks.get(r.id)
            table = tables[r.id]
            if snap is None or len(snap) != len(table) or snap[-1] != table[-1]:
                self._blocks[r.id] = list(table)
        proposals = self._draft([(r, drafts[r.id]) for r, _ in plan.scheduled if r.id in drafts])
        # one-token rows first: the attention batches leading decodes into one call
        rows = [rn for rn in rows if rn[1] == 1] + [rn for rn in rows if rn[1] != 1]
        ids: list[int] = []
        ctx: list[int] = []
        qlens: list[int] = []
        where = []
        logit_rows: list[int] = []  # flat rows whose logits are needed
        at = 0
        for r, q in rows:
            c = r.num_computed_tokens
            toks = self._tokens[r.id]
            if r.id in proposals:
                ids.append(toks[c])
                ids.extend(proposals[r.id])
                logit_rows.extend(range(at, at + q))  # every position: the target's token after each draft
            else:
                ids.extend(toks[c : c + q])
                if c + q == len(toks):
                    logit_rows.append(at + q - 1)
            ctx.append(c)
            qlens.append(q)
            where.append(tables[r.id])
            at += q
        meta = build_metadata(ctx, qlens, device=self.device, block_size=self.block_size, block_tables=where)
        meta.logits_indices = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        self.last_num_tokens, self.last_num_padding_tokens = len(ids), 0
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        if self.fault is not None:
            self.fault(batch)
        target = self.model(input_ids, meta.positions, meta, self.kv).argmax(dim=-1).tolist()
        out: dict[int, int] = {}
        it = 0
        for r, q in rows:
            toks = self._tokens[r.id]
            prop = proposals.get(r.id)
            if prop is not None:
                verdict = target[it : it + q]
                it += q
                a = 0
                while a < len(prop) and prop[a] == verdict[a]:
                    a += 1
                toks.extend(prop[:a])
                toks.append(verdict[a])
                out[r.id] = verdict[a]
                self.pending[r.id] = a
                self.measured.setdefault(r.id, []).append(a)
            elif r.num_computed_tokens + q == len(toks):
                toks.append(target[it])
                out[r.id] = target[it]
                it += 1
        return out

    def _draft(self, rows: list[tuple[Request, int]]) -> dict[int, list[int]]:
        """Greedy drafts from the target's first layers, one pass per draft position; their KV goes into the
        target's cache (the first layers) at the draft positions."""
        t0 = time.thread_time() if self.device.type == "cpu" else time.perf_counter()
        tables = self.block_manager.tables
        out: dict[int, list[int]] = {r.id: [] for r, _ in rows}
        longest = max(k for _, k in rows)
        for j in range(longest):
            live = [(r, k) for r, k in rows if k > j]
            ids = [self._tokens[r.id][r.num_computed_tokens] if j == 0 else out[r.id][-1] for r, _ in live]
            ctx = [r.num_computed_tokens + j for r, _ in live]
            meta = build_metadata(ctx, [1] * len(live), device=self.device, block_size=self.block_size,
                                  block_tables=[tables[r.id] for r, _ in live])
            logits = forward_layers(self.model, torch.tensor(ids, dtype=torch.long, device=self.device), meta,
                                    self.kv, self.draft_num_layers)
            for (r, _), t in zip(live, logits.argmax(dim=-1).tolist(), strict=True):
                out[r.id].append(t)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.draft_seconds += (time.thread_time() if self.device.type == "cpu" else time.perf_counter()) - t0
        return out


class EngineAcceptor:
    """The engine core's acceptance model: what the runner's verification just measured for the request."""

    def __init__(self, runner: SpecDecodeRunner) -> None:
        self.runner = runner

    def __call__(self, req: Request, k: int) -> int:
        return self.runner.pending.pop(req.id)
