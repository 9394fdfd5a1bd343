#!/bin/bash
# session 4, call 1 (Triton 3.6): GPU tests of the new prologues, Qwen-Image / LTX-Video steps eager
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_patch_qwenimage.py tests/test_patch_ltx.py tests/test_patch_fused_wan.py tests/test_gpu_diffusers_backend.py > $OUT/gpu-tests-prologues-t36.txt 2>&1
grep -E "passed|failed|Error" $OUT/gpu-tests-prologues-t36.txt | tail -5
for m in qwen-image ltx-video; do
  timeout 170 python3 -m sagegen bench $m --linear fp8 --repeats 5 --out $OUT/model-step-$m-fp8-prologue-h100.json > $OUT/bench-$m.log 2>&1
  tail -4 $OUT/bench-$m.log
done
