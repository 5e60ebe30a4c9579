#!/usr/bin/env bash
# Device code of the kernel tree at BASE (a commit, default HEAD) against the working tree's:
# compiles each instance listed below and each CUDA harness under tests/cuda/ to an sm_90a cubin
# from both trees (same nvcc, flags and generated instance header) and prints, per cubin,
#   identical NAME | different NAME | sass-identical NAME (cubins differ, SASS does not) | missing NAME
# then a summary line; exit 1 when any cubin's SASS differs. SASS is compared only where the
# cubins differ and CUOBJDUMP points at a cuobjdump (addresses and encodings stripped).
#   benches/sass_identity.sh [BASE]      env: NVCC, FLASHGEN (target/release/flashgen), JOBS (2)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${1:-HEAD}"
NVCC="${NVCC:-$ROOT/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc}"
FLASHGEN="${FLASHGEN:-$ROOT/target/release/flashgen}"
JOBS="${JOBS:-2}"
BASE_SHA="$(git -C "$ROOT" rev-parse --short "$BASE")"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# Instances: module, then the --where terms. Every sm90 module, f16 and bf16, head_dim 64/128/256,
# both masks, page sizes 1 and 16, rope_llama, every built-in variant; and a few portable ones
# (their kernels share the neutral headers).
INSTANCES="
single_prefill dtype=bf16 head_dim=64 mask=causal pos_encoding=rope_llama variant=default backend=sm90
single_prefill dtype=f16 head_dim=64 mask=causal pos_encoding=none variant=soft_cap backend=sm90
single_prefill dtype=bf16 head_dim=64 mask=none pos_encoding=none variant=sliding_window backend=sm90
single_prefill dtype=f16 head_dim=64 mask=none pos_encoding=rope_llama variant=alibi backend=sm90
single_prefill dtype=bf16 head_dim=64 mask=causal pos_encoding=none variant=sigmoid backend=sm90
single_prefill dtype=f16 head_dim=128 mask=causal pos_encoding=none variant=default backend=sm90
single_prefill dtype=bf16 head_dim=128 mask=none pos_encoding=none variant=soft_cap backend=sm90
single_prefill dtype=f16 head_dim=128 mask=none pos_encoding=rope_llama variant=sliding_window backend=sm90
single_prefill dtype=bf16 head_dim=128 mask=causal pos_encoding=none variant=alibi backend=sm90
single_prefill dtype=f16 head_dim=128 mask=causal pos_encoding=none variant=sigmoid backend=sm90
single_prefill dtype=bf16 head_dim=256 mask=none pos_encoding=none variant=default backend=sm90
single_prefill dtype=f16 head_dim=256 mask=none pos_encoding=rope_llama variant=soft_cap backend=sm90
single_prefill dtype=bf16 head_dim=256 mask=causal pos_encoding=none variant=sliding_window backend=sm90
single_prefill dtype=f16 head_dim=256 mask=causal pos_encoding=none variant=alibi backend=sm90
single_prefill dtype=bf16 head_dim=256 mask=none pos_encoding=rope_llama variant=sigmoid backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=64 mask=causal pos_encoding=rope_llama variant=default backend=sm90
batch_prefill_ragged dtype=f16 head_dim=64 mask=causal pos_encoding=none variant=soft_cap backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=64 mask=none pos_encoding=none variant=sliding_window backend=sm90
batch_prefill_ragged dtype=f16 head_dim=64 mask=none pos_encoding=rope_llama variant=alibi backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=64 mask=causal pos_encoding=none variant=sigmoid backend=sm90
batch_prefill_ragged dtype=f16 head_dim=128 mask=causal pos_encoding=none variant=default backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=128 mask=none pos_encoding=none variant=soft_cap backend=sm90
batch_prefill_ragged dtype=f16 head_dim=128 mask=none pos_encoding=rope_llama variant=sliding_window backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=128 mask=causal pos_encoding=none variant=alibi backend=sm90
batch_prefill_ragged dtype=f16 head_dim=128 mask=causal pos_encoding=none variant=sigmoid backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=256 mask=none pos_encoding=none variant=default backend=sm90
batch_prefill_ragged dtype=f16 head_dim=256 mask=none pos_encoding=rope_llama variant=soft_cap backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=256 mask=causal pos_encoding=none variant=sliding_window backend=sm90
batch_prefill_ragged dtype=f16 head_dim=256 mask=causal pos_encoding=none variant=alibi backend=sm90
batch_prefill_ragged dtype=bf16 head_dim=256 mask=none pos_encoding=rope_llama variant=sigmoid backend=sm90
batch_prefill_paged dtype=bf16 head_dim=64 page_size=16 mask=causal pos_encoding=rope_llama variant=default backend=sm90
batch_prefill_paged dtype=f16 head_dim=64 page_size=16 mask=causal pos_encoding=none variant=soft_cap backend=sm90
batch_prefill_paged dtype=bf16 head_dim=64 page_size=16 mask=none pos_encoding=none variant=sliding_window backend=sm90
batch_prefill_paged dtype=f16 head_dim=64 page_size=16 mask=none pos_encoding=rope_llama variant=alibi backend=sm90
batch_prefill_paged dtype=bf16 head_dim=64 page_size=16 mask=causal pos_encoding=none variant=sigmoid backend=sm90
batch_prefill_paged dtype=f16 head_dim=128 page_size=16 mask=causal pos_encoding=none variant=default backend=sm90
batch_prefill_paged dtype=bf16 head_dim=128 page_size=16 mask=none pos_encoding=none variant=soft_cap backend=sm90
batch_prefill_paged dtype=f16 head_dim=128 page_size=16 mask=none pos_encoding=rope_llama variant=sliding_window backend=sm90
batch_prefill_paged dtype=bf16 head_dim=128 page_size=16 mask=causal pos_encoding=none variant=alibi backend=sm90
batch_prefill_paged dtype=f16 head_dim=128 page_size=16 mask=causal pos_encoding=none variant=sigmoid backend=sm90
batch_prefill_paged dtype=bf16 head_dim=256 page_size=16 mask=none pos_encoding=none variant=default backend=sm90
batch_prefill_paged dtype=f16 head_dim=256 page_size=16 mask=none pos_encoding=rope_llama variant=soft_cap backend=sm90
batch_prefill_paged dtype=bf16 head_dim=256 page_size=16 mask=causal pos_encoding=none variant=sliding_window backend=sm90
batch_prefill_paged dtype=f16 head_dim=256 page_size=16 mask=causal pos_encoding=none variant=alibi backend=sm90
batch_prefill_paged dtype=bf16 head_dim=256 page_size=16 mask=none pos_encoding=rope_llama variant=sigmoid backend=sm90
batch_prefill_paged dtype=bf16 head_dim=64 page_size=1 mask=causal pos_encoding=rope_llama variant=default backend=sm90
batch_prefill_paged dtype=f16 head_dim=64 page_size=1 mask=causal pos_encoding=none variant=soft_cap backend=sm90
batch_prefill_paged dtype=bf16 head_dim=64 page_size=1 mask=none pos_encoding=none variant=sliding_window backend=sm90
batch_prefill_paged dtype=f16 head_dim=64 page_size=1 mask=none pos_encoding=rope_llama variant=alibi backend=sm90
batch_prefill_paged dtype=bf16 head_dim=64 page_size=1 mask=causal pos_encoding=none variant=sigmoid backend=sm90
batch_prefill_paged dtype=f16 head_dim=128 page_size=1 mask=causal pos_encoding=none variant=default backend=sm90
batch_prefill_paged dtype=bf16 head_dim=128 page_size=1 mask=none pos_encoding=none variant=soft_cap backend=sm90
batch_prefill_paged dtype=f16 head_dim=128 page_size=1 mask=none pos_encoding=rope_llama variant=sliding_window backend=sm90
batch_prefill_paged dtype=bf16 head_dim=128 page_size=1 mask=causal pos_encoding=none variant=alibi backend=sm90
batch_prefill_paged dtype=f16 head_dim=128 page_size=1 mask=causal pos_encoding=none variant=sigmoid backend=sm90
batch_prefill_paged dtype=bf16 head_dim=256 page_size=1 mask=none pos_encoding=none variant=default backend=sm90
batch_prefill_paged dtype=f16 head_dim=256 page_size=1 mask=none pos_encoding=rope_llama variant=soft_cap backend=sm90
batch_prefill_paged dtype=bf16 head_dim=256 page_size=1 mask=causal pos_encoding=none variant=sliding_window backend=sm90
batch_prefill_paged dtype=f16 head_dim=256 page_size=1 mask=causal pos_encoding=none variant=alibi backend=sm90
batch_prefill_paged dtype=bf16 head_dim=256 page_size=1 mask=none pos_encoding=rope_llama variant=sigmoid backend=sm90
single_decode dtype=bf16 head_dim=64 pos_encoding=rope_llama variant=default backend=sm90
single_decode dtype=f16 head_dim=64 pos_encoding=none variant=soft_cap backend=sm90
single_decode dtype=bf16 head_dim=64 pos_encoding=none variant=sliding_window backend=sm90
single_decode dtype=f16 head_dim=64 pos_encoding=rope_llama variant=alibi backend=sm90
single_decode dtype=bf16 head_dim=64 pos_encoding=none variant=sigmoid backend=sm90
single_decode dtype=f16 head_dim=128 pos_encoding=none variant=default backend=sm90
single_decode dtype=bf16 head_dim=128 pos_encoding=none variant=soft_cap backend=sm90
single_decode dtype=f16 head_dim=128 pos_encoding=rope_llama variant=sliding_window backend=sm90
single_decode dtype=bf16 head_dim=128 pos_encoding=none variant=alibi backend=sm90
single_decode dtype=f16 head_dim=128 pos_encoding=none variant=sigmoid backend=sm90
single_decode dtype=bf16 head_dim=256 pos_encoding=none variant=default backend=sm90
single_decode dtype=f16 head_dim=256 pos_encoding=rope_llama variant=soft_cap backend=sm90
single_decode dtype=bf16 head_dim=256 pos_encoding=none variant=sliding_window backend=sm90
single_decode dtype=f16 head_dim=256 pos_encoding=none variant=alibi backend=sm90
single_decode dtype=bf16 head_dim=256 pos_encoding=rope_llama variant=sigmoid backend=sm90
single_prefill dtype=bf16 head_dim=128 mask=causal pos_encoding=rope_llama variant=soft_cap backend=portable
batch_prefill_paged dtype=f16 head_dim=64 page_size=16 mask=none pos_encoding=none variant=alibi backend=portable
single_decode dtype=bf16 head_dim=128 pos_encoding=none variant=default backend=portable
batch_decode dtype=f16 head_dim=128 page_size=16 pos_encoding=rope_llama variant=sliding_window
"

