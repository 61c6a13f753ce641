"""``python -m servesim``: the servesim command, as the installed ``servesim`` script runs it."""

from sim.cli.main import app

app(prog_name="servesim")
