"""docs/write-a-policy.md cannot rot: its code blocks run here, in order, in one folder, as a reader runs them.

A ``python`` or ``yaml`` block whose first line is ``# name.py`` or ``# name.yaml`` is a file the reader saves;
every other ``python`` block is part of one script, run with this interpreter; each ``servesim ...`` line of a
``bash`` block is run as the command line (in this process: tests/conftest.py's servesim()). The policy the page
shows is the example file itself, and the error it quotes is the one a misspelt class gives."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.conftest import servesim

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "write-a-policy.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```\n", re.S | re.M)
FILE = re.compile(r"# ([\w.-]+\.(?:py|yaml))\n")


def _blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text())


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_the_pages_code_runs(tmp_path: Path) -> None:
    script, commands = [], []
    kinds = [k for k, _ in _blocks()]
    assert kinds.count("python") >= 4 and kinds.count("yaml") >= 2 and kinds.count("bash") >= 2
    for kind, body in _blocks():
        m = FILE.match(body)
        if kind in ("python", "yaml") and m:
            (tmp_path / m.group(1)).write_text(body)
        elif kind == "python":
            script.append(body)
        elif kind == "bash":
            commands += [line for line in body.splitlines() if line.startswith("servesim ")]
    for line in commands:  # in this process (tests/conftest.py's servesim()), as tests/test_readme_examples.py runs
        # the other pages' commands: a process each paid an interpreter and the imports, none of it about the page
        p = servesim(*shlex.split(line)[1:], "-q", cwd=tmp_path)
        assert p.returncode == 0, f"{line}\n{p.stderr}"
    (tmp_path / "script.py").write_text("\n\n".join(script))
    p = _run([sys.executable, "script.py"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "short-ahead" in p.stdout  # the QueuePolicy of section 3 ran beside the others
    assert (tmp_path / "runs" / "my-first-policy" / "summary.json").is_file()


def test_the_pages_policy_is_the_example_file() -> None:
    shown = next(body for kind, body in _blocks() if kind == "python" and body.startswith("# my_policy.py\n"))
    example = (ROOT / "examples" / "policies" / "shortest_prompt_first.py").read_text()
    code = shown.split("\n", 1)[1]
    assert code.split("\n\n\n", 1)[1] in example  # the class, line for line
    assert code.startswith("import servesim\n")


def test_the_quoted_error_is_what_a_misspelt_class_gives(tmp_path: Path) -> None:
    files = {m.group(1): body for kind, body in _blocks() if (m := FILE.match(body))}
    for name in ("my_policy.py", "my_scenario.yaml"):
        (tmp_path / name).write_text(files[name])
    sc = tmp_path / "my_scenario.yaml"
    sc.write_text(sc.read_text().replace(":ShortestPromptFirst", ":ShortestPromptFist"))
    quoted = next(body for kind, body in _blocks() if kind == "text" and "ShortestPromptFist" in body).strip()
    p = servesim("run", "my_scenario.yaml", "-q", "--out", "out", cwd=tmp_path)
    assert p.returncode == 2 and quoted in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
