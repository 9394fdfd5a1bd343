"""Block-level element-wise work fused: modulated LayerNorms and gated residual adds in one pass each (Wan's
and SkyReels-V2's here; SD3's, Flux's, Qwen-Image's, LTX-Video's and CogVideoX's in `fused_blocks_sd3`, `_flux`,
`_qwen`, `_ltx`, `_cogvideox`).

diffusers' ``WanTransformerBlock.forward`` (Wan 2.1, Wan 2.2 T2V/I2V and TI2V; SkyReels-V2's block is the same
code with a self-attention mask and its per-token modulation laid out [B, 6, S, C]) runs its norms, modulation and
residual adds as eager fp32 ops around the three sub-layers; at 720p they cost about 8% of a stock step and
16% of a sagegen one (lab/NOTES.md). With the patch's ``fuse_prologue`` (the default) each such block's class
is swapped for a subclass whose forward computes the same values with four `residual_norm` passes:

    n1 = LN(x)·(1+scale)+shift                          -> attn1
    x = x + attn1·gate;   n2 = norm2(x)                 -> attn2   (one pass; FP8 for an FP8 Q projection)
    x = x + attn2;        n3 = LN(x)·(1+c_scale)+c_shift -> ffn     (one pass)
    x = x + ffn·c_gate

The sub-layers (attention processors, FP8 linears) are called exactly as before. Swapping the class (not the
instance's ``forward``) keeps diffusers' hooks (context parallelism, caching) working whichever was installed
first: one installed after wraps the fused forward; one installed before holds the stock forward it wrapped,
which `fused_common.swap_class` re-points at the fused one (and back on `remove`) (tests/test_residual_norm.py).
The subclass runs the stock forward under torch.compile (inductor fuses these ops itself), on CPU
outside the Triton interpreter, when gradients are recorded, and for anything it does not reproduce: norms of
another kind, fp32 models, modulation of unexpected shapes. `remove` restores the class; the outputs are then
bit-identical to stock.
"""

from __future__ import annotations

import functools
import importlib

import torch

from ..api import triton_interpret
from . import fused_blocks_cogvideox as _cogvideox
from . import fused_blocks_flux as _flux
from . import fused_blocks_ltx as _ltx
from . import fused_blocks_qwen as _qwen
from . import fused_blocks_sd3 as _sd3
from . import fp8_out as _fp8_out
from .fused_common import _HALF, forward_subclass, swap_class
from .fused_wan import cross_attention_fp8 as _cross_attention_fp8

_WAN_BLOCK = ("diffusers.models.transformers.transformer_wan", "WanTransformerBlock")
# SkyReels-V2's block: Wan 2.1's forward plus an attention mask for self-attention (diffusion forcing) and a
# per-token modulation laid out [B, 6, S, C]
_SKYREELS_BLOCK = ("diffusers.models.transformers.transformer_skyreels_v2", "SkyReelsV2TransformerBlock")
_SUBCLASSES: dict[type, type] = {}


@functools.cache
def _block_class(where=_WAN_BLOCK):
    """diffusers' block class at ``where`` (module, name), looked up once; None if this diffusers lacks it."""
    try:
        return getattr(importlib.import_module(where[0]), where[1])
    except (ImportError, AttributeError):
        return None


def _plain_layer_norm(norm, dim: int, affine: bool) -> bool:
    """diffusers' FP32LayerNorm over ``dim`` channels, with (``affine``) or without weight and bias."""
    from diffusers.models.normalization import FP32LayerNorm

    if type(norm) is not FP32LayerNorm or tuple(norm.normalized_shape) != (dim,):
        return False
    has = norm.weight is not None
    return has == affine and (not has or norm.bias is not None)


def fusable(block, where=_WAN_BLOCK) -> bool:
    """Whether ``block`` is exactly diffusers' WanTransformerBlock (or the class ``where`` names: SkyReels-V2's)
    with the norms its forward assumes."""
    cls = _block_class(where)
    if cls is None or type(block) is not cls:
        return False
    table = getattr(block, "scale_shift_table", None)
    if not isinstance(table, torch.Tensor) or table.ndim != 3 or table.shape[:2] != (1, 6):
        return False
    dim = table.shape[2]
    norm2 = block.norm2
    return (_plain_layer_norm(block.norm1, dim, False) and _plain_layer_norm(block.norm3, dim, False)
            and (type(norm2) is torch.nn.Identity or _plain_layer_norm(norm2, dim, True)))


