#!/usr/bin/env bash
# Builds the Hopper prefill harness (sm_90a, statically linked cudart) into OUT (default
# build/hopper) with its -Xptxas -v report, and times the cold compile of one instance
# (tests/cuda/hopper_compile_check.cu). Run the binary on an H100/H200:
#   OUT/hopper_prefill_harness [--no-tests] [--no-bench] [--reps N]   (exit 1 on any failure)
# Extra nvcc flags (A/B builds) come from HOPPER_FLAGS, e.g. HOPPER_FLAGS=-DHOPPER_BENCH_ONLY.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/hopper}"
CU="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
LIB="$(dirname "$(dirname "$CU")")/lib"
mkdir -p "$OUT"
FLAGS=(-std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include" -Xptxas -v
       -gencode=arch=compute_90a,code=sm_90a ${HOPPER_FLAGS:-})
t0=$(date +%s.%N)
"$CU" "${FLAGS[@]}" -c "$ROOT/tests/cuda/hopper_compile_check.cu" -o "$OUT/compile_check.o" \
  2> "$OUT/ptxas_compile_check.txt"
t1=$(date +%s.%N)
echo "cold compile of one instance (bf16 d128 causal default): $(echo "$t1 - $t0" | bc) s"
"$CU" "${FLAGS[@]}" -L"$LIB" -cudart=static "$ROOT/tests/cuda/hopper_prefill_harness.cu" \
  -o "$OUT/hopper_prefill_harness" 2> "$OUT/ptxas_sm90a.txt" ||
  { grep -v "^ptxas info" "$OUT/ptxas_sm90a.txt" | head -50; exit 1; }
echo "built in $(echo "$(date +%s.%N) - $t1" | bc) s: $OUT/hopper_prefill_harness"
grep -i "warn" "$OUT/ptxas_sm90a.txt" | sort | uniq -c | head || true
f="$OUT/ptxas_sm90a.txt"
echo "$(basename "$f"): $(grep -c 'bytes spill stores' "$f") kernels," \
  "$(grep 'bytes spill stores' "$f" | grep -vc ' 0 bytes spill stores') with spills"
