#!/usr/bin/env bash
# Every GPU suite and harness, on the GPU machine, in one call: the checks of a built wheel
# (benches/gpu_validate.sh, one section at a time), the release (benches/gpu_release.sh) and the
# standalone CUDA harnesses (each tests/cuda/*_harness.cu, built by its run script, then run).
# Each suite's output goes to $OUT/<suite>.log and ends in one summary line,
#   SUMMARY <suite> rc=<rc> <seconds>s [skipped: why]
# repeated together at the end (and in $OUT/summary.txt); the exit status is 1 when any suite
# failed. Everything shares one time budget, LIMIT seconds (default 570: a device call is at
# most 600), and each suite gets what is left, so pick sections to split a run over calls:
#   bash ci/gpu.sh                          # validate, harness, release (in that order)
#   bash ci/gpu.sh validate:build,tests     # some of gpu_validate.sh's sections
#   bash ci/gpu.sh harness:prefill_harness  # one harness (the name of its .cu)
#   bash ci/gpu.sh release --list
# Sections: validate[:S,...] (S from gpu_validate.sh: build tests decode-portable prefill
# prefill-portable bench bench-decode loader compile; default: its own default list), release,
# harness[:NAME,...] (default: every tests/cuda/*_harness.cu). --list prints what would run.
# Inputs (built on the CPU machine and carried over: the GPU machine has no network):
#   FLASHGEN_WHEEL  the core wheel (default: the newest dist/flashgen-*.whl that is not a
#                   kernel wheel), for validate; ZIGLANG, EXTRA_WHEELS pass through to it
#   FLASHGEN_BIN    the static binary for release (default: target/*-unknown-linux-gnu/release/
#                   flashgen from ci/build-wheel.sh, else the wheel's own flashgen/_bin/flashgen)
#   RELEASE_ARCHS   gpu_release.sh's ARCHS (default 9.0a)
#   HARNESS_ARGS    arguments of every harness binary (e.g. --no-bench)
#   NVCC            the nvcc the harness scripts use (default: the project venv's, else PATH's)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
LOGS=${OUT:-/tmp/flashgen-gpu-ci}
mkdir -p "$LOGS"
LIMIT=${LIMIT:-570}
START=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - START) )); }

list_only=0
requested=()
for a in "$@"; do
  case "$a" in
    --list) list_only=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    validate|validate:*|release|harness|harness:*) requested+=("$a") ;;
    *) echo "ci/gpu.sh: unknown section '$a' (validate[:S,...], release, harness[:NAME,...])" >&2; exit 2 ;;
  esac