# The two trees: BASE's include/, csrc/ and tests/cuda/ from git; the working tree's copied, so
# both compile from paths of the same shape.
mkdir -p "$TMP/base" "$TMP/work"
git -C "$ROOT" archive "$BASE_SHA" include csrc tests/cuda | tar -x -C "$TMP/base"
(cd "$ROOT" && cp -r include csrc tests "$TMP/work/")

compile_instance() {  # n module where...
  local n="$1" module="$2"; shift 2
  local gen="$TMP/gen/$n" args=()
  for w in "$@"; do args+=(--where "$w"); done
  (cd "$ROOT" && "$FLASHGEN" generate --out "$gen" --arch 9.0a --module "$module" "${args[@]}") \
    >/dev/null 2>&1
  local inst
  inst="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["output"])' \
    "$gen/compile_commands.json")"
  inst="$(basename "${inst%.o}")"
  [ -n "$inst" ] || { echo "no instance: $module $*" >&2; return 1; }
  for tree in base work; do
    nice "$NVCC" -cubin -O3 -std=c++17 --expt-relaxed-constexpr \
      -gencode=arch=compute_90a,code=sm_90a -I"$gen/$inst" -I"$TMP/$tree/include" \
      "$TMP/$tree/csrc/$module.cu" -o "$TMP/$tree/$inst.cubin" 2>"$TMP/$tree/$inst.log" || true
  done
  echo "$inst" > "$TMP/gen/$n.name"
}

