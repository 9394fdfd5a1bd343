"""`sagegen.patch(..., linear="fp8")` on tiny models of every family (CPU, the emulation): per-layer and
whole-step accuracy against bf16, exact unpatch, the layer policy, patch_info, torch.compile, bad input and
the hardware fallback."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import sagegen
from tests.support.helpers import cosine, rel_l1
from sagegen.linear import FP8Linear, LinearPolicy
from sagegen.models import arch as archs
from sagegen.patch import patch_info
from sagegen.patch import linear_swap as linear_patch

ARCHS = ["cogvideox-5b", "hunyuanvideo", "mochi-1", "flux.1-dev", "sd3.5-medium"]
EVERYWHERE = LinearPolicy(keep_blocks=(), min_rows=1)  # every block's linears, every call in FP8


def _tiny(name: str):
    arch = archs.get_arch(name)
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    size = dict(height=64, width=64)
    if arch.frames:
        size["frames"] = 13 if arch.family == "mochi" else 9
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, **size,
                                  text_tokens=archs.smoke_text_tokens(name))
    return model, inputs


def _linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@pytest.mark.parametrize("name", ARCHS)
def test_fp8_linears_per_layer_and_step_accuracy_and_exact_unpatch(name):
    model, inputs = _tiny(name)
    before = _linears(model)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        stock = model(**inputs)[0]

    sagegen.patch(model, backend="reference", linear="fp8", linear_policy=EVERYWHERE)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert layers, "no linear was swapped"
    errors = {}

    def check(module, args, out):
        x = args[0]
        if module.prologue == "gelu_tanh":  # the MLP's GELU is fused: the layer is fed the pre-GELU tensor
            x = F.gelu(x, approximate="tanh")
        ref = F.linear(x.double(), module.linear.weight.double(),
                       None if module.linear.bias is None else module.linear.bias.double())
        errors.setdefault(id(module), []).append((cosine(out, ref), rel_l1(out, ref)))

    hooks = [m.register_forward_hook(check) for m in layers.values()]
    with torch.inference_mode():
        out = model(**inputs)[0]
    for h in hooks:
        h.remove()
    info = patch_info(model)["linear"]
    assert info["fp8_layer_count"] == len(layers) and info["fp8_calls"] >= len(layers) - 2
    assert sorted(info["fp8_layers"]) == sorted(layers)
    worst_cos = min(c for v in errors.values() for c, _ in v)
    worst_l1 = max(r for v in errors.values() for _, r in v)
    assert worst_cos > 0.995 and worst_l1 < 0.1, (worst_cos, worst_l1)
    assert cosine(out, stock) > 0.99 and rel_l1(out, stock) < 0.15

    # the attention alone: FP8 linears changed the output
    sagegen.patch(model, backend="reference")
    assert patch_info(model)["linear"] is None
    with torch.inference_mode():
        attention_only = model(**inputs)[0]
    assert not torch.equal(attention_only, out)

    sagegen.patch(model, backend="reference", linear="fp8", linear_policy=EVERYWHERE)
    sagegen.unpatch(model)
    after = _linears(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert not any(isinstance(m, FP8Linear) for m in model.modules())
    state = model.state_dict()
    assert state.keys() == params.keys() and all(torch.equal(state[k], params[k]) for k in params)
    with torch.inference_mode():
        assert torch.equal(model(**inputs)[0], stock)


def test_default_policy_keeps_embedders_final_projection_and_first_and_last_blocks():
    model, _ = _tiny("flux.1-dev")  # smoke: one double-stream and one single-stream block
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(0,)))
    info = patch_info(model)["linear"]
    assert info["fp8_layers"] and all(n.startswith("single_transformer_blocks.0.") for n in info["fp8_layers"])
    bf16 = info["bf16_layers"]
    assert bf16["proj_out"].startswith("outside") and bf16["x_embedder"].startswith("outside")
    assert bf16["transformer_blocks.0.attn.to_q"] == "in kept block transformer_blocks.0"

    sagegen.patch(model, linear="fp8")  # the default: first and last block kept, so nothing here
    assert patch_info(model)["linear"]["fp8_layer_count"] == 0

    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=("*.ff*", "*.norm*"),
                                                                   include_outside_blocks=True))
    info = patch_info(model)["linear"]
    assert "proj_out" in info["fp8_layers"] and "transformer_blocks.0.attn.to_q" in info["fp8_layers"]
    assert not any(".ff" in n or ".norm" in n for n in info["fp8_layers"])
    assert info["bf16_layers"]["transformer_blocks.0.ff.net.2"] == "matched by keep_blocks"
    sagegen.unpatch(model)


class _LoraLinear(torch.nn.Module):
    """The shape of peft's LoRA wrapper (without peft, as the older-diffusers stacks run): base_layer plus
    lora_A / lora_B (tests/patch/test_patch_lora.py runs peft itself)."""

    def __init__(self, base: torch.nn.Linear, rank: int = 16, dora: bool = False):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(base.in_features, rank, bias=False)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(rank, base.out_features, bias=False)})
        self.use_dora = {"default": dora}

    def forward(self, x):
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


def test_peft_lora_layers_run_their_base_in_fp8():
    """A LoRA layer's base runs FP8 beside its bf16 branch (listed bf16, with the reason); a DoRA layer's base
    stays bf16 (its forward reads the bf16 weight); unpatch puts the same base linear back."""
    model, _ = _tiny("flux.1-dev")
    attn = model.transformer_blocks[0].attn
    attn.to_q = _LoraLinear(attn.to_q).to(torch.bfloat16)
    attn.to_k = _LoraLinear(attn.to_k, dora=True).to(torch.bfloat16)
    base_q = attn.to_q.base_layer
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=()))
    info = patch_info(model)["linear"]
    assert "transformer_blocks.0.attn.to_q.base_layer" in info["fp8_layers"]
    assert isinstance(attn.to_q.base_layer, FP8Linear) and attn.to_q.base_layer.linear is base_q
    branch = [n for n in info["bf16_layers"] if n.startswith("transformer_blocks.0.attn.to_q.")]
    assert sorted(branch) == ["transformer_blocks.0.attn.to_q.lora_A.default",
                              "transformer_blocks.0.attn.to_q.lora_B.default"]
    assert all("LoRA branch" in info["bf16_layers"][n] for n in branch)
    assert "DoRA" in info["bf16_layers"]["transformer_blocks.0.attn.to_k.base_layer"]
    assert info["lora"] == {"layers": 2, "fp8_base_layers": 1, "merged_layers": 0, "adapters": ["default"],
                            "requantized": 0, "loads_after_patch": 0,
                            "bf16_base_layers": {"transformer_blocks.0.attn.to_k.base_layer":
                                                 info["bf16_layers"]["transformer_blocks.0.attn.to_k.base_layer"]}}
    assert "transformer_blocks.0.attn.to_v" in info["fp8_layers"]
    sagegen.unpatch(model)
    assert attn.to_q.base_layer is base_q


def test_patched_context_restores_the_previous_linear_patch():
    model, _ = _tiny("sd3.5-medium")
    sagegen.patch(model, linear="fp8", linear_policy=EVERYWHERE)
    swapped = {n for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    with sagegen.patched(model):
        assert not any(isinstance(m, FP8Linear) for m in model.modules())
    assert {n for n, m in model.named_modules() if isinstance(m, FP8Linear)} == swapped
    assert patch_info(model)["linear"]["policy"]["keep_blocks"] == ()
    sagegen.unpatch(model)


@pytest.mark.parametrize("native", [True, False])
def test_compiled_model_with_fp8_linears_gives_the_eager_result(native):
    """Per-token FP8 layers trace as plain ops by default (no ``sagegen::fp8_linear`` node: the quantization is
    in the graph for inductor to fuse); ``COMPILE_NATIVE = False`` keeps one opaque op per layer. Both through
    aot_autograd (functionalisation, the op's fake implementation) equal the eager result on the CPU."""
    from sagegen.linear import module as fp8_module

    torch._dynamo.reset()
    model, inputs = _tiny("cogvideox-5b")
    sagegen.patch(model, backend="reference", fuse_prologue=False, linear="fp8", linear_policy=EVERYWHERE)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func

        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)

    fp8_module.COMPILE_NATIVE = native
    try:
        with torch.inference_mode():
            eager = model(**inputs)[0]
            out = torch.compile(model, backend=backend, fullgraph=True)(**inputs)[0]
    finally:
        fp8_module.COMPILE_NATIVE = True
    assert len(graphs) == 1
    calls = sum(1 for node in graphs[0].graph.nodes if "fp8_linear" in str(node.target))
    assert calls == (0 if native else patch_info(model)["linear"]["fp8_layer_count"])
    assert patch_info(model)["linear"]["fp8_layer_count"] > 0
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    sagegen.unpatch(model)
    torch._dynamo.reset()


