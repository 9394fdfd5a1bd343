"""A patched model (sageattn, FP8 linears, fused blocks) under inductor's compile modes on the GPU: the default,
``max-autotune-no-cudagraphs`` and ``reduce-overhead`` (CUDA graphs), full graph, with diffusers' regional
compilation too. Each: close to the stock model compiled the same way, no recompiles after the first call, the
FP8 quantization inside the graph (no opaque op), and the model unpatches cleanly afterwards."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import sagegen
from sagegen.jobs.stepbench.compiling import uncompile
from sagegen.linear import LinearPolicy, fp8_capable
from sagegen.models import arch as archs
from tests.conftest import gpu
from tests.support.helpers import cosine, rel_l1

pytestmark = gpu


def _model(name: str):
    overrides = dict(archs.smoke_overrides(name), num_layers=2)
    if name == "flux.1-dev":
        overrides["num_single_layers"] = 2
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cuda", seed=0, config_overrides=overrides)
    arch = archs.get_arch(name)
    size = dict(height=256, width=256, **({"frames": 9} if arch.frames else {}))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cuda", seed=1, **size)
    return model, inputs


def _compiled_outputs(model, inputs, compile_fn, calls: int = 3) -> list[torch.Tensor]:
    torch._dynamo.reset()
    counters.clear()
    with torch.inference_mode():
        fn = compile_fn(model)
        outs = [fn(**inputs)[0].float().clone() for _ in range(calls)]
    assert sum(counters["recompiles"].values()) == 0, dict(counters["recompiles"])
    return outs


def _check_against_compiled_stock(outs, stock_outs):
    # Held to the stock model compiled the same way: inductor itself moves these smoke models (stock compiled vs
    # stock eager: cos 0.959 on an H100 with Triton 3.6, lab/probes/probe_fp8_compile.py), as in test_gpu_fp8
    for out, ref in zip(outs, stock_outs):
        assert torch.isfinite(out).all()
        assert cosine(out, ref) > 0.99 and rel_l1(out, ref) < 0.15, (cosine(out, ref), rel_l1(out, ref))


@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_patched_model_compiles_in_every_mode(mode):
    ok, why = fp8_capable(torch.device("cuda"))
    if not ok:
        pytest.skip(why)
    model, inputs = _model("flux.1-dev")
    full = lambda m: torch.compile(m, mode=mode, fullgraph=True)  # noqa: E731
    stock_outs = _compiled_outputs(model, inputs, full)
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
    outs = _compiled_outputs(model, inputs, full)
    _check_against_compiled_stock(outs, stock_outs)
    assert sagegen.patch_info(model)["compile"]["fp8_linears"].startswith("plain ops")
    sagegen.unpatch(model)
    torch._dynamo.reset()


def test_regional_compile_of_a_patched_model_with_cuda_graphs():
    ok, why = fp8_capable(torch.device("cuda"))
    if not ok:
        pytest.skip(why)
    model, inputs = _model("wan2.1-t2v-1.3b")

    def regional(m):
        m.compile_repeated_blocks(fullgraph=True, mode="reduce-overhead")
        return m

    stock_outs = _compiled_outputs(model, inputs, regional)
    uncompile(model)
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
    outs = _compiled_outputs(model, inputs, regional)
    _check_against_compiled_stock(outs, stock_outs)
    uncompile(model)
    sagegen.unpatch(model)
    torch._dynamo.reset()
