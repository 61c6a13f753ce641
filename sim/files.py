"""Writing result files so that a crash never leaves a half-written one: each goes to a temporary name in its
folder and is moved into place with ``os.replace`` once all of them are complete."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(out_dir: Path, contents: dict[str, str]) -> None:
    """Write every file under a temporary name, then move them all into place."""
    temps: dict[str, str] = {}
    umask = os.umask(0)
    os.umask(umask)
    try:
        for name, text in contents.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
            temps[name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        for name, tmp in temps.items():
            os.replace(tmp, out_dir / name)
    finally:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
