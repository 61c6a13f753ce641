"""Every notebook (``notebooks/*.py``, jupytext percent format) runs top to bottom without a cell error.

The notebooks run in a Jupyter kernel started from this very interpreter, on their smallest settings
(``SERVESIM_NOTEBOOK_FAST=1``). The kernel spec is written to a temporary folder at the front of JUPYTER_PATH
under a name of its own, so that neither a missing ``python3`` spec (a fresh venv) nor a user's ``python3`` spec
pointing at another interpreter changes what runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from nbclient.exceptions import CellExecutionError  # noqa: E402

from sim.studies.teaching import FAST_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
KERNEL = "servesim-test-python"
CELL_TIMEOUT = 120  # seconds; the notebooks take a few seconds each on fast settings


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "servesim tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", os.pathsep.join([str(spec_dir.parent.parent), os.environ.get("JUPYTER_PATH", "")]))
    mp.setenv(FAST_ENV, "1")
    # the kernel imports sim from this checkout even where the package is not installed
    mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiets a debugger warning on kernel start
    yield KERNEL
    mp.undo()


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/*.py found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_name: str):
    text = path.read_text(encoding="utf-8")
    assert "# %%" in text, f"{path.name} is not in jupytext percent format"
    nb = jupytext.reads(text, fmt="py:percent")
    assert any(c.cell_type == "markdown" for c in nb.cells) and any(c.cell_type == "code" for c in nb.cells)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:  # a hung cell fails at CELL_TIMEOUT; how fast they run is no test's business on a loaded machine
        client.execute()
    except CellExecutionError as e:  # the message holds the cell's source and traceback
        pytest.fail(f"{path.name}: a cell failed:\n{e}", pytrace=False)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
