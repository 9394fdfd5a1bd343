"""Shared by the fused-block tests: tiny models on the test device, exact attention, and one run of a model
stock, patched without and with the fused blocks, and unpatched again."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import sagegen
from tests.support.patching import rel_l1
from sagegen.kernels import triton_residual_norm as kernel
from sagegen.patch import patch_info, set_attention_override

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernels run in the interpreter


def on_device(model, inputs):
    return model.to(DEVICE), {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def half(model, inputs):
    return model.to(torch.bfloat16), {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v
                                      for k, v in inputs.items()}


def fp32_reference_and_half(model32, inputs32):
    """(the fp32 model's output as fp64, a bf16 copy of the model, its bf16 inputs): the oracle and the subject."""
    import copy

    with torch.no_grad():
        want = model32(**inputs32)[0].double()
    return (want, *half(copy.deepcopy(model32), inputs32))


def exact_attention(q, k, v, mask, is_causal, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def stock_unfused_fused(model, inputs, monkeypatch) -> dict:
    """Outputs of ``model`` stock, patched with ``fuse_prologue=False``, patched (blocks fused), and unpatched,
    with exact attention in both patched runs (so only the element-wise work differs); plus the fused run's
    `residual_norm` calls (each call's ``rms`` keyword) and the count of fused blocks. Checks on the way that
    the swapped classes keep diffusers' class names and are all gone after unpatching."""
    real = kernel.residual_norm
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model, backend="reference", fuse_prologue=False)
        set_attention_override(model, exact_attention)
        unfused = model(**inputs)[0]
        assert patch_info(model)["fused_blocks"] == 0
        sagegen.patch(model, backend="reference")
        set_attention_override(model, exact_attention)
        count = patch_info(model)["fused_blocks"]
        swapped = sorted({type(m) for m in model.modules() if getattr(type(m), "_sage_fused_block", False)},
                         key=lambda t: t.__name__)
        calls = []
        monkeypatch.setattr(kernel, "residual_norm", lambda *a, **k: calls.append(k.get("rms")) or real(*a, **k))
        fused = model(**inputs)[0]
        monkeypatch.undo()
        sagegen.unpatch(model)
        again = model(**inputs)[0]
    for sub in swapped:  # subclasses of diffusers' classes under the same name (class-name lookups still match)
        assert sub.__name__ == sub.__mro__[1].__name__ and not any(isinstance(m, sub) for m in model.modules())
    return dict(stock=stock, unfused=unfused, fused=fused, again=again, calls=calls, fused_blocks=count)


def assert_fused_like_stock(r: dict, want: torch.Tensor, *, blocks: int, passes: int, apart: float = 2e-2):
    """What every fused-block test asserts of a `stock_unfused_fused` run: ``blocks`` blocks fused, ``passes``
    kernel calls, unpatch and the unfused patch bit-identical to stock, and the fused output no further from the
    higher-precision run ``want`` than stock is, while differing from the unfused one by under ``apart``."""
    assert r["fused_blocks"] == blocks and len(r["calls"]) == passes, (r["fused_blocks"], len(r["calls"]))
    assert torch.equal(r["again"], r["stock"]) and torch.equal(r["unfused"], r["stock"])
    err_fused, err_stock = rel_l1(r["fused"].double(), want), rel_l1(r["stock"].double(), want)
    assert err_fused <= 1.1 * err_stock, (err_fused, err_stock)
    assert 0 < rel_l1(r["fused"], r["unfused"]) < apart, rel_l1(r["fused"], r["unfused"])
