#!/usr/bin/env bash
# One device call that checks a wheel built on the CPU machine on the GPU machine: installs it
# with pip, builds every instance of the matrix (plus the RFC's FlashSigmoid as a user variant)
# through the wheel's own flashgen binary (the JIT's code path), runs the GPU tests (kernels
# against a PyTorch fp32 reference; the public API: precompiled, JIT, custom variant, cupy) and
# the benchmarks. Logs go to $OUT.
#   bash benches/gpu_validate.sh dist/flashgen-*.whl
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flashgen-gpu}
mkdir -p "$OUT"
WHEEL=${1:?usage: gpu_validate.sh WHEEL}
SITE=/tmp/flashgen-site
rm -rf "$SITE" /tmp/flashgen-so
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$WHEEL" || exit 1
export PYTHONPATH="$SITE" FLASHGEN_CACHE_DIR=/tmp/flashgen-cache
BIN="$SITE/flashgen/_bin/flashgen"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
nvcc --version | tail -2

cat > /tmp/flashgen-custom.json <<JSON
{"variants": {"flash_sigmoid": {"header": "$PWD/tests/python/custom_variants/flash_sigmoid.cuh",
  "struct": "RfcFlashSigmoid",
  "params": [{"name": "logits_scale", "type": "float"}, {"name": "sigmoid_bias", "type": "float"}]}}}
JSON
t0=$(date +%s)
"$BIN" --config "$SITE/flashgen/_src/variants.json" --variants-file /tmp/flashgen-custom.json \
  build --out /tmp/flashgen-so --arch 9.0a --jobs 16 --quiet --json > "$OUT/build.json"
echo "flashgen build of every instance: rc=$? in $(( $(date +%s) - t0 )) s"
python3 - "$OUT/build.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['built']} compiled, {d['cached']} cached, {len(d['failed'])} failed, wall {d['wall_s']:.1f} s")
PY

FLASHGEN_TEST_SO_DIR=/tmp/flashgen-so timeout 400 python3 -m pytest -q -p no:cacheprovider -rs -s \
  tests/python/test_decode_gpu.py tests/python/test_api_gpu.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed|first call|per call|import flashgen" "$OUT/pytest.log" | tail -15

FLASHGEN_BENCH_SO_DIR=/tmp/flashgen-so timeout 300 python3 benches/bench_decode.py > "$OUT/bench_decode.log" 2>&1
echo "bench_decode rc=$?"; tail -30 "$OUT/bench_decode.log"
timeout 300 python3 benches/bench_loader.py startup overhead jit > "$OUT/bench_loader.log" 2>&1
echo "bench_loader rc=$?"; tail -9 "$OUT/bench_loader.log"
