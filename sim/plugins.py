"""Extensions that live in other packages: GPUs, engines, policies, routers and metrics added without editing
servesim.

A package declares an entry point in the group ``servesim.plugins`` (in its pyproject.toml:
``[project.entry-points."servesim.plugins"] my_gpus = "my_package.servesim_gpus"``); servesim imports each such
module once, the first time it needs a registry (a scenario read, a GPU or engine looked up, a run summarised),
and the module registers what it adds: ``sim.hardware.gpu.register_gpu``, ``sim.engines.registry.register_engine``,
``sim.metrics.registry.register_metric``. Policies and routers need no registry: a scenario names their class
(``policy: {type: custom, cls: "module:Class"}``). A plugin that fails to import is a ScenarioError naming it.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from sim.config.errors import ScenarioError

GROUP = "servesim.plugins"
_loaded: list[str] | None = None


def load_plugins() -> list[str]:
    """Import every ``servesim.plugins`` entry point once; the names loaded, in the order loaded."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _loaded = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            ep.load()
        except Exception as e:  # a plugin's own bug: one clear line naming it, not a traceback
            raise ScenarioError(f"servesim plugin {ep.name!r} ({ep.value}) failed to load: "
                                f"{type(e).__name__}: {e}") from None
        _loaded.append(ep.name)
    return _loaded
