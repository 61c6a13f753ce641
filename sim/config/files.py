"""Input and result files. Reading: a text file is read up to a size cap (so that /dev/zero or a huge file cannot
exhaust memory) and decoded as UTF-8. Writing: so that a crash never leaves a half-written file, each goes to a
temporary name in its folder and is moved into place with ``os.replace`` once all of them are complete."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from sim.config.errors import ScenarioError


class InterruptedAfterWrite(KeyboardInterrupt):
    """Ctrl-C came while ``write_atomically`` moved its files into place: it moved them all first, so the
    folder is complete, and then raised this."""


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C back until the block is done (the main thread only: no other can set a handler); then raise
    ``InterruptedAfterWrite`` if one came."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # not Python's own Ctrl-C handling (ignored, or another's handler): leave it alone
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if came:
        raise InterruptedAfterWrite


def _a_path(value: object, name: str) -> str | os.PathLike[str]:
    """``value`` if it is a path (text or ``os.PathLike``); ScenarioError naming ``name`` otherwise: a notebook's
    ``res.write(None)`` or ``report(3)`` ended in os.fspath's TypeError five frames down, naming neither."""
    if isinstance(value, str | os.PathLike):
        return value
    raise ScenarioError(f"{name} must be a path (text or pathlib.Path), got {type(value).__name__} {value!r}")


def output_path(value: str | os.PathLike[str], name: str) -> Path:
    """``value`` as the path of something to write; ScenarioError for an empty one: ``Path("")`` is the current
    folder, so an unset variable (``--out ""``, ``out=""``) wrote a run's files among the user's own."""
    if not os.fspath(_a_path(value, name)).strip():
        raise ScenarioError(f"{name}: empty path; name a file or folder (. for the current folder)")
    return Path(value)


def input_path(value: str | os.PathLike[str], name: str) -> Path:
    """``value`` as the path of something to read; ScenarioError for an empty one (``servesim run ""`` read the
    current folder: 'error: .: not a file'). Unlike ``output_path`` it does not offer ``.``: a scenario, a profile
    or a benchmark file is a file."""
    if not os.fspath(_a_path(value, name)).strip():
        raise ScenarioError(f"{name}: empty path; name the file or folder to read")
    return Path(value)


def output_folder(value: str | os.PathLike[str], name: str) -> Path:
    """``value`` as a folder to write into (made if missing), checked as ``--out`` is on the command line:
    ScenarioError for an empty path, a file where the folder should be, or a file among its parents, rather
    than the bare FileExistsError or NotADirectoryError that making it would raise."""
    out = output_path(value, name)
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"{name} {out}: exists and is not a folder")
    return _no_file_above(out, name)


def output_file(value: str | os.PathLike[str], name: str, example: str) -> Path:
    """``value`` as a file to write (its folder made if missing), checked as ``output_folder`` checks a folder:
    ScenarioError for an empty path, a folder where the file should be (``example``: a file name to offer in it),
    or a file among its parents, rather than the IsADirectoryError of the temporary file's rename."""
    out = output_path(value, name)
    if out.is_dir():
        raise ScenarioError(f"{name} {out}: is a folder; name the file to write, e.g. {out / example}")
    return _no_file_above(out, name)


def _no_file_above(out: Path, name: str) -> Path:
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ScenarioError(f"{name} {out}: {parent} is a file, not a folder")
    return out


def read_bytes_capped(path: str | os.PathLike[str], max_bytes: int, what: str) -> bytes:
    """The file's bytes, reading at most ``max_bytes``. Raises OSError (FileNotFoundError when absent) or ValueError
    naming the file, the cap in MiB and ``what`` the file should be."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes >> 20} MiB, too large for {what}")
    return data


def read_text_capped(path: str | os.PathLike[str], max_bytes: int, what: str) -> str:
    """``read_bytes_capped``'s bytes as text (UTF-8, a byte-order mark dropped); ValueError naming the file's first
    byte that is not UTF-8."""
    data = read_bytes_capped(path, max_bytes, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start} is {data[e.start]:#04x})") from None


def write_atomically(out_dir: Path, contents: Mapping[str, str | Callable[[IO[str]], None]]) -> None:
    """Write every file under a temporary name, then move them all into place. A value is the text, or a
    function that streams it into the open file (a large table, written in bounded chunks). Ctrl-C while the
    temporary files are written leaves ``out_dir`` as it was; while they are moved into place, it waits until
    all of them are, then raises ``InterruptedAfterWrite``: never a folder of files from two runs."""
    temps: dict[str, str] = {}
    umask = os.umask(0)
    os.umask(umask)
    try:
        for name, text in contents.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
            temps[name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                if isinstance(text, str):
                    f.write(text)
                else:
                    text(f)
        with sigint_deferred():
            for name, tmp in temps.items():
                os.replace(tmp, out_dir / name)
    finally:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
