"""The teaching page's logic without a browser: knob sets to scenarios (validated by the CLI's own code, with its
messages), the lesson presets, the explanation rules, and the time one redraw takes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sim.config.scenario import parse_scenario
from sim.config.schema import ScenarioError
from sim.studies.teach import explain as ex
from sim.studies.teach.knobs import (
    DEFAULT_PRESET,
    LESSONS,
    SOURCE,
    TEACH_REQUESTS,
    UI_KEYS,
    knobs_from_scenario,
    prepare,
    preset,
    preset_names,
    scenario_dict,
    simulate,
)
from tests.conftest import servesim

ROOT = Path(__file__).resolve().parent.parent


def test_every_lesson_variant_is_a_preset():
    names = preset_names()
    assert names[0] == DEFAULT_PRESET
    for stem in LESSONS:
        raw = yaml.safe_load((ROOT / "scenarios" / f"{stem}.yaml").read_text())
        assert [n for n in names if n.startswith(stem + "/")] == [f"{stem}/{v['name']}" for v in raw["variants"]]
    with pytest.raises(KeyError, match="unknown preset"):
        preset("no-such-lesson/x")


def test_preset_rebuilds_the_lesson_variant_it_came_from():
    k = preset("lesson-continuous-batching/naive")
    assert (k["policy"], k["batch_size"], k["max_wait"], k["kv"]) == ("static", 16, 0.5, "contiguous")
    assert (k["gpu"], k["model"], k["rate"], k["burstiness"]) == ("a100-80gb", "llama-3.1-8b", 8.0, 1.0)
    assert (k["prompt_mean"], k["prompt_spread"], k["output_mean"], k["output_spread"]) == (400, 0.75, 250, 1.4)
    raw = scenario_dict(k)
    assert raw["workload"] == {
        "arrival": {"type": "poisson", "rate": 8.0},
        "num_requests": TEACH_REQUESTS,
        "prompt_len": {"type": "lognormal", "mean": 400.0, "std": 300.0, "min": 16, "max": 2048},
        "output_len": {"type": "lognormal", "mean": 250.0, "std": 350.0, "min": 1, "max": 2048},
    }
    assert raw["policy"] == {"type": "static", "batch_size": 16, "max_wait": 0.5, "preemption_mode": "recompute"}
    assert raw["kv_cache"] == {"type": "contiguous", "reserve": "max_model_len"}
    c = preset("lesson-continuous-batching/continuous")
    assert c["policy"] == "chunked" and c["max_num_batched_tokens"] == 4096 and c["kv"] == "paged"
    m = preset("lesson-memory-bound/fp8-weights-and-kv")
    assert (m["weight_dtype"], m["kv_dtype"], m["tensor_parallel_size"]) == ("fp8", "fp8", 2)
    assert m["admission"] == {"max_queue_delay": 20}


def test_knob_choices_become_scenario_sections():
    k = {**preset(DEFAULT_PRESET), "policy": "continuous", "max_num_seqs": 32, "burstiness": 3.0,
         "output_spread": 0.0, "kv": "paged", "max_num_batched_tokens": None}
    raw = scenario_dict(k)
    assert raw["policy"] == {"type": "continuous", "max_num_seqs": 32, "enable_chunked_prefill": False,
                             "preemption_mode": "recompute"}
    assert raw["workload"]["arrival"] == {"type": "gamma", "rate": 8.0, "cv": 3.0}
    assert raw["workload"]["output_len"] == {"type": "fixed", "value": 250}
    assert raw["kv_cache"] == {"type": "paged"}
    parse_scenario(raw)  # a valid scenario for the schema the CLI reads


def test_a_scenario_round_trips_through_its_knobs():
    raw = yaml.safe_load((ROOT / "scenarios" / "naive-vs-continuous.yaml").read_text())
    k = knobs_from_scenario(raw, "continuous")
    assert k["output_spread"] == 1.0  # an exponential length: std = mean
    again = knobs_from_scenario(scenario_dict({**k, "label": "continuous"}), "continuous")
    assert {key: again[key] for key in UI_KEYS} == {key: k[key] for key in UI_KEYS}


@pytest.mark.parametrize(
    ("knob", "value", "key", "cli_value"),
    [
        ("gpu_memory_utilization", 1.5, "deployment.gpu_memory_utilization", "1.5"),
        ("rate", -1, "workload.arrival.rate", "-1"),
        ("max_num_seqs", 0, "policy.max_num_seqs", "0"),
        ("batch_size", 0, "policy.batch_size", "0"),
        ("block_size", 0, "deployment.block_size", "0"),
        ("burstiness", -2, "workload.arrival.cv", "-2"),
        # the spread knob sets the lognormal's std to spread x mean
        ("output_spread", -1.0, "workload.output_len.std", "-250.0"),
    ],
)
def test_bad_knob_gets_the_cli_message(tmp_path, knob, value, key, cli_value):
    """The page's message is the CLI's, word for word, for the same value set on the same scenario file."""
    k = preset(DEFAULT_PRESET)
    if knob == "max_num_seqs":
        k["policy"] = "continuous"
    if knob == "burstiness":
        k["burstiness"] = 2.0  # the file holds a gamma arrival, whose cv the command line then sets
    raw = scenario_dict(k)
    with pytest.raises(ScenarioError) as page:
        prepare({**k, knob: value})
    page_msg = str(page.value)
    assert page_msg.startswith(f"{SOURCE}: {key}: "), page_msg
    # the same scenario as a file, the bad value given with --set on the command line (run in this process:
    # tests/conftest.py's servesim() gives the exit status and stderr a process gives, a traceback included)
    f = tmp_path / "teach.yaml"
    f.write_text(yaml.safe_dump(raw))
    cli = servesim("run", str(f), "--out", str(tmp_path / "out"), "-q", "--set", f"{key}={cli_value}", cwd=ROOT,
                   timeout=120)
    assert cli.returncode == 2, cli.stderr
    assert "Traceback" not in cli.stderr
    cli_msg = cli.stderr.strip().splitlines()[-1]
    assert cli_msg == f"error: {f}: {page_msg.removeprefix(SOURCE + ': ')}"


def test_an_emptied_box_is_refused():
    with pytest.raises(ScenarioError, match=r"^teach: block_size, rate: a value is required$"):
        prepare({**preset(DEFAULT_PRESET), "rate": None, "block_size": None})


def test_a_redraw_simulates_in_well_under_a_second():
    """Both lesson presets of the first lesson, as the page runs them with one pinned: CPU time, not wall time
    (the machine is shared). Measured: about 0.25 s for the pair on a 2-core CPU."""
    naive, cont = preset("lesson-continuous-batching/naive"), preset("lesson-continuous-batching/continuous")
    simulate(cont)  # warm imports and caches
    t0 = time.process_time()
    a, b = simulate(naive), simulate(cont)
    spent = time.process_time() - t0
    assert spent < 1.0, f"{spent:.2f} s of CPU for one redraw"
    sa, sb = next(iter(a.summaries.values())), next(iter(b.summaries.values()))
    assert sa["num_completed"] == sb["num_completed"] == TEACH_REQUESTS
    # the lesson's shape holds at the page's size: continuous serves several times the naive output rate
    assert sb["output_throughput"] > 3 * sa["output_throughput"]


# ---- explanation rules ----------------------------------------------------------------------------------------
def _summary(**over) -> dict:
    s = {
        "request_throughput": 5.0, "output_throughput": 1000.0, "queue": {"p90": 0.1}, "ttft": {"p99": 0.2},
        "kv_usage": {"mean": 0.3, "max": 0.5}, "num_preemptions": 0, "num_rejected": 0, "busy_fraction": 0.9,
        "mean_batch_size": 20.0, "padding_fraction": 0.0, "kv_token_utilization": 0.97,
    }
    for k, v in over.items():
        s[k] = v
    return s


def test_a_healthy_run_says_it_keeps_up():
    (only,) = ex.explain(_summary(), offered_rate=5.0)
    assert only.startswith("The server keeps up: GPU busy 90%")


@pytest.mark.parametrize(
    ("over", "start"),
    [
        ({"queue": {"p90": ex.QUEUE_WAIT_S + 1}}, "The queue is growing"),
        ({"kv_usage": {"mean": 0.9, "max": ex.KV_CEILING}, "num_preemptions": 3}, "The memory ceiling is hit"),
        ({"busy_fraction": ex.SLOTS_IDLE_BUSY - 0.01}, "Slots sit idle"),
        ({"padding_fraction": ex.PADDING + 0.01}, "Padding"),
        ({"kv_token_utilization": ex.KV_WASTE - 0.01}, "Reserved KV is mostly empty"),
    ],
)
def test_each_sign_gets_its_sentence(over, start):
    (only,) = ex.explain(_summary(**over), offered_rate=5.0)
    assert only.startswith(start), only


@pytest.mark.parametrize(
    "over",
    [
        {"queue": {"p90": ex.QUEUE_WAIT_S}},
        {"kv_usage": {"mean": 0.9, "max": ex.KV_CEILING - 0.01}},
        {"busy_fraction": ex.SLOTS_IDLE_BUSY},
        {"padding_fraction": ex.PADDING},
        {"kv_token_utilization": ex.KV_WASTE},
    ],
)
def test_at_the_threshold_a_sign_stays_silent(over):
    (only,) = ex.explain(_summary(**over))
    assert only.startswith("The server keeps up")


def test_memory_ceiling_counts_preemptions_and_rejections():
    text = ex.explain(_summary(kv_usage={"mean": 0.9, "max": 1.0}, num_preemptions=4, num_rejected=2))[0]
    assert "peaked at 100% of the pool: 4 preemptions and 2 rejections" in text


def test_the_naive_lesson_explains_padding_and_queue():
    run = simulate(preset("lesson-continuous-batching/naive"))
    s = next(iter(run.summaries.values()))
    texts = ex.explain(s, offered_rate=8.0)
    assert [t.split(":")[0] for t in texts] == ["The queue is growing", "Padding", "Reserved KV is mostly empty"]


def test_the_padding_sentence_names_prompt_padding_too():
    # Before: "66% of the computed tokens belong to rows whose request has already finished", while in the naive
    # lesson 46 of those 66 points are prompts padded to their batch's longest (naive-vs-continuous at full size,
    # its steps.csv). With every output of one length no row finishes early, and the padding is all prompts'.
    k = preset("lesson-continuous-batching/naive") | {"output_spread": 0.0}
    run = simulate(k)
    s = next(iter(run.summaries.values()))
    (result,) = run.results
    decode_pad = int(result.steps["padding_tokens"][result.steps["prefill_tokens"] == 0].sum())
    assert decode_pad == 0 and s["padding_fraction"] > ex.PADDING
    (pad,) = [t for t in ex.explain(s, offered_rate=k["rate"]) if t.startswith("Padding")]
    assert "each prompt is padded to the longest of its batch" in pad


@pytest.mark.parametrize(
    ("name", "heads"),
    [
        ("lesson-memory-bound/bf16-two-gpus", ["The queue is growing", "The memory ceiling is hit"]),
        ("lesson-paged-memory/contiguous", ["The memory ceiling is hit", "Reserved KV is mostly empty"]),
        ("lesson-paged-memory/paged", ["The server keeps up"]),
    ],
)
def test_the_lessons_explain_their_point(name, heads):
    k = preset(name)
    s = next(iter(simulate(k).summaries.values()))
    assert [t.split(":")[0] for t in ex.explain(s, offered_rate=k["rate"])] == heads


def test_compare_states_the_ratio():
    text = ex.compare(_summary(output_throughput=300.0), _summary(output_throughput=1500.0))
    assert text.startswith("This run serves 5.00x the output tokens per second of the pinned one (1,500 against 300")
    assert ex.compare(_summary(output_throughput=0.0), _summary()).startswith("The pinned run completed no output")


# ---- the command ----------------------------------------------------------------------------------------------
def _teach(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.cli.main", "teach", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_teach_refuses_a_bad_port():
    res = servesim("teach", "--port", "0", cwd=ROOT, timeout=120)  # refused before anything listens
    assert res.returncode == 2 and res.stderr.strip() == "error: --port must be in 1..65535, got 0"


def test_teach_refuses_a_port_in_use():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        res = _teach("--port", str(port))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen: ")
    assert "Traceback" not in res.stderr


def test_teach_serves_the_page_on_the_port_given():
    """Served by waitress, a production server: Flask's built-in one printed its red "development server, do not
    use in production" warning on every start while the help suggests serving a class on 0.0.0.0."""
    pytest.importorskip("dash", reason="dash is not installed (the test extra has it)")
    import os
    import socket
    import urllib.request

    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli.main", "teach", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        page = server = None
        while page is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    page, server = r.read().decode(), r.headers["Server"]
            except OSError:
                time.sleep(0.3)
        assert page is not None, "the page never answered"
        assert "<title>servesim teach</title>" in page
        assert "/_dash-component-suites/" in page and "cdn" not in page.lower()
        assert server == "servesim teach"  # waitress's ident (Flask's server answers "Werkzeug/...")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert out.splitlines()[0] == f"servesim teach: http://127.0.0.1:{port}/ ({TEACH_REQUESTS} requests per run)"
    assert "development server" not in out and "Traceback" not in out, out


