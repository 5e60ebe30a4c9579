#!/usr/bin/env bash
# Builds the Hopper paged prefill harness into OUT (default build/hopper_paged) with its
# -Xptxas -v report (run_harness.sh). Run the binary on an H100/H200:
#   OUT/hopper_paged_harness [--no-tests] [--no-bench] [--reps N]   (exit 1 on any failure)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
exec "$ROOT/tests/cuda/run_harness.sh" hopper_paged_harness "${1:-$ROOT/build/hopper_paged}"
