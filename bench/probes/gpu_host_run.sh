#!/usr/bin/env bash
# Session 29: where the eager host time goes on Triton 3.6 and 3.9, same machine, one device call (after the
# split Triton 3.9 parts p0, p1 were stashed): probe_launch_host and probe_host_profile (MODEL, VARIANTS) on
# T3.6, then on T3.9. Optional TESTS runs pytest on both. Everything is teed to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
quiet() { grep -v -E "nanobind|leaked" ; }
one() {  # $1: tag
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions-$1.txt
  python3 bench/probes/probe_launch_host.py --out $OUT/launch-host-$1.json 2>&1 | quiet | grep -E "us/call|jit.py|driver|descriptor" | head -40
  for model in ${MODELS:-flux.1-dev}; do
    python3 bench/probes/probe_host_profile.py --model $model --variants ${VARIANTS:-attention,fp8} --steps 3 --top 40 \
      --out $OUT/host-profile-$model-$1.json 2>&1 | quiet | head -60
  done
  if [[ -n ${TESTS:-} ]]; then
    python3 -m pytest -q -p no:cacheprovider $TESTS 2>&1 | quiet > $OUT/gpu-tests-$1.log
    grep -E "passed|failed|^FAILED" $OUT/gpu-tests-$1.log | tail -20
  fi
}
if [[ ${FIRST:-t36} == t36 ]]; then (one t36); fi
bash .big/p2/stash.sh .big/p2 && source /tmp/bigwheel/env.sh && one t39
if [[ ${FIRST:-t36} != t36 ]]; then unset TRITON_PTXAS_BLACKWELL_PATH; PYTHONPATH=/tmp/site:$PWD one t36; fi
