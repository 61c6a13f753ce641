"""Sections of docs/ pages written from the code (the scenario keys, the GPU presets): each lies between two marker
comments, is rewritten by its module's ``--update``, and a test fails when the page and the code part."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def with_section(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with what lies between ``begin`` and ``end`` replaced by ``body``, or, with no markers yet, the
    markers and ``body`` appended."""
    head, sep, rest = text.partition(begin)
    tail = rest.partition(end)[2] if sep else "\n"
    return head.rstrip("\n") + "\n\n" + "\n".join([begin, body, end]) + tail


def update(page: Path, begin: str, end: str, body: str) -> None:
    page.write_text(with_section(page.read_text(encoding="utf-8"), begin, end, body), encoding="utf-8")
