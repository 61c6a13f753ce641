"""A count with its noun in the right number, for the messages and lines servesim prints: "1 request", "2
requests" ("1 requests" was printed wherever a count could be one)."""

from __future__ import annotations


def counted(n: int | float, noun: str, plural: str | None = None, fmt: str = "") -> str:
    """``n`` (formatted by ``fmt``: "," adds thousands separators) and ``noun``, plural (``plural``, default
    noun + "s") unless n is 1."""
    return f"{n:{fmt}} {noun if n == 1 else plural or noun + 's'}"
