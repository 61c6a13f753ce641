#!/usr/bin/env bash
# Download, for the GPU machine (python 3.12, x86-64, no network), the wheels of what servesim needs there and its
# image lacks, into .whl/ at the repository root (git-ignored; the device call names it in `carry`).
#
#   bash benchmarks/gpu/fetch_wheels.sh            # versions read from $PYTHON's installed packages
#   PYTHON=.venv/bin/python bash benchmarks/gpu/fetch_wheels.sh
#
# Which packages: pyproject's dependencies and their Requires-Dist, less what the image already holds (its list:
# the device notes, KINDS.md, read 2026-11-17). Present there and left out: numpy, scipy, PyYAML, tqdm, rich,
# packaging, shellingham, annotated-doc, torch, triton, nvidia-ml-py, tokenizers. Carried although the image has
# them: typer (sim.cli.main is written against this version's help and option handling), typing-extensions (pydantic
# needs >= 4.16) and narwhals (plotly 7's dataframe layer), each small, so that the versions are the ones the
# test suite ran with. Not carried: gguf (the `real` extra; the GPU run uses random weights) and the test tools.
# Each version is the one installed for $PYTHON, so the GPU run uses what the suite here was run with.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
dest=.whl
packages=(simpy pydantic pydantic-core annotated-types typing-inspection typing-extensions plotly narwhals typer)
# what the image holds, for the completeness check below (lower case, '-' for '_')
image=" numpy scipy pyyaml tqdm rich packaging shellingham annotated-doc torch triton click colorama
        markdown-it-py mdurl pygments nvidia-ml-py tokenizers "

mkdir -p "$dest"
# a folder that ignores itself: no edit of .git/info/exclude (shared by every worktree of the repository)
printf '*\n' >"$dest/.gitignore"
rm -f "$dest"/*.whl  # one version of each: two of one package stop the offline install

specs=()
for p in "${packages[@]}"; do
    v=$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p") || {
        echo "fetch_wheels: $p is not installed for $PYTHON (set PYTHON to the project's venv)" >&2; exit 1; }
    specs+=("$p==$v")
done
echo "fetching: ${specs[*]}"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${specs[@]}"

# completeness: every unconditional Requires-Dist of a fetched wheel is fetched too or on the image
"$PYTHON" - "$dest" "$image" <<'PY'
import re
import sys
import zipfile
from pathlib import Path

dest, image = Path(sys.argv[1]), set(sys.argv[2].split())
def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
wheels = sorted(dest.glob("*.whl"))
have = {norm(w.name.split("-")[0]) for w in wheels}
missing = []
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = line.split(":", 1)[1].strip()
            if ";" in req and ("extra ==" in req or "platform_system == \"Windows\"" in req
                               or "python_version < \"3.1" in req):
                continue  # an optional extra, Windows only, or for older pythons
            name = norm(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0])
            if name not in have and name not in image:
                missing.append(f"{w.name}: {req}")
total = sum(w.stat().st_size for w in wheels)
print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}/")
if missing:
    sys.exit("fetch_wheels: needed but neither fetched nor on the image:\n  " + "\n  ".join(missing))
PY
