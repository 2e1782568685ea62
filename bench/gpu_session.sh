#!/usr/bin/env bash
# One stage of the GPU checks of docs/gpu.md, on the lent GPU machine (the `device` tool's `run`,
# with `.whl` carried: make it here first with bench/gpu_wheels.sh). Each stage fits one
# 10-minute command and writes its figures under $OUT:
#
#   bash bench/gpu_session.sh tests   # tests/test_cuda.py and the CUDA cases elsewhere
#   bash bench/gpu_session.sh speed   # bench/gpu_speed.py: the issue's table, BatchNorm train
#   bash bench/gpu_session.sh eval    # the same with BatchNorm eval, no paper-budget run
#   bash bench/gpu_session.sh kkt     # KKT iteration: eager, captured, 8 runs packed
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench_out/gpu}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
python3 - <<'PY' | tee "$OUT/device.txt"
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
print(f"torch {torch.__version__}, {name}")
PY
case "${1:-tests}" in
  tests)
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
      tests/test_inverting_gradients.py tests/test_restarts.py -k "cuda" 2>&1 \
      | tee "$OUT/tests.log" ;;
  speed)
    python3 bench/gpu_speed.py --device cuda 2>&1 | tee "$OUT/gpu_speed_train.txt" ;;
  eval)
    python3 bench/gpu_speed.py --device cuda --batchnorm eval --paper-iterations 0 2>&1 \
      | tee "$OUT/gpu_speed_eval.txt" ;;
  kkt)
    for args in "--no-capture" "" "--runs 8 --pack 1" "--runs 8 --pack 8"; do
      # shellcheck disable=SC2086
      python3 bench/kkt_speed.py --device cuda --iterations 2000 --window 200 $args 2>&1
    done | tee "$OUT/kkt_speed.txt" ;;
  *)
    echo "unknown stage ${1}; one of tests, speed, eval, kkt" >&2; exit 2 ;;
esac
