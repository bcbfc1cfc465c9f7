#!/usr/bin/env bash
# Run HERE (a machine with the package registry), in the project checkout's root:
#   bash tools/gpu_sglang/prepare.sh
# Downloads SGLang 0.5.23's GPU build and what it needs that the GPU machine lacks (deps.txt, ~1.9 GB, once into
# ~/.cache/atom-gpu-sglang), and splits it into folders .gpu_sglang/p00 .. pNN of at most 60 MiB each (ignored by
# git). Then carry them to the GPU machine one call each and run assemble.sh there (README.md beside this file).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
cache=${GPU_SGLANG_CACHE:-$HOME/.cache/atom-gpu-sglang}
out="$root/.gpu_sglang"
grep -qx '/.gpu_sglang/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu_sglang/' >> "$root/.git/info/exclude"
mkdir -p "$cache/whl"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_35_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$cache/whl" -r "$here/deps.txt"
rm -rf "$out"; mkdir -p "$out/p00"
cp "$here/assemble.sh" "$out/p00/"
n=0; size=0; limit=$((60 * 1024 * 1024))
folder() { printf "%s/p%02d" "$out" "$1"; }
for w in "$cache"/whl/*.whl; do
  s=$(stat -c %s "$w")
  if [ "$s" -gt "$limit" ]; then   # big wheel: its own parts, one folder each
    tmp=$(mktemp -d); split -b 60m -d -a 2 "$w" "$tmp/$(basename "$w").part"
    for p in "$tmp"/*; do n=$((n + 1)); mkdir -p "$(folder $n)"; mv "$p" "$(folder $n)/"; done
    rm -rf "$tmp"; n=$((n + 1)); size=0; mkdir -p "$(folder $n)"
  else
    if [ $((size + s)) -gt "$limit" ]; then n=$((n + 1)); size=0; fi
    mkdir -p "$(folder $n)"; cp "$w" "$(folder $n)/"; size=$((size + s))
  fi
done
find "$out" -type d -empty -delete
echo "$(ls -d "$out"/p* | wc -l) folders in .gpu_sglang; carry each to /tmp/sgl on the GPU machine in its own call, then run"
echo "bash /tmp/sgl/assemble.sh there"
