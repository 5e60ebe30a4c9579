#!/usr/bin/env bash
# Builds the Hopper prefill harness into OUT (default build/hopper) with its -Xptxas -v report
# (run_harness.sh), after timing the cold compile of one instance
# (tests/cuda/hopper_compile_check.cu). Run the binary on an H100/H200:
#   OUT/hopper_prefill_harness [--no-tests] [--no-bench] [--reps N]   (exit 1 on any failure)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/hopper}"
CU="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
mkdir -p "$OUT"
t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$CU" -std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include" -Xptxas -v \
  -gencode=arch=compute_90a,code=sm_90a ${HOPPER_FLAGS:-} \
  -c "$ROOT/tests/cuda/hopper_compile_check.cu" -o "$OUT/compile_check.o" \
  2> "$OUT/ptxas_compile_check.txt"
echo "cold compile of one instance (bf16 d128 causal default): $(echo "$(date +%s.%N) - $t0" | bc) s"
exec "$ROOT/tests/cuda/run_harness.sh" hopper_prefill_harness "$OUT"
