"""Fusing an MLP's GELU into its second layer's FP8 activation quantization (``LinearPolicy.fuse_gelu``).

diffusers' ``FeedForward(activation_fn="gelu-approximate")`` runs ``net = [GELU(proj, approximate="tanh"),
Dropout, Linear]``: the GELU reads the first layer's output and writes it again, then the FP8 second layer
reads it once more to quantize it. Where the second layer is an `FP8Linear`, the dropout is inert (p = 0) and
the GELU is diffusers' tanh-approximate one, the GELU module is swapped for `GeluInputOnly` (which runs only
its ``proj``) and the FP8 layer gets ``prologue="gelu_tanh"``: its quantization kernel computes the GELU on the
fly (`sagegen.kernels.fp8_quant`). Anything else (exact-erf GELU, GEGLU, a dropout with p > 0, a bf16 second
layer) is left alone.

`unfuse` puts the same GELU modules back. The wrapper registers the GELU's own ``proj`` under the same name, so
state-dict keys do not change.

Flux's single blocks project ``cat(attention, GELU(mlp))``: where ``proj_out`` is an `FP8Linear` and ``act_mlp``
the tanh GELU, the layer is marked (``fuse_cat_gelu``) and the block's fused forward
(`families.flux.single_forward`) calls ``proj_out.cat_gelu(attention, mlp)``: the quantization kernel reads
both tensors and computes the GELU, so neither the GELU output nor the concatenation is written. Nothing changes
in the module tree; the stock forward (compile, CPU) ignores the mark. HunyuanVideo's single blocks compute the
same product in diffusers' own forward: they get a subclass that calls ``cat_gelu`` (`families.hunyuanvideo`),
put back by `unfuse`.
"""

from __future__ import annotations

import torch

from sagegen.linear import FP8Linear
from sagegen.patch.family_table import families, family


class GeluInputOnly(torch.nn.Module):
    """Stands in for a diffusers ``GELU`` whose activation the next FP8 layer computes: runs ``proj`` only."""

    def __init__(self, gelu: torch.nn.Module):
        super().__init__()
        self.__dict__["original"] = gelu  # outside the module tree: not moved twice, not in the state dict
        self.proj = gelu.proj            # the same module (an FP8Linear or the nn.Linear)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.proj(hidden_states)


def _is_tanh_gelu(module: torch.nn.Module) -> bool:
    try:
        from diffusers.models.activations import GELU
    except ImportError:  # pragma: no cover - diffusers is a dependency
        return False
    return type(module) is GELU and getattr(module, "approximate", None) == "tanh"


def _inert(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Identity) or (isinstance(module, torch.nn.Dropout) and module.p == 0)


def _cat_gelu_block(module: torch.nn.Module) -> str | None:
    """"flux", or the family ("hunyuanvideo", from the family table), of a single block whose forward sagegen
    runs with ``proj_out.cat_gelu`` (an FP8 proj_out after the tanh GELU), else None."""
    act = getattr(module, "act_mlp", None)
    if not (isinstance(getattr(module, "proj_out", None), FP8Linear) and type(act) is torch.nn.GELU
            and act.approximate == "tanh"):
        return None
    from sagegen.patch.fusion.prologue import diffusers_class

    flux = diffusers_class("diffusers.models.transformers.transformer_flux", "FluxSingleTransformerBlock")
    if flux is not None and isinstance(module, flux):  # the fused Flux block calls cat_gelu itself
        return "flux"
    code = next((c for c in families() if c.gelu_blocks is not None and c.gelu_blocks[0](module)), None)
    return code.name if code is not None else None


def fuse(transformer: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Fuse every eligible GELU; returns {name of the FP8 layer: the FeedForward's ``net`` (or, for a Flux or
    HunyuanVideo single block's ``proj_out``, the block)}."""
    fused = {}
    for name, module in transformer.named_modules():
        kind = _cat_gelu_block(module)
        if kind is not None:
            if kind != "flux":
                family(kind).gelu_blocks[1](module)
            module.proj_out.fuse_cat_gelu = True
            fused[f"{name}.proj_out" if name else "proj_out"] = module
            continue
        net = getattr(module, "net", None)
        if not isinstance(net, torch.nn.ModuleList) or len(net) < 3:
            continue
        act, drop, second = net[0], net[1], net[2]
        if not (_is_tanh_gelu(act) and _inert(drop) and isinstance(second, FP8Linear)):
            continue
        net[0] = GeluInputOnly(act)
        second.prologue = "gelu_tanh"
        fused[f"{name}.net.2" if name else "net.2"] = net
    return fused


def unfuse(fused: dict[str, torch.nn.Module]) -> None:
    """Undo `fuse` (a GELU wrapper replaced by someone else since is left alone)."""
    for net in fused.values():
        if not isinstance(net, torch.nn.ModuleList):  # a Flux or HunyuanVideo single block
            if isinstance(getattr(net, "proj_out", None), FP8Linear):
                net.proj_out.fuse_cat_gelu = False
            for code in families():
                if code.gelu_blocks is not None:
                    code.gelu_blocks[2](net)
            continue
        if isinstance(net[0], GeluInputOnly):
            net[0] = net[0].original
        if isinstance(net[2], FP8Linear):
            net[2].prologue = None
