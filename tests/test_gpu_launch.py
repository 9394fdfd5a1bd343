"""`CachedLaunch` on the GPU: for argument sets that differ in everything Triton specializes on (alignment,
multiples of 16, 1, constexprs), the kernel kept under its key is the one Triton's own launch picks, and the
direct launch writes the same bits."""

from __future__ import annotations

import pytest
import torch

from conftest import gpu
from sagegen.kernels import fp8_quant
from sagegen.kernels.launch import CachedLaunch

pytestmark = gpu


def _args(x, col, gelu):
    M, K = x.shape
    launch = fp8_quant.per_token_launch(K)
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    n = -(-M // launch["BLOCK_M"])
    return (n,), (x, x if col is None else col, q, s, M, K, x.stride(0), q.stride(0), n), dict(
        HAS_COL=col is not None, GELU=gelu, INTERPRET=False, TANH_LIBDEVICE=False, enable_fp_fusion=True, **launch)


@pytest.mark.parametrize("gelu", [False, True])
def test_cached_launch_picks_tritons_kernel_and_matches_bits(seed, gelu):
    cl = CachedLaunch(fp8_quant._fp8_quant_per_token_kernel)
    assert cl.enabled
    base = torch.randn(4200, 3200, device="cuda", dtype=torch.bfloat16) * 3
    odd = torch.randn(4200, 3201, device="cuda", dtype=torch.bfloat16)       # a row stride not a multiple of 16
    cases = []
    for M in (1, 16, 17, 64, 4099, 4096):
        for K in (64, 3072, 3080, 3083):
            cases += [base[:M, :K], base[:M, 1:K + 1], base[1:M + 1, 8:K + 8],  # aligned, 2-byte, 16-byte offsets
                      odd[:M, :K]]
    col = torch.rand(3200, device="cuda") * 2
    for x in cases:
        for c in (None, col[: x.shape[1]], col[1: x.shape[1] + 1]):
            for _ in range(2):  # the first call of a key fills it through Triton; the second launches directly
                grid, args, kw = _args(x, c, gelu)
                got = cl(grid, *args, **kw)
                want_grid, want_args, want_kw = _args(x, c, gelu)
                want = fp8_quant._fp8_quant_per_token_kernel[want_grid](*want_args, **want_kw)
                assert got is want, f"key {cl.key(args, kw)[0]} maps to another kernel than Triton picks"
                assert torch.equal(args[2].view(torch.uint8), want_args[2].view(torch.uint8))
                assert torch.equal(args[3], want_args[3])
    assert cl.direct_launches == len(cases) * 3


def test_direct_launch_follows_the_current_stream():
    """A launch under ``torch.cuda.stream(side)`` goes to ``side``: while ``side`` sleeps, the default stream
    still sees the outputs unwritten."""
    cl = CachedLaunch(fp8_quant._fp8_quant_per_token_kernel)
    x = torch.randn(2048, 3072, device="cuda", dtype=torch.bfloat16)
    grid, args, kw = _args(x, None, False)
    cl(grid, *args, **kw)                       # fills the key
    grid, args, kw = _args(x, None, False)
    args[2].view(torch.uint8).zero_()
    args[3].zero_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)           # ~25 ms of the side stream
        cl(grid, *args, **kw)
    early = args[3].clone()                      # on the default stream, which does not wait for side
    assert cl.direct_launches == 1
    torch.cuda.synchronize()
    assert not early.any(), "the direct launch did not go to the current (side) stream"
    want_q, want_s = fp8_quant.quantize_fp8_rows(x, block_m=kw["BLOCK_M"])
    assert torch.equal(args[3], want_s) and torch.equal(args[2].view(torch.uint8), want_q.view(torch.uint8))