compile_harness() {  # file.cu
  local f="$1" name="harness_${1%.cu}"
  for tree in base work; do
    [ -f "$TMP/$tree/tests/cuda/$f" ] || continue
    nice "$NVCC" -cubin -O3 -std=c++17 --expt-relaxed-constexpr \
      -gencode=arch=compute_90a,code=sm_90a -I"$TMP/$tree/include" \
      "$TMP/$tree/tests/cuda/$f" -o "$TMP/$tree/$name.cubin" 2>"$TMP/$tree/$name.log" || true
  done
  echo "$name" > "$TMP/gen/$name.name"
}

mkdir -p "$TMP/gen"
n=0
while read -r line; do
  [ -n "$line" ] || continue
  n=$((n + 1))
  # shellcheck disable=SC2086
  compile_instance "$n" $line &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
done <<< "$INSTANCES"
for f in $(cd "$ROOT/tests/cuda" && ls hopper_*.cu prefill_*.cu 2>/dev/null); do
  compile_harness "$f" &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
done
wait

sass() {
  "$CUOBJDUMP" -sass "$1" | sed -e 's@/\*[0-9a-f]*\*/@@g' -e 's@ */\* 0x[0-9a-f]* \*/@@' -e 's/[[:space:]]*$//' |
    grep -v '^[[:space:]]*$'
}
same=0 diff=0 sass_same=0 missing=0
for f in "$TMP"/gen/*.name; do
  name="$(cat "$f")"
  a="$TMP/base/$name.cubin" b="$TMP/work/$name.cubin"
  if [ ! -s "$a" ] || [ ! -s "$b" ]; then
    echo "missing $name"; missing=$((missing + 1))
    for t in base work; do [ -s "$TMP/$t/$name.cubin" ] || tail -3 "$TMP/$t/$name.log" | sed "s/^/  $t: /"; done
  elif cmp -s "$a" "$b"; then
    echo "identical $name"; same=$((same + 1))
  elif [ -n "${CUOBJDUMP:-}" ] && sa="$(sass "$a" | md5sum)" && sb="$(sass "$b" | md5sum)" &&
    [ "$sa" = "$sb" ]; then  # a failed listing (no nvdisasm beside cuobjdump) is no match
    echo "sass-identical $name"; sass_same=$((sass_same + 1))
  else
    echo "different $name"; diff=$((diff + 1))
  fi
done
echo "summary: $same identical, $sass_same sass-identical, $diff different, $missing missing" \
  "(base $BASE_SHA, working tree)"
[ "$diff" -eq 0 ]
