#!/usr/bin/env bash
# Session 40, issue 58: the CuTe-DSL design probe. Two calls back to back (bash lab/probes/pack_cutedsl.sh first):
#   PART=0, carry [".big/cute/p0"]: stash part 0; meanwhile sagegen's kernel and SDPA at the probe's shapes, and
#           the Hadamard rotation's cost (lab/probes/probe_rotation_speed.py).
#   PART=1, carry [".big/cute/p1"]: unpack; lab/cute_proto's SA2 prototype (bench.py --isolate: one process per
#           variant), then NVIDIA's CuTe-DSL Hopper FMHA in bf16 and FP8 beside sagegen's. Short of time:
#           BENCH_ARGS="--variants serial,overlap_pp --quick".
set -uo pipefail
export PYTHONUNBUFFERED=1
D=2026-12-08
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr A-Z a-z)
SHAPES="1,16,32768;2,32,8192;1,32,16384"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
case ${PART:-0} in
  0) bash .big/cute/p0/stash.sh .big/cute/p0
     timeout 200 python3 lab/probes/cute_design_probe.py --skip-cute --shapes "$SHAPES" \
       --out "$OUT/cute-probe-sagegen-$G-$D.json" 2>&1 | grep -v Warning | tail -12
     # issue 58 item 3: what the Hadamard rotation costs (full sageattn calls and the quantization pass)
     timeout 150 python3 lab/probes/probe_rotation_speed.py --out "$OUT/rotation-speed-$G-$D.json" 2>&1 \
       | grep -v Warning | tail -5 ;;
  1) bash .big/cute/p1/stash.sh .big/cute/p1 || exit 1
     source /tmp/cutedsl/env.sh
     export CUTE_DSL_ARCH=sm_90a
     mkdir -p /tmp/cute
     # one child process per variant (bench.py --isolate): a hang or a fault loses only that variant
     (cd lab/cute_proto && timeout ${VT:-330} python3 bench.py --isolate ${ISO:-120} ${BENCH_ARGS:-} \
        --out /tmp/cute/cute-sa2.json > "$OUT/cute-sa2-$G.log" 2>&1; echo "rc=$?" >> "$OUT/cute-sa2-$G.log")
     cp /tmp/cute/cute-sa2.json "$OUT/cute-sa2-$G-$D.json" 2>/dev/null
     grep -E "acc\]|perf\]|rc=|Error|error|killed" "$OUT/cute-sa2-$G.log" | cut -c1-220 | tail -30
     timeout ${UT:-200} python3 lab/probes/cute_design_probe.py --shapes "1,16,32768;2,32,8192" \
       --out "$OUT/cute-probe-upstream-$G-$D.json" 2>&1 | grep -v Warning | cut -c1-300 | tail -24 ;;
esac
