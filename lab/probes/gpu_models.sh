#!/usr/bin/env bash
# One device call: denoising-step benchmarks of full-size random-weight transformers (stock vs sagegen.patch).
# Usage: bash lab/probes/gpu_models.sh "cogvideox-5b --compile" "hunyuanvideo --height 544 --width 960" ...
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
for spec in "$@"; do
  name=$(echo "$spec" | tr ' ' '_' | tr -cd 'A-Za-z0-9._-')
  echo "=== $spec"
  python3 bench/bench_model_step.py $spec --out "$OUT/step-$name.json" 2>&1 | tail -12
done
