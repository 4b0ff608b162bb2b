#!/usr/bin/env bash
# Builds the twenty-eighth to thirtieth sessions' A/B candidates (bench/NOTES.md) as
# .cand/<name>/pp3kernels, and .base/pp3kernels as this commit's kernels (step 31), from the
# repository root:
#   p100  step 33: every launch of a split-vocabulary call asks for a 100% carveout (and the
#         merged row statistics' terms from _combine_max_sum's and _first_argmax's helpers,
#         and the unpin blocks as _unpinned_each: the twins patch)
#   p7    step 33 at 7% (16 KB, the finish's own split at B4; phase 1 moves to it)
#   e100  step 33 + the chunk masses' merged reduction for every q (the point finish at 2 KB
#         shared memory: the bisection's variant e, which lost 2.8 µs at B4 without it)
#   s32   step 33 + step 32 (the chunk masses' and membership's merges, sparse q only)
#   sel   step 33 + step 34 (the prefetched stop row taken by selects, its membership sums
#         slots minor, the scatter without its lane count: the S = 64 finish only, 74 -> 47
#         block barriers at B4)
#   sel176 sel + step 35 (below 16 requests that finish compiled to at most 176 registers, so
#         that it fits a multiprocessor beside one phase-1 program: 224 -> 176 at B4)
# then, on the device: bash bench/device_session.sh ab --rounds 2 --new .cand/p100 ...
set -euo pipefail
here=bench/pending
tmp=$(mktemp -d)
git archive HEAD kernels/pp3kernels tests docs | tar -x -C "$tmp"
rm -rf .base/pp3kernels .cand/p100 .cand/p7 .cand/e100 .cand/s32 .cand/sel .cand/sel176
mkdir -p .base .cand/p100
cp -r "$tmp/kernels/pp3kernels" .base/
(cd "$tmp" && patch -s -p1 <"$OLDPWD/$here/v5-step33-carveout.patch")
# the same SASS as step 31 in every kernel the default plans launch (NOTES): in every candidate
(cd "$tmp" && patch -s -p1 <"$OLDPWD/$here/v5-step33-twins.patch")
cp -r "$tmp/kernels/pp3kernels" .cand/p100/
for name in p7 e100 s32; do cp -r .cand/p100 ".cand/$name"; done
(cd "$tmp" && patch -s -p1 <"$OLDPWD/$here/v5-step34-stop-row-selects.patch")
mkdir -p .cand/sel && cp -r "$tmp/kernels/pp3kernels" .cand/sel/
(cd "$tmp" && patch -s -p1 <"$OLDPWD/$here/v5-step35-finish-maxnreg.patch")
mkdir -p .cand/sel176 && cp -r "$tmp/kernels/pp3kernels" .cand/sel176/
sed -i 's/^_CARVEOUT = 100$/_CARVEOUT = 7/' .cand/p7/pp3kernels/selector.py
grep -q '^_CARVEOUT = 7$' .cand/p7/pp3kernels/selector.py
for name in e100 s32; do
  (cd ".cand/$name" && patch -s -p2 <"../../$here/v5-step32-sparse-merges.patch")
done
chain=.cand/e100/pp3kernels/jit/chain.py
grep -q '            BLOCK_B == 1 and S > 1 and Q_MODE == _Q_SPARSE,' "$chain"
sed -i 's/^            BLOCK_B == 1 and S > 1 and Q_MODE == _Q_SPARSE,$/            BLOCK_B == 1,/' "$chain"
rm -rf "$tmp"
ls .base .cand