done
[ ${#requested[@]} -eq 0 ] && requested=(validate harness release)

VALIDATE_DEFAULT="build tests decode-portable prefill prefill-portable bench bench-decode compile"
# The harnesses: every tests/cuda/<name>_harness.cu (the run scripts build them; see run_harness).
all_harnesses() {
  local f
  for f in tests/cuda/*_harness.cu; do [ -e "$f" ] && basename "$f" .cu; done
}

# The suites, in order: "validate:<section>", "release", "harness:<name>".
suites=()
for r in "${requested[@]}"; do
  case "$r" in
    validate) for s in $VALIDATE_DEFAULT; do suites+=("validate:$s"); done ;;
    validate:*) IFS=, read -ra parts <<< "${r#validate:}"
                for s in "${parts[@]}"; do suites+=("validate:$s"); done ;;
    harness) for h in $(all_harnesses); do suites+=("harness:$h"); done ;;
    harness:*) IFS=, read -ra parts <<< "${r#harness:}"
               for h in "${parts[@]}"; do suites+=("harness:$h"); done ;;
    release) suites+=(release) ;;
  esac
done
if [ "$list_only" = 1 ]; then printf '%s\n' "${suites[@]}"; exit 0; fi

summary=()
failed=0
report() {  # suite, rc, seconds[, note]
  local line="SUMMARY $1 rc=$2 $3s${4:+ $4}"
  echo "$line"
  summary+=("$line")
  # A suite the budget left out is reported, not failed: run it in another call.
  [ "$2" = 0 ] || [ "$2" = skip ] || failed=1
}
# Runs "$@" as suite $1's command with what is left of the budget, output to $OUT/<suite>.log.
run_suite() {
  local suite=$1 log budget t0 rc
  shift
  log="$LOGS/${suite//:/-}.log"
  budget=$(( $(left) - 10 ))
  if [ "$budget" -lt 30 ]; then
    report "$suite" skip 0 "(skipped: $(left) s of the ${LIMIT} s budget left)"
    return
  fi
  echo "== $suite (up to ${budget} s; log: $log)"
  t0=$(date +%s)
  timeout --kill-after=10 "$budget" "$@" > "$log" 2>&1
  rc=$?
  tail -15 "$log"
  report "$suite" "$rc" "$(( $(date +%s) - t0 ))" "$([ "$rc" = 124 ] && echo "(timed out)")"
}

echo "== machine"
nproc
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  || echo "ci/gpu.sh: nvidia-smi failed: no GPU here?"
if [ -z "${NVCC:-}" ]; then
  venv_nvcc=$(ls .venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -1)
  NVCC=${venv_nvcc:-$(command -v nvcc || true)}
fi
export NVCC
echo "nvcc: ${NVCC:-none} ($("${NVCC:-nvcc}" --version 2>/dev/null | tail -1))"

wheel() {
  if [ -n "${FLASHGEN_WHEEL:-}" ]; then echo "$FLASHGEN_WHEEL"; return; fi
  ls -t dist/flashgen-*.whl 2>/dev/null | grep -v '/flashgen_kernels' | head -1
}
binary() {
  if [ -n "${FLASHGEN_BIN:-}" ]; then echo "$FLASHGEN_BIN"; return; fi
  local b w
  b=$(ls -t target/*-unknown-linux-gnu/release/flashgen 2>/dev/null | head -1)
  if [ -n "$b" ]; then echo "$b"; return; fi
  w=$(wheel)
  [ -n "$w" ] || return
  rm -rf /tmp/flashgen-gpu-bin && mkdir -p /tmp/flashgen-gpu-bin
  python3 -m zipfile -e "$w" /tmp/flashgen-gpu-bin >/dev/null && chmod +x /tmp/flashgen-gpu-bin/flashgen/_bin/flashgen \
    && echo /tmp/flashgen-gpu-bin/flashgen/_bin/flashgen
}

# Builds harness $1 with its run script into $2, then runs the binary.
run_harness() {
  local name=$1 dir=$2 script
  script="tests/cuda/run_${name}.sh"
  mkdir -p "$dir"
  if [ -f "$script" ]; then
    bash "$script" "$dir" || return
  elif [ -f tests/cuda/run_harness.sh ]; then
    # One parameterised script for every harness: NAME, then the output folder.
    bash tests/cuda/run_harness.sh "$name" "$dir" || return
  else
    echo "no run script for $name: neither $script nor tests/cuda/run_harness.sh"
    return 2
  fi
  [ -x "$dir/$name" ] || { echo "the run script built no $dir/$name"; return 2; }
  # shellcheck disable=SC2086
  "$dir/$name" ${HARNESS_ARGS:-}
}

export -f run_harness

for suite in "${suites[@]}"; do
  case "$suite" in
    validate:*)
      w=$(wheel)
      if [ -z "$w" ]; then
        report "$suite" 1 0 "(no wheel: set FLASHGEN_WHEEL or carry dist/ from ./ci/build-wheel.sh)"
        continue
      fi
      run_suite "$suite" env OUT="$LOGS/validate" bash benches/gpu_validate.sh "$w" "${suite#validate:}"
      ;;
    release)
      b=$(binary)
      if [ -z "$b" ]; then
        report release 1 0 "(no binary: set FLASHGEN_BIN, or carry target/ or dist/)"
        continue
      fi
      # gpu_release.sh keeps to its own limit: what is left, less a margin for its suites' ends.
      run_suite release env OUT="$LOGS/release" bash benches/gpu_release.sh "$b" "${RELEASE_ARCHS-9.0a}" \
        "$(( $(left) - 30 ))"
      ;;
    harness:*)
      name=${suite#harness:}
      dir=/tmp/flashgen-harness/$name
      run_suite "$suite" bash -c 'run_harness "$1" "$2"' _ "$name" "$dir"
      # The ptxas reports come back with the logs; the binaries stay here.
      mkdir -p "$LOGS/harness-$name" && cp "$dir"/*.txt "$LOGS/harness-$name/" 2>/dev/null
      ;;
  esac
done

echo "== summary ($(( $(date +%s) - START )) s of ${LIMIT} s)"
printf '%s\n' "${summary[@]}" | tee "$LOGS/summary.txt"
exit "$failed"
