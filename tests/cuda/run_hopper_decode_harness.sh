#!/usr/bin/env bash
# Builds the Hopper single-decode harness into OUT (default build/hopper_decode) with its
# -Xptxas -v report (run_harness.sh). Run the binary on an H100/H200:
#   OUT/hopper_decode_harness [--no-tests] [--no-bench] [--reps N]   (exit 1 on any failure)
# HOPPER_FLAGS=-DFLASHGEN_HDECODE_TRACE builds the trace mode (OUT/hopper_decode_harness --trace:
# where the time of one call goes, per step).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/build/hopper_decode}"
"$ROOT/tests/cuda/run_harness.sh" hopper_decode_harness "$OUT"
f="$OUT/ptxas_sm90a.txt"
# The fp32 reference kernel (ref_decode) may spill; the flashgen kernels must not.
echo "flashgen kernels with spills or a stack frame:" \
  "$(grep -A3 "Compiling entry function '_ZN8flashgen" "$f" | grep -E 'bytes stack frame' |
     grep -vc ' 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads') of" \
  "$(grep -c "Compiling entry function '_ZN8flashgen" "$f")"
