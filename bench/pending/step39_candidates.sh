#!/usr/bin/env bash
# Builds, from this tree's kernels/ (v5 step 38), the packages of the next A/B for target 5's
# B4 S = 64 gap (bench/NOTES.md, thirty-ninth session): .base (main) and, each as
# .cand/NAME/pkgs (measurement candidates, one constant changed in each copy):
#   cap96  the finish alone on its multiprocessor held to 96 registers instead of 128
#          (sm_90a: B4 S = 64 finish 96 registers, no spill, 2856 instructions against 2808)
#   w16    every finish of 8 warps at 16 (sm_90a, with the 128 cap: B4 S = 64 118 registers,
#          2216 instructions a thread, 84 block barriers against 74, 6 KB shared)
# Run here, from the repository root; carry [".whl", ".base", ".cand"] (and the Triton cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .base .cand/cap96 .cand/w16
mkdir -p .base
cp -r kernels/pp3kernels .base/
build() {  # NAME SED-EXPRESSION
  local dest=.cand/$1/pkgs
  mkdir -p "$dest"
  cp -r kernels/pp3kernels "$dest/"
  sed -i "$2" "$dest/pp3kernels/selector.py"
  if cmp -s kernels/pp3kernels/selector.py "$dest/pp3kernels/selector.py"; then
    echo "$1: the expression changed nothing" >&2
    exit 1
  fi
}
build cap96 's/^_FINISH_ALONE_MAXNREG = 128$/_FINISH_ALONE_MAXNREG = 96/'
build w16 's/^_FINISH_WARPS = 8$/_FINISH_WARPS = 16/'
echo "built .base and .cand/{cap96,w16}/pkgs"
