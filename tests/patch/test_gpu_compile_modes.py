"""A patched model (sageattn, FP8 linears, fused blocks) under inductor's compile modes on the GPU: the default,
``max-autotune-no-cudagraphs`` and ``reduce-overhead`` (CUDA graphs), full graph, with diffusers' regional
compilation too. Each: close to the eager patched output, no recompiles after the first call, the FP8
quantization inside the graph (no opaque op), and the model unpatches cleanly afterwards."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import sagegen
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


@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs", "reduce-overhead"])
@pytest.mark.parametrize("name", ["flux.1-dev", "wan2.1-t2v-1.3b"])
def test_patched_model_compiles_in_every_mode(name, mode):
    ok, why = fp8_capable(torch.device("cuda"))
    if not ok:
        pytest.skip(why)
    torch._dynamo.reset()
    counters.clear()
    model, inputs = _model(name)
    policy = LinearPolicy(keep_blocks=(), min_rows=1)
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=policy)
        eager = model(**inputs)[0].float()
        compiled = torch.compile(model, mode=mode, fullgraph=True)
        outs = [compiled(**inputs)[0].float().clone() for _ in range(3)]
    assert sum(counters["recompiles"].values()) == 0, dict(counters["recompiles"])
    for out in outs:
        # inductor reorders the fp32 sums and may round a scale's reciprocal differently: FP8 codes move by a step
        assert cosine(out, eager) > 0.995 and rel_l1(out, eager) < 0.08, (cosine(out, eager), rel_l1(out, eager))
    assert sagegen.patch_info(model)["compile"]["fp8_linears"].startswith("plain ops")
    sagegen.unpatch(model)
    torch._dynamo.reset()


def test_regional_compile_of_a_patched_model_with_cuda_graphs():
    ok, why = fp8_capable(torch.device("cuda"))
    if not ok:
        pytest.skip(why)
    torch._dynamo.reset()
    counters.clear()
    model, inputs = _model("wan2.1-t2v-1.3b")
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        eager = model(**inputs)[0].float()
        model.compile_repeated_blocks(fullgraph=True, mode="reduce-overhead")
        outs = [model(**inputs)[0].float().clone() for _ in range(3)]
    assert sum(counters["recompiles"].values()) == 0, dict(counters["recompiles"])
    for out in outs:
        assert cosine(out, eager) > 0.995 and rel_l1(out, eager) < 0.08
    sagegen.unpatch(model)
    torch._dynamo.reset()
