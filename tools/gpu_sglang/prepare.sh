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
# The cache may hold more than deps.txt (older sets) and the registry may since have dropped a version the cache
# holds: download only the pins the cache lacks, then carry exactly deps.txt's wheels.
wheels() {  # $1 = missing: the pins without a wheel in the cache; $1 = present: the cached wheels of the pins
  python3 - "$1" "$here/deps.txt" "$cache/whl" <<'PY'
import os, re, sys
mode, deps, cache = sys.argv[1:]
norm = lambda name: re.sub(r"[-_.]+", "_", name).lower()
have = {(norm(f.split("-")[0]), f.split("-")[1]): f for f in os.listdir(cache) if f.endswith(".whl")}
for line in open(deps):
    pin = line.split("#")[0].strip()
    if pin:
        name, version = pin.split("==")
        found = have.get((norm(name), version))
        if mode == "missing" and found is None:
            print(pin)
        elif mode == "present" and found is not None:
            print(os.path.join(cache, found))
PY
}
missing=$(wheels missing)
if [ -n "$missing" ]; then
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$cache/whl" $missing
fi
rm -rf "$out"; mkdir -p "$out/p00"
cp "$here/assemble.sh" "$here/deps.txt" "$out/p00/"
n=0; size=0; limit=$((60 * 1024 * 1024))
folder() { printf "%s/p%02d" "$out" "$1"; }
for w in $(wheels present | xargs ls -1Sr); do  # small first: they fill folders, big ones split
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
