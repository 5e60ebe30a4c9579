#!/usr/bin/env bash
# Builds one CUDA harness, tests/cuda/NAME.cu, into OUT/NAME (sm_90a, statically linked cudart)
# with its -Xptxas -v report in OUT/ptxas_sm90a.txt, then prints the build time, ptxas warnings
# and how many kernels spill. The other run_*_harness.sh scripts call it.
#   tests/cuda/run_harness.sh NAME OUT
# Extra nvcc flags (A/B builds) come from HOPPER_FLAGS, e.g. HOPPER_FLAGS=-DHOPPER_BENCH_ONLY;
# NVCC overrides the pinned compiler.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
NAME="$1"
OUT="$2"
CU="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
LIB="$(dirname "$(dirname "$CU")")/lib"
mkdir -p "$OUT"
# shellcheck disable=SC2206
FLAGS=(-std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include" -Xptxas -v
       -gencode=arch=compute_90a,code=sm_90a ${HOPPER_FLAGS:-})
f="$OUT/ptxas_sm90a.txt"
t0=$(date +%s.%N)
"$CU" "${FLAGS[@]}" -L"$LIB" -cudart=static "$ROOT/tests/cuda/$NAME.cu" -o "$OUT/$NAME" 2> "$f" ||
  { grep -v "^ptxas info" "$f" | head -50; exit 1; }
echo "built in $(echo "$(date +%s.%N) - $t0" | bc) s: $OUT/$NAME"
grep -i "warn" "$f" | sort | uniq -c | head || true
echo "$(basename "$f"): $(grep -c 'bytes spill stores' "$f") kernels," \
  "$(grep 'bytes spill stores' "$f" | grep -vc ' 0 bytes spill stores') with spills"
