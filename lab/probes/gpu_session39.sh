#!/usr/bin/env bash
# Session 39 (issues 56, 57). Carry [".whl"]. GROUP=e: Wan2.1-14B 720p peak memory with FP8 linears (bf16 copies on
# the host), then Flux.1-dev's compiled row (regional): stock, sagegen, sagegen FP8, torchao float8 with stock
# attention. GROUP=f: the compiled rows of Wan2.1-1.3B 480p and CogVideoX-5b, then the compile-mode GPU tests.
# GROUP=h: Flux's torchao row (cut off in e), then Wan2.1-1.3B's compiled row. GROUP=g: time to video on Flux.1-dev (28 steps) after a tiny smoke run of the e2e bench.
set -uo pipefail
export PYTHONUNBUFFERED=1
if [[ ! -d /tmp/site ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
D=2026-12-07
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
quiet() { grep -v -E "nanobind|leaked|Warning|warn\(" ; }
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
step() {  # $1: limit s, $2: model, $3: file tag, the rest: bench options
  local limit=$1 model=$2 tag=$3
  shift 3
  timeout "$limit" python3 bench/bench_model_step.py "$model" --no-zero-attention "$@" \
    --out "$OUT/model-step-$model-$tag-$G-$D.json" 2>&1 | quiet | grep -E "stock|sagegen|torchao|peak|compile|Error|error" | tail -12
}
COMPILED=stock_compiled,sagegen_compiled,sagegen_fp8_compiled,torchao_fp8_compiled
case ${GROUP:-e} in
  e) step 170 wan2.1-t2v-14b fp8-memory --linear fp8 --repeats 1 --warmup 1 --only sagegen_fp8
     step 390 flux.1-dev compiled-regional --compile --compile-scope regional --compiled-only --linear fp8 --torchao \
       --repeats 5 --only $COMPILED ;;
  h) step 150 flux.1-dev torchao-compiled-regional --compile --compile-scope regional --compiled-only --torchao \
       --repeats 5 --only torchao_fp8_compiled
     step 230 wan2.1-t2v-1.3b compiled-regional --compile --compile-scope regional --compiled-only --repeats 3 \
       --only stock_compiled,sagegen_compiled ;;
  f) step 300 wan2.1-t2v-1.3b compiled-regional --compile --compile-scope regional --compiled-only --linear fp8 \
       --torchao --repeats 3 --only $COMPILED
     step 260 cogvideox-5b compiled-regional --compile --compile-scope regional --compiled-only --linear fp8 \
       --torchao --repeats 3 --only $COMPILED ;;
  g) timeout 120 python3 bench/bench_e2e.py tiny-flux --steps 2 --warmup-steps 1 --out "$OUT/e2e-smoke.json" 2>&1 | quiet | tail -5
     timeout 450 python3 bench/bench_e2e.py flux.1-dev --steps 28 --compile regional \
       --out "$OUT/e2e-flux.1-dev-28-steps-$G-$D.json" 2>&1 | quiet | tail -25 ;;
  t) timeout 280 python3 -m pytest -q -p no:cacheprovider -p pytest_timeout --timeout 120 -rfE \
       tests/patch/test_gpu_compile_modes.py tests/linear/test_gpu_fp8.py tests/patch/test_gpu_offload.py \
       tests/patch/test_gpu_graphs.py 2>&1 | quiet \
       > "$OUT/gpu-tests-compile-fp8-offload.log"
     grep -E "passed|failed|^FAILED|^ERROR|^E  " "$OUT/gpu-tests-compile-fp8-offload.log" | head -20 ;;
esac
