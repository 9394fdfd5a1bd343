#!/usr/bin/env bash
# Session 32: the CLI's CUDA-graphs default for FP8 image runs, checked on a GPU (one device call per Triton).
#   T3.6: bash lab/probes/gpu_cli_default.sh t36                       carry [".whl"]
#   T3.9: after the split wheel's p0, p1 were stashed: bash lab/probes/gpu_cli_default.sh t39   carry [".big/p2", ".whl"]
# Runs tests/test_gpu_cli.py, then `sagegen compare flux.1-dev --random-weights --linear fp8` with the default
# (graphs) and with --no-cuda-graphs (STEPS steps, one prompt; TESTS=0 skips the test); logs and the run directories' manifests go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
TAG=${1:?usage: gpu_cli_default.sh t36|t39}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
if [[ $TAG == t39 ]]; then [[ -f /tmp/bigwheel/env.sh ]] || bash .big/p2/stash.sh .big/p2 || exit 1; source /tmp/bigwheel/env.sh; fi
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__)" \
  | tee $OUT/versions-$TAG.txt
quiet() { grep -v -E "nanobind|leaked" ; }
[[ ${TESTS:-1} == 1 ]] && timeout ${TEST_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_cli.py 2>&1 | quiet \
  | tee $OUT/gpu-tests-cli-$TAG.log | tail -15
[[ ${COMPARE:-1} == 1 ]] || exit 0
for mode in auto eager; do
  flags=$([[ $mode == eager ]] && echo "--no-cuda-graphs" || echo "")
  timeout ${COMPARE_LIMIT:-200} python3 -m sagegen compare ${MODEL:-flux.1-dev} --random-weights --linear fp8 \
    -p "a lighthouse at dusk" --steps ${STEPS:-8} --device cuda $flags --out /tmp/cmp-$mode-$TAG 2>&1 | quiet \
    | tee $OUT/compare-$mode-$TAG.log | tail -25
  cp /tmp/cmp-$mode-$TAG/manifest.json $OUT/compare-$mode-$TAG-manifest.json 2>/dev/null
done
