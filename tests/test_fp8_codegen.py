"""The FP8 activation quantization kernels compile for sm89 and sm90 without a GPU (ptxas ships with Triton),
with no register spills, in every configuration `quantize_fp8_rows` launches. Compiled in a subprocess: the
test session runs Triton's interpreter."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
SCRIPT = """
import inspect, json, sys
sys.path.insert(0, "bench")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from compile_check import summary
from sagegen.kernels import fp8_quant as fq

arch = int(sys.argv[1])
out = []
cases = [(fq._fp8_quant_per_token_kernel, dict(BLOCK_M=bm, BLOCK_K=bk, SINGLE_PASS=single), w)
         for single, bm, bk, w in ((True, 2, 4096, 8), (True, 1, 8192, 8), (True, 16, 512, 8), (False, 2, 1024, 4))]
cases.append((fq._fp8_quant_per_block_kernel, dict(BLOCK_M=32, BLOCK_K=128), 4))
for fn, const, warps in cases:
    const = dict(const, HAS_COL=True, INTERPRET=False)
    names = list(inspect.signature(fn.fn).parameters)
    ptr = {"X": "*bf16", "C": "*fp32", "Q": "*fp8e4nv", "S": "*fp32"}
    sig = {n: ("constexpr" if n in const else ptr.get(n, "i32")) for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    out.append(summary(kernel))
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", [89, 90])
def test_fp8_quant_kernels_compile_without_spills(arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(arch)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(reports) == 5
    for r in reports:
        assert r["stack"] == 0 and r["ldl/stl"] == 0, r
