"""The gated-residual + modulated-LayerNorm kernel (`kernels.triton_residual_norm`) against diffusers' eager
ops and an fp64 oracle, and Wan's fused block forward (`patch.fused_blocks`) against the stock block: the
route, the output, unpatch bit for bit, Wan 2.2 TI2V's per-token modulation, and the fallbacks."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.conftest import interpreted
from tests.support.patching import rel_l1
from sagegen.kernels import triton_residual_norm as kernel
from sagegen.kernels.triton_residual_norm import residual_norm, residual_norm_reference
from sagegen.models.tiny_video import build_tiny_wan_transformer
from sagegen.patch import patch_info
from sagegen.patch.families import wan
from sagegen.patch.fusion import blocks as fused_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernel runs in the interpreter


def _fp64(x, y, gate, weight, bias, eps, scale, shift):
    """The same computation in fp64 from the rounded residual: the oracle of the normalised row."""
    h = x if y is None else (x.float() + (y * gate if gate is not None else y.float())).type_as(x)
    d = h.double()
    n = (d - d.mean(-1, keepdim=True)) / torch.sqrt(d.var(-1, unbiased=False, keepdim=True) + eps)
    if weight is not None:
        n = n * weight.double() + bias.double()
    if scale is not None:
        n = n * (1 + scale.double()) + shift.double()
    return h, n


@pytest.mark.parametrize("B,S,C,res,gated,affine,mod", [
    (2, 7, 48, False, False, False, "sample"),   # Wan's norm1: modulation per sample [B, 1, C]
    (2, 5, 100, True, True, True, None),         # residual with gate, then norm2 with weight and bias
    (1, 9, 64, True, False, False, "token"),      # plain add, then norm3 modulated per token (Wan 2.2 TI2V)
    (3, 4, 33, True, True, False, "shared"),     # modulation shared by the batch [1, 1, C]; odd width
])
def test_residual_norm_matches_eager_ops_and_fp64(seed, B, S, C, res, gated, affine, mod):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(DEVICE)
    x = (rnd(B, S, C, s=3.0) + 0.7).to(torch.bfloat16)
    y = rnd(B, S, C).to(torch.bfloat16) if res else None
    gate = rnd(B, 1, C, s=0.5) if gated else None
    weight, bias = (rnd(C, s=0.3) + 1, rnd(C, s=0.2)) if affine else (None, None)
    shape = {"sample": (B, 1, C), "token": (B, S, C), "shared": (1, 1, C), None: None}[mod]
    scale, shift = (rnd(*shape, s=0.2), rnd(*shape, s=0.2)) if shape else (None, None)
    kw = dict(weight=weight, bias=bias, eps=1e-6, scale=scale, shift=shift)
    h, n = residual_norm(x, y, gate, **kw)
    h_ref, n_ref = residual_norm_reference(x, y, gate, **kw)
    _, n64 = _fp64(x, y, gate, weight, bias, 1e-6, scale, shift)
    assert h.dtype == n.dtype == torch.bfloat16 and n.shape == x.shape
    assert torch.equal(h, h_ref)  # the residual: the same fp32 ops, one rounding
    # the norm: fp32 statistics summed in another order than torch's -> at most one bf16 step, rarely
    step = n64.abs().float() * 2.0**-7 + 1e-6
    assert ((n.float() - n_ref.float()).abs() <= step).all()
    assert ((n.float() - n64).abs() <= step).all(), float(((n.float() - n64).abs() / step).max())
    assert (n != n_ref).float().mean() < 0.02


@pytest.mark.parametrize("B,S,C,res,gated,mod", [
    (2, 7, 48, False, False, "token"),    # LTX's norm1: RMSNorm, modulation per token [B, S, C]
    (2, 5, 100, True, False, "sample"),   # LTX's plain residual (cross-attention), then norm2 per sample
    (1, 6, 33, True, True, None),         # gated residual, odd width, no modulation
])
def test_rms_mode_matches_eager_ops_and_fp64(seed, B, S, C, res, gated, mod):
    """``rms=True``: diffusers' RMSNorm (no weights) in place of the LayerNorm."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(DEVICE)
    x = (rnd(B, S, C, s=3.0) + 0.7).to(torch.bfloat16)
    y = rnd(B, S, C).to(torch.bfloat16) if res else None
    gate = rnd(B, 1, C, s=0.5) if gated else None
    shape = {"sample": (B, 1, C), "token": (B, S, C), None: None}[mod]
    scale, shift = (rnd(*shape, s=0.2), rnd(*shape, s=0.2)) if shape else (None, None)
    h, n = residual_norm(x, y, gate, eps=1e-6, scale=scale, shift=shift, rms=True)
    h_ref, n_ref = residual_norm_reference(x, y, gate, eps=1e-6, scale=scale, shift=shift, rms=True)
    d = h_ref.double()
    n64 = d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-6)
    if scale is not None:
        n64 = n64 * (1 + scale.double()) + shift.double()
    assert torch.equal(h, h_ref)
    step = n64.abs().float() * 2.0**-7 + 1e-6
    assert ((n.float() - n64).abs() <= step).all(), float(((n.float() - n64).abs() / step).max())
    assert ((n.float() - n_ref.float()).abs() <= step).all()
    # and the LayerNorm is not what ran: a row with a large mean normalises differently
    _, ln = residual_norm(x, y, gate, eps=1e-6, scale=scale, shift=shift)
    assert not torch.equal(ln, n)
    with pytest.raises(ValueError, match="rms=True takes no weight"):
        residual_norm(x, weight=torch.ones(C, device=DEVICE), bias=torch.zeros(C, device=DEVICE), rms=True)


