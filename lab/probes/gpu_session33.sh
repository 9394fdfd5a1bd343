#!/usr/bin/env bash
# Session 33, one device call per Triton (T3.9: after the split parts p0, p1 were stashed; carry [".big/p2", ".whl"]):
# the GPU tests the cross-attention Q change touches, the layer probe at Wan's three widths, and (STEPS) whole-step
# A/B of the switch with FP8 linears. Everything is teed to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
quiet() { grep -v -E "nanobind|leaked" ; }
one() {  # $1: tag
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions-$1.txt
  if [[ -n ${TESTS-x} ]]; then
    timeout ${TEST_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider -rfE ${TESTS-tests/test_gpu_fp8.py \
      tests/test_gpu_fp8_out.py tests/test_cross_q_fp8.py tests/test_residual_norm.py} 2>&1 | quiet > $OUT/gpu-tests-$1.log
    grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests-$1.log | tail -8
  fi
  timeout ${PROBE_LIMIT:-150} python3 lab/probes/probe_cross_q_fp8.py --rounds ${ROUNDS:-5} \
    --out $OUT/probe-cross-q-fp8-$1.json 2>&1 | quiet | tail -5
  for model in ${STEPS:-}; do
    timeout ${STEP_LIMIT:-200} python3 lab/probes/ab_step_flag.py $model sagegen.patch.fp8_out.CROSS_Q_FP8 \
      --linear fp8 --rounds 3 --out $OUT/ab-step-cross-q-$model-$1.json 2>&1 | quiet | tail -6
  done
}
[[ ${ORDER:-t36 t39} == *t39* ]] && { bash .big/p2/stash.sh .big/p2 || exit 1; }
export PYTHONPATH=/tmp/site:$PWD
for t in ${ORDER:-t36 t39}; do
  if [[ $t == t39 ]]; then (source /tmp/bigwheel/env.sh && one t39); else one t36; fi
done
