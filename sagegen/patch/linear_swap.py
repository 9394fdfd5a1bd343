"""``sagegen.patch(..., linear="fp8")``: swap the denoiser's ``nn.Linear`` layers for `sagegen.linear.FP8Linear`.

Which layers: `sagegen.linear.LinearPolicy` (default: every linear inside the main blocks but the first and
the last block; embedders and the final projection stay bf16). The swap replaces the entry in the parent's
``_modules``; `remove` puts the very same ``nn.Linear`` objects back (their parameters were never touched).

Hardware: FP8 GEMMs need sm89+. A model on the CPU (or ``backend="reference"``) runs the emulation. On an
older GPU the attention config's ``fallback`` decides: ``"error"`` raises, ``"reference"`` runs the emulation
(slow), ``"sdpa"`` (the default) keeps every linear in bf16 with a warning, and `info` says so.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from sagegen.linear import FP8Linear, LinearPolicy, fp8_capable, select_linears
from sagegen.linear.ops import blockwise_supported
from sagegen.linear.stacked import stack
from sagegen.patch import gelu_fp8
from sagegen.patch.precision_policy import main_blocks

_STATE_ATTR = "_sagegen_linear"
MODES = (None, "fp8")


@dataclasses.dataclass
class _LinearState:
    policy: LinearPolicy
    originals: dict[str, tuple[torch.nn.Module, str, torch.nn.Linear]]  # name -> (parent, key, original)
    bf16: dict[str, str]
    emulate: bool
    note: str = ""
    parked: dict[str, torch.device] = dataclasses.field(default_factory=dict)  # name -> where the bf16 copy was
    gelu_fused: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)  # FP8 layer -> its ff net
    stacked: list[str] = dataclasses.field(default_factory=list)  # attention modules whose Q/K/V share buffers


def check_mode(linear, linear_policy) -> None:
    if linear not in MODES:
        raise ValueError(f"linear={linear!r} is not supported; use None (bf16 linears, the default) or 'fp8'")
    if linear_policy is not None and not isinstance(linear_policy, LinearPolicy):
        raise TypeError(f"linear_policy must be a sagegen.linear.LinearPolicy or None, got "
                        f"{type(linear_policy).__name__}")


def _device(transformer: torch.nn.Module) -> torch.device:
    for p in transformer.parameters():
        return p.device
    return torch.device("cpu")


def apply(transformer: torch.nn.Module, linear: str | None, policy: LinearPolicy | None, *, fallback: str,
          backend: str, attention_names: list[str]) -> None:
    """Bring the transformer's linears to the state asked for (``linear=None`` removes a previous FP8 patch)."""
    check_mode(linear, policy)
    policy = policy or LinearPolicy()
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if (linear is not None and state is not None and state.policy == policy and state.originals
            and state.emulate == (backend == "reference")
            and all(isinstance(p._modules.get(k), FP8Linear) for p, k, _ in state.originals.values())):
        return  # already patched this way: keep the quantized weights (and any outlier calibration)
    remove(transformer)
    if linear is None:
        return
    device = _device(transformer)
    if device.type != "cuda" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())  # CPU offload: it will run on the GPU
    # The op itself emulates on CPU tensors; `emulate` forces the emulation on the GPU too.
    emulate, note = backend == "reference", ""
    if device.type == "cuda" and not emulate:
        ok, why = fp8_capable(device)
        if ok and policy.act_granularity == "per_block":
            ok, why = blockwise_supported(device.index or 0)
        if not ok:
            if fallback == "error":
                raise RuntimeError(f"linear='fp8' cannot run here: {why}")
            if fallback == "reference":
                emulate, note = True, f"emulated (slow): {why}"
            else:
                warnings.warn(f"sagegen: linear='fp8' falls back to bf16 linears: {why}", stacklevel=3)
                state = _LinearState(policy, {}, {}, False, f"bf16 fallback: {why}")
                object.__setattr__(transformer, _STATE_ATTR, state)
                return
    blocks = main_blocks(transformer, attention_names)
    chosen, bf16 = select_linears(transformer, policy, blocks)
    modules = dict(transformer.named_modules())
    originals = {}
    for name, lin in chosen.items():
        parent_name, _, key = name.rpartition(".")
        parent = modules[parent_name] if parent_name else transformer
        parent._modules[key] = FP8Linear(lin, emulate=emulate, **policy.module_kwargs())
        originals[name] = (parent, key, lin)
    # Q/K/V weights in one buffer each (views, no memory added): processors that project one input to all three
    # can run one GEMM (`sagegen.linear.stacked`; Wan's fused processor does)
    stacked = [name for name, m in transformer.named_modules()
               if stack([getattr(m, p, None) for p in ("to_q", "to_k", "to_v")])]
    parked = {}
    if policy.bf16_copies != "keep":
        where = "cpu" if policy.bf16_copies == "cpu" else "meta"
        for name, (_, _, lin) in originals.items():
            parked[name] = lin.weight.device
            lin.to(where)  # "cpu": in place, the same Parameter objects with their data moved; "meta": freed
    fused = gelu_fp8.fuse(transformer) if policy.fuse_gelu else {}
    object.__setattr__(transformer, _STATE_ATTR, _LinearState(policy, originals, bf16, emulate, note, parked,
                                                              fused, stacked))


