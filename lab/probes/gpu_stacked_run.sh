#!/usr/bin/env bash
# Device calls for the FP8 linears (session 28; it replaces session 27's gpu_fp8_out_run.sh): GPU tests (TESTS), the stacked Q/K/V GEMM and the rows not yet measured
# (LINEAR: bench_fp8_linear indices, eager and as CUDA graphs), bench_out_proj (OUTPROJ: model names), and an A/B
# of the stacked GEMM in whole steps (AB: model names). Everything is teed to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
TAG=${TAG:-t36}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
fi
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions-$TAG.txt
quiet() { grep -v -E "nanobind|leaked" ; }
if [[ -n ${TESTS:-} ]]; then
  python3 -m pytest -q -p no:cacheprovider $TESTS -s 2>&1 | quiet > $OUT/gpu-tests-$TAG.log
  grep -E "vs stock|passed|failed|^FAILED|Error" $OUT/gpu-tests-$TAG.log | tail -30
fi
if [[ -n ${LINEAR:-} ]]; then
  python3 bench/bench_fp8_linear.py --only $LINEAR --no-torchao --no-sweep --rounds 3 \
    --out $OUT/fp8-linear-$TAG.json 2>&1 | quiet | tail -12
  python3 bench/bench_fp8_linear.py --only $LINEAR --no-torchao --no-sweep --rounds 3 --cuda-graphs \
    --out $OUT/fp8-linear-graphs-$TAG.json 2>&1 | quiet | tail -12
fi
if [[ -n ${OUTPROJ:-} ]]; then
  python3 bench/bench_out_proj.py --only $OUTPROJ --rounds ${ROUNDS:-5} --out $OUT/out-proj-$TAG.json 2>&1 | quiet | tail -8
fi
for model in ${AB:-}; do  # (AB_GRAPHS=0: eager only)
  python3 lab/probes/ab_step_flag.py $model sagegen.linear.stacked.ENABLED --linear fp8 --rounds ${AB_ROUNDS:-3} \
    --out $OUT/ab-step-stacked-$model-$TAG.json 2>&1 | quiet | tail -2
  if [[ ${AB_GRAPHS:-1} == 1 ]]; then
    python3 lab/probes/ab_step_flag.py $model sagegen.linear.stacked.ENABLED --linear fp8 --rounds ${AB_ROUNDS:-3} \
      --cuda-graphs --out $OUT/ab-step-stacked-graphs-$model-$TAG.json 2>&1 | quiet | tail -2
  fi
done
