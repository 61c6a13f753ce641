"""Readers for users' own benchmark result files (issue 14)."""

from sim.output.benchfiles.common import BenchFileError, BenchRun
from sim.output.benchfiles.vllm_bench import read_vllm_bench

__all__ = ["BenchFileError", "BenchRun", "read_vllm_bench"]