def test_outlier_modes_calibrate_in_a_patched_model():
    model, inputs = _tiny("hunyuanvideo")
    for mode in ("smooth", "split"):
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1, outliers=mode,
                                                                      outlier_ratio=2.0))
        with torch.inference_mode():
            model(**inputs)
        layers = [m for m in model.modules() if isinstance(m, FP8Linear)]
        assert layers and all(m.calibrated for m in layers if m.fp8_calls)
        info = patch_info(model)["linear"]["layers"]
        if mode == "smooth":
            assert all(v["smoothed"] for v in info.values() if v["calls"])
        else:
            assert any(v["outlier_channels"] for v in info.values())
    sagegen.unpatch(model)


def test_bad_linear_arguments_are_refused_before_anything_changes():
    model, _ = _tiny("sd3.5-medium")
    with pytest.raises(ValueError, match="linear='int8'"):
        sagegen.patch(model, linear="int8")
    with pytest.raises(TypeError, match="linear_policy"):
        sagegen.patch(model, linear="fp8", linear_policy={"keep_blocks": ()})
    assert not sagegen.is_patched(model)
    with pytest.raises(ValueError, match="out of range"):
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(99,)))
    sagegen.unpatch(model)
    with pytest.raises(ValueError, match="matches no nn.Linear"):
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=("nope.*",)))
    sagegen.unpatch(model)
    for bad in (dict(act_granularity="per_tensor"), dict(weight_granularity="x"), dict(outliers="clip"),
                dict(min_rows=0), dict(act_granularity="per_block"), dict(keep_blocks=(True,))):
        with pytest.raises((ValueError, TypeError)):
            LinearPolicy(**bad)


