"""The columns of the run folder's tables (requests.csv, steps.csv) and their values, shared by the CSV writer and
reader (sim/output/run_folder.py), the Parquet ones (sim/output/parquet_out.py) and ``Results`` (sim/api.py).

Below all three, so that each reads the same names and per-request latencies without importing another writer.
"""

from __future__ import annotations

from sim.metrics.records import CLASS_FIELDS, REQUEST_FIELDS, STEP_COLUMNS, RequestRecord, RunResult, has_classes

# requests.csv's columns. Times are seconds, and each time column says so in its name; a time or session that
# never happened is an empty cell (a -1 would pass for a value and break averages). The latency columns are
# derived with summarize's definitions and cover the same requests, the completed ones (a failed or cancelled
# request may have a first token, but no latency of its own in summary.json), so a user's mean over a column is
# summary.json's mean; the time columns keep what happened to every request. What each column covers is
# REQUEST_COLUMN_HELP (docs/outputs.md lists it).
TIME_FIELDS = ("arrival", "first_scheduled", "first_token", "finish")
TIME_LIST_FIELDS = ("preempted_at", "resumed_at")  # ';'-joined seconds, empty for none
# the fields whose -1 means "never happened" (an empty cell, a null). Not the arrival: every request has one
ABSENT_IF_NEGATIVE = frozenset(("first_scheduled", "first_token", "finish", "session_id"))
LATENCY_COLUMNS = ("queue_s", "ttft_s", "tpot_s", "e2el_s")
REQUEST_COLUMNS: tuple[str, ...] = tuple(
    f"{f}_s" if f in TIME_FIELDS + TIME_LIST_FIELDS else f for f in REQUEST_FIELDS
) + LATENCY_COLUMNS
# Written after those only when the run has request classes, so a classless run's file is what it always was. The
# SLO columns are seconds, empty for no bound.
SLO_FIELDS = ("ttft_slo", "tpot_slo")
CLASS_COLUMNS: tuple[str, ...] = tuple(f"{f}_s" if f in SLO_FIELDS else f for f in CLASS_FIELDS)


REQUEST_COLUMN_HELP: dict[str, str] = {
    "variant": "the variant's name",
    "id": "the request's id, in arrival order",
    "arrival_s": "when it arrived (every request)",
    "first_scheduled_s": "the start of the first step that computed any of its tokens (empty: never scheduled)",
    "first_token_s": "the end of the step that sampled its first output token (empty: none)",
    "finish_s": "when it completed, was rejected or failed (every request)",
    "prompt_tokens": "its prompt length",
    "output_tokens": "the output tokens it got (the target when completed)",
    "target_output_tokens": "the output tokens it asked for",
    "num_preemptions": "how often it lost its KV cache",
    "outcome": "completed, rejected or failed (a cancellation is a failure)",
    "reason": "why it was rejected or failed (empty when completed)",
    "replica": "the replica that served it",
    "session_id": "its user or session (empty: none)",
    "preempted_at_s": "';'-joined times at which a preemption freed its KV",
    "resumed_at_s": "';'-joined times at which it held KV again",
    "queue_s": "first_scheduled_s - arrival_s, completed requests only (summary.json's queue)",
    "ttft_s": "first_token_s - arrival_s, completed requests only (summary.json's ttft)",
    "tpot_s": "(e2el_s - ttft_s) / (output_tokens - 1), completed requests of 2 or more output tokens "
              "(summary.json's tpot)",
    "e2el_s": "finish_s - arrival_s, completed requests only (summary.json's e2el)",
    "priority": "its class's priority, lower is served sooner (runs with request classes)",
    "tenant": "its tenant (runs with request classes)",
    "slo_class": "the class whose SLOs it is held to (runs with request classes)",
    "ttft_slo_s": "its TTFT bound (empty: none; runs with request classes)",
    "tpot_slo_s": "its TPOT bound (empty: none; runs with request classes)",
}


def request_latencies(r: RequestRecord) -> list[float | str]:
    """queue, TTFT, TPOT and E2EL of one request in seconds, as summary.json counts them: empty unless it
    completed (a failed request's first token is in first_token_s), and TPOT needs two tokens (it excludes the
    first, as vLLM's benchmark does)."""
    if not r.completed:
        return ["", "", "", ""]
    tpot: float | str = (r.finish - r.first_token) / (r.output_tokens - 1) if r.output_tokens > 1 else ""
    queue: float | str = r.first_scheduled - r.arrival if r.first_scheduled >= 0 else ""  # unseen by observe
    return [queue, r.first_token - r.arrival, tpot, r.finish - r.arrival]


def class_cells(r: RequestRecord) -> list[object]:
    return [r.priority, r.tenant, r.slo_class, "" if r.ttft_slo < 0 else r.ttft_slo,
            "" if r.tpot_slo < 0 else r.tpot_slo]


def class_column_values(results: list[RunResult]) -> dict[str, list] | None:
    """requests.csv's class columns (``CLASS_COLUMNS``) for the other tables (Parquet, ``Results.requests``):
    rows in the same order, None where the CSV cell is empty; None when no variant has classes."""
    if not any(has_classes(res.requests) for res in results):
        return None
    cols: dict[str, list] = {c: [] for c in CLASS_COLUMNS}
    lists = list(cols.values())
    for res in results:
        for r in sorted(res.requests, key=lambda r: r.id):
            for col, v in zip(lists, class_cells(r), strict=True):
                col.append(None if v == "" else v)
    return cols


# steps.csv's columns: STEP_COLUMNS, with the unit in the name of each time column (the same convention as
# requests.csv). read_steps also takes the older names.
_STEP_TIME_COLUMNS = ("start", "duration")
STEP_CSV_COLUMNS: tuple[str, ...] = tuple(f"{c}_s" if c in _STEP_TIME_COLUMNS else c for c in STEP_COLUMNS)


STEP_CHUNK_ROWS = 1 << 16  # steps.csv rows converted and written at a time: memory stays bounded (a few MB)
