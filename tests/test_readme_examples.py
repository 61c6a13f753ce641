"""The examples of the README and of the pages in ``docs/`` are executed (each page but ``write-a-policy.md``,
whose blocks build on each other and run in order in tests/test_write_a_policy_doc.py): every command in a fenced
block that starts with ``servesim`` (or
``.venv/bin/servesim``, also after ``&&`` in a set-up line) and every ``python`` block. An example that stops working
fails here.

Each fenced block runs top to bottom in one scratch folder (so ``servesim compare`` finds the folders the commands
before it wrote) that links the checkout's ``scenarios/`` and ``calibration/scenarios/`` and holds a copy of
``calibration/profiles/`` (so ``servesim calibrate --out calibration/profiles/...`` never overwrites the shipped
profile). A command that takes ``--num-requests`` and gives none gets ``--num-requests N`` appended, N from
``SERVESIM_README_NUM_REQUESTS`` (default 40), and ``calibrate`` gets ``--repeats 1``; the README says so.
Commands that need a GPU, and commands shown on the reader's own files (``PLACEHOLDERS``), are skipped with the
reason named; commands that need torch skip where it is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import servesim

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the pages whose blocks stand alone: the README and every page of docs/ but the walk-through tested on its own
PAGES = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "write-a-policy.md")]
NUM_REQUESTS = os.environ.get("SERVESIM_README_NUM_REQUESTS", "40")
TIMEOUT = 600  # seconds per command; a hang fails, how fast they run is not this test's business
# subcommands that take --num-requests (the fast override)
TAKES_NUM_REQUESTS = {("run",), ("sweep",), ("plan",), ("validate",), ("engine", "run")}
NEEDS_TORCH = {"engine", "calibrate", "validate"}  # they run the real engine


@dataclass
class Block:
    line: int  # the page's line of the opening fence
    lang: str
    text: str
    commands: list[tuple[int, list[str]]] = field(default_factory=list)  # (page line, argv after `servesim`)
    page: str = "README.md"  # the file it is in, relative to the repository root


def fenced_blocks(text: str) -> list[Block]:
    """Every ```-fenced block of a Markdown text, with its info string."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(Block(start, m.group(1).lower(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def servesim_commands(block: Block) -> list[tuple[int, list[str]]]:
    """The ``servesim`` commands of a shell block: each line split on ``&&``, the parts that start with
    ``servesim`` or ``.venv/bin/servesim``, as argv after the program name."""
    out = []
    for k, line in enumerate(block.text.splitlines()):
        for part in line.split("&&"):
            first = part.split()[:1]
            if first and first[0] in ("servesim", ".venv/bin/servesim"):  # output lines are not shell
                out.append((block.line + 1 + k, shlex.split(part, comments=True)[1:]))
    return out


def readme_blocks() -> list[Block]:
    out = []
    for page in PAGES:
        out += page_blocks(page)
    return out


def page_blocks(page: Path) -> list[Block]:
    """The runnable blocks of one Markdown page."""
    out = []
    for b in fenced_blocks(page.read_text(encoding="utf-8")):
        b.page = page.relative_to(ROOT).as_posix()
        if b.lang == "python":
            out.append(b)
        elif b.lang in ("", "sh", "bash", "shell", "console"):
            b.commands = servesim_commands(b)
            if b.commands:
                out.append(b)
    return out


def _subcommand(argv: list[str]) -> tuple[str, ...]:
    return tuple(argv[:2]) if argv[:1] == ["engine"] else tuple(argv[:1])


# Blocks that show the form of a command on the reader's own files (placeholders), by a file name they use.
PLACEHOLDERS = {
    "my-deployment.yaml": "runs on the reader's own scenario and `vllm bench serve` results (placeholder files)",
}


def skip_reason(block: Block) -> str | None:
    """Why a block cannot run here (None: it runs)."""
    for _, argv in block.commands:
        if "cuda" in argv and "--device" in argv:
            return "needs a CUDA GPU (--device cuda)"
        for name, reason in PLACEHOLDERS.items():
            if name in argv:
                return reason
    needs_torch = any(a[:1] and a[0] in NEEDS_TORCH for _, a in block.commands)
    if block.lang == "python":
        needs_torch = "realengine" in block.text or "calibration" in block.text
    if needs_torch and importlib.util.find_spec("torch") is None:
        return "needs torch (the engine extra), not installed"
    return None


def fast(argv: list[str]) -> list[str]:
    """argv with ``--num-requests N`` appended where the subcommand takes it and the README gives none, and
    ``--repeats 1`` for ``calibrate`` (one measured round over the grid instead of five)."""
    # validate --against simulates the files' own requests and refuses a count
    if _subcommand(argv) in TAKES_NUM_REQUESTS and not ({"-n", "--num-requests", "--against"} & set(argv)):
        return argv + ["--num-requests", NUM_REQUESTS]
    if argv[:1] == ["calibrate"] and "--repeats" not in argv:
        return argv + ["--repeats", "1"]
    return argv


def scratch(tmp_path: Path) -> Path:
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "scenarios").symlink_to(ROOT / "calibration" / "scenarios")
    shutil.copytree(ROOT / "calibration" / "profiles", tmp_path / "calibration" / "profiles")
    return tmp_path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # the checkout's code, whatever is installed; the scratch folder is the working directory
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


BLOCKS = readme_blocks()


def _param(b: Block):
    reason = skip_reason(b)
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param(b, marks=marks, id=f"{b.page}:{b.line}-{b.lang or 'shell'}")


def test_the_readme_has_examples():
    """The extraction finds what the README and the pages show, so an empty parse cannot pass."""
    argvs = [a for b in BLOCKS for _, a in b.commands]
    assert ["run", "scenarios/naive-vs-continuous.yaml", "--out", "runs/naive-vs-continuous"] in argvs
    assert any(a[:1] == ["compare"] for a in argvs)
    assert any(b.lang == "python" and "servesim.run(" in b.text for b in BLOCKS)
    # the main job stays in the README, the examples that moved to docs/ are still found there
    assert any(b.page == "README.md" and ["run", "scenarios/naive-vs-continuous.yaml", "--out",
                                          "runs/naive-vs-continuous"] in [a for _, a in b.commands] for b in BLOCKS)
    pages = {b.page for b in BLOCKS}
    assert {"docs/running.md", "docs/python-api.md", "docs/calibration-and-validation.md"} <= pages, pages


def test_fast_override():
    assert fast(["run", "x.yaml"]) == ["run", "x.yaml", "--num-requests", NUM_REQUESTS]
    assert fast(["run", "x.yaml", "-n", "5"]) == ["run", "x.yaml", "-n", "5"]
    assert fast(["engine", "run", "x.yaml"])[-2:] == ["--num-requests", NUM_REQUESTS]
    assert fast(["calibrate", "--device", "cpu"]) == ["calibrate", "--device", "cpu", "--repeats", "1"]
    assert fast(["compare", "a", "b"]) == ["compare", "a", "b"]


def test_no_example_overwrites_a_shipped_profile():
    """A reader who copies an example into a checkout must not overwrite a shipped profile (the scratch folder
    above hides that from the runs): `calibrate --out` names a file of the reader's own."""
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "calibration" / "profiles").glob("*.json")}
    pages = [*PAGES, ROOT / "calibration" / "README.md"]
    clobbers = [f"{b.page}:{line}" for page in pages for b in page_blocks(page) for line, argv in b.commands
                if argv[:1] == ["calibrate"] and {a for k, a in enumerate(argv[1:]) if argv[k] in ("--out", "-o")}
                & shipped]
    assert not clobbers, clobbers


@pytest.mark.slow
@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_readme_example_runs(block: Block, tmp_path: Path):
    cwd = scratch(tmp_path)
    if block.lang == "python":  # a script of the reader's: a fresh interpreter, as they would run it
        steps = [(block.line, "the python block",
                  lambda: subprocess.run([sys.executable, "-c", block.text], cwd=cwd, env=_env(), capture_output=True,
                                         text=True, timeout=TIMEOUT))]
    else:  # servesim's commands in this process (tests/conftest.py's servesim(): exit status, stdout, stderr and a
        # traceback as a process gives them), without an interpreter and imports to pay for each
        steps = [(line, " ".join(fast(argv)), lambda argv=argv: servesim(*fast(argv), cwd=cwd, timeout=TIMEOUT))
                 for line, argv in block.commands]
    for line, shown, call in steps:
        p = call()
        assert p.returncode == 0, (f"{block.page}:{line}: `servesim {shown}` exited {p.returncode}\n"
                                   f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
        assert "Traceback" not in p.stderr, f"{block.page}:{line}: {p.stderr[-3000:]}"