@pytest.mark.parametrize("fallback", ["error", "reference", "sdpa"])
def test_a_gpu_without_fp8_follows_the_config_fallback(monkeypatch, fallback):
    model, inputs = _tiny("sd3.5-medium")
    monkeypatch.setattr(linear_patch, "_device", lambda m: torch.device("cuda", 0))
    monkeypatch.setattr(linear_patch, "fp8_capable", lambda d: (False, "NVIDIA A100 (sm80) has no FP8"))
    config = sagegen.DIFFUSION_CONFIG.replace(fallback=fallback)
    if fallback == "error":
        with pytest.raises(RuntimeError, match="sm80"):
            sagegen.patch(model, config, linear="fp8", linear_policy=EVERYWHERE)
        sagegen.unpatch(model)
        return
    if fallback == "sdpa":
        with pytest.warns(UserWarning, match="bf16 linears"):
            sagegen.patch(model, config, linear="fp8", linear_policy=EVERYWHERE)
        info = patch_info(model)["linear"]
        assert info["fp8_layer_count"] == 0 and "bf16 fallback" in info["note"]
    else:
        sagegen.patch(model, config, linear="fp8", linear_policy=EVERYWHERE)
        info = patch_info(model)["linear"]
        assert info["emulated"] and info["fp8_layer_count"] > 0
    sagegen.unpatch(model)


def test_patching_again_with_the_same_linear_policy_keeps_the_fp8_layers():
    model, _ = _tiny("sd3.5-medium")
    sagegen.patch(model, linear="fp8", linear_policy=EVERYWHERE)
    first = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    sagegen.patch(model, {"smooth_v": False}, linear="fp8", linear_policy=EVERYWHERE)  # attention config only
    again = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert again.keys() == first.keys() and all(again[n] is first[n] for n in first)
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(0,), min_rows=1))
    changed = {n for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert changed < set(first)
    sagegen.unpatch(model)


def test_the_default_policy_parks_the_bf16_weights_outside_the_module_tree():
    """FP8 linears save memory by default: the GPU keeps only the FP8 weights (`LinearPolicy.bf16_copies`)."""
    assert LinearPolicy().bf16_copies == "cpu"
    model, _ = _tiny("flux.1-dev")
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=()))  # (1-block tiny model)
    layers = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert layers and all(m.parked and "linear" not in m._modules for m in layers)
    info = patch_info(model)["linear"]
    moved = sum(m.linear.weight.numel() * 2 + (m.linear.bias.numel() * 2 if m.linear.bias is not None else 0)
                for m in layers)
    assert info["bf16_bytes_moved_to_cpu"] == moved and info["bf16_bytes_dropped"] == 0
    sagegen.unpatch(model)


