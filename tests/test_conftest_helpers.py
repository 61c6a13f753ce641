"""tests/conftest.py's helpers: servesim() hides the modules loaded from folders that tests added to sys.path, as a
fresh process would not have them; which modules those are is ``_under``'s answer, Path.is_relative_to's."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import _under

FILES = ["/a/b/c.py", "/a/bc/d.py", "a/b.py", "/a", "x", "/tmp/p/q/m.py", "./a/b.py", "/"]
FOLDERS = [Path("/a"), Path("/a/b"), Path(""), Path("."), Path("a"), Path("/tmp/p"), Path("/"), Path("/a/b/c.py"),
           Path("b")]


def test_under_is_path_is_relative_to() -> None:
    """servesim() built a Path for every (loaded module, added folder) pair: late in the whole suite, thousands of
    modules and dozens of folders, seconds of CPU per call (test_teach's bad-knob checks: 0.13 s alone, 11-15 s
    each in the suite). ``_under`` splits each file's path once and gives the same answers."""
    for f in FILES:
        for d in FOLDERS:
            assert _under(f, [d]) is Path(f).is_relative_to(d), (f, d)
        assert _under(f, FOLDERS) is any(Path(f).is_relative_to(d) for d in FOLDERS), f
        assert _under(f, []) is False
