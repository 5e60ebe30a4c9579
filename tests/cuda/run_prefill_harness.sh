#!/usr/bin/env bash
# Builds the prefill harness (sm_90a binary, run_harness.sh) into OUT (default build/prefill),
# writes the -Xptxas -v report for sm_80 next to it, and compile-checks the headers with an empty
# ADDITIONAL_PARAMS_DECL. Run the binary on a GPU machine:
#   OUT/prefill_harness            (tests + benchmarks; exit 1 on any failure)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/prefill}"
CU="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
mkdir -p "$OUT"
FLAGS=(-std=c++17 --expt-relaxed-constexpr -O3 -I"$ROOT/include")
"$CU" "${FLAGS[@]}" -Xptxas -v -gencode=arch=compute_80,code=sm_80 -c \
  "$ROOT/tests/cuda/prefill_harness.cu" -o "$OUT/prefill_harness_sm80.o" 2> "$OUT/ptxas_sm80.txt" &
p2=$!
"$ROOT/tests/cuda/run_harness.sh" prefill_harness "$OUT"
wait $p2 || { grep -v "^ptxas info" "$OUT/ptxas_sm80.txt" | head -50; exit 1; }
for arch in 80 90a; do
  "$CU" "${FLAGS[@]}" -gencode=arch=compute_${arch},code=sm_${arch} \
    -c "$ROOT/tests/cuda/prefill_compile_check.cu" -o "$OUT/compile_check_sm${arch}.o"
done
# The library's kernels only (the harness's naive reference kernels spill by design).
python3 "$ROOT/benches/ptxas_spills.py" --filter '^(prefill|rope)' "$OUT/ptxas_sm90a.txt" \
  "$OUT/ptxas_sm80.txt" || true
