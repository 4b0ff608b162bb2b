#!/usr/bin/env bash
# Where the small-batch call spends its time, inside each launch: Nsight Compute on the
# selector's phase-1 and phase-2 kernels (one launch each after warm-up calls), full
# metric set with PC sampling, for point drafts at B1 T1, B1 T0 and B4 T1, and sparse
# S = 64 at B4 T1 (two launches a call; sparse q from 128 padded slots runs three below 16
# requests, the support launch finishing each request: step 28). Run on the device machine
# through bench/device_session.sh, whose set-up installs the package:
# `bash bench/device_session.sh bash bench/ncu_phases.sh` (~2 min); it writes
# $OUT/ncu.tgz.part* (the CSVs and logs; the binary reports stay behind).
# ncu reads the hardware counters on this machine's runtime (Firecracker; KINDS.md) and is
# given --clock-control none: the clocks are left as they are. Each case's report is
# printed as CSV: the details page (duration, registers, occupancy, warp states) and the
# source page at SASS level (per-instruction warp-stall samples, with the Python line where
# the compiler recorded one). Unpack here: cat FILES_AT/ncu.tgz.part* | tar -xz -C DIR.
set -uo pipefail
out=${OUT:?run on the device machine: \$OUT is its return folder}
work=$(mktemp -d)
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 3; }
"$ncu" --version | tail -1
# NCU_CASES (cases separated by ";"), NCU_LAUNCHES (launches profiled after the skipped
# ones: a stats and a finish launch per call) and NCU_SAMPLING (the warp-sampling interval,
# 2^(5+N) cycles; ncu's default picks it from the launch's length, which left a 12 µs finish
# with 39 samples on 2026-12-04: 0 samples every 32 cycles) override the defaults;
# NCU_CACHE=none keeps the caches between replays (ncu flushes them by default, so that
# the finish reads the partials phase 1 has just written from HBM, not L2).
# NCU_SECTIONS (e.g. "LaunchStats Occupancy": seconds instead of minutes) replaces the full
# set and the source pages; NCU_PKG (folders holding a pp3kernels/, e.g. .cand/ copies,
# separated by spaces) profiles each of those packages in turn instead of this tree's.
IFS=';' read -ra cases <<<"${NCU_CASES:-1 T1 point;1 T0 point;4 T1 point;4 T1 sparse64}"
sampling=()
[ -n "${NCU_SAMPLING:-}" ] && sampling=(--warp-sampling-interval "$NCU_SAMPLING")
[ -n "${NCU_CACHE:-}" ] && sampling+=(--cache-control "$NCU_CACHE")
what=(--set full --import-source yes)
if [ -n "${NCU_SECTIONS:-}" ]; then
  what=()
  for section in $NCU_SECTIONS; do what+=(--section "$section"); done
fi
site=${PYTHONPATH:-}
for pkg in ${NCU_PKG:-.}; do
for case in "${cases[@]}"; do
  set -- $case
  name="b$1_$2_$3"
  export PYTHONPATH="$site"  # this tree's pp3kernels, unless NCU_PKG names another
  if [ "$pkg" != . ]; then
    name="$(basename "$pkg")_$name"
    export PYTHONPATH="$(realpath "$pkg")${site:+:$site}"
  fi
  echo "== $name"
  # 2 launches a call (3 for dense q): skip the first 4 calls' launches, then profile
  # NCU_LAUNCHES of the calls after them.
  timeout 240 "$ncu" --clock-control none --target-processes all \
    -k regex:'chain_(stats|finish)_kernel' --launch-skip 8 --launch-count "${NCU_LAUNCHES:-2}" \
    "${sampling[@]}" "${what[@]}" -f -o "$work/$name" \
    python3 bench/profile_call.py --batch "$1" --temps "$2" --q "$3" --calls "$(( 4 + ${NCU_LAUNCHES:-2} / 2 ))" \
    >"$work/$name.log" 2>&1
  echo "ncu exit $?"; tail -3 "$work/$name.log"
  [ -f "$work/$name.ncu-rep" ] || continue
  "$ncu" -i "$work/$name.ncu-rep" --page details --csv >"$work/$name.details.csv" 2>&1
  for kernel in chain_stats_kernel chain_finish_kernel; do
    [ -n "${NCU_SECTIONS:-}" ] && break
    "$ncu" -i "$work/$name.ncu-rep" -k "$kernel" --page source --csv --print-source sass \
      >"$work/$name.$kernel.sass.csv" 2>&1
    "$ncu" -i "$work/$name.ncu-rep" -k "$kernel" --page source --csv \
      --print-source cuda,sass >"$work/$name.$kernel.source.csv" 2>&1
  done
  grep -E '"(Duration|Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|Shared Memory Configuration Size)"' \
    "$work/$name.details.csv" | cut -d, -f5-6,12-15 | head -12
done
done
tar -czf /tmp/ncu.tgz -C "$work" --exclude="*.ncu-rep" . && split -b 15m -d /tmp/ncu.tgz "$out/ncu.tgz.part"
ls -la "$out"/ncu.tgz.part*
