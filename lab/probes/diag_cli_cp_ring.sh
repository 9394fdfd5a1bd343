#!/usr/bin/env bash
# One device call (2 GPUs, carry .whl), 2026-11-28: why `torchrun ... run tiny-wan --cp ring=2` hung. A single-process
# run first (it showed imageio_ffmpeg missing on the device), then the 2-rank run, whose workers get SIGABRT
# after 60 s so that PYTHONFAULTHANDLER prints where each rank waits (rank 0: destroy_process_group after its
# error; rank 1: the next step's collective). Output: $OUT/one.log, $OUT/r2.log.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 PYTHONFAULTHANDLER=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
timeout 45 python3 -m sagegen run tiny-wan -p "a fox" --seed 0 --out /tmp/runs/one > $OUT/one.log 2>&1; echo "single rc=$?"; tail -3 $OUT/one.log
torchrun --nproc-per-node 2 -m sagegen run tiny-wan -p "a fox" --seed 0-1 --cp ring=2 --out /tmp/runs/r2 > $OUT/r2.log 2>&1 &
sleep 60; for p in $(pgrep -f "sagegen run tiny-wan"); do grep -q torchrun /proc/$p/cmdline || kill -ABRT $p; done; sleep 5; pkill -9 -f torchrun; echo "ring done"
grep -v '^\s*$' $OUT/r2.log | grep -A25 'Fatal Python\|Current thread\|Thread 0x' | head -90
