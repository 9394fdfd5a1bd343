"""diffusers' regional compilation (``model.compile_repeated_blocks(fullgraph=True)``: one compiled graph reused by
every block of a class) on patched models: sagegen's processors must not make the traced code depend on which
layer runs it, or dynamo recompiles per block and, past its recompile limit, fails hard under fullgraph (found on
an H200 with FLUX.1-dev: 19 double blocks, limit 8). A per-layer precision policy may add one graph per class."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.helpers import graph_recorder, rel_l1
from sagegen.models import arch as archs
from sagegen.jobs.stepbench.compiling import uncompile

BLOCKS = {"flux.1-dev": {"num_layers": 3, "num_single_layers": 3}, "wan2.1-t2v-1.3b": {"num_layers": 3},
          "qwen-image": {"num_layers": 3}}


def _model(name):
    overrides = {**archs.smoke_overrides(name), **BLOCKS[name]}
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0, config_overrides=overrides)
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64,
                                  frames=5 if archs.get_arch(name).frames else None,
                                  text_tokens=archs.smoke_text_tokens(name))
    return model, inputs


def _regional(model, inputs):
    """Outputs and the graphs dynamo made compiling the model's repeated blocks (fullgraph); undone after."""
    graphs, backend = graph_recorder()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            model.compile_repeated_blocks(fullgraph=True, backend=backend)
            out = model(**inputs)[0]
    finally:
        uncompile(model)
        torch._dynamo.reset()
    return out, len(graphs)


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("keep_first,linear", [(False, None), (True, None), (False, "fp8")],
                         ids=["all-blocks", "first-block-full-precision", "fp8-linears"])
def test_regional_compile_traces_no_graph_per_layer(name, keep_first, linear):
    """As many graphs as stock's regional compile (which itself retraces a block class whose first block sees
    other input strides), at most twice that with the first block kept in full precision: never one per block
    (3 blocks of each class here). With FP8 linears in every block, still one graph per block class: each
    layer's FP8 weights are the compiled graph's inputs, not constants."""
    model, inputs = _model(name)
    _, stock_graphs = _regional(model, inputs)
    policy = sagegen.PrecisionPolicy(blocks=(0,)) if keep_first else None
    # (FP8: diffusers' own prologue ops in eager too, as under compile: the fused eager prologue rounds in
    # another order, and an FP8 code flipped by it moves the output by more than the attention-only bound)
    extra = dict(linear="fp8", linear_policy=sagegen.LinearPolicy(keep_blocks=(), min_rows=1),
                 fuse_prologue=False) if linear else {}
    sagegen.patch(model, policy=policy, allow_generic=True, **extra)
    try:
        with torch.no_grad():
            eager = model(**inputs)[0]
        compiled, graphs = _regional(model, inputs)
    finally:
        sagegen.unpatch(model)
    assert graphs <= stock_graphs * (2 if keep_first else 1), (graphs, stock_graphs)
    assert rel_l1(compiled, eager) < (1e-3 if linear else 2e-2), rel_l1(compiled, eager)
