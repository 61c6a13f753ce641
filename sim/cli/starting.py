"""What a Ctrl-C before the command runs prints: shared by sim/cli/main.py and the servesim package (``python -m
servesim`` imports it first), in a module of its own that imports nothing, so that either reads it at no cost."""

from __future__ import annotations

import sys
from typing import Any

STARTING = "while starting; nothing was written"  # what a Ctrl-C in the command's imports stopped


def interrupted_while_starting(_signum: int = 0, _frame: Any = None) -> None:
    """Ctrl-C before the command runs (its imports, its declarations): one line and exit 130, no traceback."""
    sys.stderr.write(f"\ninterrupted {STARTING}\n")
    raise SystemExit(130)
