"""What a run leaves behind: the run folder (CSV or Parquet), the terminal table, the HTML report, comparison of runs
and users' benchmark files (vllm bench, GuideLLM, genai-perf) read and written.
"""
