#!/bin/bash
# session 4, call 2 (Triton 3.6): compiled steps, Qwen-Image then LTX-Video (stock / sagegen / + FP8)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
for m in qwen-image ltx-video; do
  timeout 280 python3 -m sagegen bench $m --compile --linear fp8 --no-zero-attention --repeats 3 --out $OUT/model-step-$m-fp8-compiled-h100.json > $OUT/bench-$m-compiled.log 2>&1
  echo "$m rc=$?"; grep -E "ms  \(runs|speedup" $OUT/bench-$m-compiled.log | tail -6
done
