"""servesim's Python API: run a scenario, read a run folder back, compare two runs.

    import servesim
    res = servesim.run("scenarios/naive-vs-continuous.yaml", num_requests=100)
    print(res.table())

See :mod:`sim.api` for the details; the simulator itself lives in the ``sim`` package.
"""

from sim import __version__
from sim.api import Comparison, Results, RunFolderError, ScenarioError, compare, load, run

__all__ = ["Comparison", "Results", "RunFolderError", "ScenarioError", "__version__", "compare", "load", "run"]