def test_bf16_copies_dropped_free_them_and_unpatch_restores_the_dequantized_weights(seed):
    model, inputs = _tiny("sd3.5-medium")
    before = _linears(model)
    originals = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        parked = model(**inputs)[0]
        sagegen.unpatch(model)
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1,
                                                                      bf16_copies="drop"))
        layers = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
        assert layers and all(m.linear.weight.is_meta and m.linear.bias is None or m.linear.bias.is_meta
                              for m in layers.values())
        info = patch_info(model)["linear"]
        assert info["bf16_bytes_moved_to_cpu"] == 0
        assert info["bf16_bytes_dropped"] == sum(m.linear.weight.numel() * 2 for m in layers.values())
        dropped = model(**inputs)[0]
        expected = {n: (m.dequantized_weight().to(torch.bfloat16), m.gemm_bias()) for n, m in layers.items()}
    assert torch.equal(dropped, parked)  # the FP8 products do not read the bf16 weights
    with pytest.warns(UserWarning, match="dequantized FP8 weights"):
        sagegen.unpatch(model)
    after = _linears(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    state = model.state_dict()
    assert state.keys() == originals.keys()
    for name, (weight, bias) in expected.items():
        assert torch.equal(state[name + ".weight"], weight) and not state[name + ".weight"].is_meta
        assert bias is None or torch.equal(state[name + ".bias"], bias)
        # the FP8 weight's rounding: e4m3 keeps 3 mantissa bits, so each element is within ~6% of the original
        orig = originals[name + ".weight"].float()
        assert (weight.float() - orig).abs().max() <= 0.07 * orig.abs().amax(dim=1, keepdim=True).max()
        assert not torch.equal(weight, originals[name + ".weight"])
    untouched = [k for k in originals if not any(k.startswith(n + ".") for n in expected)]
    assert untouched and all(torch.equal(state[k], originals[k]) for k in untouched)


@pytest.mark.parametrize("outliers", ["smooth", "split"])
def test_dropping_the_bf16_copies_refuses_outlier_calibration(outliers):
    with pytest.raises(ValueError, match=r"bf16_copies='drop' needs outliers='off'"):
        LinearPolicy(outliers=outliers, bf16_copies="drop")
    with pytest.raises(ValueError, match=r"bf16_copies='nowhere'; use one of \('cpu', 'keep', 'drop'\)"):
        LinearPolicy(bf16_copies="nowhere")


@pytest.mark.parametrize("outliers", ["smooth", "split"])
def test_dequantized_weight_undoes_smoothing_and_keeps_split_columns(seed, outliers):
    lin = torch.nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight.mul_(torch.linspace(0.1, 3, 64))
    layer = FP8Linear(lin, outliers=outliers, min_rows=1, outlier_ratio=2.0)
    x = torch.randn(16, 64)
    x[:, 5] *= 50  # an outlier channel
    layer.calibrate(x)
    assert layer.col_scale is not None
    w = layer.dequantized_weight()
    err = (w - lin.weight).abs().max() / lin.weight.abs().max()
    assert err < 0.07, err
    if outliers == "split":
        assert torch.equal(w[:, layer.outlier_idx], lin.weight[:, layer.outlier_idx].float())


def test_bf16_copies_on_the_cpu_leave_the_module_tree_and_come_back_exactly(seed):
    model, inputs = _tiny("sd3.5-medium")
    before = _linears(model)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        stock = model(**inputs)[0]
    policy = LinearPolicy(keep_blocks=(), min_rows=4096, bf16_copies="cpu")  # every call below min_rows
    sagegen.patch(model, linear="fp8", linear_policy=policy)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert layers and all(m.parked for m in layers.values())
    assert not any(k.startswith(tuple(n + ".linear." for n in layers)) for k in model.state_dict())
    info = patch_info(model)["linear"]
    assert info["bf16_copies"] == "cpu" and info["bf16_bytes_moved_to_cpu"] > 0
    with torch.inference_mode():
        small = model(**inputs)[0]  # the dequantized FP8 weights in bf16: close to stock, not equal
    assert cosine(small, stock) > 0.99 and not torch.equal(small, stock)
    assert all(m.fp8_calls == 0 for m in layers.values())
    sagegen.unpatch(model)
    after = _linears(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    state = model.state_dict()
    assert state.keys() == params.keys() and all(torch.equal(state[k], params[k]) for k in params)