def test_the_header_and_the_verdict_each_name_the_window_of_their_rate():
    """The header's requests/s is over the whole run, the verdict's over the arrival window: on the naive preset
    they differ (1.32 against 1.51 req/s), so each line says which window it measured."""
    pytest.importorskip("dash", reason="dash is not installed (the test extra has it)")
    from sim.studies.teach.app import redraw

    shown = redraw(preset(DEFAULT_PRESET), None)
    (res,) = simulate({**preset(DEFAULT_PRESET), "label": "now: naive: static batches"}).results
    done = sum(r.completed for r in res.requests)
    header, verdict = shown["throughput"], shown["verdict"]
    assert f", {done / res.duration:.3g} requests/s over the whole run ({res.duration:.3g} s, first arrival to " \
        "last completion), " in header, header
    first, last = min(r.arrival for r in res.requests), max(r.arrival for r in res.requests)
    scheduled = sum(0 <= r.first_scheduled <= last for r in res.requests) / (last - first)
    assert f", scheduled {scheduled:.2f} req/s (first to last arrival)" in verdict, verdict
    assert f"{done / res.duration:.3g}" != f"{scheduled:.3g}"  # the two windows give two different rates here



def test_the_slot_chart_and_the_start_up_line_state_one_request_count():
    """The slot chart's title said "at most 300 requests per variant" (the report's SLOT_REQUESTS) while start-up
    said 200 per run: both come from TEACH_REQUESTS now, and every request of the run is drawn."""
    pytest.importorskip("dash", reason="dash is not installed (the test extra has it)")
    from sim.studies.teach.app import redraw

    fig = redraw(preset(DEFAULT_PRESET), None)["slots"]
    assert fig.layout.title.text.endswith(f"(at most {TEACH_REQUESTS} requests per variant)"), fig.layout.title.text
    (panel,) = [a.text for a in fig.layout.annotations]
    assert f": {TEACH_REQUESTS} of {TEACH_REQUESTS} scheduled requests drawn;" in panel, panel


def test_a_run_that_served_nobody_says_so_not_that_more_traffic_would_fit():
    # every request rejected: the page said "Slots sit idle: the GPU is busy only 0% of the time (mean batch nan
    # requests). More traffic would fit on this server."
    summary = {"num_requests": 5, "num_completed": 0, "num_rejected": 5, "num_preemptions": 0,
               "rejections": {"prompt+output 5010 tokens exceeds max_model_len 4096": 5},
               "busy_fraction": 0.0, "mean_batch_size": float("nan"), "kv_usage": {"mean": float("nan"),
               "max": float("nan")}, "request_throughput": 0.0, "queue": {}, "padding_fraction": float("nan"),
               "kv_token_utilization": float("nan")}
    (line,) = ex.explain(summary, offered_rate=2.0)
    assert line.startswith("No request was served: all 5 were rejected (prompt+output 5010 tokens exceeds "
                           "max_model_len 4096: 5)."), line
    assert "nan" not in line and "would fit" not in line
