#!/usr/bin/env bash
# One device call: install carried wheels, run the GPU tests and the attention benchmark; results under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
MODE=${1:-all}
if [[ $MODE == all || $MODE == tests ]]; then
  python3 -m pytest -q tests/kernels/test_gpu.py tests/kernels/test_triton_interpret.py -s -p no:cacheprovider 2>&1 | tee $OUT/tests.log | tail -40
fi
if [[ $MODE == tune ]]; then
  python3 lab/probes/tune_attention.py --out $OUT/tune.json 2>&1 | tee $OUT/tune.log
fi
if [[ $MODE == all || $MODE == bench ]]; then
  python3 bench/bench_attention.py --out $OUT/attention.json --plot $OUT/attention.png ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench.log
fi
