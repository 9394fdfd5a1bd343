"""The patcher's API on tiny transformers: patch/unpatch/patched/is_patched, config, policy, errors, state."""

from __future__ import annotations

import inspect
import threading

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

import sagegen
from tests.support.patching import rel_l1
from sagegen.models.tiny import build_tiny_transformer
from sagegen.patch import (SUPPORTED_MODELS, attention_modules, patch_info, reset_stats, reset_steps,
                           set_attention_override, step_history)
from sagegen.patch.fusion import blocks as fused_blocks
from sagegen.patch.wrapper import is_wrapper


@pytest.fixture(scope="module")
def flux():
    return build_tiny_transformer("flux")


@pytest.fixture(autouse=True)
def _unpatched(flux):
    yield
    sagegen.unpatch(flux)


def flux_inputs(batch=1, size=4, text=8, dtype=torch.float32):
    n = size * size
    return dict(hidden_states=torch.randn(batch, n, 16, dtype=dtype),
                encoder_hidden_states=torch.randn(batch, text, 32, dtype=dtype),
                pooled_projections=torch.randn(batch, 64, dtype=dtype), timestep=torch.rand(batch),
                guidance=torch.full((batch,), 3.5), txt_ids=torch.zeros(text, 3),
                img_ids=torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(float(size)), torch.arange(float(size)),
                                                   indexing="ij"), -1).reshape(n, 3).float(),
                return_dict=False)


class TinyGeneric(torch.nn.Module):
    """A model sagegen does not know: two diffusers Attention layers, head dims 64 and 16."""

    def __init__(self, processor=None):
        super().__init__()
        self.blocks = torch.nn.ModuleList([
            Attention(query_dim=128, heads=2, dim_head=64, processor=processor or AttnProcessor2_0()),
            Attention(query_dim=32, heads=2, dim_head=16, processor=AttnProcessor2_0()),
        ])
        self.proj = torch.nn.Linear(128, 32)

    def forward(self, x):
        x = x + self.blocks[0](x)
        y = self.proj(x)
        return y + self.blocks[1](y)


def test_patch_returns_object_and_is_idempotent(flux):
    originals = {n: m.processor for n, m in attention_modules(flux).items()}
    assert not sagegen.is_patched(flux)
    assert sagegen.patch(flux) is flux
    assert sagegen.patch(flux) is flux  # twice: harmless
    for name, module in attention_modules(flux).items():
        assert is_wrapper(module.processor) and module.processor.original is originals[name]
        assert not is_wrapper(module.processor.original)
    assert sagegen.is_patched(flux)
    assert "SageFluxAttnProcessor" in repr(flux.transformer_blocks[0].attn.processor)
    sagegen.unpatch(flux)
    assert all(m.processor is originals[n] for n, m in attention_modules(flux).items())
    assert not sagegen.is_patched(flux)
    assert sagegen.unpatch(flux) is flux  # unpatching an unpatched model is a no-op


def test_patched_context_manager_restores_even_on_error(flux):
    originals = {n: m.processor for n, m in attention_modules(flux).items()}
    with sagegen.patched(flux) as obj:
        assert obj is flux and sagegen.is_patched(flux)
    assert not sagegen.is_patched(flux)
    with pytest.raises(RuntimeError, match="boom"):
        with sagegen.patched(flux):
            raise RuntimeError("boom")
    assert all(m.processor is originals[n] for n, m in attention_modules(flux).items())
    # nested inside an existing patch: the outer patch (and its config) survives the block
    sagegen.patch(flux, {"smooth_v": False})
    with sagegen.patched(flux, policy=sagegen.PrecisionPolicy(blocks=(0,))):
        assert patch_info(flux)["full_precision_modules"]
    info = patch_info(flux)
    assert info["config"]["smooth_v"] is False and not info["full_precision_modules"]


def test_config_default_is_diffusion_and_fields_override(flux):
    sagegen.patch(flux)
    assert patch_info(flux)["config"] == sagegen.DIFFUSION_CONFIG.to_dict()
    assert patch_info(flux)["config"]["smooth_v"] is True
    sagegen.patch(flux, {"smooth_v": False, "pv_precision": "fp16"})
    cfg = patch_info(flux)["config"]
    assert cfg["smooth_v"] is False and cfg["pv_precision"] == "fp16" and cfg["smooth_k"] is True
    custom = sagegen.SageConfig(k_granularity="per_token")
    sagegen.patch(flux, custom)
    assert patch_info(flux)["config"] == custom.to_dict()


