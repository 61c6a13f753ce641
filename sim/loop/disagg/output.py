"""transfers.csv: one row per KV transfer of every disaggregated run in a run folder (written beside
requests.csv by ``sim.output.run_folder.write_run``)."""

from __future__ import annotations

import csv
import io

from sim.metrics.records import RunResult

TRANSFERS_FILE = "transfers.csv"
TRANSFER_COLUMNS = ("variant", "id", "prefill_replica", "decode_replica", "prompt_tokens", "bytes",
                    "prefill_end_s", "transfer_start_s", "transfer_end_s", "decode_admitted_s", "transfer_s")


def transfer_files(results: list[RunResult]) -> dict[str, str]:
    """{TRANSFERS_FILE: text} when a result split prefill and decode, else {}. A request never admitted by
    the decode pool (rejected there) has an empty decode_admitted_s. ``bytes`` is a whole number (it was written
    as a float, 514457600.0, which a reader typing the column as integers refuses)."""
    runs = [r for r in results if r.disaggregation]
    if not runs:
        return {}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TRANSFER_COLUMNS)
    for r in runs:
        d = r.disaggregation
        assert d is not None
        prompt = {rec.id: rec.prompt_tokens for rec in r.requests}
        for j, rid in enumerate(d["id"].tolist()):
            adm = float(d["decode_admitted"][j])
            end, ready = float(d["transfer_end"][j]), float(d["prefill_end"][j])
            w.writerow([r.name, rid, int(d["prefill_replica"][j]), int(d["decode_replica"][j]), prompt[rid],
                        round(float(d["transfer_bytes"][j])), repr(ready), repr(float(d["transfer_start"][j])),
                        repr(end), "" if adm < 0 else repr(adm), repr(end - ready)])
    return {TRANSFERS_FILE: buf.getvalue()}
