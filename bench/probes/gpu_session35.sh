#!/usr/bin/env bash
# Session 35: the full sparse benchmark after the EARLY_INDEX change (v8.2), on both Tritons, with the sparse GPU
# tests. T3.9: ORDER="t39 t36" after the split parts p0, p1 were stashed; carry [".big/p2", ".whl"].
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
quiet() { grep -v -E "nanobind|leaked" ; }
run_tag() {  # $1: tag (t36 / t39)
  timeout "${STEP_LIMIT:-300}" python3 bench/bench_sparse.py --out "$OUT/sparse-attention-$1.json" 2>&1 | quiet | tail -16
  timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_sparse.py \
    tests/test_kernel_codegen.py tests/test_sparse_tiles.py 2>&1 | quiet > "$OUT/gpu-tests-sparse-$1.log"
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu-tests-sparse-$1.log" | tail -6
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
