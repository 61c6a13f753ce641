"""The CPU's energy counter for an engine run on the CPU: Intel's RAPL (also AMD's on Zen), read through Linux's
powercap files, ``/sys/class/powercap/intel-rapl:N/energy_uj`` (microjoules, one file a CPU package).

Only the package zones are summed (``intel-rapl:N`` named ``package-N``; their ``intel-rapl:N:M`` subzones, cores
and uncore, lie inside them, and a ``psys`` zone beside them holds them). A package counter wraps at its
``max_energy_range_uj``: each reading adds its rise since the last, plus the range where it wrapped, so readings at
least once a wrap apart (minutes at a package's draw) count every joule. What it measures is the whole socket, every
process on it, not the engine alone. Since Linux 5.10 the files are readable by root only (CVE-2020-8694); where
none is readable the run's energy is marked unmeasured.
"""

from __future__ import annotations

from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")


def _package(zone: Path) -> bool:
    """Whether top-level zone ``zone`` is a CPU package (its ``name`` is ``package-N``): a laptop's or a recent
    server's ``psys`` zone, the platform as a whole, sits beside them as ``intel-rapl:1`` or ``:2``. A zone whose
    name cannot be read is taken as a package."""
    try:
        return (zone / "name").read_text().strip().startswith("package")
    except OSError:
        return True


class RaplCounter:
    """Joules of the readable package zones under ``root`` since the first reading (``read``)."""

    def __init__(self, root: Path | None = None) -> None:
        root = RAPL_ROOT if root is None else root
        self.zones: list[tuple[Path, int]] = []  # (energy_uj file, its wrap range in uJ)
        paths = sorted(root.glob("intel-rapl:*")) if root.is_dir() else []
        for zone in paths:
            if zone.name.count(":") != 1:  # a subzone (intel-rapl:0:0), counted in its package
                continue
            if not _package(zone):  # psys, the whole platform: it holds the packages, which it would count again
                continue
            try:
                int((zone / "energy_uj").read_text())
                wrap = int((zone / "max_energy_range_uj").read_text())
            except (OSError, ValueError):  # not readable (root only), or no counter
                continue
            self.zones.append((zone / "energy_uj", wrap))
        self._last: list[int] | None = None
        self._total_uj = 0

    @property
    def readable(self) -> bool:
        return bool(self.zones)

    def read(self) -> float | None:
        """Joules counted since the first reading (0.0 then); None without a readable zone or when a read fails."""
        if not self.zones:
            return None
        try:
            now = [int(path.read_text()) for path, _ in self.zones]
        except (OSError, ValueError):
            return None
        if self._last is not None:
            for (_, wrap), before, after in zip(self.zones, self._last, now, strict=True):
                self._total_uj += after - before if after >= before else after + wrap - before
        self._last = now
        return self._total_uj / 1e6
