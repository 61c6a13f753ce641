"""A long run's step log spilled to a temporary file, a field at a time, and read back a field at a time.

The step log keeps its steps as packed chunks (``sim.metrics.records.StepLog``), 28 bytes a step plus 64 a run:
about 1 GB at a million requests (20 M steps) and ten times that at ten million. Past ``SPILL_MIN`` steps its
chunks move to an unnamed temporary file (deleted by the system when closed, or when the process ends), each
field of a chunk written as one contiguous array, so that reading a column reads only that column's bytes. A
spilled chunk stands in for the structured array it was (``fields[name]``, ``len``), and its values read back
bit for bit, so every output is the same whether a run spilled or not.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

# Steps a log keeps in memory before its chunks go to a file (about 40 MB of packed steps and runs)
SPILL_MIN = 1 << 20


class SpillFile:
    """An unnamed temporary file that arrays are appended to and read back from by offset."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="servesim-steps-")
        self._size = 0

    def write(self, values: np.ndarray) -> int:
        """Append ``values`` (contiguous) and return the offset it starts at. A failed write (a full disk) raises
        an OSError that says what was being written where."""
        at = self._size
        data = np.ascontiguousarray(values).data.cast("B")
        fd = self._file.fileno()
        done = 0
        try:
            while done < len(data):  # os.pwrite may write less than asked
                done += os.pwrite(fd, data[done:], at + done)
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror or e} while spilling the step log of a long run to a temporary "
                          f"file in {tempfile.gettempdir()} (TMPDIR chooses the folder)") from None
        self._size += len(data)
        return at

    def read(self, at: int, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` values of ``dtype`` written at offset ``at`` (a new, writable array)."""
        out = np.empty(count, dtype=dtype)
        view = out.data.cast("B")
        fd = self._file.fileno()
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], at + done)
            if got <= 0:
                raise OSError(f"step log spill file ended early at byte {at + done}")
            done += got
        return out


class SpilledFields:
    """A structured array written to a ``SpillFile`` one field after another: ``self[name]`` reads that field
    back (a plain array of the field's dtype), ``len`` is its number of rows. Pickled, it becomes the structured
    array again (a sweep's worker sends its results to the parent, which has no access to the file)."""

    __slots__ = ("_file", "_len", "_dtype", "_at")

    def __init__(self, file: SpillFile, values: np.ndarray) -> None:
        names = values.dtype.names
        assert names is not None, "a structured array"
        self._file = file
        self._len = len(values)
        self._dtype = values.dtype
        self._at = {name: file.write(values[name]) for name in names}

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, name: str) -> np.ndarray:
        return self._file.read(self._at[name], self._dtype[name], self._len)

    def load(self) -> np.ndarray:
        """The structured array it was."""
        out = np.empty(self._len, dtype=self._dtype)
        for name in self._at:
            out[name] = self[name]
        return out

    def __reduce__(self) -> tuple[object, tuple[np.ndarray]]:
        return _identity, (self.load(),)


def _identity(values: np.ndarray) -> np.ndarray:
    return values
