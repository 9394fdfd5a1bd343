"""`sagegen.patch` on HunyuanVideo-1.5: the main blocks' attention gets a key mask [B, 1, 1, S] instead of the
stock processor's query x key mask [B, 1, S, S] (`sagegen.patch.families.hunyuanvideo15_call`), with outputs
bit-identical to the stock processor's on the same backend; `unpatch` gives back the stock processor objects; the
policy's full-precision path, ``sparse=``, re-patching, a compiled block and the processor context parallelism
installs all still work."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import sagegen
from sagegen.models.tiny_classes import build_tiny_class, tiny_class_inputs
from sagegen.patch import attention_modules, patch_info, set_attention_override, sparse_density
from sagegen.patch import dispatch_route as backend_route

pytest.importorskip("diffusers.models.transformers.transformer_hunyuan_video15")
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0  # noqa: E402

from sagegen.patch.families.hunyuanvideo15_call import KeyMaskProcessor, key_mask_call  # noqa: E402

REFINER = "context_embedder.token_refiner.refiner_blocks.0.attn"  # SDPA route, its own small text mask
MAIN = ("transformer_blocks.0.attn", "transformer_blocks.1.attn")
N_VIDEO, N_TEXT = 2 * 4 * 4, 12 + 6 + 5  # tiny inputs: 2x4x4 latent; Qwen 12 + ByT5 6 + image 5 text tokens


def _model(dtype=torch.bfloat16):
    model = build_tiny_class("hunyuanvideo15", dtype=dtype)
    return model, tiny_class_inputs("hunyuanvideo15", model)  # batch 2, sample 0 with 3 padding Qwen tokens


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.fixture
def stock_call(monkeypatch):
    """Within the test, `patch` runs the stock processor's own __call__ on the backend route (as before)."""
    def use_stock():
        monkeypatch.setattr(backend_route, "call_for", backend_route.call_function)
    return use_stock


def _patched_output(model, inputs, **kwargs):
    sagegen.patch(model, backend="reference", **kwargs)
    out = _run(model, inputs)
    sagegen.unpatch(model)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_key_mask_path_equals_the_stock_processor_on_the_patch(dtype, stock_call):
    model, inputs = _model(dtype)
    key_mask = _patched_output(model, inputs)
    key_mask_full = _patched_output(model, inputs, policy=sagegen.PrecisionPolicy(blocks=MAIN))  # exact SDPA
    stock_call()
    stock = _patched_output(model, inputs)
    stock_full = _patched_output(model, inputs, policy=sagegen.PrecisionPolicy(blocks=MAIN))
    # sagegen's backend reduces the stock square mask to this key mask itself (eager), and SDPA gives the same
    # rows for a broadcast key mask as for the expanded one; padding queries are 0 in both
    assert torch.equal(key_mask, stock)
    assert torch.equal(key_mask_full, stock_full)
    assert not torch.equal(key_mask, key_mask_full)  # the quantized path did run


def test_the_attention_gets_a_key_mask_not_a_square_one(stock_call):
    model, inputs = _model()
    masks = []

    def record(q, k, v, mask, is_causal, scale):
        masks.append(None if mask is None else (tuple(mask.shape), mask.dtype))
        return torch.zeros_like(q)

    sagegen.patch(model, backend="reference")
    set_attention_override(model, record)
    _run(model, inputs)
    assert patch_info(model)["modules"] == {REFINER: "sdpa", **{n: "backend" for n in MAIN}}
    s = N_VIDEO + N_TEXT
    assert masks == [((2, 2, 12, 12), torch.bool)] + [((2, 1, 1, s), torch.bool)] * 2  # refiner, then blocks
    sagegen.unpatch(model)
    stock_call()  # what the patch handed over before: the [B, 1, S, S] mask
    sagegen.patch(model, backend="reference")
    set_attention_override(model, record)
    masks.clear()
    _run(model, inputs)
    assert masks[1:] == [((2, 1, s, s), torch.bool)] * 2
    sagegen.unpatch(model)


def test_unpatch_restores_the_stock_processors_and_repatch_works():
    model, inputs = _model()
    processors = {n: m.processor for n, m in attention_modules(model).items()}
    backends = {n: p._attention_backend for n, p in processors.items() if hasattr(p, "_attention_backend")}
    ref = _run(model, inputs)
    sagegen.patch(model, backend="reference")
    first = _run(model, inputs)
    sagegen.patch(model, backend="reference")  # re-patch: wraps nothing twice, same result
    assert patch_info(model)["routes"] == {"backend": 2, "sdpa": 1}
    assert torch.equal(_run(model, inputs), first)
    assert all(m.processor.original is processors[n] for n, m in attention_modules(model).items())
    sagegen.unpatch(model)
    assert all(m.processor is processors[n] for n, m in attention_modules(model).items())
    assert all(type(model.get_submodule(n).processor) is HunyuanVideo15AttnProcessor2_0 for n in MAIN)
    assert {n: p._attention_backend for n, p in processors.items() if n in backends} == backends
    assert torch.equal(_run(model, inputs), ref)
    sagegen.patch(model, backend="reference")  # patch again after unpatch
    assert torch.equal(_run(model, inputs), first)
    sagegen.unpatch(model)


