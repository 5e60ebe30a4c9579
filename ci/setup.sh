#!/usr/bin/env bash
# Installs what the build and the tests need into the project-local venv .venv: the pinned CUDA
# 13.0 toolchain from PyPI and the Python test tools. Re-runs pip only when a requirements file
# changed. Source it (". ci/setup.sh") to get FLASHGEN_NVCC and VENV exported.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

stamp="$VENV/.flashgen-requirements"
want="$(cat "$ROOT/ci/requirements-cuda.txt" "$ROOT/ci/requirements-test.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ci/setup.sh: installing the CUDA toolchain and test tools into $VENV" >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$ROOT/ci/requirements-cuda.txt" -r "$ROOT/ci/requirements-test.txt"
  echo "$want" > "$stamp"
fi

FLASHGEN_NVCC="$(ls "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -n 1)"
export FLASHGEN_NVCC VENV
