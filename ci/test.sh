#!/usr/bin/env bash
# Runs every test: formatting and lints, the Rust tests (the CLI on fixture matrices with real
# nvcc), then a small wheel checked with pip, auditwheel and check-wheel-contents, and the Python
# tests of the loader and the API. GPU tests skip cleanly where there is no GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. ci/setup.sh

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
    echo "ci/test.sh: installing bubblewrap (apt-get) for the sccache-dist test" >&2
    { $sudo timeout 120 apt-get install -y -qq bubblewrap \
        || { $sudo timeout 120 apt-get update -qq && $sudo timeout 120 apt-get install -y -qq bubblewrap; }
    } >/dev/null 2>&1 || echo "ci/test.sh: bubblewrap was not installed; the sccache-dist test will skip" >&2
  fi
fi

echo "== cargo fmt / clippy" >&2
cargo fmt --check
cargo clippy --locked --all-targets --quiet -- -D warnings

echo "== ruff / mypy" >&2
# Configured in pyproject.toml ([tool.ruff], [tool.mypy]: the package and the PEP 517 backend).
"$VENV/bin/python" -m ruff check --no-cache python/flashgen backend tests/python benches
"$VENV/bin/python" -m mypy

echo "== cargo test" >&2
cargo test --locked

echo "== release binary" >&2
cargo build --release --locked --quiet
# The Python tests build a small wheel with it (one instance, sm_90a) and check it with pip,
# auditwheel and check-wheel-contents, then exercise the loader against the installed wheel.
export FLASHGEN_BIN="$PWD/target/release/flashgen" FLASHGEN_TOOLS_VENV="$VENV"

echo "== pytest" >&2
set +e
"$VENV/bin/python" -m pytest tests/python -q -rs "$@"
rc=$?
set -e
# pytest exits 5 when it collects no test: nothing failed.
if [ "$rc" -eq 5 ]; then rc=0; fi
exit "$rc"
