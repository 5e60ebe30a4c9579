#!/usr/bin/env bash
# One device call that checks a wheel built on the CPU machine on the GPU machine: installs it
# with pip, builds the decode instances (plus the RFC's FlashSigmoid as a user variant) through
# the wheel's own flashgen binary (the JIT's code path), runs the GPU tests (kernels against a
# PyTorch fp32 reference; the public API: precompiled, JIT, custom variant, cupy; prefill through
# the API, whose instances the test compiles through the loader) and the benchmarks. Logs go to
# $OUT (ZIGLANG: see the install below). Sections can be chosen: gpu_validate.sh WHEEL [build]
# [tests] [decode-portable] [prefill] [prefill-portable] [bench] [bench-decode] [loader] [compile]
# (default: all; tests runs the decode suite on each module's default backend (sm90 single decode
# on Hopper), decode-portable again on the portable one; prefill runs the
# prefill suite on the loader's backend choice, sm90 on Hopper, prefill-portable again on the
# portable kernels; bench measures both backends and the loader; loader measures the loader
# alone; compile times one cold instance build of each family on this machine). PREFILL_TIMEOUT:
# the prefill sections' limit in seconds (default 300).
#   bash benches/gpu_validate.sh dist/flashgen-*.whl
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flashgen-gpu}
mkdir -p "$OUT"
WHEEL=${1:?usage: gpu_validate.sh WHEEL [build] [tests] [prefill] [bench]}
shift
SECTIONS=${*:-build tests decode-portable prefill prefill-portable bench bench-decode compile}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
SITE=/tmp/flashgen-site
rm -rf "$SITE"
# EXTRA_WHEELS: a release's kernel wheels, installed beside the core wheel WHEEL.
# shellcheck disable=SC2086
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$WHEEL" ${EXTRA_WHEELS:-} || exit 1
# A manylinux wheel (./ci/build-wheel.sh's default) requires ziglang: its JIT builds with zig.
# ZIGLANG names the ziglang wheel, or a .tar.xz of its ziglang/ folder, to install beside it.
case "${ZIGLANG:-}" in
  "") ;;
  *.whl) python3 -m pip install -q --no-index --no-deps --target "$SITE" "$ZIGLANG" || exit 1 ;;
  *) tar -C "$SITE" -xJf "$ZIGLANG" || exit 1 ;;
esac
export PYTHONPATH="$SITE" FLASHGEN_CACHE_DIR=/tmp/flashgen-cache FLASHGEN_TEST_CACHE_DIR=/tmp/flashgen-cache
BIN="$SITE/flashgen/_bin/flashgen"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
nvcc --version | tail -2

if want build; then
  rm -rf /tmp/flashgen-so
  # A user variants file names headers inside its own folder.
  mkdir -p /tmp/flashgen-custom && cp tests/python/custom_variants/flash_sigmoid.cuh /tmp/flashgen-custom/
  cat > /tmp/flashgen-custom/variants.json <<JSON
{"variants": {"flash_sigmoid": {"header": "flash_sigmoid.cuh",
  "struct": "RfcFlashSigmoid",
  "params": [{"name": "logits_scale", "type": "float"}, {"name": "sigmoid_bias", "type": "float"}]}}}
JSON
  t0=$(date +%s)
  "$BIN" --config "$SITE/flashgen/_src/variants.json" --variants-file /tmp/flashgen-custom/variants.json \
    build --out /tmp/flashgen-so --arch 9.0a --jobs 16 --quiet --json --module '*_decode' \
    --where pos_encoding=none > "$OUT/build.json"
  echo "flashgen build of the decode instances: rc=$? in $(( $(date +%s) - t0 )) s"
  python3 - "$OUT/build.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['built']} compiled, {d['cached']} cached, {len(d['failed'])} failed, wall {d['wall_s']:.1f} s")
PY
fi

if want tests; then
  FLASHGEN_TEST_SO_DIR=/tmp/flashgen-so timeout 240 python3 -m pytest -q -p no:cacheprovider -rs -x \
    tests/python/test_decode_gpu.py tests/python/test_api_gpu.py > "$OUT/pytest.log" 2>&1
  echo "pytest (decode, api) rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed|first call|per call|import flashgen" "$OUT/pytest.log" | tail -8
fi

if want decode-portable; then
  FLASHGEN_TEST_SO_DIR=/tmp/flashgen-so FLASHGEN_TEST_BACKEND=portable timeout 240 python3 -m pytest -q \
    -p no:cacheprovider -rs -x tests/python/test_decode_gpu.py > "$OUT/pytest_decode_portable.log" 2>&1
  echo "pytest (decode, FLASHGEN_TEST_BACKEND=portable) rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_decode_portable.log" | tail -8
fi

if want prefill; then
  t0=$(date +%s)
  timeout "${PREFILL_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_prefill_gpu.py \
    > "$OUT/pytest_prefill.log" 2>&1
  echo "pytest (prefill) rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_prefill.log" | tail -12
fi
if want prefill-portable; then
  t0=$(date +%s)
  FLASHGEN_TEST_BACKEND=portable timeout "${PREFILL_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rs \
    tests/python/test_prefill_gpu.py > "$OUT/pytest_prefill_portable.log" 2>&1
  echo "pytest (prefill, FLASHGEN_TEST_BACKEND=portable) rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_prefill_portable.log" | tail -12
fi

if want bench; then
  for b in sm90 portable; do
    timeout 240 python3 benches/bench_prefill.py --backend $b --json "$OUT/prefill_$b.json" \
      > "$OUT/bench_prefill_$b.log" 2>&1
    echo "bench_prefill --backend $b rc=$?"; tail -22 "$OUT/bench_prefill_$b.log"
  done
fi
if want bench || want loader; then
  timeout 120 python3 benches/bench_loader.py startup overhead > "$OUT/bench_loader.log" 2>&1
  echo "bench_loader rc=$?"; tail -6 "$OUT/bench_loader.log"
fi

if want bench-decode; then
  # The instances of the build section; single_decode on each of its backends.
  FLASHGEN_BIN="$BIN" FLASHGEN_BENCH_SO_DIR=/tmp/flashgen-so timeout 150 python3 benches/bench_decode.py --backend sm90 \
    --json "$OUT/decode_sm90.json" > "$OUT/bench_decode_sm90.log" 2>&1
  echo "bench_decode --backend sm90 rc=$?"; tail -16 "$OUT/bench_decode_sm90.log"
  FLASHGEN_BIN="$BIN" FLASHGEN_BENCH_SO_DIR=/tmp/flashgen-so timeout 90 python3 benches/bench_decode.py --backend portable \
    --single-only --json "$OUT/decode_portable.json" > "$OUT/bench_decode_portable.log" 2>&1
  echo "bench_decode --backend portable --single-only rc=$?"; tail -8 "$OUT/bench_decode_portable.log"
fi

if want compile; then
  for sel in "single_prefill --where mask=causal --where backend=sm90" \
             "single_prefill --where mask=causal --where backend=portable" "single_decode"; do
    rm -rf /tmp/flashgen-cold /tmp/flashgen-cold-out
    t0=$(date +%s%N)
    FLASHGEN_CACHE_DIR=/tmp/flashgen-cold "$BIN" --config "$SITE/flashgen/_src/variants.json" build \
      --out /tmp/flashgen-cold-out --arch 9.0a --quiet --module $sel --where dtype=bf16 \
      --where head_dim=128 --where pos_encoding=none --where variant=default
    echo "cold build of one instance ($sel, sm_90a, this machine): rc=$? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  done
fi
