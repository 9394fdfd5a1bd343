#!/usr/bin/env bash
# One call on a 2-GPU machine: `sagegen compare` under torchrun with one process per GPU, then check that the
# run directory holds every sample of both variants and a whole manifest, and that each rank used its own GPU.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/diffusers-*.whl .whl/importlib_metadata-*.whl .whl2/*.whl && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
RUN=$OUT/run2gpu
torchrun --nproc_per_node 2 -m sagegen compare tiny-cogvideox --prompts smoke --seed 0,1 --out $RUN 2>&1 | tail -25
python3 - "$RUN" <<'PY'
import json, sys
from sagegen.runs.directory import RunDir
run = RunDir(sys.argv[1])
m = run.manifest
ids = [s["id"] for s in m["samples"]]
done = {v: [i for i in ids if run.finished(v, i)] for v in m["variants"]}
print("samples", len(ids), {v: len(d) for v, d in done.items()})
print("timings", {v: len(t) for v, t in m["timings"].items()})
print("processes", json.dumps(m.get("setup", {}), default=str)[:600])
assert all(len(d) == len(ids) for d in done.values()) and all(len(t) == len(ids) for t in m["timings"].values())
print("TWO-GPU RUN OK")
PY
