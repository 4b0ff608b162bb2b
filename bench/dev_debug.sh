set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
PYTHONUNBUFFERED=1 timeout 200 python3 bench/gpu_debug.py > $OUT/gpu_debug.log 2>&1; echo "debug rc=$?"
grep -v "^ *%\|^ *tt\.\|^ *scf\|^ *arith\|^ *ttg\|^ *}" $OUT/gpu_debug.log | head -60
PYTHONUNBUFFERED=1 timeout 150 python3 bench/gpu_check.py timings 2>&1 | tail -22 | tee $OUT/timings.log
