#!/usr/bin/env bash
# Session 35 (one tag a call; T3.9: ORDER=t39 after the split parts p0, p1 were stashed; carry [".big/p2", ".whl"]):
# GROUP=sparse: the full sparse benchmark after the EARLY_INDEX change (v8.2) with the sparse GPU tests;
# GROUP=list: the tile list staged in shared memory (gluon_attn.list_in_smem) against the copy in .ab/sagegen_base
# (`mkdir .ab && git archive <rev> sagegen | tar -x -C .ab && mv .ab/sagegen .ab/sagegen_base`, carry .ab), with it
# also on at head dim 128 in the probe, then the kernel's GPU tests and the full sparse benchmark.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
quiet() { grep -v -E "nanobind|leaked" ; }
tests() {  # $1: tag, the rest: test files
  local tag=$1
  shift
  timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -rfE "$@" 2>&1 | quiet > "$OUT/gpu-tests-$tag.log"
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu-tests-$tag.log" | tail -6
}
sparse_bench() {
  timeout "${STEP_LIMIT:-300}" python3 bench/bench_sparse.py --out "$OUT/sparse-attention-$1.json" 2>&1 | quiet \
    | grep -E "wrote|Error" | tail -3
  python3 -c "
import json; d = json.load(open('$OUT/sparse-attention-$1.json'))
for r in d['rows']: print(r['shape'][2:], r['target_density'], round(r['sparse_over_dense'], 3), round(r['target_ratio'], 3), round(r['flex_over_sagegen_sparse'], 2))"
}
run_tag() {  # $1: tag (t36 / t39)
  case ${GROUP:-sparse} in
    sparse) sparse_bench "$1"
            tests "sparse-$1" tests/test_gpu_sparse.py tests/test_kernel_codegen.py tests/test_sparse_tiles.py ;;
    list) timeout 240 python3 lab/probes/probe_sparse_index_loads.py --base .ab --list-limit 128=1024 \
            --out "$OUT/probe-sparse-list-$1.json" 2>&1 | quiet | grep -E "shape|wrote|Error" | tail -5
          tests "sparse-list-$1" tests/test_gpu_sparse.py tests/test_gpu.py
          sparse_bench "list-$1" ;;
  esac
}
[[ ${ORDER:-t36} == *t39* ]] && { bash .big/p2/stash.sh .big/p2 || exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for t in ${ORDER:-t36}; do
  if [[ $t == t39 ]]; then
    (source /tmp/bigwheel/env.sh && python3 -c "import triton; print('triton', triton.__version__)" && run_tag t39)
  else
    python3 -c "import triton; print('triton', triton.__version__)" && run_tag t36
  fi
done
