#!/usr/bin/env bash
# Session 29: where the eager host time goes on Triton 3.6 and 3.9, same machine, one device call (after the
# split Triton 3.9 parts p0, p1 were stashed): probe_launch_host (LAUNCH=1), probe_step_gc (GC: models) and
# probe_host_profile (MODELS, VARIANTS), on the Tritons in ORDER. Optional TESTS runs pytest on both. Everything is teed to $OUT.
# TREES (session 30): folders that each hold a `sagegen` package, run in turn within each Triton, each from inside
# its folder (an A/B of two commits in one call): e.g. `bash lab/probes/ab_tree.sh 610e59c` writes .ab/610e59c/sagegen, then
# TREES="$PWD .ab/610e59c" with carry [".big/p2", ".whl", ".ab"]. Default: this checkout only.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
BASE_PYTHONPATH=${PYTHONPATH:-}
quiet() { grep -v -E "nanobind|leaked" ; }
one() {  # $1: tag
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $OUT/versions-$1.txt
  if [[ ${LAUNCH:-1} == 1 ]]; then
    python3 lab/probes/probe_launch_host.py --out $OUT/launch-host-$1.json 2>&1 | quiet | grep -E "us/call" | head -20
  fi
  for model in ${GC:-}; do
    python3 lab/probes/probe_step_gc.py $model --linear fp8 --rounds ${ROUNDS:-5} --out $OUT/step-gc-$model-$1.json 2>&1 | quiet | tail -12
  done
  for model in ${MODELS:-}; do
    python3 lab/probes/probe_host_profile.py --model $model --variants ${VARIANTS:-attention,fp8} --steps 3 --top 40 \
      --out $OUT/host-profile-$model-$1.json 2>&1 | quiet | head -60
  done
  if [[ -n ${TESTS:-} && -d tests ]]; then  # groups split by "|" run at once, group i on GPU i
    IFS='|' read -ra groups <<< "$TESTS"
    for i in "${!groups[@]}"; do
      dev=$([[ ${#groups[@]} -gt 1 ]] && echo "$i" || echo "${CUDA_VISIBLE_DEVICES:-}")
      CUDA_VISIBLE_DEVICES=$dev timeout ${TEST_LIMIT:-570} python3 -m pytest -q -p no:cacheprovider -rfE \
        --durations=15 ${groups[$i]} 2>&1 | quiet > $OUT/gpu-tests-$1-g$i.log &
    done
    wait
    for i in "${!groups[@]}"; do echo "group $i: ${groups[$i]}"; grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu-tests-$1-g$i.log | tail -20; done
  fi
}
[[ ${ORDER:-t36 t39} == *t39* ]] && { bash .big/p2/stash.sh .big/p2 || exit 1; }
n=0
for t in ${ORDER:-t36 t39}; do  # e.g. ORDER="t36 t39 t36": a repeat shows the host's drift
  for tree in ${TREES:-$PWD}; do
    n=$((n + 1))
    tree=$(realpath "$tree")
    label=$([[ $tree == "$PWD" ]] && echo "" || echo "-$(basename "$tree")")
    # The probes put their checkout's root first on sys.path: another tree gets this checkout's bench/ and runs there.
    [[ $tree != "$PWD" ]] && tar -C "$PWD" --exclude=bench/results -cf - bench | tar -C "$tree" -xf -
    export PYTHONPATH=/tmp/site:$tree:$BASE_PYTHONPATH
    (cd "$tree" && python3 -c "import sagegen, os; print('sagegen from', os.path.dirname(sagegen.__file__))")
    if [[ $t == t39 ]]; then (cd "$tree" && source /tmp/bigwheel/env.sh && one t39$label-$n)
    else (cd "$tree" && one t36$label-$n); fi
  done
done
