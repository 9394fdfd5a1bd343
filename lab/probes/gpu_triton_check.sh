#!/usr/bin/env bash
# One device call: the single-GPU test suite (MODE=tests) or the quick attention and sparse benchmarks
# (MODE=bench) under whichever Triton comes first on PYTHONPATH (source a split wheel's env.sh first to test
# another version). Logs and JSON land under $OUT, named by the Triton version.
#   bash lab/probes/gpu_triton_check.sh tests|bench
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
tv=$(python3 -c "import triton, torch; print(f't{triton.__version__}')")
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
case ${1:-tests} in
  tests)
    python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_gpu*.py tests/kernels/test_fp8_codegen.py 2>&1 \
      | tee "$OUT/gpu-tests-$tv.txt" | grep -v -i 'leaked\|nanobind' | tail -25 ;;
  bench)
    python3 bench/bench_attention.py --quick --out "$OUT/attention-quick-$tv.json" 2>&1 | tail -30
    python3 bench/bench_sparse.py --quick --out "$OUT/sparse-quick-$tv.json" 2>&1 | tail -30 ;;
esac
