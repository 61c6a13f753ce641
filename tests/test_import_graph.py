"""No import circle in sim/, realengine/ or calibration/.

The graph is read from the source with ``ast``, nothing is imported. An edge A -> B is any import that runs:
module top level and inside functions or methods alike (a function-level import is a circle deferred, not
removed). Imports under ``if TYPE_CHECKING:`` are left out: they never run, so they cannot make a module's import
order matter, and they are how a type annotation may legitimately point up a layer. ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``).

A circle is a strongly connected component of more than one module. Run this file as a script to print every
circle with the imports that tie it: ``python tests/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "realengine", "calibration")

# Imports that close a circle not broken yet, each with why and who owns it. The test leaves these edges out
# before it looks for circles, and fails when one of them no longer closes a circle (remove it then), so the list
# only shrinks. Edges rather than a circle's members: a module added inside a known circle does not fail the test,
# a second edge back up does. (Issue 36's circle 5, sim.serving.core <-> sim.serving.fast_path <-> sim.serving.decode_group <->
# sim.policies.base, is not here: its back edges, fast_path -> core and decode_group -> fast_path, are
# TYPE_CHECKING-only today.)
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}  # none left: every circle of issue 36 is broken


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node`` except those in the body of ``if TYPE_CHECKING:`` (its else still runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _runtime_imports(ast.Module(body=[sub], type_ignores=[]))
        else:
            yield from _runtime_imports(child)


def _targets(mod: str, path: Path, imp: ast.Import | ast.ImportFrom, mods: dict[str, Path]) -> Iterator[str]:
    if isinstance(imp, ast.Import):
        for alias in imp.names:
            # `import a.b.c` runs a, a.b and a.b.c; the deepest one we own is the edge that matters.
            parts = alias.name.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in mods:
                    yield ".".join(parts[:i])
                    break
        return
    if imp.level:
        pkg_parts = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        base_parts = pkg_parts[: len(pkg_parts) - (imp.level - 1)]
        base = ".".join(base_parts + ([imp.module] if imp.module else []))
    else:
        base = imp.module or ""
    for alias in imp.names:
        sub = f"{base}.{alias.name}"
        if sub in mods:
            yield sub
        elif base in mods:
            yield base


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for imp in _runtime_imports(tree):
            for target in _targets(mod, path, imp, mods):
                if target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative: the graph is deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def _describe(comp: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = [f"  {a} -> {b}" for a in sorted(comp) for b in sorted(graph[a] & comp)]
    return "\n".join([", ".join(sorted(comp)), *edges])


def test_graph_sees_runtime_imports_only() -> None:
    """The reader itself: relative, function-level and TYPE_CHECKING imports are told apart."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from .c import thing\n"
        "if TYPE_CHECKING:\n"
        "    from .d import T\n"
        "else:\n"
        "    import pkg.e\n"
        "def f():\n"
        "    from pkg import sub\n"
    )
    mods = {m: Path(m) for m in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e", "pkg.sub")}
    tree = ast.parse(src)
    got = {t for imp in _runtime_imports(tree) for t in _targets("pkg.a", Path("pkg/a.py"), imp, mods)}
    assert got == {"pkg.b", "pkg.c", "pkg.e", "pkg.sub"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


def _reaches(graph: dict[str, set[str]], src: str, dst: str) -> bool:
    seen, todo = {src}, [src]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt == dst:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def test_no_import_circle() -> None:
    graph = import_graph()
    stale = [e for e in KNOWN_BACK_EDGES if e[1] not in graph.get(e[0], set()) or not _reaches(graph, e[1], e[0])]
    assert not stale, f"no longer closes a circle, remove it from KNOWN_BACK_EDGES: {stale}"
    pruned = {m: targets - {b for a, b in KNOWN_BACK_EDGES if a == m} for m, targets in graph.items()}
    found = circles(pruned)
    assert not found, "import circle(s):\n" + "\n".join(_describe(c, graph) for c in found)


if __name__ == "__main__":
    g = import_graph()
    for comp in circles(g):
        print(_describe(comp, g), end="\n\n")
    sys.exit(0)


def test_no_package_imports_a_private_name_of_another() -> None:
    """calibration/ imported sim.config.files._sigint_deferred: a name its own module may change without looking
    for callers. What one top-level package uses of another is public (no leading underscore)."""
    found = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            top = node.module.partition(".")[0] if isinstance(node, ast.ImportFrom) and node.module else ""
            if isinstance(node, ast.ImportFrom) and node.level == 0 and top in PACKAGES \
                    and top != mod.partition(".")[0]:
                found += [f"{mod}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
