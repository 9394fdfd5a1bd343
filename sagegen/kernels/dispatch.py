"""Backend choice and dispatch for `sageattn`: Triton kernels, the PyTorch emulation, or SDPA fallback.

The two implementations are imported lazily and never import each other.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn.functional as F

from sagegen.config import SageConfig
from sagegen.kernels.block_sparse import BlockSparse, check_tiles
from sagegen.kernels.spec import MaskSpec, device_capability

MIN_CAPABILITY = (8, 0)  # Ampere: INT8 tensor cores
FP8_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def describe_cuda(device: torch.device) -> tuple[bool, str]:
    """Whether the Triton kernels support `device`, and why (for `sagegen env` and warnings)."""
    if device.type != "cuda":
        return False, f"device {device} is not a CUDA GPU"
    if not triton_available():
        return False, "Triton is not installed"
    cap = device_capability(device)
    if cap < MIN_CAPABILITY:
        return False, f"compute capability {cap[0]}.{cap[1]} < 8.0 (no INT8 tensor-core path)"
    return True, f"compute capability {cap[0]}.{cap[1]}"


# Below this much work, `backend="auto"` runs PyTorch SDPA on the GPU: the quantized kernel's fixed costs (the
# quantization pass, its extra launches, a grid too small to fill the GPU) outweigh its faster main loop.
# Work = batch·heads·Nq·Nk, per head dim; measured on an H200 (bench/results/archive/attention-h200-*-gluon.json,
# "crossover" at B·H = 48 and the Flux / SD3.5 shapes): at head dim 128 the kernel is 0.96x at B·H=24,
# 4,608 tokens (Flux) and 1.07x at B·H=48, 4,608; at head dim 64 0.99x at B·H=48, 4,608, 1.07x at 6,144
# and 1.13x at B·H=76, 4,429 (SD3.5-large with CFG).
AUTO_MIN_WORK = {64: 1.2e9, 128: 9.0e8}  # head dims <= 64 use the first, larger ones the second


def auto_min_work(head_dim: int) -> float:
    return AUTO_MIN_WORK[64] if head_dim <= 64 else AUTO_MIN_WORK[128]


# Cross-attention to a short text (Wan, LTX-Video, SkyReels-V2: 128-512 keys) runs SDPA at any query length:
# there the kernel's per-query quantization pass is most of its time. Measured on an H100 (Triton 3.9,
# bench/results/archive/backend-h100-2026-11-24.json): 512 keys, 32,760 queries x 12 heads 0.80 ms vs SDPA's 0.19;
# 512 keys, 75,600 x 40 1.89 vs 1.58; 128 keys, 6,144 x 32 0.53 vs 0.03.
AUTO_MAX_SHORT_KV = 512


def auto_prefers_sdpa(n_q: int, n_kv: int, batch_heads: int = 1, head_dim: int = 128) -> bool:
    """Whether `backend="auto"` runs PyTorch SDPA for this call: less work than the measured crossover, or
    at most `AUTO_MAX_SHORT_KV` keys (cross-attention to text)."""
    return n_kv <= AUTO_MAX_SHORT_KV or batch_heads * n_q * n_kv < auto_min_work(head_dim)


def crossover_note() -> str:
    """The auto rule in words (for `sagegen env` and docs)."""
    return (f"below B·H·Nq·Nk = {AUTO_MIN_WORK[64]:.2g} (head dim <= 64) or {AUTO_MIN_WORK[128]:.2g} (larger) "
            f"PyTorch SDPA, faster there: about {int((AUTO_MIN_WORK[64] / 48) ** 0.5):,} / "
            f"{int((AUTO_MIN_WORK[128] / 48) ** 0.5):,} tokens at 48 batch·heads (crossover measured on an H200), and "
            f"at most {AUTO_MAX_SHORT_KV} keys at any size (cross-attention to text; measured on an H100)")


def choose(q: torch.Tensor, backend: str, config: SageConfig, *, interpret: bool,
           warn: Callable[[str], None], n_kv: int | None = None, sparse: bool = False) -> tuple[str, SageConfig]:
    """Pick "triton", "reference" or "sdpa" for a call, and the config it runs with. Block-sparse calls
    (``sparse``) never take the small-call SDPA shortcut: SDPA would compute every block."""
    only = config.emulation_only()  # numerics under study, in the emulation alone (SageConfig.EMULATION_ONLY)
    if only and backend == "triton":
        raise ValueError(f"backend='triton': SageConfig {', '.join(only)} runs in the emulation only; use "
                         "backend='reference' (or 'auto')")
    if backend == "reference" or only:
        if only and backend == "auto" and q.device.type == "cuda":
            warn(f"sagegen: SageConfig {', '.join(only)} runs in the PyTorch emulation only (slow), not the "
                 "kernels")
        return "reference", config
    if q.device.type == "cpu":
        if backend == "triton" and not interpret:
            raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the Triton "
                             "kernels on CPU for testing); use backend='auto' or 'reference' on CPU")
        return ("triton" if backend == "triton" else "reference"), config
    ok, why = describe_cuda(q.device)
    if not ok:
        if config.fallback == "error":
            raise RuntimeError(f"sagegen's Triton kernels cannot run here: {why} (SageConfig.fallback='error')")
        warn(f"sagegen: Triton kernels unavailable ({why}); falling back to {config.fallback}")
        return config.fallback, config
    if backend == "auto" and not sparse and auto_prefers_sdpa(q.shape[2], n_kv if n_kv is not None else q.shape[2],
                                               q.shape[0] * q.shape[1], q.shape[3]):
        return "sdpa", config
    if config.pv_precision == "fp8" and device_capability(q.device) < FP8_CAPABILITY:
        warn("sagegen: this GPU has no FP8 tensor cores; using fp16 P·V (SageConfig.pv_precision='fp16')")
        config = config.replace(pv_precision="fp16")
    return "triton", config


def run(choice: str, q, k, v, out, *, sm_scale: float, is_causal: bool, mask: MaskSpec,
        attn_mask: torch.Tensor | None, config: SageConfig, return_lse: bool,
        block_sparse: BlockSparse | None = None, out_scale: torch.Tensor | None = None) -> torch.Tensor | None:
    """Run the chosen backend on [B, H, N, D] views; writes `out` (a view of the caller's output; e4m3, with
    its scale written into ``out_scale``, when that is given: "triton" and "reference" only)."""
    if out_scale is not None and choice not in ("triton", "reference"):
        raise ValueError(f"an FP8 attention output needs sagegen's kernels or emulation, not {choice!r}")
    if block_sparse is not None:
        # the same tiles in every backend (the fallback too), so a mask that runs here runs everywhere alike
        tiles = config.blocks(q.shape[-1], device_capability(q.device) if q.is_cuda else None)
        check_tiles(block_sparse, *tiles, "SageConfig.blocks on this device")
    if choice == "triton":
        from sagegen.kernels import launch

        return launch.sage_attention(q, k, v, out, sm_scale=sm_scale, is_causal=is_causal, mask=mask,
                                     config=config, return_lse=return_lse, block_sparse=block_sparse,
                                     out_scale=out_scale)
    if choice == "reference":
        from sagegen.kernels import reference

        o, lse = reference.sage_attention(q, k, v, sm_scale=sm_scale, is_causal=is_causal, mask=mask,
                                          config=config, return_lse=return_lse, block_sparse=block_sparse,
                                          out_scale=out_scale)
        out.copy_(o)
        return lse
    if block_sparse is not None:  # the fallback computes every block: fold the block mask into a dense one
        dense = block_sparse.to_dense_mask(q.shape[2], k.shape[2])
        if attn_mask is None:
            attn_mask = dense
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & dense
        else:
            attn_mask = attn_mask.masked_fill(~dense, -math.inf)
    return sdpa_attention(q, k, v, out, sm_scale=sm_scale, is_causal=is_causal, attn_mask=attn_mask,
                          return_lse=return_lse)


def _full_mask(attn_mask, is_causal, nq, nk, device):
    """SDPA cannot take a mask and is_causal together: fold causality into the mask."""
    if not is_causal:
        return attn_mask
    causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
    if attn_mask is None:
        return causal
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal
    return attn_mask.masked_fill(~causal, -math.inf)


def sdpa_attention(q, k, v, out, *, sm_scale, is_causal, attn_mask, return_lse):
    """PyTorch SDPA in full precision (the fallback), with zeros for fully masked rows."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    if attn_mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=sm_scale)
        mask = _full_mask(None, is_causal, nq, nk, q.device) if return_lse else None
    else:
        mask = _full_mask(attn_mask, is_causal, nq, nk, q.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale)
    out.copy_(torch.nan_to_num(o, nan=0.0))
    if not return_lse:
        return None
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    step = max(1, (1 << 26) // max(1, q.shape[0] * q.shape[1] * nk))
    for i in range(0, nq, step):
        s = (q[:, :, i:i + step].float() @ k.float().transpose(-1, -2)) * sm_scale
        if mask is not None:
            m = mask[..., i:i + step, :] if mask.dim() >= 2 and mask.shape[-2] != 1 else mask
            s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.float()
        lse[:, :, i:i + step] = torch.logsumexp(s, dim=-1)
    return lse


def sdpa_direct(q, k, v, layout: str, attn_mask, is_causal: bool, sm_scale: float) -> torch.Tensor:
    """PyTorch SDPA on the caller's tensors (either layout), returned in that layout; fully masked rows 0."""
    hnd = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2))
    qh, kh, vh = hnd(q), hnd(k), hnd(v)
    group = qh.shape[1] // kh.shape[1]
    if group > 1:
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    if attn_mask is None:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal, scale=sm_scale)
    else:
        mask = _full_mask(attn_mask, is_causal, qh.shape[2], kh.shape[2], q.device)
        o = torch.nan_to_num(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=sm_scale), nan=0.0)
    return hnd(o)
