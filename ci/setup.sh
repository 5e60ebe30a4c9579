#!/usr/bin/env bash
# Installs what the build and the tests need into the project-local venv .venv: the pinned CUDA
# 13.0 toolchain from PyPI and the Python test tools, and bubblewrap where it can (below). Re-runs
# pip only when a requirements file changed. Source it (". ci/setup.sh") to get FLASHGEN_NVCC and
# VENV exported.
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

# bubblewrap: the sandbox of the sccache-dist build server that tests/scale_out.rs starts on
# 127.0.0.1 (the test skips, saying why, without it). Installed from the distribution as root, or
# under CI with passwordless sudo; never fatal, bounded in time.
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    if [ "${CI:-}" = true ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    else
      sudo=none
    fi
  fi
  if [ "$sudo" != none ]; then
    echo "ci/setup.sh: installing bubblewrap (apt-get) for the sccache-dist test" >&2
    { $sudo timeout 120 apt-get install -y -qq bubblewrap \
        || { $sudo timeout 120 apt-get update -qq && $sudo timeout 120 apt-get install -y -qq bubblewrap; }
    } >/dev/null 2>&1 || echo "ci/setup.sh: bubblewrap was not installed; the sccache-dist test will skip" >&2
  fi
fi

FLASHGEN_NVCC="$(ls "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -n 1)"
export FLASHGEN_NVCC VENV