@interpreted
@pytest.mark.parametrize("fp8_out", [False, True])
def test_rows_a_program_do_not_change_the_rows(fp8_out, monkeypatch):
    """Several rows a program (the interpreter's setting) with a ragged last program give the same bits as one
    row a program (the GPU's)."""
    monkeypatch.setattr(kernel, "INTERPRETER_ROWS", 64)
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(2, 75, 40, generator=g) * 3).to(DEVICE, torch.bfloat16)  # 150 rows: 3 programs of 64
    y = torch.randn(2, 75, 40, generator=g).to(DEVICE, torch.bfloat16)
    gate, scale, shift = (torch.randn(2, 1, 40, generator=g).to(DEVICE) * 0.3 for _ in range(3))
    many = residual_norm(x, y, gate, scale=scale, shift=shift, fp8_out=fp8_out)
    many_add = residual_norm(x, y, norm=False, fp8_out=fp8_out) if fp8_out else None
    monkeypatch.undo()
    monkeypatch.setattr(kernel, "INTERPRETER_ROWS", 1)
    one = residual_norm(x, y, gate, scale=scale, shift=shift, fp8_out=fp8_out)
    def bits(result):  # every tensor of (h, n) or (h, (n_fp8, scales)), FP8 as its bytes
        flat = [t for part in result for t in (part if isinstance(part, tuple) else (part,))]
        return [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in flat]

    for a, b in zip(bits(many), bits(one)):
        assert torch.equal(a, b)
    if fp8_out:
        for a, b in zip(bits(many_add), bits(residual_norm(x, y, norm=False, fp8_out=True))):
            assert torch.equal(a, b)


def test_residual_norm_without_norm_and_validation():
    x = torch.randn(2, 3, 16, device=DEVICE).to(torch.bfloat16)
    y = torch.randn(2, 3, 16, device=DEVICE).to(torch.bfloat16)
    gate = torch.randn(2, 1, 16, device=DEVICE)
    h, n = residual_norm(x, y, gate, norm=False)
    assert n is None and torch.equal(h, residual_norm_reference(x, y, gate, norm=False)[0])
    assert residual_norm(x, norm=False)[0] is x
    with pytest.raises(ValueError, match="x must"):
        residual_norm(x.float())
    with pytest.raises(ValueError, match="y must"):
        residual_norm(x, y[:, :2])
    with pytest.raises(ValueError, match="scale and shift"):
        residual_norm(x, scale=gate)
    with pytest.raises(ValueError, match="gate must"):
        residual_norm(x, y, torch.randn(2, 2, 16, device=DEVICE))


