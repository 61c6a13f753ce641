"""``python -m sim.cli``: the servesim command."""

from sim.cli.main import app

app()
