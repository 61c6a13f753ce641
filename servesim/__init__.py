"""servesim's Python API: run a scenario, read a run folder back, compare two runs.

    import servesim
    res = servesim.run("scenarios/naive-vs-continuous.yaml", num_requests=100)
    print(res.table())

A scheduling policy of one's own subclasses ``servesim.Policy`` (see :mod:`sim.policies.api` and
docs/write-a-policy.md) and is named in a scenario by ``policy: {type: custom, cls: "my_policies.py:MyPolicy"}``.
``servesim.evaluate(policy, scenario, seeds=...)`` scores one (an object, a class or source text) for a search
loop, its failures returned as scores (:mod:`sim.studies.evaluate`).

See :mod:`sim.api` for the details; the simulator itself lives in the ``sim`` package.
"""

import sys as _sys  # not servesim.sys: dir(servesim) is the API

try:
    from sim import __version__
    from sim.api import Comparison, Results, RunFolderError, ScenarioError, compare, load, run
    from sim.studies.evaluate import Scores, WorkloadCache, evaluate
    from sim.policies.api import Budget, KVView, Limits, Plan, Policy, PolicyView, RequestView
    from sim.policies.gates import Admission, AdmissionState, ReplicaView, Router, TokenBucket
    from sim.policies.queue import QueuePolicy
    from sim.policies.user import PolicyError
except KeyboardInterrupt:
    if _sys.argv[:1] != ["-m"]:  # imported by a program (or a notebook): the Ctrl-C is its own to handle
        raise
    # `python -m servesim ...`: Python imports this package, seconds of imports on a busy machine, before the
    # command's own guarded ones (sim/cli/main.py); a Ctrl-C here printed a traceback where they print one line
    from sim.cli.starting import STARTING

    _sys.stderr.write(f"\ninterrupted {STARTING}\n")
    raise SystemExit(130) from None

__all__ = ["Admission", "AdmissionState", "Budget", "Comparison", "KVView", "Limits", "Plan", "Policy", "PolicyError",
           "PolicyView", "QueuePolicy", "ReplicaView", "RequestView", "Results", "Router", "RunFolderError",
           "ScenarioError", "Scores", "TokenBucket", "WorkloadCache", "__version__", "compare", "evaluate", "load",
           "run"]
