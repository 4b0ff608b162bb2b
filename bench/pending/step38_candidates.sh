#!/usr/bin/env bash
# Builds, from this tree's kernels/, the packages of the thirty-eighth session's test of the
# B4 / B16 register loss (bench/NOTES.md): .base (main) and, each as .cand/NAME/pkgs,
#   s37       step 37 (the narrow support's sums by sort and segmented scan; 122 registers)
#   cap128    main with only the finish launch held to 128 registers (measurement only)
#   c16       main with the finish asking the 16 KB split (one of its programs a multiprocessor)
#   s37c16    step 37 + c16
#   cap128c16 cap128 + c16
# Run here, from the repository root; carry [".whl", ".base", ".cand"] (and the Triton cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
pending=bench/pending
rm -rf .base .cand/s37 .cand/cap128 .cand/c16 .cand/s37c16 .cand/cap128c16
mkdir -p .base
cp -r kernels/pp3kernels .base/
build() {  # NAME PATCH...
  local name=$1
  shift
  local dest=.cand/$name/pkgs
  mkdir -p "$dest"
  cp -r kernels/pp3kernels "$dest/"
  for patch in "$@"; do
    # the patches name kernels/pp3kernels/...; the copy lives at $dest/pp3kernels/...
    git apply --directory="$dest" -p2 --include="$dest/pp3kernels/*" "$pending/$patch" \
      || { echo "$patch does not apply to $dest" >&2; exit 1; }
  done
}
build s37 v5-step37-sorted-membership.patch
build cap128 measure-finish-cap128.patch
build c16 v5-step38-finish-alone.patch
build s37c16 v5-step37-sorted-membership.patch v5-step38-finish-alone.patch
build cap128c16 measure-finish-cap128.patch v5-step38-finish-alone.patch
echo "built .base and .cand/{s37,cap128,c16,s37c16,cap128c16}/pkgs"