def _inputs(model, batch=2, frames=5, h=32, w=32, text=24, seed=0, per_token=False):
    gen = torch.Generator().manual_seed(seed)
    c = model.config
    lf = (frames - 1) // 4 + 1
    latents = torch.randn(batch, c.in_channels, lf, h // 8, w // 8, generator=gen)
    tokens = lf * (h // 16) * (w // 16)
    timestep = torch.full((batch,), 500.0)
    if per_token:  # Wan 2.2 TI2V (expand_timesteps): one timestep per token, the first frame's at 0
        timestep = torch.full((batch, tokens), 500.0)
        timestep[:, : tokens // lf] = 0.0
    return dict(hidden_states=latents.to(DEVICE, torch.bfloat16), timestep=timestep.to(DEVICE),
                encoder_hidden_states=torch.randn(batch, text, c.text_dim, generator=gen).to(DEVICE, torch.bfloat16),
                return_dict=False)


@pytest.mark.parametrize("per_token", [False, True])
def test_fused_wan_blocks_match_the_stock_blocks(seed, per_token, monkeypatch):
    """Reference attention on both sides, so the only difference is the fused element-wise work: the fused
    model stays within bf16 rounding of the one whose blocks run diffusers' code; unpatch is bit-identical."""
    model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=seed % 100).to(DEVICE)
    inputs = _inputs(model, seed=seed % 1000, per_token=per_token)
    cls = type(model.blocks[0])
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", fuse_prologue=False)
        unfused = model(**inputs)[0]
        assert patch_info(model)["fused_blocks"] == 0 and type(model.blocks[0]) is cls
        sagegen.patch(model, backend="reference")
        assert patch_info(model)["fused_blocks"] == len(model.blocks)
        assert type(model.blocks[0]).__name__ == cls.__name__ and isinstance(model.blocks[0], cls)
        calls = []
        monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or residual_norm(*a, **k))
        fused = model(**inputs)[0]
        monkeypatch.undo()
        sagegen.unpatch(model)
        again = model(**inputs)[0]
    assert type(model.blocks[0]) is cls and torch.equal(again, stock)
    assert len(calls) == 4 * len(model.blocks)  # four passes per block, each on the kernel
    assert rel_l1(fused, unfused) < 5e-3, rel_l1(fused, unfused)


def test_fused_wan_block_falls_back_where_it_cannot_reproduce(seed, monkeypatch):
    """A block with another norm is not swapped; fp32 models and calls the kernel cannot run take the stock
    forward, bit for bit."""
    model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=1).to(DEVICE)
    block = model.blocks[0]
    block.norm1 = torch.nn.LayerNorm(block.norm1.normalized_shape, elementwise_affine=False)  # not FP32LayerNorm
    assert not wan.fusable(block) and wan.fusable(model.blocks[1])
    inputs = _inputs(model, seed=seed % 1000)
    with torch.no_grad():
        # the stock blocks around the same fused Q/K prologue: the prologue rounds differently from diffusers'
        # norm and rotary, and one bf16 ulp can move an INT8 code (seed 4283450758 did)
        sagegen.patch(model, backend="reference")
        fused_blocks.remove(model)
        assert fused_blocks.fused_count(model) == 0
        unfused = model(**inputs)[0]
        sagegen.patch(model, backend="reference")
        assert patch_info(model)["fused_blocks"] == len(model.blocks) - 1
        calls = []
        monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or residual_norm(*a, **k))
        model(**inputs)
        assert len(calls) == 4 * (len(model.blocks) - 1)
        monkeypatch.setattr(fused_blocks, "_can_run", lambda x: False)
        assert torch.equal(model(**inputs)[0], unfused) and len(calls) == 4 * (len(model.blocks) - 1)
        sagegen.unpatch(model)
    assert patch_info(model) == {} and fused_blocks.fused_count(model) == 0

    block = model.blocks[1]  # gradients recorded: the stock forward, so they reach the block's inputs
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or residual_norm(*a, **k))
    sagegen.patch(model, backend="reference")
    with torch.no_grad():  # the same call without gradients takes the kernel
        block(torch.randn(1, 4, block.scale_shift_table.shape[-1], device=DEVICE, dtype=torch.bfloat16),
              torch.randn(1, 3, block.scale_shift_table.shape[-1], device=DEVICE, dtype=torch.bfloat16),
              torch.randn(1, 6, block.scale_shift_table.shape[-1], device=DEVICE, dtype=torch.bfloat16), None)
    assert len(calls) == 4
    calls.clear()
    x = torch.randn(1, 4, block.scale_shift_table.shape[-1], device=DEVICE, dtype=torch.bfloat16,
                    requires_grad=True)
    temb = torch.randn(1, 6, x.shape[-1], device=DEVICE, dtype=torch.bfloat16)
    ehs = torch.randn(1, 3, x.shape[-1], device=DEVICE, dtype=torch.bfloat16)
    block(x, ehs, temb, None).float().sum().backward()
    assert not calls and x.grad is not None and torch.isfinite(x.grad).all()
    sagegen.unpatch(model)

    fp32 = build_tiny_wan_transformer(dtype=torch.float32, seed=1).to(DEVICE)
    inputs = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in _inputs(fp32, seed=seed % 1000).items()}
    with torch.no_grad():
        sagegen.patch(fp32, backend="reference", fuse_prologue=False)
        unfused = fp32(**inputs)[0]
        sagegen.patch(fp32, backend="reference")
        assert patch_info(fp32)["fused_blocks"] == len(fp32.blocks)
        calls = []
        monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or residual_norm(*a, **k))
        assert torch.equal(fp32(**inputs)[0], unfused) and not calls  # fp32 hidden states: the stock forward
        sagegen.unpatch(fp32)


