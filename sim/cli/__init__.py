"""The servesim command: a thin typer layer (main.py) over plain functions, with serve and observe in live.py.

``sim.cli.app`` still names the command for an install made before the command moved into ``sim.cli.main``; it
is looked up on first use so that importing ``sim.cli.common`` does not build the whole command.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from sim.cli.main import app
        return app
    raise AttributeError(name)