def _modulation(block, temb, x):
    """The six [B, 1 or S, C] fp32 modulation vectors as the stock forward derives them; None if their shape
    is not one the kernel broadcasts over x [B, S, C]."""
    table = block.scale_shift_table
    if temb.ndim == 4 and _is_skyreels(block):  # per token, [B, 6, S, C]
        parts = [p.squeeze(1) for p in (table.unsqueeze(2) + temb.float()).chunk(6, dim=1)]
    elif temb.ndim == 4:  # Wan 2.2 TI2V: per-token [B, S, 6, C]
        parts = [p.squeeze(2) for p in (table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
    else:
        parts = list((table + temb.float()).chunk(6, dim=1))
    B, S, C = x.shape
    for p in parts:
        if p.ndim != 3 or p.shape[0] not in (1, B) or p.shape[1] not in (1, S) or p.shape[2] != C or p.stride(2) != 1:
            return None
    return parts


def _can_run(x) -> bool:
    """Eager inference on a GPU (or the interpreter): the kernels have no backward, so a call that records
    gradients runs the stock forward."""
    return (not torch.compiler.is_compiling() and isinstance(x, torch.Tensor) and x.dtype in _HALF
            and x.ndim == 3 and (x.is_cuda or triton_interpret())
            and not (torch.is_grad_enabled() and x.requires_grad))


def _is_skyreels(block) -> bool:
    cls = _block_class(_SKYREELS_BLOCK)
    return cls is not None and isinstance(block, cls)


def _fused_forward(self, stock, hidden_states, encoder_hidden_states, temb, rotary_emb):
    out = _fused_body(self, hidden_states, encoder_hidden_states, temb, rotary_emb, None)
    return stock(self, hidden_states, encoder_hidden_states, temb, rotary_emb) if out is None else out


def _skyreels_forward(self, stock, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask=None):
    out = _fused_body(self, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask)
    if out is None:
        return stock(self, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask)
    return out


def _fused_body(self, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask):
    """The block's output through `residual_norm` passes, or None where they do not reproduce it."""
    mods = _modulation(self, temb, hidden_states) if _can_run(hidden_states) else None
    if mods is None:
        return None
    shift, scale, gate, c_shift, c_scale, c_gate = mods
    x = hidden_states.contiguous()
    _, n = _residual_norm(x, scale=scale, shift=shift, eps=self.norm1.eps)
    y = self.attn1(n, None, attention_mask, rotary_emb)
    norm2 = self.norm2
    if type(norm2) is torch.nn.Identity:
        x, _ = _residual_norm(x, y, gate, norm=False)
        y = self.attn2(x, encoder_hidden_states, None, None)
    else:
        # cross-attention's Q projection is this norm's only reader: where it runs FP8 on the fused route, the
        # norm writes the per-token FP8 copy instead of the bf16 rows (`fused_wan.cross_attention_fp8`)
        cross = _cross_attention_fp8(self.attn2, encoder_hidden_states, x) if _fp8_out.CROSS_Q_FP8 else None
        x, n = _residual_norm(x, y, gate, weight=norm2.weight, bias=norm2.bias, eps=norm2.eps,
                              fp8_out=cross is not None)
        y = cross(*n) if isinstance(n, tuple) else self.attn2(n, encoder_hidden_states, None, None)
    x, n = _residual_norm(x, y, scale=c_scale, shift=c_shift, eps=self.norm3.eps)
    x, _ = _residual_norm(x, self.ffn(n), c_gate, norm=False)
    return x


def _residual_norm(x, y=None, gate=None, fp8_out=False, **kwargs):
    """The kernel where it reproduces the stock ops (a sub-layer output of x's dtype and shape), else the
    eager ops themselves. ``fp8_out``: the normalised rows as (e4m3 copy, per-token scales) from the kernel,
    or with ``norm=False`` that copy of the residual sum; the eager ops give the rows in x's dtype and no copy
    (the caller takes either)."""
    from ..kernels.triton_residual_norm import residual_norm, residual_norm_reference

    if y is not None and (y.dtype != x.dtype or y.shape != x.shape):
        return residual_norm_reference(x, y, gate, **kwargs)
    if y is not None and y.stride(2) != 1:
        y = y.contiguous()
    return residual_norm(x, y, gate, fp8_out=fp8_out, **kwargs)


def _with_kernel(family_forward):
    """A family module's fused forward with this module's run check and `_residual_norm` bound in."""
    def forward(self, stock, *args, **kwargs):
        return family_forward(self, stock, _can_run, _residual_norm, *args, **kwargs)
    return forward


# (is this block the family's, its fused forward), tried in order after Wan's and SkyReels-V2's
_FAMILIES = [(_sd3.fusable, _with_kernel(_sd3.fused_forward)),
             (_flux.double_fusable, _with_kernel(_flux.double_forward)),
             (_flux.single_fusable, _with_kernel(_flux.single_forward)),
             (_qwen.fusable, _with_kernel(_qwen.fused_forward)),
             (_ltx.fusable, _with_kernel(_ltx.fused_forward)),
             (_cogvideox.fusable, _with_kernel(_cogvideox.fused_forward))]


def _fused_kind(block):
    """The fused forward that reproduces ``block``'s (Wan, SkyReels-V2, SD3, Flux, Qwen-Image, LTX-Video,
    CogVideoX), or None."""
    if fusable(block):
        return _fused_forward
    if fusable(block, _SKYREELS_BLOCK):
        return _skyreels_forward
    return next((forward for check, forward in _FAMILIES if check(block)), None)


def _subclass(cls: type, fused) -> type:
    return forward_subclass(cls, fused, "_sage_fused_block", _SUBCLASSES, __name__)


def install(transformer) -> int:
    """Swap every fusable block of ``transformer`` (Wan, SD3, Flux, Qwen-Image, LTX, CogVideoX) to its fused
    subclass; returns how many."""
    count = 0
    for module in transformer.modules():
        if getattr(type(module), "_sage_fused_block", False):
            count += 1
        elif (fused := _fused_kind(module)) is not None:
            swap_class(module, _subclass(type(module), fused))
            count += 1
    return count


def remove(transformer) -> None:
    """Put the original class back on every fused block."""
    for module in transformer.modules():
        if getattr(type(module), "_sage_fused_block", False):
            swap_class(module, type(module).__mro__[1])


def fused_count(transformer) -> int:
    return sum(1 for m in transformer.modules() if getattr(type(m), "_sage_fused_block", False))
