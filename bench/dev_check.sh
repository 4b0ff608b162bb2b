set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,power.limit,clocks.sm --format=csv
PYTHONUNBUFFERED=1 timeout 420 python3 bench/gpu_check.py 2>&1 | tee $OUT/gpu_check.log
PYTHONUNBUFFERED=1 timeout 120 python3 -m pytest -q -m gpu tests -x 2>&1 | tail -15
