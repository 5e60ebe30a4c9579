#!/bin/bash
# One instance's release .so files (8.0+PTX, 9.0a, 10.0, 12.0), built two ways on the CPU machine,
# with the CPU seconds (user + system) of each way and a byte comparison (benches/NOTES-build.md):
#   per arch:  what `flashgen build --arch A` runs today, one one-step `nvcc -shared` per architecture
#              (host code compiled four times);
#   host once: `nvcc -c` for sm_90a (host code and the sm_90a fatbin), then for each other
#              architecture `nvcc -fatbin` (device code only), `objcopy --update-section .nv_fatbin=`
#              on a copy of that object, and the link `flashgen build` runs.
# Usage (a portable instance; FLASHGEN_NVCC or CUDA_HOME as for flashgen):
#   bash benches/host_once.sh OUT --module batch_prefill_paged --where dtype=bf16 --where head_dim=128 \
#       --where page_size=16 --where mask=causal --where pos_encoding=none --where variant=default \
#       --where backend=portable
# Runs one compile at a time. FLASHGEN_BIN: the flashgen binary (default target/release/flashgen).
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
bin=${FLASHGEN_BIN:-target/release/flashgen}
archs=("8.0+PTX" "9.0a" "10.0" "12.0")
cpu() { awk '{printf "%.2f", $1 + $2}' "$1"; }

# 1. Per arch, through flashgen itself (a fresh cache each, so that every one compiles).
declare -A ref
total=0
for i in "${!archs[@]}"; do
  a=${archs[$i]}
  rm -rf "$out/ref-$i" "$out/cache-$i"
  FLASHGEN_CACHE_DIR="$out/cache-$i" /usr/bin/time -f "%U %S %e" -o "$out/ref-$i.time" \
    "$bin" build --arch "$a" --out "$out/ref-$i" -j 1 -q "$@"
  so=("$out/ref-$i"/*.so)
  [ ${#so[@]} -eq 1 ] || { echo "select exactly one instance (got ${#so[@]})" >&2; exit 2; }
  ref[$a]=${so[0]}
  echo "per arch  $a: $(cpu "$out/ref-$i.time") CPU-s"
  total=$(awk -v t="$total" -v c="$(cpu "$out/ref-$i.time")" 'BEGIN{print t + c}')
done
echo "per arch  total: $total CPU-s"

# 2. Host once. The compile command is the one compile_commands.json lists for sm_90a; nvcc runs
# through a .cuda link in its folder as flashgen's link does, so that the bytes can match.
gen="$out/gen"
rm -rf "$gen"
"$bin" generate --out "$gen" --arch 9.0a "$@" >/dev/null
nvcc=$(python3 -c 'import json,shlex,sys; c=json.load(open(sys.argv[1]))[0]; print(shlex.split(c.get("command") or shlex.join(c["arguments"]))[0])' "$gen/compile_commands.json")
ln -sfn "$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)" "$gen/.cuda"
mapfile -t cflags < <(python3 - "$gen/compile_commands.json" <<'EOF'
import json, shlex, sys
c = json.load(open(sys.argv[1]))[0]
a = shlex.split(c.get("command") or shlex.join(c["arguments"]))[1:]
o = a.index("-o"); del a[o:o + 2]
for w in a:
    if w != "-c" and not w.startswith("-gencode"):
        print(w)
EOF
)
link=(-shared -Xcompiler=-fPIC -cudart=none -Xlinker=--strip-all -Xlinker=--build-id=none -Xlinker=-l:libcudart.so.13)
gencode() {
  case $1 in
    8.0+PTX) echo "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80" ;;
    9.0a) echo "-gencode=arch=compute_90a,code=sm_90a" ;;
    10.0) echo "-gencode=arch=compute_100,code=sm_100" ;;
    12.0) echo "-gencode=arch=compute_120,code=sm_120" ;;
  esac
}
# The link's flags: flashgen's link-only ones, then the compile's but -c's source and includes.
lflags=()
for w in "${cflags[@]}"; do
  case " ${link[*]} " in *" $w "*) continue ;; esac
  case $w in -I*|*.cu) ;; *) lflags+=("$w") ;; esac
done
step() { local t=$1; shift; (cd "$gen" && /usr/bin/time -f "%U %S %e" -o "$out/$t.time" "$@"); }
mkdir -p "$out/once"
# shellcheck disable=SC2046
step once-c .cuda/bin/nvcc -c "${cflags[@]}" $(gencode 9.0a) -o "$out/once/host.o"
total=$(cpu "$out/once-c.time")
for a in "${archs[@]}"; do
  o="$out/once/host.o"
  if [ "$a" != 9.0a ]; then
    # shellcheck disable=SC2046
    step "once-fatbin-$a" .cuda/bin/nvcc -fatbin "${cflags[@]}" $(gencode "$a") -o "$out/once/$a.fatbin"
    step "once-objcopy-$a" objcopy --update-section ".nv_fatbin=$out/once/$a.fatbin" "$o" "$out/once/host-$a.o"
    o="$out/once/host-$a.o"
    total=$(awk -v t="$total" -v a="$(cpu "$out/once-fatbin-$a.time")" -v b="$(cpu "$out/once-objcopy-$a.time")" 'BEGIN{print t + a + b}')
  fi
  # shellcheck disable=SC2046
  step "once-link-$a" .cuda/bin/nvcc "${link[@]}" "${lflags[@]}" $(gencode "$a") -L.cuda/lib "$o" -o "$out/once/$a.so"
  total=$(awk -v t="$total" -v c="$(cpu "$out/once-link-$a.time")" 'BEGIN{print t + c}')
  if cmp -s "$out/once/$a.so" "${ref[$a]}"; then same="byte-identical"; else same="DIFFERENT"; fi
  echo "host once $a: $same to the per-arch .so"
done
echo "host once total: $total CPU-s (the sm_90a compile $(cpu "$out/once-c.time"))"
