"""Finding a user's class from a scenario's ``cls: "file.py:Class"`` or ``cls: "package.module:Class"``.

Resolved once, when the scenario is validated, so a missing file, a module that fails to import or a name that is
not a class is reported before anything runs, naming what is wrong. A file is loaded as a module of its own
(registered under a name derived from its path, so a process pool's workers find the same class).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import os
import re
import sys
import traceback
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from sim.config.errors import PASS_THROUGH


def exception_text(e: BaseException) -> str:
    """``raised Name: message`` for an exception from a user's code, or the ``sys.exit`` it called; never raises (a
    user's ``__str__`` may)."""
    if isinstance(e, SystemExit):
        # sys.exit inside a policy would end servesim itself, with that status and no word of why
        return f"called sys.exit({e.code!r})"
    try:
        text = str(e)
    except Exception:
        text = "(its message could not be formatted)"
    if isinstance(e, AttributeError) and "did you mean" not in text:
        text += _near_attribute(e)
    # an exception without a message (a bare assert, raise KeyboardInterrupt) read "raised AssertionError: "
    return f"raised {type(e).__name__}: {text}" if text else f"raised {type(e).__name__}"


def _near_attribute(e: AttributeError) -> str:
    """"; did you mean 'x'?" for a name the object lacks (``view.kv.free_blocks``), as Python's own traceback says it
    and the message servesim prints (``str(e)``) did not; "" when nothing is close."""
    import difflib

    name, obj = getattr(e, "name", None), getattr(e, "obj", None)
    if not isinstance(name, str) or obj is None:
        return ""
    try:
        names = [n for n in dir(obj) if isinstance(n, str) and not n.startswith("_")]
    except Exception:  # a user's object whose __dir__ raises: no hint
        return ""
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def unexpected_arg_hint(kind: Any, e: BaseException) -> str:
    """`` (X's constructor takes a, b; did you mean a?)`` for a constructor refusing an argument by name: Python's
    message named the base class a ``**kwargs`` forwarded it to (``QueuePolicy.__init__() got an unexpected keyword
    argument 'shrt'``), never the names that the user's class takes; "" for any other error."""
    import difflib

    m = re.search(r"unexpected keyword argument '([^']+)'", str(e)) if isinstance(e, TypeError) else None
    if m is None or not isinstance(kind, type):
        return ""
    names: list[str] = []
    for c in kind.__mro__:  # each __init__ down the chain its **kwargs forward to, until one takes no **kwargs
        if "__init__" not in vars(c) or c is object:
            continue
        try:
            params = inspect.signature(vars(c)["__init__"]).parameters.values()
        except (TypeError, ValueError):
            return ""
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name != "self" and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    close = difflib.get_close_matches(m[1], names, n=1)
    return (f" ({kind.__name__}'s constructor takes {', '.join(names) or 'no arguments'}"
            f"{f'; did you mean {close[0]}?' if close else ''})")


def file_digest(path: str | Path) -> str:
    """The SHA-1 of a file's bytes, what says a user's code was edited; "" when it cannot be read (deleted since)."""
    try:
        return hashlib.sha1(Path(path).read_bytes()).hexdigest()
    except OSError:  # deleted since: changed
        return ""


def _helpers(module: ModuleType, folder: str, new: set[str]) -> dict[str, tuple[str, str]]:
    """Module name -> (file, digest) of the Python modules under ``folder`` that ``module`` uses: those its import
    brought in (``new``) and those its names come from (``from helpers import key`` of one imported before)."""
    names = set(new)
    for v in list(vars(module).values()):
        try:
            names.add(v.__name__ if isinstance(v, ModuleType) else v.__module__)
        except Exception:  # noqa: BLE001, S112 - no module (an int), or a user's object that raises on asking
            continue
    out: dict[str, tuple[str, str]] = {}
    # servesim's own modules are never a user's helper (a policy kept at the repository's root imports them from
    # under its folder): reloading one would make its classes anew under the running simulator
    for n in sorted(x for x in names if isinstance(x, str) and x != module.__name__
                    and x.partition(".")[0] not in ("sim", "servesim", "realengine", "calibration")):
        f = getattr(sys.modules.get(n), "__file__", None)
        if isinstance(f, str) and f.endswith(".py") and str(Path(f).resolve()).startswith(folder + os.sep):
            out[n] = (f, file_digest(f))
    return out