def test_config_reaches_the_kernel(flux, monkeypatch):
    seen = []
    real = sagegen.api.sageattn

    def spy(*args, **kwargs):
        seen.append((kwargs["config"], kwargs["backend"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(sagegen.api, "sageattn", spy)
    sagegen.patch(flux, {"q_granularity": "per_block"}, backend="reference")
    with torch.no_grad():
        flux(**flux_inputs())
    assert seen and all(c == sagegen.DIFFUSION_CONFIG.replace(q_granularity="per_block") and b == "reference"
                        for c, b in seen)


@pytest.mark.parametrize("bad, error, match", [
    ({"smooth_vv": True}, ValueError, "smooth_vv"),
    ({"pv_precision": "fp4"}, ValueError, "pv_precision"),
    ("fast", TypeError, "config must be"),
])
def test_bad_config(flux, bad, error, match):
    with pytest.raises(error, match=match):
        sagegen.patch(flux, bad)
    assert not sagegen.is_patched(flux)


def test_bad_arguments(flux):
    with pytest.raises(ValueError, match="backend='cuda'.*auto"):
        sagegen.patch(flux, backend="cuda")
    with pytest.raises(TypeError, match="policy must be"):
        sagegen.patch(flux, policy={"first_steps": 1})
    with pytest.raises(ValueError, match="fp32_dtype"):
        sagegen.patch(flux, fp32_dtype=torch.float64)
    with pytest.raises(ValueError, match="last_steps needs the number of denoising steps"):
        sagegen.patch(flux, policy=sagegen.PrecisionPolicy(last_steps=2))
    with pytest.raises(TypeError, match="diffusers pipeline with a `transformer`"):
        sagegen.patch(object())

    class UNetPipe:
        unet = torch.nn.Linear(1, 1)

    with pytest.raises(ValueError, match="UNet.*transformer pipelines"):
        sagegen.patch(UNetPipe())
    assert not sagegen.is_patched(object())


@pytest.mark.parametrize("kwargs, match", [
    (dict(first_steps=-1), "first_steps"), (dict(last_steps=1.5), "last_steps"),
    (dict(num_steps=0), "num_steps"), (dict(blocks=(1.5,)), "blocks"), (dict(blocks=("",)), "blocks"),
])
def test_policy_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        sagegen.PrecisionPolicy(**kwargs)


def test_policy_blocks_resolution_and_errors(flux):
    # Flux: transformer_blocks (1 double-stream block) then single_transformer_blocks (1): indices 0, 1 / -1
    sagegen.patch(flux, policy=sagegen.PrecisionPolicy(blocks=(-1,)))
    assert patch_info(flux)["full_precision_modules"] == ["single_transformer_blocks.0.attn"]
    sagegen.patch(flux, policy=sagegen.PrecisionPolicy(blocks="transformer_blocks.*"))
    assert patch_info(flux)["full_precision_modules"] == ["transformer_blocks.0.attn"]
    with pytest.raises(ValueError, match=r"layer index 2 is out of range.*2 blocks"):
        sagegen.patch(flux, policy=sagegen.PrecisionPolicy(blocks=(2,)))
    with pytest.raises(ValueError, match="matches no attention module.*transformer_blocks.0.attn"):
        sagegen.patch(flux, policy=sagegen.PrecisionPolicy(blocks=("decoder.*",)))


def test_unknown_model_takes_the_generic_sdpa_route():
    model = TinyGeneric()
    assert set(SUPPORTED_MODELS.values()) == {"cogvideox", "hunyuanvideo", "mochi", "flux", "sd3", "wan"}
    x = torch.randn(2, 10, 128)
    with torch.no_grad():
        reference = model(x)
        sagegen.patch(model)  # no allow_generic needed any more (still accepted)
        out = model(x)
    stats = patch_info(model)["stats"]
    assert patch_info(model)["family"] == "generic"
    assert patch_info(model)["routes"] == {"sdpa": 2}
    # head dim 64 goes to sagegen; head dim 16 is not a kernel size and stays on SDPA
    assert stats["routed"] == 1 and stats["fallback:head_dim"] == 1
    assert 0 < rel_l1(out, reference) < 0.05
    sagegen.unpatch(model)


def test_processor_without_sdpa_warns_once():
    model = TinyGeneric(processor=AttnProcessor())  # the classic processor computes attention by hand
    sagegen.patch(model, allow_generic=True)
    with pytest.warns(RuntimeWarning, match="made no torch SDPA call.*attention backend"):
        with torch.no_grad():
            model(torch.randn(1, 4, 128))
    assert patch_info(model)["stats"]["unrouted_processor_calls"] == 1


def test_wrapper_keeps_the_processor_signature(flux):
    # diffusers drops keyword arguments the processor's __call__ does not name (e.g. image_rotary_emb)
    original = flux.transformer_blocks[0].attn.processor
    sagegen.patch(flux)
    wrapper = flux.transformer_blocks[0].attn.processor
    assert inspect.signature(wrapper.__call__).parameters.keys() == \
        inspect.signature(original.__call__).parameters.keys()
    assert "image_rotary_emb" in inspect.signature(wrapper.__call__).parameters


def test_fp32_model_runs_attention_in_bf16_and_returns_fp32(flux, monkeypatch):
    dtypes = []
    real = sagegen.api.sageattn

    def spy(q, k, v, **kwargs):
        dtypes.append(q.dtype)
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(sagegen.api, "sageattn", spy)
    inputs = flux_inputs()
    with torch.no_grad():
        reference = flux(**inputs)[0]
        sagegen.patch(flux)
        out = flux(**inputs)[0]
        sagegen.patch(flux, fp32_dtype=torch.float16)
        out16 = flux(**inputs)[0]
    assert dtypes[:2] == [torch.bfloat16] * 2 and dtypes[2:] == [torch.float16] * 2
    assert out.dtype == torch.float32 and out16.dtype == torch.float32
    assert 0 < rel_l1(out, reference) < 0.05 and 0 < rel_l1(out16, reference) < 0.05


def test_bf16_model(seed):
    model = build_tiny_transformer("flux", dtype=torch.bfloat16)
    inputs = flux_inputs(batch=2, dtype=torch.bfloat16)
    with torch.no_grad():
        reference = model(**inputs)[0]
        with sagegen.patched(model):
            out = model(**inputs)[0]
            assert patch_info(model)["stats"]["routed"] == 2
    assert out.dtype == torch.bfloat16 and 0 < rel_l1(out, reference) < 0.05


def test_no_global_state_changed(flux):
    import diffusers.models.attention_dispatch as dispatch
    import diffusers.models.transformers.transformer_flux as flux_module

    sdpa = F.scaled_dot_product_attention
    dispatch_fn = flux_module.dispatch_attention_fn
    registry = getattr(dispatch, "_AttentionBackendRegistry", None)
    active = registry.get_active_backend()[0] if registry is not None else None
    with sagegen.patched(flux):
        with torch.no_grad():
            flux(**flux_inputs())
        assert torch._C._len_torch_function_stack() == 0  # the routing mode lives only inside a processor call
        assert F.scaled_dot_product_attention is sdpa and torch.nn.functional.scaled_dot_product_attention is sdpa
    assert F.scaled_dot_product_attention is sdpa is torch._C._nn.scaled_dot_product_attention
    assert flux_module.dispatch_attention_fn is dispatch_fn
    if registry is not None:
        assert registry.get_active_backend()[0] == active
    assert not any(hasattr(m, "_sagegen_patch") for m in flux.modules())
    assert not flux._forward_pre_hooks


def test_routing_is_thread_local():
    """While a patched processor runs, an SDPA call from another thread is not taken over."""
    results = {}

    class Probe(AttnProcessor2_0):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
            q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)

            def other_thread():
                results["other"] = F.scaled_dot_product_attention(q, q, q)

            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
            results["q"] = q
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, **kwargs)

    model = TinyGeneric(processor=Probe())
    sagegen.patch(model, allow_generic=True)
    with torch.no_grad():
        model(torch.randn(1, 4, 128))
    q = results["q"]
    assert torch.equal(results["other"], F.scaled_dot_product_attention(q, q, q))
    assert patch_info(model)["stats"]["routed"] == 1  # only the processor's own call


def test_bare_transformer_step_policy_with_num_steps(flux):
    sagegen.patch(flux, policy=sagegen.PrecisionPolicy(first_steps=1, last_steps=1, num_steps=3))
    inputs = flux_inputs()
    with torch.no_grad():
        for generation in range(2):
            for t in (0.9, 0.9, 0.5, 0.1):  # the repeated timestep is a second (CFG) call of the same step
                flux(**{**inputs, "timestep": torch.tensor([t])})
    flags = [(0, True), (0, True), (1, False), (2, True)]
    assert step_history(flux) == flags * 2
    reset_stats(flux)
    reset_steps(flux)
    with torch.no_grad():
        flux(**{**inputs, "timestep": torch.tensor([0.5])})
    assert step_history(flux) == [(0, True)]
    assert patch_info(flux)["stats"] == {"full_precision_calls": 2}


def test_attention_override_requires_patch(flux):
    with pytest.raises(ValueError, match="needs a patched object"):
        set_attention_override(flux, None)
    sagegen.patch(flux)
    with pytest.raises(TypeError, match="callable"):
        set_attention_override(flux, 3)


@pytest.mark.slow
def test_torch_compile_traces_through_the_patch():
    import torch._dynamo

    model = build_tiny_transformer("flux", dtype=torch.bfloat16)
    inputs = flux_inputs(dtype=torch.bfloat16)
    sagegen.patch(model)
    torch._dynamo.reset()
    with torch.no_grad():
        # under compile the fused blocks run diffusers' forward (inductor fuses those ops itself): so does the
        # eager reference
        fused_blocks.remove(model)
        eager = model(**inputs)[0]
        assert fused_blocks.install(model) == 2
        explanation = torch._dynamo.explain(model)(**inputs)
        compiled = torch.compile(model, backend="eager")(**inputs)[0]
    assert explanation.graph_break_count == 0
    assert torch.equal(compiled, eager)
    # diagnostics count eager calls only: counting inside traced code made dynamo recompile every call
    assert patch_info(model)["stats"]["routed"] == 2


class SquareMaskModel(torch.nn.Module):
    """Calls attention with the square text-padding mask HunyuanVideo used in diffusers 0.32: [B, 1, N, N],
    True where both the query and the key are valid tokens."""

    def __init__(self):
        super().__init__()
        self.attn = Attention(query_dim=128, heads=2, dim_head=64, processor=AttnProcessor2_0())

    def forward(self, x, valid):
        n = x.shape[1]
        ok = torch.arange(n)[None, :] < torch.tensor(valid)[:, None]
        return self.attn(x, attention_mask=(ok[:, None, :, None] & ok[:, None, None, :]))


def test_square_padding_mask_becomes_a_key_mask(monkeypatch, seed):
    masks = []
    real = sagegen.api.sageattn

    def spy(q, k, v, **kwargs):
        masks.append(kwargs["attn_mask"])
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(sagegen.api, "sageattn", spy)
    model, valid = SquareMaskModel(), [20, 37]
    x = torch.randn(2, 48, 128)
    sagegen.patch(model, allow_generic=True)
    with torch.no_grad():
        out = model(x, valid)
    sagegen.unpatch(model)
    assert [tuple(m.shape) for m in masks] == [(2, 1, 1, 48)]  # per key in the kernel, no 48x48 mask
    assert masks[0][:, 0, 0].sum(dim=1).tolist() == valid
    for b, n in enumerate(valid):  # each sample's valid tokens attend only each other, exactly as SDPA
        with torch.no_grad():
            alone = model(x[b:b + 1, :n], [n])
        assert rel_l1(out[b, :n], alone[0]) < 0.05
        # padded query rows have no key: zeros from attention, so only the output projection's bias remains
        bias = model.attn.to_out[0].bias
        assert torch.allclose(out[b, n:], bias.expand(48 - n, -1), atol=1e-6)


def test_auto_backend_crossover_is_reported_from_the_kernel_rule():
    from sagegen.kernels import dispatch as backends
    from sagegen.patch.session import _auto_prefers_sdpa

    rule = getattr(backends, "auto_prefers_sdpa", None)
    if rule is None:
        pytest.skip("this sagegen has no auto crossover rule")
    assert _auto_prefers_sdpa(256, 256, 2 * 24, 128) is True  # HunyuanVideo's text refiner
    assert _auto_prefers_sdpa(17776, 17776, 2 * 48, 64) is False  # CogVideoX-5b
    assert _auto_prefers_sdpa(4608, 4608, 24, 128) is True  # Flux-dev 1024² (0.96x measured)
    assert _auto_prefers_sdpa(4429, 4429, 2 * 38, 64) is False  # SD3.5-large 1024², CFG (1.13x measured)
    assert _auto_prefers_sdpa(4608, 4608, 48, 64) is True  # 0.99x measured
    assert _auto_prefers_sdpa(75600, 512, 40, 128) is True  # Wan2.1-14B 720p cross-attention (SDPA 1.2x faster)
    assert _auto_prefers_sdpa(75600, 513, 40, 128) is False
    assert _auto_prefers_sdpa(4608, 4608, 48, 128) == bool(rule(4608, 4608, 48, 128)) is False  # 1.07x
