#!/usr/bin/env bash
# Builds the prefill harness (sm_90a binary, statically linked cudart) into OUT (default
# build/prefill), writes the -Xptxas -v reports for sm_90a and sm_80 next to it, and compile-
# checks the headers with an empty ADDITIONAL_PARAMS_DECL. Run the binary on a GPU machine:
#   OUT/prefill_harness            (tests + benchmarks; exit 1 on any failure)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/prefill}"
CU="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
LIB="$(dirname "$(dirname "$CU")")/lib"
mkdir -p "$OUT"
FLAGS=(-std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include" -Xptxas -v)
t0=$(date +%s)
"$CU" "${FLAGS[@]}" -gencode=arch=compute_90a,code=sm_90a -L"$LIB" -cudart=static \
  "$ROOT/tests/cuda/prefill_harness.cu" -o "$OUT/prefill_harness" 2> "$OUT/ptxas_sm90a.txt" &
p1=$!
"$CU" "${FLAGS[@]}" -gencode=arch=compute_80,code=sm_80 -c \
  "$ROOT/tests/cuda/prefill_harness.cu" -o "$OUT/prefill_harness_sm80.o" 2> "$OUT/ptxas_sm80.txt" &
p2=$!
wait $p1 || { cat "$OUT/ptxas_sm90a.txt" | grep -v "^ptxas info" | head -50; exit 1; }
wait $p2 || { cat "$OUT/ptxas_sm80.txt" | grep -v "^ptxas info" | head -50; exit 1; }
for arch in 80 90a; do
  "$CU" -std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include" \
    -gencode=arch=compute_${arch},code=sm_${arch} -c "$ROOT/tests/cuda/prefill_compile_check.cu" \
    -o "$OUT/compile_check_sm${arch}.o"
done
echo "built in $(( $(date +%s) - t0 )) s: $OUT/prefill_harness"
# The library's kernels only (the harness's naive reference kernels spill by design).
python3 "$ROOT/benches/ptxas_spills.py" --filter '^(prefill|rope)' "$OUT/ptxas_sm90a.txt" \
  "$OUT/ptxas_sm80.txt" || true
