#!/usr/bin/env bash
# Session 34: the README's step table measured again on one GPU with today's code, a group a device call
# (GROUP=a / a2: HunyuanVideo / HunyuanVideo-1.5; b: Wan 14B and the GPU test of the cross-attention Q route; c: the other
# presets; wan: the two Wan T2V presets, for Triton 3.9), the sparse attention benchmark (GROUP=sparse), and the
# sparse loop's index loads against the copy in .ab/sagegen_base with the kernel's GPU tests (GROUP=idx; make the
# copy with `mkdir .ab && git archive <rev> sagegen | tar -x -C .ab && mv .ab/sagegen .ab/sagegen_base`, carry .ab).
# T3.9: ORDER=t39 after the split parts p0, p1 were stashed; carry [".big/p2", ".whl"]. Everything lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
quiet() { grep -v -E "nanobind|leaked" ; }
step() {  # $1: tag, $2: preset, the rest: bench options
  local tag=$1 model=$2
  shift 2
  timeout "${STEP_LIMIT:-420}" python3 bench/bench_model_step.py "$model" "$@" --no-zero-attention \
    --out "$OUT/model-step-$model-$tag.json" 2>&1 | quiet | tail -3
}
group() {  # $1: group, $2: tag
  case $1 in
    a) step "$2" hunyuanvideo --sparse topk=0.5,blocks=none --linear fp8 --repeats 1 ;;
    a2) step "$2" hunyuanvideo-1.5-720p --sparse topk=0.5 --linear fp8 --repeats 1 ;;
    b) timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/linear/test_gpu_fp8.py -k cross_q 2>&1 | quiet \
         > "$OUT/gpu-tests-cross-q-$2.log"
       grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu-tests-cross-q-$2.log" | tail -4
       step "$2" wan2.1-t2v-14b --sparse topk=0.5 --linear fp8 --repeats 2
       step "$2" wan2.1-t2v-1.3b --linear fp8 --repeats 3 ;;
    c) step "$2" wan2.2-ti2v-5b --linear fp8 --repeats 2
       step "$2" cogvideox-5b --linear fp8 --repeats 3
       step "$2" ltx-video --linear fp8 --repeats 5
       step "$2" qwen-image --linear fp8 --cuda-graphs --repeats 5
       step "$2" sd3.5-large --linear fp8 --cuda-graphs --repeats 5
       step "$2" flux.1-dev --linear fp8 --cuda-graphs --repeats 5 ;;
    wan) step "$2" wan2.1-t2v-14b --linear fp8 --repeats 2
         step "$2" wan2.1-t2v-1.3b --linear fp8 --repeats 3 ;;
    idx) timeout 200 python3 lab/probes/probe_sparse_index_loads.py --base .ab \
           --out "$OUT/probe-sparse-index-loads-$2.json" 2>&1 | quiet | grep -E "shape|wrote|Error" | tail -5
         timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_gpu_sparse.py \
           tests/kernels/test_gpu.py 2>&1 | quiet > "$OUT/gpu-tests-sparse-$2.log"
         grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu-tests-sparse-$2.log" | tail -6 ;;
    sparse) timeout "${STEP_LIMIT:-420}" python3 bench/bench_sparse.py --out "$OUT/sparse-attention-$2.json" 2>&1 \
              | quiet | tail -20 ;;
  esac
}
[[ ${ORDER:-t36} == *t39* ]] && { bash .big/p2/stash.sh .big/p2 || exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for t in ${ORDER:-t36}; do
  if [[ $t == t39 ]]; then
    (source /tmp/bigwheel/env.sh && python3 -c "import triton; print('triton', triton.__version__)" \
      && for g in ${GROUP:-b}; do group "$g" t39; done)
  else
    python3 -c "import triton; print('triton', triton.__version__)"
    for g in ${GROUP:-b}; do group "$g" t36; done
  fi
done
