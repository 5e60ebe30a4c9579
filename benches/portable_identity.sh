#!/usr/bin/env bash
# Checks that a source refactor of the portable kernels left the generated code unchanged: builds
# a fixed set of instances (every module of the portable backend, and three sm90 ones, whose
# kernels share headers with it) from BASE_REV (exported with git archive) and from the
# working tree, with the same flashgen binary and nvcc, and compares each instance's device code
# (the .nv_fatbin section) and its whole .so. Prints one line per instance:
#   identical        the whole .so is byte-for-byte the same
#   same-device      the device code is the same, the host code differs
#   DIFFERENT        the device code differs (disassemble both with cuobjdump -sass to see why)
#   bash benches/portable_identity.sh [BASE_REV]        (default: the branch's merge base with main)
# WORK (default /tmp/portable-identity) keeps both builds; only the tree's is rebuilt when the base
# build is already there for the same revision. Needs FLASHGEN_NVCC (. ci/setup.sh) and
# target/release/flashgen; runs nvcc under nice.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE_REV=$(git rev-parse "${1:-$(git merge-base HEAD main)}")
WORK=${WORK:-/tmp/portable-identity}
BIN=${FLASHGEN_BIN:-$ROOT/target/release/flashgen}
: "${FLASHGEN_NVCC:?set FLASHGEN_NVCC (. ci/setup.sh)}"
export FLASHGEN_NVCC

# module, then the --where terms that pick its instances (every axis given, or the AOT subset).
INSTANCES=(
  "single_decode --aot --where backend=portable"
  "batch_decode --aot"
  "single_prefill --aot --where backend=portable"
  "batch_prefill_ragged --aot --where backend=portable"
  "batch_prefill_paged --aot --where backend=portable"
  "single_decode --where backend=portable --where dtype=bf16 --where head_dim=128 --where pos_encoding=rope_llama --where variant=alibi"
  "single_decode --where backend=portable --where dtype=f16 --where head_dim=64 --where pos_encoding=none --where variant=sigmoid"
  "batch_decode --where dtype=bf16 --where head_dim=128 --where page_size=1 --where pos_encoding=rope_llama --where variant=sigmoid"
  "batch_decode --where dtype=f16 --where head_dim=256 --where page_size=16 --where pos_encoding=none --where variant=alibi"
  "single_prefill --where backend=portable --where dtype=f16 --where head_dim=64 --where mask=none --where pos_encoding=none --where variant=soft_cap"
  "single_prefill --where backend=portable --where dtype=bf16 --where head_dim=256 --where mask=causal --where pos_encoding=rope_llama --where variant=sliding_window"
  "batch_prefill_ragged --where backend=portable --where dtype=bf16 --where head_dim=64 --where mask=none --where pos_encoding=none --where variant=alibi"
  "batch_prefill_ragged --where backend=portable --where dtype=f16 --where head_dim=128 --where mask=causal --where pos_encoding=rope_llama --where variant=sigmoid"
  "batch_prefill_paged --where backend=portable --where dtype=f16 --where head_dim=128 --where page_size=1 --where mask=causal --where pos_encoding=rope_llama --where variant=soft_cap"
  "batch_prefill_paged --where backend=portable --where dtype=bf16 --where head_dim=64 --where page_size=16 --where mask=none --where pos_encoding=none --where variant=sliding_window"
  "batch_prefill_paged --where backend=portable --where dtype=f16 --where head_dim=256 --where page_size=16 --where mask=none --where pos_encoding=none --where variant=sigmoid"
  # sm90 instances: the Hopper kernels include the shared params, hooks, scheduler and traits.
  "single_decode --where backend=sm90 --where dtype=f16 --where head_dim=128 --where pos_encoding=none --where variant=default"
  "single_prefill --where backend=sm90 --where dtype=bf16 --where head_dim=128 --where mask=causal --where pos_encoding=none --where variant=soft_cap"
  "batch_prefill_paged --where backend=sm90 --where dtype=bf16 --where head_dim=128 --where page_size=16 --where mask=none --where pos_encoding=rope_llama --where variant=default"
)

build() { # SRC_ROOT OUT
  local sel
  for sel in "${INSTANCES[@]}"; do
    # shellcheck disable=SC2086
    nice "$BIN" build -q --config "$1/variants.json" --out "$2" --arch "8.0 9.0a" --module $sel
  done
}

mkdir -p "$WORK"
if [ "$(cat "$WORK/base.rev" 2>/dev/null)" != "$BASE_REV" ]; then
  rm -rf "$WORK/base-src" "$WORK/base" "$WORK/base.rev"
  mkdir -p "$WORK/base-src"
  git archive "$BASE_REV" variants.json csrc include | tar -x -C "$WORK/base-src"
  build "$WORK/base-src" "$WORK/base"
  echo "$BASE_REV" >"$WORK/base.rev"
fi
[ "${BASE_ONLY:-0}" = 1 ] && exit 0
# A copy of the working tree's sources, so that editing them during the build is harmless.
rm -rf "$WORK/tree" "$WORK/tree-src"
mkdir -p "$WORK/tree-src"
cp -r variants.json csrc include "$WORK/tree-src/"
build "$WORK/tree-src" "$WORK/tree"

fatbin() { objcopy -O binary --only-section=.nv_fatbin "$1" "$2"; }
# SASS of each kernel, one block a function, without addresses and encodings.
sass() { cuobjdump -sass "$1" | sed -E 's@/\*[0-9a-f]{4}\*/@@; s@/\* 0x[0-9a-f]+ \*/@@' | grep -v '^\s*$'; }
# With cuobjdump and nvdisasm on PATH (the nvidia-cuda-cuobjdump and -nvdisasm wheels), a
# DIFFERENT line names the kernels whose SASS differs (none: the cubins differ elsewhere).
kernels_differing() {
  sass "$1" >"$WORK/a.sass" && sass "$2" >"$WORK/b.sass" || { echo "(no SASS: cuobjdump failed)"; return; }
  python3 - "$WORK/a.sass" "$WORK/b.sass" <<'PY'
import re, sys
def funcs(path):
    out, cur, arch = {}, None, ""
    for line in open(path):
        m = re.search(r"arch = (\S+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = (arch, m.group(1))
            out[cur] = []
        elif cur:
            out[cur].append(line.strip())
    return out
a, b = funcs(sys.argv[1]), funcs(sys.argv[2])
diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
print("  SASS identical in all %d kernels" % len(a) if not diff else
      "\n".join("  SASS differs: %s %s" % k for k in diff))
PY
}
same=0 dev=0 diff=0
echo "base $BASE_REV vs working tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- csrc include || echo '+changes'))"
for so in "$WORK"/base/*.so; do
  name=$(basename "$so")
  new="$WORK/tree/$name"
  if [ ! -f "$new" ]; then
    echo "MISSING    $name"; diff=$((diff + 1)); continue
  fi
  if cmp -s "$so" "$new"; then
    echo "identical  $name"; same=$((same + 1)); continue
  fi
  fatbin "$so" "$WORK/a.fatbin"; fatbin "$new" "$WORK/b.fatbin"
  if cmp -s "$WORK/a.fatbin" "$WORK/b.fatbin"; then
    echo "same-device $name"; dev=$((dev + 1))
  else
    echo "DIFFERENT  $name"; diff=$((diff + 1))
    if command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null; then
      kernels_differing "$so" "$new"
    fi
  fi
done
echo "$same identical, $dev same device code (host differs), $diff different"
[ "$diff" = 0 ]
