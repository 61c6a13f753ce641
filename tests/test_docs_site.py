"""docs/ builds as a site with MkDocs in strict mode (mkdocs.yml): every page in the nav, every link between pages
and every #anchor resolving. tests/test_docs_links.py checks the same links without MkDocs, the README's too."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                reason="needs mkdocs (the test extra)")


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=120)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    p = _build(ROOT, tmp_path / "site")
    assert p.returncode == 0, p.stderr[-3000:]
    built = {q.parent.name for q in (tmp_path / "site").glob("*/index.html")}
    assert {page.stem for page in (ROOT / "docs").glob("*.md")} <= built


def test_strict_mode_fails_on_a_broken_anchor(tmp_path: Path) -> None:
    """The build above would pass a broken link if MkDocs only noted it: plant one and see the build fail."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "running.md"
    page.write_text(page.read_text() + "\nSee [nowhere](scenarios.md#no-such-heading).\n")
    p = _build(tmp_path, tmp_path / "site")
    assert p.returncode != 0
    assert "no-such-heading" in p.stderr
