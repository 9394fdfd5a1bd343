"""The fused prologue of Wan's attention (Wan 2.1 / 2.2 T2V and TI2V: diffusers ``WanAttnProcessor``; SkyReels-V2,
whose ``SkyReelsV2AttnProcessor`` is the same code).

Per layer the stock processor RMS-normalises Q and K across all heads (``torch.nn.RMSNorm(heads·head_dim)``),
splits the heads, and in self-attention rotates the video tokens' Q and K with Wan's pairwise rotary tables
(``out[..., 0::2] = x1·cos - x2·sin`` ... over an fp32/fp64 copy, about ten eager kernels per tensor).
`wan_call` writes the normalised (and rotated) Q and K straight into [B, N, H, D] attention buffers in one
Triton pass each (`kernels.triton_heads_rms_rope`), V is the projection's view, and one attention call is
routed as usual (under diffusers' context parallelism: handed to diffusers' dispatcher with sagegen's backend and
this patch's settings, which splits it over the ranks). Cross-attention to the text (no rotary) gets the fused
norms the same way. With ``linear="fp8"`` self-attention's Q, K and V run as one GEMM (`sagegen.linear.stacked`).

It answers None (the caller runs the wrapped original) for anything it does not reproduce exactly: another
processor class, an attention mask, I2V's added image K/V (``add_k_proj``), norms other than a
torch.nn.RMSNorm across the heads, rotary tables of another form, another diffusers attention backend chosen for
the module, fp32 models, or tensors the kernel cannot run on. Under torch.compile the original runs.

Blocks: diffusers' ``WanTransformerBlock.forward`` (Wan 2.1, Wan 2.2 T2V/I2V and TI2V; SkyReels-V2's block is the
same code with a self-attention mask and its per-token modulation laid out [B, 6, S, C]) runs its norms,
modulation and residual adds as eager fp32 ops around the three sub-layers; at 720p they cost about 8% of a stock
step and 16% of a sagegen one. `block_forward` computes the same values with four `residual_norm` passes
(`sagegen.patch.fusion.blocks` swaps the class):

    n1 = LN(x)·(1+scale)+shift                          -> attn1
    x = x + attn1·gate;   n2 = norm2(x)                 -> attn2   (one pass; FP8 for an FP8 Q projection)
    x = x + attn2;        n3 = LN(x)·(1+c_scale)+c_shift -> ffn     (one pass)
    x = x + ffn·c_gate

Norms of another kind, fp32 models and modulation of unexpected shapes take the stock forward.
"""

from __future__ import annotations

import functools
import importlib

import torch

from sagegen.linear.shared import sharing
from sagegen.patch import fp8_handoff as fp8_out
from sagegen.patch.family_table import FamilyCode, register
from sagegen.patch.fusion.prologue import (_HALF, _arguments, _cp_dispatch, _diffusers_class, _kernel_can_run,
                                           _native_dispatch, qkv_projections)

# processor class -> the module whose `_get_qkv_projections` it calls (both run the code `wan_call` mirrors)
_PROCESSORS = {
    "diffusers.models.transformers.transformer_wan.WanAttnProcessor": "transformer_wan",
    "diffusers.models.transformers.transformer_skyreels_v2.SkyReelsV2AttnProcessor": "transformer_skyreels_v2",
}


def _heads_rms_params(norm, inner_dim: int, dtype: torch.dtype):
    """(weight or None, eps) of a torch.nn.RMSNorm over all heads (``inner_dim``) whose weight, if any, has the
    activations' dtype (another dtype changes the output's dtype in torch); False otherwise."""
    if type(norm) is torch.nn.RMSNorm and tuple(norm.normalized_shape) == (inner_dim,):
        weight = norm.weight
        if weight is None or (tuple(weight.shape) == (inner_dim,) and weight.dtype == dtype):
            return weight, (norm.eps if norm.eps is not None else torch.finfo(dtype).eps)
    return False


def _wan_tables(rotary, n: int, head_dim: int):
    """(cos, sin) [N, D/2] as Wan's rotation reads them (``freqs_cos[..., 0::2]``, ``freqs_sin[..., 1::2]``
    of [1, N, 1, D] tables); None for no tables; False for another form."""
    if rotary is None:
        return None
    if not (isinstance(rotary, (tuple, list)) and len(rotary) == 2
            and all(isinstance(t, torch.Tensor) and tuple(t.shape) == (1, n, 1, head_dim) for t in rotary)):
        return False
    cos, sin = rotary[0][0, :, 0, 0::2], rotary[1][0, :, 0, 1::2]
    if cos.dtype != sin.dtype or cos.dtype not in (torch.float32, torch.float64, *_HALF):
        return False
    return cos, sin


