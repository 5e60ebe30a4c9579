#!/usr/bin/env bash
# Builds the wheel: installs the pinned toolchain, builds the release binary, then
# `flashgen build-wheel` (the precompiled subset of variants.json, or the filters given as
# arguments) into dist/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. ci/setup.sh
cargo build --release --locked --quiet
exec target/release/flashgen build-wheel --out dist "$@"
