#!/usr/bin/env bash
# One device call that checks a manylinux_2_17 wheel (./ci/build-wheel.sh's default) on the GPU
# machine, which has no zig and no network: installs the wheel and ziglang (ZIGLANG: the ziglang
# wheel, or a .tar.xz of its ziglang/ folder) with pip --target, JIT-builds one of the wheel's
# instances into an empty cache and compares its bytes with the wheel's (benches/gpu_zig.py),
# unloads a kernel that ran and every precompiled .so (dlclose), and runs the API GPU tests.
# Logs go to $OUT.   ZIGLANG=ziglang.tar.xz bash benches/gpu_manylinux.sh dist/flashgen-*.whl
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flashgen-gpu}
mkdir -p "$OUT"
WHEEL=${1:?usage: ZIGLANG=ZIG.whl|ZIG.tar.xz gpu_manylinux.sh WHEEL}
SITE=/tmp/site
rm -rf "$SITE" /tmp/fg-parity-cache /tmp/fg-parity-out /tmp/fg-api-cache
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$WHEEL" || exit 1
case "${ZIGLANG:?set ZIGLANG}" in
  *.whl) python3 -m pip install -q --no-index --no-deps --target "$SITE" "$ZIGLANG" || exit 1 ;;
  *) tar -C "$SITE" -xJf "$ZIGLANG" || exit 1 ;;
esac
export PYTHONPATH=$SITE
echo "zig $("$SITE/ziglang/zig" version); $(nvcc --version | tail -2 | tr '\n' ' '); $(g++ --version | head -1)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

t0=$(date +%s)
timeout 90 python3 benches/gpu_zig.py parity > "$OUT/parity.log" 2>&1
echo "== parity rc=$? in $(( $(date +%s) - t0 )) s"; cut -c1-400 "$OUT/parity.log"

t0=$(date +%s)
timeout 20 python3 benches/gpu_zig.py dlclose > "$OUT/dlclose.log" 2>&1
echo "== dlclose rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/dlclose.log"

t0=$(date +%s)
FLASHGEN_CACHE_DIR=/tmp/fg-api-cache timeout 70 python3 -m pytest -q -p no:cacheprovider -rs -x \
  tests/python/test_api_gpu.py > "$OUT/pytest_api.log" 2>&1
echo "== pytest test_api_gpu rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/pytest_api.log" | tail -6
