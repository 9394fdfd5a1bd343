#!/usr/bin/env bash
# Session 40 (issues 56, 57). Carry [".whl"]. GROUP=t: the GPU tests never run (compile modes, offload, FP8
# memory, graphs under a step cache), then time to video on FLUX.1-dev at 28 steps (stock, sagegen stack,
# torchao stack; regional compile) after a tiny smoke run of the e2e bench.
set -uo pipefail
export PYTHONUNBUFFERED=1
if [[ ! -d /tmp/site ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
D=2026-12-08
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
quiet() { grep -v -E "nanobind|leaked|Warning|warn\(" ; }
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
case ${GROUP:-t} in
  t) timeout 220 python3 -m pytest -q -p no:cacheprovider -p pytest_timeout --timeout 100 -rfE \
       tests/patch/test_gpu_compile_modes.py tests/linear/test_gpu_fp8.py tests/patch/test_gpu_offload.py \
       tests/patch/test_gpu_graphs.py "tests/kernels/test_gpu.py::test_hadamard_rotation_tracks_emulation_on_hardware" \
       2>&1 | quiet > "$OUT/gpu-tests-compile-fp8-offload-graphs-$G.log"
     grep -E "passed|failed|^FAILED|^ERROR|^E  " "$OUT/gpu-tests-compile-fp8-offload-graphs-$G.log" | head -20
     timeout 60 python3 bench/bench_e2e.py tiny-flux --steps 2 --warmup-steps 1 --out "$OUT/e2e-smoke.json" 2>&1 \
       | quiet | tail -4
     timeout 300 python3 bench/bench_e2e.py flux.1-dev --steps 28 --compile regional \
       --out "$OUT/e2e-flux.1-dev-28-steps-$G-$D.json" 2>&1 | quiet | tail -12 ;;
esac
