"""Compile the serving core's hot modules with mypyc into a copy of the package, out of the tree (issue 40, item 4:
is a compiled hot loop worth shipping?). The checkout is not touched; the pure-Python package stays the reference.

    python benchmarks/mypyc_trial.py BUILD_DIR [MODULE.py ...]
    PYTHONPATH=BUILD_DIR python benchmarks/bench_azure_conv.py --requests 30000   # compiled
    PYTHONPATH=.         python benchmarks/bench_azure_conv.py --requests 30000   # pure, alternate the two

Needs mypy (the test extra; mypyc ships with it) and a C compiler. BUILD_DIR is replaced. The copy differs from the
source where mypyc needs it: the hot ``AnalyticCostModel`` and ``ContinuousPolicy`` lose their ``typing.Protocol``
base (a native class subclassing a Protocol with default methods fails at import: "attribute '__dict__' of 'type'
objects is not writable") and keep their ClassVars on a plain base class (a native dataclass takes a ClassVar for a
field); the classes that cannot be native get ``@mypyc_attr(native_class=False)`` (exceptions, any other Protocol
subclass, and the frozen records built through ``unfrozen_twin``, whose ``__class__`` assignment needs
``__slots__``). Outputs are compared with ``diff -r`` of two run folders (docs/benchmarks.md says what was compared
and what differs). Not part of the test suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the modules a cProfile of bench_azure_conv puts 88% of the simulation's own time in, and the request states
HOT = ["sim/serving/fast_path.py", "sim/serving/core.py", "sim/serving/block_manager.py", "sim/costs/analytic.py",
       "sim/loop/simulator.py", "sim/policies/continuous.py", "sim/serving/decode_group.py",
       "sim/metrics/records.py", "sim/serving/request.py", "sim/serving/kv_manager.py"]
# classes mypyc must leave as ordinary Python classes (see the docstring)
NOT_NATIVE = re.compile(
    r"^((?:@dataclass[^\n]*\n)?class (?:\w+\((?:CostModel|Policy|RuntimeError|ValueError|Exception)\)"
    r"|RequestRecord|RequestSpec):)", re.M)
# hot classes made native by dropping their Protocol base (structural typing is enough for mypy, and each defines
# every member the core reads); their ClassVars move to a plain base class, since mypyc's native dataclasses take a
# ClassVar for a field (the generated __init__ fails: "attribute 'decode_all_when_idle' is read-only")
NATIVE = {"AnalyticCostModel": "CostModel", "ContinuousPolicy": "Policy"}
CLASSVAR = re.compile(r"^    \w+: ClassVar\[.*$\n", re.M)


def make_native(text: str, name: str, base: str) -> str:
    """``text`` with class ``name``'s ``base`` dropped and its ClassVars moved to a base class of their own."""
    header = f"class {name}({base}):\n"
    start = text.index(header)
    deco = text.rfind("\n\n", 0, start) + 2  # the decorators above the class
    end = m.start() if (m := re.compile(r"^\S", re.M).search(text, start + len(header))) else len(text)
    body = text[start + len(header):end]
    classvars = "".join(CLASSVAR.findall(body))
    if not classvars:
        return text[:start] + f"class {name}:\n" + text[start + len(header):]
    flags = f"_{name}ClassVars"
    return (text[:deco] + f"class {flags}:\n{classvars}\n\n" + text[deco:start] + f"class {name}({flags}):\n"
            + CLASSVAR.sub("", body) + text[end:])


def prepare(build: Path, modules: list[str]) -> None:
    """Copy ``sim`` and ``servesim`` into ``build`` and mark the classes that must stay non-native."""
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    for pkg in ("sim", "servesim"):
        shutil.copytree(ROOT / pkg, build / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for mod in modules:
        path = build / mod
        text = path.read_text()
        for name, base in NATIVE.items():
            if f"class {name}({base}):" in text:
                text = make_native(text, name, base)
        text, n = NOT_NATIVE.subn(r"@mypyc_attr(native_class=False)\n\1", text)
        if n:
            head = "\nfrom __future__ import annotations\n"
            text = text.replace(head, head + "from mypy_extensions import mypyc_attr\n", 1)
        path.write_text(text)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    build = Path(sys.argv[1]).resolve()
    modules = sys.argv[2:] or HOT
    prepare(build, modules)
    mypyc = Path(sys.executable).with_name("mypyc")
    env = {**os.environ, "PATH": f"{mypyc.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # an untyped generator (Replica._loop) draws mypy's annotation-unchecked note, which mypyc counts as an error
    subprocess.run([str(mypyc), "--disable-error-code", "annotation-unchecked", *modules], cwd=build, env=env,
                   check=True)


if __name__ == "__main__":
    main()
