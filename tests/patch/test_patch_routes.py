"""`sagegen.patch` on every diffusers denoiser: the route each attention module takes (fused / backend / sdpa),
the output against stock within the quantization's error, `unpatch` bit-identical, the PrecisionPolicy on the
backend route, a pipeline with two denoisers (Wan2.2-A14B's layout) patched whole, and
`torch.compile(fullgraph=True)` where the model allows it."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import sagegen
from sagegen.models.tiny import build_tiny_transformer
from sagegen.patch import attention_modules, patch_info, reset_stats, set_attention_override, step_history
from sagegen.patch import dispatch_route as backend_route
from tests.support.dispatch_models import DISPATCH_MODELS, tiny_skyreels_v2, tiny_wan
from tests.support.helpers import rel_l1

ad = pytest.importorskip("diffusers.models.attention_dispatch")
QUANT_TOL = 0.03  # rel. L1 of a whole tiny model's output vs stock (measured 4e-4 .. 6.4e-3)
# Modules that call SDPA directly, by model: HunyuanVideo-1.5's token refiner.
SDPA_MODULES = {"hunyuanvideo-1.5": {"context_embedder.token_refiner.refiner_blocks.0.attn"}}
# Models with fused processors (targets.SUPPORTED_MODELS): Wan's (and SkyReels-V2's) self and text cross-attention.
FUSED = {"wan2.1", "wan2.2-ti2v", "skyreels-v2"}
# Models whose stock diffusers code does not compile with fullgraph=True (checked below, so the skip stays honest).
NO_FULLGRAPH = {"hunyuanvideo-1.5"}


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _backends(model):
    return {name: getattr(m.processor, "_attention_backend", "-") for name, m in attention_modules(model).items()}


@pytest.mark.parametrize("name", list(DISPATCH_MODELS))
def test_every_model_routes_matches_stock_and_unpatches_exactly(name):
    model, inputs = DISPATCH_MODELS[name]()
    processors = {n: m.processor for n, m in attention_modules(model).items()}
    backends = _backends(model)
    active = ad._AttentionBackendRegistry._active_backend
    ref = _run(model, inputs)
    sagegen.patch(model)  # no allow_generic
    out = _run(model, inputs)
    info = patch_info(model)
    sdpa = SDPA_MODULES.get(name, set())
    main = "fused" if name in FUSED else "backend"
    assert info["modules"] == {n: ("sdpa" if n in sdpa else main) for n in processors}
    assert info["routes"] == {k: v for k, v in ((main, len(processors) - len(sdpa)), ("sdpa", len(sdpa))) if v}
    assert info["stats"]["routed"] == len(processors) and "fallback" not in info["stats"]
    member = ad.AttentionBackendName("sagegen")
    assert all(m.processor.original._attention_backend == member for n, m in attention_modules(model).items()
               if n not in sdpa and main == "backend")
    assert ad._AttentionBackendRegistry._active_backend == active  # the global default untouched
    assert 0 < rel_l1(out, ref) < QUANT_TOL
    sagegen.unpatch(model)
    assert {n: m.processor for n, m in attention_modules(model).items()} == processors
    assert all(m.processor is processors[n] for n, m in attention_modules(model).items())
    assert _backends(model) == backends
    assert torch.equal(_run(model, inputs), ref)


def test_the_five_families_keep_their_fused_processors():
    flux = build_tiny_transformer("flux")
    sagegen.patch(flux)
    assert patch_info(flux)["routes"] == {"fused": 2}
    sagegen.patch(flux, fuse_prologue=False)
    assert patch_info(flux)["routes"] == {"sdpa": 2}
    sagegen.unpatch(flux)


@pytest.fixture
def skyreels_generic(monkeypatch):
    """SkyReels-V2 as a model sagegen has no fused code for: Wan's interface on the backend route."""
    from sagegen.patch import targets

    monkeypatch.delitem(targets.SUPPORTED_MODELS, "SkyReelsV2Transformer3DModel")


def test_precision_policy_blocks_on_the_backend_route(skyreels_generic):
    model, inputs = tiny_skyreels_v2()
    ref = _run(model, inputs)
    sagegen.patch(model, policy=sagegen.PrecisionPolicy(blocks=(0, 1)))  # every block: stock attention
    assert torch.equal(_run(model, inputs), ref)
    assert patch_info(model)["stats"] == {"full_precision_calls": 4}
    reset_stats(model)
    sagegen.patch(model, policy=sagegen.PrecisionPolicy(blocks=("blocks.1.attn2",)))
    out = _run(model, inputs)
    assert patch_info(model)["stats"] == {"full_precision_calls": 1, "processor_calls": 3, "routed": 3}
    assert 0 < rel_l1(out, ref) < QUANT_TOL
    sagegen.unpatch(model)


def test_config_reaches_the_backend_per_model(skyreels_generic):
    model, inputs = tiny_skyreels_v2()
    other, _ = tiny_skyreels_v2()
    cfg = sagegen.SageConfig(smooth_v=False, k_granularity="per_token")
    sagegen.patch(model, cfg)
    sagegen.patch(other)
    out, default = _run(model, inputs), _run(other, inputs)
    assert not torch.equal(out, default)
    sagegen.patch(model)  # re-patch: the new config applies to the same wrappers
    assert torch.equal(_run(model, inputs), default)
    assert sagegen.get_backend_config().config == sagegen.DIFFUSION_CONFIG  # process-wide settings untouched
    sagegen.unpatch(model)
    sagegen.unpatch(other)


