#!/usr/bin/env bash
# Builds the wheel: installs the pinned toolchain, builds the release binary, then
# `flashgen build-wheel` (the precompiled subset of variants.json, or the filters given as
# arguments) into dist/.
#
# The binary is static (`-C target-feature=+crt-static`; RUSTFLAGS only reaches it because of the
# explicit --target: build scripts and proc macros, built for the host, stay dynamic), so it needs
# no glibc. The instances are linked by the system's g++ against the shared CUDA runtime, which
# leaves them needing glibc 2.3 and the C++ ABI of 2004 (CXXABI_1.3): build-wheel tags the wheel
# from what its files need (manylinux_2_17 on Debian 12's g++ 12). FLASHGEN_MANYLINUX=2_N links
# them through zig for that glibc instead (the wheel then requires ziglang in its `jit` extra).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. ci/setup.sh
target="$(uname -m)-unknown-linux-gnu"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --quiet --target "$target"
bin="target/$target/release/flashgen"
if [ -n "${FLASHGEN_MANYLINUX:-}" ] && [ "$FLASHGEN_MANYLINUX" != off ]; then
  exec "$bin" build-wheel --manylinux "$FLASHGEN_MANYLINUX" --out dist "$@"
fi
FLASHGEN_MANYLINUX=off exec "$bin" build-wheel --out dist "$@"
