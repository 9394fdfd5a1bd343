"""SkyReels-V2 on Wan's fused route: diffusers' ``SkyReelsV2AttnProcessor`` and ``SkyReelsV2TransformerBlock``
are Wan 2.1's code (plus a self-attention mask and a [B, 6, S, C] per-token modulation for diffusion forcing),
so the patch runs Wan's fused Q/K RMSNorm + rotary pass and its residual-norm block passes on them. Checked in
the Triton interpreter with the reference attention on both sides (the only difference is the fused
element-wise work), for plain text-to-video calls and for diffusion forcing (per-frame timesteps and a causal
block mask); unpatch is bit-identical."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.helpers import rel_l1
from sagegen.kernels import triton_residual_norm as kernel
from sagegen.patch import attention_modules, patch_info
from sagegen.patch.families import wan
from sagegen.patch.fusion import blocks as fused_blocks

pytest.importorskip("diffusers.models.transformers.transformer_skyreels_v2")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _model(seed: int, frames_per_block: int = 1):
    from diffusers import SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    model = SkyReelsV2Transformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32,
                                         in_channels=4, out_channels=4, text_dim=16, freq_dim=32, ffn_dim=64,
                                         num_layers=2, rope_max_seq_len=32, num_frame_per_block=frames_per_block)
    with torch.no_grad():  # norms and modulation away from their identity initialisation
        for m in model.modules():
            if isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
        for block in model.blocks:
            block.scale_shift_table.normal_(0, 0.3)
    return torch.nn.Module.to(model.eval(), DEVICE, torch.bfloat16)  # (ModelMixin.to warns about fp32 modules)


def _inputs(seed: int, frames: int = 4, forcing: bool = False):
    g = torch.Generator().manual_seed(seed)
    timestep = torch.tensor([[900.0, 700.0, 500.0, 300.0][:frames]]) if forcing else torch.tensor([500.0])
    return dict(hidden_states=torch.randn(1, 4, frames, 8, 8, generator=g).to(DEVICE, torch.bfloat16),
                timestep=timestep.to(DEVICE),
                encoder_hidden_states=torch.randn(1, 6, 16, generator=g).to(DEVICE, torch.bfloat16),
                enable_diffusion_forcing=forcing, return_dict=False)


@pytest.mark.parametrize("forcing,frames_per_block", [(False, 1), (True, 1), (True, 2)],
                         ids=["t2v", "diffusion-forcing", "forcing-causal-blocks"])
def test_skyreels_takes_wans_fused_route(seed, forcing, frames_per_block, monkeypatch):
    model = _model(seed % 100, frames_per_block)
    inputs = _inputs(seed % 1000, forcing=forcing)
    processors = {n: m.processor for n, m in attention_modules(model).items()}
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", fuse_prologue=False)
        unfused = model(**inputs)[0]
        assert patch_info(model)["fused_blocks"] == 0
        sagegen.patch(model, backend="reference")
        info = patch_info(model)
        assert info["family"] == "wan" and info["routes"] == {"fused": 4}
        assert info["fused_blocks"] == len(model.blocks)
        calls, real = [], kernel.residual_norm
        monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
        fused = model(**inputs)[0]
        monkeypatch.undo()
        stats = patch_info(model)["stats"]
        sagegen.unpatch(model)
        again = model(**inputs)[0]
    assert torch.equal(again, stock)
    assert all(m.processor is processors[n] for n, m in attention_modules(model).items())
    assert fused_blocks.fused_count(model) == 0
    assert len(calls) == 4 * len(model.blocks)  # the block passes ran, per-token modulation included
    # the Q/K prologue: every call but a masked self-attention (diffusion forcing's causal blocks: stock code)
    masked = len(model.blocks) if frames_per_block > 1 else 0
    assert stats.get("fused_qk_prologue", 0) == 2 * len(model.blocks) - masked, stats
    # bf16 roundings of the norms and modulation, in another order (measured 4-5.2e-3 with these perturbed
    # weights; dropping the causal-block mask gave 2.4e-2, Wan 2.2's modulation layout an error)
    assert rel_l1(fused, unfused) < 1e-2, rel_l1(fused, unfused)


def test_skyreels_block_modulation_layouts():
    """The [B, 6, S, C] per-token layout of diffusion forcing is read as SkyReels does, not as Wan 2.2 TI2V's
    [B, S, 6, C]."""
    model = _model(3)
    block = model.blocks[0]
    c = block.scale_shift_table.shape[-1]
    x = torch.randn(1, 5, c, device=DEVICE, dtype=torch.bfloat16)
    temb = torch.randn(1, 6, 5, c, device=DEVICE)
    parts = wan._modulation(block, temb, x)
    want = [e.squeeze(1) for e in (block.scale_shift_table.unsqueeze(2) + temb.float()).chunk(6, dim=1)]
    assert all(torch.equal(p, w) for p, w in zip(parts, want))
    flat = wan._modulation(block, torch.randn(1, 6, c, device=DEVICE), x)
    assert all(p.shape == (1, 1, c) for p in flat)
