#!/usr/bin/env bash
# Wheels for the GPU machine, which has torch, transformers, accelerate and peft but not the rest of what
# capo-trl needs, and reaches no package index. Run here (where pip reaches the index), then carry the folder:
#   scripts/gpu_wheels.sh [DIR]          # default DIR: .gpu-wheels (git-ignored)
# On the GPU machine, from the repository root:
#   python3 -m pip install --no-index --no-deps DIR/*.whl && PYTHON=python3 scripts/gpu_check.sh
# The versions are this environment's (the ones the CPU suite passes with); the target is CPython 3.12
# on x86_64 (the GPU machine's), so binary wheels are fetched for that platform, not this one's.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu-wheels}
PYTHON=${PYTHON:-python}
mkdir -p "$DIR"
# name==version of each package the GPU machine lacks, read from this environment
mapfile -t PINS < <("$PYTHON" - <<'PY'
from importlib.metadata import version
for name in ("trl", "datasets", "dill", "multiprocess", "math-verify", "latex2sympy2_extended",
             "antlr4-python3-runtime", "pebble", "hjson", "pydantic", "pydantic-core", "annotated-types",
             "typing-inspection"):
    print(f"{name}=={version(name)}")
PY
)
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$DIR" "${PINS[@]}"
# DeepSpeed ships as a source archive; without its compiled ops it builds to a pure-Python wheel
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --quiet --no-deps -w "$DIR" \
    "deepspeed==$("$PYTHON" -c 'from importlib.metadata import version; print(version("deepspeed"))')"
"$PYTHON" -m pip wheel --quiet --no-deps -w "$DIR" .   # capo-trl itself
ls "$DIR"
