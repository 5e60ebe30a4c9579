#!/usr/bin/env bash
# Builds the Hopper single-decode harness (sm_90a, statically linked cudart) into OUT (default
# build/hopper_decode) with its -Xptxas -v report. Run the binary on an H100/H200:
#   OUT/hopper_decode_harness [--no-tests] [--no-bench] [--reps N]   (exit 1 on any failure)
# Extra nvcc flags (A/B builds) come from HOPPER_FLAGS; HOPPER_FLAGS=-DFLASHGEN_HDECODE_TRACE builds
# the trace mode (OUT/hopper_decode_harness --trace: where the time of one call goes, per step).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/hopper_decode}"
CU="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
LIB="$(dirname "$(dirname "$CU")")/lib"
mkdir -p "$OUT"
t0=$(date +%s.%N)
"$CU" -std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include" -Xptxas -v \
  -gencode=arch=compute_90a,code=sm_90a ${HOPPER_FLAGS:-} -L"$LIB" -cudart=static \
  "$ROOT/tests/cuda/hopper_decode_harness.cu" -o "$OUT/hopper_decode_harness" \
  2> "$OUT/ptxas_sm90a.txt" || { grep -v "^ptxas info" "$OUT/ptxas_sm90a.txt" | head -50; exit 1; }
echo "built in $(echo "$(date +%s.%N) - $t0" | bc) s: $OUT/hopper_decode_harness"
f="$OUT/ptxas_sm90a.txt"
# The fp32 reference kernel (ref_decode) may spill; the flashgen kernels must not.
echo "flashgen kernels with spills or a stack frame:" \
  "$(grep -A3 "Compiling entry function '_ZN8flashgen" "$f" | grep -E 'bytes stack frame' |
     grep -vc ' 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads') of" \
  "$(grep -c "Compiling entry function '_ZN8flashgen" "$f")"
