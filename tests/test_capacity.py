"""Capacity figures against hand computations for two real models, and the ``servesim capacity`` command.

The hand computations spell out each step from the models' published config.json shapes and the H100's
nvidia-smi memory (81,559 MiB), with vLLM's KV sizing: usable = memory * 0.9; KV memory = usable - weights -
activation reserve; blocks = KV memory // (16 tokens * KV bytes per token).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.hardware.capacity import capacity_row, capacity_table, format_capacity
from sim.hardware.dtypes import GiB
from sim.hardware.gpu import GPUSpec
from sim.hardware.models import ModelSpec

H100_BYTES = 81559 * 2**20  # 85,520,809,984
USABLE = int(H100_BYTES * 0.9)  # 76,968,728,985


def test_llama_3_1_8b_bf16_on_h100_by_hand() -> None:
    # Parameters: embeddings and the (untied) LM head, 128,256 x 4,096 each; per layer q and o 4096 x 4096, k and v
    # 4096 x 1024 (8 KV heads x 128), gate/up/down 3 x 4096 x 14336; two RMSNorm weights per layer, one final.
    embed = 128256 * 4096  # 525,336,576
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # 218,103,808
    params = 2 * embed + 32 * layer + 32 * 2 * 4096 + 4096
    assert params == 8_030_261_248
    weights = 2 * params  # bf16: 16.06 GB, "16 GB of weights"
    assert weights == 16_060_522_496
    # KV per token: K and V, 32 layers, 8 KV heads of 128, 2 bytes: 128 KiB
    kv_token = 2 * 32 * 8 * 128 * 2
    assert kv_token == 128 * 1024
    # activation reserve (sim.hardware.kv_budget.estimate_activation_reserve): 8192 tokens x (4 x 4096 + 3 x 14336)
    # x 2 bytes, plus 256 rows x 128,256 fp32 logits x 2 copies, plus 1 GiB of runtime overhead
    reserve = 8192 * (4 * 4096 + 3 * 14336) * 2 + 256 * 128256 * 4 * 2 + GiB
    assert reserve == 2_309_488_640
    kv_memory = USABLE - weights - reserve  # 58,598,717,849 bytes, 54.6 GiB
    blocks = kv_memory // (16 * kv_token)
    assert blocks == 27_942  # 447,072 tokens
    sessions_4k = blocks // (4096 // 16)  # a 4,096-token session is 256 blocks
    assert sessions_4k == 109

    table = capacity_table("llama-3.1-8b", "h100-sxm", contexts=[1000, 4096, 8192, 131072])
    r = table.row("bf16", "auto", 1)
    assert (r.weight_dtype, r.kv_dtype, r.fits) == ("bf16", "bf16", True)
    assert r.weight_bytes == weights
    assert r.kv_bytes_per_token == r.kv_bytes_per_token_replica == kv_token
    assert r.activation_reserve == reserve
    assert r.kv_memory == kv_memory
    assert r.num_gpu_blocks == blocks and r.capacity_tokens == 447_072
    # 1,000 tokens take 63 blocks (the last one partly filled): 27,942 // 63 = 443
    assert r.sessions == (blocks // 63, sessions_4k, blocks // 512, blocks // 8192) == (443, 109, 54, 3)
    assert table.kv_bytes_per_session(4096) == 4096 * kv_token == 512 * 2**20

    # fp8 KV halves the bytes per token, so twice the blocks fit in the same KV memory
    f = table.row("bf16", "fp8", 1)
    assert f.kv_bytes_per_token == kv_token // 2
    assert f.num_gpu_blocks == kv_memory // (16 * kv_token // 2) == 55_884
    # fp8 weights: the decoder's linear layers in one byte each, embeddings, LM head and norms stay bf16
    w8 = table.row("fp8", "auto", 1)
    assert w8.weight_bytes == 32 * layer + 2 * (2 * embed + 32 * 2 * 4096 + 4096) == 9_081_200_640
    assert w8.kv_dtype == "bf16"  # auto: the activation dtype of fp8 weights
    # int4: half a byte per linear weight
    assert table.row("int4", "auto", 1).weight_bytes == 32 * layer // 2 + 2 * (2 * embed + 32 * 2 * 4096 + 4096)


def test_llama_3_1_70b_on_h100_by_hand() -> None:
    # 80 layers, hidden 8192, 64 heads, 8 KV heads of 128, MLP 28,672, vocabulary 128,256
    embed = 128256 * 8192
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672  # 855,638,016
    params = 2 * embed + 80 * layer + 80 * 2 * 8192 + 8192
    assert params == 70_553_706_496  # 141.1 GB in bf16: more than one H100 holds
    kv_token = 2 * 80 * 8 * 128 * 2
    assert kv_token == 320 * 1024

    table = capacity_table("llama-3.1-70b", "h100-sxm", weight_dtypes=["bf16", "int4"], kv_dtypes=["auto"])
    one = table.row("bf16", "bf16", 1)
    assert not one.fits and one.weight_bytes == 2 * params and "does not fit" not in one.reason
    assert "weights" in one.reason and "usable" in one.reason

    # the weights fit but the rest holds no whole block: that is the reason given, not "weights > usable" (before:
    # "15.0 GiB weights + 2.2 GiB activations per GPU > 20.2 GiB usable", false on its face)
    big = capacity_table("llama-3.1-8b", "l4", weight_dtypes=["bf16"], kv_dtypes=["auto"], tensor_parallel_sizes=[1],
                         block_size=10**6).row("bf16", "bf16", 1)
    left = big.usable_memory - big.weight_bytes - big.activation_reserve
    assert not big.fits and 0 < left < 10**6 * big.kv_bytes_per_token
    assert big.reason == (f"{left / GiB:.1f} GiB left per GPU after weights and activations < one 1,000,000-token KV "
                          f"block ({10**6 * big.kv_bytes_per_token / GiB:.1f} GiB)")
    assert big.reason.startswith("3.1 GiB left") and big.reason.endswith("(122.1 GiB)")

    # tp=4: each GPU holds 16 of the 64 heads, 2 of the 8 KV heads, a quarter of the MLP and of the vocabulary
    vocab = 128256 // 4
    layer4 = 8192 * (16 + 2 * 2) * 128 + 16 * 128 * 8192 + 3 * 8192 * (28672 // 4)  # 213,909,504
    per_gpu = 80 * layer4 + 2 * vocab * 8192 + 80 * 2 * 8192 + 8192  # norms are replicated
    r = table.row("bf16", "bf16", 4)
    assert r.weight_bytes == 2 * per_gpu == 35_278_831_616
    assert r.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2 == 80 * 1024  # a quarter of the KV heads per GPU
    assert r.kv_bytes_per_token_replica == kv_token
    reserve = 8192 * (4 * 8192 + 3 * (28672 // 4)) * 2 + 256 * 128256 * 8 + GiB
    assert r.activation_reserve == reserve == 2_225_602_560
    blocks = (USABLE - 2 * per_gpu - reserve) // (16 * 80 * 1024)
    assert r.num_gpu_blocks == blocks == 30_108
    assert r.sessions[table.contexts.index(4096)] == blocks // 256 == 117
    assert r.sessions_per_gpu[table.contexts.index(4096)] == 117 / 4

    # tp=8 has one KV head per GPU: 40 KiB per token per GPU
    assert table.row("bf16", "bf16", 8).kv_bytes_per_token == 40 * 1024
    # int4 weights fit on a single H100: 68.45 B linear weights at half a byte + 2.1 B in bf16
    q = table.row("int4", "bf16", 1)
    assert q.fits and q.weight_bytes == 80 * layer // 2 + 2 * (2 * embed + 80 * 2 * 8192 + 8192)


def test_tp_beyond_kv_heads_replicates_kv() -> None:
    # Qwen2.5-7B has 4 KV heads: at tp=4 each GPU keeps one, and tp=2 halves them
    m = ModelSpec.from_name("qwen2.5-7b")
    g = GPUSpec.from_name("a100-80gb")
    rows = {tp: capacity_row(m, g, weight_dtype="bf16", kv_dtype="auto", tensor_parallel_size=tp) for tp in (1, 2, 4)}
    assert [rows[t].kv_bytes_per_token for t in (1, 2, 4)] == [2 * 28 * h * 128 * 2 for h in (4, 2, 1)]
    assert rows[4].kv_bytes_per_token_replica == rows[1].kv_bytes_per_token  # no replication up to the KV heads


def test_contexts_beyond_the_model_are_marked() -> None:
    t = capacity_table("mistral-7b", "l40s", contexts=[4096, 65536], weight_dtypes=["bf16"], kv_dtypes=["auto"],
                       tensor_parallel_sizes=[1])
    (r,) = t.rows
    assert r.sessions[1] is None and r.sessions[0] > 0  # Mistral's context is 32,768 tokens
    assert "-" in format_capacity(t).splitlines()[-4]


def test_default_tp_keeps_only_degrees_that_split_the_model() -> None:
    t = capacity_table("smollm2-135m", "l4", weight_dtypes=["bf16"], kv_dtypes=["auto"])
    assert sorted({r.tensor_parallel_size for r in t.rows}) == [1]  # 9 heads, 3 KV heads: 2, 4, 8 do not divide
    with pytest.raises(ValueError, match="does not split"):
        capacity_table("llama-3.1-8b", "h100", tensor_parallel_sizes=[3])


# ---- command line ---------------------------------------------------------------------------------------------
def test_capacity_command_table() -> None:
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "4096",
                                   "--context", "32768", "--tp", "1", "--tp", "2"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "KV per token (whole model): 128.0 KiB in bf16, 64.0 KiB in fp8" in out
    assert "16.06 GB in bf16" in out
    lines = [ln.split() for ln in out.splitlines()]
    row = next(ln for ln in lines if ln[:3] == ["bf16", "bf16", "1"])
    assert row[-2:] == ["109", "13"]  # sessions at 4k and 32k, as computed by hand above
    # 4 weight dtypes x 2 KV dtypes x 2 tp degrees
    assert sum(1 for ln in lines if len(ln) > 3 and ln[2] in ("1", "2") and ln[0] in ("bf16", "fp8", "int8", "int4")) \
        == 16


def test_capacity_command_json() -> None:
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4",
                                   "--weight-dtype", "bf16", "--kv-dtype", "auto", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["model"] == "llama-3.1-70b" and d["gpu"] == "h100-sxm"
    assert d["kv_bytes_per_token"]["bf16"] == 327_680
    (row,) = d["rows"]
    assert row["num_gpu_blocks"] == 30_108 and row["sessions"]["4096"] == 117


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "llama-9b", "--gpu", "h100"], "unknown model 'llama-9b'"),
        (["--model", "llama-3.1-8b", "--gpu", "tpu"], "unknown GPU 'tpu'"),
        # the names a vLLM user has at hand name their preset (it said "file not found" and no more)
        (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100"],
         "file not found: meta-llama/Llama-3.1-8B-Instruct; the preset for 'meta-llama/Llama-3.1-8B-Instruct' is "
         "'llama-3.1-8b'"),
        (["--model", "llama-3.1-8b", "--gpu", "NVIDIA H100 80GB HBM3"], "the preset for 'NVIDIA H100 80GB HBM3' is "
         "'h100-sxm'"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "3"], "tensor_parallel_size=3 does not split"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--kv-dtype", "int4"], "weight-only"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--weight-dtype", "fp4"], "unknown dtype 'fp4'"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--context", "0"], "context lengths must be >= 1"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    ],
)
def test_capacity_command_bad_input(args: list[str], needle: str) -> None:
    res = CliRunner().invoke(app, ["capacity", *args])
    assert res.exit_code == 2
    assert needle in res.stderr
    assert res.stderr.startswith("error: ") and "Traceback" not in res.output


@pytest.mark.parametrize(("args", "needle", "not_there"), [
    # a model accepted as given (case-insensitive) is not what the GPU's error is about: its hint took the GPU's place
    (["--model", "Llama-3.1-8B", "--gpu", "NVIDIA H100 80GB HBM3"], "the preset for 'NVIDIA H100 80GB HBM3' is "
     "'h100-sxm'", "Llama-3.1-8B"),
    # an error about neither (the split) named the GPU alias's preset as if it were the mistake
    (["--model", "llama-3.1-8b", "--gpu", "H100", "--tp", "3"], "tensor_parallel_size=3 does not split",
     "the preset for"),
])
def test_capacitys_preset_hint_is_for_the_name_that_failed(args: list[str], needle: str, not_there: str) -> None:
    res = CliRunner().invoke(app, ["capacity", *args])
    assert res.exit_code == 2 and needle in res.stderr and not_there not in res.stderr, res.stderr


def test_a_model_typo_is_told_its_preset_once(tmp_path: Path) -> None:
    # Before: "unknown model 'llama3-8b'; did you mean 'llama-3-8b'? presets: ...; the preset for 'llama3-8b' is
    # 'llama-3-8b'", in capacity and in a scenario's deployment.model alike
    res = CliRunner().invoke(app, ["capacity", "--model", "llama3-8b", "--gpu", "h100-sxm"])
    assert res.exit_code == 2 and res.stderr.count("'llama-3-8b'") == 1, res.stderr
    path = tmp_path / "typo.yaml"
    path.write_text("name: t\nworkload: {arrival: {type: poisson, rate: 1}, num_requests: 2, prompt_len: {type: fixed, value: 8}, output_len: {type: fixed, value: 2}}\ndeployment: {model: llama3-8b}\n")
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and res.stderr.count("'llama-3-8b'") == 1, res.stderr


def test_an_unknown_name_is_told_what_the_command_line_takes() -> None:
    # Before: "(or use ModelSpec.from_hf_config with a config.json)" and "(or GPUSpec.from_dict)": Python calls a
    # command-line user cannot make, where --model takes a config.json path
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-99", "--gpu", "h100-sxm"])
    assert res.exit_code == 2 and "(or a config.json path, or the folder holding one)" in res.stderr, res.stderr
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "tpu-v9"])
    assert res.exit_code == 2 and "a mapping of GPUSpec's fields" in res.stderr and ".from_" not in res.stderr


def test_a_context_given_twice_is_one_column() -> None:
    # Before: --context 4096 --context 4096 printed two @4k columns (and two KV-per-session cells), where a repeated
    # --tp or dtype is one row.
    twice = capacity_table("llama-3.1-8b", "h100-sxm", contexts=[4096, 4096, 1024], weight_dtypes=["bf16"],
                           kv_dtypes=["auto"], tensor_parallel_sizes=[1])
    once = capacity_table("llama-3.1-8b", "h100-sxm", contexts=[4096, 1024], weight_dtypes=["bf16"],
                          kv_dtypes=["auto"], tensor_parallel_sizes=[1])
    assert twice.contexts == once.contexts == (4096, 1024) and format_capacity(twice) == format_capacity(once)


def test_gpus_with_pp_keeps_the_splits_of_those_stages() -> None:
    # Before: --gpus 4 --pp 2 printed the pp 4, 2 and 1 splits, --pp ignored (a --tp beside --gpus filters), and
    # --gpus 4 --pp 3 printed them too instead of saying no split of 4 GPUs has 3 stages.
    t = capacity_table("llama-3.1-8b", "h100-sxm", contexts=[4096], weight_dtypes=["bf16"], kv_dtypes=["auto"],
                       pipeline_parallel_sizes=[2], num_gpus=4)
    assert [(r.tensor_parallel_size, r.pipeline_parallel_size) for r in t.rows] == [(2, 2)]
    with pytest.raises(ValueError, match=r"no tp x pp split of 4 GPUs with pp in \[3\] suits llama-3\.1-8b"):
        capacity_table("llama-3.1-8b", "h100-sxm", contexts=[4096], pipeline_parallel_sizes=[3], num_gpus=4)


def test_wide_context_labels_and_session_counts_keep_their_columns_apart() -> None:
    # Before: `servesim capacity --model llama-3.2-1b --gpu l4 --context 4096 --context 200000` printed
    # "KV per session:       4k tok200,000 tok" and "@4k@200,000": a label wider than its column ran into the one
    # before; a session count of 8 characters and more (1,000,000) likewise
    table = capacity_table("llama-3.2-1b", "h200", contexts=[4096, 200_000, 16, 1], weight_dtypes=["int4"],
                           kv_dtypes=["fp8"], tensor_parallel_sizes=[8])
    lines = format_capacity(table).splitlines()
    (kv,) = [ln for ln in lines if ln.startswith("KV per session:")]
    assert kv.split()[3:] == ["4k", "tok", "200,000", "tok", "16", "tok", "1", "tok"]
    (head,) = [ln for ln in lines if ln.startswith("weights kv")]
    (row,) = [ln for ln in lines if ln.startswith("int4")]
    assert head.split()[-4:] == ["@4k", "@200,000", "@16", "@1"]
    (r,) = table.rows
    assert len(f"{r.sessions[3]:,}") >= 8  # as wide as the old 8-character column: no space before it
    assert row.split()[-4:] == [f"{r.sessions[0]:,}", "-", f"{r.sessions[2]:,}", f"{r.sessions[3]:,}"]
    # right-aligned under their labels
    def ends(line: str) -> list[int]:
        return [m.end() for m in re.finditer(r"\S+", line)][-4:]

    assert ends(row) == ends(head)


def test_a_kv_per_session_wider_than_its_label_keeps_its_column_apart() -> None:
    # Before: the KV-per-session columns were as wide as their labels only; at 40960k tokens llama-3.1-405b's
    # "20160.0 GiB" is wider than "40960k tok" and ran into the cell before it: "504.0 MiB20160.0 GiB"
    table = capacity_table("llama-3.1-405b", "h200", contexts=[1024, 41_943_040], weight_dtypes=["bf16"],
                           kv_dtypes=["auto"], tensor_parallel_sizes=[8])
    lines = format_capacity(table).splitlines()
    (row,) = [ln for ln in lines if ln.startswith("  bf16")]
    assert row.split() == ["bf16", "504.0", "MiB", "20160.0", "GiB"]


@pytest.mark.parametrize(("args", "said"), [
    (["--context", "4k"], "Invalid value for '--context': '4k' is not a whole number: give it in digits, 4096 or 4000 "
     "(no k or m); repeat --context for several"),
    (["--context", "1024,4096"], "'1024,4096' is not a whole number: give a whole number in digits; several are "
     "given by repeating it: --context 1024 --context 4096"),
    (["--tp=x"], "Invalid value for '--tp': 'x' is not a whole number: give a whole number in digits"),
    (["--gpu-memory-utilization", "90%"], "'90%' is not a number: give a number in digits (with a decimal point, no "
     "% or unit)")])
def test_a_size_option_says_what_it_read_and_the_forms_it_takes(args: list[str], said: str) -> None:
    """typer answered `--context 4k` (the table's own heading) with "Input should be a valid integer, unable to parse
    string as an integer": neither the value nor what is taken."""
    res = CliRunner().invoke(app, ["capacity", "--model", "tiny", "--gpu", "h100", *args])
    assert res.exit_code == 2 and said in " ".join(res.stderr.split()) and "Traceback" not in res.stderr, res.stderr
