"""Notebook figures render where a notebook is read without running it (GitHub, nbviewer, a PDF export):
``python -m servesim.notebooks`` builds ``notebooks/NAME.ipynb`` from ``notebooks/NAME.py`` with the very cells of
its source and a static PNG beside every plotly figure (plotly's JSON alone is blank there). The built notebooks
stay out of git; this test builds one, where kaleido and Chromium are installed."""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")

ROOT = Path(__file__).resolve().parent.parent
PLOTLY = "application/vnd.plotly.v1+json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def _figure_outputs(nb) -> list[dict]:
    return [o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if PLOTLY in o.get("data", {}) or "image/png" in o.get("data", {})]


def _png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data)
    assert raw.startswith(PNG_MAGIC)
    return struct.unpack(">II", raw[16:24])  # the IHDR chunk: width, height


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.slow
def test_build_writes_a_png_beside_every_figure(tmp_path, monkeypatch):
    pytest.importorskip("kaleido", reason="kaleido (the test extra) is not installed")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if _chromium() is None and "BROWSER_PATH" not in os.environ:
        pytest.skip("no Chromium to draw the PNGs (Debian's chromium package; .ci/run installs it)")
    from servesim.notebooks import build

    # a kernel spec of this interpreter, as tests/test_notebooks.py makes one
    spec = tmp_path / "jupyter" / "kernels" / "servesim-figures"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "servesim figures", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([str(tmp_path / "jupyter"), os.environ.get("JUPYTER_PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    source = ROOT / "notebooks" / "01_naive_vs_continuous.py"
    path = build(source, tmp_path / "out", fast=True, kernel_name="servesim-figures", timeout=300)
    nb = nbformat.read(str(path), as_version=4)
    figs = _figure_outputs(nb)
    assert len(figs) >= 3
    for data in figs:
        assert PLOTLY in data and "image/png" in data  # interactive where JavaScript runs, a PNG everywhere
        assert _png_size(data["image/png"])[0] == 1000
    assert _cells(nb) == _cells(jupytext.reads(source.read_text(encoding="utf-8"), fmt="py:percent"))


def test_build_retries_once_past_kaleido_page_race_only(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    from servesim import notebooks

    calls = []

    def flaky(message):
        def execute(self):
            calls.append(message)
            if len(calls) == 1:
                raise nbclient.exceptions.CellExecutionError(message, "JavascriptError", message)
        return execute

    source = ROOT / "notebooks" / "01_naive_vs_continuous.py"
    monkeypatch.setattr(nbclient.NotebookClient, "execute", flaky("ReferenceError: kaleido_scopes is not defined"))
    assert notebooks.build(source, tmp_path / "a").is_file() and len(calls) == 2  # the race: one more try
    calls.clear()
    monkeypatch.setattr(nbclient.NotebookClient, "execute", flaky("NameError: name 'x' is not defined"))
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        notebooks.build(source, tmp_path / "b")  # the notebook's own error: no retry
    assert len(calls) == 1