def remove(transformer: torch.nn.Module) -> None:
    """Put the original ``nn.Linear`` objects back (a layer replaced by someone else since is left alone)."""
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return
    gelu_fp8.unfuse(state.gelu_fused)  # the GELU modules first: they hold the first layers
    dropped = []
    for name, (parent, key, original) in state.originals.items():
        current = parent._modules.get(key)
        if name in state.parked:
            # back to where the FP8 layer is now (the model may have moved since), else where it was
            ours = isinstance(current, FP8Linear) and current.linear is original
            device = current.w_q.device if ours else state.parked[name]
            if not original.weight.is_meta:
                original.to(device)
            elif ours:
                _restore_dropped(original, current, device)
                dropped.append(name)
            else:
                warnings.warn(f"sagegen.unpatch: {name} was patched with bf16_copies='drop' and replaced since; "
                              "its original linear keeps no weights (meta)", stacklevel=3)
        if isinstance(current, FP8Linear) and current.linear is original:
            parent._modules[key] = original
    object.__delattr__(transformer, _STATE_ATTR)
    if dropped:
        warnings.warn(f"sagegen.unpatch: {len(dropped)} linears were patched with LinearPolicy(bf16_copies='drop') "
                      "and get their dequantized FP8 weights back, not the original bits; reload the model for "
                      "those", stacklevel=3)


@torch.no_grad()
def _restore_dropped(original: torch.nn.Linear, fp8: torch.nn.Module, device: torch.device) -> None:
    """Give a linear whose bf16 weight was dropped (meta) real storage on ``device``: the FP8 layer's
    dequantized weight and its bias copy, in the original dtype."""
    dtype = original.weight.dtype
    original.to_empty(device=device)
    original.weight.copy_(fp8.dequantized_weight().to(device=device, dtype=dtype))
    if original.bias is not None:
        original.bias.copy_(fp8.gemm_bias().to(device=device, dtype=dtype))


def current(transformer: torch.nn.Module) -> tuple[str | None, LinearPolicy | None]:
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    return ("fp8", state.policy) if state is not None else (None, None)


def reset_counts(transformer: torch.nn.Module) -> None:
    """Zero the FP8 layers' call counts (`sagegen.patch.reset_stats`)."""
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return
    for parent, key, _ in state.originals.values():
        module = parent._modules.get(key)
        if isinstance(module, FP8Linear):
            module._fp8_calls[0] = 0


def info(transformer: torch.nn.Module) -> dict | None:
    """What ran FP8: the policy, the FP8 layers (with their FP8 call counts), the bf16 ones and why."""
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return None
    fp8 = {}
    for name, (parent, key, _) in state.originals.items():
        module = parent._modules.get(key)
        if isinstance(module, FP8Linear):
            fp8[name] = {"calls": module.fp8_calls,
                         "outlier_channels": 0 if module.outlier_idx is None else int(module.outlier_idx.numel()),
                         "smoothed": module.col_scale is not None and module.outlier_idx is None}
    weight_bytes = sum(m.w_q.numel() for m in (p._modules.get(k) for p, k, _ in state.originals.values())
                       if isinstance(m, FP8Linear))
    return {"mode": "fp8", "policy": dataclasses.asdict(state.policy),
            "emulated": state.emulate or _device(transformer).type != "cuda",
            "note": state.note, "fp8_layers": sorted(fp8), "fp8_layer_count": len(fp8),
            "fp8_calls": sum(v["calls"] for v in fp8.values()), "layers": fp8,
            "bf16_layers": dict(sorted(state.bf16.items())), "fp8_weight_bytes_added": weight_bytes,
            "bf16_copies": state.policy.bf16_copies,
            "gelu_fused_layers": sorted(state.gelu_fused),
            "qkv_stacked_modules": len(state.stacked),
            "bf16_bytes_moved_to_cpu": sum(o.weight.numel() * o.weight.element_size()
                                           + (o.bias.numel() * o.bias.element_size() if o.bias is not None else 0)
                                           for n, (_, _, o) in state.originals.items()
                                           if n in state.parked and not o.weight.is_meta),
            "bf16_bytes_dropped": sum(o.weight.numel() * o.weight.element_size()
                                      for n, (_, _, o) in state.originals.items()
                                      if n in state.parked and o.weight.is_meta)}