@pytest.mark.parametrize("hook", ["diffusers_after", "diffusers_first", "accelerate_first"])
def test_fused_blocks_keep_diffusers_hooks(seed, monkeypatch, hook):
    """diffusers' hooks (context-parallel splits, caches, sagegen's CP mask hooks) and accelerate's wrap a
    module's bound ``forward``. Patched first, the hook wraps the fused forward; hooked first, the hook's
    reference to the stock forward is re-pointed at the fused one (`fused_common.swap_class`). Either way the
    hook runs, every block runs fused, and after `unpatch` the hooked block runs the stock forward again, bit
    for bit."""
    from accelerate.hooks import ModelHook as AccelerateHook
    from accelerate.hooks import add_hook_to_module
    from diffusers.hooks import HookRegistry, ModelHook

    class Count(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            Count.calls += 1
            return args, kwargs

    class AccelerateCount(AccelerateHook):
        def pre_forward(self, module, *args, **kwargs):
            Count.calls += 1
            return args, kwargs

    def install():
        if hook.startswith("diffusers"):
            HookRegistry.check_if_exists_or_initialize(model.blocks[0]).register_hook(Count(), "count")
        else:
            add_hook_to_module(model.blocks[0], AccelerateCount())

    model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=2).to(DEVICE)
    inputs = _inputs(model, seed=seed % 1000)
    calls = []
    monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or residual_norm(*a, **k))
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", fuse_prologue=False)
        unfused = model(**inputs)[0]
        sagegen.unpatch(model)
        calls.clear()
        if hook.endswith("first"):
            install()
        sagegen.patch(model, backend="reference")
        if hook.endswith("after"):
            install()
        out = model(**inputs)[0]
        fused_calls = len(calls)
        sagegen.unpatch(model)
        calls.clear()
        after = model(**inputs)[0]
    assert Count.calls == 2
    assert fused_calls == 4 * len(model.blocks)
    assert rel_l1(out, unfused) < 5e-3
    assert not calls and torch.equal(after, stock)  # the hook holds the stock forward again


def test_fused_wan_blocks_with_fp32_kept_norms(seed):
    """from_pretrained(torch_dtype=bf16) keeps Wan's norms and modulation table in fp32
    (`_keep_in_fp32_modules`): the blocks still fuse and stay within bf16 rounding of diffusers' blocks."""
    model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=seed % 100).to(DEVICE)
    assert {"scale_shift_table", "norm2"} <= set(model._keep_in_fp32_modules)
    for block in model.blocks:
        block.scale_shift_table.data = block.scale_shift_table.data.float()
        for norm in (block.norm1, block.norm2, block.norm3):
            for p in norm.parameters():
                p.data = p.data.float()
    inputs = _inputs(model, seed=seed % 1000)
    with torch.no_grad():
        sagegen.patch(model, backend="reference", fuse_prologue=False)
        unfused = model(**inputs)[0]
        sagegen.patch(model, backend="reference")
        assert patch_info(model)["fused_blocks"] == len(model.blocks)
        fused = model(**inputs)[0]
        sagegen.unpatch(model)
    assert rel_l1(fused, unfused) < 5e-3, rel_l1(fused, unfused)
