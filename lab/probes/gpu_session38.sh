#!/usr/bin/env bash
# Session 38 (issue 56): GROUP=a: the compile/FP8 GPU tests, then the FP8-under-compile A/B on a regionally compiled
# Flux step; GROUP=b: Wan2.1-14B 720p peak memory with FP8 linears (the new default, bf16 copies on the host), and
# the compiled table rows (Flux with torchao). Carry [".whl"].
set -uo pipefail
export PYTHONUNBUFFERED=1
if [[ ! -d /tmp/site ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
quiet() { grep -v -E "nanobind|leaked" ; }
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
tests() {  # $1: tag, the rest: test files
  local tag=$1
  shift
  timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider -rfE --durations=8 "$@" 2>&1 | quiet > "$OUT/gpu-tests-$tag.log"
  grep -E "passed|failed|^FAILED|^ERROR|s call" "$OUT/gpu-tests-$tag.log" | tail -14
}
case ${GROUP:-a} in
  d) timeout 170 python3 bench/bench_model_step.py wan2.1-t2v-14b --linear fp8 --repeats 1 --warmup 0 \
       --no-zero-attention --only sagegen_fp8 --out "$OUT/model-step-wan2.1-t2v-14b-fp8-memory-2026-12-07.json" 2>&1 \
       | quiet | grep -E "stock|sagegen|peak|Error|error" | tail -8 ;;
  c) timeout 200 python3 -m pytest -q -p no:cacheprovider -p pytest_timeout --timeout 110 -rfE \
       tests/patch/test_gpu_compile_modes.py 2>&1 | quiet > "$OUT/gpu-tests-compile-modes.log"
     grep -E "passed|failed|^FAILED|^ERROR|^E  " "$OUT/gpu-tests-compile-modes.log" | head -20
     TEST_LIMIT=120 tests fp8-memory-offload tests/linear/test_gpu_fp8.py tests/patch/test_gpu_offload.py -k "free_gpu_memory or offload"
     timeout 150 python3 bench/bench_model_step.py wan2.1-t2v-14b --linear fp8 --repeats 1 --warmup 1 --no-zero-attention \
       --only sagegen_fp8 --out "$OUT/model-step-wan2.1-t2v-14b-fp8-memory-h100-2026-12-07.json" 2>&1 | quiet \
       | grep -E "stock|sagegen|peak|Error|error" | tail -8 ;;
  a) tests compile-fp8 tests/patch/test_gpu_compile_modes.py tests/linear/test_gpu_fp8.py
     timeout "${PROBE_LIMIT:-280}" python3 lab/probes/probe_fp8_compile_native.py flux.1-dev --scope regional \
       --out "$OUT/probe-fp8-compile-native-flux-h200-2026-12-07.json" 2>&1 | quiet | grep -v Warning | tail -14 ;;
  b) timeout 200 python3 bench/bench_model_step.py wan2.1-t2v-14b --linear fp8 --repeats 2 --no-zero-attention \
       --only sagegen_fp8 --out "$OUT/model-step-wan2.1-t2v-14b-fp8-memory-h200-2026-12-07.json" 2>&1 | quiet \
       | grep -E "stock|sagegen|peak|Error|error" | tail -8
     timeout 360 python3 bench/bench_model_step.py flux.1-dev --compile --compile-scope regional --compiled-only \
       --linear fp8 --torchao --no-zero-attention --repeats 5 \
       --out "$OUT/model-step-flux.1-dev-fp8-torchao-regional-compiled-h200-2026-12-07.json" 2>&1 | quiet \
       | grep -E "stock|sagegen|torchao|Error|error" | tail -10 ;;
esac
