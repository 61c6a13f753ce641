"""The common shape every benchmark reader produces.

All latencies are held in SECONDS, with servesim's definitions: TTFT from arrival to the first token, TPOT over the
output tokens after the first, ITL per gap between tokens, E2EL from arrival to the last token. Readers convert
explicitly from their source's units (vllm bench serve writes aggregates in ms and per-request lists in s).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config.files import read_bytes_capped

# A benchmark file's size at most. vllm bench serve --save-detailed keeps every request's token gaps (itls) and its
# generated text, some 27 kB a request of 1,000 tokens (measured on a file of vLLM's layout), so 512 MiB held
# only 20,000 requests. Neither is read (the ITL figures are the file's aggregates): both are cut from the bytes before
# parsing (``_UNREAD``), which keeps the parse small, and a regular file is taken up to MAX_BENCH_FILE_BYTES, judged by
# its size before anything is read. Anything else (a pipe, /dev/zero, read without end before the cap) up to
# MAX_BENCH_BYTES.
MAX_BENCH_BYTES = 512 << 20
MAX_BENCH_FILE_BYTES = 4 << 30
# a top-level key's value that is never read, cut to null: a list of lists of numbers, a list of strings (a key inside
# a string is written with its quotes escaped, which the look-behind refuses; the texts' quantifiers are possessive: no
# backtracking over a GB)
_UNREAD = (re.compile(rb'(?<!\\)"itls"\s*:\s*(\[[^"{}]*\])'),  # greedy: back over the ", " after its last "]"
           re.compile(rb'(?<!\\)"generated_texts"\s*:\s*(\[(?:\s*+"(?:[^"\\]++|\\.)*+"\s*+,?)*+\s*+\])'))


class BenchFileError(ValueError):
    """A file that cannot be read at all; the message names the file and the field."""


def _read_capped(p: Path) -> bytes:
    """The file's bytes, refused past its cap (``MAX_BENCH_FILE_BYTES`` for a regular file, judged by its size before
    anything is read; ``MAX_BENCH_BYTES`` else) with the reason (ValueError)."""
    regular = p.is_file()
    cap = MAX_BENCH_FILE_BYTES if regular else MAX_BENCH_BYTES
    if regular and p.stat().st_size > cap:
        raise ValueError(f"{p}: larger than {cap >> 20} MiB, too large for a benchmark file")
    return read_bytes_capped(p, cap, "a benchmark file")


def _without_unread(data: bytes) -> bytes:
    """``data`` with the values of the keys servesim never reads (``_UNREAD``) replaced by null (joined from views
    of ``data``: no copy of the whole on the way)."""
    for pattern in _UNREAD:
        m = pattern.search(data)
        if m is not None:
            view = memoryview(data)
            data = b"".join((view[:m.start(1)], b"null", view[m.end(1):]))
    return data


def _check_utf8(p: Path, data: bytes) -> None:
    """BenchFileError naming the first byte that is not UTF-8; checked in slices, never decoded whole (a GB file
    decoded whole doubled what reading it held)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view, step = memoryview(data), 1 << 24
    for start in range(0, len(data), step):
        try:
            decoder.decode(view[start:start + step], final=start + step >= len(data))
        except UnicodeDecodeError as e:
            at = max(start + e.start, 0)
            raise BenchFileError(f"{p}: not UTF-8 text (byte {at} is {data[at]:#04x})") from None


def read_bench_json(path: str | Path) -> Any:
    """A benchmark (or knobs) file's JSON value; BenchFileError naming the file for one that is missing, too large,
    not UTF-8, not JSON or nested past the parser's depth (a RecursionError traceback). The per-request ``itls`` and
    ``generated_texts`` of a vllm bench serve --save-detailed file are read as null (``_UNREAD``)."""
    p = Path(path)
    try:
        data = _read_capped(p)
    except FileNotFoundError:
        raise BenchFileError(f"{p}: file not found") from None
    except OSError as e:
        raise BenchFileError(f"{p}: not readable JSON ({e})") from None
    except ValueError as e:  # too large: the message names the file and the cap
        raise BenchFileError(str(e)) from None
    if data.startswith(b"\xef\xbb\xbf"):  # a byte-order mark
        data = data[3:]
    _check_utf8(p, data)
    try:
        return json.loads(_without_unread(data))
    except RecursionError:
        raise BenchFileError(f"{p}: not readable JSON (nested too deeply)") from None
    except ValueError as e:
        raise BenchFileError(f"{p}: not readable JSON ({e})") from None


@dataclass
class BenchRun:
    source: str
    format: str = "vllm-bench"  # vllm-bench | guidellm | genai-perf
    label: str | None = None  # which benchmark of a file holding several (GuideLLM's sweeps)
    model: str | None = None
    request_rate: float | None = None  # requests/s; None for "inf" (all at once)
    request_rate_absent: bool = False  # a vLLM file without the key or with null (vllm bench serve writes "inf")
    burstiness: float | None = None  # gamma shape of inter-arrival times; 1.0 is Poisson
    max_concurrency: int | None = None
    # vLLM's --ramp-up-strategy (linear or exponential) with its start and end rates in requests/s
    ramp_up: tuple[str, float, float] | None = None
    duration_s: float | None = None
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    arrival_times_s: list[float] | None = None  # relative to the first request's
    ttfts_s: list[float] = field(default_factory=list)
    latencies_s: list[float] | None = None  # E2EL per request, where the file has it
    num_failed: int = 0  # requests the file lists as failed (left out of the per-request lists)
    # Aggregates keyed "<stat>_<metric>" in seconds, e.g. "mean_ttft", "p99_e2el"; throughputs under vLLM's names
    # (request_throughput in req/s, output_throughput and total_token_throughput in tokens/s).
    aggregates: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "file: field: why" for what could not be read
    num_requests: int | None = None  # requests of the run, where only aggregates are known
    # mean/std/min/max of the lengths where the file has no per-request lengths (genai-perf's export)
    input_len_stats: dict[str, float] | None = None
    output_len_stats: dict[str, float] | None = None

    @property
    def load(self) -> float | None:
        """The x of a load sweep: the request rate, else the max concurrency."""
        if self.request_rate is not None:
            return self.request_rate
        return float(self.max_concurrency) if self.max_concurrency is not None else None
