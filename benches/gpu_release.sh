#!/usr/bin/env bash
# The release on the GPU machine, in one device call (issue 24): build the whole release's core
# wheel and the kernel wheels of ARCHS with the given static binary on every core, timed; install
# them as a user would (pip, one folder); run the decode and prefill GPU suites with
# FLASHGEN_DISABLE_JIT=1 on every test (FLASHGEN_TEST_DISABLE_JIT=1: nothing may compile at run
# time), the decode kernel suite on the kernel wheel's own .so files; time the first call of a
# precompiled instance of each module in fresh processes. Logs go to $OUT.
#   bash benches/gpu_release.sh BIN [ARCHS] [SECONDS]
# ARCHS: the release architectures to build (default: 9.0a, this GPU's; "" builds them all).
# SECONDS: the call's own limit; the suites get what the build leaves (default 590).
# SAVE=1 also leaves the wheels in $OUT/wheels, cut into 15 MiB parts (a device call returns no
# larger file); WHEELS=DIR skips the build and tests the wheels in DIR (parts are joined first),
# for a later call. SUITES: which of "first cached api prefill decode docs" to run (default: all;
# cached installs the core wheel alone and times an instance the JIT compiled in an earlier process).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flashgen-release}
mkdir -p "$OUT"
BIN=$(realpath "${1:?usage: gpu_release.sh BIN [ARCHS] [SECONDS]}")
ARCHS=${2-9.0a}
LIMIT=${3:-590}
START=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1

REL=/tmp/flashgen-rel
if [ -n "${WHEELS:-}" ]; then
  mkdir -p "$REL/dist"
  for part in "$WHEELS"/*.whl.part-aa; do
    [ -e "$part" ] && cat "${part%-aa}"-* > "$REL/dist/$(basename "${part%.part-aa}")"
  done
  cp -n "$WHEELS"/*.whl "$REL/dist/" 2>/dev/null
  ls -l "$REL/dist"
else
  rm -rf "$REL" && mkdir -p "$REL"
  arch_args=()
  [ -n "$ARCHS" ] && arch_args=(--arch "$ARCHS")
  /usr/bin/time -f "release build: %e s wall, %U s user, %S s system, max RSS %M KiB" \
    "$BIN" --config variants.json build-wheel --release "${arch_args[@]}" -j "$(nproc)" --quiet \
    --out "$REL/dist" --build-dir "$REL/build" > "$OUT/release_build.log" 2>&1
  echo "build-wheel --release rc=$?"
  tail -3 "$OUT/release_build.log"
  ls -l "$REL/dist"
  python3 benches/release_size.py "$REL"/dist/*.whl > "$OUT/release_size.txt" 2>&1
  tail -25 "$OUT/release_size.txt"
  sha256sum "$REL"/dist/*.whl > "$OUT/release_sha256.txt"
  if [ "${SAVE:-}" = 1 ]; then
    mkdir -p "$OUT/wheels"
    for w in "$REL"/dist/*.whl; do split -b 15M "$w" "$OUT/wheels/$(basename "$w").part-"; done
  fi
fi

SITE=/tmp/flashgen-rel-site
rm -rf "$SITE"
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$REL"/dist/*.whl || exit 1
export PYTHONPATH="$SITE" FLASHGEN_TEST_DISABLE_JIT=1 FLASHGEN_DISABLE_JIT=1
export FLASHGEN_CACHE_DIR=/tmp/flashgen-rel-cache FLASHGEN_TEST_CACHE_DIR=/tmp/flashgen-rel-cache
python3 -m flashgen doctor 2>&1 | tail -12

suite() {  # name, then pytest arguments; each suite gets what is left, less a margin
  local name=$1 t0 rc budget
  shift
  budget=$(( $(left) - 15 ))
  if [ "$budget" -lt 20 ]; then echo "pytest ($name): not run, $(left) s left"; return; fi
  t0=$(date +%s)
  timeout "$budget" python3 -m pytest -q -p no:cacheprovider -rs "$@" > "$OUT/pytest_$name.log" 2>&1
  rc=$?
  echo "pytest ($name) rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -E "^(FAILED|ERROR)|passed|failed|^SKIPPED" "$OUT/pytest_$name.log" | cut -c1-220 | tail -12
}
SUITES=${SUITES:-first cached api prefill decode docs}
want() { [[ " $SUITES " == *" $1 "* ]]; }
if want first; then
  python3 benches/first_call.py precompiled > "$OUT/first_call.log" 2>&1
  echo "first_call.py precompiled rc=$?"; tail -8 "$OUT/first_call.log"
fi
if want cached; then
  # The core wheel alone, the JIT on: the first call of an instance an earlier process compiled.
  CORE=/tmp/flashgen-core-site
  rm -rf "$CORE" /tmp/flashgen-core-cache
  python3 -m pip install -q --no-index --no-deps --target "$CORE" "$REL"/dist/flashgen-[0-9]*.whl || exit 1
  env -u FLASHGEN_DISABLE_JIT -u FLASHGEN_TEST_DISABLE_JIT PYTHONPATH="$CORE" \
    FLASHGEN_CACHE_DIR=/tmp/flashgen-core-cache python3 benches/first_call.py compile cached \
    > "$OUT/first_call_cached.log" 2>&1
  echo "first_call.py compile cached (core wheel alone) rc=$?"; tail -4 "$OUT/first_call_cached.log"
fi
want api && suite api tests/python/test_api_gpu.py
want prefill && suite prefill tests/python/test_prefill_gpu.py
kernels=$(ls -d "$SITE"/flashgen_kernels_*/_aot | head -1)
want decode && FLASHGEN_TEST_SO_DIR=$kernels suite decode tests/python/test_decode_gpu.py
want docs && FLASHGEN_BIN="$SITE/flashgen/_bin/flashgen" suite docs tests/python/test_docs.py
echo "left: $(left) s"
# A device call returns at most 8 files: the logs travel as one archive beside the wheel parts.
tar -C "$OUT" -czf /tmp/flashgen-release-logs.tgz --exclude=./wheels . \
  && find "$OUT" -maxdepth 1 -type f -delete && mv /tmp/flashgen-release-logs.tgz "$OUT/logs.tgz"
