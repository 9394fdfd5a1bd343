#!/usr/bin/env bash
# Session 32, one device call after the split Triton 3.9 parts p0, p1 were stashed (carry [".big/p2", ".whl"]):
# for each Triton in ORDER, the graph tests (replays counting their calls) and the CLI test, then
# `sagegen bench MODEL --linear fp8 --cuda-graphs` for MODELS. Everything is teed to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
quiet() { grep -v -E "nanobind|leaked" ; }
one() {  # $1: tag
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions-$1.txt
  if [[ -n ${TESTS-tests/patch/test_gpu_graphs.py tests/cli/test_gpu_cli.py} ]]; then
    timeout ${TEST_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider -rfE ${TESTS-tests/patch/test_gpu_graphs.py \
      tests/cli/test_gpu_cli.py} 2>&1 | quiet > $OUT/gpu-tests-$1.log
    grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests-$1.log | tail -8
  fi
  for model in ${MODELS:-}; do
    timeout ${BENCH_LIMIT:-200} python3 -m sagegen bench $model --linear fp8 --cuda-graphs --repeats 5 \
      --no-zero-attention --out $OUT/model-step-$model-fp8-graphs-$1.json 2>&1 | quiet | tail -14
  done
}
[[ ${ORDER:-t36 t39} == *t39* ]] && { bash .big/p2/stash.sh .big/p2 || exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for t in ${ORDER:-t36 t39}; do
  if [[ $t == t39 ]]; then (source /tmp/bigwheel/env.sh && one t39); else one t36; fi
done
