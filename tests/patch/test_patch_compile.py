"""`torch.compile` of a patched transformer: sageattn in the graph for every attention call, one compile for
repeated calls with the same shapes, no graph breaks from the patch, the eager result, exact unpatch."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import sagegen
from sagegen.models import arch as archs
from sagegen.patch import attention_modules, patch_info
from sagegen.patch.wrapper import is_wrapper

# One architecture per family whose stock diffusers model compiles without graph breaks (Mochi's processor
# graph-breaks on its own, on a data-dependent nonzero).
ARCHS = ["cogvideox-5b", "hunyuanvideo", "flux.1-dev", "sd3.5-medium"]


def _tiny(name: str):
    arch = archs.get_arch(name)
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    size = dict(height=64, width=64)
    if arch.frames:
        size["frames"] = 9
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, **size,
                                  text_tokens=archs.smoke_text_tokens(name))
    return model, inputs


class Recorder:
    """A dynamo backend that counts compiles and keeps each graph; runs the graph as traced (no codegen)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def count(self, word: str) -> int:
        return sum(1 for g in self.graphs for node in g.graph.nodes
                   if node.op == "call_function" and word in str(node.target))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("grad_mode", ["inference_mode", "no_grad"])
@pytest.mark.parametrize("name", ARCHS)
def test_compiled_patched_model_runs_sageattn_and_compiles_once(name, grad_mode):
    model, inputs = _tiny(name)
    originals = {n: m.processor for n, m in attention_modules(model).items()}
    # the fused prologues are eager-only (the compiled graph has diffusers' code, equal up to rounding order):
    # eager runs diffusers' code too, so the two must agree bit for bit
    sagegen.patch(model, backend="reference", fuse_prologue=False)
    ctx = getattr(torch, grad_mode)
    with ctx():
        eager = model(**inputs)[0]
    stats = dict(patch_info(model)["stats"])
    attention_calls = stats["routed"]
    assert attention_calls >= 1 and stats.get("fallback", 0) == 0

    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    with ctx(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "made no SDPA call" warning under compile
        outs = [compiled(**inputs)[0] for _ in range(3)]

    assert len(recorder.graphs) == 1, f"compiled {len(recorder.graphs)} graphs for 3 calls of one shape"
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert recorder.count("sagegen.sageattn") == attention_calls
    assert recorder.count("scaled_dot_product") == 0
    for out in outs:
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
    # compiled calls leave the diagnostics alone (counting inside traced code made dynamo recompile per call)
    assert dict(patch_info(model)["stats"]) == stats

    sagegen.unpatch(model)
    after = {n: m.processor for n, m in attention_modules(model).items()}
    assert all(after[n] is originals[n] and not is_wrapper(after[n]) for n in originals)


def test_compiled_patched_model_with_block_policy_keeps_those_blocks_on_sdpa():
    model, inputs = _tiny("flux.1-dev")
    sagegen.patch(model, backend="reference", policy=sagegen.PrecisionPolicy(blocks=["transformer_blocks.0"]),
                  fuse_prologue=False)  # as above: eager-only, compared bit for bit
    with torch.inference_mode():
        eager = model(**inputs)[0]
    stats = dict(patch_info(model)["stats"])
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    with torch.inference_mode():
        outs = [compiled(**inputs)[0] for _ in range(2)]
    assert len(recorder.graphs) == 1
    assert recorder.count("sagegen.sageattn") == stats["routed"] == 1
    assert recorder.count("scaled_dot_product") == stats["full_precision_calls"] == 1
    for out in outs:
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
    sagegen.unpatch(model)


def test_compiled_eager_and_unpatched_agree_with_the_emulation():
    """aot_eager (functionalisation and the custom op's fake impl) gives the eager patched output."""
    model, inputs = _tiny("cogvideox-5b")
    with torch.inference_mode():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", fuse_prologue=False)  # compared bit for bit with the graph
        eager = model(**inputs)[0]
        compiled = torch.compile(model, backend="aot_eager")
        out = compiled(**inputs)[0]
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
        assert not torch.equal(out, stock)  # the quantized attention ran, not SDPA
        sagegen.unpatch(model)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="aot_eager")(**inputs)[0], stock,
                                   rtol=0, atol=0)


def test_compiled_patched_mochi_runs_attention_eagerly_through_sagegen():
    """Mochi's own processor breaks dynamo's graph; its attention runs eagerly between graph breaks (a break
    inside the re-bound processor made dynamo resume in the wrong globals: NameError on torch 2.11), still
    routed to sagegen, with the eager result."""
    model, inputs = _tiny("mochi-1")
    with torch.inference_mode():
        stock = model(**inputs)[0]
        stock_recorder = Recorder()
        torch.compile(model, backend=stock_recorder)(**inputs)
        torch._dynamo.reset()
        sagegen.patch(model)
        eager = model(**inputs)[0]
        before = patch_info(model)["stats"].get("routed", 0)
        recorder = Recorder()
        compiled = torch.compile(model, backend=recorder)
        out = compiled(**inputs)[0]
        routed = patch_info(model)["stats"].get("routed", 0) - before
    n_attn = len(attention_modules(model))
    assert routed >= n_attn > 0
    assert torch.equal(out, eager) and not torch.equal(out, stock)
    # No SDPA beyond what stock's graphs hold (the caption attention-pool: not a processor, head dim 512).
    assert recorder.count("scaled_dot_product_attention") <= stock_recorder.count("scaled_dot_product_attention")
    sagegen.unpatch(model)


def test_mochi_under_compile_compiles_its_attention_wrapper_once():
    """Mochi's processor breaks dynamo's graph, so its attention runs eagerly between breaks; the wrapper must
    not specialise on each layer (guards on every layer's name hit dynamo's recompile limit at 8 layers)."""
    arch = archs.get_arch("mochi-1")
    overrides = {**archs.smoke_overrides("mochi-1"), "num_layers": 4}
    model = archs.build_transformer("mochi-1", dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=overrides)
    inputs = archs.example_inputs("mochi-1", batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64,
                                  width=64, frames=arch.frames and 7,
                                  text_tokens=archs.smoke_text_tokens("mochi-1"))
    sagegen.patch(model, backend="reference")
    with torch.no_grad():
        eager = model(**inputs)[0]
        with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
            out = torch.compile(model, backend=Recorder())(**inputs)[0]
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
