#!/usr/bin/env bash
# Builds the wheel: installs the pinned toolchain, builds the release binary, then
# `flashgen build-wheel` (the precompiled subset of variants.json, or the filters given as
# arguments) into dist/.
#
# By default the wheel is built for glibc 2.17 and newer (manylinux_2_17): the instances through
# zig (`--manylinux 2_17`, the pinned PyPI ziglang that ci/setup.sh installs) and a static binary
# that needs no glibc (RUSTFLAGS only reaches the binary because of the explicit --target: build
# scripts and proc macros, built for the host, stay dynamic). FLASHGEN_MANYLINUX=2_N picks another
# target; FLASHGEN_MANYLINUX=off links with the system's g++ (a wheel tagged for this machine's
# glibc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. ci/setup.sh
export FLASHGEN_MANYLINUX="${FLASHGEN_MANYLINUX:-2_17}"
if [ "$FLASHGEN_MANYLINUX" != off ]; then
  target="$(uname -m)-unknown-linux-gnu"
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --quiet --target "$target"
  exec "target/$target/release/flashgen" build-wheel --manylinux "$FLASHGEN_MANYLINUX" --out dist "$@"
fi
cargo build --release --locked --quiet
exec target/release/flashgen build-wheel --out dist "$@"