def test_attention_override_on_the_backend_route(skyreels_generic):
    model, inputs = tiny_skyreels_v2()
    sagegen.patch(model)
    set_attention_override(model, lambda q, k, v, m, c, s: torch.zeros_like(q))
    out = _run(model, inputs)
    assert patch_info(model)["stats"]["overridden"] == 4
    set_attention_override(model, None)
    assert not torch.equal(_run(model, inputs), out)
    sagegen.unpatch(model)


def test_without_a_registrable_diffusers_the_sdpa_route_takes_over(monkeypatch, skyreels_generic):
    monkeypatch.setattr(backend_route, "backend_member", lambda: None)
    model, inputs = tiny_skyreels_v2()
    ref = _run(model, inputs)
    sagegen.patch(model)
    out = _run(model, inputs)
    assert patch_info(model)["routes"] == {"sdpa": 4}
    assert patch_info(model)["stats"]["routed"] == 4  # diffusers' native backend's SDPA call, intercepted
    assert 0 < rel_l1(out, ref) < QUANT_TOL
    sagegen.unpatch(model)
    assert torch.equal(_run(model, inputs), ref)


# -- a pipeline with two denoisers ------------------------------------------------------------------------------
def _wan22_pipeline(build):
    """Wan2.2-A14B's layout: a high-noise `transformer` and a low-noise `transformer_2` switching at
    boundary_ratio; no text encoder or VAE (prompt embeddings in, latents out). ``build``: Wan's own denoiser
    (fused route) or SkyReels-V2's, which has Wan's forward interface (on the backend route, with
    `skyreels_generic`)."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    t1, _ = build(0)
    t2, _ = build(5)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=scheduler, transformer=t1,
                       transformer_2=t2, boundary_ratio=0.8)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(0)
    emb, neg = torch.randn(1, 5, 16, generator=g), torch.randn(1, 5, 16, generator=g)

    def run():
        with torch.no_grad():
            return pipe(prompt_embeds=emb, negative_prompt_embeds=neg, height=16, width=16, num_frames=5,
                        num_inference_steps=4, guidance_scale=3.0, output_type="latent",
                        generator=torch.Generator().manual_seed(1)).frames

    return pipe, run


@pytest.mark.parametrize("build,route", [(tiny_wan, "fused"), (tiny_skyreels_v2, "backend")],
                         ids=["wan-fused", "skyreels-backend"])
def test_pipeline_with_two_denoisers_is_patched_whole_and_unpatched_exactly(build, route, request):
    if route == "backend":
        request.getfixturevalue("skyreels_generic")
    pipe, run = _wan22_pipeline(build)
    processors = {(a, n): m.processor for a in ("transformer", "transformer_2")
                  for n, m in attention_modules(getattr(pipe, a)).items()}
    ref = run()
    sagegen.patch(pipe, policy=sagegen.PrecisionPolicy(last_steps=1))
    out = run()
    info = patch_info(pipe)
    assert info["routes"] == {route: 8}
    assert set(info["denoisers"]) == {"transformer", "transformer_2"}
    assert "transformer_2.blocks.1.attn2" in info["modules"]
    # 4 steps x 2 CFG calls, shared across both experts; the last step in full precision
    assert step_history(pipe) == [(0, False)] * 2 + [(1, False)] * 2 + [(2, False)] * 2 + [(3, True)] * 2
    assert info["stats"] == {"routed": 24, "full_precision_calls": 8, "processor_calls": 24}
    assert all(i["stats"].get("processor_calls") for i in info["denoisers"].values())  # both experts ran
    assert 0 < rel_l1(out, ref) < QUANT_TOL
    assert sagegen.is_patched(pipe)
    sagegen.unpatch(pipe)
    assert not sagegen.is_patched(pipe)
    assert all(getattr(pipe, a).get_submodule(n).processor is p for (a, n), p in processors.items())
    assert not any(hasattr(getattr(pipe, a), "_sagegen_patch") for a in ("transformer", "transformer_2"))
    assert not pipe.transformer._forward_pre_hooks and not pipe.transformer_2._forward_pre_hooks
    assert torch.equal(run(), ref)


# -- torch.compile ----------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", list(DISPATCH_MODELS))
def test_patched_model_compiles_with_fullgraph(name, fresh_dynamo):
    """The dynamo backend keeps the traced graph and runs it as is (no inductor codegen: slow on a 2-core CPU);
    the graph must hold one sagegen op per attention call and give the eager result."""
    model, inputs = DISPATCH_MODELS[name]()
    if name in NO_FULLGRAPH:
        with pytest.raises(Exception):  # noqa: B017 -- stock diffusers already breaks the graph
            with torch.no_grad():
                torch.compile(model, fullgraph=True, backend="eager")(**inputs)
        pytest.skip(f"{name}: the stock model does not compile with fullgraph=True")
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    sagegen.patch(model)
    eager = _run(model, inputs)
    compiled = torch.compile(model, fullgraph=True, backend=record)
    with torch.no_grad():
        out, again = compiled(**inputs)[0], compiled(**inputs)[0]
    assert len(graphs) == 1
    ops = sum(1 for n in graphs[0].graph.nodes if n.op == "call_function" and "sagegen" in str(n.target))
    assert ops == len(attention_modules(model))
    assert torch.equal(out, eager) and torch.equal(again, eager)
    sagegen.unpatch(model)
