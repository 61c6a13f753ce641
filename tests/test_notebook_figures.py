"""Notebook figures render where a notebook is read without running it (GitHub, nbviewer, a PDF export): each
``notebooks/NAME.py`` has a committed ``notebooks/NAME.ipynb`` built by ``python -m servesim.notebooks``, holding
the very cells of its source and a static PNG beside every plotly figure (plotly's JSON alone is blank there).
A second test builds one notebook afresh, where kaleido and Chromium are installed."""

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
SOURCES = sorted((ROOT / "notebooks").glob("*.py"))
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


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_committed_notebook_matches_its_source_and_has_images(source: Path):
    built = source.with_suffix(".ipynb")
    assert built.is_file(), f"{built.name} missing: run `python -m servesim.notebooks {source.stem}`"
    nb = nbformat.read(str(built), as_version=4)
    want = jupytext.reads(source.read_text(encoding="utf-8"), fmt="py:percent")
    assert _cells(nb) == _cells(want), (f"{built.name} is stale against {source.name}: rebuild it with "
                                         f"`python -m servesim.notebooks {source.stem}`")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    figs = _figure_outputs(nb)
    for data in figs:
        assert "image/png" in data, f"{built.name}: a plotly figure without its static PNG"
        w, h = _png_size(data["image/png"])
        assert w >= 600 and h >= 200
    if "fig" in source.read_text(encoding="utf-8"):
        assert figs, f"{built.name}: its source draws figures, the notebook holds none"


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
