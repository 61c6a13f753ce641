"""The servesim command: a thin typer layer (main.py) over plain functions, with serve and observe in live.py.

``sim.cli.app`` still names the command for an install made before the command moved into ``sim.cli.main``; it
is looked up on first use so that importing ``sim.cli.common`` does not build the whole command.
"""

import sys
from typing import Any

STARTING = "while starting; nothing was written"  # what a Ctrl-C in the command's imports stopped


def interrupted_while_starting(_signum: int = 0, _frame: Any = None) -> None:
    """Ctrl-C before the command runs (its imports, its declarations): one line and exit 130, no traceback."""
    sys.stderr.write(f"\ninterrupted {STARTING}\n")
    raise SystemExit(130)


def __getattr__(name: str) -> Any:
    if name == "app":
        from sim.cli.main import app
        return app
    raise AttributeError(name)
