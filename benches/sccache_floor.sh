#!/usr/bin/env bash
# What an sccache 0.16 hit of flashgen's compile step costs, against the floor of any hit: the
# same nvcc flags (the AOT archs sm_80 + sm_90a) on a one-line kernel, then on three AOT
# instances (single_decode, batch_decode, single_prefill; bf16 d128). For each: the compile
# without a launcher, one `nvcc -E` pass of the translation unit (a hit runs about five), and a
# hit through a private sccache server. Medians; everything lives in one temp folder, removed at
# the end, and the server is stopped. Issue 9's warm-rebuild row in BENCHMARKS.md reads it.
#   . ci/setup.sh && bash benches/sccache_floor.sh          (about a minute on 2 idle cores)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/ci/setup.sh" >/dev/null
NVCC=$FLASHGEN_NVCC
SCCACHE=${SCCACHE:-$VENV/bin/sccache}
FLASHGEN=${FLASHGEN_BIN:-$ROOT/target/release/flashgen}
W=$(mktemp -d)
export SCCACHE_DIR=$W/sccache SCCACHE_IDLE_TIMEOUT=0
SCCACHE_SERVER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export SCCACHE_SERVER_PORT
cleanup() { "$SCCACHE" --stop-server >/dev/null 2>&1 || true; rm -rf "$W"; }
trap cleanup EXIT
"$SCCACHE" --start-server >/dev/null

# The AOT instances' generated headers, and the flags flashgen's compile step passes.
FLASHGEN_CACHE_DIR=$W/cache "$FLASHGEN" --config "$ROOT/variants.json" generate --out "$W/gen" \
  --aot >/dev/null
printf '__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n' > "$W/one_line.cu"
FLAGS=(-Xcompiler -fPIC --expt-relaxed-constexpr -Xcompiler -fvisibility=hidden -cudart=static -O3
       -std=c++17 -Xfatbin=-compress-all -gencode arch=compute_80,code=sm_80
       -gencode arch=compute_90a,code=sm_90a)

seconds() {  # wall seconds of one run of "$@", output discarded
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

measure() {  # NAME, then the compile's input arguments
  local name=$1 cold pass hit
  shift
  "$NVCC" "${FLAGS[@]}" "$@" -o "$W/x.o" >/dev/null  # warms the page cache
  cold=$(for _ in 1 2 3; do seconds "$NVCC" "${FLAGS[@]}" "$@" -o "$W/x.o"; done | median)
  pass=$(for _ in 1 2 3; do seconds "$NVCC" "${FLAGS[@]}" "$@" -E -Xcompiler=-P -o "$W/x.ii"; done | median)
  "$SCCACHE" "$NVCC" "${FLAGS[@]}" "$@" -o "$W/hit.o" >/dev/null  # fills the cache
  hit=$(for _ in 1 2 3 4 5; do rm -f "$W/hit.o"; seconds "$SCCACHE" "$NVCC" "${FLAGS[@]}" "$@" -o "$W/hit.o"; done | median)
  printf '%-26s nvcc -c %6.3f s   one nvcc -E pass %6.3f s   sccache hit %6.3f s   hit/cold %5.3f\n' \
    "$name" "$cold" "$pass" "$hit" "$(echo "scale=3; $hit / $cold" | bc)"
}

measure "one-line kernel" -c "$W/one_line.cu"
for uri in single_decode_dtype_bf16_head_dim_128_pos_encoding_none_variant_default_backend_portable \
           batch_decode_dtype_bf16_head_dim_128_page_size_16_pos_encoding_none_variant_default_kv_dtype_same \
           single_prefill_dtype_bf16_head_dim_128_mask_causal_pos_encoding_none_variant_default_backend_portable_kv_dtype_same; do
  (cd "$W/gen" && measure "${uri%%_dtype*}" -I"$uri" -I"$ROOT/include" -c "$ROOT/csrc/${uri%%_dtype*}.cu")
done
"$SCCACHE" --show-stats | grep -E '^Cache (hits|misses) +[0-9]+$' || true