def wan_call(original, session, attn, args, kwargs):
    """WanAttnProcessor.__call__ (or SkyReels-V2's copy of it) with the Q/K RMSNorms (and the rotary embeddings)
    fused; None where not applicable."""
    for path, module in _PROCESSORS.items():
        a = _arguments(original, path, attn, args, kwargs)
        if a is not None:
            break
    if a is None:
        return None
    # under context parallelism diffusers' dispatcher splits the attention over the ranks; else it is routed here
    native = _native_dispatch(original)
    parallel = None if native else _cp_dispatch(original, session, sparse=a.get("encoder_hidden_states") is None)
    if parallel is None and not native:
        return None
    _get_qkv_projections = importlib.import_module(f"diffusers.models.transformers.{module}")._get_qkv_projections

    hidden_states, encoder_hidden_states = a.get("hidden_states"), a.get("encoder_hidden_states")
    rotary = a.get("rotary_emb")
    if a.get("attention_mask") is not None or getattr(attn, "add_k_proj", None) is not None:
        return None  # a mask, or I2V's image K/V: the stock path
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        return None
    if encoder_hidden_states is not None and (not isinstance(encoder_hidden_states, torch.Tensor)
                                              or encoder_hidden_states.dim() != 3 or rotary is not None):
        return None  # (the model rotates only in self-attention)
    weight, dtype = getattr(attn.to_q, "weight", None), hidden_states.dtype
    if not _kernel_can_run(weight, hidden_states) or dtype != weight.dtype:
        return None
    layer = _layer(attn, dtype, hidden_states.shape[1], rotary)
    if layer is None:
        return None

    if encoder_hidden_states is None and not getattr(attn, "fused_projections", False):
        query, key, value = qkv_projections(attn, hidden_states)  # (with FP8 linears: one GEMM)
    else:
        query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
    if any(t.dtype != dtype for t in (query, key, value)):
        return None
    return _attend(session, attn, layer, query, key, value, parallel if encoder_hidden_states is None else None)


def _layer(attn, dtype: torch.dtype, n_tokens: int, rotary):
    """(heads, head_dim, (Q norm, K norm), rotary tables) of a Wan attention module the fused call reproduces;
    None otherwise."""
    heads, inner_dim = attn.heads, getattr(attn, "inner_dim", None)
    if not isinstance(inner_dim, int) or inner_dim % heads or getattr(attn, "kv_inner_dim", None) != inner_dim:
        return None
    head_dim = inner_dim // heads
    norms = [_heads_rms_params(getattr(attn, n, None), inner_dim, dtype) for n in ("norm_q", "norm_k")]
    tables = _wan_tables(rotary, n_tokens, head_dim)
    if any(n is False for n in norms) or tables is False or head_dim % 2:
        return None
    return heads, head_dim, norms, tables


def _attend(session, attn, layer, query, key, value, parallel):
    """The fused Q/K norms (and rotation), the attention and the output projection, from the projections
    [B, N, H·D]; ``parallel``: diffusers' context-parallel dispatch (self-attention only) or None."""
    from sagegen.kernels.triton_heads_rms_rope import heads_rms_norm_rope

    heads, head_dim, norms, tables = layer
    dtype = query.dtype
    query, key, value = (t.unflatten(2, (heads, head_dim)) for t in (query, key, value))
    query = heads_rms_norm_rope(query, norms[0], tables)
    key = heads_rms_norm_rope(key, norms[1], tables)
    if parallel is not None:
        out = parallel(query, key, value).flatten(2, 3).to(dtype)
    else:
        hnd = lambda t: t.transpose(1, 2)  # [B, N, H, D] -> the [B, H, N, D] view the kernels and SDPA take
        rows = None
        if fp8_out.wanted(attn.to_out[0], query.shape[0] * query.shape[1]):
            rows = fp8_out.attention(session, hnd(query), hnd(key), hnd(value))
        if rows is not None:  # an e4m3 output for the FP8 projection (patch/fp8_out.py)
            return attn.to_out[1](fp8_out.project(attn.to_out[0], rows))
        out = session.route((hnd(query), hnd(key), hnd(value)),
                            {"attn_mask": None, "dropout_p": 0.0, "is_causal": False})
        out = out.transpose(1, 2).flatten(2, 3).to(dtype)
    return attn.to_out[1](attn.to_out[0](out))


def _hooked(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs more than its class's forward: torch hooks (its own or global),
    diffusers' hook registry, or a forward set on the instance (accelerate)."""
    from torch.nn.modules import module as _torch_module

    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or getattr(module, "_diffusers_hook", None) is not None
                or _torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)


