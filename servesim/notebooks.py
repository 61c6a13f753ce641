"""Build ``notebooks/NAME.ipynb`` from the jupytext sources ``notebooks/NAME.py``, executed, with every plotly
figure also stored as a static PNG, so the figures show where a notebook is read without running it (GitHub,
nbviewer, a PDF export): plotly's JSON output alone is blank there.

    python -m servesim.notebooks            # every notebook, on the notebooks' own settings
    python -m servesim.notebooks --fast 01_naive_vs_continuous --out /tmp/nb

Needs the ``notebooks`` extra (``pip install -e '.[notebooks]'``: jupytext, nbclient, ipykernel and kaleido,
which draws the PNGs in a headless Chromium; set ``BROWSER_PATH`` if Chromium is not on the PATH). The ``.py``
files are the source of truth and the only notebooks in git (the built ``.ipynb`` are ignored: outputs stay out of
version control; publish them where notebooks are read). ``tests/test_notebook_figures.py`` builds one and checks
that it holds its source's cells and an image beside every figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PNG_WIDTH = 1000  # pixels; the figures set their own heights

# Run first in the kernel and dropped from the written notebook: it makes every displayed figure carry a PNG
# beside its interactive JSON. One kaleido server (one Chromium) draws them all: 0.2 s a figure instead of 5.
_PRELUDE = f"""\
import kaleido
import plotly.io as pio
kaleido.start_sync_server(silence_warnings=True)
pio.renderers["png"].width = {PNG_WIDTH}
pio.renderers.default = "plotly_mimetype+png"
"""


def _browser_env() -> None:
    if "BROWSER_PATH" not in os.environ:
        for name in ("chromium", "chromium-browser", "google-chrome"):
            found = shutil.which(name)
            if found:
                os.environ["BROWSER_PATH"] = found
                return


def build(source: Path, out_dir: Path, *, fast: bool = False, kernel_name: str = "python3",
          timeout: int = 600) -> Path:
    """Execute one jupytext source and write ``out_dir/NAME.ipynb`` with its outputs; returns the path."""
    import jupytext
    import nbclient
    import nbformat

    from sim.studies.teaching import FAST_ENV

    nb = jupytext.reads(source.read_text(encoding="utf-8"), fmt="py:percent")
    prelude = nbformat.v4.new_code_cell(_PRELUDE)
    nb.cells.insert(0, prelude)
    _browser_env()
    saved = os.environ.get(FAST_ENV)
    os.environ[FAST_ENV] = "1" if fast else "0"
    try:
        for attempt in (1, 2):
            try:
                nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=timeout,
                                        resources={"metadata": {"path": str(source.parent)}}).execute()
                break
            except nbclient.exceptions.CellExecutionError as e:
                # kaleido 1.x (choreographer) can call into its page before the page's script has loaded when the
                # machine is busy ("kaleido_scopes is not defined"): seen twice in full test runs beside other heavy
                # jobs. A fresh kernel and Chromium get past it; any other error is the notebook's own.
                if attempt == 2 or "kaleido_scopes is not defined" not in str(e):
                    raise
    finally:
        if saved is None:
            os.environ.pop(FAST_ENV, None)
        else:
            os.environ[FAST_ENV] = saved
    nb.cells.pop(0)
    for i, cell in enumerate(nb.cells):  # stable ids and counts: a rebuild changes only what the outputs changed
        cell["id"] = f"cell-{i}"
        if cell.cell_type == "code":
            cell["execution_count"] = None
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = None
    nb.metadata.pop("widgets", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{source.stem}.ipynb"
    nbformat.write(nb, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m servesim.notebooks [--fast] [--out DIR] [NAME ...]``."""
    ap = argparse.ArgumentParser(prog="python -m servesim.notebooks", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="notebook names (default: every notebooks/*.py)")
    ap.add_argument("--out", type=Path, default=NOTEBOOKS, help="folder for the .ipynb files (default: notebooks/)")
    ap.add_argument("--fast", action="store_true", help="the test suite's smallest settings")
    ap.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
    args = ap.parse_args(argv)
    sources = sorted(NOTEBOOKS.glob("*.py"))
    if args.names:
        wanted = {n.removesuffix(".py") for n in args.names}
        unknown = wanted - {s.stem for s in sources}
        if unknown:
            print(f"error: no notebook {', '.join(sorted(unknown))} in {NOTEBOOKS}", file=sys.stderr)
            return 2
        sources = [s for s in sources if s.stem in wanted]
    try:
        import jupytext  # noqa: F401
        import kaleido  # noqa: F401
        import nbclient  # noqa: F401
    except ImportError as e:
        print(f"error: building notebooks needs the notebooks extra (pip install -e '.[notebooks]'): {e}",
              file=sys.stderr)
        return 2
    for s in sources:
        print(f"wrote {build(s, args.out, fast=args.fast, kernel_name=args.kernel)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
