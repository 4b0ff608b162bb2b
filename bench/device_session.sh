#!/usr/bin/env bash
# One device call of evidence, from the repository root on the GPU machine:
#   bash bench/device_session.sh STAGE [ARGS] [then STAGE [ARGS]]...
#   (carry [".whl", ".overlay", ".base", ".gitcopy", ".triton-cache.txz"]); e.g. `pytest then qualify`
# Stages, run in the order given, each time-boxed, all output logged to $OUT/session.log;
# each stage's ARGS (the words up to the next "then") go to its command. "The call's
# remaining time" is 570 s less what has run: it assumes a 600 s call; where less device
# time is left, the call is cut first and its receipts do not come back:
#   tests    pytest -m gpu ARGS in the background, beside the next stages (not beside a
#            strict qualify: on 2026-12-01, with the kernels recompiling, the two shared the
#            machine, the qualification passed its 400 s limit and wrote no receipt; nor
#            beside a probe, whose timings they would disturb: run `gate` first instead)
#   pytest   pytest -m gpu ARGS in the foreground (e.g. -k some_test)
#   gate     pytest -m gpu ARGS in the foreground; the call stops here if they fail (so that
#            no receipt of the later stages comes from code that failed its GPU tests); with
#            a cold Triton cache `gate -k "test_selector_gpu or test_selector_tma"` took 415 s
#            in one process (2026-12-02) and 62 s as `gate -n 8 -k ...` (pytest-xdist, in
#            the device image: the compiles spread over the machine's 16 cores)
#   require  python3 ARGS; the call stops here if it fails (e.g. bench/ab_decide.py on the
#            call's A/B, $OUT/selector_ab-1.json: the later stages run only for a winner)
#   wait     wait for the background tests (before a timing stage)
#   need     N: end the call here (returning what it made) unless N seconds of its time are
#            left, so that a long stage (a strict qualify, ~380 s) is not started only to be
#            cut by the call's limit, which loses its receipt
#   qualify  pp3 qualify --profile strict ARGS with the call's remaining time (a strict run
#            takes ~310-370 s with the Triton cache of an earlier strict run carried, and
#            passed a 400 s limit without it on 2026-12-01; 343 s with .triton-cache.txz
#            carried on 2026-12-03: carry the cache)
#   peer     the same command as qualify, named for a run of a peer's sampler (e.g.
#            --verifier vllm-mrv2 --overlay .overlay/vllm-0.33.0, or --verifier flashinfer:
#            its wheels from .whl-fi/gpu, carry ".whl-fi/gpu")
#   oracle   pp3 oracle --device cuda ARGS
#   probe    pp3 probe --overlay .overlay/vllm-0.33.0 ARGS
#   pp3      pp3 ARGS (any command, e.g. `pp3 qualify --verifier vllm-mrv2 ...`), the call's
#            remaining time
#   ab       bench/selector_ab.py --base .base ARGS (.base/pp3kernels: an older kernel
#            package to compare with; carry ".base" too; a later --base in ARGS wins);
#            the call's n-th A/B returns as $OUT/selector_ab-n.json
#   script   python3 ARGS with the call's remaining time (e.g. bench/launch_split.py, which
#            times each of the selector's launches alone)
#   bash     bash ARGS with the call's remaining time (e.g. bench/ncu_phases.sh)
# The receipts this call wrote and the manifest return as $OUT/receipts.tar.part* (take them
# in with `bash bench/receipts_aside.sh take FILES_AT`); the Triton cache is returned as a tarball in
# parts (TRITON_CACHE_DIR lives in the repository, git-ignored; join the parts an earlier
# call returned into .triton-cache.tgz and carry it, and compiled kernels of unchanged
# source are reused; with a cold cache the GPU tests' gate took 295 s on 2026-12-01).
# The device machine's .git is the session's starting copy, not this tree's: carry a copy
# (`cp -r .git .gitcopy`, listed in .git/info/exclude) so receipts record the right commit.
# A shallow copy is a few MiB instead of the whole history, which leaves room in the 64 MiB
# that travel for the Triton cache or FlashInfer's wheels:
#   rm -rf .gitcopy /tmp/shallow && git clone -q --depth 1 "file://$PWD" /tmp/shallow \
#     && mv /tmp/shallow/.git .gitcopy && cp .git/info/exclude .gitcopy/info/exclude
# The committed receipts alone are about 59 MB (end of 2026-12-01), so the tree with
# anything more (FlashInfer's wheels, 26 MB; the Triton cache, ~30 MB) does not fit: before
# every call, here,
# `bash bench/receipts_aside.sh out RECEIPT_IT_SUPERSEDES.json` (MANIFEST.jsonl stays: the new
# line chains to its last one), and `bash bench/receipts_aside.sh back` after it.
set -o pipefail
[ -d .gitcopy ] && export GIT_DIR=$PWD/.gitcopy GIT_WORK_TREE=$PWD
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
# the call's remaining time (see above); PP3_CALL_S: the call's length where less device
# time is left than a whole call (the command's limit_s less ~30 s for the returns)
left() { echo $(( ${PP3_CALL_S:-570} - $(elapsed) )); }
# A warm machine keeps /tmp between calls: wheels an earlier call installed would stay on the
# path (2026-12-03: wheels carried once beyond orjson and crc32c, typer and rich among them,
# newer than the image's, made every later `pp3` call fail at import: no module named
# 'pydantic'), so the site starts empty. Carry in .whl only what the image lacks
# (orjson, crc32c).
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 3
if ls .whl-fi/gpu/*.whl >/dev/null 2>&1; then  # FlashInfer's wheels, when carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl-fi/gpu/*.whl 2>&1 | tail -5
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 \
  || { tail -20 /tmp/install.log; echo "editable install failed"; exit 3; }
export PP3_SCRATCH=/tmp/pp3-scratch PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.triton-cache
mkdir -p receipts "$TRITON_CACHE_DIR"
[ -f .triton-cache.tgz ] && tar -xzf .triton-cache.tgz -C "$TRITON_CACHE_DIR"
[ -f .triton-cache-new.tgz ] && tar -xzf .triton-cache-new.tgz -C "$TRITON_CACHE_DIR"
# the same caches merged and xz-compressed (a third of the gzip size: 17 MB for 380 MB of
# cache on 2026-12-03), through Python's lzma where the image lacks xz
[ -f .triton-cache.txz ] && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' .triton-cache.txz "$TRITON_CACHE_DIR"
marker=$(mktemp)
log=$OUT/session.log
say() { echo "== [$(elapsed)s] $*" | tee -a "$log"; }
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm --format=csv | tee -a "$log"
tests_pid=
while [ $# -gt 0 ]; do
  stage=$1; shift
  args=()  # the stage's own words, up to the next "then"
  while [ $# -gt 0 ] && [ "$1" != then ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  say "$stage ${args[*]}"
  case $stage in
    tests)
      (timeout 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8 \
        "${args[@]}" >"$OUT/pytest_gpu.log" 2>&1; echo "pytest exit $?" >>"$OUT/pytest_gpu.log") &
      tests_pid=$! ;;
    pytest)
      timeout 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider "${args[@]}" 2>&1 \
        | tee "$OUT/pytest_fg.log" | tail -40 | tee -a "$log"
      say "pytest exit ${PIPESTATUS[0]}" ;;
    gate)  # 420 s: a cold compile of tests/kernels/test_selector_gpu.py alone took 292 s
      timeout 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider "${args[@]}" 2>&1 \
        | tee "$OUT/pytest_gate.log" | tail -20 | tee -a "$log"
      gate_rc=${PIPESTATUS[0]}
      say "gate exit $gate_rc"
      [ "$gate_rc" = 0 ] || { say "gate failed: stopping"; exit 1; } ;;
    require)
      timeout 60 python3 "${args[@]}" 2>&1 | tail -20 | tee -a "$log"
      require_rc=${PIPESTATUS[0]}
      say "require exit $require_rc"
      [ "$require_rc" = 0 ] || { say "requirement not met: stopping"; exit 1; } ;;
    need)
      if [ "$(left)" -lt "${args[0]}" ]; then say "need ${args[0]} s, $(left) s left: ending the call"; break; fi ;;
    wait)
      if [ -n "$tests_pid" ]; then wait "$tests_pid"; tests_pid=; say "tests done"; fi
      tail -5 "$OUT/pytest_gpu.log" 2>/dev/null | tee -a "$log" ;;
    qualify|peer)
      timeout "$(left)" python3 -m pp3cli qualify --profile strict "${args[@]}" 2>&1 \
        | tail -80 | tee -a "$log"
      say "$stage exit ${PIPESTATUS[0]}" ;;
    oracle)
      timeout 100 python3 -m pp3cli oracle --device cuda "${args[@]}" 2>&1 | tail -60 | tee -a "$log"
      say "oracle exit ${PIPESTATUS[0]}" ;;
    ab)  # the n-th A/B of a call writes $OUT/selector_ab-n.json (its log goes to session.log)
      ab_n=$(( ${ab_n:-0} + 1 ))
      timeout 500 python3 bench/selector_ab.py --base .base --out "/tmp/ab-$ab_n" "${args[@]}" \
        2>&1 | tail -40 | tee -a "$log"
      say "ab exit ${PIPESTATUS[0]}"
      cp "/tmp/ab-$ab_n/selector_ab.json" "$OUT/selector_ab-$ab_n.json" 2>/dev/null ;;
    probe)
      timeout "$(left)" python3 -m pp3cli probe --overlay .overlay/vllm-0.33.0 \
        "${args[@]}" 2>&1 | tee -a "$log" | tail -80
      say "probe exit ${PIPESTATUS[0]}" ;;
    script)
      timeout "$(left)" python3 "${args[@]}" 2>&1 | tee "$OUT/script.log" \
        | tail -40 | tee -a "$log"
      say "script exit ${PIPESTATUS[0]}" ;;
    pp3)
      timeout "$(left)" python3 -m pp3cli "${args[@]}" 2>&1 | tail -60 | tee -a "$log"
      say "pp3 exit ${PIPESTATUS[0]}" ;;
    bash)
      timeout "$(left)" bash "${args[@]}" 2>&1 | tee "$OUT/bash.log" \
        | tail -60 | tee -a "$log"
      say "bash exit ${PIPESTATUS[0]}" ;;
    *) say "unknown stage $stage"; exit 2 ;;
  esac
done
if [ -n "$tests_pid" ]; then wait "$tests_pid"; say "tests done"; tail -30 "$OUT/pytest_gpu.log"; fi
# Only the receipts this call wrote, with the manifest, in one tarball: a call returns 8 files
# at most and silently drops the rest (on 2026-12-01 two receipts of a five-receipt call were
# lost that way, and had to be made again). Take them in here with
# `bash bench/receipts_aside.sh take FILES_AT`, which checks the manifest and the files.
find receipts -maxdepth 1 -name '*.json' -newer "$marker" -printf '%f\n' >/tmp/new-receipts
echo MANIFEST.jsonl >>/tmp/new-receipts
tar -cf - -C receipts -T /tmp/new-receipts | split -b 15m -d - "$OUT/receipts.tar.part"
say "receipts returned: $(tr '\n' ' ' </tmp/new-receipts)"
# Files come back at 16 MiB each at most: the cache returns in 15 MiB parts, three at most
# (join them here: cat triton-cache.tgz.part* > .triton-cache.tgz). Kernels of every source
# version seen stay in it: on 2026-12-01 it passed 30 MB after a kernel change (then the
# limit: it did not come back). Past ~30 MB it no longer travels beside FlashInfer's 26 MB
# of wheels within the 64 MiB a call carries; start a fresh one (carry none) after a kernel
# change if it has grown that far.
# Past that, only the kernels this call compiled return (the entries newer than the call's
# start), as triton-cache-new.tgz.part*: join them into .triton-cache-new.tgz, which the next
# call unpacks after .triton-cache.tgz (both travel, so keep them under the 64 MiB).
# Smaller: merge every cache taken in so far into one xz tarball, .triton-cache.txz, and carry
# it alone (2026-12-03: 59 MB of the two gzip tarballs made 17 MB, which left room for six
# receipts to supersede). Here: mkdir -p /tmp/tc; tar -xzf each .tgz (joined parts) -C /tmp/tc;
# tar -cf - -C /tmp/tc . | xz -9 -T2 > .triton-cache.txz (~80 s on two cores).
tar -czf /tmp/triton-cache.tgz -C "$TRITON_CACHE_DIR" .
cache_bytes=$(stat -c %s /tmp/triton-cache.tgz)
if [ "$cache_bytes" -le $(( 45 * 1024 * 1024 )) ]; then
  split -b 15m -d /tmp/triton-cache.tgz "$OUT/triton-cache.tgz.part" && ls -la "$OUT"/triton-cache.tgz.part*
else
  (cd "$TRITON_CACHE_DIR" && find . -mindepth 1 -maxdepth 1 -type d -newer "$marker" -printf '%f\n') \
    >/tmp/new-cache
  tar -czf /tmp/triton-cache-new.tgz -C "$TRITON_CACHE_DIR" -T /tmp/new-cache
  new_bytes=$(stat -c %s /tmp/triton-cache-new.tgz)
  if [ "$new_bytes" -le $(( 30 * 1024 * 1024 )) ]; then
    split -b 15m -d /tmp/triton-cache-new.tgz "$OUT/triton-cache-new.tgz.part"
    say "Triton cache of $cache_bytes bytes: returned its $(wc -l </tmp/new-cache) new entries ($new_bytes bytes)"
  else
    say "Triton cache of $cache_bytes bytes, $new_bytes new: too large to return"
  fi
fi
returned=$(find "$OUT" -type f | wc -l)
[ "$returned" -le 8 ] || say "WARNING: $returned files under \$OUT; a call returns 8 at most"
say "end"
