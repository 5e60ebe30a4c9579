#!/bin/bash
# The release's CPU time with and without host code once per instance (src/host_once.rs,
# benches/NOTES-build.md "In the driver"): `build-wheel --release` of a slice of variants.json
# for all of release.archs, each way from a fresh build folder and a fresh cache, under GNU time;
# then the wheels compared byte for byte. The one-step way is the driver's own fallback: a PATH
# without objcopy (g++, gcc, as and ld only).
# Usage: bash benches/host_once_release.sh OUT [build-wheel filters, default the slice below]
# FLASHGEN_BIN: the flashgen binary (default target/release/flashgen); FLASHGEN_NVCC as for flashgen.
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
bin=$(readlink -f "${FLASHGEN_BIN:-target/release/flashgen}")
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(--where dtype=bf16 --where head_dim=128 --module single_decode)
jobs=${JOBS:-2}

mkdir -p "$out/no-objcopy"
for t in g++ gcc as ld; do ln -sfn "$(command -v "$t")" "$out/no-objcopy/$t"; done

for way in host-once one-step; do
  rm -rf "$out/$way"
  mkdir -p "$out/$way"
  path=$PATH
  [ "$way" = one-step ] && path=$out/no-objcopy
  PATH=$path FLASHGEN_CACHE_DIR="$out/$way/cache" SOURCE_DATE_EPOCH=1700000000 \
    /usr/bin/time -f "%U %S %e" -o "$out/$way/time" \
    "$bin" build-wheel --release -v -j "$jobs" --build-dir "$out/$way/build" --out "$out/$way/dist" \
    "${filters[@]}" > "$out/$way/wheels" 2> "$out/$way/log"
  read -r u s e < "$out/$way/time"
  printf '%-9s %8.1f CPU-s (user %.1f + sys %.1f), wall %.1f s; nvcc -c: %d, -fatbin: %d, one-step: %d\n' \
    "$way" "$(awk -v u="$u" -v s="$s" 'BEGIN{print u + s}')" "$u" "$s" "$e" \
    "$(grep -c '^+ .* -c ' "$out/$way/log" || true)" "$(grep -c '^+ .* -fatbin ' "$out/$way/log" || true)" \
    "$(grep '^+ .*nvcc ' "$out/$way/log" | grep -v -e ' -c ' -e ' -fatbin ' | grep -c '\.cu ' || true)"
done
same=0; differ=0
for w in "$out"/host-once/dist/*.whl; do
  if cmp -s "$w" "$out/one-step/dist/$(basename "$w")"; then same=$((same + 1)); else differ=$((differ + 1)); echo "DIFFERENT: $(basename "$w")"; fi
done
echo "wheels byte-identical: $same, different: $differ"
