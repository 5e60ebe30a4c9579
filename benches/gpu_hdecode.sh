#!/usr/bin/env bash
# One device call for the Hopper single decode (issue 10 item 4), run in the repo root on the GPU
# machine: the harness's timings (portable vs sm90 plans), a flashgen build of the sm90
# single_decode instances (pos none, the built-in variants and the RFC's FlashSigmoid) and one
# portable instance, the decode GPU suite on the sm90 backend, bench_decode.py on both backends
# (with SDPA beside), and the harness's correctness cases. DIR holds what was built on the CPU
# machine: the flashgen release binary and hopper_decode_harness
# (tests/cuda/run_hopper_decode_harness.sh DIR). Logs go to $OUT.
#   bash benches/gpu_hdecode.sh DIR
set -uo pipefail
export PYTHONUNBUFFERED=1
DIR="$(cd "${1:?usage: gpu_hdecode.sh DIR}" && pwd)"
OUT=${OUT:-/tmp/hdecode}
mkdir -p "$OUT"
export FLASHGEN_BIN="$DIR/flashgen"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
"$DIR/hopper_decode_harness" --no-tests --reps 40 > "$OUT/bench.txt" 2>&1
echo "harness bench rc=$?"; tail -40 "$OUT/bench.txt"
mkdir -p /tmp/custom && cp tests/python/custom_variants/flash_sigmoid.cuh /tmp/custom/
cat > /tmp/custom/variants.json <<JSON
{"variants": {"flash_sigmoid": {"header": "flash_sigmoid.cuh", "struct": "RfcFlashSigmoid",
  "params": [{"name": "logits_scale", "type": "float"}, {"name": "sigmoid_bias", "type": "float"}]}}}
JSON
t0=$(date +%s)
"$FLASHGEN_BIN" --config variants.json --variants-file /tmp/custom/variants.json build --out /tmp/so \
  --arch 9.0a --jobs 16 --quiet --module single_decode --where pos_encoding=none --where backend=sm90 \
  > "$OUT/build.txt" 2>&1
echo "build sm90 rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/build.txt"
"$FLASHGEN_BIN" --config variants.json build --out /tmp/so_p --arch 9.0a --jobs 16 --quiet \
  --module single_decode --where pos_encoding=none --where backend=portable --where dtype=bf16 \
  --where head_dim=128 --where variant=default > "$OUT/build_p.txt" 2>&1
echo "build portable rc=$?"
t0=$(date +%s)
FLASHGEN_TEST_SO_DIR=/tmp/so FLASHGEN_TEST_BACKEND=sm90 PYTHONPATH=python timeout 240 python3 -m pytest \
  -q -p no:cacheprovider -rs tests/python/test_decode_gpu.py -k "not batch" > "$OUT/pytest.log" 2>&1
echo "pytest single_decode sm90 rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -12
FLASHGEN_BENCH_SO_DIR=/tmp/so PYTHONPATH=python timeout 90 python3 benches/bench_decode.py --single-only \
  --backend sm90 > "$OUT/bench_sm90.txt" 2>&1
echo "bench_decode sm90 rc=$?"; cat "$OUT/bench_sm90.txt"
FLASHGEN_BENCH_SO_DIR=/tmp/so_p PYTHONPATH=python timeout 60 python3 benches/bench_decode.py --single-only \
  --quick --backend portable > "$OUT/bench_portable.txt" 2>&1
echo "bench_decode portable rc=$?"; cat "$OUT/bench_portable.txt"
timeout 120 "$DIR/hopper_decode_harness" --no-bench > "$OUT/tests.txt" 2>&1
echo "harness tests rc=$?"; grep -v "^ok" "$OUT/tests.txt" | tail -8; grep -c "^ok" "$OUT/tests.txt"