def _run_source(module: ModuleType, path: str, source: bytes) -> None:
    """Run ``source`` (the bytes just read from ``path``) as ``module``'s code. Not through the import system's
    loader: it takes __pycache__'s bytecode when the file's mtime (whole seconds) and size are unchanged, so a file
    edited to the same length within a second of its last load ran its old code, while the digest, read from the
    new bytes, said it was the new one (tests/test_policy_api.py)."""
    exec(compile(source, path, "exec", dont_inherit=True), vars(module))  # noqa: S102 - the user's own file


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """A helper beside a policy file, imported from its bytes: the import system's own loader takes __pycache__'s
    bytecode while the source's mtime (whole seconds) and size are unchanged, so a helper edited to the same length
    within the second ran its old code in the next process that imported it (a sweep's worker, a new kernel)."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


def _import_from_sources(folder: str) -> None:
    """Modules in ``folder`` (a policy file's) import from their sources, not their bytecode (``_SourceLoader``):
    the finder of every sys.path entry that is that folder ("" for a notebook's working folder included)."""
    m = importlib.machinery
    for entry in sys.path:
        if isinstance(entry, str) and os.path.realpath(entry or os.curdir) == folder:
            sys.path_importer_cache[entry] = m.FileFinder(
                entry or os.curdir, (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES),
                (_SourceLoader, m.SOURCE_SUFFIXES), (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES))


def _module_from_file(path: Path) -> ModuleType:
    name = "servesim_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    try:
        source = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    digest = hashlib.sha1(source).hexdigest()
    loaded = sys.modules.get(name)
    # a file edited since it was loaded is loaded again: a notebook's kernel (or any process that runs twice) went on
    # running the first version of the policy, silently. So is one whose helper beside it was edited, the helper
    # reloaded first (`from helpers import key` kept the first key): only the edited ones, so nothing else is redone
    if loaded is not None:
        helpers: dict[str, tuple[str, str]] = vars(loaded).get("__servesim_helpers__", {})
        edited = [n for n, (f, h) in helpers.items() if file_digest(f) != h]
        if not edited and vars(loaded).get("__servesim_file_digest__") == digest:
            return loaded
        for n in edited:
            if n in sys.modules:
                try:
                    _run_source(sys.modules[n], helpers[n][0], Path(helpers[n][0]).read_bytes())
                except PASS_THROUGH:
                    raise
                except BaseException as e:
                    raise ValueError(f"{helpers[n][0]}: importing it {exception_text(e)}") from None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # its folder is importable, as `python my_policy.py` makes it: `from helpers import key` beside the file failed
    # with ModuleNotFoundError under the servesim command (whose sys.path holds its own bin folder, not the file's).
    # Appended, not put first: a file there named like an installed module (yaml.py) must not shadow it
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    _import_from_sources(folder)
    sys.modules[name] = module
    before = set(sys.modules)
    try:
        _run_source(module, spec.origin or str(path), source)
    except PASS_THROUGH:
        # Ctrl-C, the watchdog stopping an import that never returns (sim/policies/watchdog.py), a study's time budget
        raise
    except BaseException as e:  # not only Exception: sys.exit, GeneratorExit, a library's own BaseException
        del sys.modules[name]
        # spec.origin: the file's absolute path, as its frames name it (a relative path never matched them)
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == spec.origin]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise ValueError(f"{path}: importing it {exception_text(e)}{where}") from None
    # the digest covers the helpers beside it too: a sweep resumed after one was edited is refused as after an edit
    # of the file itself (configs.user_code)
    helpers = _helpers(module, folder, set(sys.modules) - before)
    vars(module)["__servesim_helpers__"] = helpers
    vars(module)["__servesim_file_digest__"] = digest
    vars(module)["__servesim_digest__"] = hashlib.sha1(
        " ".join([digest, *(h for _, h in helpers.values())]).encode()).hexdigest() if helpers else digest
    return module


def _near_file(path: Path) -> str:
    """``; did you mean good.py?`` for a file name of the folder close to the one not found (a typo, another case),
    "" when none is or the folder is not there either."""
    import difflib

    try:
        names = {f.name.lower(): f.name for f in path.parent.glob("*.py")} if path.parent.is_dir() else {}
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name.lower(), list(names), n=1, cutoff=0.7)
    return f"; did you mean {names[close[0]]}?" if close else ""


