"""Helpers for the patcher tests: cached tiny pipelines, a pipeline runner, and an attention spy."""

from __future__ import annotations

import collections
import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from sagegen.models.tiny import TINY_CALL_DEFAULTS, build_tiny_pipeline

# SDPA calls inside a transformer that are not attention-processor calls and stay on SDPA by design:
# Mochi's caption attention-pool (one query token, head dim 512: not a kernel head dim).
UNROUTED_BY_DESIGN = {"mochi": {"time_embed.pooler"}}


@functools.lru_cache(maxsize=None)
def tiny_pipeline(family: str):
    pipe = build_tiny_pipeline(family, seed=0)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, family: str, seed: int, prompt="a cat walks on the grass", output_type="latent",
        **overrides) -> torch.Tensor:
    """One generation's latents (or decoded frames/images with ``output_type="pt"``), as fp32."""
    kwargs = {**TINY_CALL_DEFAULTS[family], **overrides}
    out = pipe(prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type=output_type, **kwargs)
    return (out.frames if hasattr(out, "frames") else out.images).float()


def rel_l1(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||_1 / ||b||_1."""
    return float((a.float() - b.float()).abs().sum() / b.float().abs().sum())


def assert_one_layer_as_close_as_routed(fused_out, routed, stock):
    """One layer's outputs (a tensor, or a tuple such as (video, text)): the fused prologue against the stock
    processor routed through sagegen (``routed``) and the unquantized stock processor (``stock``). The fused
    path usually equals the routed one bit for bit, but its fp32 prologue can round a Q/K element to the other
    bf16 neighbour, which flips an INT8 code (Mochi, seed 173235485: rel-L1 2.2e-3 on 256 text values). A real
    fault (rope one token off: ~0.9) is far above a quarter of the quantization error (~0.025) that bounds
    this."""
    if isinstance(fused_out, torch.Tensor):
        fused_out, routed, stock = (fused_out,), (routed,), (stock,)
    assert len(fused_out) == len(routed) == len(stock)
    for out, ref, dense in zip(fused_out, routed, stock):
        quant_err = rel_l1(ref, dense)
        assert 0 < quant_err < 0.05
        assert rel_l1(out, ref) < 0.25 * quant_err, (rel_l1(out, ref), quant_err)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))


def zeros_attention(q, k, v, mask, is_causal, scale):
    return torch.zeros_like(q)


class AttentionSpy(TorchFunctionMode):
    """Records every torch SDPA call and every sagegen kernel call, with the module that made it.

    ``roots`` maps a region name ("transformer", "text_encoder", "vae", ...) to a module; hooks on all their
    submodules keep a stack, so each call is attributed to (region, qualified module name). Calls made outside
    all roots are attributed to (None, None). Each record: kind ("sdpa" | "sage"), region, module, head dim,
    the transformer forward index (0-based, -1 outside), and the call's attn_mask (or None).
    Entered around a pipeline call, it sits *below* the patcher's own per-call mode, so it sees SDPA only when
    the patcher did not take the call, and sees the sagegen op the patcher calls instead.
    """

    def __init__(self, roots: dict[str, torch.nn.Module]):
        super().__init__()
        self.records: list[dict] = []
        self.forward_index = -1
        self._stack: list[tuple[str, str]] = []
        self._handles = []
        for region, root in roots.items():
            for name, module in root.named_modules():
                self._handles.append(module.register_forward_pre_hook(self._push(region, name)))
                self._handles.append(module.register_forward_hook(self._pop))
            if region == "transformer":
                self._handles.append(root.register_forward_pre_hook(self._next_forward))

    def _push(self, region, name):
        def hook(module, args):
            self._stack.append((region, name))
        return hook

    def _pop(self, module, args, output):
        self._stack.pop()

    def _next_forward(self, module, args):
        self.forward_index += 1

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = None
        if func is F.scaled_dot_product_attention:
            kind = "sdpa"
        elif func in (torch.ops.sagegen.sageattn, torch.ops.sagegen.sageattn.default):
            kind = "sage"
        if kind is not None:
            q = args[0] if args else kwargs["query"]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            region, module = self._stack[-1] if self._stack else (None, None)
            self.records.append(dict(kind=kind, region=region, module=module, head_dim=q.shape[-1],
                                     forward=self.forward_index if region == "transformer" else -1,
                                     mask=mask))
        return func(*args, **kwargs)

    def select(self, kind=None, region=..., module=...):
        return [r for r in self.records if (kind is None or r["kind"] == kind)
                and (region is ... or r["region"] == region) and (module is ... or r["module"] == module)]

    def modules(self, kind, region) -> collections.Counter:
        return collections.Counter(r["module"] for r in self.select(kind, region))


def pipeline_roots(pipe) -> dict[str, torch.nn.Module]:
    return {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def half_model_with_distinct_norms(model, inputs, device, seed: int = 0):
    """``model`` and ``inputs`` in bf16 on ``device``, the Q/K norm weights (ones at init) set to distinct random
    values first, so that a norm applied to the wrong tensor or stream changes the output."""
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm_" in name and name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.25)
    model = model.to(device, torch.bfloat16)
    inputs = {k: (v.to(device, torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point()
                  else v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return model, inputs


def cross_q_on_and_off(model, inputs, monkeypatch) -> dict:
    """``model`` run stock, then patched with FP8 linears in every block with `fp8_out.CROSS_Q_FP8` on and off
    (cross-attention Q from the FP8 copy of the pass before it, or quantizing itself), then unpatched: the
    outputs, the fused blocks, the first patched run's stats and each patched run's eager quantizations."""
    import sagegen
    from sagegen.linear import LinearPolicy
    from sagegen.linear import module as linear_module
    from sagegen.patch import patch_info
    from sagegen.patch import fp8_handoff as fp8_out

    real, quantized = linear_module.quantize_eager, []
    monkeypatch.setattr(linear_module, "quantize_eager", lambda *a, **k: quantized.append(1) or real(*a, **k))
    r = {}
    with torch.inference_mode():
        r["stock"] = model(**inputs)[0]
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        r["blocks"] = patch_info(model)["fused_blocks"]
        r["taken"] = model(**inputs)[0]
        r["stats"], r["quantized_taken"], quantized[:] = dict(patch_info(model)["stats"]), len(quantized), []
        saved, fp8_out.CROSS_Q_FP8 = fp8_out.CROSS_Q_FP8, False
        try:
            r["plain"] = model(**inputs)[0]
        finally:
            fp8_out.CROSS_Q_FP8 = saved
        r["quantized_plain"] = len(quantized)
        sagegen.unpatch(model)
        r["again"] = model(**inputs)[0]
    monkeypatch.undo()
    return r
