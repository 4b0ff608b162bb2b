#!/usr/bin/env bash
# One GPU session's evidence: GPU tests, oracle, probe and the strict qualification, each
# time-boxed, receipts written to receipts/ and copied to $OUT with the manifest.
set -o pipefail
start=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - start) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PP3_SCRATCH=/tmp/pp3-scratch PYTHONUNBUFFERED=1
mkdir -p receipts
log=$OUT/device_final.log
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv | tee -a $log
echo "== pytest -m gpu" | tee -a $log
timeout 110 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -25 | tee -a $log
echo "== oracle (left $(left)s)" | tee -a $log
timeout 70 python3 -m pp3cli oracle --device cuda 2>&1 | tail -15 | tee -a $log
echo "== probe (left $(left)s)" | tee -a $log
timeout 170 python3 -m pp3cli probe --batch 1,4,64 --depth 4,5 --overlay .overlay/vllm-0.33.0 2>&1 | tail -45 | tee -a $log
t=$(left); echo "== qualify strict (left ${t}s)" | tee -a $log
timeout $(( t > 30 ? t - 15 : 15 )) python3 -m pp3cli qualify --profile strict 2>&1 | tail -30 | tee -a $log
cp receipts/*.json receipts/MANIFEST.jsonl $OUT/ 2>/dev/null
ls receipts | tee -a $log