def test_sparse_on_the_backend_route_matches_the_stock_processor(stock_call):
    model, inputs = _model()
    g = torch.Generator().manual_seed(3)  # 4 x 8 x 8 = 256 video tokens: several key blocks to drop
    inputs["hidden_states"] = torch.randn(2, 9, 4, 8, 8, generator=g).to(torch.bfloat16)
    sparse = sagegen.SparseConfig(value=0.2, keep_first=False, keep_diagonal=False, min_tokens=0,
                                  dense_steps=0.0, dense_blocks=())
    sagegen.patch(model, backend="reference", sparse=sparse)
    out = _run(model, inputs)
    density = sparse_density(model)
    sagegen.unpatch(model)
    assert {r["layer"] for r in density["per_step_layer"]} == set(MAIN) and density["overall"] < 1.0
    stock_call()
    assert torch.equal(out, _patched_output(model, inputs, sparse=sparse))


def test_native_backend_key_mask_processor_equals_stock():
    """The processor context parallelism installs, on diffusers' native backend (exact SDPA), gives the stock
    model's output bit for bit; patching over it keeps its own call and unpatch gives it back."""
    model, inputs = _model(torch.float32)
    ref = _run(model, inputs)
    for n in MAIN:
        model.get_submodule(n).set_processor(KeyMaskProcessor())
    assert torch.equal(_run(model, inputs), ref)
    installed = {n: model.get_submodule(n).processor for n in MAIN}
    assert backend_route.call_for(installed[MAIN[0]]) is key_mask_call
    key_mask = _patched_output(model, inputs)
    assert all(model.get_submodule(n).processor is p for n, p in installed.items())
    fresh, _ = _model(torch.float32)
    assert torch.equal(_patched_output(fresh, inputs), key_mask)


def test_a_patched_block_compiles_with_fullgraph():
    """The whole model does not (stock diffusers branches on data in forward); one block does, with the key
    mask path in one graph and one sagegen op."""
    torch._dynamo.reset()
    model, inputs = _model()
    sagegen.patch(model, backend="reference")
    block, captured = model.transformer_blocks[0], {}
    handle = block.register_forward_pre_hook(lambda m, a, k: captured.setdefault("in", (a, k)), with_kwargs=True)
    _run(model, inputs)
    handle.remove()
    args, kwargs = captured["in"]
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        eager = block(*args, **kwargs)
        compiled = torch.compile(block, fullgraph=True, backend=record)(*args, **kwargs)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    assert sum("sagegen" in t for t in targets) == 1
    assert not any("repeat" in t for t in targets)  # the stock processor's [B, 1, S, S] expansion
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    sagegen.unpatch(model)
    torch._dynamo.reset()


def test_key_mask_call_hands_its_segments_to_sagegen_under_context_parallelism(monkeypatch):
    """Under CP with sagegen's backend the call passes its (video, text) lengths, so a Ulysses split attends in
    one process's token order (tests/parallel/test_cp_attention.py::test_segments_keep_one_process_order); with another
    backend, or without CP, it passes nothing (diffusers would drop the key, and warn under its checks)."""
    import sagegen.patch.families.hunyuanvideo15_call as hv15
    from sagegen.patch.dispatch_route import backend_member

    model, inputs = _model()
    block = model.transformer_blocks[0]
    seen = []

    def dispatch(q, k, v, *, attention_kwargs=None, **kwargs):
        seen.append(attention_kwargs)
        return torch.zeros_like(q)

    monkeypatch.setattr(hv15, "dispatch_attention_fn", dispatch)
    video = torch.randn(2, N_VIDEO, block.attn.to_q.in_features, dtype=torch.bfloat16)
    text = torch.randn(2, N_TEXT, block.attn.add_q_proj.in_features, dtype=torch.bfloat16)
    for parallel, backend in ((object(), backend_member()), (object(), None), (None, backend_member())):
        proc = KeyMaskProcessor()
        proc._parallel_config, proc._attention_backend = parallel, backend
        with torch.no_grad():
            key_mask_call(proc, block.attn, video, text, torch.ones(2, N_TEXT))
    assert seen == [{"_sagegen_segments": (N_VIDEO, N_TEXT)}, None, None]
