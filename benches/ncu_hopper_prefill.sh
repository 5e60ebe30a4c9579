#!/usr/bin/env bash
# Where the sm90 prefill kernel's warps wait: Nsight Compute's warp-state sampling per SASS
# instruction, for one launch of the harness's kernel (GPU machine).
#   bash benches/ncu_hopper_prefill.sh HARNESS OUT [NAME REGEX SKIP]...
# HARNESS: tests/cuda/run_hopper_prefill_harness.sh's binary (or the paged harness's), e.g. built
# with HOPPER_FLAGS="-lineinfo -DHOPPER_BENCH_ONLY". Each NAME REGEX SKIP triple profiles
# launch SKIP (0-based) of the kernels whose demangled name matches REGEX (default: the first
# bench row, single causal d128 8192, and the ragged batch row). OUT gets per case: NAME.log,
# NAME.sass.csv (the source page: samples, stall reasons and memory counters per SASS
# instruction; read it with benches/ncu_stalls.py) and NAME.details.txt (speed of light, warp
# states); the report itself stays only with KEEP_REP=1. Clocks are left alone
# (--clock-control none), as the bench runs them.
set -uo pipefail
HARNESS=${1:?usage: ncu_hopper_prefill.sh HARNESS OUT [NAME REGEX SKIP]...}
OUT=${2:?usage: ncu_hopper_prefill.sh HARNESS OUT [NAME REGEX SKIP]...}
shift 2
mkdir -p "$OUT"
if [ $# -eq 0 ]; then
  set -- causal8192 'hopper_prefill_kernel<.*SinglePrefillParams' 2 \
         ragged 'hopper_prefill_kernel<.*BatchPrefillRaggedParams' 2
fi
while [ $# -ge 3 ]; do
  name=$1 regex=$2 skip=$3
  shift 3
  ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" \
    --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section ComputeWorkloadAnalysis --section SchedulerStats \
    -f -o "$OUT/$name" "$HARNESS" --no-tests --reps 3 > "$OUT/$name.log" 2>&1
  echo "ncu $name: rc=$?"
  ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.details.txt" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
  [ "${KEEP_REP:-0}" = 1 ] || rm -f "$OUT/$name.ncu-rep"
  python3 "$(dirname "$0")/ncu_stalls.py" "$OUT/$name.sass.csv" --top 15 | head -40
done
