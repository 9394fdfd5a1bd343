"""``sagegen.patch(..., linear="fp8")``: swap the denoiser's ``nn.Linear`` layers for `sagegen.linear.FP8Linear`.

Which layers: `sagegen.linear.LinearPolicy` (default: every linear inside the main blocks but the first and
the last block; embedders and the final projection stay bf16). The swap replaces the entry in the parent's
``_modules``; `remove` puts the very same ``nn.Linear`` objects back (their parameters were never touched), found
where they are now (unloading a LoRA moves its FP8 base up to the wrapper's place).

peft LoRA layers: the base runs FP8 beside the bf16 LoRA branch, and merges re-quantize it (`lora_fp8`). A LoRA
loaded after patching is loaded with the bf16 linears back in place (`lora_load`, through `settings`).

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
from sagegen.patch import gelu_fp8, lora_fp8
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
    settings: dict = dataclasses.field(default_factory=dict)  # apply's keyword arguments, to swap again after a load
    lora_loads: int = 0  # LoRA loads since patching that swapped the linears out and in again
    requantized_before: int = 0  # re-quantizations after merges by the FP8 layers of before those loads


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
            and len(_placed(transformer, state)) == len(state.originals)):
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
    settings = dict(fallback=fallback, backend=backend, attention_names=list(attention_names))
    object.__setattr__(transformer, _STATE_ATTR, _LinearState(policy, originals, bf16, emulate, note, parked,
                                                              fused, stacked, settings))
    lora_fp8.install(transformer)


def settings(transformer: torch.nn.Module) -> dict | None:
    """What it takes to swap this transformer's linears again as they are now (`lora_load`): ``apply``'s
    arguments and the LoRA counters to carry over; None where no FP8 layer is in place."""
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None or not state.originals:
        return None
    requantized = state.requantized_before + sum(m.requantized for _, _, m in _placed(transformer, state).values())
    return dict(policy=state.policy, apply=dict(state.settings), lora_loads=state.lora_loads,
                requantized=requantized)


def restore(transformer: torch.nn.Module, saved: dict, loads: int) -> None:
    """Swap the linears again from `settings` (after `remove`), counting ``loads`` more LoRA loads."""
    apply(transformer, "fp8", saved["policy"], **saved["apply"])
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is not None:
        state.lora_loads, state.requantized_before = saved["lora_loads"] + loads, saved["requantized"]


def _placed(transformer: torch.nn.Module, state: _LinearState) -> dict[str, tuple[torch.nn.Module, str, FP8Linear]]:
    """patch-time name -> (parent, key, FP8 layer) for each of this patch's FP8 layers still in the module tree,
    wherever it is now (peft's unload puts a LoRA layer's base where the wrapper was)."""
    names = {id(original): name for name, (_, _, original) in state.originals.items()}
    found = {}
    for parent in transformer.modules():
        for key, child in parent._modules.items():
            if isinstance(child, FP8Linear) and id(child._wrapped()) in names:
                found[names[id(child._wrapped())]] = (parent, key, child)
    return found


def remove(transformer: torch.nn.Module) -> None:
    """Put the original ``nn.Linear`` objects back (a layer replaced by someone else since is left alone)."""
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return
    gelu_fp8.unfuse(state.gelu_fused)  # the GELU modules first: they hold the first layers
    lora_fp8.release(transformer)
    placed = _placed(transformer, state)
    dropped = []
    for name, (_, _, original) in state.originals.items():
        parent, key, current = placed.get(name, (None, None, None))
        ours = current is not None
        if name in state.parked:
            # back to where the FP8 layer is now (the model may have moved since), else where it was
            device = current.w_q.device if ours else state.parked[name]
            if not original.weight.is_meta:
                original.to(device)
            elif ours:
                _restore_dropped(original, current, device)
                dropped.append(name)
            else:
                warnings.warn(f"sagegen.unpatch: {name} was patched with bf16_copies='drop' and replaced since; "
                              "its original linear keeps no weights (meta)", stacklevel=3)
        if ours:
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
    for _, _, module in _placed(transformer, state).values():
        module._fp8_calls[0] = 0


def info(transformer: torch.nn.Module) -> dict | None:
    """What ran FP8: the policy, the FP8 layers (with their FP8 call counts), the bf16 ones and why."""
    state: _LinearState | None = getattr(transformer, _STATE_ATTR, None)
    if state is None:
        return None
    placed = _placed(transformer, state)
    names = {id(m): n for n, m in transformer.named_modules()}  # where each layer is now
    fp8 = {}
    for _, _, module in placed.values():
        fp8[names.get(id(module), "?")] = {
            "calls": module.fp8_calls,
            "outlier_channels": 0 if module.outlier_idx is None else int(module.outlier_idx.numel()),
            "smoothed": module.col_scale is not None and module.outlier_idx is None}
    weight_bytes = sum(m.w_q.numel() for _, _, m in placed.values())
    lora = lora_fp8.info(transformer, state.requantized_before + sum(m.requantized for _, _, m in placed.values()),
                         state.bf16)
    lora["loads_after_patch"] = state.lora_loads
    return {"mode": "fp8", "policy": dataclasses.asdict(state.policy),
            "emulated": state.emulate or _device(transformer).type != "cuda",
            "note": state.note, "fp8_layers": sorted(fp8), "fp8_layer_count": len(fp8),
            "fp8_calls": sum(v["calls"] for v in fp8.values()), "layers": fp8,
            "bf16_layers": dict(sorted(state.bf16.items())), "fp8_weight_bytes_added": weight_bytes,
            "bf16_copies": state.policy.bf16_copies,
            "gelu_fused_layers": sorted(state.gelu_fused),
            "qkv_stacked_modules": len(state.stacked),
            "lora": lora,
            "bf16_bytes_moved_to_cpu": sum(o.weight.numel() * o.weight.element_size()
                                           + (o.bias.numel() * o.bias.element_size() if o.bias is not None else 0)
                                           for n, (_, _, o) in state.originals.items()
                                           if n in state.parked and not o.weight.is_meta),
            "bf16_bytes_dropped": sum(o.weight.numel() * o.weight.element_size()
                                      for n, (_, _, o) in state.originals.items()
                                      if n in state.parked and o.weight.is_meta)}