def cross_attention_fp8(attn, encoder_hidden_states, x: torch.Tensor):
    """For a fused Wan block (`fused_blocks`) about to call ``attn``, its cross-attention, on the normalised
    hidden state of x's shape [B, S, C]: a function ``run(n_fp8, scales)`` that returns the module's output from
    that state's per-token FP8 copy (the norm's `residual_norm(fp8_out=True)`), where the patched processor would
    run this fused call with an FP8 Q projection anyway (Q is the norm's only reader: the quantization pass is
    gone, lab/NOTES.md v8.1). None wherever anything could differ: another processor or settings for the
    layer (full precision, another backend, context parallelism, an analysis override), hooks on the module or
    its Q projection, a Q projection that quantizes its input otherwise, I2V's image K/V, other norms."""
    processor = getattr(attn, "processor", None)
    session = getattr(processor, "_sage_session", None)
    if (session is None or session.family != "wan" or not session.fuse_qk_prologue
            or session.attention_override is not None or session.step_full_precision
            or processor._sage_full_precision or processor._sage_backend_fns is not None):
        return None
    original = processor._sage_original
    if not any(_diffusers_class(path) is type(original) for path in _PROCESSORS) or not _native_dispatch(original):
        return None
    to_q, dtype, rows = attn.to_q, x.dtype, x.shape[0] * x.shape[1]
    if (_hooked(attn) or _hooked(to_q) or getattr(attn, "add_k_proj", None) is not None
            or getattr(attn, "fused_projections", False) or not fp8_out.takes_fp8_rows(to_q, rows)):
        return None
    if not (isinstance(encoder_hidden_states, torch.Tensor) and encoder_hidden_states.dim() == 3
            and encoder_hidden_states.dtype == dtype and _kernel_can_run(to_q.weight, x)
            and all(getattr(getattr(attn, n, None), "weight", None) is not None
                    and getattr(attn, n).weight.dtype == dtype for n in ("to_q", "to_k", "to_v"))):
        return None
    layer = _layer(attn, dtype, x.shape[1], None)
    if layer is None:
        return None

    def run(n_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        with sharing():  # (as the processor wrapper: K and V of one text state share one quantization)
            session.current_name = processor._sage_name
            query = to_q.forward_fp8(n_fp8, scales, dtype)
            key, value = attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states)
            out = _attend(session, attn, layer, query, key, value, None)
        session.count("processor_calls")
        session.count("fused_qk_prologue")
        session.count("cross_q_from_norm")
        return out

    return run


_WAN_BLOCK = ("diffusers.models.transformers.transformer_wan", "WanTransformerBlock")


# SkyReels-V2's block: Wan 2.1's forward plus an attention mask for self-attention (diffusion forcing) and a
# per-token modulation laid out [B, 6, S, C]
_SKYREELS_BLOCK = ("diffusers.models.transformers.transformer_skyreels_v2", "SkyReelsV2TransformerBlock")


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


def _is_skyreels(block) -> bool:
    cls = _block_class(_SKYREELS_BLOCK)
    return cls is not None and isinstance(block, cls)


def skyreels_fusable(block) -> bool:
    return fusable(block, _SKYREELS_BLOCK)


def block_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb, rotary_emb):
    out = _fused_body(self, can_run, residual_norm, hidden_states, encoder_hidden_states, temb, rotary_emb, None)
    return stock(self, hidden_states, encoder_hidden_states, temb, rotary_emb) if out is None else out


def skyreels_block_forward(self, stock, can_run, residual_norm, hidden_states, encoder_hidden_states, temb,
                           rotary_emb, attention_mask=None):
    out = _fused_body(self, can_run, residual_norm, hidden_states, encoder_hidden_states, temb, rotary_emb,
                      attention_mask)
    if out is None:
        return stock(self, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask)
    return out


def _fused_body(self, can_run, residual_norm, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask):
    """The block's output through `residual_norm` passes, or None where they do not reproduce it."""
    mods = _modulation(self, temb, hidden_states) if can_run(hidden_states) else None
    if mods is None:
        return None
    shift, scale, gate, c_shift, c_scale, c_gate = mods
    x = hidden_states.contiguous()
    _, n = residual_norm(x, scale=scale, shift=shift, eps=self.norm1.eps)
    y = self.attn1(n, None, attention_mask, rotary_emb)
    norm2 = self.norm2
    if type(norm2) is torch.nn.Identity:
        x, _ = residual_norm(x, y, gate, norm=False)
        y = self.attn2(x, encoder_hidden_states, None, None)
    else:
        # cross-attention's Q projection is this norm's only reader: where it runs FP8 on the fused route, the
        # norm writes the per-token FP8 copy instead of the bf16 rows (`cross_attention_fp8`)
        cross = cross_attention_fp8(self.attn2, encoder_hidden_states, x) if fp8_out.CROSS_Q_FP8 else None
        x, n = residual_norm(x, y, gate, weight=norm2.weight, bias=norm2.bias, eps=norm2.eps,
                              fp8_out=cross is not None)
        y = cross(*n) if isinstance(n, tuple) else self.attn2(n, encoder_hidden_states, None, None)
    x, n = residual_norm(x, y, scale=c_scale, shift=c_shift, eps=self.norm3.eps)
    x, _ = residual_norm(x, self.ffn(n), c_gate, norm=False)
    return x


register(FamilyCode("wan", prologue=wan_call,
                    blocks=((fusable, block_forward), (skyreels_fusable, skyreels_block_forward))))
