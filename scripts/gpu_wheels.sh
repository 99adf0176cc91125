#!/usr/bin/env bash
# Wheels for the GPU machine, which has torch, numpy, scipy, scikit-learn, pandas, pyarrow and matplotlib but
# reaches no package index and lacks (or has older versions of) the rest of what capo-trl needs. Run here,
# where pip reaches the index, then carry the folder:
#   scripts/gpu_wheels.sh [DIR]          # default DIR: .gpu-wheels (git-ignored), ~25 MB
# On the GPU machine, from the repository root (a separate target, so the image's own packages stay as
# they are and these take precedence):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site
#   PYTHON=python3 scripts/gpu_check.sh
# The versions are this environment's (the ones the CPU suite passes with); the target is CPython 3.12 on
# x86_64 (the GPU machine's), so binary wheels are fetched for that platform, not this one's.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu-wheels}
PYTHON=${PYTHON:-python}
mkdir -p "$DIR"
# name==version of each package to carry, read from this environment: capo-trl's and TRL's own stack
# (transformers >= 5.23 and huggingface_hub 2 are newer than such an image's), DeepSpeed and what it needs
# beyond the image, and the small packages whose floors those set above an image's likely versions.
mapfile -t PINS < <("$PYTHON" - <<'PY'
from importlib.metadata import version
for name in ("trl", "transformers", "accelerate", "peft", "datasets", "huggingface-hub", "hf-xet", "httpx2",
             "httpcore2", "truststore", "kernels", "tomlkit", "tokenizers", "safetensors", "regex", "fsspec",
             "dill", "multiprocess", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "pebble",
             "hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
             "click", "idna", "anyio", "h11"):
    print(f"{name}=={version(name)}")
PY
)
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$DIR" "${PINS[@]}"
# DeepSpeed ships as a source archive; without its compiled ops it builds to a pure-Python wheel
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --quiet --no-deps -w "$DIR" \
    "deepspeed==$("$PYTHON" -c 'from importlib.metadata import version; print(version("deepspeed"))')"
rm -f "$DIR"/capo_trl-*.whl
"$PYTHON" -m pip wheel --quiet --no-deps -w "$DIR" .   # capo-trl itself
ls "$DIR"
du -sh "$DIR"
