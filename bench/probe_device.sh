#!/usr/bin/env bash
# Run `pp3 probe` on the GPU machine, from the repository root. Installs nothing from the
# network: packages the device image lacks (orjson, crc32c) travel as wheels in .whl/
# (carry ".whl"); the vLLM overlay travels in .overlay/ (carry ".overlay", made here with
# `pp3 overlay fetch --dest .overlay`). Receipts go to receipts/ and are copied to $OUT.
#
#   device run, carry [".whl", ".overlay"]:  bash bench/probe_device.sh [probe options]
set -euo pipefail
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c 'import orjson, crc32c, pynvml, typer, rich, filelock, torch, triton;
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())'

OUT=${OUT:-$PWD/probe-out}
mkdir -p "$OUT" receipts
export PP3_SCRATCH=${PP3_SCRATCH:-/tmp/pp3-scratch}
overlay=()
if [ -f .overlay/vllm-0.33.0/PP3_OVERLAY.json ]; then
  overlay=(--overlay .overlay/vllm-0.33.0)
fi
marker=$(mktemp)
set +e
PYTHONUNBUFFERED=1 python3 -m pp3cli --receipts receipts probe "${overlay[@]}" "$@" \
  2> >(tee "$OUT/probe.stderr" >&2) | tee "$OUT/probe.stdout"
status=${PIPESTATUS[0]}
set -e
find receipts -maxdepth 1 -name 'probe-*.json' -newer "$marker" -exec cp {} "$OUT"/ \;
cp receipts/MANIFEST.jsonl "$OUT"/ 2>/dev/null || true
rm -f "$marker"
echo "pp3 probe exit status: $status" >&2
exit "$status"
