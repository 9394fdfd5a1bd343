#!/usr/bin/env bash
# The context-parallel device runs of lab/NOTES.md v6.4, one device call each (one-GPU baselines are kept in
# /tmp/cp-baselines and reused by a later call while the machine stays warm).
# On a 2-GPU machine, one call a model (each fits the 10-minute call):
#   bash lab/probes/gpu_cp.sh two hunyuanvideo native;  bash lab/probes/gpu_cp.sh two wan2.1-14b   # the second also tests
# The third argument names diffusers' backend to compare with (default _native_cudnn; native for Ulysses);
# CPS="--cp ring=2" replaces the default splits (Ulysses 2 and Ring 2).
#   bash lab/probes/gpu_cp.sh patched wan2.1-14b   # Ulysses 2 with sagegen.patch (+ FP8 linears) as well
#   bash lab/probes/gpu_cp.sh patched hunyuanvideo native
#   PATCHED="--patched attention --patched sparse" bash lab/probes/gpu_cp.sh patched wan2.1-14b
#   CPS="--cp ring=2" PATCHED="--patched attention --patched sparse" bash lab/probes/gpu_cp.sh patched wan2.1-14b
#   bash lab/probes/gpu_cp.sh ringab               # HunyuanVideo Ring 2: joint calls in order vs chunk order
#   bash lab/probes/gpu_cp.sh quadpatched          # 4 GPUs: Wan2.1-14B Ulysses 4 patched, then tests/test_gpu_cp.py
# On a 4-GPU machine:
#   bash lab/probes/gpu_cp.sh quad    # HunyuanVideo: Ulysses 4 and Ulysses 2 x Ring 2 (the one-GPU baseline for
#                                # sagegen only; diffusers' native backend alongside)
# Needs the diffusers wheel in .whl (carry it). JSON and logs land in $OUT.
set -uo pipefail
# NVLink multicast stays off (the device tool's rule for shared hosts).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BASE=/tmp/cp-baselines
DAY=$(date -u +%F)
nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv > "$OUT/gpus-$1${2:-}.txt"
nvidia-smi topo -m >> "$OUT/gpus-$1${2:-}.txt" 2>&1
case $1 in
  two)
    timeout 540 torchrun --nproc-per-node 2 --master-port 29511 bench/bench_cp.py \
      --model "$2" ${CPS:---cp ulysses=2 --cp ring=2} --repeats 1 --baseline-dir $BASE --stock "${3:-_native_cudnn}" \
      --out "$OUT/cp-$2-${3:-_native_cudnn}-2gpu-$DAY.json" > "$OUT/$2-2gpu.log" 2>&1
    echo "$2 launch exit $?"
    if [[ $2 == wan2.1-14b ]]; then
      timeout 200 python3 -m pytest -q tests/test_gpu_cp.py -p no:cacheprovider > "$OUT/test-gpu-cp.log" 2>&1
      echo "test_gpu_cp exit $?"; tail -3 "$OUT/test-gpu-cp.log"
    fi
    ;;
  patched)
    # sagegen.patch under CP (fused prologues and block norms; + FP8 linears) against the backend alone and cuDNN
    timeout 560 torchrun --nproc-per-node 2 --master-port 29515 bench/bench_cp.py \
      --model "$2" ${CPS:---cp ulysses=2} ${PATCHED:---patched attention --patched fp8} --single sagegen --repeats 1 \
      --stock "${3:-_native_cudnn}" --baseline-dir $BASE --out "$OUT/cp-$2-patched-2gpu-$DAY.json" \
      > "$OUT/$2-patched.log" 2>&1
    echo "$2 patched launch exit $?"
    ;;
  ringab)
    # HunyuanVideo 720p under Ring 2 (NOTES v7.0): the patched joint calls with their keys in one process's order
    # (the default; dense in one call, block-sparse part by part), then in chunk order (SAGEGEN_RING_IN_ORDER=0)
    timeout 330 torchrun --nproc-per-node 2 --master-port 29519 bench/bench_cp.py --model hunyuanvideo \
      --cp ring=2 --patched attention --patched sparse --single sagegen --repeats 1 --baseline-dir $BASE \
      --out "$OUT/cp-hunyuanvideo-ring-inorder-2gpu-$DAY.json" > "$OUT/ring-inorder.log" 2>&1
    echo "ring in order exit $?"
    SAGEGEN_RING_IN_ORDER=0 timeout 200 torchrun --nproc-per-node 2 --master-port 29521 bench/bench_cp.py \
      --model hunyuanvideo --cp ring=2 --patched attention --single sagegen --repeats 1 --baseline-dir $BASE \
      --out "$OUT/cp-hunyuanvideo-ring-chunks-2gpu-$DAY.json" > "$OUT/ring-chunks.log" 2>&1
    echo "ring chunk order exit $?"
    ;;
  quadpatched)
    # Wan2.1-14B Ulysses 4: sagegen.patch (+ FP8 linears), the backend alone and cuDNN; then the CP GPU tests
    timeout 420 torchrun --nproc-per-node 4 --master-port 29517 bench/bench_cp.py \
      --model wan2.1-14b --cp ulysses=4 --patched attention --patched fp8 --single sagegen --repeats 1 \
      --baseline-dir $BASE --out "$OUT/cp-wan2.1-14b-patched-4gpu-$DAY.json" > "$OUT/cp-4gpu-patched.log" 2>&1
    echo "4-gpu patched launch exit $?"
    timeout 150 python3 -m pytest -q tests/test_gpu_cp.py -p no:cacheprovider > "$OUT/test-gpu-cp.log" 2>&1
    echo "test_gpu_cp exit $?"; tail -3 "$OUT/test-gpu-cp.log"
    ;;
  quad)
    timeout 430 torchrun --nproc-per-node 4 --master-port 29513 bench/bench_cp.py \
      --model hunyuanvideo --cp ulysses=4 --cp ulysses=2,ring=2 --repeats 1 --single sagegen --stock native \
      --baseline-dir $BASE --out "$OUT/cp-hunyuanvideo-4gpu-$DAY.json" > "$OUT/cp-4gpu.log" 2>&1
    echo "4-gpu launch exit $?"
    ;;
esac
ls $BASE 2>/dev/null
grep -h "^\[" "$OUT"/*.log | tail -40
