"""(prompt, output) length pairs sampled from a lengths-only file, such as the arxiv-summarization lengths Vidur's
own figures use: each request draws one row, so the two lengths keep their joint distribution (their correlation,
the longest requests' shape), which two independent ``empirical`` marginals would lose.

A file is a CSV with a header row; the two columns are named in the scenario (defaults: Vidur's
``num_prefill_tokens`` and ``num_decode_tokens``). ``vidur-arxiv`` names the shipped copy (see
``sim/workload/data/traces/NOTICE.md``).
"""

from __future__ import annotations

import csv
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sim.workload.traces import MAX_TRACE_BYTES, MAX_TRACE_LENGTH, TRACE_DIR

LENGTH_FILES: dict[str, str] = {"vidur-arxiv": "vidur_arxiv_summarization_llama2.csv"}


def resolve_lengths(name_or_path: str) -> Path:
    """Path of a shipped lengths file name, or the given path. Raises FileNotFoundError naming the path."""
    path = TRACE_DIR / LENGTH_FILES[name_or_path] if name_or_path in LENGTH_FILES else Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"lengths file not found: {path} (shipped ones are named {', '.join(LENGTH_FILES)})")
    return path


def load_pairs(name_or_path: str, prompt_column: str, output_column: str) -> tuple[np.ndarray, np.ndarray]:
    """The file's (prompt, output) lengths as two read-only int64 arrays; 0 is clamped to 1 as traces do."""
    path = resolve_lengths(name_or_path)
    st = path.stat()
    return _read(str(path), st.st_mtime_ns, st.st_size, prompt_column, output_column)


@lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int, size: int, prompt_column: str, output_column: str) -> tuple[np.ndarray, np.ndarray]:
    if size > MAX_TRACE_BYTES:
        raise ValueError(f"{path}: {size / 2**30:.3g} GiB, larger than the {MAX_TRACE_BYTES >> 30} GiB allowed")
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file (expected a header row)")
        cols = []
        for name in (prompt_column, output_column):
            if name not in header:
                raise ValueError(f"{path}: no column {name!r}; the header has {', '.join(header)}")
            cols.append(header.index(name))
        prompt: list[int] = []
        output: list[int] = []
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            for col, name, out in ((cols[0], prompt_column, prompt), (cols[1], output_column, output)):
                try:
                    v = int(row[col])
                except (ValueError, IndexError):
                    raise ValueError(f"{path}:{line}: {name} must be an integer, got "
                                     f"{row[col] if col < len(row) else 'nothing'!r}") from None
                if not 0 <= v <= MAX_TRACE_LENGTH:
                    raise ValueError(f"{path}:{line}: {name} must lie in [0, {MAX_TRACE_LENGTH}], got {v}")
                out.append(max(v, 1))
    if not prompt:
        raise ValueError(f"{path}: the file holds no rows")
    arrays = (np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64))
    for a in arrays:
        a.setflags(write=False)
    return arrays


class LengthPairs(BaseModel):
    """(prompt, output) lengths drawn together, one row of a lengths file per request."""

    # as the workload section's models (sim/workload/generator.py imports this one): unknown keys refused, frozen
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["pairs"] = "pairs"
    file: str = Field(description=f"Shipped lengths file ({', '.join(LENGTH_FILES)}) or path to a CSV with a header.")
    prompt_column: str = Field(default="num_prefill_tokens", description="Column of prompt tokens.")
    output_column: str = Field(default="num_decode_tokens", description="Column of output tokens.")
    sample: Literal["random", "in_order"] = Field(
        default="random", description="random: rows drawn with replacement; in_order: rows in file order, cycled.")

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        prompt, output = load_pairs(self.file, self.prompt_column, self.output_column)
        rows = rng.integers(0, len(prompt), size=n) if self.sample == "random" else np.arange(n) % len(prompt)
        return prompt[rows], output[rows]

    def describe(self) -> str:
        return f"(prompt, output) pairs from {os.path.basename(self.file)}"