def load_class(spec: str) -> type:
    """The class ``spec`` names. Raises ValueError with the reason."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{spec!r}: expected 'path/to/file.py:ClassName' or 'package.module:ClassName'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            # a tournament spec's policies are relative to the spec, not to its scenario: "the scenario file" misled
            raise ValueError(f"{target}: file not found (a path is relative to the file that names it, a scenario or "
                             "a tournament spec; from the command line (--set, --sweep) or in a scenario given from "
                             f"Python as a dict, to the working folder){_near_file(path)}")
        module = _module_from_file(path)
    elif "/" in target or "\\" in target or target.startswith(".") or target.lower().endswith(".py"):
        # a path without .py (./my_policy, policies/mine, mine.Py): importing it as a module said "the 'package'
        # argument is required to perform a relative import", and the hint made 'mine.Py' into 'mine/Py.py'
        stem = target[:-3] if target.lower().endswith(".py") else target.rstrip("/\\")
        raise ValueError(f"{target}: not a module name; a file of your own is named by its path, ending in .py: "
                         f"'{stem}.py:{name}'")
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            if e.name is not None and e.name != target and not target.startswith(e.name + "."):
                # the module is there and its own import of another failed: "no such module" sent the user to
                # look for a file that exists
                raise ValueError(f"{target}: importing it {exception_text(e)}") from None
            # "policies:Mine" for the policies.py beside the scenario (vLLM's --scheduler-cls takes a module path):
            # the message named no other way
            raise ValueError(f"{target}: no such module ({e}); a file of your own is named by its path: "
                             f"'{target.replace('.', '/')}.py:{name}'") from None
        except PASS_THROUGH:
            raise
        except BaseException as e:
            raise ValueError(f"{target}: importing it {exception_text(e)}") from None
    obj = getattr(module, name, None)
    if obj is None:
        found = sorted(k for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        # __main__ is the script or notebook that called servesim.run; on the command line it is servesim itself
        where = (" (__main__ names a class of the Python script or notebook running servesim.run; from the command "
                 "line name the file that defines it, 'my_policy.py:Class')") if target == "__main__" else ""
        raise ValueError(f"{target} has no {name!r} (its classes: {', '.join(found) or 'none'}){where}")
    if not isinstance(obj, type):
        what = type(obj).__name__  # "is a int" read wrong
        raise ValueError(f"{target}:{name} is {'an' if what[:1].lower() in 'aeiou' else 'a'} {what}, not a class")
    return obj


# Annotations a YAML value can be checked against exactly: a scalar, None, a Literal, or a union of them. A
# container (tuple[int, ...] from a YAML list) or a class of the user's is left to the constructor.
_SCALARS = (int, float, bool, str, type(None))


def _checkable(hint: Any) -> bool:
    if hint in _SCALARS:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return True
    return origin in (typing.Union, types.UnionType) and all(_checkable(a) for a in typing.get_args(hint))


# A number as YAML 1.2 writes it that YAML 1.1 (PyYAML) reads as text: an exponent without a sign, or without a
# point before it (6e0, 5e-4, 1.0e3)
_TEXT_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")


def fitted_args(kind: type, args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` as the user's constructor of ``kind`` is given them, checked against its annotations: ValueError
    naming the first that does not fit (``short: int`` given "abc" failed mid-run in the user's own comparison, and
    given true or 2.5 ran silently on it). A number YAML reads as text (``_TEXT_FLOAT``) is the float it spells where
    the annotation takes a float and not text, as a scenario's own number fields read it."""
    out = dict(args)
    init: Any = getattr(kind, "__init__", None)
    if getattr(init, "__module__", "sim").partition(".")[0] in ("sim", "servesim", "builtins"):
        return out  # servesim's own constructor checks its arguments
    try:
        hints = typing.get_type_hints(init)
        params = inspect.signature(init).parameters
    except Exception:  # noqa: BLE001 - a name only imported under TYPE_CHECKING, a builtin: nothing to check by
        return out
    from pydantic import TypeAdapter, ValidationError

    for name, value in args.items():
        hint = hints.get(name)
        if name not in params or hint is None or not _checkable(hint):
            continue
        # a search loop's numpy draw (rng.integers gives np.int64) is the number it holds
        plain = value.item() if isinstance(value, np.generic) else value
        adapter = TypeAdapter(hint)
        try:
            adapter.validate_python(plain, strict=True)  # strict: true is no int, "1024" no number
        except ValidationError as e:
            # (finite: 1e400 is no number a YAML file means, as a scenario's own number fields refuse it)
            if isinstance(plain, str) and _TEXT_FLOAT.fullmatch(plain.strip()) and math.isfinite(float(plain)):
                try:
                    out[name] = adapter.validate_python(float(plain), strict=True)
                    continue
                except ValidationError:
                    pass
            shown = getattr(hint, "__name__", None) if isinstance(hint, type) else None
            raise ValueError(f"args {name}={value!r} does not fit {kind.__name__}'s constructor, which takes {name}: "
                             f"{shown or str(hint).replace('typing.', '')} ({e.errors()[0]['msg'].lower()})") from None
    return out
