"""The Python time LMDeploy v0.1.0a1's benchmark client spends on a request before TurboMind sees it: the source of
``PROFILE_GENERATION_SUBMIT_S`` and ``PROFILE_GENERATION_SUBMIT_PER_GPU_S`` (benchmarks/bench_published.py).

``benchmark/profile_generation.py`` (InternLM/lmdeploy at ebe90bc, the commit of docs/en/benchmark/a100_fp16.md)
starts a request's first-token clock (``prev = time.perf_counter()``) and calls ``TurboMindInstance.stream_infer``
(lmdeploy/turbomind/turbomind.py at v0.1.0a1), whose Python code builds the request's tensors (``torch.IntTensor``,
``pad_sequence``, a dozen ``np.full``), hands each to TurboMind through DLPack (``_tm.from_dlpack``), makes a
``Queue`` and starts one ``Thread`` a GPU that calls the C++ ``forward``, which enqueues the request. Every thread of
the client runs in one interpreter, so that code runs one request at a time. This script runs the same Python with
the two TurboMind calls replaced by their nearest pure counterparts (``v.__dlpack__()`` for ``_tm.from_dlpack``; the
forward thread returns at once) and prints the median time of a request, for 1 and 4 GPUs (the tables' TP 1 and 4).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_lmdeploy_client.py [--repeats N]
"""

from __future__ import annotations

import argparse
import time
from queue import Queue
from threading import Event, Thread

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence


def stream_infer_python(prompt: list[int], gpu_count: int, session_len: int = 4096, output_len: int = 128,
                        eos_id: int = 2) -> None:
    """stream_infer's code up to the forward threads' start (v0.1.0a1, ``ignore_eos=True``, ``stream_output``)."""
    batch = [torch.IntTensor(prompt)]
    lengths = torch.IntTensor([len(ids) for ids in batch])
    ids = pad_sequence(batch, batch_first=True, padding_value=eos_id)

    def full(value: float, dtype: type) -> np.ndarray:
        return np.full((1,), value, dtype=dtype)

    inputs = dict(input_ids=ids, input_lengths=lengths,
                  request_output_len=np.full(lengths.shape, output_len, dtype=np.uint32),
                  runtime_top_k=full(1, np.uint32), runtime_top_p=full(1.0, np.float32),
                  temperature=full(1.0, np.float32), repetition_penalty=full(1.0, np.float32),
                  step=full(0, np.int32), session_len=session_len * np.ones([1], dtype=np.uint32),
                  START=full(1, np.int32), END=full(1, np.int32), CORRID=np.array([1], dtype=np.uint64),
                  STOP=full(0, np.int32), bad_words_list=torch.tensor([[[eos_id], [1]]], dtype=torch.int32))
    _ = {k: v.__dlpack__() for k, v in inputs.items()}  # _np_dict_to_tm_dict: _tm.from_dlpack(v) each
    Queue()
    entered = Event()
    for _device in range(gpu_count):  # _forward_thread: one thread a GPU calls the model instance's forward
        Thread(target=entered.set, daemon=True).start()
    entered.wait()
    _ = lengths + lengths.new_tensor(np.zeros(1, dtype=np.int32))  # seq_start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for gpus in (1, 4):
        for n in (1, 128):
            prompt = rng.integers(0, 101, n).tolist()  # profile_generation.py's random ids below 101
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                stream_infer_python(prompt, gpus)
                times.append(time.perf_counter() - t0)
            print(f"{gpus} GPU(s), {n:3d}-token prompt: median {np.median(times) * 1e6:5.0f} us "
                  f"(10th percentile {np.percentile(times, 10) * 1e6:5.0f} us) over {args.repeats} requests")


if __name__ == "__main__":
    main()
