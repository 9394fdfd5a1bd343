#!/usr/bin/env bash
# One device call for the FP8 attention output (session 27): GPU tests, the old tree's codegen test, the benchmark.
set -uo pipefail
export PYTHONUNBUFFERED=1
TAG=${TAG:-t36}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
fi
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions-$TAG.txt
if [[ -d abbase ]]; then
  (cd abbase && python3 -m pytest -q -p no:cacheprovider tests/test_kernel_codegen.py -k sm89 2>&1 | tail -3) | tee $OUT/codegen-old-$TAG.txt
fi
python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_gpu_fp8_out.py tests/test_kernel_codegen.py} -s > $OUT/gpu-tests-$TAG.log 2>&1
grep -v nanobind $OUT/gpu-tests-$TAG.log | grep -E "rel. L1|codes one|vs stock|passed|failed|^FAILED|Error" | tail -30
if [[ -n ${BENCH:-} ]]; then
  python3 bench/bench_out_proj.py --rounds ${ROUNDS:-9} --out $OUT/out-proj-$TAG.json 2>&1 | grep -v nanobind | tail -8
fi
