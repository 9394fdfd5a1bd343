"""The FP8 activation quantization kernels compile for sm89 and sm90 without a GPU (ptxas ships with Triton),
with no register spills and with 16-byte loads, in the configurations `quantize_fp8_rows` launches at the
models' widths (GELU prologue included). Compiled in a subprocess: the test session runs Triton's interpreter.
The arguments get the divisibility-by-16 specialisation the JIT gives them at run time (row strides and K of
the models are multiples of 16)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
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
cases = []
for K, gelu, col in ((3072, False, False), (5120, False, True), (12288, True, False), (13824, True, True),
                     (2432, True, False)):
    launch = fq.per_token_launch(K)
    warps = launch.pop("num_warps")
    cases.append((fq._fp8_quant_per_token_kernel, dict(launch, GELU=gelu, HAS_COL=col, HAS_PREFIX=False), warps))
launch = fq.per_token_launch(15360)  # Flux's single-block proj_out: cat(attention, GELU(mlp)) read from both
warps = launch.pop("num_warps")
cases.append((fq._fp8_quant_per_token_kernel, dict(launch, GELU=True, HAS_COL=False, HAS_PREFIX=True), warps))
cases.append((fq._fp8_quant_per_token_kernel,
              dict(fq.per_token_launch(20480, max_single_pass_k=16384), GELU=True, HAS_COL=False, HAS_PREFIX=True),
              4))
cases[-1][1].pop("num_warps")
for K in (9728, 12288):  # GELU rows in chunks (SD3.5's ff down; Flux's, CogVideoX's, HunyuanVideo's)
    assert fq.gelu_rows_chunked(K, True, False, False)
    launch = fq.per_token_launch(K, chunked=True)
    warps = launch.pop("num_warps")
    cases.append((fq._fp8_quant_per_token_kernel, dict(launch, GELU=True, HAS_COL=False, HAS_PREFIX=False), warps))
cases.append((fq._fp8_quant_per_block_kernel,
              dict(BLOCK_M=32, BLOCK_K=128, GELU=False, HAS_COL=True, HAS_PREFIX=False), 4))
for fn, const, warps in cases:
    const = dict(const, INTERPRET=False, TANH_LIBDEVICE=False)  # as the launches pass them
    names = list(inspect.signature(fn.fn).parameters)
    ptr = {"X": "*bf16", "P": "*bf16", "C": "*fp32", "Q": "*fp8e4nv", "S": "*fp32"}
    sig = {n: ("constexpr" if n in const else ptr.get(n, "i32")) for n in names}
    div16 = [n for n in names if n in ptr or n in ("K", "K0", "stride_xm", "stride_pm", "stride_qm")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div16}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    out.append(dict(summary(kernel), case={k: v for k, v in const.items() if k != "INTERPRET"}, warps=warps))
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", [89, 90])
def test_fp8_quant_kernels_compile_without_spills(arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(arch)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(reports) == 10
    for r in reports:
        assert r["stack"] == 0 and r["ldl/stl"] == 0, r
        assert r["ldg128"] > 0, r  # the bf16 rows are read in 16-byte vectors
