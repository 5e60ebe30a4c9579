#!/usr/bin/env bash
# Builds the wheel: installs the pinned toolchain, builds the release binary, then
# `flashgen build-wheel` (the precompiled subset of variants.json, or the filters given as
# arguments) into dist/.
#
# FLASHGEN_MANYLINUX=2_17 builds a wheel for glibc 2.17 and newer: the instances through zig
# (`--manylinux`, the pinned PyPI ziglang), and a static binary that needs no glibc. RUSTFLAGS
# only reaches the binary because of the explicit --target: build scripts and proc macros, built
# for the host, stay dynamic.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. ci/setup.sh
if [ -n "${FLASHGEN_MANYLINUX:-}" ]; then
  target="$(uname -m)-unknown-linux-gnu"
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --quiet --target "$target"
  exec "target/$target/release/flashgen" build-wheel --manylinux "$FLASHGEN_MANYLINUX" --out dist "$@"
fi
cargo build --release --locked --quiet
exec target/release/flashgen build-wheel --out dist "$@"
