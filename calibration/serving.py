"""Steps logged from real serving runs, as calibration samples (torch-free).

The grid measures scripted shapes; serving makes shapes no grid lists (ragged contexts, a prompt chunk beside
a dozen decodes at unequal lengths, a step that swaps). ``StepRecorder`` sits between the engine's loop and its
model runner (``run_engine(on_runner=recorder.attach)``) and notes every step's exact shape as the runner sees
it: the core's ``StepShape`` aggregates, the longest decode context (which the engine's batched decode
attention pads every decode row to) included. After the run, ``samples`` pairs those shapes with the durations
the engine measured for the same steps (its step log, in order), giving ``calibration.fit.Sample`` rows that the
fit takes beside the grid's. A serving run is one "script" of the held-out error: it is held out whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from calibration.fit import Sample
from sim.serving.core import Batch


def shape_row(batch: Batch) -> tuple[int, ...]:
    """The step's covariates in ``Sample``'s field order (``num_seqs`` .. ``swap_blocks``, ``max_decode_len``):
    the core's ``StepShape``, read before the step runs."""
    s = batch.shape
    return (int(s.num_seqs), int(s.num_tokens), int(s.num_decode_seqs), int(s.kv_read_tokens), int(s.attn_pairs),
            int(s.num_padding_tokens), int(s.swap_blocks), int(s.max_decode_len))


class StepRecorder:
    """Notes the shape of every step a ``realengine.ModelRunner`` executes (install with ``attach``)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []

    def attach(self, runner: Any) -> None:
        """Wrap ``runner.execute``: the shape is read before the step runs (the core has planned and allocated
        it; the requests' counters are those the runner uses)."""
        inner = runner.execute

        def execute(batch: Batch, *args: Any, **kwargs: Any) -> Any:
            self.rows.append(shape_row(batch))
            return inner(batch, *args, **kwargs)

        runner.execute = execute

    def samples(self, steps: Mapping[str, np.ndarray], script: str, kind: str = "serving") -> list[Sample]:
        """The recorded shapes with the engine's measured durations (``RunResult.steps``, one row per step in
        the order they ran) as samples of one script. Raises if the two logs disagree on the step count."""
        order = np.argsort(np.asarray(steps["start"]), kind="stable")
        dur = np.asarray(steps["duration"], dtype=np.float64)[order]
        if dur.size != len(self.rows):
            raise RuntimeError(f"{script}: the engine logged {dur.size} steps, the recorder saw {len(self.rows)}")
        return [Sample(script, kind, k, row[0], row[1], row[2], row[3], row[4], row[5], row[6], duration=float(d),
                       max_decode_len=row[7])
                for k, (row, d) in enumerate(zip(self.rows, dur.tolist(), strict=False)) if d > 0]


def serving_samples(runs: Sequence[tuple[StepRecorder, dict[str, np.ndarray], str]]) -> list[Sample]:
    """Samples of several recorded runs (recorder, the run's step columns, a name per run)."""
    out: list[Sample] = []
    for rec, steps, name in runs:
        out += rec.samples(steps, name)
    return out
