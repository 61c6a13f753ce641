"""The step shapes a calibration measures (``Grid``) and the scripts that make them (``scripts_of``): small workloads
whose requests arrive at chosen step numbers, run by ``calibration.measure``.

Shape classes (``Script.kind``): ``decode`` (B requests decoding at context c), ``prefill`` (one prompt in
chunks of q tokens over a cached context c = 0, q, 2q, ...), ``mixed`` (B decodes plus a prefill chunk, as
chunked prefill schedules them) and ``padded`` (static batching: rows padded to the longest, finished rows kept).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.hardware.models import ModelSpec


@dataclass(frozen=True, slots=True)
class Arrival:
    step: int  # the request arrives before this step is scheduled (0: at the start)
    prompt_len: int
    output_len: int


@dataclass(frozen=True, slots=True)
class Script:
    """One calibration workload: a policy and requests arriving at given step numbers."""

    name: str
    kind: str  # shape class: decode | prefill | mixed | padded
    policy: dict[str, Any]  # a scenario's policy section (continuous or static)
    arrivals: tuple[Arrival, ...]

    @property
    def max_tokens(self) -> int:
        return sum(a.prompt_len + a.output_len for a in self.arrivals)


@dataclass(frozen=True, slots=True)
class Grid:
    """Which step shapes a calibration measures. ``tiny_cpu`` keeps the whole calibration of the tiny model
    within seconds on a 2-core CPU; ``gpu`` covers a 1B-class model on a datacenter GPU."""

    decode_batches: tuple[int, ...]  # B: requests decoding together
    decode_contexts: tuple[int, ...]  # c: their prompt length (the context grows by one per step)
    decode_steps: int  # decode steps per decode script
    prefill_chunks: tuple[int, ...]  # q: chunk size of a chunked prompt
    prefill_len: int  # prompt length of the prefill scripts: chunks at contexts 0, q, 2q, ... < prefill_len
    mixed_batches: tuple[int, ...]  # B decodes beside a prefill chunk
    mixed_chunks: tuple[int, ...]  # q of that chunk
    mixed_prompt: int  # prompt being chunked in the mixed scripts
    static_batches: tuple[int, ...]  # static batching batch sizes (padded steps)
    static_max_prompt: int
    static_max_output: int
    swap_blocks: tuple[int, ...] = (1, 4, 16, 64)  # block counts of the swap copy measurement
    # ragged decodes: B requests decoding at unequal contexts, one at c and the others at 16 tokens. The engine's
    # batched decode attention gathers every row padded to the longest context, so these steps separate its
    # rows x longest-context cost from the sum of contexts (equal in the decode scripts)
    ragged_batches: tuple[int, ...] = ()
    ragged_contexts: tuple[int, ...] = ()

    @classmethod
    def tiny_cpu(cls) -> Grid:
        return cls(
            decode_batches=(1, 2, 4, 8, 16, 32), decode_contexts=(16, 128, 384), decode_steps=10,
            prefill_chunks=(16, 64, 256, 768), prefill_len=768,
            mixed_batches=(2, 8, 24), mixed_chunks=(32, 128), mixed_prompt=384,
            static_batches=(4, 16), static_max_prompt=160, static_max_output=24,
            ragged_batches=(4, 16), ragged_contexts=(384,),
        )

    @classmethod
    def medium_cpu(cls) -> Grid:
        """For a CPU model of tens of millions of parameters (``llama-57m``): steps of 5-50 ms at the batch
        sizes and chunks its workloads use, the whole calibration within a couple of minutes."""
        return cls(
            decode_batches=(1, 2, 4, 8, 16), decode_contexts=(16, 128, 320), decode_steps=5,
            prefill_chunks=(16, 64, 128, 256), prefill_len=512,
            mixed_batches=(2, 8), mixed_chunks=(32, 96), mixed_prompt=256,
            static_batches=(4, 8), static_max_prompt=128, static_max_output=12,
            ragged_batches=(4, 12), ragged_contexts=(256, 640),
        )

    @classmethod
    def gpu(cls) -> Grid:
        return cls(
            decode_batches=(1, 4, 16, 64, 128, 256), decode_contexts=(128, 1024, 4096), decode_steps=16,
            prefill_chunks=(128, 512, 2048, 8192), prefill_len=8192,
            mixed_batches=(8, 64, 192), mixed_chunks=(256, 1024), mixed_prompt=4096,
            static_batches=(16, 64), static_max_prompt=1024, static_max_output=128,
            swap_blocks=(1, 16, 64, 256),
        )

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_grid(device: str, spec: ModelSpec | None = None) -> Grid:
    """The GPU grid on CUDA; on a CPU the tiny grid for a model of a few million parameters or fewer (its steps
    are about a millisecond), the medium grid for anything bigger."""
    if device == "cuda":
        return Grid.gpu()
    return Grid.tiny_cpu() if spec is None or spec.num_params < 5e6 else Grid.medium_cpu()


def scripts_of(grid: Grid, seed: int = 0) -> list[Script]:
    """The grid as scripts. Lengths of the padded (static batching) scripts are drawn from ``seed``."""
    out: list[Script] = []
    big = 1 << 20  # a budget no script reaches: the batch is limited by max_num_seqs only
    for b in grid.decode_batches:
        for c in grid.decode_contexts:
            # all prompts in one first step, then decode_steps steps of b decodes at contexts c, c + 1, ...
            out.append(Script(f"decode-b{b}-c{c}", "decode",
                              {"type": "continuous", "enable_chunked_prefill": True, "max_num_seqs": b,
                               "max_num_batched_tokens": big},
                              tuple(Arrival(0, c, grid.decode_steps + 1) for _ in range(b))))
    for q in grid.prefill_chunks:
        # one prompt cut into chunks of q: steps of q new tokens over cached contexts 0, q, 2q, ...
        n = max(1, grid.prefill_len // q)
        out.append(Script(f"prefill-q{q}", "prefill",
                          {"type": "continuous", "enable_chunked_prefill": True, "max_num_seqs": 1,
                           "max_num_batched_tokens": q},
                          (Arrival(0, n * q, 1),)))
    for b in grid.mixed_batches:
        for q in grid.mixed_chunks:
            # b short requests decode while a long prompt arrives at step 2 and is chunked beside them
            # (the decoders' own 16-token prompts take the first few steps, in chunks of the same budget)
            chunks = max(1, grid.mixed_prompt // q)
            start = -(-16 * b // (b + q)) + 1
            decoders = tuple(Arrival(0, 16, start + chunks + 4) for _ in range(b))
            out.append(Script(f"mixed-b{b}-q{q}", "mixed",
                              {"type": "continuous", "enable_chunked_prefill": True, "max_num_seqs": b + 1,
                               "max_num_batched_tokens": b + q},
                              decoders + (Arrival(start, chunks * q, 1),)))
    for b in grid.ragged_batches:
        for c in grid.ragged_contexts:
            out.append(Script(f"ragged-b{b}-c{c}", "decode",
                              {"type": "continuous", "enable_chunked_prefill": True, "max_num_seqs": b,
                               "max_num_batched_tokens": big},
                              (Arrival(0, c, grid.decode_steps + 1),)
                              + tuple(Arrival(0, 16, grid.decode_steps + 1) for _ in range(b - 1))))
    rng = np.random.default_rng(seed)
    for b in grid.static_batches:
        prompts = rng.integers(8, grid.static_max_prompt + 1, size=2 * b)
        outputs = rng.integers(2, grid.static_max_output + 1, size=2 * b)
        out.append(Script(f"static-b{b}", "padded",
                          {"type": "static", "batch_size": b, "max_wait": 0.0},
                          tuple(Arrival(0, int(p), int(o)) for p, o in zip(prompts, outputs, strict=True))))
    return out
